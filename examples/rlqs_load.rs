//! A load generator for Weir's rate limit quota service (bench/rlqs.sh): `STREAMS` RLQS streams
//! (Envoys), each reporting the same `BUCKETS` buckets (`name = b0 … bN`) once every `INTERVAL_MS`
//! as Envoy's filter does (one message with every bucket's allowed and denied since the last), so
//! each bucket's key has `STREAMS` holders; for a fixed time. Prints one JSON line of counts.
//!
//! ```text
//! cargo run --release --example rlqs_load -- ADDR SECONDS STREAMS BUCKETS INTERVAL_MS [DEMAND]
//! ```
//!
//! `DEMAND` is each Envoy's requests per second per bucket (reported as allowed; 10 unless told).
//! The streams start spread over one interval, so the reports arrive evenly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use weir::rls::proto::quota::{BucketId, BucketQuotaUsage, RateLimitQuotaServiceClient, RateLimitQuotaUsageReports};

fn arg<T: std::str::FromStr>(n: usize, default: T) -> T {
    std::env::args().nth(n).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[derive(Default)]
struct Counts {
    messages: AtomicU64,
    usages: AtomicU64,
    actions: AtomicU64,
    errors: AtomicU64,
}

fn report(buckets: usize, interval: Duration, demand: f64, first: bool) -> RateLimitQuotaUsageReports {
    let allowed = if first { 1 } else { (demand * interval.as_secs_f64()).round() as u64 };
    RateLimitQuotaUsageReports {
        domain: "bench".into(),
        bucket_quota_usages: (0..buckets)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId { bucket: [("name".to_string(), format!("b{i}"))].into_iter().collect() }),
                time_elapsed: Some(prost_types::Duration {
                    seconds: if first { 0 } else { interval.as_secs() as i64 },
                    nanos: 0,
                }),
                num_requests_allowed: allowed,
                num_requests_denied: 0,
            })
            .collect(),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: String =
        std::env::args().nth(1).ok_or("usage: rlqs_load ADDR SECONDS STREAMS BUCKETS INTERVAL_MS [DEMAND]")?;
    let seconds: f64 = arg(2, 10.0);
    let streams: usize = arg(3, 8);
    let buckets: usize = arg(4, 100);
    let interval = Duration::from_millis(arg(5, 1000));
    let demand: f64 = arg(6, 10.0);
    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let channel = Channel::from_shared(format!("http://{addr}"))?.connect().await?;
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..streams {
        let (mut client, counts) = (RateLimitQuotaServiceClient::new(channel.clone()), counts.clone());
        let offset = interval.mul_f64(s as f64 / streams as f64);
        tasks.spawn(async move {
            tokio::time::sleep(offset).await;
            let (tx, rx) = tokio::sync::mpsc::channel::<RateLimitQuotaUsageReports>(4);
            let outbound = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
            if tx.send(report(buckets, interval, demand, true)).await.is_err() {
                return;
            }
            let mut inbound = match client.stream_rate_limit_quotas(outbound).await {
                Ok(r) => r.into_inner(),
                Err(_) => {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            };
            counts.messages.fetch_add(1, Ordering::Relaxed);
            counts.usages.fetch_add(buckets as u64, Ordering::Relaxed);
            let reader_counts = counts.clone();
            let reader = tokio::spawn(async move {
                loop {
                    match inbound.message().await {
                        Ok(Some(answer)) => {
                            reader_counts.actions.fetch_add(answer.bucket_action.len() as u64, Ordering::Relaxed);
                        }
                        Ok(None) => return,
                        Err(_) => {
                            reader_counts.errors.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            });
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            while Instant::now() < deadline {
                tick.tick().await;
                if Instant::now() >= deadline || reader.is_finished() {
                    break;
                }
                if tx.send(report(buckets, interval, demand, false)).await.is_err() {
                    break;
                }
                counts.messages.fetch_add(1, Ordering::Relaxed);
                counts.usages.fetch_add(buckets as u64, Ordering::Relaxed);
            }
            drop(tx);
            reader.abort();
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed().as_secs_f64();
    let usages = counts.usages.load(Ordering::Relaxed);
    println!(
        "{{\"streams\":{streams},\"buckets\":{buckets},\"messages\":{},\"usages\":{usages},\"actions\":{},\"errors\":{},\"seconds\":{elapsed:.3},\"usages_per_sec\":{:.1}}}",
        counts.messages.load(Ordering::Relaxed),
        counts.actions.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
        usages as f64 / elapsed
    );
    Ok(())
}
