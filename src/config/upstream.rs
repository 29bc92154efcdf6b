//! `[[upstream]]`: servers with weights, timeouts, passive and active health, retries and DNS
//! re-resolution, compiled into [`UpstreamSpec`]s. Names are nginx's where nginx has one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use super::spanned::Spanned;
use crate::adaptive::{AdaptiveSpec, QueueSettings, Settings as AdaptiveSettings};

use super::checks::{check_name, parse_duration, unique};
use super::each::Each;
use super::error::{ConfigError, Source};
use super::schema;
use crate::upstream::{
    tls, CheckKind, HealthCheckSpec, Protocol, RetryPolicy, ServerSpec, Timeouts, Upstream, UpstreamSpec, UpstreamTls,
    MAX_TRIES,
};

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_FAIL_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_RESOLVE_INTERVAL: Duration = Duration::from_secs(30);
const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);
const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_RISE: i64 = 2;
const DEFAULT_FALL: i64 = 3;
const MAX_WEIGHT: i64 = 1000;
const MAX_CONNS: i64 = 1_000_000;
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_millis(50);
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Every upstream that compiles, and an error for each that does not (see `each`).
pub(super) fn compile_upstreams(
    src: &Source<'_>,
    list: Vec<Spanned<schema::Upstream>>,
    warnings: &mut Vec<String>,
) -> Each<Upstream> {
    let mut seen = HashMap::new();
    let mut out = Each::default();
    for up in list {
        let up = up.into_inner();
        let name = up.name.get_ref().clone();
        let compiled = || {
            check_name(src, &up.name, "upstream.name")?;
            unique(src, &mut seen, &up.name, "upstream")?;
            compile_one(src, up, warnings).map(Upstream::new)
        };
        out.push(&name, compiled());
    }
    out
}

/// Errors about one upstream: `file:line: upstream "app": field: what`.
struct Ctx<'a, 'b> {
    src: &'a Source<'b>,
    name: String,
}

impl Ctx<'_, '_> {
    fn err(&self, span: &Range<usize>, field: &str, what: impl std::fmt::Display) -> ConfigError {
        self.src.error_at(span, format!("upstream {:?}: {field}: {what}", self.name))
    }

    fn int(&self, v: &Option<Spanned<i64>>, field: &str, range: (i64, i64), default: i64) -> Result<i64, ConfigError> {
        match v {
            None => Ok(default),
            Some(v) if (range.0..=range.1).contains(v.get_ref()) => Ok(*v.get_ref()),
            Some(v) => {
                Err(self.err(&v.span(), field, format!("must be {}..={}, got {}", range.0, range.1, v.get_ref())))
            }
        }
    }

    fn duration(
        &self,
        v: &Option<Spanned<String>>,
        field: &str,
        min: Duration,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let Some(v) = v else { return Ok(default) };
        self.duration_text(v.get_ref(), &v.span(), field, min)
    }

    fn duration_text(
        &self,
        text: &str,
        span: &Range<usize>,
        field: &str,
        min: Duration,
    ) -> Result<Duration, ConfigError> {
        match parse_duration(text) {
            Some(d) if d >= min && d <= MAX_TIMEOUT => Ok(d),
            Some(_) => Err(self.err(span, field, format!("must be between {min:?} and 24h, got {text:?}"))),
            None => Err(self.err(
                span,
                field,
                format!("expected a duration like \"500ms\", \"5s\" or \"1m\", got {text:?}"),
            )),
        }
    }
}

