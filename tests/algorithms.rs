//! The contract of the running binary for every rate-limiting algorithm, request cost and per-key
//! overrides: each reachable through the config and the proxy, with its statuses and headers. The
//! real `weir` binary (memory store), a real upstream, real sockets on loopback. The model itself
//! (every instant, boundary, cost and extreme) is table-driven on a manual clock in
//! `src/limit/tables/`; here, where time matters, short windows and rates keep each test to
//! seconds, nothing waits for a wall-clock minute, and a limit that must hold until an instant is
//! checked by asking until it is lifted: no admission read before the instant (exact lower bound),
//! one within seconds after it (generous upper bound). Config errors go through `weir check -c`.

use crate::support;

use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::config::{line_of, memory_with_app};
use support::http::{self, statuses, summaries, Response};
use support::ratelimit::{retry_after, sf_param};
use support::upstream::Upstream;
use support::weir::{check_config, Weir};

const SEC_US: u64 = 1_000_000;

/// `r=` of the `RateLimit` field (remaining right now).
fn remaining(r: &Response) -> i64 {
    let rl = r.header("ratelimit").unwrap_or_else(|| panic!("no RateLimit: {}", r.summary()));
    sf_param(&rl, "r").unwrap_or_else(|| panic!("no r= in RateLimit: {}", r.summary()))
}

/// `(q, w)` of the `RateLimit-Policy` field.
fn policy(r: &Response) -> (i64, i64) {
    let p = r.header("ratelimit-policy").unwrap_or_else(|| panic!("no RateLimit-Policy: {}", r.summary()));
    let q = sf_param(&p, "q").unwrap_or_else(|| panic!("no q= in {p:?}"));
    let w = sf_param(&p, "w").unwrap_or_else(|| panic!("no w= in {p:?}"));
    (q, w)
}

/// A 429 from a rate limit, with the contract's fields.
fn assert_rate_limited(r: &Response, zone: &str) {
    let ctx = r.summary();
    assert_eq!(r.status, 429, "rejected: {ctx}");
    assert!(retry_after(r) >= 1, "Retry-After >= 1: {ctx}");
    let body = r.json();
    assert_eq!(body["error"], "rate_limited", "{ctx}");
    assert_eq!(body["zone"], zone, "{ctx}");
    assert_eq!(body["retry_after"].as_u64(), Some(retry_after(r)), "body agrees with Retry-After: {ctx}");
    assert_eq!(remaining(r), 0, "nothing remains on a rejection: {ctx}");
}

fn get(w: &Weir, path: &str) -> Response {
    http::get(w.addr, path)
}

fn get_with(w: &Weir, path: &str, headers: &[(&str, &str)]) -> Response {
    http::get_with(w.addr, path, headers)
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_micros() as u64
}

/// Sleeps until the wall clock (the one weir reads) reaches `at_us`.
fn sleep_until_us(at_us: u64) {
    let now = now_us();
    if at_us > now {
        thread::sleep(Duration::from_micros(at_us - now));
    }
}

/// Sleeps until `offset` past the start of the next epoch-aligned window of `period`; returns
/// that window's start (µs since the epoch), as fixed and sliding windows align theirs.
fn next_window_start(period: Duration, offset: Duration) -> u64 {
    let period_us = period.as_micros() as u64;
    let start = (now_us() / period_us + 1) * period_us;
    sleep_until_us(start + offset.as_micros() as u64);
    start
}

/// An admission after rejections (see [`poll_until_admitted`]).
struct Admitted {
    response: Response,
    /// When the admitted request was read back (µs since the epoch).
    done: u64,
    /// When each rejected request before it was sent (µs since the epoch).
    rejected_sent: Vec<u64>,
}

