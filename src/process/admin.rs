//! The admin listener (`[server] admin = "127.0.0.1:9901"`, off when absent):
//! `GET /healthz` (process up), `GET /readyz` (the store decides; 503 with the reason while it
//! fails), `GET /metrics` (Prometheus), `GET /config` (generation, hash, load time),
//! `POST /reload`, `GET /limits?zone=Z&key=K` (one key's state, for support), and `GET /upstreams`
//! (servers with health, weight and requests in flight), `GET /top` (the hottest keys per zone,
//! fleet-wide on Redis; `src/top/`), `GET /zones` (keys per zone on Redis, one bounded scan),
//! `GET /rlqs` (the RLQS holders and shares of each divided key, `rls/quota/live.rs`),
//! `DELETE /limits/{zone}/{key}` or
//! `DELETE /limits/{zone}?id=ID` (resets a key's state, fleet-wide on Redis), and `GET /` (the
//! status page: a page with no data in it, which reads the endpoints above with the token the
//! operator types). With `admin_token` set, every endpoint but the probes and the empty page
//! needs `Authorization: Bearer <token>`. Without it (a loopback listener), every endpoint but
//! the probes needs a loopback `Host` (or the admin address itself): a web page whose name was
//! rebound to 127.0.0.1 cannot drive it (DNS rebinding); and a change sent by a browser needs a
//! page of this machine as its `Origin` (no blind cross-site `POST /reload`). Every answer forbids
//! framing and sniffing; the page's policy allows its own inline script and style and nothing
//! else (`admin_guard.rs`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use http::{header, HeaderValue, Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::{json, Value};

use crate::limit::{evaluate, SlidingState, State, TokenState, WindowState};
use crate::metrics::METRICS;
use crate::process::lasting::Lasting;
use crate::process::reload::{ReloadOutcome, Reloader};
use crate::store::{LeasedStore, StoreAdmin};
use crate::top::Tracker;
use crate::upstream::Registry;

use super::admin_guard::{self as guard, path_decode, query_param, Provenance};

pub struct AdminApp {
    reloader: Arc<Reloader>,
    store: Arc<dyn StoreAdmin>,
    /// This instance's name in the fleet's top-keys views.
    instance: String,
    /// The tables the engine records into (`GET /top`, resets).
    top: Arc<Tracker>,
    /// Every upstream's pool and adaptive limit (`GET /upstreams`).
    upstreams: Arc<Registry>,
    /// The RLQS streams' shares (`GET /rlqs`), when the rate limit service runs.
    quota: Option<Arc<crate::rls::quota::Live>>,
    /// This instance's leases of leased zones' budgets (`GET /limits`); `None` off Redis.
    leases: Option<LeasedStore>,
}

enum Body {
    Json(Value),
    Text(String),
    Html(&'static str),
}

/// `?n=N`, the rows a list endpoint shows: `default` when absent or unreadable, within 1..=`max`.
fn row_count(query: Option<&str>, default: usize, max: usize) -> usize {
    query_param(query, "n")
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(default)
        .clamp(1, max)
}

/// The status page (`GET /`): one file, inline CSS and JS, no external assets.
const STATUS_PAGE: &str = include_str!("admin_page.html");
/// Keys one `GET /zones` examines unless told (`?scan=N`), and the most it may be told.
const DEFAULT_ZONE_SCAN: u64 = 1_000_000;
const MAX_ZONE_SCAN: u64 = 100_000_000;

/// The status page's content security policy (its script's hash), computed once.
fn page_policy() -> &'static str {
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| guard::page_policy(STATUS_PAGE))
}

impl AdminApp {
    /// The admin API over the process's lasting state.
    pub fn new(reloader: Arc<Reloader>, lasting: &Lasting) -> Self {
        Self {
            reloader,
            store: lasting.admin.clone(),
            instance: lasting.instance.clone(),
            top: lasting.top.clone(),
            upstreams: lasting.upstreams.clone(),
            quota: None,
            leases: lasting.budget_leases.clone(),
        }
    }

    /// With the RLQS service's live view (`GET /rlqs`).
    pub fn with_quota(mut self, live: Arc<crate::rls::quota::Live>) -> Self {
        self.quota = Some(live);
        self
    }

