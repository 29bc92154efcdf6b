//! Top keys and resets through the real binary: a flood of distinct keys with an attacker in it
//! (memory store), and two instances on one Redis (fleet-wide counts, a reset seen by both, the
//! admin token). Real weir processes, real Redis, real sockets.

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};
use support::admin;
use support::config::with_app;
use support::http::{KeepAlive, Request};
use support::poll::poll;
use support::redis_server::RedisServer;
use support::upstream::Upstream;
use support::weir::Weir;

const TOKEN: &str = "top-secret-token-0123";
const BEARER: &str = "Bearer top-secret-token-0123";
const TIMEOUT: Duration = Duration::from_secs(5);

/// How a `header:` key shows in `/top` (hashed: it may be an API key).
fn shown(key: &str) -> String {
    let hex: String = Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{}", &hex[..12])
}

/// Every command Redis has run so far (`INFO commandstats`).
fn command_calls(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).expect("INFO commandstats");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .filter_map(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("calls=")))
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

fn top(admin: SocketAddr) -> Value {
    let r = admin::request(admin, "GET", "/top?n=5", Some(BEARER));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn zone<'a>(top: &'a Value, name: &str) -> &'a Value {
    top["zones"]
        .as_array()
        .and_then(|z| z.iter().find(|z| z["zone"] == name))
        .unwrap_or_else(|| panic!("no zone {name} in {top}"))
}

fn first_key(top: &Value, zone_name: &str, list: &str) -> Option<String> {
    zone(top, zone_name)[list].get(0).map(|r| r["key"].as_str().unwrap_or_default().to_string())
}

fn get_keyed(client: &mut KeepAlive, key: &str) -> u16 {
    client.send(&Request::get("/api/x").header("X-Key", key)).map(|r| r.status).unwrap_or(0)
}