/// Sends `GET path` every 50 ms until it is admitted, for at most `within`: every answer before
/// that must be `zone`'s 429, and one must be admitted in time (fails loudly otherwise).
fn poll_until_admitted(w: &Weir, path: &str, zone: &str, within: Duration) -> Admitted {
    let deadline = Instant::now() + within;
    let mut rejected_sent = Vec::new();
    loop {
        let sent = now_us();
        let r = get(w, path);
        let done = now_us();
        if r.status == 200 {
            return Admitted { response: r, done, rejected_sent };
        }
        assert_rate_limited(&r, zone);
        rejected_sent.push(sent);
        assert!(Instant::now() < deadline, "{path}: still rejected {within:?} later: {}", r.summary());
        thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// Each algorithm end to end
// ---------------------------------------------------------------------------------------------

#[test]
fn fixed_window_counts_per_epoch_aligned_window_and_reopens_at_the_boundary() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "fw"
key = "ip"
algorithm = "fixed_window"
window = "2s"
limit = 3

[[route]]
name = "fw"
path_prefix = "/fw/"
upstream = "app"
limit_req = [ { zone = "fw" } ]
"#,
    ));

    let start = next_window_start(Duration::from_secs(2), Duration::from_millis(50));
    let rs: Vec<Response> = (0..3).map(|_| get(&w, "/fw/a")).collect();
    assert!(rs.iter().all(|r| r.status == 200), "3 pass in a fresh window: {:#?}", summaries(&rs));
    assert_eq!(rs.iter().map(remaining).collect::<Vec<_>>(), vec![2, 1, 0], "r counts down");
    assert_eq!(policy(&rs[0]), (3, 2), "window algorithm: q=<limit>;w=<window seconds>");
    let p = rs[0].header("ratelimit-policy").unwrap();
    assert!(p.contains("\"fw\""), "policy names the zone: {p}");

    let sent = now_us();
    let fourth = get(&w, "/fw/a");
    let done = now_us();
    assert_rate_limited(&fourth, "fw");
    let ra = retry_after(&fourth);
    assert!(ra <= 2, "Retry-After is at most the window: {}", fourth.summary());
    // Retry-After = the rest of the window, rounded up (at least 1 s), for a "now" between the
    // request's sending and its answer: 2 when it ran less than 1 s into the window, as it
    // normally does; a slow machine moves the bounds, never skips the check (the exact instant:
    // `fixed_window_cases` in src/limit/tables/fixed_window.rs).
    let rest_secs = |at: u64| (start + 2 * SEC_US).saturating_sub(at).div_ceil(SEC_US).max(1);
    assert!(
        (rest_secs(done)..=rest_secs(sent)).contains(&ra),
        "Retry-After = the rest of the window, rounded up ({}..={}): {}",
        rest_secs(done),
        rest_secs(sent),
        fourth.summary()
    );
    assert_eq!(policy(&fourth), (3, 2), "{}", fourth.summary());

    // Rejected until the window ends (exact lower bound: nothing admitted is read before its end),
    // then the next window opens whole: 3 more right away (with the 3 just before: the double
    // burst). The instants to the µs: `fixed_window_cases` in src/limit/tables/fixed_window.rs.
    let reopened = poll_until_admitted(&w, "/fw/a", "fw", Duration::from_secs(7));
    assert!(
        reopened.done >= start + 2 * SEC_US,
        "admitted {} µs before the window's end: {}",
        start + 2 * SEC_US - reopened.done,
        reopened.response.summary()
    );
    assert_eq!(remaining(&reopened.response), 2, "a new window: {}", reopened.response.summary());
    let rs: Vec<Response> = (0..3).map(|_| get(&w, "/fw/a")).collect();
    assert_eq!(statuses(&rs), vec![200, 200, 429], "a new window: {:#?}", summaries(&rs));
    assert_eq!(up.hits(), 6, "upstream saw exactly the admitted requests");
}

#[test]
fn sliding_log_admits_the_limit_in_any_window_and_retries_when_the_oldest_leaves() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "log_m"
key = "ip"
algorithm = "sliding_log"
rate = "3r/m"

[[limit_req_zone]]
name = "log_2s"
key = "ip"
algorithm = "sliding_log"
window = "2s"
limit = 3

[[route]]
name = "per_minute"
path_prefix = "/m/"
upstream = "app"
limit_req = [ { zone = "log_m" } ]

[[route]]
name = "short"
path_prefix = "/s/"
upstream = "app"
limit_req = [ { zone = "log_2s" } ]
"#,
    ));

    // rate = "3r/m": 3 per minute window ending now.
    let rs: Vec<Response> = (0..4).map(|_| get(&w, "/m/x")).collect();
    assert_eq!(statuses(&rs), vec![200, 200, 200, 429], "{:#?}", summaries(&rs));
    assert_eq!(rs[..3].iter().map(remaining).collect::<Vec<_>>(), vec![2, 1, 0]);
    assert_rate_limited(&rs[3], "log_m");
    let ra = retry_after(&rs[3]);
    assert!((59..=60).contains(&ra), "Retry-After ≈ 60 s, when the oldest entry leaves: {}", rs[3].summary());
    assert_eq!(policy(&rs[3]), (3, 60), "q=3;w=60: {}", rs[3].summary());

    // window = "2s": one request, then two 1 s later; the window slides, nothing resets.
    let first_sent = now_us();
    assert_eq!(get(&w, "/s/x").status, 200);
    let first_done = now_us();
    sleep_until_us(first_done + SEC_US);
    assert_eq!(get(&w, "/s/x").status, 200);
    assert_eq!(get(&w, "/s/x").status, 200);
    let full = get(&w, "/s/x");
    assert_rate_limited(&full, "log_2s");
    assert_eq!(retry_after(&full), 1, "the first entry leaves within a second: {}", full.summary());
    assert_eq!(policy(&full), (3, 2));

    // The first entry stays in the window 2 s after it was admitted (exact lower bound: nothing
    // admitted is read before); after it leaves, exactly one place is free (the other two are 1 s
    // younger). The instants to the µs: `sliding_log_cases` in src/limit/tables/sliding_log.rs.
    let after = poll_until_admitted(&w, "/s/x", "log_2s", Duration::from_secs(6));
    assert!(
        after.done >= first_sent + 2 * SEC_US,
        "admitted {} µs before the oldest entry left: {}",
        first_sent + 2 * SEC_US - after.done,
        after.response.summary()
    );
    assert_eq!(remaining(&after.response), 0, "{}", after.response.summary());
    let again = get(&w, "/s/x");
    assert_rate_limited(&again, "log_2s");
}

