//! The replay's findings as a terminal table (default) or JSON (`--json`), and the `--suggest`
//! TOML snippet. Whole-second logs are replayed under two assumptions; every figure that differs
//! between them is shown as a range `a–b`.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::snippet::toml_snippet;
use super::stats::{percentile, RefStats, Series, Stats};
use super::suggest::{Eval, Proposals as Suggest};
pub use super::text::{key_text, limit_text, rate_text};
use super::Summary;
use crate::config::Runtime;

/// How many keys the report lists per zone.
pub const TOP_KEYS: usize = 5;
/// The time series is summed into at most this many points.
pub const MAX_POINTS: usize = 600;

fn range(values: &[u64]) -> String {
    let (lo, hi) = (values.iter().min().copied().unwrap_or(0), values.iter().max().copied().unwrap_or(0));
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}–{hi}")
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn percent_range(values: &[(u64, u64)]) -> String {
    let shares: Vec<f64> = values.iter().map(|&(p, w)| 100.0 * share(p, w)).collect();
    let lo = shares.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = shares.iter().copied().fold(0.0, f64::max);
    if (hi - lo).abs() < 0.05 {
        format!("{hi:.1}%")
    } else {
        format!("{lo:.1}–{hi:.1}%")
    }
}

fn delays_ms(s: &RefStats) -> (f64, f64, f64) {
    let mut d = s.delays.clone();
    d.sort_unstable();
    let ms = |us: u64| us as f64 / 1000.0;
    (ms(percentile(&d, 50.0)), ms(percentile(&d, 99.0)), ms(d.last().copied().unwrap_or(0)))
}

/// Keys by rejections (then requests), the top `n`.
fn top_keys(s: &RefStats, n: usize) -> Vec<(&Vec<u8>, &super::stats::KeyStats)> {
    let mut keys: Vec<_> = s.keys.iter().filter(|(_, k)| k.rejected > 0).collect();
    keys.sort_by(|a, b| b.1.rejected.cmp(&a.1.rejected).then(b.1.requests.cmp(&a.1.requests)).then(a.0.cmp(b.0)));
    keys.truncate(n);
    keys
}

/// A zone's series as dense arrays of at most [`MAX_POINTS`] steps: (first second, step, offered, admitted).
pub fn dense(series: &Series) -> Option<(u64, u64, Vec<u64>, Vec<u64>)> {
    let (&first, _) = series.first_key_value()?;
    let (&last, _) = series.last_key_value()?;
    let span = last - first + 1;
    let step = span.div_ceil(MAX_POINTS as u64).max(1);
    let n = span.div_ceil(step) as usize;
    let (mut offered, mut admitted) = (vec![0; n], vec![0; n]);
    for (&sec, &(o, a)) in series {
        let i = ((sec - first) / step) as usize;
        offered[i] += o;
        admitted[i] += a;
    }
    Some((first, step, offered, admitted))
}

fn ref_json(rt: &Runtime, route: usize, limit: usize, s: &RefStats) -> Value {
    let zl = &rt.routes[route].limits[limit];
    let (p50, p99, max) = delays_ms(s);
    let top: Vec<Value> = top_keys(s, TOP_KEYS)
        .into_iter()
        .map(|(k, v)| json!({"key": key_text(k), "requests": v.requests, "rejected": v.rejected, "peak_rps": v.peak}))
        .collect();
    json!({
        "zone": rt.zones[zl.zone].name,
        "limit": limit_text(&zl.limit),
        "dry_run": zl.dry_run,
        "requests": s.requests,
        "passed": s.passed,
        "delayed": s.delayed,
        "delay_ms": {"p50": p50, "p99": p99, "max": max},
        "rejected": s.rejected,
        "rejected_share": share(s.rejected, s.requests),
        "not_charged": s.not_charged,
        "keys": s.keys.len(),
        "keys_rejected": s.keys.values().filter(|k| k.rejected > 0).count(),
        "top_keys": top,
    })
}

