//! `[rls]`'s RLQS settings and each domain's `[[rls.domain.bucket]]` rules (docs/rlqs.md): which
//! Envoy quota buckets divide which zone, compiled once. The matching itself is
//! `rls::quota::buckets` (pure); the division `rls::quota::assign`.

use std::time::Duration;

use super::ValueMatch;
use crate::config::checks::parse_duration;
use crate::config::error::{ConfigError, Source};
use crate::config::limit_req::Zone;
use crate::config::route::compile_limit_ref;
use crate::config::schema;
use crate::config::spanned::Spanned;
use crate::limit::{Algorithm, Rate};

/// `[rls]`'s RLQS settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSettings {
    /// How often each Envoy reports each bucket: assignments live a little longer than this.
    pub report_interval: Duration,
    /// RLQS streams open at once on this instance.
    pub max_streams: usize,
    /// Buckets one stream may hold.
    pub max_buckets: usize,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        QuotaSettings { report_interval: Duration::from_secs(5), max_streams: 256, max_buckets: 1000 }
    }
}

/// One `[[rls.domain.bucket]]`.
#[derive(Debug, Clone)]
pub struct BucketRule {
    /// The id's entries, sorted by key: an id matches when it has exactly these keys.
    pub id: Vec<(String, ValueMatch)>,
    pub limit: BucketLimit,
}

/// What a bucket's Envoys get.
#[derive(Debug, Clone, PartialEq)]
pub enum BucketLimit {
    /// The zone's rate and `capacity` (burst + 1) divided among the Envoys reporting the key.
    Divided { zone: String, rate: Rate, capacity: u64 },
    /// ALLOW_ALL.
    Unlimited,
    /// DENY_ALL (a limit of 0).
    Deny,
}

/// Entries one bucket rule may name.
pub const MAX_ID_ENTRIES: usize = 16;

pub(super) fn compile_settings(
    src: &Source<'_>,
    interval: Option<Spanned<String>>,
    streams: Option<Spanned<i64>>,
    buckets: Option<Spanned<i64>>,
) -> Result<QuotaSettings, ConfigError> {
    let mut settings = QuotaSettings::default();
    if let Some(text) = interval {
        settings.report_interval = parse_duration(text.get_ref())
            .filter(|d| (Duration::from_secs(1)..=Duration::from_secs(60)).contains(d))
            .ok_or_else(|| {
                src.error_at(
                    &text.span(),
                    format!("rls.quota_report_interval: expected \"1s\" to \"60s\", got {:?}", text.get_ref()),
                )
            })?;
    }
    let bounded = |value: Option<Spanned<i64>>, field: &str, max: i64, default: usize| match value {
        None => Ok(default),
        Some(v) if (1..=max).contains(v.get_ref()) => Ok(*v.get_ref() as usize),
        Some(v) => Err(src.error_at(&v.span(), format!("rls.{field}: must be 1..={max}, got {}", v.get_ref()))),
    };
    settings.max_streams = bounded(streams, "max_quota_streams", 4096, settings.max_streams)?;
    settings.max_buckets = bounded(buckets, "max_quota_buckets", 100_000, settings.max_buckets)?;
    Ok(settings)
}