#[test]
fn token_bucket_holds_burst_plus_one_and_refills_at_the_rate() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "tokens"
key = "ip"
algorithm = "token_bucket"
rate = "1r/m"

[[limit_req_zone]]
name = "leaky"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "fast_tokens"
key = "ip"
algorithm = "token_bucket"
rate = "2r/s"

[[route]]
name = "tb"
path_prefix = "/tb/"
upstream = "app"
limit_req = [ { zone = "tokens", burst = 2 } ]

[[route]]
name = "lb"
path_prefix = "/lb/"
upstream = "app"
limit_req = [ { zone = "leaky", burst = 2, nodelay = true } ]

[[route]]
name = "fast"
path_prefix = "/fast/"
upstream = "app"
limit_req = [ { zone = "fast_tokens", burst = 2 } ]
"#,
    ));

    let tb: Vec<Response> = (0..4).map(|_| get(&w, "/tb/x")).collect();
    assert_eq!(statuses(&tb), vec![200, 200, 200, 429], "{:#?}", summaries(&tb));
    assert_eq!(tb[..3].iter().map(remaining).collect::<Vec<_>>(), vec![2, 1, 0]);
    assert_rate_limited(&tb[3], "tokens");
    let ra = retry_after(&tb[3]);
    assert!((59..=60).contains(&ra), "one token takes 60 s at 1r/m: {}", tb[3].summary());
    // q = burst + 1 tokens, w = the time an empty bucket takes to refill them (3 min).
    assert_eq!(policy(&tb[3]), (3, 180), "{}", tb[3].summary());

    // The same pattern through a leaky bucket with nodelay decides the same, header for header.
    let lb: Vec<Response> = (0..4).map(|_| get(&w, "/lb/x")).collect();
    assert_eq!(statuses(&lb), vec![200, 200, 200, 429], "{:#?}", summaries(&lb));
    assert_eq!(lb[..3].iter().map(remaining).collect::<Vec<_>>(), vec![2, 1, 0]);
    assert_eq!(policy(&lb[3]), policy(&tb[3]));
    assert!((59..=60).contains(&retry_after(&lb[3])), "{}", lb[3].summary());

    // 2r/s: a token every 500 ms.
    let first_sent = now_us();
    let fast: Vec<Response> = (0..4).map(|_| get(&w, "/fast/x")).collect();
    assert_eq!(statuses(&fast), vec![200, 200, 200, 429], "{:#?}", summaries(&fast));
    assert_eq!(retry_after(&fast[3]), 1, "500 ms, rounded up: {}", fast[3].summary());
    assert_eq!(policy(&fast[3]), (3, 2), "3 tokens at 2r/s refill in 1.5 s, rounded up");
    // A full bucket at the first request, refilling since: the first token is back 500 ms after it
    // (exact lower bound), and only one.
    let refilled = poll_until_admitted(&w, "/fast/x", "fast_tokens", Duration::from_secs(5));
    assert!(
        refilled.done >= first_sent + 500_000,
        "a token back {} µs before 500 ms: {}",
        first_sent + 500_000 - refilled.done,
        refilled.response.summary()
    );
    assert_rate_limited(&get(&w, "/fast/x"), "fast_tokens");
}

#[test]
fn sliding_window_estimates_with_the_previous_window_weighted_by_its_overlap() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "sw_m"
key = "ip"
algorithm = "sliding_window"
rate = "5r/m"

[[limit_req_zone]]
name = "sw_4s"
key = "ip"
algorithm = "sliding_window"
window = "4s"
limit = 2

[[route]]
name = "per_minute"
path_prefix = "/m/"
upstream = "app"
limit_req = [ { zone = "sw_m" } ]

