//! `weir replay`: what a config would have done to past traffic, decided by the proxy's own code
//! (routes, keys, overrides, cost, the limit model and the memory store) on a simulated clock.
//!
//! `input` reads files (gzip, stdin), `parse` turns lines into requests, `reorder` puts them in
//! the order their limits were decided, `replayer` decides each (on the engine's ticket), `stats` counts, `report` prints
//! (table or JSON) with `text` for limits and keys, `plot` draws offered vs admitted, `suggest`
//! searches limits that meet targets and `snippet` writes them as TOML.

pub mod cli;
pub mod hash;
pub mod input;
pub mod parse;
pub mod plot;
pub mod reorder;
pub mod replayer;
pub mod report;
pub mod snippet;
pub mod stats;
pub mod suggest;
pub mod text;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use parse::{Format, Record};
use reorder::{Pending, Reorder};
use replayer::Replayer;
use stats::Stats;

use crate::config::Runtime;

/// How many bad lines are shown (all are counted).
const BAD_EXAMPLES: usize = 5;
/// How many disagreements with the logged status are shown.
const MISMATCH_EXAMPLES: usize = 5;
/// The most characters of a bad line's message shown: a parse error may quote its line.
const BAD_EXAMPLE_CHARS: usize = 200;
/// `--max-line-length`'s default: far beyond any access-log line, small enough to hold.
pub const DEFAULT_MAX_LINE_LENGTH: usize = 1024 * 1024;
/// `--max-keys`'s default: distinct keys (per zone reference) the report's tables may hold.
pub const DEFAULT_MAX_KEYS: u64 = 2_000_000;

#[derive(Debug, Clone)]
pub struct Options {
    pub format: Format,
    pub files: Vec<String>,
    pub from_us: Option<u64>,
    pub to_us: Option<u64>,
    pub decisions: Option<PathBuf>,
    /// Replay `dry_run` references as if enforced.
    pub enforce: bool,
    /// The longest a line may come after lines that started later (`--reorder-window`).
    pub reorder_cap_us: u64,
    pub suggest: Option<suggest::Targets>,
    pub progress: bool,
    /// Lines longer than this are counted as bad and skipped (`--max-line-length`).
    pub max_line_len: usize,
    /// The replay stops with an error when its key tables reach this many keys (`--max-keys`).
    pub max_keys: u64,
    /// `--instances N`: a fleet of N instances leasing the leased zones (docs/leases.md).
    pub instances: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReplayError(pub String);

/// Where a timestamp that says only the second puts the requests of that second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assumption {
    /// Millisecond or finer timestamps: replayed as logged.
    Exact,
    /// Whole seconds: the n requests of a second at `s + i/n`.
    Spread,
    /// Whole seconds: all at the start of their second (the worst case for bursts).
    Start,
}

impl Assumption {
    pub fn as_str(self) -> &'static str {
        match self {
            Assumption::Exact => "exact",
            Assumption::Spread => "spread",
            Assumption::Start => "start",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Assumption::Exact => "timestamps as logged",
            Assumption::Spread => "the requests of each second spread evenly over it",
            Assumption::Start => "the requests of each second all at its start",
        }
    }
}

/// Replayed statuses against the `$limit_req_status` the log recorded.
#[derive(Debug, Clone, Default)]
pub struct Agreement {
    pub compared: u64,
    pub matched: u64,
    /// `file:line: logged X, replayed Y`.
    pub examples: Vec<String>,
}

pub struct Run<'rt> {
    pub assumption: Assumption,
    replayer: Replayer<'rt>,
    pub stats: Stats,
    last_us: u64,
}

/// Everything a replay found.
pub struct Summary<'rt> {
    pub format: &'static str,
    pub files: Vec<String>,
    pub lines: u64,
    /// Lines that are not requests (blank, other log events).
    pub ignored: u64,
    /// Requests outside `--from`/`--to`.
    pub outside: u64,
    pub bad: u64,
    pub bad_examples: Vec<String>,
    /// Lines that came after the reorder window: decided at the window's edge, not their start.
    pub late: u64,
    pub runs: Vec<Run<'rt>>,
    pub agreement: Option<Agreement>,
    pub suggestions: Option<suggest::Proposals>,
    pub elapsed: Duration,
}

/// The line a sequence number came from.
#[derive(Clone)]
struct Origin {
    file: usize,
    line: u64,
}

