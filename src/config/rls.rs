//! `[rls]`: the rate limit service's listeners and, per `[[rls.domain]]`, its descriptor rules.
//! A domain compiles into a `Route` like any `[[route]]` (its rules' zone references are the
//! route's `limit_req` list, with its header mode and failure policy), so the decision step is
//! the proxy's own; only the rule tree that turns descriptors into keyed zones is the RLS's.

use std::collections::HashMap;
use std::net::SocketAddr;

use super::checks::{check_name, unique};
use super::error::{ConfigError, Source};
use super::limit_req::Zone;
use super::route::{compile_limit_ref, failure_policy, header_mode, Cost, Route, ZoneLimit};
use super::schema;
use super::spanned::Spanned;
use crate::limit::Algorithm;

pub mod quota;
pub use quota::{BucketLimit, BucketRule, QuotaSettings};

/// `[rls]`, compiled.
#[derive(Debug, Clone)]
pub struct RlsSettings {
    pub listen: Vec<SocketAddr>,
    /// gRPC over TLS with the `[[server.tls]]` certificates.
    pub listen_tls: Vec<SocketAddr>,
    /// More descriptors in one request are refused (INVALID_ARGUMENT).
    pub max_descriptors: usize,
    /// Envoy's rate limit quota service (RLQS) on the same listeners.
    pub quota: QuotaSettings,
    pub domains: Vec<Domain>,
}

impl RlsSettings {
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.iter().find(|d| d.name == name)
    }
}

/// One `[[rls.domain]]`: its rules, and the route they compile into.
#[derive(Debug, Clone)]
pub struct Domain {
    pub name: String,
    /// Named `rls:<domain>`; its `limits` are the zones the rules reference (`Rule::limit`
    /// indexes them), with the domain's header mode (`rate_limit_headers`) and failure policy.
    pub route: Route,
    pub rules: Vec<Rule>,
    /// Which of two matching `*` values wins at one level.
    pub pattern_order: PatternOrder,
    /// `limit_override_zone`: the limit (index into `route.limits`) that decides descriptors
    /// carrying Envoy's `RateLimitOverride`; `None`: the override is ignored.
    pub limit_override: Option<usize>,
    /// RLQS bucket rules (`[[rls.domain.bucket]]`), in file order.
    pub buckets: Vec<BucketRule>,
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub key: String,
    pub value: ValueMatch,
    /// The limits this rule applies, decided all or nothing: indices into its domain's
    /// `Route::limits`. Empty: the rule only holds nested rules, or is `unlimited`.
    pub limits: Vec<usize>,
    /// Matches and limits nothing (answered with the peer's MaxUint32 remaining).
    pub unlimited: bool,
    /// `current_limit.name` in answers, and what other rules' `replaces` name.
    pub name: Option<String>,
    /// Names of rules this one takes out of a call that matches it.
    pub replaces: Vec<String>,
    /// Every value matching the `*` pattern shares one counter.
    pub share_threshold: bool,
    /// A soft limit (envoyproxy/ratelimit's `quota_mode`).
    pub quota: bool,
    pub children: Vec<Rule>,
}

/// Which of two `*` values that both match a value wins at one level (exact values and the key
/// alone rank as ever: exact first, key alone last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PatternOrder {
    /// The one with more literal characters (`/api/admin/*` over `/api/*`), then file order.
    #[default]
    Specific,
    /// The first in file order, as envoyproxy/ratelimit picks.
    File,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// `key` alone: any value (each value its own counter).
    Any,
    Exact(String),
    /// A value with `*`s: each matches any run of characters (envoyproxy/ratelimit's rule).
    /// `parts` is the text split on `*` (so at least two).
    Pattern {
        text: String,
        parts: Vec<String>,
    },
}

impl ValueMatch {
    pub fn parse(value: Option<&str>) -> ValueMatch {
        match value {
            None => ValueMatch::Any,
            Some(v) if v.contains('*') => {
                ValueMatch::Pattern { text: v.to_string(), parts: v.split('*').map(str::to_string).collect() }
            }
            Some(v) => ValueMatch::Exact(v.to_string()),
        }
    }
}

/// Descriptors a request may carry by default, and at most (Envoy sends a handful).
const DEFAULT_MAX_DESCRIPTORS: i64 = 64;
const MAX_MAX_DESCRIPTORS: i64 = 1024;
/// How deep rules nest (entries per descriptor that can match).
const MAX_DEPTH: usize = 16;