[[route]]
name = "short"
path_prefix = "/s/"
upstream = "app"
limit_req = [ { zone = "sw_4s" } ]
"#,
    ));

    // rate = "5r/m": five pass, counting down, the sixth is over. Its Retry-After: with 5 in this
    // minute, a sixth fits once 5 × (60 - t) / 60 <= 4, 12 s into the next minute. The formula to
    // the µs: `sliding_window_cases` in src/limit/tables/sliding_window.rs.
    let first_sent = now_us();
    let rs: Vec<Response> = (0..5).map(|_| get(&w, "/m/x")).collect();
    assert!(rs.iter().all(|r| r.status == 200), "{:#?}", summaries(&rs));
    assert_eq!(rs.iter().map(remaining).collect::<Vec<_>>(), vec![4, 3, 2, 1, 0]);
    let sent = now_us();
    let sixth = get(&w, "/m/x");
    let done = now_us();
    assert_rate_limited(&sixth, "sw_m");
    assert_eq!(policy(&sixth), (5, 60));
    let ra = retry_after(&sixth);
    let minute = |t: u64| t / (60 * SEC_US);
    if minute(first_sent) == minute(done) {
        // All six in one minute (nearly always): the rest of it + 12 s, for a "now" between the
        // sixth's sending and its answer.
        let minute_end = (minute(sent) + 1) * 60 * SEC_US;
        let lo = (minute_end + 12 * SEC_US - done).div_ceil(SEC_US);
        let hi = (minute_end + 12 * SEC_US - sent).div_ceil(SEC_US);
        assert!(
            (lo..=hi).contains(&ra),
            "Retry-After in {lo}..={hi} (the rest of the minute + 12 s): {}",
            sixth.summary()
        );
    } else {
        // Across a minute boundary, p of the five decided before it: a sixth fits once
        // p × t / 60 >= 1 into the new minute, i.e. from 60 / p s (12 s for p = 5) up to 60 s
        // (p = 1) into it; 12 s into the next one if none was (p = 0).
        let boundary = (minute(first_sent) + 1) * 60 * SEC_US;
        let lo = (boundary + 12 * SEC_US).saturating_sub(done).div_ceil(SEC_US);
        let hi = (boundary + 72 * SEC_US).saturating_sub(sent).div_ceil(SEC_US);
        assert!((lo..=hi).contains(&ra), "Retry-After in {lo}..={hi} across a minute boundary: {}", sixth.summary());
    }

    // window = "4s", limit = 2: fill one window; in the next the previous 2 weigh 2 × (1 - t/4 s),
    // so a request is rejected there until 2 s into it (a fixed window would admit it at once):
    // exact lower bound, generous upper bound.
    let start = next_window_start(Duration::from_secs(4), Duration::from_millis(50));
    let rs: Vec<Response> = (0..3).map(|_| get(&w, "/s/x")).collect();
    assert_eq!(statuses(&rs), vec![200, 200, 429], "{:#?}", summaries(&rs));
    assert_eq!(policy(&rs[2]), (2, 4), "{}", rs[2].summary());
    sleep_until_us(start + 4 * SEC_US);
    let next = poll_until_admitted(&w, "/s/x", "sw_4s", Duration::from_secs(10));
    assert!(
        next.rejected_sent.iter().any(|&t| t >= start + 4 * SEC_US),
        "a request sent in the next window was rejected (the previous window weighs in): sent at {:?}, admitted {}",
        next.rejected_sent,
        next.response.summary()
    );
    assert!(
        next.done >= start + 6 * SEC_US,
        "admitted {} µs before 2 s into the next window: {}",
        start + 6 * SEC_US - next.done,
        next.response.summary()
    );
    // One passed: 2 × (1 - t/4) + 1 + 1 > 2 for the rest of the window.
    assert_rate_limited(&get(&w, "/s/x"), "sw_4s");
}

// ---------------------------------------------------------------------------------------------
// Cost
// ---------------------------------------------------------------------------------------------