fn compile_one(
    src: &Source<'_>,
    mut up: schema::Upstream,
    warnings: &mut Vec<String>,
) -> Result<UpstreamSpec, ConfigError> {
    let cx = Ctx { src, name: up.name.get_ref().clone() };
    let (tls, protocol) = compile_tls(&cx, &mut up, warnings)?;
    if up.servers.get_ref().is_empty() {
        return Err(cx.err(&up.servers.span(), "servers", "must list at least one address"));
    }
    let max_fails = cx.int(&up.max_fails, "max_fails", (0, 1000), 1)? as u32;
    let fail_timeout = cx.duration(&up.fail_timeout, "fail_timeout", Duration::from_millis(1), DEFAULT_FAIL_TIMEOUT)?;
    let max_conns = up.max_conns.as_ref().map(|_| cx.int(&up.max_conns, "max_conns", (1, MAX_CONNS), 0)).transpose()?;
    let defaults = ServerSpec {
        target: String::new(),
        is_name: false,
        weight: 1,
        max_fails,
        fail_timeout,
        max_conns: max_conns.map(|m| m as usize),
        addrs: Vec::new(),
        unix: None,
    };
    let resolver = match &up.resolver {
        None => None,
        Some(r) => Some(
            r.get_ref()
                .parse::<SocketAddr>()
                .or_else(|_| r.get_ref().parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| cx.err(&r.span(), "resolver", format!("{:?} is not an IP or IP:port", r.get_ref())))?,
        ),
    };
    let servers = up
        .servers
        .get_ref()
        .iter()
        .map(|s| compile_server(&cx, s, &defaults, resolver, warnings))
        .collect::<Result<Vec<_>, _>>()?;

    if let Some(UpstreamTls { sni: None, .. }) = &tls {
        // Each server's host is its SNI and the name its certificate must carry.
        for (server, entry) in servers.iter().zip(up.servers.get_ref()) {
            let host = tls::host_of(&server.target);
            if rustls_pki_types::ServerName::try_from(host).is_err() {
                return Err(cx.err(
                    &entry.span(),
                    "servers",
                    format!("{host:?} cannot be sent as a TLS server name: set sni = \"the name on the certificate\""),
                ));
            }
        }
    }
    let timeouts = Timeouts {
        connect: cx.duration(
            &up.connect_timeout,
            "connect_timeout",
            Duration::from_millis(1),
            DEFAULT_CONNECT_TIMEOUT,
        )?,
        read: cx.duration(&up.read_timeout, "read_timeout", Duration::from_millis(1), DEFAULT_IO_TIMEOUT)?,
        send: cx.duration(&up.send_timeout, "send_timeout", Duration::from_millis(1), DEFAULT_IO_TIMEOUT)?,
        idle: cx.duration(&up.idle_timeout, "idle_timeout", Duration::from_millis(1), DEFAULT_IO_TIMEOUT)?,
    };
    let keepalive = cx.int(&up.keepalive, "keepalive", (0, 100_000), 32)? > 0;
    let tries = up.tries.as_ref().map(|_| cx.int(&up.tries, "tries", (1, i64::from(MAX_TRIES)), 1)).transpose()?;
    let timeout = match &up.next_upstream_timeout {
        // nginx: 0 turns the limit off.
        Some(t) if t.get_ref().trim() == "0" => None,
        t => t
            .as_ref()
            .map(|t| cx.duration_text(t.get_ref(), &t.span(), "next_upstream_timeout", Duration::from_millis(1)))
            .transpose()?,
    };
    let retry = compile_next_upstream(&cx, up.next_upstream.as_ref(), tries.map(|t| t as u32), timeout)?;
    let resolve_interval =
        cx.duration(&up.resolve_interval, "resolve_interval", MIN_INTERVAL, DEFAULT_RESOLVE_INTERVAL)?;
    let check_span = up.health_check.as_ref().map(|h| h.span());
    let health_check = up.health_check.map(|h| compile_check(&cx, h)).transpose()?;
    if let (Some(h), Some(span)) = (&health_check, check_span) {
        if h.port.is_some() && servers.iter().any(|s| s.unix.is_some()) {
            return Err(cx.err(&span, "health_check.port", "a unix socket server has no port: remove port"));
        }
    }
    let adaptive = up.adaptive.map(|a| compile_adaptive(&cx, a)).transpose()?;
    Ok(UpstreamSpec {
        name: cx.name.clone(),
        servers,
        timeouts,
        keepalive,
        health_check,
        retry,
        resolve_interval,
        resolver,
        tls,
        protocol,
        adaptive,
    })
}

