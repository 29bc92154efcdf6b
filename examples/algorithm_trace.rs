//! The same bursty traffic through every algorithm of the limit model, on a simulated clock.
//!
//! ```text
//! cargo run --example algorithm_trace > trace.csv     # algorithm,t_ms,admitted (one row per request)
//! python3 docs/plot_algorithms.py                      # runs this and draws docs/algorithms.png
//! ```
//!
//! One key, one zone per algorithm, comparable settings: the window algorithms allow 10 per 10 s
//! window (`window = "10s"`, `limit = 10`), the buckets drain or refill at 1 r/s and hold 10
//! (`burst = 9`; the leaky bucket with `nodelay`, so nothing is delayed and every decision is
//! admit or reject). The traffic (60 s):
//!
//! - a burst of 30 requests at t = 0;
//! - a steady 2 r/s (twice the rate) from 0.5 s to 19.5 s;
//! - quiet from 20 s to 29.5 s;
//! - a burst of 40 requests from 29.5 s to 30.475 s (one every 25 ms), straddling the window
//!   boundary at 30 s (windows are aligned to the Unix epoch, and the trace starts on one);
//! - a steady 2 r/s again from 30.5 s to 39.5 s;
//! - quiet from 40 s to 45 s;
//! - a burst of 20 at 45 s, then 1 request every 2 s (half the rate) to the end.
//!
//! Stdout is the CSV; stderr a summary per algorithm: admitted, and the most admitted in any
//! 10 s span (the sliding-window limit a window algorithm promises, and fixed window breaks).

use weir::limit::{decide_all, Algorithm, DelayPolicy, LimitReq, Rate, State, ZoneInput};

const MS: u64 = 1_000;
const SEC: u64 = 1_000_000;
/// The trace's t = 0: 1_700_000_000 s since the epoch, a multiple of 10 s, so the windows of
/// `window = "10s"` start at t = 0, 10, 20 … s.
const T0: u64 = 1_700_000_000 * SEC;
const DURATION_MS: u64 = 60_000;

/// Request arrival times in ms from t = 0, sorted (simultaneous requests repeat a time).
fn traffic() -> Vec<u64> {
    let mut t = Vec::new();
    t.extend(std::iter::repeat_n(0, 30));
    t.extend((1..40).map(|i| i * 500)); // 2 r/s: 0.5 s .. 19.5 s
    t.extend((0..40).map(|i| 29_500 + i * 25)); // 29.5 s .. 30.475 s
    t.extend((61..80).map(|i| i * 500)); // 2 r/s: 30.5 s .. 39.5 s
    t.extend(std::iter::repeat_n(45_000, 20));
    t.extend((1..8).map(|i| 45_000 + i * 2_000)); // 47 s .. 59 s
    t.sort_unstable();
    t
}

fn limits() -> Vec<LimitReq> {
    let window = Rate { count: 10, period_us: 10 * SEC };
    let per_second = Rate::parse("1r/s").expect("rate");
    let bucket = |algorithm| LimitReq { algorithm, rate: per_second, burst: 9, delay: DelayPolicy::NoDelay };
    let windowed = |algorithm| LimitReq { algorithm, rate: window, burst: 0, delay: DelayPolicy::NoDelay };
    vec![
        bucket(Algorithm::LeakyBucket),
        bucket(Algorithm::TokenBucket),
        windowed(Algorithm::FixedWindow),
        windowed(Algorithm::SlidingLog),
        windowed(Algorithm::SlidingWindow),
    ]
}

/// The most admissions in any span of `span_ms` (half-open `[t, t + span)`), over sorted times.
fn max_in_span(admitted_ms: &[u64], span_ms: u64) -> usize {
    let mut best = 0;
    let mut start = 0;
    for (end, &t) in admitted_ms.iter().enumerate() {
        while admitted_ms[start] + span_ms <= t {
            start += 1;
        }
        best = best.max(end + 1 - start);
    }
    best
}

fn main() {
    let arrivals = traffic();
    assert!(arrivals.iter().all(|&t| t < DURATION_MS));
    println!("algorithm,t_ms,admitted");
    eprintln!("{} requests offered in {} s", arrivals.len(), DURATION_MS / 1000);
    eprintln!("{:<15} {:>8} {:>18}", "algorithm", "admitted", "max in any 10 s");
    for limit in limits() {
        let name = limit.algorithm.as_str();
        let mut state: Option<State> = None;
        let mut admitted_ms = Vec::new();
        for &t_ms in &arrivals {
            let verdict = decide_all(&[ZoneInput { limit: &limit, state: state.clone(), cost: 1 }], T0 + t_ms * MS);
            if verdict.admitted {
                state = Some(verdict.zones[0].next.clone());
                admitted_ms.push(t_ms);
            }
            println!("{name},{t_ms},{}", u8::from(verdict.admitted));
        }
        eprintln!("{name:<15} {:>8} {:>18}", admitted_ms.len(), max_in_span(&admitted_ms, 10_000));
    }
}