#[test]
fn route_cost_and_cost_header_are_charged_clamped_and_validated() {
    let up = Upstream::start();
    let mut w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "fixed_cost"
key = "ip"
algorithm = "token_bucket"
rate = "1r/m"

[[limit_req_zone]]
name = "header_cost"
key = "ip"
algorithm = "token_bucket"
rate = "1r/m"

[[route]]
name = "report"
path_prefix = "/report/"
upstream = "app"
cost = 3
limit_req = [ { zone = "fixed_cost", burst = 5 } ]

[[route]]
name = "batch"
path_prefix = "/batch/"
upstream = "app"
cost_header = "X-Cost"
max_cost = 4
limit_req = [ { zone = "header_cost", burst = 9 } ]
"#,
    ));

    // cost = 3 against 6 tokens: two pass, the third is over.
    let rs: Vec<Response> = (0..3).map(|_| get(&w, "/report/x")).collect();
    assert_eq!(statuses(&rs), vec![200, 200, 429], "{:#?}", summaries(&rs));
    assert_eq!(remaining(&rs[0]), 3, "6 - 3: {}", rs[0].summary());
    assert_eq!(remaining(&rs[1]), 0, "{}", rs[1].summary());
    assert_rate_limited(&rs[2], "fixed_cost");
    let ra = retry_after(&rs[2]);
    assert!((179..=180).contains(&ra), "3 tokens at 1r/m take 180 s: {}", rs[2].summary());

    // cost_header: 10 tokens; 2, then 999 clamped to 4.
    let two = get_with(&w, "/batch/x", &[("X-Cost", "2")]);
    assert_eq!(two.status, 200, "{}", two.summary());
    assert_eq!(remaining(&two), 8, "X-Cost: 2 counts 2: {}", two.summary());
    let clamped = get_with(&w, "/batch/x", &[("X-Cost", "999")]);
    assert_eq!(clamped.status, 200, "{}", clamped.summary());
    assert_eq!(remaining(&clamped), 4, "X-Cost: 999 is clamped to max_cost = 4: {}", clamped.summary());

    for bad in ["abc", "-1", "1.5", "+2", "1e3", "0x10", "2 3"] {
        let r = get_with(&w, "/batch/x", &[("X-Cost", bad)]);
        assert_eq!(r.status, 400, "X-Cost: {bad:?}: {}", r.summary());
        assert!(r.header("content-type").is_some_and(|c| c.starts_with("application/json")), "{}", r.summary());
        let body = r.json();
        assert_eq!(body["error"], "bad_cost", "X-Cost: {bad:?}: {}", r.summary());
        assert_eq!(body["route"], "batch", "{}", r.summary());
        assert!(!r.has_header("retry-after"), "a bad request is not a rate limit: {}", r.summary());
        w.assert_alive(&format!("after X-Cost: {bad:?}"));
    }
    // The 400s charged nothing: 4 tokens left, then none.
    let four = get_with(&w, "/batch/x", &[("X-Cost", "4")]);
    assert_eq!(four.status, 200, "bad costs were not charged: {}", four.summary());
    assert_eq!(remaining(&four), 0, "{}", four.summary());
    let over = get_with(&w, "/batch/x", &[("X-Cost", "1")]);
    assert_rate_limited(&over, "header_cost");
    // Without the header the route's cost (default 1) applies.
    let plain = get(&w, "/batch/x");
    assert_rate_limited(&plain, "header_cost");
    assert_eq!(up.hits(), 5, "2 report + 3 batch requests reached the upstream");
    w.assert_alive("at the end");
}

#[test]
fn a_cost_no_zone_could_ever_admit_is_request_too_costly_without_retry_after() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "tb10"
key = "ip"
algorithm = "token_bucket"
rate = "1r/m"

[[limit_req_zone]]
name = "log3"
key = "ip"
algorithm = "sliding_log"
rate = "3r/m"

[[limit_req_zone]]
name = "fw3"
key = "ip"
algorithm = "fixed_window"
rate = "3r/m"

[[limit_req_zone]]
name = "lb"
key = "ip"
rate = "1r/m"

[[route]]
name = "big"
path_prefix = "/big/"
upstream = "app"
cost_header = "X-Cost"
max_cost = 1000
limit_req = [ { zone = "tb10", burst = 9 } ]

[[route]]
name = "log"
path_prefix = "/log/"
upstream = "app"
cost = 4
limit_req = [ { zone = "log3" } ]

[[route]]
name = "fw"
path_prefix = "/fw/"
upstream = "app"
cost = 4
limit_req = [ { zone = "fw3" } ]