/// `adaptive = { ... }`: bounds, tolerance, window and queue (docs/adaptive.md).
fn compile_adaptive(cx: &Ctx<'_, '_>, a: Spanned<schema::Adaptive>) -> Result<AdaptiveSpec, ConfigError> {
    let span = a.span();
    let a = a.into_inner();
    let defaults = AdaptiveSettings::default();
    let bound = (1, 100_000);
    let min_limit = cx.int(&a.min_limit, "adaptive.min_limit", bound, i64::from(defaults.min_limit))? as u32;
    let max_limit = cx.int(&a.max_limit, "adaptive.max_limit", bound, i64::from(defaults.max_limit))? as u32;
    if min_limit > max_limit {
        return Err(cx.err(&span, "adaptive", format!("min_limit {min_limit} is above max_limit {max_limit}")));
    }
    let initial = cx.int(&a.initial_limit, "adaptive.initial_limit", bound, i64::from(defaults.initial_limit))? as u32;
    let tolerance = match &a.tolerance {
        None => defaults.tolerance,
        Some(t) if (1.05..=10.0).contains(t.get_ref()) => *t.get_ref(),
        Some(t) => {
            return Err(cx.err(&t.span(), "adaptive.tolerance", format!("must be 1.05..=10, got {}", t.get_ref())))
        }
    };
    let window = cx.duration(&a.window, "adaptive.window", Duration::from_millis(10), defaults.window)?;
    if window > Duration::from_secs(60) {
        return Err(cx.err(&span, "adaptive.window", "must be at most 60s"));
    }
    let max_waiting = cx.int(&a.queue, "adaptive.queue", (0, 100_000), 0)? as usize;
    let timeout =
        cx.duration(&a.queue_timeout, "adaptive.queue_timeout", Duration::from_millis(1), DEFAULT_QUEUE_TIMEOUT)?;
    Ok(AdaptiveSpec {
        controller: AdaptiveSettings {
            min_limit,
            max_limit,
            initial_limit: initial.clamp(min_limit, max_limit),
            tolerance,
            window,
        },
        queue: QueueSettings { max_waiting, timeout },
    })
}

