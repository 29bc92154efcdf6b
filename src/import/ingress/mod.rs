//! `weir import-ingress PATH…`: Kubernetes Ingress manifests with ingress-nginx annotations (and
//! the controller's ConfigMap) as one Weir TOML, translated as ingress-nginx generated its nginx
//! config: one zone per Ingress object and limit (`<namespace>_<name>_rps`, `_rpm`, `_conn`), both
//! `limit-rps` and `limit-rpm` applying, burst = rate × `limit-burst-multiplier` (default 5),
//! always `nodelay`, `limit-whitelist`/`limit-allowlist` as exempt CIDRs, `limit-rate` and
//! `limit-rate-after` in KB, statuses from the ConfigMap (default 503), `use-forwarded-headers`
//! as `[real_ip]`, paths by `pathType`, and a host with `use-regex` or `rewrite-target` on any of
//! its Ingresses making every path of that host a case-insensitive regex. Pure: texts in, TOML out.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_yaml::Value;

use crate::import::toml_text::{list, quote};

const PREFIX: &str = "nginx.ingress.kubernetes.io/";

/// Annotations that change nothing Weir decides (or that the controller applies outside the
/// request's limits): passed over without a warning.
const KNOWN_IGNORED: &[&str] = &[
    "proxy-body-size",
    "proxy-connect-timeout",
    "proxy-read-timeout",
    "proxy-send-timeout",
    "proxy-buffering",
    "proxy-buffer-size",
    "proxy-request-buffering",
    "proxy-http-version",
    "ssl-redirect",
    "force-ssl-redirect",
    "backend-protocol",
    "enable-cors",
    "cors-allow-origin",
    "cors-allow-methods",
    "cors-allow-headers",
    "cors-allow-credentials",
    "cors-max-age",
    "cors-expose-headers",
    "upstream-vhost",
    "ssl-passthrough",
    "affinity",
    "session-cookie-name",
    "session-cookie-expires",
    "session-cookie-max-age",
    "load-balance",
    "proxy-next-upstream",
    "proxy-next-upstream-tries",
    "client-body-buffer-size",
    "enable-access-log",
    "server-alias",
    "app-root",
];

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Every backend Service goes to this address (instead of `svc.ns.svc.cluster.local:port`).
    pub upstream: Option<String>,
    /// `[server] listen`.
    pub listen: String,
    /// Controller replicas: print what each limit was across them.
    pub replicas: Option<u64>,
    /// With `replicas`: write the total of all replicas (rate × N) as the fleet-wide rate.
    pub keep_total: bool,
    pub allow_unexpressed: bool,
}

#[derive(Debug)]
pub struct Imported {
    pub toml: String,
    /// Warnings and the per-replica report, for stderr.
    pub notes: Vec<String>,
}

struct Doc {
    at: String,
    value: Value,
}

/// Multi-document YAML, each document with the file:line it starts on.
fn documents(name: &str, text: &str) -> Result<Vec<Doc>, String> {
    let mut out = Vec::new();
    let mut start = 1;
    let mut current = String::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let sep = line.trim_end() == "---" || line.starts_with("--- ");
        if sep {
            push_doc(name, start, &current, &mut out)?;
            current.clear();
            start = i + 2;
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    push_doc(name, start, &current, &mut out)?;
    Ok(out)
}

fn push_doc(name: &str, start: usize, text: &str, out: &mut Vec<Doc>) -> Result<(), String> {
    if text.trim().is_empty() || text.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#')) {
        return Ok(());
    }
    if text.contains("{{") {
        return Err(format!(
            "{name}:{start}: template syntax (`{{{{`): render the chart first (helm template) and import its output"
        ));
    }
    let value: Value = serde_yaml::from_str(text).map_err(|e| {
        let line = e.location().map_or(start, |l| start + l.line() - 1);
        format!("{name}:{line}: not YAML: {e}")
    })?;
    // The line of `kind:` names the object best.
    let kind_line = text.lines().position(|l| l.starts_with("kind:")).map_or(start, |i| start + i);
    if let Some(items) = value.get("items").and_then(Value::as_sequence).filter(|_| kind_of(&value) == "List") {
        for item in items {
            out.push(Doc { at: format!("{name}:{kind_line}"), value: item.clone() });
        }
    } else {
        out.push(Doc { at: format!("{name}:{kind_line}"), value });
    }
    Ok(())
}