    async fn handle(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        auth: Option<&[u8]>,
        from: Provenance<'_>,
    ) -> (StatusCode, Body) {
        let probe = matches!(path, "/healthz" | "/readyz");
        if !probe && !self.local_enough(from, !matches!(*method, Method::GET | Method::HEAD)) {
            return (
                StatusCode::FORBIDDEN,
                Body::Json(json!({ "error": "this admin listener answers only Host: localhost, 127.0.0.1, [::1] \
                    or its own address, and changes only from pages of those (set server.admin_token to reach it \
                    by another name)" })),
            );
        }
        // The page is public but empty: it shows what the token-protected endpoints return.
        let public = probe || (path == "/" && *method == Method::GET);
        if !public && !self.authorized(auth) {
            return (StatusCode::UNAUTHORIZED, Body::Json(json!({ "error": "missing or wrong bearer token" })));
        }
        match (method, path) {
            (&Method::GET, "/healthz") => (StatusCode::OK, Body::Json(json!({ "status": "ok" }))),
            (&Method::GET, "/readyz") => self.readiness().await,
            (&Method::GET, "/metrics") => (StatusCode::OK, Body::Text(METRICS.render())),
            (&Method::GET, "/config") => (StatusCode::OK, Body::Json(json!(self.reloader.status()))),
            (&Method::POST, "/reload") => match self.reloader.reload("admin API") {
                ReloadOutcome::Applied { generation, hash } => {
                    (StatusCode::OK, Body::Json(json!({ "result": "applied", "generation": generation, "hash": hash })))
                }
                ReloadOutcome::Unchanged { generation } => {
                    (StatusCode::OK, Body::Json(json!({ "result": "unchanged", "generation": generation })))
                }
                ReloadOutcome::Refused(error) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, Body::Json(json!({ "result": "refused", "error": error })))
                }
            },
            (&Method::GET, "/limits") => self.limits(query).await,
            (&Method::GET, "/upstreams") => (StatusCode::OK, Body::Json(self.upstreams())),
            (&Method::GET, "/zones") => self.zone_keys(query).await,
            (&Method::GET, "/top") => (StatusCode::OK, Body::Json(self.top(query).await)),
            (&Method::GET, "/rlqs") => (StatusCode::OK, Body::Json(self.rlqs(query))),
            (&Method::GET, "/") => (StatusCode::OK, Body::Html(STATUS_PAGE)),
            (&Method::DELETE, p) if p.starts_with("/limits/") => self.reset(&p["/limits/".len()..], query).await,
            (
                _,
                "/healthz" | "/readyz" | "/metrics" | "/config" | "/reload" | "/limits" | "/upstreams" | "/top"
                | "/zones" | "/rlqs" | "/",
            ) => (StatusCode::METHOD_NOT_ALLOWED, Body::Json(json!({ "error": "method not allowed" }))),
            _ => (
                StatusCode::NOT_FOUND,
                Body::Json(json!({ "error": "not found",
                    "endpoints": ["/", "/healthz", "/readyz", "/metrics", "/config", "/reload", "/limits", "/upstreams", "/top", "/zones", "/rlqs"] })),
            ),
        }
    }

    /// With a token, any `Host` and `Origin` (the token is the guard, and a browser never sends
    /// it by itself); on loopback without one, `admin_guard::is_local`: a hostile page can neither
    /// reach the API through a name rebound to 127.0.0.1 nor send it a blind cross-site `POST`.
    /// A listener opened to the network on purpose (`admin_insecure`) is reached by whatever
    /// names its scrapers use: it is not checked.
    fn local_enough(&self, from: Provenance<'_>, changes_state: bool) -> bool {
        let runtime = self.reloader.runtime().load();
        let exposed = runtime.server.admin.is_some_and(|a| !a.ip().is_loopback());
        runtime.server.admin_token.is_some() || exposed || guard::is_local(from, changes_state, runtime.server.admin)
    }

    fn authorized(&self, auth: Option<&[u8]>) -> bool {
        let runtime = self.reloader.runtime().load();
        let Some(token) = &runtime.server.admin_token else {
            return true;
        };
        let Some(given) = auth.and_then(bearer_credentials) else {
            return false;
        };
        constant_time_eq(given, token.expose().as_bytes())
    }

    /// 200 while the store decides; 503 with the reason while it fails (a Redis that is down,
    /// out of memory or busy, or an open circuit): the failure policy then answers every request.
    /// Warnings (a Redis eviction policy that can lose limit state) do not make it unready.
    async fn readiness(&self) -> (StatusCode, Body) {
        let health = self.store.health().await;
        let mut body =
            json!({ "status": if health.ready { "ready" } else { "not_ready" }, "store": self.store.kind() });
        if let (Value::Object(fields), Ok(Value::Object(more))) = (&mut body, serde_json::to_value(&health)) {
            fields.extend(more.into_iter().filter(|(k, _)| k != "ready"));
        }
        let status = if health.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        (status, Body::Json(body))
    }

    /// `GET /upstreams`: each upstream of the running config with its servers' health, weight and
    /// requests in flight on this instance.
    fn upstreams(&self) -> Value {
        let runtime = self.reloader.runtime().load_full();
        let list: Vec<Value> = runtime
            .upstreams
            .iter()
            .map(|u| {
                let kept = self.upstreams.of(u);
                let pool = &kept.pool;
                let spec = pool.spec();
                json!({
                    "name": u.name,
                    "servers": pool.status(),
                    "health_check": spec.health_check.as_ref().map(|h| json!({
                        "type": match h.kind { crate::upstream::CheckKind::Tcp => "tcp", _ => "http" },
                        "interval_ms": h.interval.as_millis() as u64, "rise": h.rise, "fall": h.fall,
                    })),
                    "adaptive": kept.adaptive.as_ref().map(|a| a.status()),
                })
            })
            .collect();
        json!({ "upstreams": list })
    }

    /// `GET /top[?n=10]`: see `top::view::top_json`; with the store's state, for the page.
    async fn top(&self, query: Option<&str>) -> Value {
        let runtime = self.reloader.runtime().load_full();
        let n = row_count(query, 10, 100);
        let now = crate::top::fleet::now_us();
        let local = self.top.local(now, crate::top::fleet::max_idle_us(&runtime));
        let fleet = self.top.fleet();
        let health = self.store.health().await;
        let extra = json!({
            "instance": self.instance,
            "store": { "kind": self.store.kind(), "ready": health.ready, "reason": health.reason,
                       "warnings": health.warnings },
            "config": self.reloader.status(),
            "upstreams": self.upstreams()["upstreams"].clone(),
            "memory": { "bytes": self.top.bytes(), "bound_bytes": crate::top::bound_bytes(&runtime) },
        });
        let held = |zone: &str, key: &[u8]| self.leases.as_ref().map(|l| l.held(zone, key));
        crate::top::view::top_json(&runtime, &local, &fleet, n, extra, &held)
    }

    /// `GET /rlqs[?n=50]`: each divided key's holders and shares (`rls/quota/live.rs`), keys
    /// shown as `GET /top` shows them (hashed when they may be secrets).
    fn rlqs(&self, query: Option<&str>) -> Value {
        use crate::rls::quota::live;
        let runtime = self.reloader.runtime().load_full();
        let n = row_count(query, live::DEFAULT_KEYS, live::MAX_KEYS);
        let mut out = match &self.quota {
            Some(quota) => quota.json(n, crate::limit::Clock::now_us(&crate::limit::SystemClock), |zone, key| {
                let secret = crate::top::view::zone_is_secret(&runtime, zone);
                (crate::top::view::key_id(zone, key), crate::top::view::shown_key(secret, key))
            }),
            None => json!({ "streams": 0, "keys": [], "keys_total": 0, "truncated": false }),
        };
        if let Value::Object(fields) = &mut out {
            fields.insert("instance".into(), json!(self.instance));
            fields.insert("store".into(), json!(self.store.kind()));
            fields.insert("enabled".into(), json!(self.quota.is_some()));
        }
        crate::top::text::escape_json(&mut out);
        out
    }

    /// `DELETE /limits/{zone}/{key}` (the key percent-encoded) or `DELETE /limits/{zone}?id=ID`
    /// (a row of `/top`, hashed keys included): forgets the key's state in the store (fleet-wide on
    /// Redis), in this instance's deny cache at once and the others' within a sync period
    /// (`top::fleet`), and in the top tables.
    async fn reset(&self, rest: &str, query: Option<&str>) -> (StatusCode, Body) {
        let bad = |what: &str, e: String| {
            (StatusCode::BAD_REQUEST, Body::Json(json!({ "error": format!("{what}: {e} (percent-encode it whole)") })))
        };
        let (zone, key) = rest.split_once('/').map_or((rest, None), |(zone, key)| (zone, Some(key)));
        let zone = match path_decode(zone).map(String::from_utf8) {
            Ok(Ok(zone)) => zone,
            Ok(Err(_)) => return bad("the zone", "not UTF-8".into()),
            Err(e) => return bad("the zone", e),
        };
        let key = match key.map(path_decode).transpose() {
            Ok(key) => key,
            Err(e) => return bad("the key", e),
        };
        let runtime = self.reloader.runtime().load_full();
        if !runtime.zones.iter().any(|z| z.name == zone) {
            return (StatusCode::NOT_FOUND, Body::Json(json!({ "error": format!("no zone {zone:?}") })));
        }
        let key = match (key, query_param(query, "id")) {
            (Some(key), None) if !key.is_empty() => key,
            (None, Some(id)) => {
                let id = String::from_utf8_lossy(&id).into_owned();
                let now = crate::top::fleet::now_us();
                // Any row, however idle: a reset may follow a look at an old listing.
                let local = self.top.local(now, u64::MAX);
                match crate::top::view::find_by_id(&local, &self.top.fleet(), &zone, &id) {
                    Some(key) => key,
                    None => {
                        return (
                            StatusCode::NOT_FOUND,
                            Body::Json(
                                json!({ "error": format!("no key with id {id:?} in zone {zone:?} (GET /top lists them)") }),
                            ),
                        )
                    }
                }
            }
            _ => {
                return (
                    StatusCode::BAD_REQUEST,
                    Body::Json(
                        json!({ "error": "give DELETE /limits/ZONE/KEY (KEY percent-encoded) or DELETE /limits/ZONE?id=ID" }),
                    ),
                )
            }
        };
        // Read before the reset, to say whether there was anything to forget (a typo in a key
        // resets nothing, and says so); unknown (null) when the store cannot tell, which does not
        // hold up the reset.
        let existed = self.store.inspect(&zone, &key).await.ok().map(|state| state.is_some());
        if let Err(e) = self.store.reset(&zone, &key).await {
            return (StatusCode::SERVICE_UNAVAILABLE, Body::Json(json!({ "error": format!("reset failed: {e}") })));
        }
        self.top.forget(&zone, &key);
        let secret = crate::top::view::zone_is_secret(&runtime, &zone);
        let shown = crate::top::view::shown_key(secret, &key);
        let shown = crate::top::text::escape(&shown);
        tracing::info!(zone = %zone, key = %shown, existed = ?existed, "admin: key reset");
        (
            StatusCode::OK,
            Body::Json(json!({
                "result": "reset", "zone": zone, "key": shown, "existed": existed,
                "id": crate::top::view::key_id(&zone, &key), "store": self.store.kind(),
            })),
        )
    }

    /// `GET /limits?zone=per_ip&key=203.0.113.7`: the key's bucket now, and per route using the zone
    /// how many requests it could still pass.
    /// `GET /zones[?scan=N]`: keys per zone in the store, from one scan of at most N keys
    /// (default 1,000,000; `complete: false` when it stopped there).
    async fn zone_keys(&self, query: Option<&str>) -> (StatusCode, Body) {
        let budget = match query_param(query, "scan").map(|v| String::from_utf8_lossy(&v).parse::<u64>()) {
            None => DEFAULT_ZONE_SCAN,
            Some(Ok(n)) if (1..=MAX_ZONE_SCAN).contains(&n) => n,
            Some(_) => {
                let error = format!("scan must be 1-{MAX_ZONE_SCAN} keys");
                return (StatusCode::BAD_REQUEST, Body::Json(json!({ "error": error })));
            }
        };
        match self.store.zone_keys(budget).await {
            Ok(found) => (StatusCode::OK, Body::Json(json!(found))),
            Err(e) => (StatusCode::SERVICE_UNAVAILABLE, Body::Json(json!({ "error": e.to_string() }))),
        }
    }

    async fn limits(&self, query: Option<&str>) -> (StatusCode, Body) {
        let param = |name: &str| query_param(query, name);
        let (Some(zone_name), Some(key)) =
            (param("zone").map(|z| String::from_utf8_lossy(&z).into_owned()), param("key"))
        else {
            return (StatusCode::BAD_REQUEST, Body::Json(json!({ "error": "give ?zone=NAME&key=KEY" })));
        };
        let runtime = self.reloader.runtime().load_full();
        let Some(zone_index) = runtime.zones.iter().position(|z| z.name == zone_name) else {
            return (StatusCode::NOT_FOUND, Body::Json(json!({ "error": format!("no zone {zone_name:?}") })));
        };
        let zone = &runtime.zones[zone_index];
        let state = match self.store.inspect(&zone.name, &key).await {
            Ok(state) => state,
            Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, Body::Json(json!({ "error": e.to_string() }))),
        };
        let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
        let routes: Vec<Value> = runtime
            .routes
            .iter()
            .flat_map(|r| r.limits.iter().filter(|l| l.zone == zone_index).map(move |l| (r, l)))
            .map(|(route, l)| {
                // A cost-0 evaluation drains the bucket to now without charging anything.
                let now = evaluate(&l.limit, state.as_ref(), now_us, 0);
                json!({ "route": route.name, "burst": l.limit.burst, "remaining": now.remaining,
                        "empty_in_seconds": now.reset_us as f64 / 1e6, "dry_run": l.dry_run })
            })
            .collect();
        let mut answer = json!({
            "zone": zone.name, "key": String::from_utf8_lossy(&key), "rate": zone.rate.to_string(),
            "algorithm": zone.algorithm.as_str(),
            "state": state.as_ref().map(state_json),
            "routes": routes,
        });
        if let Some(spec) = zone.lease {
            answer["lease"] = self.lease_json(&zone.name, &key, spec).await;
        }
        (StatusCode::OK, Body::Json(answer))
    }

    /// A leased key's leases (docs/leases.md): this instance's, from memory (`null` when it holds
    /// none and has forgotten the key), and the fleet's holders, from Redis (`null` with
    /// `fleet_error` when Redis does not answer, or on the memory store, which does not lease).
    async fn lease_json(&self, zone: &str, key: &[u8], spec: crate::limit::lease::LeaseSpec) -> Value {
        let this_instance = self.leases.as_ref().and_then(|l| l.key_leases(zone, key));
        let mut lease = json!({
            "tokens": spec.tokens, "lifetime_ms": spec.lifetime_us as f64 / 1e3,
            "this_instance": this_instance, "fleet": null,
        });
        match self.store.lease_holders(zone, key).await {
            Ok(Some(holders)) => lease["fleet"] = json!({ "holders": holders.len(), "leases": holders }),
            Ok(None) => {}
            Err(e) => lease["fleet_error"] = json!(e.to_string()),
        }
        lease
    }
}

