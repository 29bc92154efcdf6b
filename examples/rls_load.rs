//! A load generator for Weir's rate limit service (bench/rls.sh): `ShouldRateLimit` calls with the
//! generated tonic client, closed loop, for a fixed time; prints one JSON line of counts.
//!
//! ```text
//! cargo run --release --example rls_load -- ADDR [SECONDS] [CONNECTIONS] [IN_FLIGHT_PER_CONNECTION] [KEYS]
//! cargo run --release --example rls_load -- ADDR SECONDS CONNECTIONS --rate CALLS_PER_SEC [KEYS]
//! ```
//!
//! With `--rate` the load is open loop: a call is started every 1/RATE s (spread over the
//! connections) in a task of its own, whatever the earlier ones do, so a stalled answer never
//! holds back the calls after it (no coordinated omission). Each call's latency runs from its
//! start; how late calls started against their schedule (tokio's timer has a 1 ms tick) is
//! reported apart, as `late_p99_us`. The line adds the latency percentiles in µs.
//!
//! Each call carries one descriptor `[("remote_address", "10.0.x.y")]` of `KEYS` distinct values
//! (round robin) in domain `bench`, so most calls are admitted and each is one store decision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tonic::transport::Channel;
use weir::rls::proto::rate_limit_descriptor::Entry;
use weir::rls::proto::rate_limit_response::Code;
use weir::rls::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};

fn arg<T: std::str::FromStr>(n: usize, default: T) -> T {
    std::env::args().nth(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

fn request(n: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "remote_address".into(), value: format!("10.0.{}.{}", n / 256, n % 256) }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: String =
        std::env::args().nth(1).ok_or("usage: rls_load ADDR [SECONDS] [CONNECTIONS] [IN_FLIGHT] [KEYS]")?;
    if std::env::args().nth(4).as_deref() == Some("--rate") {
        return open_loop(&addr, arg(2, 5.0), arg(3, 4), arg(5, 5000.0), arg(6, 10_000)).await;
    }
    let seconds: f64 = arg(2, 5.0);
    let connections: usize = arg(3, 4);
    let in_flight: usize = arg(4, 16);
    let keys: u64 = arg(5, 10_000);
    let (ok, over, errors, next) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let channel = Channel::from_shared(format!("http://{addr}"))?.connect().await?;
        for _ in 0..in_flight {
            let mut client = RateLimitServiceClient::new(channel.clone());
            let (ok, over, errors, next) = (ok.clone(), over.clone(), errors.clone(), next.clone());
            tasks.spawn(async move {
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed) % keys;
                    match client.should_rate_limit(request(n)).await {
                        Ok(r) if r.get_ref().overall_code == i32::from(Code::Ok) => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(_) => over.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let (ok, over, errors) = (ok.load(Ordering::Relaxed), over.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
    println!(
        "{{\"calls\":{},\"ok\":{ok},\"over_limit\":{over},\"errors\":{errors},\"seconds\":{elapsed:.3},\"calls_per_sec\":{:.1}}}",
        ok + over + errors,
        (ok + over + errors) as f64 / elapsed
    );
    Ok(())
}

/// Open loop at `rate` calls a second for `seconds`: prints counts and latency percentiles (µs,
/// from each call's start).
async fn open_loop(
    addr: &str,
    seconds: f64,
    connections: usize,
    rate: f64,
    keys: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut clients = Vec::new();
    for _ in 0..connections.max(1) {
        let channel = Channel::from_shared(format!("http://{addr}"))?.connect().await?;
        clients.push(RateLimitServiceClient::new(channel));
    }
    let total = (seconds * rate) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    // Each call records its own result as it ends and its task is freed then: a JoinSet kept
    // every finished task until the end, and the generator's work grew with the row's length
    // (a 10 s row's max latency read 28 ms where a 2 s row's read 5, on the same server).
    let results = Arc::new(Mutex::new(Results::with_capacity(total as usize)));
    let finished = Arc::new(Semaphore::new(0));
    let started = tokio::time::Instant::now();
    for n in 0..total {
        let due = started + interval.mul_f64(n as f64);
        tokio::time::sleep_until(due).await;
        let mut client = clients[n as usize % clients.len()].clone();
        let (results, finished) = (results.clone(), finished.clone());
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let late = started.saturating_duration_since(due).as_micros() as u64;
            let answer = client.should_rate_limit(request(n % keys)).await;
            let took = started.elapsed().as_micros() as u64;
            let kind = match answer {
                Ok(r) if r.get_ref().overall_code == i32::from(Code::Ok) => 0,
                Ok(_) => 1,
                Err(_) => 2,
            };
            results.lock().unwrap_or_else(|p| p.into_inner()).record(took, late, kind);
            finished.add_permits(1);
        });
    }
    let all = u32::try_from(total).map_err(|_| "too many calls for one run")?;
    drop(finished.acquire_many(all).await?);
    let elapsed = started.elapsed().as_secs_f64();
    let mut r = std::mem::take(&mut *results.lock().unwrap_or_else(|p| p.into_inner()));
    r.lateness.sort_unstable();
    let late_p99 = r.lateness.get(r.lateness.len() * 99 / 100).copied().unwrap_or(0);
    let latencies = &mut r.latencies;
    latencies.sort_unstable();
    let at = |q: f64| latencies.get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)));
    let pct = |q: f64| at(q).copied().unwrap_or(0);
    let [ok, over, errors] = r.counts;
    println!(
        "{{\"calls\":{},\"ok\":{ok},\"over_limit\":{over},\"errors\":{errors},\"seconds\":{elapsed:.3},\"calls_per_sec\":{:.1},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{},\"late_p99_us\":{late_p99}}}",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(0.999),
        latencies.last().copied().unwrap_or(0)
    );
    Ok(())
}

/// The open loop's results, recorded by each call as it ends.
#[derive(Default)]
struct Results {
    latencies: Vec<u64>,
    lateness: Vec<u64>,
    /// Admitted, over the limit, failed.
    counts: [u64; 3],
}

impl Results {
    fn with_capacity(n: usize) -> Self {
        Self { latencies: Vec::with_capacity(n), lateness: Vec::with_capacity(n), counts: [0; 3] }
    }

    fn record(&mut self, took: u64, late: u64, kind: usize) {
        self.latencies.push(took);
        self.lateness.push(late);
        self.counts[kind] += 1;
    }
}