/// `tls`, `sni`, `verify`, `ca_file`, `client_cert`, `client_key` and `protocol`. Files are read
/// and checked here, so `weir check` and a reload refuse what a handshake would fail on.
fn compile_tls(
    cx: &Ctx<'_, '_>,
    up: &mut schema::Upstream,
    warnings: &mut Vec<String>,
) -> Result<(Option<UpstreamTls>, Protocol), ConfigError> {
    let on = up.tls.as_ref().is_some_and(|t| *t.get_ref());
    let protocol = match &up.protocol {
        None => Protocol::H1,
        Some(p) => match (p.get_ref().as_str(), on) {
            ("h1", _) => Protocol::H1,
            ("h2", true) => Protocol::H2,
            ("h2c", false) => Protocol::H2c,
            ("h2", false) => {
                return Err(cx.err(
                    &p.span(),
                    "protocol",
                    "\"h2\" is HTTP/2 over TLS: add tls = true, or use \"h2c\" for cleartext HTTP/2",
                ))
            }
            ("h2c", true) => {
                return Err(cx.err(&p.span(), "protocol", "\"h2c\" is cleartext HTTP/2: with tls = true use \"h2\""))
            }
            (other, _) => {
                return Err(cx.err(&p.span(), "protocol", format!("expected \"h1\", \"h2\" or \"h2c\", got {other:?}")))
            }
        },
    };
    if !on {
        let tls_only = [
            ("sni", up.sni.as_ref().map(|v| v.span())),
            ("verify", up.verify.as_ref().map(|v| v.span())),
            ("ca_file", up.ca_file.as_ref().map(|v| v.span())),
            ("client_cert", up.client_cert.as_ref().map(|v| v.span())),
            ("client_key", up.client_key.as_ref().map(|v| v.span())),
        ];
        if let Some((field, Some(span))) = tls_only.into_iter().find(|(_, s)| s.is_some()) {
            return Err(cx.err(&span, field, "only applies with tls = true"));
        }
        return Ok((None, protocol));
    }
    let sni = match up.sni.take() {
        None => None,
        Some(s) => {
            let text = s.get_ref().trim();
            if text.is_empty() || rustls_pki_types::ServerName::try_from(text).is_err() {
                return Err(cx.err(
                    &s.span(),
                    "sni",
                    format!(
                        "{:?} is not a DNS name or IP address (leave sni out to send each server's host)",
                        s.get_ref()
                    ),
                ));
            }
            Some(text.to_ascii_lowercase())
        }
    };
    let verify = up.verify.as_ref().is_none_or(|v| *v.get_ref());
    let base = super::tls::base_dir(cx.src.file);
    let now = cx.src.outside.unix_now();
    let read =
        |path: &std::path::Path| cx.src.outside.read(path).map_err(|e| format!("cannot read {}: {e}", path.display()));
    let ca = match up.ca_file.take() {
        None => None,
        Some(f) => {
            let path = super::tls::resolve(&base, f.get_ref());
            let ca =
                read(&path).and_then(|pem| tls::parse_ca(&path, &pem)).map_err(|e| cx.err(&f.span(), "ca_file", e))?;
            if ca.not_after <= now {
                warnings.push(format!(
                    "{}:{}: upstream {:?}: ca_file: a certificate in {} has expired: servers it signed will not verify",
                    cx.src.file,
                    cx.src.line_of(&f.span()),
                    cx.name,
                    path.display()
                ));
            }
            Some(Arc::new(ca))
        }
    };
    let client = match (up.client_cert.take(), up.client_key.take()) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            let cert_path = super::tls::resolve(&base, cert.get_ref());
            let key_path = super::tls::resolve(&base, key.get_ref());
            let client = read(&cert_path)
                .and_then(|c| read(&key_path).map(|k| (c, k)))
                .and_then(|(cert_pem, key_pem)| tls::parse_client(&cert_path, &cert_pem, &key_path, &key_pem))
                .map_err(|e| cx.err(&cert.span(), "client_cert", e))?;
            if let Some(w) = client.loaded.expiry_warning(&cert_path, now) {
                warnings.push(format!(
                    "{}:{}: upstream {:?}: client_cert: {w}",
                    cx.src.file,
                    cx.src.line_of(&cert.span()),
                    cx.name
                ));
            }
            Some(Arc::new(client))
        }
        (Some(one), None) | (None, Some(one)) => {
            return Err(cx.err(&one.span(), "client_cert", "client_cert and client_key: give both, or neither"))
        }
    };
    if !verify {
        let span = up.verify.as_ref().map(|v| v.span()).unwrap_or_default();
        warnings.push(format!(
            "{}:{}: upstream {:?}: verify = false: the servers' certificates are not checked, so anyone on the \
             path can impersonate them; use ca_file for a private CA instead",
            cx.src.file,
            cx.src.line_of(&span),
            cx.name
        ));
    }
    Ok((Some(UpstreamTls { sni, verify, ca, client }), protocol))
}

