//! `weir replay` end to end: the real binary on generated logs (plain and gzip, every format),
//! checked through `--decisions` and the `--json` report; a differential check of a seeded msec
//! log against the limit model driven directly; `--suggest` whose proposal, replayed, meets its
//! targets.

use crate::support;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::{Rng, SeedableRng};
use serde_json::Value;
use weir::limit::{decide_all, Algorithm, DelayPolicy, LimitReq, Rate, State, ZoneInput};

const T0: u64 = 1_700_000_000; // 2023-11-14T22:13:20Z
const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

fn config(zones_and_routes: &str) -> String {
    format!(
        "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n\
         [real_ip]\ntrusted = [\"127.0.0.1/32\"]\nheader = \"X-Forwarded-For\"\n\
         [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n{zones_and_routes}"
    )
}

/// nginx `$time_local` of an epoch second (UTC).
fn local_time(secs: u64) -> String {
    let t = chrono::DateTime::from_timestamp(secs as i64, 0).unwrap();
    let month = MONTHS[t.format("%m").to_string().parse::<usize>().unwrap() - 1];
    format!("{}/{month}/{}", t.format("%d"), t.format("%Y:%H:%M:%S +0000"))
}

fn combined(secs: u64, ip: &str, target: &str, ua: &str, xff: &str) -> String {
    format!("{ip} - - [{}] \"GET {target} HTTP/1.1\" 200 12 \"-\" \"{ua}\" \"{xff}\"", local_time(secs))
}

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Self {
        Dir { dir: tempfile::tempdir().unwrap() }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }
    fn write_gz(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(text.as_bytes()).unwrap();
        std::fs::write(&p, enc.finish().unwrap()).unwrap();
        p
    }
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn weir(args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_weir")).args(args).output().unwrap();
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs a replay with `--json --decisions`, returning the report and the decision words.
fn replay(conf: &Path, extra: &[&str], files: &[&Path], decisions: &Path) -> (Value, Vec<String>) {
    let mut args = vec!["replay", "-c", conf.to_str().unwrap(), "--json", "--quiet", "--decisions"];
    args.push(decisions.to_str().unwrap());
    args.extend_from_slice(extra);
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let out = weir(&args);
    assert!(out.ok, "weir {args:?} failed: {}", out.stderr);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    let text = std::fs::read_to_string(decisions).unwrap();
    let words = text.lines().map(|l| l.split('\t').nth(1).unwrap().to_string()).collect();
    for (i, line) in text.lines().enumerate() {
        if files.len() == 1 {
            assert_eq!(line.split('\t').next().unwrap(), (i + 1).to_string(), "line numbers in order");
        }
    }
    (report, words)
}

fn zone<'v>(run: &'v Value, route: &str, zone: &str) -> &'v Value {
    let r = run["routes"].as_array().unwrap().iter().find(|r| r["route"] == route).unwrap();
    r["zones"].as_array().unwrap().iter().find(|z| z["zone"] == zone).unwrap()
}

const TWO_PER_SECOND: &str = "[[limit_req_zone]]\nname = \"per_ip\"\nkey = \"ip\"\nrate = \"2r/s\"\n\
    [[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"per_ip\" } ]\n";

