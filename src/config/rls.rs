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

/// `[rls]`, compiled.
#[derive(Debug, Clone)]
pub struct RlsSettings {
    pub listen: Vec<SocketAddr>,
    /// gRPC over TLS with the `[[server.tls]]` certificates.
    pub listen_tls: Vec<SocketAddr>,
    /// More descriptors in one request are refused (INVALID_ARGUMENT).
    pub max_descriptors: usize,
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
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub key: String,
    pub value: ValueMatch,
    /// The limit this rule applies: an index into its domain's `Route::limits`. `None`: the rule
    /// only holds nested rules.
    pub limit: Option<usize>,
    pub children: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueMatch {
    /// `key` alone: any value (each value its own counter).
    Any,
    Exact(String),
    /// `value = "abc*"`: values that start with `abc`.
    Prefix(String),
}

impl ValueMatch {
    pub fn parse(value: Option<&str>) -> ValueMatch {
        match value {
            None => ValueMatch::Any,
            Some(v) => match v.strip_suffix('*') {
                Some(prefix) => ValueMatch::Prefix(prefix.to_string()),
                None => ValueMatch::Exact(v.to_string()),
            },
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
    let schema::Rls { listen, listen_tls, max_descriptors, domain } = rls.into_inner();
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
        let schema::RlsDomain { name, dry_run, rate_limit_headers, on_error, descriptor } = d.into_inner();
        check_name(src, &name, "rls.domain.name")?;
        unique(src, &mut seen, &name, "rls.domain")?;
        let dname = name.into_inner();
        let here =
            |span: &std::ops::Range<usize>, msg: String| src.error_at(span, format!("rls.domain {dname:?}: {msg}"));
        let mut limits = Vec::new();
        let rules = compile_rules(descriptor, zones, dry_run, &mut limits, 1, &here)?;
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
            priority: Default::default(),
        };
        domains.push(Domain { name: dname, route, rules });
    }
    Ok(Some(RlsSettings { listen, listen_tls, max_descriptors, domains }))
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

/// One level of rules; each zone reference becomes one of the route's `limits`.
fn compile_rules(
    list: Vec<Spanned<schema::RlsDescriptor>>,
    zones: &[Zone],
    domain_dry_run: bool,
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
        let schema::RlsDescriptor { key, value, zone, burst, delay, nodelay, dry_run, unlimited, descriptor } =
            d.into_inner();
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
        let limit = match zone {
            Some(zone) if unlimited => {
                return Err(here(&zone.span(), "a descriptor rule has either zone or unlimited = true".into()))
            }
            Some(zone) => {
                let zone_span = zone.span();
                let reference = schema::LimitReqRef { zone, burst, delay, nodelay, dry_run };
                let mut zl = compile_limit_ref(&reference, zones, here)?;
                let z = &zones[zl.zone];
                if z.count_statuses.is_some() || z.response_cost.is_some() {
                    return Err(here(
                        &zone_span,
                        format!(
                            "zone {:?} is charged by the response (count_statuses, cost_from_response); the rate limit \
                             service never sees a response",
                            z.name
                        ),
                    ));
                }
                zl.dry_run |= domain_dry_run;
                limits.push(zl);
                Some(limits.len() - 1)
            }
            None => {
                if let Some(at) = [burst.map(|b| b.span()), delay.map(|d| d.span()), nodelay.map(|n| n.span())]
                    .into_iter()
                    .flatten()
                    .next()
                {
                    return Err(here(&at, "burst, delay and nodelay need a zone in the same descriptor rule".into()));
                }
                if descriptor.is_empty() && !unlimited {
                    return Err(here(
                        &span,
                        format!("descriptor {:?}: give a zone, nested descriptors, or unlimited = true", key.get_ref()),
                    ));
                }
                None
            }
        };
        let children = compile_rules(descriptor, zones, domain_dry_run, limits, depth + 1, here)?;
        rules.push(Rule { key: key.into_inner(), value: value_match, limit, children });
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
        assert_eq!(d.rules[0].children[0].limit, Some(0));
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
            (format!("{ZONES}{rls}[[rls.domain.descriptor]]\nkey = \"a\"\nzone = \"z\"\nunlimited = true\n"), "either zone or unlimited"),
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