[[route]]
name = "leaky"
path_prefix = "/leaky/"
upstream = "app"
cost = 3
limit_req = [ { zone = "lb", burst = 1, nodelay = true } ]
"#,
    ));

    let assert_too_costly = |r: &Response, route: &str, zone: &str| {
        let ctx = r.summary();
        assert_eq!(r.status, 429, "{ctx}");
        let body = r.json();
        assert_eq!(body["error"], "request_too_costly", "{ctx}");
        assert_eq!(body["route"], route, "{ctx}");
        assert_eq!(body["zone"], zone, "{ctx}");
        assert!(body["retry_after"].is_null(), "retry_after: null: {ctx}");
        assert!(!r.has_header("retry-after"), "no Retry-After: retrying cannot help: {ctx}");
    };

    let r = get_with(&w, "/big/x", &[("X-Cost", "11")]);
    assert_too_costly(&r, "big", "tb10");
    // Exactly the capacity passes (the too-costly request charged nothing), and 11 stays too costly.
    let r = get_with(&w, "/big/x", &[("X-Cost", "10")]);
    assert_eq!(r.status, 200, "cost = burst + 1 fits a full bucket: {}", r.summary());
    let r = get_with(&w, "/big/x", &[("X-Cost", "11")]);
    assert_too_costly(&r, "big", "tb10");
    // A cost that fits the capacity but not the tokens left is an ordinary rejection.
    let r = get_with(&w, "/big/x", &[("X-Cost", "1")]);
    assert_rate_limited(&r, "tb10");

    assert_too_costly(&get(&w, "/log/x"), "log", "log3");
    assert_too_costly(&get(&w, "/fw/x"), "fw", "fw3");
    assert_too_costly(&get(&w, "/leaky/x"), "leaky", "lb");
    assert_eq!(up.hits(), 1, "only the X-Cost: 10 request reached the upstream");
}

// ---------------------------------------------------------------------------------------------
// Overrides
// ---------------------------------------------------------------------------------------------

#[test]
fn header_override_gives_a_partner_its_own_rate_and_burst_and_unlimited_exempts() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[limit_req_zone.override]]
match = "header:X-Api-Key=partner-123"
rate = "600r/m"
burst = 20

[[limit_req_zone.override]]
match = "header:X-Api-Key=internal"
rate = "unlimited"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ { zone = "per_key", burst = 0, nodelay = true } ]
"#,
    ));

    // partner-123: 600r/m (one every 100 ms) with burst 20: 21 at once.
    let started = Instant::now();
    let mut passed = 0;
    let rejection = loop {
        let r = get_with(&w, "/api/x", &[("X-Api-Key", "partner-123")]);
        if r.status != 200 {
            break r;
        }
        if passed == 0 {
            assert_eq!(policy(&r), (21, 3), "the override's burst + 1, refilled in 2.1 s: {}", r.summary());
        }
        passed += 1;
        assert!(passed <= 1000, "the partner is never limited");
    };
    let elapsed = started.elapsed();
    assert_rate_limited(&rejection, "per_key");
    assert!(passed >= 21, "the partner gets burst 20 + 1 = 21 passes, got {passed}");
    // Generous upper bound: plus what 10 r/s drains while the requests were sent.
    let drained = (elapsed.as_secs_f64() * 10.0).ceil() as usize;
    assert!(passed <= 21 + drained, "{passed} passes in {elapsed:?}: at most 21 + {drained}");
    assert_eq!(retry_after(&rejection), 1, "100 ms at 600r/m, rounded up: {}", rejection.summary());

    // Another key gets the zone's own 1r/m with the route's burst 0.
    let a = get_with(&w, "/api/x", &[("X-Api-Key", "someone-else")]);
    assert_eq!(a.status, 200, "{}", a.summary());
    assert_eq!(policy(&a), (1, 60), "{}", a.summary());
    let b = get_with(&w, "/api/x", &[("X-Api-Key", "someone-else")]);
    assert_rate_limited(&b, "per_key");
    assert!((59..=60).contains(&retry_after(&b)), "{}", b.summary());

    // The match is on the whole value.
    let near = get_with(&w, "/api/x", &[("X-Api-Key", "partner-1234")]);
    assert_eq!(near.status, 200, "{}", near.summary());
    assert_rate_limited(&get_with(&w, "/api/x", &[("X-Api-Key", "partner-1234")]), "per_key");

    // internal: unlimited.
    for i in 0..50 {
        let r = get_with(&w, "/api/x", &[("X-Api-Key", "internal")]);
        assert_eq!(r.status, 200, "internal request {i} is never limited: {}", r.summary());
    }
}

#[test]
fn ip_override_exempts_loopback_and_the_first_matching_override_wins() {
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone.override]]
match = "127.0.0.0/8"
rate = "unlimited"

[[limit_req_zone]]
name = "per_ip_plain"
key = "ip"
rate = "1r/m"

[[limit_req_zone]]
name = "header_first"
key = ["ip", "header:X-Api-Key"]
rate = "1r/m"

[[limit_req_zone.override]]
match = "header:X-Api-Key=partner-123"
rate = "1r/m"
burst = 1

[[limit_req_zone.override]]
match = "127.0.0.0/8"
rate = "unlimited"

[[limit_req_zone]]
name = "ip_first"
key = ["ip", "header:X-Api-Key"]
rate = "1r/m"

[[limit_req_zone.override]]
match = "127.0.0.1"
rate = "unlimited"