#[test]
fn combined_logs_replay_under_both_assumptions_plain_and_gzip() {
    let d = Dir::new();
    let conf = d.write("weir.toml", &config(TWO_PER_SECOND));
    // Two requests in one second: spread over it (t, t+0.5) both pass at 2r/s; both at its start,
    // the second is rejected. Then a bad line, then one request a second later (passes).
    // The last line comes through a trusted proxy for another client: its own key, passes.
    let log = [
        combined(T0, "192.0.2.1", "/a", "-", "-"),
        combined(T0, "192.0.2.1", "/b?x=1", "-", "-"),
        "this is not a log line".to_string(),
        combined(T0 + 1, "192.0.2.1", "/c", "-", "-"),
        combined(T0 + 1, "127.0.0.1", "/d", "-", "198.51.100.4"),
    ]
    .join("\n");
    let plain = d.write("access.log", &log);
    let gz = d.write_gz("access.log.gz", &log);
    let mut got = Vec::new();
    for file in [&plain, &gz] {
        let (report, words) = replay(&conf, &[], &[file], &d.path("decisions.tsv"));
        assert_eq!(words, ["PASSED", "PASSED", "BAD", "PASSED", "PASSED"]);
        assert_eq!(report["bad"], 1);
        let example = report["bad_examples"][0].as_str().unwrap();
        assert!(example.starts_with(&format!("{}:3: ", file.display())), "{example}");
        let runs = report["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!((runs[0]["assumption"].as_str(), runs[1]["assumption"].as_str()), (Some("spread"), Some("start")));
        let (spread, start) = (zone(&runs[0], "all", "per_ip"), zone(&runs[1], "all", "per_ip"));
        assert_eq!((spread["requests"].as_u64(), spread["rejected"].as_u64()), (Some(4), Some(0)));
        assert_eq!((start["requests"].as_u64(), start["rejected"].as_u64()), (Some(4), Some(1)));
        assert_eq!(start["keys"], 2);
        assert_eq!(start["top_keys"][0]["key"], "192.0.2.1");
        assert_eq!(start["top_keys"][0]["peak_rps"], 2);
        let series = &runs[1]["series"][0];
        assert_eq!(
            (series["offered"].clone(), series["admitted"].clone()),
            (serde_json::json!([2, 2]), serde_json::json!([1, 2]))
        );
        got.push(words);
    }
    // The table says both assumptions, as a range.
    let out = weir(&["replay", "-c", conf.to_str().unwrap(), "--quiet", plain.to_str().unwrap()]);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("0–1"), "{}", out.stdout);
    assert!(out.stdout.contains(&format!("bad line {}:3:", plain.display())), "{}", out.stdout);
}