type Here<'a> = dyn Fn(&std::ops::Range<usize>, String) -> ConfigError + 'a;

pub(super) fn compile_rls(
    src: &Source<'_>,
    rls: Option<Spanned<schema::Rls>>,
    zones: &[Zone],
) -> Result<Option<RlsSettings>, ConfigError> {
    let Some(rls) = rls else { return Ok(None) };
    let span = rls.span();
    let schema::Rls {
        listen,
        listen_tls,
        max_descriptors,
        quota_report_interval,
        max_quota_streams,
        max_quota_buckets,
        domain,
    } = rls.into_inner();
    let quota = quota::compile_settings(src, quota_report_interval, max_quota_streams, max_quota_buckets)?;
    let listen = addresses(src, listen, "rls.listen")?;
    let listen_tls = addresses(src, listen_tls, "rls.listen_tls")?;
    if listen.is_empty() && listen_tls.is_empty() {
        return Err(src.error_at(&span, "rls: give listen = [\"127.0.0.1:8081\"] (or listen_tls)"));
    }
    let max_descriptors = match max_descriptors {
        None => DEFAULT_MAX_DESCRIPTORS as usize,
        Some(m) if (1..=MAX_MAX_DESCRIPTORS).contains(m.get_ref()) => *m.get_ref() as usize,
        Some(m) => {
            return Err(src.error_at(
                &m.span(),
                format!("rls.max_descriptors: must be 1..={MAX_MAX_DESCRIPTORS}, got {}", m.get_ref()),
            ))
        }
    };
    let mut seen = HashMap::new();
    let mut domains = Vec::new();
    for d in domain {
        let schema::RlsDomain {
            name,
            dry_run,
            rate_limit_headers,
            on_error,
            pattern_order,
            quota_mode,
            limit_override_zone,
            descriptor,
            bucket,
        } = d.into_inner();
        check_name(src, &name, "rls.domain.name")?;
        unique(src, &mut seen, &name, "rls.domain")?;
        let dname = name.into_inner();
        let here =
            |span: &std::ops::Range<usize>, msg: String| src.error_at(span, format!("rls.domain {dname:?}: {msg}"));
        let mut limits = Vec::new();
        let pattern_order = match pattern_order.as_ref().map(|p| (p.get_ref().as_str(), p.span())) {
            None | Some(("specific", _)) => PatternOrder::Specific,
            Some(("file", _)) => PatternOrder::File,
            Some((other, at)) => {
                return Err(here(&at, format!("pattern_order: expected \"specific\" or \"file\", got {other:?}")))
            }
        };
        let domain_modes = DomainModes { dry_run, quota: quota_mode };
        let rules = compile_rules(descriptor, zones, domain_modes, &mut limits, 1, &here)?;
        let buckets = quota::compile_buckets(bucket, zones, &here)?;
        let limit_override = match limit_override_zone {
            None => None,
            Some(zone) => {
                let span = zone.span();
                let reference = schema::LimitReqRef {
                    zone,
                    burst: None,
                    delay: None,
                    nodelay: None,
                    dry_run: false,
                    when: None,
                    unless: None,
                };
                let mut zl = compile_limit_ref(&reference, zones, &here)?;
                let z = &zones[zl.zone];
                if !matches!(z.algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow) {
                    return Err(here(
                        &span,
                        format!(
                            "limit_override_zone: zone {:?} is {}; the caller's limit is a count per unit, for \
                             fixed_window or sliding_window",
                            z.name,
                            z.algorithm.as_str()
                        ),
                    ));
                }
                if limits.iter().any(|l| l.zone == zl.zone) {
                    // Its keys carry the caller's rate; a rule's descriptor keyed alike would share them.
                    return Err(here(
                        &span,
                        format!(
                            "limit_override_zone: zone {:?} is also a rule's zone; give overrides a zone of their own",
                            z.name
                        ),
                    ));
                }
                zl.dry_run = dry_run;
                limits.push(zl);
                Some(limits.len() - 1)
            }
        };
        let headers = header_mode(rate_limit_headers.as_ref(), &here)?;
        let on_error = failure_policy(on_error.as_ref(), &here)?;
        let route = Route {
            name: format!("rls:{dname}"),
            // Never read: the RLS answers, it does not forward.
            upstream: 0,
            limits,
            status: 429,
            headers,
            on_error,
            conn_limits: Vec::new(),
            conn_status: 503,
            access: Vec::new(),
            cost: Cost { default: 1, header: None, max: 1, min: 1 },
            grpc_status: None,
            limit_rate: None,
            priority: Default::default(),
            priority_from: None,
            rejection: None,
        };
        domains.push(Domain { name: dname, route, rules, pattern_order, limit_override, buckets });
    }
    Ok(Some(RlsSettings { listen, listen_tls, max_descriptors, quota, domains }))
}