[[limit_req_zone.override]]
match = "header:X-Api-Key=partner-123"
rate = "1r/m"
burst = 1

[[route]]
name = "exempt"
path_prefix = "/exempt/"
upstream = "app"
limit_req = [ { zone = "per_ip", burst = 0, nodelay = true } ]

[[route]]
name = "plain"
path_prefix = "/plain/"
upstream = "app"
limit_req = [ { zone = "per_ip_plain", burst = 0, nodelay = true } ]

[[route]]
name = "header_first"
path_prefix = "/hf/"
upstream = "app"
limit_req = [ { zone = "header_first", burst = 0, nodelay = true } ]

[[route]]
name = "ip_first"
path_prefix = "/if/"
upstream = "app"
limit_req = [ { zone = "ip_first", burst = 0, nodelay = true } ]
"#,
    ));

    for i in 0..30 {
        let r = get(&w, "/exempt/x");
        assert_eq!(r.status, 200, "loopback is exempt (request {i}): {}", r.summary());
    }
    // The same zone without the override limits loopback.
    assert_eq!(get(&w, "/plain/x").status, 200);
    assert_rate_limited(&get(&w, "/plain/x"), "per_ip_plain");

    // header_first: the partner override comes first, so it applies even from loopback.
    let partner = [("X-Api-Key", "partner-123")];
    let rs: Vec<Response> = (0..3).map(|_| get_with(&w, "/hf/x", &partner)).collect();
    assert_eq!(statuses(&rs), vec![200, 200, 429], "{:#?}", summaries(&rs));
    assert_rate_limited(&rs[2], "header_first");
    for _ in 0..10 {
        let r = get_with(&w, "/hf/x", &[("X-Api-Key", "other")]);
        assert_eq!(r.status, 200, "other keys from loopback match the second override: {}", r.summary());
    }
    // ip_first: the loopback override comes first and wins for the partner too.
    for _ in 0..10 {
        let r = get_with(&w, "/if/x", &partner);
        assert_eq!(r.status, 200, "the first matching override (unlimited) wins: {}", r.summary());
    }
}

#[test]
fn header_override_matches_a_long_value() {
    // API keys and tokens are often longer than the 128 bytes after which a zone's key is hashed;
    // an override naming one must still match it.
    let long_key = "k".repeat(200);
    let up = Upstream::start();
    let w = Weir::start(&memory_with_app(
        up.addr(),
        &format!(
            r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[limit_req_zone.override]]
match = "header:X-Api-Key={long_key}"
rate = "unlimited"

[[route]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limit_req = [ {{ zone = "per_key", burst = 0, nodelay = true }} ]
"#
        ),
    ));
    for i in 0..5 {
        let r = get_with(&w, "/api/x", &[("X-Api-Key", long_key.as_str())]);
        assert_eq!(r.status, 200, "request {i} with the exempted 200-byte key: {}", r.summary());
    }
}

// ---------------------------------------------------------------------------------------------
// Config errors
// ---------------------------------------------------------------------------------------------

const CHECK_TIMEOUT: Duration = Duration::from_secs(15);

const CHECK_HEAD: &str = r#"[server]
listen = ["127.0.0.1:8080"]

[[upstream]]
name = "app"
servers = ["127.0.0.1:9000"]
"#;

/// `weir check -c FILE` must exit 1 with `FILE:LINE:` (LINE: of `needle`) and every word of `says`.
fn expect_check_error(case: &str, body: &str, needle: &str, says: &[&str]) {
    let text = format!("{CHECK_HEAD}{body}");
    let file = format!("{case}.toml");
    let out = check_config(&file, &text, CHECK_TIMEOUT);
    let line = line_of(&text, needle);
    let ctx = format!("case {case}: expected {file}:{line} saying {says:?}\n{text}\n{}", out.describe());
    assert!(!out.timed_out, "{ctx}");
    assert_eq!(out.code, Some(1), "exit code 1: {ctx}");
    assert!(out.stderr.contains(&format!("{file}:{line}:")), "stderr names file:line: {ctx}");
    for word in says {
        assert!(out.stderr.contains(word), "stderr says {word:?}: {ctx}");
    }
}