#[test]
fn msec_logs_replay_in_start_order() {
    let d = Dir::new();
    let conf = d.write("weir.toml", &config(&TWO_PER_SECOND.replace("2r/s", "1r/s")));
    // Logged in end order; the second line started first (101.0 − 0.5 = 100.5), so it passes and
    // the first (started 100.9, 0.4 s later) is rejected at 1r/s, burst 0.
    let tail = |ip: &str| format!("{ip} - - [{}] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"", local_time(T0 + 100));
    let log = format!(
        "{}.900 0.000 {} -\n{}.000 0.500 {} PASSED\n{}.000 0.000 {}\n",
        T0 + 100,
        tail("192.0.2.1"),
        T0 + 101,
        tail("192.0.2.1"),
        T0 + 102,
        tail("192.0.2.1")
    );
    let file = d.write("access.log", &log);
    let (report, words) = replay(&conf, &["--format", "msec"], &[&file], &d.path("dec.tsv"));
    assert_eq!(words, ["REJECTED", "PASSED", "PASSED"]);
    let gz = d.write_gz("access.log.gz", &log);
    assert_eq!(replay(&conf, &["--format", "msec"], &[&gz], &d.path("dec-gz.tsv")).1, words);
    assert_eq!(report["runs"].as_array().unwrap().len(), 1);
    assert_eq!(report["runs"][0]["assumption"], "exact");
    // Two lines carry a logged status (`-` and PASSED): the first disagrees, the second agrees.
    assert_eq!((report["agreement"]["compared"].as_u64(), report["agreement"]["matched"].as_u64()), (Some(2), Some(1)));
    // --from drops the line that started before it.
    let from = (T0 + 100).to_string() + ".6";
    let (_, words) = replay(&conf, &["--format", "msec", "--from", &from], &[&file], &d.path("dec2.tsv"));
    assert_eq!(words, ["PASSED", "-", "PASSED"]);
}

#[test]
fn json_and_weir_logs_with_keys_from_headers() {
    let d = Dir::new();
    let conf = d.write(
        "weir.toml",
        &config(
            "[[limit_req_zone]]\nname = \"per_key\"\nkey = \"header:X-Api-Key\"\nrate = \"1r/s\"\n\
             [[route]]\nname = \"api\"\npath_prefix = \"/api/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"per_key\", burst = 1, delay = 0 } ]\n\
             [[route]]\nname = \"other\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
        ),
    );
    // Same key twice at one instant with burst 1: the second waits 1 s. Other keys are apart.
    let lines = [
        r#"{"time":"2023-11-14T22:13:20.000Z","addr":"192.0.2.1","req":"GET /api/a HTTP/1.1","key":"k1"}"#,
        r#"{"time":"2023-11-14T22:13:20.000Z","addr":"192.0.2.1","req":"GET /api/a HTTP/1.1","key":"k1"}"#,
        r#"{"time":"2023-11-14T22:13:20.000Z","addr":"192.0.2.1","req":"GET /api/a HTTP/1.1","key":"k1"}"#,
        r#"{"time":"2023-11-14T22:13:20.000Z","addr":"192.0.2.1","req":"GET /api/a HTTP/1.1"}"#,
        r#"{"time":"2023-11-14T22:13:20.500Z","addr":"192.0.2.1","req":"GET /home HTTP/1.1","key":"k1"}"#,
        r#"{"time":"oops","req":"GET / HTTP/1.1"}"#,
    ]
    .join("\n");
    let file = d.write_gz("access.json.gz", &lines);
    let (report, words) = replay(
        &conf,
        &["--format", "json", "--field", "ts=time,ip=addr,request=req", "--field", "header.X-Api-Key=key"],
        &[&file],
        &d.path("dec.tsv"),
    );
    assert_eq!(words, ["PASSED", "DELAYED", "REJECTED", "-", "-", "BAD"]);
    let plain = d.write("access.json", &lines);
    let json_args = ["--format", "json", "--field", "ts=time,ip=addr,request=req,header.X-Api-Key=key"];
    assert_eq!(replay(&conf, &json_args, &[&plain], &d.path("dec-plain.tsv")).1, words);
    let z = zone(&report["runs"][0], "api", "per_key");
    assert_eq!(z["delay_ms"]["max"], 1000.0);
    assert_eq!(z["keys_rejected"], 1);

    // Weir's own log: the route and resolved client are taken from it, the start is time − duration.
    let conf_ip = d.write(
        "ip.toml",
        &config(&TWO_PER_SECOND.replace("2r/s", "1r/s").replace("path_prefix = \"/\"", "path_prefix = \"/x/\"")),
    );
    let ev = |ts: &str, dur: f64, client: &str| {
        format!(
            r#"{{"timestamp":"{ts}","level":"INFO","target":"weir::access","route":"all","client":"{client}","method":"GET","path":"/somewhere","status":200,"limit_req":"PASSED","duration_ms":{dur}}}"#
        )
    };
    let log = [
        ev("2023-11-14T22:13:20.900000Z", 0.0, "192.0.2.1"),
        r#"{"timestamp":"2023-11-14T22:13:20.950000Z","level":"INFO","target":"weir::reload","message":"reloaded"}"#
            .to_string(),
        ev("2023-11-14T22:13:21.000000Z", 500.0, "192.0.2.1"),
    ]
    .join("\n");
    let file = d.write("weir.log", &log);
    let (report, words) = replay(&conf_ip, &["--format", "weir"], &[&file], &d.path("dec3.tsv"));
    assert_eq!(words, ["REJECTED", "-", "PASSED"]);
    let gz = d.write_gz("weir.log.gz", &log);
    assert_eq!(replay(&conf_ip, &["--format", "weir"], &[&gz], &d.path("dec3-gz.tsv")).1, words);
    assert_eq!(report["ignored"], 1);
}

#[test]
fn bad_formats_and_files_are_clear_errors() {
    let d = Dir::new();
    let conf = d.write("weir.toml", &config(TWO_PER_SECOND));
    let out = weir(&["replay", "-c", conf.to_str().unwrap(), "--format", "apache", "x.log"]);
    assert!(!out.ok);
    assert!(out.stderr.contains("unknown --format \"apache\""), "{}", out.stderr);
    let missing = d.path("missing.log");
    let out = weir(&["replay", "-c", conf.to_str().unwrap(), missing.to_str().unwrap()]);
    assert!(!out.ok);
    assert!(out.stderr.contains(&format!("{}: cannot open", missing.display())), "{}", out.stderr);
    let out = weir(&["replay", "-c", conf.to_str().unwrap(), "--format", "json", "x.log"]);
    assert!(!out.ok && out.stderr.contains("ts=FIELD"), "{}", out.stderr);
}

/// The limit model driven directly: per (zone, key) state with the memory store's expiry, all
/// zones of a request decided together.
fn model_decisions(limits: &[LimitReq], requests: &[(u64, Vec<String>)]) -> Vec<&'static str> {
    let mut states: HashMap<(usize, String), (State, u64)> = HashMap::new();
    requests
        .iter()
        .map(|(now, keys)| {
            let inputs: Vec<ZoneInput<'_>> = limits
                .iter()
                .enumerate()
                .map(|(z, l)| ZoneInput {
                    limit: l,
                    state: states.get(&(z, keys[z].clone())).filter(|(_, exp)| *exp > *now).map(|(s, _)| s.clone()),
                    cost: 1,
                })
                .collect();
            let v = decide_all(&inputs, *now);
            if !v.admitted {
                return "REJECTED";
            }
            for (z, out) in v.zones.iter().enumerate() {
                states.insert((z, keys[z].clone()), (out.next.clone(), out.expires_us));
            }
            if v.delay_us > 0 {
                "DELAYED"
            } else {
                "PASSED"
            }
        })
        .collect()
}