fn stats_json(rt: &Runtime, stats: &Stats) -> Value {
    let routes: Vec<Value> = stats
        .routes
        .iter()
        .enumerate()
        .filter(|(_, r)| r.requests > 0)
        .map(|(ri, r)| {
            let zones: Vec<Value> = r.limits.iter().enumerate().map(|(li, s)| ref_json(rt, ri, li, s)).collect();
            let conns: Vec<Value> = r
                .conns
                .iter()
                .enumerate()
                .map(|(ci, c)| {
                    let cl = &rt.routes[ri].conn_limits[ci];
                    json!({
                        "zone": rt.conn_zones[cl.zone].name,
                        "max": cl.max,
                        "dry_run": cl.dry_run,
                        "estimated": true,
                        "requests": c.requests,
                        "rejected": c.rejected,
                        "keys": c.keys.len(),
                        "keys_rejected": c.keys.values().filter(|k| k.1).count(),
                        "peak_in_flight": c.keys.values().map(|k| k.0).max().unwrap_or(0),
                    })
                })
                .collect();
            json!({
                "route": rt.routes[ri].name,
                "conn_zones": conns,
                "requests": r.requests,
                "passed": r.passed,
                "delayed": r.delayed,
                "rejected": r.rejected,
                "unlimited": r.unlimited,
                "denied": r.denied,
                "bad_cost": r.bad_cost,
                "unauthorized": r.unauthorized,
                "bad_request": r.bad_request,
                "zones": zones,
            })
        })
        .collect();
    let series: Vec<Value> = stats
        .series
        .iter()
        .enumerate()
        .filter_map(|(zi, s)| {
            let (first, step, offered, admitted) = dense(s)?;
            Some(json!({"zone": rt.zones[zi].name, "start": first, "step_s": step, "offered": offered, "admitted": admitted}))
        })
        .collect();
    json!({
        "requests": stats.requests,
        "no_route": stats.no_route,
        "bad_request": stats.bad_request,
        "from_us": stats.first_us,
        "to_us": stats.last_us,
        "routes": routes,
        "series": series,
    })
}

fn eval_json(e: &Eval) -> Value {
    json!({"requests": e.requests, "rejected": e.rejected, "rejected_share": share(e.rejected, e.requests),
           "keys": e.keys, "keys_hit": e.keys_hit, "keys_hit_share": share(e.keys_hit, e.keys), "delayed": e.delayed})
}

fn suggest_json(rt: &Runtime, s: &Suggest) -> Value {
    let list: Vec<Value> = s
        .suggestions
        .iter()
        .map(|x| {
            json!({
                "route": rt.routes[x.route].name,
                "zone": rt.zones[rt.routes[x.route].limits[x.limit].zone].name,
                "current": {"limit": limit_text(&x.current), "result": eval_json(&x.current_eval)},
                "proposed": x.proposed.as_ref().map(|(l, e)| json!({
                    "limit": limit_text(l), "rate": rate_text(&l.rate), "burst": l.burst, "result": eval_json(e)})),
            })
        })
        .collect();
    let verified: Option<Vec<Value>> = s.verified.as_ref().map(|v| v.iter().map(eval_json).collect());
    json!({
        "verified": verified,
        "max_rejected": s.targets.max_rejected,
        "max_keys_hit": s.targets.max_keys_hit,
        "suggestions": list,
        "toml": toml_snippet(rt, s),
    })
}

pub fn json(rt: &Runtime, sum: &Summary<'_>) -> Value {
    let runs: Vec<Value> = sum
        .runs
        .iter()
        .map(|r| {
            let mut v = stats_json(rt, &r.stats);
            v["assumption"] = json!(r.assumption.as_str());
            v["describe"] = json!(r.assumption.describe());
            v
        })
        .collect();
    json!({
        "format": sum.format,
        "files": sum.files,
        "lines": sum.lines,
        "ignored": sum.ignored,
        "outside": sum.outside,
        "bad": sum.bad,
        "bad_examples": sum.bad_examples,
        "late": sum.late,
        "elapsed_s": sum.elapsed.as_secs_f64(),
        "runs": runs,
        "agreement": sum.agreement.as_ref().map(|a| json!({
            "compared": a.compared, "matched": a.matched, "examples": a.examples})),
        "suggest": sum.suggestions.as_ref().map(|s| suggest_json(rt, s)),
    })
}