fn state_json(state: &State) -> Value {
    match state {
        State::Bucket(b) => json!({ "level": b.level, "last_us": b.last_us }),
        State::Tokens(TokenState { tokens, last_us }) => json!({ "tokens": tokens, "last_us": last_us }),
        State::Window(WindowState { start_us, count }) => json!({ "window_start_us": start_us, "count": count }),
        State::Sliding(SlidingState { start_us, prev, curr }) => {
            json!({ "window_start_us": start_us, "previous": prev, "current": curr })
        }
        State::Log(entries) => {
            json!({ "entries": entries.len(), "oldest_us": entries.first(), "newest_us": entries.last() })
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let auth = req.headers.get(header::AUTHORIZATION).map(|v| v.as_bytes().to_vec());
        let host = req.headers.get(header::HOST).map(|v| v.as_bytes().to_vec());
        let origin = req.headers.get(header::ORIGIN).map(|v| v.as_bytes().to_vec());
        let (method, path, query) =
            (req.method.clone(), req.uri.path().to_string(), req.uri.query().map(str::to_string));
        let from = Provenance { host: host.as_deref(), origin: origin.as_deref() };
        let (status, body) = self.handle(&method, &path, query.as_deref(), auth.as_deref(), from).await;
        let (content_type, mut bytes) = match body {
            Body::Json(mut v) => {
                // Keys and names may hold what a terminal or a page would obey (ESC, U+202E).
                crate::top::text::escape_json(&mut v);
                ("application/json", v.to_string().into_bytes())
            }
            Body::Text(t) => ("text/plain; version=0.0.4", t.into_bytes()),
            Body::Html(page) => ("text/html; charset=utf-8", page.as_bytes().to_vec()),
        };
        if content_type == "application/json" {
            bytes.push(b'\n');
        }
        let length = bytes.len();
        let mut resp = Response::new(bytes);
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        guard::protect(headers, if content_type.starts_with("text/html") { page_policy() } else { guard::DATA_POLICY });
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// The credentials of an `Authorization: Bearer <token>` value; the scheme is case-insensitive
/// (RFC 9110 §11.1), whitespace around the token is ignored.
fn bearer_credentials(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first().is_none_or(|b| *b != b' ') {
        return None;
    }
    Some(rest.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_policy_names_its_one_script_by_hash() {
        let policy = page_policy();
        assert!(policy.contains("script-src 'sha256-") && policy.contains("frame-ancestors 'none'"), "{policy}");
        assert_eq!(STATUS_PAGE.matches("<script").count(), 1, "one inline script, the one hashed");
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_credentials(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_credentials(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_credentials(b"BEARER   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_credentials(b"Basic abc"), None);
        assert_eq!(bearer_credentials(b"Bearerabc"), None);
    }

    #[test]
    fn compares_tokens() {
        assert!(constant_time_eq(b"secret-token-123", b"secret-token-123"));
        assert!(!constant_time_eq(b"secret-token-124", b"secret-token-123"));
        assert!(!constant_time_eq(b"short", b"secret-token-123"));
    }
}