fn kind_of(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

fn text_at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(*p)?;
    }
    cur.as_str()
}

/// One Ingress path with its Ingress's limits.
struct PathOut {
    host: Option<String>,
    path: String,
    path_type: String,
    backend: String,
    ingress: usize,
    at: String,
}

struct Limits {
    name: String,
    at: String,
    rps: Option<u64>,
    rpm: Option<u64>,
    multiplier: u64,
    connections: Option<u64>,
    allow: Vec<String>,
    rate: Option<u64>,
    rate_after: Option<u64>,
    regex: bool,
    /// `rewrite-target`: a path it rewrites (target ≠ path) is a regex, as `use-regex` is.
    rewrite: Option<String>,
}

pub fn import(inputs: &[(String, String)], opts: &Options) -> Result<Imported, String> {
    let mut docs = Vec::new();
    for (name, text) in inputs {
        docs.extend(documents(name, text)?);
    }
    let mut notes = Vec::new();
    let mut refusals = Vec::new();
    let mut cm: BTreeMap<String, String> = BTreeMap::new();
    let mut cm_at = None;
    let mut ingresses: Vec<Limits> = Vec::new();
    let mut paths: Vec<PathOut> = Vec::new();
    for doc in &docs {
        let v = &doc.value;
        match kind_of(v) {
            "ConfigMap" => {
                let name = text_at(v, &["metadata", "name"]).unwrap_or("");
                let data = v.get("data").and_then(Value::as_mapping);
                let controller = name.contains("ingress-nginx")
                    || name.contains("nginx-configuration")
                    || data.is_some_and(|d| {
                        d.keys().any(|k| {
                            k.as_str().is_some_and(|k| k.starts_with("limit-") || k == "use-forwarded-headers")
                        })
                    });
                if !controller {
                    notes.push(format!(
                        "{}: ConfigMap {name}: not the controller's (no limit or forwarded-header keys): skipped",
                        doc.at
                    ));
                    continue;
                }
                for (k, val) in data.into_iter().flatten() {
                    if let (Some(k), Some(val)) = (k.as_str(), val.as_str()) {
                        cm.insert(k.to_string(), val.to_string());
                    }
                }
                cm_at = Some(doc.at.clone());
            }
            "Ingress" => match ingress(doc, ingresses.len(), &mut paths, &mut notes) {
                Ok(l) => ingresses.push(l),
                Err(e) => refusals.push(e),
            },
            _ => {}
        }
    }
    if ingresses.is_empty() && refusals.is_empty() {
        return Err("no Ingress in the given files".into());
    }
    if !refusals.is_empty() {
        if !opts.allow_unexpressed {
            return Err(format!("{}\n(--allow-unexpressed imports the other Ingresses)", refusals.join("\n")));
        }
        notes.extend(refusals.into_iter().map(|r| format!("left out: {r}")));
    }
    let cm_where = cm_at.clone().unwrap_or_else(|| "ingress-nginx's default".into());
    let status = |key: &str| -> Result<u16, String> {
        match cm.get(key) {
            None => Ok(503),
            Some(s) => s
                .parse()
                .ok()
                .filter(|s| (400..=599).contains(s))
                .ok_or_else(|| format!("{cm_where}: {key} {s:?}: not a status 400-599")),
        }
    };
    // A ConfigMap value that is not a number is refused with its place, as an annotation's is:
    // imported silently as "no limit", it would drop the operator's bandwidth cap unseen.
    let kb = |key: &str| -> Result<Option<u64>, String> {
        match cm.get(key) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("{cm_where}: {key} {v:?}: not a whole number of kilobytes per second")),
        }
    };
    let (cm_rate, cm_rate_after) = (kb("limit-rate")?, kb("limit-rate-after")?);
    let req_status = status("limit-req-status-code")?;
    let conn_status = status("limit-conn-status-code")?;
    let mut toml = String::new();
    let names: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
    let _ = writeln!(
        toml,
        "# Imported from Kubernetes Ingress (ingress-nginx annotations) by `weir import-ingress` ({}).",
        names.join(", ")
    );
    let _ = writeln!(toml, "# One zone per Ingress and limit, as ingress-nginx generated them; docs/migrating-from-nginx.md explains the output.");
    let replicas = opts.replicas.unwrap_or(1).max(1);
    if opts.replicas.is_some() {
        let _ = writeln!(
            toml,
            "# ingress-nginx decided these limits in each of {replicas} controller replicas: {}.",
            if opts.keep_total {
                "rates are written as the total of all replicas (rate × replicas), now held fleet-wide"
            } else {
                "rates are written per replica (now fleet-wide: up to replicas× stricter than before)"
            }
        );
    }
    let _ = writeln!(toml, "\n[server]\nlisten = [{}]\n", quote(&opts.listen));
    let _ = writeln!(toml, "[store]\nkind = \"memory\"   # the fleet: kind = \"redis\", url = \"redis://…\"\n");
    if cm.get("use-forwarded-headers").is_some_and(|v| v == "true")
        || cm.get("compute-full-forwarded-for").is_some_and(|v| v == "true")
    {
        let cidrs = cm.get("proxy-real-ip-cidr").cloned().unwrap_or_else(|| "0.0.0.0/0".into());
        let trusted: Vec<String> = cidrs.split(',').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect();
        if trusted.iter().any(|c| c == "0.0.0.0/0" || c == "::/0") {
            notes.push(format!(
                "{cm_where}: use-forwarded-headers trusts X-Forwarded-For from every address (proxy-real-ip-cidr {cidrs}): any client can choose its own key; set proxy-real-ip-cidr to your load balancers"
            ));
        }
        let header = cm.get("forwarded-for-header").cloned().unwrap_or_else(|| "X-Forwarded-For".into());
        let _ = writeln!(
            toml,
            "[real_ip]   # {cm_where}: use-forwarded-headers, proxy-real-ip-cidr\ntrusted = {}\nheader = {}\n",
            list(&trusted),
            quote(&header)
        );
    }
    // Upstreams.
    let mut upstreams: BTreeMap<String, String> = BTreeMap::new();
    for p in &paths {
        upstreams.entry(sanitize(&p.backend)).or_insert_with(|| {
            let server = opts.upstream.clone().unwrap_or_else(|| p.backend.clone());
            format!(
                "[[upstream]]   # Service {}\nname = {}\nservers = [{}]\n",
                p.backend,
                quote(&sanitize(&p.backend)),
                quote(&server)
            )
        });
    }
    for u in upstreams.values() {
        let _ = writeln!(toml, "{u}");
    }
    // Zones.
    let mut zone_names: BTreeMap<(usize, &str), String> = BTreeMap::new();
    for (i, l) in ingresses.iter().enumerate() {
        for (kind, rate, unit) in [("rps", l.rps, "r/s"), ("rpm", l.rpm, "r/m")] {
            let Some(rate) = rate else { continue };
            let nginx_name = format!("{}_{kind}", l.name);
            let weir = short(&nginx_name);
            let written = rate * if opts.keep_total { replicas } else { 1 };
            if let Some(n) = opts.replicas {
                notes.push(format!(
                    "{}: limit-{kind} {rate}: across {n} replicas effectively {} {unit} (burst {}) in total; {}",
                    l.at,
                    rate * n,
                    rate * l.multiplier * n,
                    if opts.keep_total {
                        format!("written as {written}{unit} fleet-wide")
                    } else {
                        format!("written as {rate}{unit} fleet-wide ({n}× stricter)")
                    }
                ));
            }
            let _ = writeln!(toml, "[[limit_req_zone]]   # {}: nginx.ingress.kubernetes.io/limit-{kind}: \"{rate}\" (ingress-nginx zone {nginx_name})", l.at);
            let _ = writeln!(toml, "name = {}\nkey = \"ip\"\nrate = \"{written}{unit}\"", quote(&weir));
            toml.push('\n');
            zone_names.insert((i, kind), weir);
        }
        if l.connections.is_some() {
            let weir = short(&format!("{}_conn", l.name));
            let _ = writeln!(
                toml,
                "[[limit_conn_zone]]   # {}: nginx.ingress.kubernetes.io/limit-connections\nname = {}\nkey = \"ip\"\n",
                l.at,
                quote(&weir)
            );
            zone_names.insert((i, "conn"), weir);
        }
    }
    // Routes: per host, exact paths first, then by length (ingress-nginx sorts by length).
    let regex_hosts: Vec<Option<String>> =
        paths.iter().filter(|p| regex_path(&ingresses[p.ingress], &p.path)).map(|p| p.host.clone()).collect();
    let mut order: Vec<&PathOut> = paths.iter().collect();
    order.sort_by_key(|p| (p.host.is_none(), p.host.clone(), p.path_type != "Exact", std::cmp::Reverse(p.path.len())));
    for (n, p) in order.iter().enumerate() {
        let l = &ingresses[p.ingress];
        let as_regex = regex_hosts.contains(&p.host);
        let re = if as_regex {
            format!("(?i)^{}", p.path.trim_start_matches('^'))
        } else {
            match p.path_type.as_str() {
                "Exact" => format!("^{}$", regex::escape(&p.path)),
                "Prefix" if p.path == "/" => "^/".to_string(),
                "Prefix" => format!("^{}(/|$)", regex::escape(p.path.trim_end_matches('/'))),
                _ => format!("^{}", regex::escape(&p.path)),
            }
        };
        if regex::Regex::new(&re).is_err() {
            return Err(format!("{}: path {:?}: not a regex Weir reads (use-regex makes it one)", p.at, p.path));
        }
        let _ = writeln!(
            toml,
            "[[route]]   # {}: Ingress {} path {} ({}){}",
            p.at,
            l.name,
            p.path,
            p.path_type,
            if as_regex { ", a regex: use-regex/rewrite-target on this host" } else { "" }
        );
        let _ = writeln!(toml, "name = \"r{}\"\npath_regex = {}", n + 1, quote(&re));
        if let Some(h) = &p.host {
            let _ = writeln!(toml, "host = {}", quote(h));
        }
        let _ = writeln!(toml, "upstream = {}", quote(&sanitize(&p.backend)));
        // ingress-nginx keys every zone of the Ingress by a geo/map that is empty for the
        // whitelist: no limit (rate or connections) applies to those clients.
        let exempt = if l.allow.is_empty() {
            String::new()
        } else {
            format!(", unless = [ {{ ip = {} }} ]", crate::import::toml_text::list(&l.allow))
        };
        let mut entries = Vec::new();
        for (kind, rate) in [("rps", l.rps), ("rpm", l.rpm)] {
            if let (Some(rate), Some(z)) = (rate, zone_names.get(&(p.ingress, kind))) {
                let burst = rate * l.multiplier * if opts.keep_total { replicas } else { 1 };
                entries.push(format!("{{ zone = {}, burst = {burst}, nodelay = true{exempt} }}", quote(z)));
            }
        }
        if !entries.is_empty() {
            let _ = writeln!(
                toml,
                "limit_req = [{}]\nlimit_req_status = {req_status}   # limit-req-status-code ({cm_where})",
                entries.join(", ")
            );
        }
        if let (Some(max), Some(z)) = (l.connections, zone_names.get(&(p.ingress, "conn"))) {
            let _ = writeln!(
                toml,
                "limit_conn = [{{ zone = {}, max = {max}{exempt} }}]\nlimit_conn_status = {conn_status}",
                quote(z)
            );
        }
        // Without the annotation, ingress-nginx takes the ConfigMap's value (the default
        // backend's LimitRate / LimitRateAfter) for every location.
        let rate = l.rate.or(cm_rate);
        if let Some(rate) = rate.filter(|r| *r > 0) {
            let from = if l.rate.is_some() { "" } else { "   # limit-rate of the ConfigMap" };
            let _ = writeln!(toml, "limit_rate = \"{rate}k\"{from}");
            if let Some(after) = l.rate_after.or(cm_rate_after).filter(|a| *a > 0) {
                let _ = writeln!(toml, "limit_rate_after = \"{after}k\"");
            }
        }
        toml.push('\n');
    }
    let header: String = notes.iter().map(|n| format!("# NOTE: {n}\n")).collect();
    if let Some(i) = toml.find("\n[server]") {
        toml.insert_str(i + 1, &header);
    }
    Ok(Imported { toml, notes })
}