#[test]
fn msec_replay_matches_the_model_driven_directly() {
    let d = Dir::new();
    let conf = d.write(
        "weir.toml",
        &config(
            "[[limit_req_zone]]\nname = \"per_ip\"\nkey = \"ip\"\nrate = \"5r/s\"\n\
             [[limit_req_zone]]\nname = \"per_agent\"\nkey = \"header:User-Agent\"\nrate = \"720r/m\"\n\
             [[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n\
             limit_req = [ { zone = \"per_ip\", burst = 4, delay = 2 }, { zone = \"per_agent\", burst = 3, nodelay = true } ]\n",
        ),
    );
    let limits = [
        LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("5r/s").unwrap(),
            burst: 4,
            delay: DelayPolicy::After(2),
        },
        LimitReq {
            algorithm: Algorithm::LeakyBucket,
            rate: Rate::parse("720r/m").unwrap(),
            burst: 3,
            delay: DelayPolicy::NoDelay,
        },
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    // 3000 requests over ~60 s from 6 addresses and 4 agents; logged in end order.
    let mut reqs: Vec<(u64, u64, String, String)> = (0..3000)
        .map(|_| {
            let start_ms = T0 * 1000 + rng.gen_range(0..60_000);
            let took_ms = if rng.gen_bool(0.2) { rng.gen_range(0..3000) } else { rng.gen_range(0..20) };
            (start_ms, took_ms, format!("192.0.2.{}", rng.gen_range(1..7)), format!("agent{}", rng.gen_range(0..4)))
        })
        .collect();
    reqs.sort_by_key(|r| r.0 + r.1);
    let log: String = reqs
        .iter()
        .map(|(start, took, ip, ua)| {
            let end = start + took;
            format!(
                "{}.{:03} {}.{:03} {}\n",
                end / 1000,
                end % 1000,
                took / 1000,
                took % 1000,
                combined(end / 1000, ip, "/p", ua, "-")
            )
        })
        .collect();
    let file = d.write("access.log", &log);
    let (_, words) = replay(&conf, &["--format", "msec"], &[&file], &d.path("dec.tsv"));

    // The model in start order (ties in log order), mapped back to log order.
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by_key(|&i| (reqs[i].0, i));
    let inputs: Vec<(u64, Vec<String>)> =
        order.iter().map(|&i| (reqs[i].0 * 1000, vec![reqs[i].2.clone(), reqs[i].3.clone()])).collect();
    let decided = model_decisions(&limits, &inputs);
    let mut want = vec![""; reqs.len()];
    for (k, &i) in order.iter().enumerate() {
        want[i] = decided[k];
    }
    assert_eq!(words, want);
    for word in ["PASSED", "DELAYED", "REJECTED"] {
        let n = want.iter().filter(|w| **w == word).count();
        assert!(n > 50, "the schedule exercises {word}: {n}");
    }
}

