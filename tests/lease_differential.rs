//! `lua/limit_req/lease.lua` (in the joined `lua/limit_req.lua`) against the Rust model's
//! `lease::grant` and `lease::give_back`, on a real redis-server: random traces of grants and
//! give-backs by several holders of one key, for every algorithm that leases, with the clock
//! passed in. Every grant (tokens, retry, window) and every stored state (exact f64) must agree,
//! and so must the holders Redis counts as live.
//!
//! Redis expires keys on its own wall clock while the trace's clock jumps, so each call runs in
//! one MULTI/EXEC with a PERSIST of both keys: the model never forgets a state either, and a state past its expiry
//! evaluates as none on both sides. Reproduce a failure with `WEIR_LEASE_DIFF_SEED=<seed>`.

use crate::support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;
use support::redis_server::RedisServer;
use weir::limit::lease::{give_back, grant, Grant, Ledger};
use weir::limit::{evaluate, Algorithm, DelayPolicy, LimitReq, Rate, State};

const SCRIPT: &str = include_str!("../lua/limit_req.lua");
const T0: u64 = 1_700_000_000_000_000;
const SEC: u64 = 1_000_000;
const TRACES: usize = 150;
const STEPS: usize = 60;

fn random_limit(rng: &mut StdRng) -> LimitReq {
    match rng.gen_range(0..3) {
        0 => LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate { count: rng.gen_range(1..200), period_us: [SEC, 60 * SEC][rng.gen_range(0..2)] },
            burst: rng.gen_range(0..60),
            delay: DelayPolicy::NoDelay,
        },
        1 => LimitReq {
            algorithm: Algorithm::TokenBucket,
            rate: Rate { count: rng.gen_range(1..200), period_us: SEC },
            burst: rng.gen_range(0..60),
            delay: DelayPolicy::NoDelay,
        },
        _ => LimitReq {
            algorithm: Algorithm::FixedWindow,
            rate: Rate { count: rng.gen_range(0..80), period_us: [SEC, 10 * SEC][rng.gen_range(0..2)] },
            burst: 0,
            delay: DelayPolicy::NoDelay,
        },
    }
}