fn addresses(
    src: &Source<'_>,
    list: Option<Spanned<Vec<Spanned<String>>>>,
    field: &str,
) -> Result<Vec<SocketAddr>, ConfigError> {
    list.map(Spanned::into_inner)
        .unwrap_or_default()
        .iter()
        .map(|a| {
            a.get_ref()
                .parse()
                .map_err(|_| src.error_at(&a.span(), format!("{field}: {:?} is not an IP:port address", a.get_ref())))
        })
        .collect()
}

/// What a domain sets for all of its rules.
#[derive(Debug, Clone, Copy)]
struct DomainModes {
    dry_run: bool,
    quota: bool,
}

/// One level of rules; each zone reference becomes one of the route's `limits`.
fn compile_rules(
    list: Vec<Spanned<schema::RlsDescriptor>>,
    zones: &[Zone],
    domain: DomainModes,
    limits: &mut Vec<ZoneLimit>,
    depth: usize,
    here: &Here<'_>,
) -> Result<Vec<Rule>, ConfigError> {
    let mut rules: Vec<Rule> = Vec::new();
    for d in list {
        let span = d.span();
        if depth > MAX_DEPTH {
            return Err(here(&span, format!("descriptor rules nest at most {MAX_DEPTH} deep")));
        }
        let schema::RlsDescriptor {
            key,
            value,
            zone,
            burst,
            delay,
            nodelay,
            dry_run,
            unlimited,
            exempt,
            limit_req,
            name,
            replaces,
            share_threshold,
            quota_mode,
            descriptor,
        } = d.into_inner();
        if key.get_ref().is_empty() {
            return Err(here(&key.span(), "descriptor.key must not be empty".into()));
        }
        let value_match = ValueMatch::parse(value.as_ref().map(|v| v.get_ref().as_str()));
        if value.as_ref().is_some_and(|v| v.get_ref().is_empty() || v.get_ref() == "*") {
            let at = value.as_ref().map(|v| v.span()).unwrap_or_default();
            return Err(here(&at, "descriptor.value: leave it out to match any value".into()));
        }
        if rules.iter().any(|r| r.key == *key.get_ref() && r.value == value_match) {
            return Err(here(
                &key.span(),
                format!("descriptor {:?} (value {:?}) is given twice at this level", key.get_ref(), value_match),
            ));
        }
        if share_threshold && !matches!(value_match, ValueMatch::Pattern { .. }) {
            return Err(here(
                &key.span(),
                format!(
                    "descriptor {:?}: share_threshold needs a value with `*` (the values it shares a counter among)",
                    key.get_ref()
                ),
            ));
        }
        let name = match name {
            Some(n) if n.get_ref().is_empty() => {
                return Err(here(&n.span(), "descriptor.name must not be empty".into()))
            }
            n => n.map(Spanned::into_inner),
        };
        let replaces: Vec<String> = match replaces {
            None => Vec::new(),
            Some(list) => {
                let span = list.span();
                let list: Vec<String> = list.into_inner().into_iter().map(Spanned::into_inner).collect();
                if list.is_empty() || list.iter().any(String::is_empty) {
                    return Err(here(&span, "descriptor.replaces: give the names of the rules it replaces".into()));
                }
                if name.as_ref().is_some_and(|n| list.contains(n)) {
                    return Err(here(&span, "descriptor.replaces: a rule cannot replace itself".into()));
                }
                list
            }
        };
        let mut references: Vec<schema::LimitReqRef> = Vec::new();
        match (zone, limit_req) {
            (Some(zone), None) => {
                references.push(schema::LimitReqRef { zone, burst, delay, nodelay, dry_run, when: None, unless: None })
            }
            (None, Some(list)) => {
                if let Some(at) = [burst.map(|b| b.span()), delay.map(|d| d.span()), nodelay.map(|n| n.span())]
                    .into_iter()
                    .flatten()
                    .next()
                {
                    return Err(here(&at, "with limit_req, give burst, delay and nodelay in its entries".into()));
                }
                let span = list.span();
                references = list.into_inner();
                if references.is_empty() {
                    return Err(here(&span, "descriptor.limit_req: give at least one zone".into()));
                }
                for r in &mut references {
                    r.dry_run |= dry_run;
                }
            }
            (Some(zone), Some(_)) => {
                return Err(here(&zone.span(), "a descriptor rule has zone or limit_req, not both".into()))
            }
            (None, None) => {
                if let Some(at) = [burst.map(|b| b.span()), delay.map(|d| d.span()), nodelay.map(|n| n.span())]
                    .into_iter()
                    .flatten()
                    .next()
                {
                    return Err(here(&at, "burst, delay and nodelay need a zone in the same descriptor rule".into()));
                }
            }
        }
        if unlimited && !references.is_empty() {
            return Err(here(&span, "a descriptor rule has either zones or unlimited = true".into()));
        }
        if exempt && (unlimited || !references.is_empty() || !descriptor.is_empty()) {
            return Err(here(&span, "exempt = true is a rule with no zone, no nested rules and no unlimited".into()));
        }
        if references.is_empty() && descriptor.is_empty() && !unlimited && !exempt {
            return Err(here(
                &span,
                format!(
                    "descriptor {:?}: give a zone, nested descriptors, unlimited = true or exempt = true",
                    key.get_ref()
                ),
            ));
        }
        if !replaces.is_empty() && references.is_empty() && !unlimited {
            return Err(here(&span, "descriptor.replaces needs a zone or unlimited = true in the same rule".into()));
        }
        if quota_mode && references.is_empty() {
            return Err(here(&span, "descriptor.quota_mode needs a zone (it softens that limit)".into()));
        }
        let mut rule_limits = Vec::with_capacity(references.len());
        for reference in &references {
            if let Some(c) = reference.when.as_ref().or(reference.unless.as_ref()) {
                return Err(here(
                    &c.span(),
                    "when/unless: not on a descriptor's limit_req (its descriptors already say what applies)".into(),
                ));
            }
            let mut zl = compile_limit_ref(reference, zones, here)?;
            let z = &zones[zl.zone];
            if z.count_statuses.is_some() || z.response_cost.is_some() {
                return Err(here(
                    &reference.zone.span(),
                    format!(
                        "zone {:?} is charged by the response (count_statuses, cost_from_response); the rate limit \
                         service never sees a response",
                        z.name
                    ),
                ));
            }
            if rule_limits.iter().any(|&i: &usize| limits[i].zone == zl.zone) {
                return Err(here(&reference.zone.span(), format!("zone {:?} is listed twice in one rule", z.name)));
            }
            zl.dry_run |= domain.dry_run;
            limits.push(zl);
            rule_limits.push(limits.len() - 1);
        }
        let children = compile_rules(descriptor, zones, domain, limits, depth + 1, here)?;
        let quota = quota_mode || (domain.quota && !rule_limits.is_empty());
        rules.push(Rule {
            key: key.into_inner(),
            value: value_match,
            limits: rule_limits,
            unlimited,
            name,
            replaces,
            share_threshold,
            quota,
            children,
        });
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use crate::config::from_text;

    const ZONES: &str = "[[limit_req_zone]]\nname = \"z\"\nrate = \"1r/s\"\n\n";

    fn error(text: &str) -> String {
        match from_text(text, "t.toml") {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn rls_alone_needs_no_server_and_compiles_domains_into_routes() {
        let text = format!(
            "{ZONES}[rls]\nlisten = [\"127.0.0.1:8081\"]\n\n[[rls.domain]]\nname = \"d\"\non_error = \"deny\"\nrate_limit_headers = \"none\"\n\n\
             [[rls.domain.descriptor]]\nkey = \"a\"\n\n[[rls.domain.descriptor.descriptor]]\nkey = \"b\"\nzone = \"z\"\nburst = 2\n"
        );
        let rt = from_text(&text, "t.toml").expect("compiles");
        let rls = rt.rls.as_ref().expect("[rls]");
        let d = rls.domain("d").expect("domain");
        assert_eq!(d.route.name, "rls:d");
        assert_eq!(d.route.limits.len(), 1);
        assert_eq!(d.route.limits[0].limit.burst, 2);
        assert_eq!(d.route.on_error, Some(crate::config::FailurePolicy::Deny));
        assert_eq!(d.route.headers, crate::config::HeaderMode::None);
        assert_eq!(d.rules[0].children[0].limits, vec![0]);
        assert!(!d.rules[0].children[0].quota);
        let quota = from_text(&text.replace("on_error = \"deny\"", "quota_mode = true"), "t.toml").expect("compiles");
        let d = quota.rls.as_ref().and_then(|r| r.domain("d")).expect("domain");
        assert!(d.rules[0].children[0].quota && !d.rules[0].quota, "the domain's quota_mode softens rules with a zone");
        assert!(rt.server.listen.is_empty());
    }

    #[test]
    fn mistakes_are_refused_with_their_line() {
        let rls = "[rls]\nlisten = [\"127.0.0.1:8081\"]\n\n[[rls.domain]]\nname = \"d\"\n\n";
        let cases = [
            (format!("{ZONES}[rls]\n"), "give listen"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"nope\"\n"), "unknown zone"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nburst = 2\n"), "need a zone"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\n"), "give a zone"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"z\"\n\n[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"z\"\n"), "twice"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nvalue = \"*\"\nzone = \"z\"\n"), "leave it out"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"z\"\nunlimited = true\n"), "either zones or unlimited"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"z\"\nexempt = true\n"), "exempt = true is"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nexempt = true\nreplaces = [\"x\"]\n"), "replaces needs"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"z\"\nname = \"x\"\nreplaces = [\"x\"]\n"), "cannot replace itself"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nvalue = \"b\"\nshare_threshold = true\nzone = \"z\"\n"), "share_threshold needs"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nlimit_req = [{{ zone = \"z\" }}, {{ zone = \"z\" }}]\n"), "listed twice"),
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nquota_mode = true\nunlimited = true\n"), "quota_mode needs"),
            (format!("{ZONES}[rls]\nlisten = [\"127.0.0.1:8081\"]\n\n[[rls.domain]]\nname = \"d\"\nlimit_override_zone = \"z\"\n"), "fixed_window or sliding_window"),
            (
                format!(
                    "[[limit_req_zone]]\nname = \"w\"\nalgorithm = \"fixed_window\"\nwindow = \"1m\"\nlimit = 1\n\n{rls}\
                     limit_override_zone = \"w\"\n\n[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"w\"\n"
                ),
                "a zone of their own",
            ),
            (format!("{ZONES}{rls}[[rls.domain]]\nname = \"d\"\n"), "duplicate rls.domain name \"d\""),
            (format!("{ZONES}[rls]\nlisten_tls = [\"127.0.0.1:8443\"]\n"), "[[server.tls]]"),
            (format!("{ZONES}[rls]\nlisten = [\"127.0.0.1:1\"]\nmax_descriptors = 0\n"), "max_descriptors"),
            (
                format!("{}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"z\"\n", ZONES.replace("rate", "count_statuses = [401]\nrate")),
                "never sees a response",
            ),
            (
                format!(
                    "{}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"z\"\n",
                    ZONES.replace("rate", "cost_from_response = { header = \"X-Tokens\" }\nrate")
                ),
                "never sees a response",
            ),
            (format!("[[limit_req_zone]]\nname = \"z\"\nrate = \"1r/s\"\nbad_token_key = \"ip\"\n\n{rls}"), "the zone has no key"),
        ];
        for (text, expected) in &cases {
            let e = error(text);
            assert!(e.contains(expected), "{e}\n--- for ---\n{text}");
        }
    }

    #[test]
    fn a_keyless_zone_is_for_descriptors_only() {
        let text = format!(
            "[server]\nlisten = [\"127.0.0.1:8080\"]\n\n[[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:9000\"]\n\n{ZONES}\
             [[route]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [{{ zone = \"z\" }}]\n"
        );
        assert!(error(&text).contains("has no key"), "{}", error(&text));
        // Routes need [server] listeners even when [rls] is there.
        let with_rls =
            text.replace("[server]\nlisten = [\"127.0.0.1:8080\"]\n", "[rls]\nlisten = [\"127.0.0.1:8081\"]\n");
        assert!(error(&with_rls).contains("server.listen"), "{}", error(&with_rls));
    }
}