/// Writes one `--decisions` line per input line, in input order, though requests are decided
/// in start order.
struct DecisionsOut {
    out: BufWriter<File>,
    path: PathBuf,
    pending: BTreeMap<u64, (Origin, &'static str)>,
    next: u64,
    prefix_files: bool,
}

impl DecisionsOut {
    fn put(&mut self, seq: u64, origin: Origin, word: &'static str, files: &[String]) -> Result<(), ReplayError> {
        self.pending.insert(seq, (origin, word));
        while let Some((origin, word)) = self.pending.remove(&self.next) {
            let r = if self.prefix_files {
                writeln!(self.out, "{}:{}\t{word}", files[origin.file], origin.line)
            } else {
                writeln!(self.out, "{}\t{word}", origin.line)
            };
            r.map_err(|e| ReplayError(format!("{}: cannot write: {e}", self.path.display())))?;
            self.next += 1;
        }
        Ok(())
    }
}

struct Driver<'rt> {
    runs: Vec<Run<'rt>>,
    rt: &'rt Runtime,
    decisions: Option<DecisionsOut>,
    agreement: Option<Agreement>,
    collector: Option<suggest::Collector>,
    late: u64,
    max_keys: u64,
    instances: Option<u64>,
}

impl<'rt> Driver<'rt> {
    fn ensure_runs(&mut self, whole_second: bool) {
        if !self.runs.is_empty() {
            return;
        }
        let assumptions: &[Assumption] =
            if whole_second { &[Assumption::Spread, Assumption::Start] } else { &[Assumption::Exact] };
        self.runs = assumptions
            .iter()
            .map(|&assumption| Run {
                assumption,
                replayer: Replayer::with_instances(self.rt, self.instances),
                stats: Stats::new(self.rt),
                last_us: 0,
            })
            .collect();
    }

    /// Decides one group of records that started at the same logged time.
    fn decide_group(&mut self, group: Vec<Pending>, files: &[String]) -> Result<(), ReplayError> {
        let n = group.len() as u64;
        for (i, p) in group.iter().enumerate() {
            let mut primary_word = "-";
            for (r, run) in self.runs.iter_mut().enumerate() {
                let at = match run.assumption {
                    Assumption::Exact | Assumption::Start => p.rec.start_us,
                    Assumption::Spread => p.rec.start_us + (i as u64) * 1_000_000 / n,
                };
                let now = if at < run.last_us {
                    if r == 0 {
                        self.late += 1;
                    }
                    run.last_us
                } else {
                    at
                };
                run.last_us = now;
                let d = run.replayer.decide(&p.rec, now);
                run.stats.record(self.rt, &d, now);
                if run.stats.keys > self.max_keys {
                    return Err(too_many_keys(self.max_keys, &files[p.origin.0], p.origin.1));
                }
                if r == 0 {
                    primary_word = d.word();
                    if let Some(c) = self.collector.as_mut() {
                        c.observe(&d, now);
                    }
                }
            }
            let origin = Origin { file: p.origin.0, line: p.origin.1 };
            if let (Some(agreement), Some(logged)) = (self.agreement.as_mut(), p.rec.logged_status.as_deref()) {
                agreement.compared += 1;
                if logged == primary_word {
                    agreement.matched += 1;
                } else if agreement.examples.len() < MISMATCH_EXAMPLES {
                    agreement.examples.push(format!(
                        "{}:{}: logged {logged}, replayed {primary_word}",
                        files[origin.file], origin.line
                    ));
                }
            }
            if let Some(out) = self.decisions.as_mut() {
                out.put(p.seq, origin, primary_word, files)?;
            }
        }
        Ok(())
    }

    fn resolve(&mut self, seq: u64, origin: Origin, word: &'static str, files: &[String]) -> Result<(), ReplayError> {
        match self.decisions.as_mut() {
            Some(out) => out.put(seq, origin, word, files),
            None => Ok(()),
        }
    }
}