fn ingress(doc: &Doc, index: usize, paths: &mut Vec<PathOut>, notes: &mut Vec<String>) -> Result<Limits, String> {
    let v = &doc.value;
    let at = &doc.at;
    let name = text_at(v, &["metadata", "name"]).ok_or_else(|| format!("{at}: Ingress without metadata.name"))?;
    let ns = text_at(v, &["metadata", "namespace"]).unwrap_or("default");
    let uid = text_at(v, &["metadata", "uid"]);
    let zone = match uid {
        Some(u) => format!("{ns}_{name}_{u}"),
        None => format!("{ns}_{name}"),
    };
    let mut l = Limits {
        name: zone,
        at: at.clone(),
        rps: None,
        rpm: None,
        multiplier: 5,
        connections: None,
        allow: Vec::new(),
        rate: None,
        rate_after: None,
        regex: false,
        rewrite: None,
    };
    let number = |key: &str, val: &str| -> Result<u64, String> {
        val.trim()
            .parse()
            .map_err(|_| format!("{at}: Ingress {ns}/{name}: {PREFIX}{key}: {val:?} is not a whole number"))
    };
    if let Some(ann) = v.get("metadata").and_then(|m| m.get("annotations")).and_then(Value::as_mapping) {
        for (k, val) in ann {
            let (Some(k), Some(val)) = (
                k.as_str(),
                val.as_str()
                    .map(str::to_string)
                    .or_else(|| val.as_u64().map(|n| n.to_string()))
                    .or_else(|| val.as_bool().map(|b| b.to_string())),
            ) else {
                continue;
            };
            let Some(key) = k.strip_prefix(PREFIX) else { continue };
            match key {
                "limit-rps" => l.rps = Some(number(key, &val)?).filter(|n| *n > 0),
                "limit-rpm" => l.rpm = Some(number(key, &val)?).filter(|n| *n > 0),
                "limit-burst-multiplier" => l.multiplier = number(key, &val)?.max(1),
                "limit-connections" => l.connections = Some(number(key, &val)?).filter(|n| *n > 0),
                "limit-whitelist" | "limit-allowlist" => {
                    for c in val.split(',').map(str::trim).filter(|c| !c.is_empty()) {
                        let ok = c.parse::<ipnet::IpNet>().is_ok() || c.parse::<std::net::IpAddr>().is_ok();
                        if !ok {
                            return Err(format!("{at}: Ingress {ns}/{name}: {key}: {c:?} is not a CIDR"));
                        }
                        l.allow.push(c.to_string());
                    }
                }
                "limit-rate" => l.rate = Some(number(key, &val)?),
                "limit-rate-after" => l.rate_after = Some(number(key, &val)?),
                "use-regex" => l.regex |= val == "true",
                "rewrite-target" => {
                    l.rewrite = Some(val.clone());
                    notes.push(format!("{at}: Ingress {ns}/{name}: rewrite-target {val:?}: Weir forwards the path unchanged (a path it rewrites makes the host's paths regexes, as in ingress-nginx)"));
                }
                k if k.starts_with("global-rate-limit") => {
                    return Err(format!("{at}: Ingress {ns}/{name}: {PREFIX}{key}: ingress-nginx's global limit is a fixed window in memcached (lua-resty-global-throttle) with its own key syntax; Weir's limits with kind = \"redis\" are fleet-wide already: write it as a [[limit_req_zone]] by hand (rate = limit / window), or drop the annotation and keep limit-rps"))
                }
                "configuration-snippet" | "server-snippet" | "stream-snippet" => {
                    return Err(format!("{at}: Ingress {ns}/{name}: {PREFIX}{key}: raw nginx config inside the controller's; import it with `weir import-nginx` on the controller's `nginx -T`"))
                }
                k if k.starts_with("auth-") => {
                    return Err(format!("{at}: Ingress {ns}/{name}: {PREFIX}{key}: authentication runs in nginx; Weir would forward without it"))
                }
                "permanent-redirect" | "temporal-redirect" | "default-backend" | "custom-http-errors" | "whitelist-source-range" | "denylist-source-range" => {
                    return Err(format!("{at}: Ingress {ns}/{name}: {PREFIX}{key}: nginx answers these requests itself (not imported yet)"))
                }
                k if KNOWN_IGNORED.contains(&k) => {}
                other => notes.push(format!("{at}: Ingress {ns}/{name}: unknown annotation {PREFIX}{other}: not imported")),
            }
        }
    }
    let rules = v.get("spec").and_then(|s| s.get("rules")).and_then(Value::as_sequence).cloned().unwrap_or_default();
    if v.get("spec").and_then(|s| s.get("defaultBackend")).is_some() {
        notes.push(format!("{at}: Ingress {ns}/{name}: defaultBackend not imported"));
    }
    for rule in &rules {
        let host = rule.get("host").and_then(Value::as_str).map(str::to_string);
        for p in rule.get("http").and_then(|h| h.get("paths")).and_then(Value::as_sequence).into_iter().flatten() {
            let path = p.get("path").and_then(Value::as_str).unwrap_or("/").to_string();
            let path_type = p.get("pathType").and_then(Value::as_str).unwrap_or("ImplementationSpecific").to_string();
            let svc = text_at(p, &["backend", "service", "name"])
                .ok_or_else(|| format!("{at}: Ingress {ns}/{name}: path {path}: only Service backends are imported"))?;
            let port = p.get("backend").and_then(|b| b.get("service")).and_then(|s| s.get("port"));
            let port =
                port.and_then(|p| p.get("number")).and_then(Value::as_u64).map(|n| n.to_string()).ok_or_else(|| {
                    format!("{at}: Ingress {ns}/{name}: Service {svc}: a named port (give --upstream)")
                })?;
            paths.push(PathOut {
                host: host.clone(),
                path,
                path_type,
                backend: format!("{svc}.{ns}.svc.cluster.local:{port}"),
                ingress: index,
                at: at.clone(),
            });
        }
    }
    Ok(l)
}