fn zone_args(limit: &LimitReq, cost: u64) -> [i64; 6] {
    [
        i64::from(limit.algorithm.id()),
        limit.rate.count as i64,
        limit.rate.period_us as i64,
        limit.burst as i64,
        -1,
        cost as i64,
    ]
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("not an integer: {other:?}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn lua_grant(
    conn: &mut redis::Connection,
    keys: &(String, String),
    limit: &LimitReq,
    now: u64,
    holder: u64,
    min: u64,
    want: u64,
    lifetime: u64,
) -> Grant {
    let mut eval = redis::cmd("EVAL");
    eval.arg(SCRIPT).arg(2).arg(&keys.0).arg(&keys.1).arg("lease").arg("grant").arg(format!("i{holder}")).arg(now);
    eval.arg(&zone_args(limit, min)[..]).arg(want).arg(lifetime);
    let reply: Vec<Value> = persisting(conn, keys, eval);
    assert_eq!(int(&reply[4]) as u64, now, "the script decided at the clock it was given");
    grant_of(&reply)
}

fn lua_give(
    conn: &mut redis::Connection,
    keys: &(String, String),
    limit: &LimitReq,
    now: u64,
    holder: u64,
    unused: u64,
    window: Option<u64>,
) {
    let window = window.map_or(String::new(), |w| w.to_string());
    let mut eval = redis::cmd("EVAL");
    eval.arg(SCRIPT).arg(2).arg(&keys.0).arg(&keys.1).arg("lease").arg("give").arg(format!("i{holder}")).arg(now);
    eval.arg(&zone_args(limit, unused)[..]).arg(window);
    let _: Value = persisting(conn, keys, eval);
}

/// The script's call and the PERSIST of both keys in one MULTI/EXEC, so that no key expires on
/// Redis's wall clock between the two.
fn persisting<T: redis::FromRedisValue>(conn: &mut redis::Connection, keys: &(String, String), eval: redis::Cmd) -> T {
    let (reply, _, _): (T, Value, Value) = redis::pipe()
        .atomic()
        .add_command(eval)
        .cmd("PERSIST")
        .arg(&keys.0)
        .cmd("PERSIST")
        .arg(&keys.1)
        .query(conn)
        .expect("the lease script");
    reply
}

fn stored(conn: &mut redis::Connection, key: &str) -> Option<State> {
    let raw: Option<String> = redis::cmd("GET").arg(key).query(conn).expect("GET");
    raw.map(|text| State::from_stored_text(&text).unwrap_or_else(|| panic!("{text:?} is no state")))
}

fn live_holders(conn: &mut redis::Connection, key: &str, now: u64) -> Vec<u64> {
    let all: Vec<(String, u64)> = redis::cmd("HGETALL").arg(key).query(conn).expect("HGETALL");
    let mut live: Vec<u64> =
        all.into_iter().filter(|(_, ends)| *ends > now).map(|(id, _)| id[1..].parse().expect("id")).collect();
    live.sort();
    live
}

#[test]
fn lease_script_matches_the_model() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let seed = std::env::var("WEIR_LEASE_DIFF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x1EA5E);
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut grants, mut refusals, mut shrunk, mut credits) = (0, 0, 0, 0);
    for trace in 0..TRACES {
        let limit = random_limit(&mut rng);
        let keys = (format!("weir:z{trace}:{{k}}"), format!("weir:z{trace}:{{k}}:lease"));
        let mut ledger = Ledger::default();
        let mut now = T0 + rng.gen_range(0..10 * SEC);
        let lifetime = [SEC / 10, SEC, 3 * SEC][rng.gen_range(0..3)];
        // The window each holder's latest grant belongs to (for its give-back).
        let mut windows: [Option<u64>; 6] = [None; 6];
        for step in 0..STEPS {
            let ctx = format!("seed {seed} trace {trace} step {step} {limit:?}");
            now += [0, 1_000, 50_000, 300_000, 2 * SEC][rng.gen_range(0..5)];
            let holder = rng.gen_range(1..6u64);
            if rng.gen_bool(0.7) {
                let min = rng.gen_range(0..4);
                let want = rng.gen_range(min..60);
                let (model, next) = grant(&limit, &ledger, now, holder, min, want, lifetime);
                let lua = lua_grant(&mut conn, &keys, &limit, now, holder, min, want, lifetime);
                assert_eq!(lua, model, "{ctx}: grant of {min}..{want} to {holder}");
                ledger = next;
                windows[holder as usize] = model.window_start_us;
                match model.tokens {
                    0 => refusals += 1,
                    t if t < want => {
                        grants += 1;
                        shrunk += 1
                    }
                    _ => grants += 1,
                }
            } else {
                let unused = rng.gen_range(0..30);
                let window = windows[holder as usize];
                ledger = give_back(&limit, &ledger, now, holder, unused, window);
                lua_give(&mut conn, &keys, &limit, now, holder, unused, window);
                credits += 1;
            }
            match stored(&mut conn, &keys.0) {
                // A key may expire on Redis's clock before the PERSIST (a bucket credited back to
                // empty lives 1 ms): then the model's state must be one that equals no state now.
                None => assert_eq!(
                    evaluate(&limit, ledger.state.as_ref(), now, 0).next,
                    evaluate(&limit, None, now, 0).next,
                    "{ctx}: Redis forgot a state the model keeps: {:?}",
                    ledger.state
                ),
                lua => assert_eq!(lua, ledger.state, "{ctx}: the stored state"),
            }
            let mut model_live: Vec<u64> =
                ledger.holders.iter().filter(|h| h.expires_us > now).map(|h| h.instance).collect();
            model_live.sort();
            assert_eq!(live_holders(&mut conn, &keys.1, now), model_live, "{ctx}: live holders");
        }
    }
    // The traces reached every branch: full grants, grants shrunk near the limit, refusals, credits.
    assert!(
        grants > 1000 && shrunk > 200 && refusals > 200 && credits > 1000,
        "{grants} {shrunk} {refusals} {credits}"
    );
}

/// `{tokens, retry_us, window_start_us, window_left_us, now_us}` (-1: none).
fn grant_of(values: &[Value]) -> Grant {
    let opt = |v: &Value| u64::try_from(int(v)).ok();
    Grant {
        tokens: int(&values[0]) as u64,
        retry_after_us: opt(&values[1]),
        window_start_us: opt(&values[2]),
        window_left_us: opt(&values[3]),
    }
}