/// Flood keys: `WEIR_TOP_FLOOD_KEYS` (default 30,000 so that CI stays well within a minute; the
/// issue's 1M runs the same test longer: `WEIR_TOP_FLOOD_KEYS=1000000`).
fn flood_keys() -> u64 {
    std::env::var("WEIR_TOP_FLOOD_KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(30_000)
}

/// A flood of distinct one-shot keys, 100 regular clients at 2 r/s each and, once the flood is
/// under way, an attacker at 20 r/s (10× a regular client). Every key is limited to 1 r/m: the
/// flood keys pass once at their limit (near-limit rows), the regular clients and the attacker are
/// mostly rejected. The attacker must lead both lists within 2 s of its first request, and the
/// tables stay within their documented bound.
#[test]
fn an_attacker_in_a_flood_of_distinct_keys_leads_within_two_seconds() {
    let up = Upstream::start();
    let config = with_app(
        &format!("{}\nadmin_token = \"{TOKEN}\"", admin::LISTEN),
        "[log]\naccess_log = false\n\n[store]\nkind = \"memory\"\n\n[top]\nkeys = 64\nhalf_life = \"30s\"",
        up.addr(),
        r#"[[limit_req_zone]]
name = "per_key"
key = "header:X-Key"
rate = "1r/m"
max_keys = 2000000

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 0, nodelay = true } ]
"#,
    );
    let w = Weir::start(&config);
    let admin_addr = admin::addr(&w);
    let total = flood_keys();
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    let mut threads = Vec::new();
    for t in 0..6u64 {
        let (sent, addr) = (sent.clone(), w.addr);
        threads.push(thread::spawn(move || {
            let mut client = KeepAlive::new(addr, TIMEOUT);
            let mut i = t;
            while i < total {
                assert_eq!(get_keyed(&mut client, &format!("flood-{i}")), 200, "a one-shot key passes");
                sent.fetch_add(1, Ordering::Relaxed);
                i += 6;
            }
        }));
    }
    let paced = |addr: SocketAddr, keys: Vec<String>, per_key_rate: f64, stop: Arc<AtomicBool>| {
        thread::spawn(move || {
            let mut client = KeepAlive::new(addr, TIMEOUT);
            let every = Duration::from_secs_f64(1.0 / (per_key_rate * keys.len() as f64));
            let mut next = Instant::now();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                get_keyed(&mut client, &keys[n % keys.len()]);
                n += 1;
                next += every;
                thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        })
    };
    let regular = paced(w.addr, (0..100).map(|i| format!("regular-{i}")).collect(), 2.0, stop.clone());

    // The attacker arrives once a tenth of the flood is through.
    poll(Duration::from_secs(120), Duration::from_millis(20), || sent.load(Ordering::Relaxed), |&n| n >= total / 10)
        .expect("the flood is under way");
    let attacker_started = Instant::now();
    let attacker = paced(w.addr, vec!["attacker".into()], 20.0, stop.clone());
    let want = shown("attacker");
    let led = poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || top(admin_addr),
        |t| {
            first_key(t, "per_key", "rejected").as_deref() == Some(&want)
                && first_key(t, "per_key", "closest").as_deref() == Some(&want)
        },
    );
    let took = attacker_started.elapsed();
    let led = led.unwrap_or_else(|t| panic!("the attacker never led: {}", zone(&t, "per_key")));
    assert!(took <= Duration::from_secs(2), "the attacker led only after {took:?}");
    let flood_at_lead = sent.load(Ordering::Relaxed);

    for t in threads {
        t.join().expect("flood thread");
    }
    // Still first once the whole flood is through.
    let end = top(admin_addr);
    assert_eq!(first_key(&end, "per_key", "rejected"), Some(want.clone()), "{}", zone(&end, "per_key"));
    stop.store(true, Ordering::Relaxed);
    regular.join().expect("regular clients");
    attacker.join().expect("attacker");

    let bytes = end["memory"]["bytes"].as_u64().expect("memory.bytes");
    let bound = end["memory"]["bound_bytes"].as_u64().expect("memory.bound_bytes");
    assert!(bytes <= bound && bound < 2_000_000, "{bytes} > {bound}");
    assert_eq!(zone(&led, "per_key")["rejected"][0]["key"], want, "a header key is shown hashed");
    // Its rate is read from the requests since it entered the table: about 20 r/s by now.
    let row = &zone(&end, "per_key")["rejected"][0];
    let rate = row["rejected_rate"].as_f64().unwrap_or(0.0);
    assert!((12.0..=25.0).contains(&rate), "{row}");
    eprintln!(
        "flood of {total} keys: attacker first after {took:?} (flood at {flood_at_lead}); tables {bytes} B of a {bound} B bound"
    );
}

/// One member of a two-instance fleet on `url`: zone "fleet" keyed by `X-Key` at 1 r/m with a
/// burst of 1 (two requests pass, then 429 for a minute), the deny cache on.
fn member(up: &Upstream, url: &str) -> Weir {
    let sections = format!("[log]\naccess_log = false\n\n[store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout = \"1s\"");
    Weir::start(&with_app(
        &format!("{}\nadmin_token = \"{TOKEN}\"", admin::LISTEN),
        &sections,
        up.addr(),
        r#"[[limit_req_zone]]
name = "fleet"
key = "header:X-Key"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "fleet", burst = 1, nodelay = true } ]
"#,
    ))
}