/// The readable report.
pub fn table(rt: &Runtime, sum: &Summary<'_>) -> String {
    let mut out = String::new();
    let secs = sum.elapsed.as_secs_f64();
    let _ = writeln!(
        out,
        "weir replay: {} line(s) of {} ({} format) in {:.2} s ({:.0} lines/s); {} bad, {} not requests, {} outside --from/--to",
        sum.lines,
        sum.files.join(", "),
        sum.format,
        secs,
        sum.lines as f64 / secs.max(1e-9),
        sum.bad,
        sum.ignored,
        sum.outside
    );
    for b in &sum.bad_examples {
        let _ = writeln!(out, "  bad line {b}");
    }
    if sum.late > 0 {
        let _ = writeln!(
            out,
            "  {} line(s) came later than the reorder window and were decided at its edge (raise --reorder-window)",
            sum.late
        );
    }
    let Some(first) = sum.runs.first() else {
        let _ = writeln!(out, "no request to replay");
        return out;
    };
    if sum.runs.len() > 1 {
        let names: Vec<&str> = sum.runs.iter().map(|r| r.assumption.describe()).collect();
        let _ = writeln!(out, "timestamps are whole seconds: replayed with {}; a–b shows both", names.join(" | "));
    }
    let _ = writeln!(
        out,
        "{} request(s), {} without a route, {} refused as malformed (400)",
        first.stats.requests, first.stats.no_route, first.stats.bad_request
    );
    let header = [
        "route",
        "zone",
        "limit",
        "requests",
        "passed",
        "delayed",
        "delay p50/p99/max ms",
        "rejected",
        "share",
        "keys",
        "keys rej.",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for (ri, route) in rt.routes.iter().enumerate() {
        let rs: Vec<_> = sum.runs.iter().map(|r| &r.stats.routes[ri]).collect();
        if rs[0].requests == 0 {
            continue;
        }
        let pick = |f: &dyn Fn(&super::stats::RouteStats) -> u64| range(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
        rows.push(vec![
            route.name.clone(),
            if route.limits.is_empty() { "(no limit)".into() } else { "(all)".into() },
            String::new(),
            pick(&|r| r.requests),
            pick(&|r| r.passed),
            pick(&|r| r.delayed),
            String::new(),
            pick(&|r| r.rejected),
            percent_range(&rs.iter().map(|r| (r.rejected, r.requests)).collect::<Vec<_>>()),
            String::new(),
            String::new(),
        ]);
        for (li, zl) in route.limits.iter().enumerate() {
            let ss: Vec<&RefStats> = rs.iter().map(|r| &r.limits[li]).collect();
            let pick = |f: &dyn Fn(&RefStats) -> u64| range(&ss.iter().map(|s| f(s)).collect::<Vec<_>>());
            let delays: Vec<String> = ss
                .iter()
                .map(|s| {
                    let (a, b, c) = delays_ms(s);
                    if s.delayed == 0 {
                        "-".to_string()
                    } else {
                        format!("{a:.0}/{b:.0}/{c:.0}")
                    }
                })
                .collect();
            let mut delays_cell = delays[0].clone();
            if delays.iter().any(|d| *d != delays[0]) {
                delays_cell = delays.join(" | ");
            }
            let dry = if zl.dry_run { " (dry run)" } else { "" };
            rows.push(vec![
                String::new(),
                format!("{}{dry}", rt.zones[zl.zone].name),
                limit_text(&zl.limit),
                pick(&|s| s.requests),
                pick(&|s| s.passed),
                pick(&|s| s.delayed),
                delays_cell,
                pick(&|s| s.rejected),
                percent_range(&ss.iter().map(|s| (s.rejected, s.requests)).collect::<Vec<_>>()),
                pick(&|s| s.keys.len() as u64),
                pick(&|s| s.keys.values().filter(|k| k.rejected > 0).count() as u64),
            ]);
        }
    }
    for (ri, route) in rt.routes.iter().enumerate() {
        for (ci, cl) in route.conn_limits.iter().enumerate() {
            let cs: Vec<_> = sum.runs.iter().map(|r| &r.stats.routes[ri].conns[ci]).collect();
            if cs[0].requests == 0 {
                continue;
            }
            let pick =
                |f: &dyn Fn(&super::stats::ConnStats) -> u64| range(&cs.iter().map(|c| f(c)).collect::<Vec<_>>());
            let dry = if cl.dry_run { " (dry run)" } else { "" };
            rows.push(vec![
                route.name.clone(),
                format!("{}{dry}", rt.conn_zones[cl.zone].name),
                format!("limit_conn max={} (estimated)", cl.max),
                pick(&|c| c.requests),
                pick(&|c| c.requests - c.rejected),
                String::new(),
                format!("peak {} in flight", pick(&|c| u64::from(c.keys.values().map(|k| k.0).max().unwrap_or(0)))),
                pick(&|c| c.rejected),
                percent_range(&cs.iter().map(|c| (c.rejected, c.requests)).collect::<Vec<_>>()),
                pick(&|c| c.keys.len() as u64),
                pick(&|c| c.keys.values().filter(|k| k.1).count() as u64),
            ]);
        }
    }
    out.push_str(&columns(&rows));
    let mut tops = String::new();
    for (ri, route) in rt.routes.iter().enumerate() {
        for (li, zl) in route.limits.iter().enumerate() {
            let s = &first.stats.routes[ri].limits[li];
            for (k, v) in top_keys(s, TOP_KEYS) {
                let _ = writeln!(
                    tops,
                    "  {}/{}  {}  rejected {} of {}, peak {} r/s",
                    route.name,
                    rt.zones[zl.zone].name,
                    key_text(k),
                    v.rejected,
                    v.requests,
                    v.peak
                );
            }
        }
    }
    if !tops.is_empty() {
        let _ = writeln!(out, "top keys by rejections ({}):", first.assumption.describe());
        out.push_str(&tops);
    }
    if let Some(a) = &sum.agreement {
        let _ = writeln!(
            out,
            "logged $limit_req_status: {} of {} replayed the same ({:.2}%)",
            a.matched,
            a.compared,
            100.0 * share(a.matched, a.compared)
        );
        for e in &a.examples {
            let _ = writeln!(out, "  {e}");
        }
    }
    if let Some(s) = &sum.suggestions {
        out.push_str(&suggest_text(rt, s));
    }
    out
}

fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..n).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            // Text columns left, numbers right.
            if c < 3 {
                let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
            } else {
                let _ = write!(line, "{}{cell}  ", " ".repeat(pad));
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

fn eval_text(e: &Eval) -> String {
    format!(
        "{} of {} rejected ({:.2}%), {} of {} keys hit ({:.2}%), {} delayed",
        e.rejected,
        e.requests,
        100.0 * share(e.rejected, e.requests),
        e.keys_hit,
        e.keys,
        100.0 * share(e.keys_hit, e.keys),
        e.delayed
    )
}

fn suggest_text(rt: &Runtime, s: &Suggest) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nsuggest: at most {:.3}% of requests and {:.3}% of keys rejected, per zone on its own traffic",
        100.0 * s.targets.max_rejected,
        100.0 * s.targets.max_keys_hit
    );
    for x in &s.suggestions {
        let route = &rt.routes[x.route];
        let zone = &rt.zones[route.limits[x.limit].zone].name;
        let _ =
            writeln!(out, "  {}/{zone}: now {}: {}", route.name, limit_text(&x.current), eval_text(&x.current_eval));
        match &x.proposed {
            Some((l, e)) => {
                let _ = writeln!(out, "  {}/{zone}: use {}: {}", route.name, limit_text(l), eval_text(e));
            }
            None => {
                let _ = writeln!(out, "  {}/{zone}: no candidate meets the targets (bursts up to 1000)", route.name);
            }
        }
    }
    if let Some(verified) = &s.verified {
        let _ = writeln!(out, "  replayed with all the proposals together (zones of a route all-or-nothing):");
        for (x, e) in s.suggestions.iter().zip(verified) {
            let route = &rt.routes[x.route];
            let zone = &rt.zones[route.limits[x.limit].zone].name;
            let ok = if e.meets(&s.targets) { "meets the targets" } else { "MISSES the targets" };
            let _ = writeln!(out, "  {}/{zone}: {}: {ok}", route.name, eval_text(e));
        }
    }
    let _ = writeln!(out, "\n{}", toml_snippet(rt, s));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(range(&[3, 5]), "3–5");
        assert_eq!(range(&[4, 4]), "4");
    }

    #[test]
    fn series_are_summed_into_few_points() {
        let mut s = Series::new();
        for sec in 0..1200u64 {
            s.insert(1000 + sec, (2, 1));
        }
        let (first, step, offered, admitted) = dense(&s).unwrap();
        assert_eq!((first, step, offered.len()), (1000, 2, 600));
        assert!(offered.iter().all(|&o| o == 4) && admitted.iter().all(|&a| a == 2));
    }
}
