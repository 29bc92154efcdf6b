//! A load generator for Weir's rate limit service (bench/rls.sh): `ShouldRateLimit` calls with the
//! generated tonic client, closed loop, for a fixed time; prints one JSON line of counts.
//!
//! ```text
//! cargo run --release --example rls_load -- ADDR [SECONDS] [CONNECTIONS] [IN_FLIGHT_PER_CONNECTION] [KEYS]
//! ```
//!
//! Each call carries one descriptor `[("remote_address", "10.0.x.y")]` of `KEYS` distinct values
//! (round robin) in domain `bench`, so most calls are admitted and each is one store decision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use weir::rls::proto::rate_limit_descriptor::Entry;
use weir::rls::proto::rate_limit_response::Code;
use weir::rls::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};

fn arg<T: std::str::FromStr>(n: usize, default: T) -> T {
    std::env::args().nth(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: String =
        std::env::args().nth(1).ok_or("usage: rls_load ADDR [SECONDS] [CONNECTIONS] [IN_FLIGHT] [KEYS]")?;
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
                    let value = format!("10.0.{}.{}", n / 256, n % 256);
                    let request = RateLimitRequest {
                        domain: "bench".into(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry { key: "remote_address".into(), value }],
                            limit: None,
                            hits_addend: None,
                        }],
                        hits_addend: 0,
                    };
                    match client.should_rate_limit(request).await {
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