/// ingress-nginx's enforceRegexModifier: a location with `use-regex`, or one whose
/// `rewrite-target` differs from its path (needsRewrite), makes every path of its host a regex.
fn regex_path(l: &Limits, path: &str) -> bool {
    l.regex || l.rewrite.as_ref().is_some_and(|t| !t.is_empty() && t != path)
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' }).collect()
}

/// Weir zone names are at most 128 characters (ingress-nginx's `<namespace>_<name>_<uid>_rps`
/// is ~75): longer ones keep their start and a hash of the whole name (the comment keeps it).
fn short(name: &str) -> String {
    let clean = sanitize(name);
    if clean.len() <= 128 {
        return clean;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(clean.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}_{hex}", &clean[..119])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFESTS: &str = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: api\n  namespace: shop\n  uid: 3f1c2a5e-8b7d-4c1e-9f00-1234567890ab\n  annotations:\n    nginx.ingress.kubernetes.io/limit-rps: \"10\"\n    nginx.ingress.kubernetes.io/limit-rpm: \"300\"\n    nginx.ingress.kubernetes.io/limit-burst-multiplier: \"3\"\n    nginx.ingress.kubernetes.io/limit-whitelist: \"10.0.0.0/8, 192.168.1.1\"\n    nginx.ingress.kubernetes.io/limit-connections: \"4\"\n    nginx.ingress.kubernetes.io/limit-rate: \"100\"\n    nginx.ingress.kubernetes.io/frobnicate: \"yes\"\nspec:\n  rules:\n  - host: shop.example.com\n    http:\n      paths:\n      - path: /api\n        pathType: Prefix\n        backend:\n          service:\n            name: api\n            port:\n              number: 8080\n      - path: /health\n        pathType: Exact\n        backend:\n          service:\n            name: api\n            port:\n              number: 8080\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: legacy\n  namespace: shop\n  annotations:\n    nginx.ingress.kubernetes.io/use-regex: \"true\"\nspec:\n  rules:\n  - host: shop.example.com\n    http:\n      paths:\n      - path: /v[12]/items\n        pathType: ImplementationSpecific\n        backend:\n          service:\n            name: legacy\n            port:\n              number: 80\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ingress-nginx-controller\ndata:\n  limit-req-status-code: \"429\"\n  use-forwarded-headers: \"true\"\n";

    fn run(opts: &Options) -> Imported {
        run_on(MANIFESTS, opts)
    }

    fn run_on(manifests: &str, opts: &Options) -> Imported {
        let o = Options { upstream: Some("127.0.0.1:9000".into()), listen: "127.0.0.1:8080".into(), ..opts.clone() };
        import(&[("m.yaml".into(), manifests.into())], &o).unwrap()
    }

    #[test]
    fn annotations_become_zones_and_routes_as_ingress_nginx_generated_them() {
        let out = run(&Options::default());
        let t = &out.toml;
        let rt = crate::config::from_text(t, "i.toml").unwrap_or_else(|e| panic!("{e}\n{t}"));
        assert!(t.contains("# m.yaml:2: nginx.ingress.kubernetes.io/limit-rps: \"10\""), "{t}");
        // ingress-nginx's own zone name (68 characters here) is the Weir zone's name.
        assert!(t.contains("name = \"shop_api_3f1c2a5e-8b7d-4c1e-9f00-1234567890ab_rps\""), "{t}");
        assert_eq!(short(&"x".repeat(300)).len(), 128);
        assert!(t.contains("rate = \"10r/s\"") && t.contains("rate = \"300r/m\""), "{t}");
        assert!(t.contains("burst = 30, nodelay = true") && t.contains("burst = 900, nodelay = true"), "{t}");
        // The whitelist exempts from every limit of the Ingress, limit_conn too (one geo/map key).
        assert_eq!(t.matches("unless = [ { ip = [\"10.0.0.0/8\", \"192.168.1.1\"] } ]").count(), 6, "{t}");
        assert!(t.contains("limit_req_status = 429"), "{t}");
        assert!(t.contains("limit_conn = [{ zone ="), "{t}");
        assert!(t.contains("limit_rate = \"100k\""), "{t}");
        assert!(out.notes.iter().any(|n| n.contains("unknown annotation nginx.ingress.kubernetes.io/frobnicate")));
        assert!(out.notes.iter().any(|n| n.contains("trusts X-Forwarded-For from every address")));
        // use-regex on one Ingress of the host: every path of the host is a case-insensitive regex.
        let pick = |path: &str| {
            let i =
                crate::routes::find(&rt.matchers, rt.route_order, Some("shop.example.com"), &http::Method::GET, path)?;
            Some(rt.routes[i].name.clone())
        };
        assert!(t.contains("path_regex = \"(?i)^/api\""), "{t}");
        assert_eq!(pick("/API/x"), pick("/api/x"));
        assert!(pick("/V1/items").is_some());
        assert_eq!(pick("/other"), None);
    }

    #[test]
    fn replicas_are_reported_and_the_total_can_be_kept() {
        let out = run(&Options { replicas: Some(3), ..Options::default() });
        assert!(
            out.notes.iter().any(|n| n.contains("limit-rps 10: across 3 replicas effectively 30 r/s (burst 90)")),
            "{:?}",
            out.notes
        );
        assert!(out.toml.contains("rate = \"10r/s\""));
        let kept = run(&Options { replicas: Some(3), keep_total: true, ..Options::default() });
        assert!(
            kept.toml.contains("rate = \"30r/s\"") && kept.toml.contains("burst = 90, nodelay = true"),
            "{}",
            kept.toml
        );
    }

    #[test]
    fn a_configmap_limit_rate_that_is_not_a_number_is_refused_with_its_place() {
        for (key, value) in [("limit-rate", "90k"), ("limit-rate-after", "lots"), ("limit-rate", "-1")] {
            let bad = MANIFESTS.replace("  use-forwarded-headers: \"true\"\n", &format!("  {key}: \"{value}\"\n"));
            let o = Options {
                upstream: Some("127.0.0.1:9000".into()),
                listen: "127.0.0.1:8080".into(),
                ..Options::default()
            };
            let err = import(&[("m.yaml".into(), bad)], &o).err().unwrap_or_else(|| panic!("{key}: {value} imported"));
            assert!(err.contains(key) && err.contains(value) && err.contains("m.yaml"), "{err}");
        }
    }

    #[test]
    fn the_configmaps_limit_rate_applies_where_no_annotation_sets_one() {
        // kubernetes/ingress-nginx test/e2e/settings/limit_rate.go: `limit-rate: "90"` in the
        // ConfigMap is `limit_rate 90k;` in every location; an annotation still wins.
        let with = MANIFESTS
            .replace("  use-forwarded-headers: \"true\"\n", "  limit-rate: \"90\"\n  limit-rate-after: \"64\"\n");
        let t = run_on(&with, &Options::default()).toml;
        let legacy = &t[t.find("Ingress shop_legacy").unwrap()..];
        assert!(
            legacy.contains("limit_rate = \"90k\"   # limit-rate of the ConfigMap\nlimit_rate_after = \"64k\""),
            "{t}"
        );
        let api = &t[t.find("Ingress shop_api").unwrap()..];
        assert!(api.contains("limit_rate = \"100k\"\nlimit_rate_after = \"64k\""), "{t}");
    }

    #[test]
    fn a_rewrite_target_equal_to_its_path_leaves_the_paths_plain() {
        // nasirnjs/kubernetes ingress-rate-limit/ingress.yaml: rewrite-target "/" on path "/".
        let same = MANIFESTS.replace(
            "    nginx.ingress.kubernetes.io/use-regex: \"true\"\n",
            "    nginx.ingress.kubernetes.io/rewrite-target: /v[12]/items\n",
        );
        let t = run_on(&same, &Options::default()).toml;
        assert!(!t.contains("(?i)"), "{t}");
        let other = same.replace("rewrite-target: /v[12]/items", "rewrite-target: /$1");
        let t = run_on(&other, &Options::default()).toml;
        assert!(t.contains("path_regex = \"(?i)^/api\""), "{t}");
    }

    #[test]
    fn bad_values_and_templates_are_refused_with_file_and_line() {
        let bad = MANIFESTS.replace("limit-rps: \"10\"", "limit-rps: \"ten\"");
        let e = import(&[("m.yaml".into(), bad)], &Options::default()).unwrap_err();
        assert!(e.starts_with("m.yaml:2: Ingress shop/api: nginx.ingress.kubernetes.io/limit-rps"), "{e}");
        let e = import(
            &[("t.yaml".into(), "---\nkind: Ingress\nmetadata:\n  name: {{ .Release.Name }}\n".into())],
            &Options::default(),
        )
        .unwrap_err();
        assert!(e.starts_with("t.yaml:2: template syntax"), "{e}");
    }
}