#[test]
fn suggested_limits_replayed_meet_their_targets() {
    let d = Dir::new();
    let template = "[[limit_req_zone]]\nname = \"per_ip\"\nkey = \"ip\"\nrate = \"RATE\"\n\
        [[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"per_ip\", burst = BURST, nodelay = true } ]\n";
    let conf = d.write("weir.toml", &config(&template.replace("RATE", "1r/s").replace("BURST", "0")));
    // 20 clients at steady rates of 1..=5 r/s (phase-shifted), for 60 s: known per-key rates.
    let mut reqs: Vec<(u64, String)> = Vec::new();
    for c in 0..20u64 {
        let rate = c % 5 + 1;
        let interval_us = 1_000_000 / rate;
        let phase = c * 7_919 % interval_us;
        let mut t = T0 * 1_000_000 + phase;
        while t < (T0 + 60) * 1_000_000 {
            reqs.push((t, format!("198.51.100.{}", c + 1)));
            t += interval_us;
        }
    }
    reqs.sort();
    let log: String = reqs
        .iter()
        .map(|(t, ip)| format!(r#"{{"ts":"{}.{:06}","ip":"{ip}","path":"/x"}}"#, t / 1_000_000, t % 1_000_000) + "\n")
        .collect();
    let file = d.write("access.json", &log);
    let json_args = ["--format", "json", "--field", "ts=ts,ip=ip,path=path"];
    let mut args = json_args.to_vec();
    args.extend(["--suggest", "--max-rejected", "0.1%", "--max-keys-hit", "0%"]);
    let (report, _) = replay(&conf, &args, &[&file], &d.path("dec.tsv"));
    let s = &report["suggest"]["suggestions"][0];
    assert!(s["current"]["result"]["rejected"].as_u64().unwrap() > 1000, "1r/s rejects the faster clients");
    let proposed = &s["proposed"];
    // The fastest key sends exactly 5r/s: 5r/s with no burst admits everything; anything slower
    // needs a burst worth more than that over ten seconds.
    assert_eq!((proposed["rate"].as_str(), proposed["burst"].as_u64()), (Some("5r/s"), Some(0)), "{s}");
    assert!(report["suggest"]["toml"].as_str().unwrap().contains("rate = \"5r/s\""));
    // The replay with the proposal in place, done by --suggest itself.
    assert_eq!(report["suggest"]["verified"][0]["rejected"], 0, "{}", report["suggest"]);

    // Replayed with the proposed limit, the targets hold.
    let conf2 = d.write(
        "suggested.toml",
        &config(
            &template
                .replace("RATE", proposed["rate"].as_str().unwrap())
                .replace("BURST", &proposed["burst"].to_string()),
        ),
    );
    let (report, _) = replay(&conf2, &json_args, &[&file], &d.path("dec2.tsv"));
    let z = zone(&report["runs"][0], "all", "per_ip");
    assert!(z["rejected_share"].as_f64().unwrap() <= 0.001, "{z}");
    assert_eq!(z["keys_rejected"], 0);
    assert_eq!(z["requests"].as_u64(), Some(reqs.len() as u64));
}

#[test]
fn svg_plot_and_stdin() {
    let d = Dir::new();
    let conf = d.write("weir.toml", &config(TWO_PER_SECOND));
    let log: String = (0..10).map(|i| combined(T0 + i / 3, "192.0.2.1", "/", "-", "-") + "\n").collect();
    let svg = d.path("plot.svg");
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["replay", "-c", conf.to_str().unwrap(), "--quiet", "--svg", svg.to_str().unwrap(), "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(log.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("10 request(s)"));
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 2, "offered and admitted for the one zone");
    assert!(svg.contains("zone per_ip"));
}

#[test]
fn weir_json_log_of_a_live_run_replays_to_the_same_decisions() {
    use std::time::Duration;
    use support::http;
    use support::upstream::Upstream;
    use support::weir::Weir;

    // Weir's log names the client (resolved through the trusted proxy) but no headers: the zones
    // key on the address. Two zones (one delays).
    let up = Upstream::start();
    let w = Weir::start(&support::config::with_app(
        "",
        "[store]\nkind = \"memory\"\n[log]\nformat = \"json\"\n\
         [real_ip]\ntrusted = [\"127.0.0.1/32\"]\nheader = \"X-Forwarded-For\"\n",
        up.addr(),
        "[[limit_req_zone]]\nname = \"fast\"\nkey = \"ip\"\nrate = \"5r/s\"\n\
         [[limit_req_zone]]\nname = \"slow\"\nkey = \"ip\"\nrate = \"2r/s\"\n\
         [[route]]\nname = \"api\"\npath_prefix = \"/api/\"\nupstream = \"app\"\n\
         limit_req = [ { zone = \"fast\", burst = 3, nodelay = true }, { zone = \"slow\", burst = 2, delay = 1 } ]\n\
         [[route]]\nname = \"open\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    ));
    // Four clients in parallel (two of them the same address), 10 requests each, 40 ms apart.
    let n = 40;
    let addr = w.addr;
    let threads: Vec<_> = ["203.0.113.1", "203.0.113.2", "203.0.113.1", "203.0.113.3"]
        .into_iter()
        .enumerate()
        .map(|(t, client)| {
            std::thread::spawn(move || {
                for i in 0..10 {
                    let r = http::get_with(addr, &format!("/api/{t}/{i}"), &[("X-Forwarded-For", client)]);
                    assert!(r.status == 200 || r.status == 429, "{}", r.status);
                    std::thread::sleep(Duration::from_millis(40));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(http::get(w.addr, "/open").status, 200);
    let live: Vec<String> = support::access_log::wait_for_access_lines(&w, n + 1)
        .iter()
        .map(|l| l["limit_req"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(live.len(), n + 1, "one access line per request");
    for word in ["PASSED", "DELAYED", "REJECTED"] {
        assert!(live.iter().any(|l| l == word), "the run exercises {word}: {live:?}");
    }

    let d = Dir::new();
    let log = d.write("weir.log", &w.stderr());
    let (report, words) = replay(&w.config_path, &["--format", "weir"], &[&log], &d.path("dec.tsv"));
    let replayed: Vec<&str> = words.iter().map(String::as_str).filter(|w| *w != "-").collect();
    let agreement = &report["agreement"];
    assert_eq!(agreement["compared"].as_u64(), Some(n as u64 + 1), "{report}");
    assert_eq!(agreement["matched"], agreement["compared"], "{}", agreement["examples"]);
    assert_eq!(replayed.len(), n, "one limited decision per /api/ request: {words:?}");
}

/// nginx on `PATH` or in /usr/sbin (scripts/setup.sh installs nginx-light).
fn nginx_bin() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|p| p.is_file());
    found.expect("nginx is needed for the differential test: run scripts/setup.sh (installs nginx-light)")
}

#[test]
fn replay_of_an_nginx_log_gives_nginx_decisions() {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    use support::http;

    // Rates of 125 and 250 r/s drain 1/8 and 1/4 request per millisecond: nginx's integer
    // milli-requests and Weir's doubles are both exact on nginx's millisecond clock, so there
    // is no rounding boundary at which they could legitimately differ.
    let d = Dir::new();
    std::fs::create_dir_all(d.path("www")).unwrap();
    std::fs::create_dir_all(d.path("logs")).unwrap();
    std::fs::write(d.path("www/ok.txt"), "ok\n").unwrap();
    let port = support::weir::free_port();
    let access = d.path("logs/access.json");
    let nginx_conf = format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {prefix}/logs/nginx.pid;
error_log {prefix}/logs/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    limit_req_zone $http_x_client zone=per_client:1m rate=125r/s;
    limit_req_zone $http_x_tenant zone=per_tenant:1m rate=250r/s;
    log_format replay escape=json '{{"ts":"$msec","rt":"$request_time","conn":"$connection","ip":"$remote_addr","req":"$request","client":"$http_x_client","tenant":"$http_x_tenant","status":"$limit_req_status"}}';
    server {{
        listen 127.0.0.1:{port};
        access_log {access} replay;
        root {prefix}/www;
        location /a/ {{
            limit_req zone=per_client burst=5 nodelay;
            limit_req zone=per_tenant burst=10 delay=4;
            try_files /ok.txt =404;
        }}
        location /b/ {{
            limit_req zone=per_client burst=3;
            try_files /ok.txt =404;
        }}
    }}
}}
"#,
        prefix = d.dir.path().display(),
        access = access.display()
    );
    let conf_path = d.write("nginx.conf", &nginx_conf);
    /// Stops nginx however the test ends.
    struct Nginx(std::process::Child);
    impl Drop for Nginx {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let nginx = Command::new(nginx_bin())
        .args(["-p", d.dir.path().to_str().unwrap(), "-c", conf_path.to_str().unwrap()])
        .arg("-e")
        .arg(d.path("logs/error.log"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(Nginx)
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let started = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(started.elapsed() < Duration::from_secs(10), "nginx did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    // A seeded schedule: one request every 3-5 ms for about 3 s (so that no two requests share
    // nginx's millisecond), from 4 clients in 2 tenants (and some without a client key), in runs
    // of one client that go over its rate; sent by 16 threads in parallel (delays do not hold
    // the schedule up).
    let mut rng = rand::rngs::StdRng::seed_from_u64(1515);
    let mut schedule: Vec<(u64, String, String, String)> = Vec::new();
    let mut at_ms = 0;
    while at_ms < 3000 {
        let client = if rng.gen_bool(0.1) { String::new() } else { format!("c{}", rng.gen_range(0..4)) };
        let tenant = format!("t{}", rng.gen_range(0..2));
        let path = if rng.gen_bool(0.7) { "/a/x" } else { "/b/y" };
        for _ in 0..rng.gen_range(1..=12u64) {
            schedule.push((at_ms, path.to_string(), client.clone(), tenant.clone()));
            at_ms += rng.gen_range(3..=5u64);
        }
    }
    schedule.sort();
    let total = schedule.len();
    let queue = Arc::new(Mutex::new(schedule.into_iter().rev().collect::<Vec<_>>()));
    let t0 = Instant::now();
    let senders: Vec<_> = (0..16)
        .map(|_| {
            let queue = queue.clone();
            std::thread::spawn(move || loop {
                let Some((at, path, client, tenant)) = queue.lock().unwrap().pop() else { break };
                if let Some(wait) = Duration::from_millis(at).checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
                let mut headers = vec![("X-Tenant", tenant.as_str())];
                if !client.is_empty() {
                    headers.push(("X-Client", client.as_str()));
                }
                let r = http::get_with(addr, &path, &headers);
                assert!(r.status == 200 || r.status == 503, "nginx answered {}", r.status);
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    // nginx logs a request after answering it: wait (bounded) for every line, not a fixed while.
    let logged = || std::fs::read_to_string(&access).map_or(0, |l| l.lines().count());
    let all_logged =
        support::poll::wait_until(Duration::from_secs(10), Duration::from_millis(20), || logged() >= total);
    assert!(all_logged.is_some(), "nginx logged {} of {total} requests", logged());
    drop(nginx);

    let log = std::fs::read_to_string(&access).unwrap();
    if let Ok(keep) = std::env::var("WEIR_KEEP_NGINX_LOG") {
        std::fs::write(keep, &log).unwrap();
    }
    assert_eq!(log.lines().count(), total, "one nginx log line per request");
    let lines: Vec<Value> = log.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).collect();
    // With escape=json nginx writes an unset $limit_req_status as "".
    let logged: Vec<String> = lines
        .iter()
        .map(|l| match l["status"].as_str().unwrap() {
            "" => "-".to_string(),
            s => s.to_string(),
        })
        .collect();
    for word in ["PASSED", "DELAYED", "REJECTED"] {
        let n = logged.iter().filter(|w| *w == word).count();
        assert!(n >= 20, "the schedule makes nginx {word} ({n} of {total})");
    }

    let conf = d.write(
        "weir.toml",
        &config(
            "[[limit_req_zone]]\nname = \"per_client\"\nkey = \"header:X-Client\"\nrate = \"125r/s\"\n\
             [[limit_req_zone]]\nname = \"per_tenant\"\nkey = \"header:X-Tenant\"\nrate = \"250r/s\"\n\
             [[route]]\nname = \"a\"\npath_prefix = \"/a/\"\nupstream = \"app\"\n\
             limit_req = [ { zone = \"per_client\", burst = 5, nodelay = true }, { zone = \"per_tenant\", burst = 10, delay = 4 } ]\n\
             [[route]]\nname = \"b\"\npath_prefix = \"/b/\"\nupstream = \"app\"\nlimit_req = [ { zone = \"per_client\", burst = 3 } ]\n",
        ),
    );
    let (report, words) = replay(
        &conf,
        &[
            "--format",
            "json",
            "--field",
            "ts=ts,request_time=rt,order=conn,ip=ip,request=req,header.X-Client=client,header.X-Tenant=tenant,limit_req_status=status",
        ],
        &[&access],
        &d.path("dec.tsv"),
    );
    // nginx decides on a millisecond clock read when the request's headers are in, which may be
    // a millisecond after `$msec - $request_time`; it truncates delays to whole milliseconds (a
    // delay under 1 ms is PASSED); and it does not log the order of requests within a
    // millisecond. Lines where any of this can matter are "at a boundary" (nginx_boundaries). A
    // disagreement must be at a boundary, or follow one for the same key within 200 ms (the
    // replayed state differs from there on).
    let boundary = nginx_boundaries(&lines);
    let mut rooted: Vec<(u64, String)> = Vec::new();
    let mut unexplained = Vec::new();
    let mut differ = 0;
    let mut order: Vec<usize> = (0..lines.len()).collect();
    order.sort_by_key(|&i| (start_ms(&lines[i]), lines[i]["conn"].as_str().unwrap().parse::<u64>().unwrap(), i));
    for &i in &order {
        if words[i] == logged[i] {
            continue;
        }
        differ += 1;
        let l = &lines[i];
        let keys = [format!("c:{}", l["client"]), format!("t:{}", l["tenant"])];
        let at = start_ms(l);
        let follows = rooted.iter().any(|(t, k)| at <= t + 200 && keys.contains(k));
        if boundary[i] || follows {
            rooted.extend(keys.iter().map(|k| (at, k.clone())));
        } else {
            unexplained.push(format!("line {}: nginx {}, replay {}: {l}", i + 1, logged[i], words[i]));
        }
    }
    let at_boundary = boundary.iter().filter(|b| **b).count();
    eprintln!("nginx differential: {total} lines, {differ} differ, {at_boundary} at a millisecond boundary");
    assert!(
        unexplained.is_empty(),
        "{} lines differ away from any boundary:\n{}",
        unexplained.len(),
        unexplained.join("\n")
    );
    assert!(differ * 20 <= total, "{differ} of {total} lines differ: more than 5 %");
    assert_eq!(report["agreement"]["compared"].as_u64(), Some(total as u64));
}

fn start_ms(line: &Value) -> u64 {
    let ms = |field: &str| {
        let text = line[field].as_str().unwrap();
        let (s, f) = text.split_once('.').unwrap();
        s.parse::<u64>().unwrap() * 1000 + f.parse::<u64>().unwrap()
    };
    ms("ts") - ms("rt")
}

/// For each nginx log line of the differential test: whether it is at a millisecond boundary: it
/// shares its millisecond with another request of one of its keys (nginx does not log their
/// order), or by nginx's integer `limit_req` arithmetic (milli-requests, the rate per
/// millisecond, the state following nginx's own logged outcomes) a shift of up to 2 ms would
/// change its decision, or its delay is under 1 ms (nginx truncates it to 0: PASSED).
fn nginx_boundaries(lines: &[Value]) -> Vec<bool> {
    // How far nginx's decision may be from `$msec - $request_time`: its clock is cached per event
    // loop turn, and the headers may be read a turn or two after the request began.
    const SHIFT_MS: i64 = 2;
    // (zone, key field, burst, delay) in milli-requests; rates in milli-requests per ms.
    let rate = |zone: &str| if zone == "per_client" { 125 } else { 250 };
    let refs = |path: &str| -> Vec<(&str, &str, i64, i64)> {
        if path.starts_with("/a/") {
            vec![("per_client", "client", 5000, i64::MAX), ("per_tenant", "tenant", 10_000, 4000)]
        } else {
            vec![("per_client", "client", 3000, 0)]
        }
    };
    let mut state: HashMap<(String, String), (i64, u64)> = HashMap::new();
    let mut order: Vec<usize> = (0..lines.len()).collect();
    order.sort_by_key(|&i| (start_ms(&lines[i]), lines[i]["conn"].as_str().unwrap().parse::<u64>().unwrap(), i));
    let mut out = vec![false; lines.len()];
    // Requests of one key that nginx saw in the same millisecond: their order is not logged.
    let mut same_ms: HashMap<(u64, String), Vec<usize>> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        for field in ["client", "tenant"] {
            let key = l[field].as_str().unwrap();
            if !key.is_empty() {
                same_ms.entry((start_ms(l), format!("{field}:{key}"))).or_default().push(i);
            }
        }
    }
    for group in same_ms.values().filter(|g| g.len() > 1) {
        for &i in group {
            out[i] = true;
        }
    }
    for i in order {
        let l = &lines[i];
        let now = start_ms(l);
        let path = l["req"].as_str().unwrap().split(' ').nth(1).unwrap().to_string();
        let mut charged = Vec::new();
        for (zone, field, burst, delay) in refs(&path) {
            let key = l[field].as_str().unwrap().to_string();
            if key.is_empty() {
                continue;
            }
            let r = rate(zone);
            let excess = match state.get(&(zone.to_string(), key.clone())) {
                None => 0,
                Some(&(e, last)) => (e - r * (now - last) as i64 + 1000).max(0),
            };
            let near = |threshold: i64| threshold != i64::MAX && (excess - threshold).abs() <= SHIFT_MS * r;
            let sub_ms_delay = excess > delay && (excess - delay) * 1000 / (r * 1000) == 0;
            out[i] |= near(burst) || near(delay) || sub_ms_delay;
            charged.push((zone.to_string(), key, excess));
        }
        if matches!(l["status"].as_str(), Some("PASSED" | "DELAYED")) {
            for (zone, key, excess) in charged {
                state.insert((zone, key), (excess, now));
            }
        }
    }
    out
}
