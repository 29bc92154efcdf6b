//! An nginx zone key (a complex value: text and `$variables`, through `map` and `geo` chains)
//! as a Weir key plus the conditions under which nginx's key is empty (nginx does not limit an
//! empty key). The allow-list idioms — a `geo` of trusted networks, a bypass token in a `map`, a
//! `map $request_method` that limits POSTs only — become `unless` / `when` conditions on every
//! reference to the zone, so the token is never part of the key (a made-up token would get a
//! fresh bucket: the key trap). Where a geo nests networks so that a condition list cannot say
//! it ("10/8 is exempt except 10.1/16") and the address is the key, per-key overrides do.

use super::model::{Http, Table};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Ip,
    Header(String),
    Cookie(String),
    Query(String),
    Const(String),
}

impl Part {
    pub fn weir(&self) -> String {
        match self {
            Part::Ip => "ip".into(),
            Part::Header(h) => format!("header:{h}"),
            Part::Cookie(c) => format!("cookie:{c}"),
            Part::Query(q) => format!("query:{q}"),
            Part::Const(c) => format!("const:{c}"),
        }
    }
}

/// One override: a match (`10.0.0.0/8`, `header:X-Token=abc`) and whether it exempts (else the
/// zone's own rate: a more specific entry that keeps the limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub matches: String,
    pub exempt: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPlan {
    pub parts: Vec<Part>,
    pub overrides: Vec<Override>,
    /// Weir conditions (TOML inline tables) under which the key is set: all must hold.
    pub when: Vec<String>,
    /// Weir conditions under which nginx's key is empty: any exempts.
    pub unless: Vec<String>,
    /// The key holds `$server_name`: one zone per server, keyed by its name.
    pub per_server: bool,
    pub notes: Vec<String>,
}

/// A condition a `map`/`geo` entry puts on the request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cond {
    Net(String),
    Equals(Part, String),
    /// `map $request_method`.
    Method(String),
}

/// The key text of a zone (`$binary_remote_addr`, `$limit_key`, `"$host$uri"`).
pub fn plan(key: &str, http: &Http) -> Result<KeyPlan, String> {
    let pieces = split(key)?;
    if let [Piece::Var(v)] = pieces.as_slice() {
        if let Some(t) = http.tables.get(v.as_str()) {
            return table_plan(v, t, http);
        }
    }
    let mut out = KeyPlan {
        parts: Vec::new(),
        overrides: Vec::new(),
        when: Vec::new(),
        unless: Vec::new(),
        per_server: false,
        notes: Vec::new(),
    };
    for p in pieces {
        match p {
            Piece::Text(t) => out.parts.push(Part::Const(t)),
            Piece::Var(v) if v == "server_name" => out.per_server = true,
            Piece::Var(v) if http.tables.contains_key(v.as_str()) => {
                return Err(format!(
                    "`${v}` (a map/geo) inside a longer key: only a key that is one map/geo variable is imported"
                ));
            }
            Piece::Var(v) => out.parts.push(simple(&v, &mut out.notes)?),
        }
    }
    Ok(out)
}

/// A request variable as a key part.
fn simple(var: &str, notes: &mut Vec<String>) -> Result<Part, String> {
    Ok(match var {
        "binary_remote_addr" | "remote_addr" => Part::Ip,
        "host" | "http_host" => {
            notes.push(format!(
                "`${var}` keyed as the Host header: nginx lowercases it and drops the port, Weir keys the header as sent"
            ));
            Part::Header("Host".into())
        }
        v if v.starts_with("http_") => Part::Header(header_name(&v[5..])),
        v if v.starts_with("cookie_") => Part::Cookie(v[7..].to_string()),
        v if v.starts_with("arg_") => Part::Query(v[4..].to_string()),
        v => {
            return Err(format!(
                "`${v}` has no Weir key part (keys: client address, headers, cookies, query arguments, constants)"
            ))
        }
    })
}