/// Replays `opts.files` through `rt`.
pub fn replay<'rt>(rt: &'rt Runtime, opts: &Options) -> Result<Summary<'rt>, ReplayError> {
    let started = Instant::now();
    let wanted = replayer::wanted_headers(rt);
    let decisions = match &opts.decisions {
        None => None,
        Some(path) => Some(DecisionsOut {
            out: BufWriter::new(
                File::create(path).map_err(|e| ReplayError(format!("{}: cannot create: {e}", path.display())))?,
            ),
            path: path.clone(),
            pending: BTreeMap::new(),
            next: 0,
            prefix_files: opts.files.len() > 1,
        }),
    };
    let mut d = Driver {
        runs: Vec::new(),
        rt,
        decisions,
        agreement: None,
        collector: opts.suggest.is_some().then(|| suggest::Collector::new(rt)),
        late: 0,
        max_keys: opts.max_keys,
        instances: opts.instances,
    };
    let mut summary_counts = (0u64, 0u64, 0u64, 0u64); // lines, ignored, outside, bad
    let mut bad_examples = Vec::new();
    let mut reorder = Reorder::new(opts.reorder_cap_us);
    let mut seq = 0u64;
    let mut buf = Vec::with_capacity(1024);
    let progress = opts.progress && std::io::stderr().is_terminal();
    let mut last_progress = Instant::now();
    let whole_second_format = matches!(opts.format, Format::Combined);

    for (fi, path) in opts.files.iter().enumerate() {
        let mut reader = input::open(path).map_err(|e| ReplayError(format!("{path}: cannot open: {e}")))?;
        let mut parser = opts.format.parser(&wanted);
        let mut line_no = 0u64;
        loop {
            let line = input::next_line(reader.as_mut(), &mut buf, opts.max_line_len)
                .map_err(|e| ReplayError(format!("{path}:{}: cannot read: {e}", line_no + 1)))?;
            if line == input::Line::End {
                break;
            }
            line_no += 1;
            summary_counts.0 += 1;
            let origin = Origin { file: fi, line: line_no };
            let this = seq;
            seq += 1;
            let parsed = match line {
                input::Line::TooLong { bytes } => {
                    Err(format!("{bytes} bytes, longer than --max-line-length ({}): skipped", opts.max_line_len))
                }
                _ => parser.parse(&buf),
            };
            match parsed {
                Ok(Some(rec)) => {
                    if opts.from_us.is_some_and(|f| rec.start_us < f) || opts.to_us.is_some_and(|t| rec.start_us >= t) {
                        summary_counts.2 += 1;
                        d.resolve(this, origin, "-", &opts.files)?;
                        continue;
                    }
                    d.ensure_runs(whole_second_format || rec.whole_second);
                    if d.agreement.is_none() && rec.logged_status.is_some() {
                        d.agreement = Some(Agreement::default());
                    }
                    let rec = Box::new(truncate_to_second(rec, d.runs[0].assumption));
                    reorder.push(Pending { seq: this, origin: (fi, line_no), rec });
                    while let Some(group) = reorder.pop_group(false) {
                        d.decide_group(group, &opts.files)?;
                    }
                }
                Ok(None) => {
                    summary_counts.1 += 1;
                    d.resolve(this, origin, "-", &opts.files)?;
                }
                Err(why) => {
                    summary_counts.3 += 1;
                    if bad_examples.len() < BAD_EXAMPLES {
                        bad_examples.push(format!("{path}:{line_no}: {}", truncated(&why, BAD_EXAMPLE_CHARS)));
                    }
                    d.resolve(this, origin, "BAD", &opts.files)?;
                }
            }
            if progress && line_no.is_multiple_of(65_536) && last_progress.elapsed() > Duration::from_millis(250) {
                last_progress = Instant::now();
                let rate = summary_counts.0 as f64 / started.elapsed().as_secs_f64().max(1e-9);
                eprint!("\rweir replay: {path}: {line_no} lines ({:.0} lines/s, {} buffered)   ", rate, reorder.len());
            }
        }
    }
    while let Some(group) = reorder.pop_group(true) {
        d.decide_group(group, &opts.files)?;
    }
    if progress {
        eprint!("\r{:78}\r", "");
    }
    if let Some(out) = d.decisions.as_mut() {
        out.out.flush().map_err(|e| ReplayError(format!("{}: cannot write: {e}", out.path.display())))?;
    }
    let suggestions = match (d.collector.take(), opts.suggest.as_ref()) {
        (Some(c), Some(targets)) => Some(suggest::search(rt, &c, targets)),
        _ => None,
    };
    let (lines, ignored, outside, bad) = summary_counts;
    Ok(Summary {
        format: opts.format.name(),
        files: opts.files.clone(),
        lines,
        ignored,
        outside,
        bad,
        bad_examples,
        late: d.late,
        runs: d.runs,
        agreement: d.agreement,
        suggestions,
        elapsed: started.elapsed(),
    })
}

/// At most `max` characters of `text`, marked when cut.
fn truncated(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}… ({} bytes in all)", &text[..cut], text.len()),
    }
}

fn too_many_keys(max: u64, file: &str, line: u64) -> ReplayError {
    ReplayError(format!(
        "{file}:{line}: more than {max} distinct keys (--max-keys): the replay keeps about 200 bytes per key \
         (twice for a whole-second log); raise --max-keys if the memory is there, or replay a shorter span \
         (--from/--to) or fewer files"
    ))
}

/// In a whole-second replay every record of a second must be released together: a JSON log in
/// RFC 3339 seconds is already aligned, this makes sure of it.
fn truncate_to_second(mut rec: Record, assumption: Assumption) -> Record {
    if assumption != Assumption::Exact {
        rec.start_us -= rec.start_us % 1_000_000;
    }
    rec
}

/// Loads the config for a replay: `enforce` turns dry-run references into enforced ones.
pub fn load_config(path: &std::path::Path, enforce: bool) -> Result<Runtime, ReplayError> {
    let mut rt = crate::config::load(path).map_err(|e| ReplayError(e.to_string()))?;
    if enforce {
        for route in &mut rt.routes {
            for limit in &mut route.limits {
                limit.dry_run = false;
            }
        }
    }
    Ok(rt)
}