/// `grants` (several keys' grants in one call, as the leasing layer batches its asks) answers
/// and stores exactly what one `grant` call per key, in order at the same now, would: random
/// subsets of a few keys with their own limits (the same key twice in a call included), on the
/// model. A malformed grant anywhere in a call is refused before any grant is made.
#[test]
fn several_grants_in_one_call_match_one_by_one() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let seed = std::env::var("WEIR_LEASE_DIFF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xBA7C4);
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut calls, mut granted, mut refused) = (0, 0, 0);
    for trace in 0..40 {
        let keys: Vec<(LimitReq, (String, String))> = (0..rng.gen_range(2..6))
            .map(|k| {
                let state = format!("weir:g{trace}:{{k{k}}}");
                (random_limit(&mut rng), (state.clone(), format!("{state}:lease")))
            })
            .collect();
        let mut ledgers = vec![Ledger::default(); keys.len()];
        let mut now = T0 + rng.gen_range(0..10 * SEC);
        let lifetime = [SEC / 10, SEC][rng.gen_range(0..2)];
        for step in 0..40 {
            now += [0, 1_000, 50_000, 300_000][rng.gen_range(0..4)];
            let holder = rng.gen_range(1..4u64);
            let picked: Vec<(usize, u64, u64)> = (0..rng.gen_range(1..7))
                .map(|_| {
                    let min = rng.gen_range(0..4);
                    (rng.gen_range(0..keys.len()), min, rng.gen_range(min..60))
                })
                .collect();
            let mut eval = redis::cmd("EVAL");
            eval.arg(SCRIPT).arg(2 * picked.len());
            for &(k, _, _) in &picked {
                eval.arg(&keys[k].1 .0).arg(&keys[k].1 .1);
            }
            eval.arg("lease").arg("grants").arg(format!("i{holder}")).arg(now).arg(picked.len());
            for &(k, min, want) in &picked {
                eval.arg(&zone_args(&keys[k].0, min)[..]).arg(want).arg(lifetime);
            }
            let mut pipe = redis::pipe();
            pipe.atomic().add_command(eval);
            for (_, (state, holders)) in &keys {
                pipe.cmd("PERSIST").arg(state).ignore().cmd("PERSIST").arg(holders).ignore();
            }
            let (replies,): (Vec<Value>,) = pipe.query(&mut conn).expect("the grants call");
            calls += 1;
            assert_eq!(replies.len(), picked.len(), "one reply per grant");
            for (j, &(k, min, want)) in picked.iter().enumerate() {
                let ctx = format!("seed {seed} trace {trace} step {step} grant {j} of key {k} {:?}", keys[k].0);
                let (model, next) = grant(&keys[k].0, &ledgers[k], now, holder, min, want, lifetime);
                let Value::Array(reply) = &replies[j] else { panic!("{ctx}: {:?} is no grant reply", replies[j]) };
                assert_eq!(grant_of(reply), model, "{ctx}: grant of {min}..{want} to {holder}");
                ledgers[k] = next;
                if model.tokens == 0 {
                    refused += 1;
                } else {
                    granted += 1;
                }
            }
            for (k, (limit, (state, _))) in keys.iter().enumerate() {
                match stored(&mut conn, state) {
                    None => assert_eq!(
                        evaluate(limit, ledgers[k].state.as_ref(), now, 0).next,
                        evaluate(limit, None, now, 0).next,
                        "seed {seed} trace {trace} step {step} key {k}: Redis forgot a state"
                    ),
                    lua => assert_eq!(lua, ledgers[k].state, "seed {seed} trace {trace} step {step} key {k}"),
                }
            }
        }
    }
    assert!(calls == 1600 && granted > 1500 && refused > 300, "{calls} {granted} {refused}");

    // A malformed last grant: the call is refused and the first key is left as it was.
    let (state, holders) = ("weir:bad:{k}".to_string(), "weir:bad:{k}:lease".to_string());
    let limit = random_limit(&mut StdRng::seed_from_u64(1));
    let mut eval = redis::cmd("EVAL");
    eval.arg(SCRIPT).arg(4).arg(&state).arg(&holders).arg(&state).arg(&holders);
    eval.arg("lease").arg("grants").arg("i1").arg(T0).arg(2);
    eval.arg(&zone_args(&limit, 1)[..]).arg(10).arg(SEC);
    eval.arg(&[i64::from(Algorithm::SlidingWindow.id()), 10, SEC as i64, 0, -1, 1][..]).arg(10).arg(SEC);
    let refusal: redis::RedisResult<Value> = eval.query(&mut conn);
    let message = format!("{:?}", refusal.expect_err("a sliding window does not lease"));
    assert!(message.contains("does not lease"), "{message}");
    assert_eq!(stored(&mut conn, &state), None, "no grant of a refused call was made");
}