/// `x_api_key` → `X-Api-Key` (header names are case-insensitive; this is only for reading).
fn header_name(var: &str) -> String {
    var.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// `map`/`geo` chains: every entry becomes (condition, value); the values must all be one key
/// or empty, and each condition must be expressible as an override of that key.
fn table_plan(var: &str, t: &Table, http: &Http) -> Result<KeyPlan, String> {
    let cases = cases(var, t, http, 0)?;
    let mut notes = Vec::new();
    let mut parts: Option<Vec<Part>> = None;
    let mut resolved = Vec::new();
    for (cond, value) in &cases {
        if value.is_empty() {
            resolved.push((cond.clone(), None));
            continue;
        }
        let mut p = Vec::new();
        for piece in split(value)? {
            match piece {
                Piece::Text(t) => p.push(Part::Const(t)),
                Piece::Var(v) => p.push(simple(&v, &mut notes).map_err(|e| format!("`${var}`: {e}"))?),
            }
        }
        match &parts {
            None => parts = Some(p.clone()),
            Some(q) if *q == p => {}
            Some(q) => {
                return Err(format!(
                    "`${var}` gives different keys ({} and {}) depending on the request: Weir has no per-request \
                     choice of key (a different key would need a zone of its own)",
                    describe(q),
                    describe(&p)
                ))
            }
        }
        resolved.push((cond.clone(), Some(p)));
    }
    let Some(parts) = parts else {
        return Err(format!("`${var}` is always empty: nginx never limits with it (drop the limit instead)"));
    };
    let default_limited = resolved.last().is_some_and(|(c, v)| c.is_none() && v.is_some());
    let listed: Vec<(Cond, bool)> = resolved.iter().filter_map(|(c, v)| c.clone().map(|c| (c, v.is_none()))).collect();
    if let Some((when, unless)) = conditions(&listed, default_limited) {
        return Ok(KeyPlan { parts, overrides: Vec::new(), when, unless, per_server: false, notes });
    }
    // Nested networks with different answers: per-key overrides, most specific first.
    let mut overrides = Vec::new();
    for (cond, value) in resolved {
        let exempt = value.is_none();
        let matches = match cond {
            None if exempt => default_everyone(&parts).ok_or_else(|| {
                format!("`${var}`: only the listed values are limited; Weir cannot say \"every other value is exempt\" for this key")
            })?,
            None => continue,
            Some(Cond::Net(n)) if parts.contains(&Part::Ip) => vec![n],
            Some(_) => {
                return Err(format!(
                    "`${var}`: its entries cannot be said as a list of conditions (networks with different answers \
                     nested in each other while the client address is not the key, or an empty value among several \
                     limited ones)"
                ))
            }
        };
        overrides.extend(matches.into_iter().map(|m| Override { matches: m, exempt }));
    }
    // Entries that keep the zone's rate and come last change nothing.
    while overrides.last().is_some_and(|o| !o.exempt) {
        overrides.pop();
    }
    Ok(KeyPlan { parts, overrides, when: Vec::new(), unless: Vec::new(), per_server: false, notes })
}

/// The listed entries (condition, exempt) as `when` (default exempt: the limited entries) or
/// `unless` (default limited: the exempt entries) conditions; `None` when a list cannot say it:
/// a network of the other answer nested more specifically inside one of the list's networks
/// (geo picks the most specific), or an empty value among several limited ones.
fn conditions(listed: &[(Cond, bool)], default_limited: bool) -> Option<(Vec<String>, Vec<String>)> {
    // The entries that differ from the default.
    let picked: Vec<&Cond> = listed.iter().filter(|(_, exempt)| *exempt == default_limited).map(|(c, _)| c).collect();
    if picked.is_empty() {
        return Some((Vec::new(), Vec::new()));
    }
    let mut nets = Vec::new();
    let mut methods = Vec::new();
    let mut values: Vec<(&Part, &str)> = Vec::new();
    for c in &picked {
        match c {
            Cond::Net(n) => nets.push(n.clone()),
            Cond::Method(m) => methods.push(m.clone()),
            Cond::Equals(p, v) => values.push((p, v)),
        }
    }
    // Sorted most specific first: a net of the default's answer listed before one of ours
    // and inside it would be swallowed by our list.
    for (i, (c, exempt)) in listed.iter().enumerate() {
        let (Cond::Net(inner), true) = (c, *exempt != default_limited) else { continue };
        let Ok(inner) = inner.parse::<ipnet::IpNet>() else { return None };
        let swallowed = listed[i + 1..].iter().any(|(o, e)| {
            *e == default_limited
                && matches!(o, Cond::Net(outer) if outer.parse::<ipnet::IpNet>().is_ok_and(|n| n.contains(&inner)))
        });
        if swallowed {
            return None;
        }
    }
    let mut out = Vec::new();
    if !nets.is_empty() {
        out.push(format!("{{ ip = {} }}", list_text(&nets)));
    }
    if !methods.is_empty() {
        out.push(format!("{{ method = {} }}", list_text(&methods)));
    }
    let subject = |p: &Part| match p {
        Part::Header(h) => Some(format!("header = {}", quote_text(h))),
        Part::Cookie(c) => Some(format!("cookie = {}", quote_text(c))),
        Part::Query(q) => Some(format!("query = {}", quote_text(q))),
        Part::Ip | Part::Const(_) => None,
    };
    if default_limited {
        // unless: any one exempts.
        for (p, v) in &values {
            let s = subject(p)?;
            out.push(if v.is_empty() {
                format!("{{ {s}, present = false }}")
            } else {
                format!("{{ {s}, equals = {} }}", quote_text(v))
            });
        }
        return Some((Vec::new(), out));
    }
    // when: one condition must cover every limited entry (a list of `when` is an AND).
    if out.len() + usize::from(!values.is_empty()) > 1 {
        return None;
    }
    if let Some((p, _)) = values.first() {
        if values.iter().any(|(q, v)| q != p || v.is_empty()) {
            return None;
        }
        let s = subject(p)?;
        let alternatives: Vec<String> = values.iter().map(|(_, v)| regex::escape(v)).collect();
        out.push(match values.as_slice() {
            [(_, v)] => format!("{{ {s}, equals = {} }}", quote_text(v)),
            _ => format!("{{ {s}, matches = {} }}", quote_text(&format!("^(?:{})$", alternatives.join("|")))),
        });
    }
    Some((out, Vec::new()))
}

fn quote_text(s: &str) -> String {
    crate::import::toml_text::quote(s)
}

fn list_text(items: &[String]) -> String {
    crate::import::toml_text::list(items)
}

/// "Everyone else", for a key whose default maps to "".
fn default_everyone(parts: &[Part]) -> Option<Vec<String>> {
    parts.contains(&Part::Ip).then(|| vec!["0.0.0.0/0".to_string(), "::/0".to_string()])
}

fn describe(parts: &[Part]) -> String {
    let v: Vec<String> = parts.iter().map(Part::weir).collect();
    format!("[{}]", v.join(", "))
}

const MAX_CHAIN: usize = 8;

/// (condition, value text) in the order nginx decides them, the default last (`None`).
fn cases(var: &str, t: &Table, http: &Http, depth: usize) -> Result<Vec<(Option<Cond>, String)>, String> {
    if let Some(u) = &t.unsupported {
        return Err(format!("`${var}`: {u} is not imported"));
    }
    if depth > MAX_CHAIN {
        return Err(format!("`${var}`: map/geo chain deeper than {MAX_CHAIN}"));
    }
    let source = t.source.trim_start_matches('$');
    let source = source.trim_start_matches('{').trim_end_matches('}');
    let mut out = Vec::new();
    if t.geo {
        if !matches!(source, "remote_addr" | "binary_remote_addr") {
            return Err(format!("`${var}`: a geo over {} (only the client address is imported)", t.source));
        }
        // Longest prefix first: geo picks the most specific network.
        let mut nets: Vec<(ipnet::IpNet, String)> = Vec::new();
        for (k, v) in &t.entries {
            let net = k
                .parse::<ipnet::IpNet>()
                .or_else(|_| k.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| format!("{}: geo `${var}`: {k:?} is not an address or CIDR", t.at))?;
            nets.push((net, v.clone()));
        }
        nets.sort_by_key(|(n, _)| std::cmp::Reverse(n.prefix_len()));
        out.extend(nets.into_iter().map(|(n, v)| (Some(Cond::Net(n.to_string())), v)));
        out.push((None, t.default.clone()));
        return Ok(out);
    }
    if let Some(inner) = http.tables.get(source) {
        // A chain: the inner table's values are looked up in this one.
        for (cond, value) in cases(source, inner, http, depth + 1)? {
            if value.contains('$') {
                return Err(format!("`${var}`: looks up `${source}`, whose value {value:?} is not constant"));
            }
            let mapped = t.entries.iter().find(|(k, _)| *k == value).map_or(&t.default, |(_, v)| v);
            out.push((cond, mapped.clone()));
        }
        return Ok(out);
    }
    if source == "request_method" {
        out.extend(t.entries.iter().map(|(k, v)| (Some(Cond::Method(k.clone())), v.clone())));
        out.push((None, t.default.clone()));
        return Ok(out);
    }
    let mut notes = Vec::new();
    let part = simple(source, &mut notes).map_err(|e| format!("`${var}`: a map over {}: {e}", t.source))?;
    for (k, v) in &t.entries {
        let cond = match part {
            Part::Ip => Cond::Net(k.clone()),
            ref p => Cond::Equals(p.clone(), k.clone()),
        };
        out.push((Some(cond), v.clone()));
    }
    out.push((None, t.default.clone()));
    Ok(out)
}

#[derive(Debug, PartialEq)]
enum Piece {
    Text(String),
    Var(String),
}

/// `a$b${c}d` → Text(a) Var(b) Var(c) Text(d).
fn split(value: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            text.push(c);
            continue;
        }
        if !text.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut text)));
        }
        let mut name = String::new();
        if chars.peek() == Some(&'{') {
            chars.next();
            for c in chars.by_ref() {
                if c == '}' {
                    break;
                }
                name.push(c);
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    name.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
        }
        if name.is_empty() {
            return Err(format!("{value:?}: a `$` without a variable name"));
        }
        out.push(Piece::Var(name));
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::{lexer::parse, model::read};
    use super::*;

    fn http(body: &str) -> Http {
        read(&parse("k.conf", &format!("http {{\n{body}\n}}\n")).unwrap()).unwrap()
    }

    #[test]
    fn plain_and_composite_keys() {
        let h = http("");
        let p = plan("$binary_remote_addr", &h).unwrap();
        assert_eq!(p.parts, [Part::Ip]);
        let p = plan("$http_x_api_key:$cookie_sid$arg_t", &h).unwrap();
        assert_eq!(
            p.parts,
            [
                Part::Header("X-Api-Key".into()),
                Part::Const(":".into()),
                Part::Cookie("sid".into()),
                Part::Query("t".into())
            ]
        );
        assert!(plan("$server_name", &h).unwrap().per_server);
        assert!(plan("$request_uri", &h).unwrap_err().contains("no Weir key part"));
    }

    #[test]
    fn geo_map_whitelist_becomes_unlimited_overrides_most_specific_first() {
        let h = http(
            "geo $limited { default 1; 10.0.0.0/8 0; 10.1.0.0/16 1; 192.168.1.7 0; }\n\
             map $limited $key { 0 \"\"; 1 $binary_remote_addr; }",
        );
        let p = plan("$key", &h).unwrap();
        assert_eq!(p.parts, [Part::Ip]);
        let o: Vec<(String, bool)> = p.overrides.iter().map(|o| (o.matches.clone(), o.exempt)).collect();
        assert_eq!(o, [("192.168.1.7/32".into(), true), ("10.1.0.0/16".into(), false), ("10.0.0.0/8".into(), true)]);
    }

    #[test]
    fn exemptions_by_what_is_not_the_key_become_conditions() {
        let h = http("map $http_x_bypass $key { default $binary_remote_addr; s3cret \"\"; }");
        let p = plan("$key", &h).unwrap();
        assert_eq!(p.parts, [Part::Ip]);
        assert_eq!(p.unless, ["{ header = \"X-Bypass\", equals = \"s3cret\" }"]);
        let h = http("map $request_method $key { default \"\"; POST $binary_remote_addr; PUT $binary_remote_addr; }");
        let p = plan("$key", &h).unwrap();
        assert_eq!((p.when.as_slice(), p.unless.len()), (&["{ method = [\"POST\", \"PUT\"] }".to_string()][..], 0));
        let h = http("geo $key { default $binary_remote_addr; 10.0.0.0/8 \"\"; 192.168.0.0/16 \"\"; }");
        // Most specific first, as geo decides.
        assert_eq!(plan("$key", &h).unwrap().unless, ["{ ip = [\"192.168.0.0/16\", \"10.0.0.0/8\"] }"]);
        let h = http("map $cookie_tier $key { default \"\"; free $binary_remote_addr; trial $binary_remote_addr; }");
        assert_eq!(plan("$key", &h).unwrap().when, ["{ cookie = \"tier\", matches = \"^(?:free|trial)$\" }"]);
        let h = http("map $http_user_agent $key { default \"\"; ~bot $binary_remote_addr; }");
        assert!(plan("$key", &h).unwrap_err().contains("regex"));
        let h = http("map $http_x_tier $key { default $binary_remote_addr; gold $http_x_api_key; }");
        assert!(plan("$key", &h).unwrap_err().contains("different keys"));
        let h = http("map $http_x_api_key $key { default $http_x_api_key; internal \"\"; }");
        let p = plan("$key", &h).unwrap();
        assert_eq!(p.unless, ["{ header = \"X-Api-Key\", equals = \"internal\" }"]);
        // Nested networks with different answers while the key is not the address: refused.
        let h = http("geo $g { default 1; 10.0.0.0/8 0; 10.1.0.0/16 1; }\n map $g $key { 0 \"\"; 1 $http_x_api_key; }");
        assert!(plan("$key", &h).unwrap_err().contains("cannot be said"));
    }
}
