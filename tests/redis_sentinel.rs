//! `weir` on a Sentinel-watched master (`url = "redis+sentinel://…/mymaster"`): one master, one
//! replica, one Sentinel, real weir processes, real upstream, real sockets. Weir finds the master
//! through the Sentinel, enforces its limits there, and after the master is killed (SIGKILL) and
//! the Sentinel promotes the replica, decides on the new master by itself.

use crate::support;

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use support::certs::{install, Ca};
use support::config::{redis_store, with_app, NO_ACCESS_LOG};
use support::http::{self, summaries, Response};
use support::redis_topology::{NodeTls, SentinelSetup};
use support::upstream::Upstream;
use support::weir::Weir;

/// A Weir on the setup's Sentinel; `store_extra`: more `[store]` lines (the TLS files).
fn member(setup: &SentinelSetup, up: &Upstream, store_extra: &str) -> Weir {
    let store = redis_store(
        &setup.url(),
        &format!("timeout = \"500ms\"\non_error = \"allow\"\ndeny_cache_size = 0\n{store_extra}"),
    );
    let sections = format!("{NO_ACCESS_LOG}\n\n{store}");
    let rest = r#"[[limit_req_zone]]
name = "fleet"
key = "header:X-Key"
rate = "1r/m"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "fleet", burst = 4, nodelay = true } ]
"#;
    Weir::start(&with_app("", &sections, up.addr(), rest))
}

/// Six requests with `X-Key: key`, alternating between the instances.
fn six(addrs: [SocketAddr; 2], key: &str) -> Vec<Response> {
    (0..6).map(|i| http::get_with(addrs[i % 2], "/api/", &[("X-Key", key)])).collect()
}

fn statuses(rs: &[Response]) -> Vec<u16> {
    rs.iter().map(|r| r.status).collect()
}

fn exists_on(setup: &SentinelSetup, port: u16, key: &str) -> bool {
    let mut conn = setup.connect(port).unwrap_or_else(|e| panic!("connect to {port}: {e}"));
    redis::cmd("EXISTS").arg(key).query::<u64>(&mut conn).expect("EXISTS") == 1
}

const ENFORCED: [u16; 6] = [200, 200, 200, 200, 200, 429];

#[test]
fn weir_follows_a_sentinel_failover() {
    let started = Instant::now();
    let setup = SentinelSetup::start();
    println!("master, replica and sentinel ready after {:?}", started.elapsed());
    follows_failover(setup, "", started);
}

/// `rediss+sentinel://`: the Sentinel, the master and the replica on TLS only, each requiring a
/// client certificate; Weir trusts the test CA (`tls_ca`) and presents its own pair. With
/// `on_error = "allow"`, a connection that failed would let every request pass: the sixth
/// request's 429 can only come from the master.
#[test]
fn weir_follows_a_sentinel_failover_over_tls() {
    let started = Instant::now();
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    // The Sentinel names the master by IP: its certificate must carry that IP.
    let (cert, key) = install(dir.path(), "redis", &ca.leaf(&["127.0.0.1", "localhost"], "redis", 30));
    let (client_cert, client_key) = install(dir.path(), "client", &ca.leaf(&["weir"], "weir", 30));
    let setup = SentinelSetup::start_tls(NodeTls {
        ca: ca_file.clone(),
        cert,
        key,
        client_cert: client_cert.clone(),
        client_key: client_key.clone(),
    });
    println!("master, replica and sentinel ready over TLS after {:?}", started.elapsed());
    let store_extra = format!(
        "tls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"",
        ca_file.display(),
        client_cert.display(),
        client_key.display()
    );
    follows_failover(setup, &store_extra, started);
}

/// Two Weirs enforce one limit on the master, then on the replica the Sentinel promotes after
/// the master is SIGKILLed.
fn follows_failover(mut setup: SentinelSetup, store_extra: &str, started: Instant) {
    let up = Upstream::start();
    let (w1, w2) = (member(&setup, &up, store_extra), member(&setup, &up, store_extra));
    let addrs = [w1.addr, w2.addr];
    let (old_master, replica) = (setup.master.port, setup.replica.port);
    // Precondition: each instance decides on the master (a loaded machine can take longer than
    // the store's 500 ms for a first TLS connection through the Sentinel, and `on_error =
    // "allow"` then passes requests without a decision). Checked on keys of their own.
    for (i, addr) in addrs.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(20);
        let key = format!("warm-up-{i}");
        while http::get_with(*addr, "/api/", &[("X-Key", &key)]).header("ratelimit").is_none() {
            assert!(Instant::now() < deadline, "instance {i} never decided on the master within 20 s");
            thread::sleep(Duration::from_millis(100));
        }
    }

    // One limit for both instances, kept on the master the Sentinel names.
    let rs = six(addrs, "before");
    assert_eq!(statuses(&rs), ENFORCED, "{:#?}", summaries(&rs));
    assert!(exists_on(&setup, old_master, "weir:fleet:{before}"));

    setup.master.kill();
    let killed = Instant::now();
    let setup = &setup;
    let (recovered, during, promoted) = thread::scope(|s| {
        let promoted = s.spawn(|| setup.wait_master(replica, Duration::from_secs(20)));
        let mut during = 0;
        for i in 0.. {
            if killed.elapsed() > Duration::from_secs(30) {
                break;
            }
            let key = format!("after-{i}");
            let rs = six(addrs, &key);
            for r in &rs {
                assert!(r.status == 200 || r.status == 429, "not served per policy: {}", r.summary());
            }
            if statuses(&rs) == ENFORCED {
                return (Some((killed.elapsed(), key)), during, promoted.join().expect("wait_master"));
            }
            during += rs.len();
            thread::sleep(Duration::from_millis(100));
        }
        (None, during, promoted.join().expect("wait_master"))
    });
    let promoted = promoted.expect("the sentinel promotes the replica within 20 s");
    let Some((took, key)) = recovered else {
        let tail = |w: &Weir| w.stderr().lines().rev().take(30).collect::<Vec<_>>().join("\n");
        panic!(
            "weir does not decide on the new master within 30 s\n--- w1 ---\n{}\n--- w2 ---\n{}",
            tail(&w1),
            tail(&w2)
        );
    };
    assert_eq!(setup.master_port(), Some(replica));
    assert!(exists_on(setup, replica, &format!("weir:fleet:{{{key}}}")), "decided on the new master");
    assert!(setup.connect(old_master).is_err(), "the old master is dead");
    println!(
        "sentinel failover: replica {replica} promoted {promoted:?} after SIGKILL of master {old_master}; \
         weir decides there {took:?} after the kill, {during} requests served per policy meanwhile; test {:?}",
        started.elapsed()
    );

    // Limits hold on the new master, for both instances.
    let rs = six(addrs, "later");
    assert_eq!(statuses(&rs), ENFORCED, "{:#?}", summaries(&rs));
}