/// `"10.0.0.1:8080 weight=3 max_fails=2 fail_timeout=5s max_conns=100"`.
fn compile_server(
    cx: &Ctx<'_, '_>,
    entry: &Spanned<String>,
    defaults: &ServerSpec,
    resolver: Option<SocketAddr>,
    warnings: &mut Vec<String>,
) -> Result<ServerSpec, ConfigError> {
    let span = entry.span();
    let mut words = entry.get_ref().split_whitespace();
    let Some(target) = words.next() else {
        return Err(cx.err(&span, "servers", "an entry is empty; expected \"host:port\""));
    };
    let mut server = ServerSpec { target: target.to_string(), ..defaults.clone() };
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            return Err(cx.err(
                &span,
                "servers",
                format!("{word:?}: expected weight=N, max_fails=N, fail_timeout=T or max_conns=N"),
            ));
        };
        let number = |range: (i64, i64)| -> Result<i64, ConfigError> {
            value.parse::<i64>().ok().filter(|n| (range.0..=range.1).contains(n)).ok_or_else(|| {
                cx.err(&span, "servers", format!("{key} must be {}..={}, got {value:?}", range.0, range.1))
            })
        };
        match key {
            "weight" => server.weight = number((1, MAX_WEIGHT))? as usize,
            "max_fails" => server.max_fails = number((0, 1000))? as u32,
            "max_conns" => server.max_conns = Some(number((1, MAX_CONNS))? as usize),
            "fail_timeout" => {
                server.fail_timeout =
                    cx.duration_text(value, &span, "servers: fail_timeout", Duration::from_millis(1))?
            }
            _ => {
                return Err(cx.err(
                    &span,
                    "servers",
                    format!("unknown parameter {key:?} (known: weight, max_fails, fail_timeout, max_conns)"),
                ));
            }
        }
    }
    if let Some(path) = target.strip_prefix("unix:") {
        let path = unix_path(path).map_err(|e| cx.err(&span, "servers", format!("{target:?}: {e}")))?;
        // The app may start after Weir: a missing socket is a note, and requests get 502 until it is there.
        match cx.src.outside.is_socket(std::path::Path::new(path)) {
            Some(true) | None => {}
            Some(false) => warnings.push(format!(
                "{}:{}: upstream {:?}: {path} is not a unix socket now (missing, or another kind of file): requests \
                 get 502 until the upstream listens there",
                cx.src.file,
                cx.src.line_of(&span),
                cx.name
            )),
        }
        server.addrs = vec![crate::upstream::unix_identity(path)];
        server.unix = Some(path.to_string());
        return Ok(server);
    }
    if let Ok(addr) = target.parse::<SocketAddr>() {
        server.addrs = vec![addr];
        return Ok(server);
    }
    // A name: resolved once here (per-request resolution would block the proxy's workers), then
    // again every resolve_interval in the background.
    let resolved = target
        .rsplit_once(':')
        .filter(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        .and_then(|_| cx.src.outside.resolve(target, resolver).ok())
        .filter(|addrs| !addrs.is_empty());
    match resolved {
        Some(addrs) => {
            server.is_name = true;
            server.addrs = addrs;
            Ok(server)
        }
        None => Err(cx.err(&span, "servers", format!("cannot resolve server {target:?} (expected host:port)"))),
    }
}

fn compile_next_upstream(
    cx: &Ctx<'_, '_>,
    list: Option<&Spanned<Vec<Spanned<String>>>>,
    tries: Option<u32>,
    timeout: Option<Duration>,
) -> Result<RetryPolicy, ConfigError> {
    let mut policy =
        RetryPolicy { tries, timeout, on_error: true, on_timeout: true, on_status: Vec::new(), non_idempotent: false };
    let Some(list) = list else { return Ok(policy) };
    policy.on_error = false;
    policy.on_timeout = false;
    let mut off = false;
    for item in list.get_ref() {
        match item.get_ref().as_str() {
            "error" => policy.on_error = true,
            "timeout" => policy.on_timeout = true,
            "non_idempotent" => policy.non_idempotent = true,
            "off" => off = true,
            other => match other.strip_prefix("http_").and_then(|c| c.parse::<u16>().ok()) {
                Some(code @ (429 | 500 | 502 | 503 | 504)) => policy.on_status.push(code),
                _ => {
                    return Err(cx.err(
                        &item.span(),
                        "next_upstream",
                        format!("unknown condition {other:?} (known: error, timeout, http_500, http_502, http_503, http_504, http_429, non_idempotent, off)"),
                    ))
                }
            },
        }
    }
    if off && (policy.on_error || policy.on_timeout || !policy.on_status.is_empty() || policy.non_idempotent) {
        return Err(cx.err(&list.span(), "next_upstream", "\"off\" cannot be combined with other conditions"));
    }
    Ok(policy)
}

