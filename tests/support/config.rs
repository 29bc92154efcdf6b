//! Config text for weir under test. Each test spells out its zones and routes in TOML; the parts
//! that every config repeats (the `[server]` section, the upstream "app") come from here, and
//! line numbers in a config are looked up rather than hard-coded.

use std::net::SocketAddr;

/// `[store] kind = "memory"`.
pub const MEMORY_STORE: &str = r#"[store]
kind = "memory""#;

/// `[log]` without the access log.
pub const NO_ACCESS_LOG: &str = r#"[log]
access_log = false"#;

/// `[log]` in JSON (the access log read back by the tests).
pub const JSON_LOG: &str = r#"[log]
format = "json""#;

/// `[store] kind = "redis"` at `url` (`redis://`, `rediss://`, a Sentinel or cluster URL), then the
/// `extra` lines of the section (`timeout = "1s"`, `lease_ttl`, TLS files, ...): the one place
/// the tests spell a Redis store.
pub fn redis_store(url: &str, extra: &str) -> String {
    format!("[store]\nkind = \"redis\"\nurl = \"{url}\"\n{extra}")
}

/// `[server]` listening on `$LISTEN` with 2 threads, with the `server_extra` lines added (e.g.
/// [`super::admin::LISTEN`]), then `rest`.
pub fn with_server(server_extra: &str, rest: &str) -> String {
    format!(
        r#"[server]
listen = ["$LISTEN"]
threads = 2
{server_extra}

{rest}"#
    )
}

/// [`with_server`], then `sections` (`[log]`, `[store]`, … as TOML text), then one upstream "app"
/// with the server `up`, then `rest` (zones and routes).
pub fn with_app(server_extra: &str, sections: &str, up: SocketAddr, rest: &str) -> String {
    with_server(
        server_extra,
        &format!(
            r#"{sections}

[[upstream]]
name = "app"
servers = ["{up}"]

{rest}"#
        ),
    )
}

/// [`with_app`] on the memory store, without an admin listener: where most proxy tests start.
pub fn memory_with_app(up: SocketAddr, rest: &str) -> String {
    with_app("", MEMORY_STORE, up, rest)
}

/// 1-based number of the first line of `text` containing `needle`.
pub fn line_of(text: &str, needle: &str) -> usize {
    nth_line_of(text, needle, 0)
}

/// 1-based number of the `nth` (0-based) line of `text` containing `needle`.
pub fn nth_line_of(text: &str, needle: &str, nth: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .nth(nth)
        .unwrap_or_else(|| panic!("{needle:?} (#{nth}) not in the config"))
        .0
        + 1
}
