//! `weir replay` on hostile input (issue 22): a gzip that expands to one enormous line is skipped
//! with bounded memory and reported in a few bytes, a bad line's message is truncated, and the
//! per-key tables stop at `--max-keys` with a clear error. The real binary, its peak RSS read
//! from the kernel (`wait4`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const T0: u64 = 1_700_000_000; // 2023-11-14T22:13:20Z

const CONFIG: &str = "[server]\nlisten = [\"127.0.0.1:1\"]\n[store]\nkind = \"memory\"\n\
     [[upstream]]\nname = \"app\"\nservers = [\"127.0.0.1:2\"]\n\
     [[limit_req_zone]]\nname = \"per_ip\"\nkey = \"ip\"\nrate = \"10r/s\"\n\
     [[route]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n\
     limit_req = [ { zone = \"per_ip\", burst = 5 } ]\n";

/// A combined-format line at `T0 + secs` from `ip`.
fn combined(secs: u64, ip: &str) -> String {
    let t = chrono::DateTime::from_timestamp((T0 + secs) as i64, 0).unwrap();
    format!("{ip} - - [{}] \"GET /x HTTP/1.1\" 200 12 \"-\" \"-\"", t.format("%d/%b/%Y:%H:%M:%S +0000"))
}

struct Finished {
    code: i32,
    stdout: String,
    stderr: String,
    /// Peak resident set size, KiB.
    max_rss_kib: i64,
}

/// Runs `weir replay -c CONFIG args…` to its end, with its peak RSS.
fn replay(dir: &Path, args: &[&str]) -> Finished {
    let conf = dir.join("weir.toml");
    std::fs::write(&conf, CONFIG).unwrap();
    let out = dir.join("stdout");
    let err = dir.join("stderr");
    let child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("replay")
        .arg("-c")
        .arg(&conf)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: plain struct out-parameters; `pid` is this test's own child, reaped here once.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    assert!(libc::WIFEXITED(status), "weir replay did not exit normally: {status}");
    Finished {
        code: libc::WEXITSTATUS(status),
        stdout: String::from_utf8_lossy(&std::fs::read(&out).unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&std::fs::read(&err).unwrap()).into_owned(),
        max_rss_kib: usage.ru_maxrss,
    }
}

fn json(f: &Finished) -> Value {
    serde_json::from_str(&f.stdout).unwrap_or_else(|e| panic!("{e}: stdout {:?} stderr {:?}", f.stdout, f.stderr))
}

#[test]
fn a_gzip_line_of_200_mb_is_skipped_with_bounded_memory_and_reported_briefly() {
    let dir = tempfile::tempdir().unwrap();
    let log: PathBuf = dir.path().join("huge.log.gz");
    // Streamed into the encoder a megabyte at a time: 200 MB of one line, compressed to little.
    let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&log).unwrap(), flate2::Compression::fast());
    writeln!(gz, "{}", combined(0, "192.0.2.1")).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..200 {
        gz.write_all(&chunk).unwrap();
    }
    writeln!(gz).unwrap();
    writeln!(gz, "{}", combined(1, "192.0.2.2")).unwrap();
    gz.finish().unwrap();

    let f = replay(dir.path(), &["--json", "--quiet", log.to_str().unwrap()]);
    assert_eq!(f.code, 0, "{}", f.stderr);
    let report = json(&f);
    assert_eq!(report["lines"], 3, "{report}");
    assert_eq!(report["bad"], 1, "{report}");
    let example = report["bad_examples"][0].as_str().unwrap();
    assert!(example.contains(":2: 209715200 bytes, longer than --max-line-length (1048576): skipped"), "{example}");
    assert!(f.stdout.len() + f.stderr.len() < 64 * 1024, "output of {} bytes", f.stdout.len() + f.stderr.len());
    // The line is never held: far below its 200 MB (a debug build idles near 20 MB).
    assert!(f.max_rss_kib < 100 * 1024, "peak RSS {} KiB", f.max_rss_kib);
}

#[test]
fn a_bad_line_is_shown_truncated_never_whole() {
    let dir = tempfile::tempdir().unwrap();
    // A request field of 300 KB without a space: under the line limit, but not a request line,
    // and the parser quotes what it could not read.
    let junk = "X".repeat(300_000);
    let text = format!(
        "{}\n1.2.3.4 - - [14/Nov/2023:22:13:21 +0000] \"{junk}\" 200 12 \"-\" \"-\"\n{}\n",
        combined(0, "192.0.2.1"),
        combined(2, "192.0.2.2")
    );
    let log = dir.path().join("bad.log");
    std::fs::write(&log, text).unwrap();
    let f = replay(dir.path(), &["--quiet", log.to_str().unwrap()]);
    assert_eq!(f.code, 0, "{}", f.stderr);
    let line = f.stdout.lines().find(|l| l.contains("bad line")).unwrap_or_else(|| panic!("{}", f.stdout));
    assert!(line.contains("bad.log:2: "), "{line}");
    assert!(line.len() < 1000, "a bad line's message of {} bytes", line.len());
    assert!(line.ends_with("bytes in all)"), "{line}");
    assert!(f.stdout.len() + f.stderr.len() < 16 * 1024);
}

#[test]
fn distinct_keys_beyond_max_keys_stop_the_replay_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("keys.log");
    let mut text = String::new();
    for i in 0..30_000u64 {
        text.push_str(&combined(i / 100, &format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)));
        text.push('\n');
    }
    std::fs::write(&log, text).unwrap();
    let f = replay(dir.path(), &["--quiet", "--max-keys", "10000", log.to_str().unwrap()]);
    assert_eq!(f.code, 1, "{}\n{}", f.stdout, f.stderr);
    assert!(
        f.stderr.contains(&format!("{}:10001: more than 10000 distinct keys (--max-keys)", log.display())),
        "{}",
        f.stderr
    );
    assert!(f.stderr.contains("raise --max-keys"), "{}", f.stderr);
    // Room for every key: the replay completes.
    let f = replay(dir.path(), &["--quiet", "--json", "--max-keys", "30000", log.to_str().unwrap()]);
    assert_eq!(f.code, 0, "{}", f.stderr);
    assert_eq!(json(&f)["lines"], 30_000);
}