#[test]
fn check_refuses_bucket_settings_on_window_algorithms_and_delay_on_token_bucket() {
    expect_check_error(
        "burst_on_fixed_window",
        r#"
[[limit_req_zone]]
name = "fw"
key = "ip"
algorithm = "fixed_window"
rate = "100r/m"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"

[[route.limit_req]]
zone = "fw"
burst = 5
"#,
        "burst = 5",
        &["fw", "fixed_window", "burst"],
    );
    expect_check_error(
        "nodelay_on_sliding_log",
        r#"
[[limit_req_zone]]
name = "log"
key = "ip"
algorithm = "sliding_log"
window = "10s"
limit = 50

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"
limit_req = [ { zone = "log", nodelay = true } ]
"#,
        "limit_req = [",
        &["log", "sliding_log", "nodelay"],
    );
    expect_check_error(
        "delay_on_token_bucket",
        r#"
[[limit_req_zone]]
name = "tb"
key = "ip"
algorithm = "token_bucket"
rate = "10r/s"

[[route]]
name = "api"
path_prefix = "/"
upstream = "app"

[[route.limit_req]]
zone = "tb"
burst = 5
delay = 2
"#,
        "delay = 2",
        &["tb", "token_bucket", "delay"],
    );
}

#[test]
fn check_refuses_unknown_algorithms_and_misplaced_window_settings() {
    expect_check_error(
        "unknown_algorithm",
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
algorithm = "gcra"
rate = "10r/s"
"#,
        "algorithm = \"gcra\"",
        &["algorithm", "gcra"],
    );
    expect_check_error(
        "window_on_leaky_bucket",
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
window = "10s"
limit = 5
"#,
        "window = \"10s\"",
        &["window", "leaky_bucket"],
    );
    expect_check_error(
        "bad_window",
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
algorithm = "fixed_window"
window = "10 seconds"
limit = 5
"#,
        "window = ",
        &["window"],
    );
}

#[test]
fn check_refuses_override_matches_outside_the_key() {
    expect_check_error(
        "override_part_not_in_key",
        r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[limit_req_zone.override]]
match = "header:X-Tenant=acme"
rate = "600r/m"
"#,
        "match = ",
        &["per_key", "header:X-Tenant=acme", "not in the zone's key"],
    );
    expect_check_error(
        "ip_override_without_ip_key",
        r#"
[[limit_req_zone]]
name = "per_key"
key = "header:X-Api-Key"
rate = "1r/m"

[[limit_req_zone.override]]
match = "10.0.0.0/8"
rate = "unlimited"
"#,
        "match = ",
        &["per_key", "10.0.0.0/8"],
    );
    expect_check_error(
        "override_bad_rate",
        r#"
[[limit_req_zone]]
name = "per_ip"
key = "ip"
rate = "1r/m"

[[limit_req_zone.override]]
match = "10.0.0.0/8"
rate = "lots"
"#,
        "rate = \"lots\"",
        &["per_ip", "rate"],
    );
}

/// `weir check -c FILE` must exit 0.
fn expect_check_ok(case: &str, body: &str) {
    let text = format!("{CHECK_HEAD}{body}");
    let out = check_config(&format!("{case}.toml"), &text, CHECK_TIMEOUT);
    assert_eq!(out.code, Some(0), "case {case}: expected ok\n{text}\n{}", out.describe());
}

#[test]
fn check_accepts_windows_up_to_the_documented_365d() {
    // The error message and docs/configuration.md give the range as "1ms" to "365d"
    // (envoyproxy/ratelimit's year), and limit 0 (a block) on fixed and sliding windows.
    for window in ["1ms", "500ms", "10s", "15m", "1440m", "1h", "24h", "7d", "30d", "365d", "8760h"] {
        for (algorithm, limit) in [("fixed_window", 5), ("sliding_window", 0)] {
            expect_check_ok(
                &format!("window_{window}_{algorithm}"),
                &format!(
                    r#"
[[limit_req_zone]]
name = "z"
key = "ip"
algorithm = "{algorithm}"
window = "{window}"
limit = {limit}
"#
                ),
            );
        }
    }
    expect_check_error(
        "window_over_365d",
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
algorithm = "fixed_window"
window = "366d"
limit = 5
"#,
        "window = ",
        &["window"],
    );
    expect_check_error(
        "sliding_log_of_nothing",
        r#"
[[limit_req_zone]]
name = "z"
key = "ip"
algorithm = "sliding_log"
window = "1m"
limit = 0
"#,
        "limit = ",
        &["limit"],
    );
}

#[test]
fn check_refuses_an_override_burst_on_a_window_zone() {
    // Like `burst` on a reference to a window zone (refused above), an override's burst would
    // silently mean nothing: a window algorithm's capacity is its count per window.
    expect_check_error(
        "override_burst_on_fixed_window",
        r#"
[[limit_req_zone]]
name = "fw"
key = "ip"
algorithm = "fixed_window"
rate = "100r/m"

[[limit_req_zone.override]]
match = "10.0.0.0/8"
rate = "1000r/m"
burst = 50
"#,
        "burst = 50",
        &["fw", "burst"],
    );
}