pub(super) fn compile_buckets(
    list: Vec<Spanned<schema::RlsBucket>>,
    zones: &[Zone],
    here: &dyn Fn(&std::ops::Range<usize>, String) -> ConfigError,
) -> Result<Vec<BucketRule>, ConfigError> {
    let mut rules: Vec<BucketRule> = Vec::new();
    for b in list {
        let span = b.span();
        let schema::RlsBucket { id, zone, burst, unlimited, deny } = b.into_inner();
        let id_span = id.span();
        let id = id.into_inner();
        if id.is_empty() || id.len() > MAX_ID_ENTRIES {
            return Err(here(
                &id_span,
                format!("bucket.id: give 1 to {MAX_ID_ENTRIES} entries, as Envoy's bucket_id_builder does"),
            ));
        }
        let mut entries = Vec::with_capacity(id.len());
        for (key, value) in id {
            if key.is_empty() || value.get_ref().is_empty() {
                return Err(here(
                    &value.span(),
                    "bucket.id: keys and values must not be empty (Envoy refuses them too)".into(),
                ));
            }
            let value = match value.get_ref().as_str() {
                "*" => ValueMatch::Any,
                v => ValueMatch::parse(Some(v)),
            };
            entries.push((key, value));
        }
        // BTreeMap: already sorted by key.
        if rules.iter().any(|r| r.id == entries) {
            return Err(here(&id_span, "bucket.id: the same id is given twice in this domain".into()));
        }
        let limit = match (zone, unlimited, deny) {
            (Some(zone), false, false) => {
                let reference = schema::LimitReqRef {
                    zone,
                    burst,
                    delay: None,
                    nodelay: None,
                    dry_run: false,
                    when: None,
                    unless: None,
                };
                let zl = compile_limit_ref(&reference, zones, here)?;
                let z = &zones[zl.zone];
                if !matches!(z.algorithm, Algorithm::LeakyBucket | Algorithm::TokenBucket) {
                    return Err(here(
                        &reference.zone.span(),
                        format!(
                            "zone {:?} is {}: an Envoy's share is a token bucket, so the zone is a leaky_bucket or a \
                             token_bucket",
                            z.name,
                            z.algorithm.as_str()
                        ),
                    ));
                }
                if z.count_statuses.is_some() || z.response_cost.is_some() {
                    return Err(here(
                        &reference.zone.span(),
                        format!("zone {:?} is charged by the response; Envoy's buckets count requests", z.name),
                    ));
                }
                BucketLimit::Divided { zone: z.name.clone(), rate: zl.limit.rate, capacity: zl.limit.capacity() }
            }
            (None, true, false) if burst.is_none() => BucketLimit::Unlimited,
            (None, false, true) if burst.is_none() => BucketLimit::Deny,
            _ => {
                return Err(here(
                    &span,
                    "a bucket rule has one of zone (with burst), unlimited = true or deny = true".into(),
                ))
            }
        };
        rules.push(BucketRule { id: entries, limit });
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_text;

    const HEAD: &str = "[[limit_req_zone]]\nname = \"z\"\nrate = \"10r/s\"\n\n[[limit_req_zone]]\nname = \"w\"\nalgorithm = \"fixed_window\"\nwindow = \"1m\"\nlimit = 5\n\n[rls]\nlisten = [\"127.0.0.1:8081\"]\n";

    fn compile(rest: &str) -> Result<crate::config::Runtime, String> {
        from_text(&format!("{HEAD}{rest}"), "t.toml").map_err(|e| e.to_string())
    }

    #[test]
    fn bucket_rules_compile_with_their_zone_and_settings() {
        let rt = compile(
            "quota_report_interval = \"2s\"\nmax_quota_streams = 8\n\n[[rls.domain]]\nname = \"d\"\n\n\
             [[rls.domain.bucket]]\nid = { name = \"api\", tenant = \"*\" }\nzone = \"z\"\nburst = 4\n\n\
             [[rls.domain.bucket]]\nid = { name = \"open\" }\nunlimited = true\n\n\
             [[rls.domain.bucket]]\nid = { name = \"closed\" }\ndeny = true\n",
        )
        .expect("compiles");
        let rls = rt.rls.as_ref().expect("[rls]");
        assert_eq!(rls.quota.report_interval, Duration::from_secs(2));
        assert_eq!((rls.quota.max_streams, rls.quota.max_buckets), (8, 1000));
        let d = rls.domain("d").expect("domain");
        assert_eq!(d.buckets.len(), 3);
        assert_eq!(
            d.buckets[0].id,
            vec![("name".into(), ValueMatch::Exact("api".into())), ("tenant".into(), ValueMatch::Any)]
        );
        assert_eq!(
            d.buckets[0].limit,
            BucketLimit::Divided { zone: "z".into(), rate: Rate::parse("10r/s").unwrap(), capacity: 5 }
        );
        assert_eq!(d.buckets[1].limit, BucketLimit::Unlimited);
        assert_eq!(d.buckets[2].limit, BucketLimit::Deny);
    }

    #[test]
    fn mistakes_are_refused_with_what_to_do() {
        let domain = "[[rls.domain]]\nname = \"d\"\n\n[[rls.domain.bucket]]\n";
        let cases = [
            (format!("{domain}id = {{}}\nzone = \"z\"\n"), "give 1 to 16 entries"),
            (format!("{domain}id = {{ name = \"\" }}\nzone = \"z\"\n"), "must not be empty"),
            (format!("{domain}id = {{ name = \"a\" }}\nzone = \"w\"\n"), "leaky_bucket or a token_bucket"),
            (format!("{domain}id = {{ name = \"a\" }}\nzone = \"nope\"\n"), "unknown zone"),
            (format!("{domain}id = {{ name = \"a\" }}\n"), "one of zone"),
            (format!("{domain}id = {{ name = \"a\" }}\nzone = \"z\"\ndeny = true\n"), "one of zone"),
            (format!("{domain}id = {{ name = \"a\" }}\nunlimited = true\nburst = 3\n"), "one of zone"),
            (
                format!("{domain}id = {{ name = \"a\" }}\nzone = \"z\"\n\n[[rls.domain.bucket]]\nid = {{ name = \"a\" }}\ndeny = true\n"),
                "given twice",
            ),
            ("quota_report_interval = \"500ms\"\n".to_string(), "quota_report_interval"),
            ("max_quota_buckets = 0\n".to_string(), "max_quota_buckets"),
        ];
        for (rest, expected) in &cases {
            let e = compile(rest).expect_err(rest);
            assert!(e.contains(expected), "{e}\n--- for ---\n{rest}");
        }
    }
}