fn compile_check(cx: &Ctx<'_, '_>, check: Spanned<schema::HealthCheck>) -> Result<HealthCheckSpec, ConfigError> {
    let span = check.span();
    let h = check.into_inner();
    let kind_name =
        h.kind.as_ref().map(|k| k.get_ref().as_str()).unwrap_or(if h.path.is_some() { "http" } else { "tcp" });
    let kind_span = h.kind.as_ref().map_or(span.clone(), |k| k.span());
    let kind = match kind_name {
        "tcp" => {
            for (set, field) in [(h.path.is_some(), "path"), (h.host.is_some(), "host"), (h.status.is_some(), "status")]
            {
                if set {
                    return Err(cx.err(&kind_span, &format!("health_check.{field}"), "only for type = \"http\""));
                }
            }
            CheckKind::Tcp
        }
        "http" => {
            let path = match &h.path {
                None => "/".to_string(),
                Some(p)
                    if p.get_ref().starts_with('/')
                        && http::uri::PathAndQuery::try_from(p.get_ref().as_str()).is_ok() =>
                {
                    p.get_ref().clone()
                }
                Some(p) => {
                    return Err(cx.err(
                        &p.span(),
                        "health_check.path",
                        format!("{:?} is not a path like \"/healthz\"", p.get_ref()),
                    ))
                }
            };
            let host = match &h.host {
                None => cx.name.clone(),
                Some(v) if http::HeaderValue::from_str(v.get_ref()).is_ok() && !v.get_ref().is_empty() => {
                    v.get_ref().clone()
                }
                Some(v) => {
                    return Err(cx.err(
                        &v.span(),
                        "health_check.host",
                        format!("{:?} is not a Host value", v.get_ref()),
                    ))
                }
            };
            let statuses = match &h.status {
                None => vec![(200, 399)],
                Some(s) => parse_statuses(s.get_ref()).ok_or_else(|| {
                    cx.err(
                        &s.span(),
                        "health_check.status",
                        format!(
                            "expected codes or ranges like \"200\", \"200-399\" or \"200,204\", got {:?}",
                            s.get_ref()
                        ),
                    )
                })?,
            };
            CheckKind::Http { path, host, statuses }
        }
        other => {
            return Err(cx.err(&kind_span, "health_check.type", format!("expected \"tcp\" or \"http\", got {other:?}")))
        }
    };
    Ok(HealthCheckSpec {
        kind,
        interval: cx.duration(&h.interval, "health_check.interval", MIN_INTERVAL, DEFAULT_CHECK_INTERVAL)?,
        timeout: cx.duration(&h.timeout, "health_check.timeout", Duration::from_millis(1), DEFAULT_CHECK_TIMEOUT)?,
        rise: cx.int(&h.rise, "health_check.rise", (1, 100), DEFAULT_RISE)? as usize,
        fall: cx.int(&h.fall, "health_check.fall", (1, 100), DEFAULT_FALL)? as usize,
        port: h
            .port
            .as_ref()
            .map(|_| cx.int(&h.port, "health_check.port", (1, 65535), 0))
            .transpose()?
            .map(|p| p as u16),
    })
}

/// `"200"`, `"200-399"`, `"200,204,301-302"`: inclusive ranges of 100..=599.
fn parse_statuses(text: &str) -> Option<Vec<(u16, u16)>> {
    let code = |s: &str| s.trim().parse::<u16>().ok().filter(|c| (100..=599).contains(c));
    text.split(',')
        .map(|part| match part.split_once('-') {
            Some((lo, hi)) => Some((code(lo)?, code(hi)?)).filter(|(lo, hi)| lo <= hi),
            None => code(part).map(|c| (c, c)),
        })
        .collect()
}

/// The path of a `unix:` server: absolute (Weir may run in another directory than the app), and
/// short enough for `sun_path` (108 bytes with the terminating NUL on Linux).
fn unix_path(path: &str) -> Result<&str, String> {
    if !path.starts_with('/') {
        return Err("a unix socket path must be absolute (unix:/run/app.sock)".into());
    }
    if path.len() > 107 || path.contains('\0') {
        return Err("a unix socket path holds at most 107 bytes and no NUL".into());
    }
    if path.ends_with('/') {
        return Err("a unix socket path names a file, not a directory".into());
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::parse_statuses;

    #[test]
    fn statuses() {
        assert_eq!(parse_statuses("200"), Some(vec![(200, 200)]));
        assert_eq!(parse_statuses("200-399, 404"), Some(vec![(200, 399), (404, 404)]));
        assert_eq!(parse_statuses("399-200"), None);
        assert_eq!(parse_statuses("2xx"), None);
        assert_eq!(parse_statuses(""), None);
    }
}