#[test]
fn two_instances_share_counts_and_a_reset_on_one_lets_the_key_through_on_both() {
    let redis = RedisServer::start();
    let up = Upstream::start();
    let (a, b) = (member(&up, &redis.url()), member(&up, &redis.url()));
    let (admin_a, admin_b) = (admin::addr(&a), admin::addr(&b));
    let (mut on_a, mut on_b) = (KeepAlive::new(a.addr, TIMEOUT), KeepAlive::new(b.addr, TIMEOUT));

    // Without the token nothing is shown or reset.
    assert_eq!(admin::request(admin_a, "GET", "/top", None).status, 401);
    assert_eq!(admin::request(admin_a, "GET", "/top", Some("Bearer wrong-token-000000")).status, 401);
    assert_eq!(admin::request(admin_a, "DELETE", "/limits/fleet/victim", None).status, 401);

    // Two pass (burst 1), then the key is rejected on both instances: by Redis once each, then by
    // each one's deny cache.
    assert_eq!(get_keyed(&mut on_a, "victim"), 200);
    assert_eq!(get_keyed(&mut on_b, "victim"), 200);
    for _ in 0..10 {
        assert_eq!(get_keyed(&mut on_a, "victim"), 429);
        assert_eq!(get_keyed(&mut on_b, "victim"), 429);
    }
    // What sharing the views costs Redis: a 2 s flood of the rejected key on both instances adds
    // no Redis call per request (the deny caches answer), and the syncs' few commands per period.
    let mut redis_conn = redis.connection();
    let (calls_before, started) = (command_calls(&mut redis_conn), Instant::now());
    let mut flooded = 0u64;
    while started.elapsed() < Duration::from_secs(2) {
        assert_eq!(get_keyed(&mut on_a, "victim"), 429);
        assert_eq!(get_keyed(&mut on_b, "victim"), 429);
        flooded += 2;
    }
    let calls = command_calls(&mut redis_conn) - calls_before - 1; // less this INFO
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("{flooded} rejected requests in {seconds:.1} s cost Redis {calls} commands (2 instances' syncs)");
    // 2 instances × 2 syncs/s × 4-5 commands = 16-20/s, whatever the flood.
    assert!((calls as f64) < 30.0 * seconds, "{calls} Redis commands for {flooded} requests in {seconds:.1} s");
    assert!(flooded > calls * 5, "{flooded} requests, {calls} Redis commands");

    // Either instance lists the key with both instances' rejections.
    let want = shown("victim");
    for admin_addr in [admin_a, admin_b] {
        let seen = poll(
            Duration::from_secs(5),
            Duration::from_millis(100),
            || top(admin_addr),
            |t| zone(t, "fleet")["rejected"].get(0).is_some_and(|r| r["key"] == want && r["instances"] == 2),
        )
        .unwrap_or_else(|t| panic!("no fleet-wide row: {}", zone(&t, "fleet")));
        assert_eq!(seen["instances"], 2, "both instances' views");
    }
    // The keys are the fleet's; the routes' and zones' counters this instance's.
    let labels = top(admin_a);
    assert_eq!(
        labels["scope"],
        serde_json::json!({"routes": "this instance", "decisions": "this instance", "keys": "fleet"})
    );
    assert_eq!(
        (&zone(&labels, "fleet")["scope"], &zone(&labels, "fleet")["decisions_scope"]),
        (&"fleet".into(), &"this instance".into())
    );

    // Reset on A, by the row's id (the key is shown hashed).
    let id = top(admin_a)["zones"][0]["rejected"][0]["id"].as_str().expect("id").to_string();
    let r = admin::request(admin_a, "DELETE", &format!("/limits/fleet?id={id}"), Some(BEARER));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["key"], want);
    assert_eq!(r.json()["existed"], true, "the key held state in Redis");
    let reset_at = Instant::now();
    // A lets it through at once (its deny cache forgot it with the reset) ...
    assert_eq!(get_keyed(&mut on_a, "victim"), 200);
    // ... and B once it has read the reset (it would reject from its deny cache until then, and
    // Redis holds one more request of burst: the first that reaches Redis passes).
    let through =
        poll(Duration::from_secs(5), Duration::from_millis(20), || get_keyed(&mut on_b, "victim"), |&s| s == 200);
    let took = reset_at.elapsed();
    assert_eq!(through, Ok(200), "B never let the key through after the reset");
    assert!(took <= Duration::from_secs(2), "B let it through only after {took:?}");
    // The bucket is full again on both: the reset did not disable the limit.
    assert_eq!(get_keyed(&mut on_a, "victim"), 429);
    assert_eq!(get_keyed(&mut on_b, "victim"), 429);

    // A raw key (percent-encoded path) resets too; an unknown zone or id is 404.
    let r = admin::request(admin_b, "DELETE", "/limits/fleet/victim", Some(BEARER));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get_keyed(&mut on_b, "victim"), 200);
    assert_eq!(admin::request(admin_b, "DELETE", "/limits/nope/victim", Some(BEARER)).status, 404);
    assert_eq!(admin::request(admin_b, "DELETE", "/limits/fleet?id=0000", Some(BEARER)).status, 404);
    eprintln!("reset seen by the other instance after {took:?}");
}
