//! `weir replay` arguments and output: the report on stdout (table or `--json`), errors and
//! progress on stderr, `--decisions` and `--svg` to files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::parse::{time, Format};
use super::{load_config, plot, replay, report, suggest, Options, ReplayError};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// combined (nginx, whole seconds), msec (`$msec $request_time` + combined), weir (Weir's JSON log) or json (with --field).
    #[arg(long, default_value = "combined")]
    format: String,
    /// For --format json: NAME=FIELD[,NAME=FIELD...] with NAME one of ts, ip, method, path, request, host,
    /// request_time, route, limit_req_status, order (same-millisecond order, e.g. nginx $connection),
    /// header.NAME; FIELD a top-level name or a JSON pointer.
    #[arg(long = "field")]
    fields: Vec<String>,
    /// Replay only requests that started at or after this time (RFC 3339, epoch seconds or nginx time).
    #[arg(long)]
    from: Option<String>,
    /// Replay only requests that started before this time.
    #[arg(long)]
    to: Option<String>,
    /// Write `LINE<TAB>STATUS` per input line (`FILE:LINE` with several files): PASSED, DELAYED,
    /// REJECTED, *_DRY_RUN, `-` (no limit applied, or not a request) or BAD (unparsable).
    #[arg(long)]
    decisions: Option<PathBuf>,
    /// Print the report as JSON (with the time series) instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw offered vs admitted requests per zone over time into this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Replay dry-run limits as if they were enforced.
    #[arg(long)]
    enforce: bool,
    /// Search the smallest limits that meet --max-rejected and --max-keys-hit, print them as TOML.
    #[arg(long)]
    suggest: bool,
    /// --suggest: the largest share of requests a limit may reject.
    #[arg(long, default_value = "0.1%")]
    max_rejected: String,
    /// --suggest: the largest share of keys that may see a rejection.
    #[arg(long, default_value = "1%")]
    max_keys_hit: String,
    /// The longest a line may be logged after lines of requests that started later (seconds).
    #[arg(long, default_value = "300")]
    reorder_window: u64,
    /// No progress line on stderr.
    #[arg(long)]
    quiet: bool,
    /// Lines longer than this many bytes are counted as bad and skipped, never held whole.
    #[arg(long, default_value_t = super::DEFAULT_MAX_LINE_LENGTH)]
    max_line_length: usize,
    /// Stop with an error when the report's per-key tables reach this many keys (each key of
    /// each zone reference is one; about 200 bytes per key and run, a whole-second log runs twice):
    /// bounds the replay's memory.
    #[arg(long, default_value_t = super::DEFAULT_MAX_KEYS)]
    max_keys: u64,
    /// Simulate a fleet of N instances deciding the leased zones (`lease`, docs/leases.md) from
    /// leases of one shared budget, requests spread over them in turn: what leasing would have
    /// admitted. Without it every zone is decided exactly, as by one instance.
    #[arg(long)]
    instances: Option<u64>,
    /// Log files (plain or gzip); `-` is standard input.
    #[arg(required = true)]
    files: Vec<String>,
}

fn options(args: &ReplayArgs) -> Result<Options, ReplayError> {
    let format = Format::parse(&args.format, &args.fields).map_err(ReplayError)?;
    let when = |flag: &str, v: &Option<String>| -> Result<Option<u64>, ReplayError> {
        v.as_deref()
            .map(|t| {
                time::parse_arg(t).ok_or_else(|| {
                    ReplayError(format!("{flag} {t:?}: expected RFC 3339, epoch seconds or 10/Oct/2000:13:55:36 -0700"))
                })
            })
            .transpose()
    };
    let suggest = if args.suggest {
        let max_rejected =
            suggest::parse_share(&args.max_rejected).map_err(|e| ReplayError(format!("--max-rejected: {e}")))?;
        let max_keys_hit =
            suggest::parse_share(&args.max_keys_hit).map_err(|e| ReplayError(format!("--max-keys-hit: {e}")))?;
        Some(suggest::Targets { max_rejected, max_keys_hit })
    } else {
        None
    };
    Ok(Options {
        format,
        files: args.files.clone(),
        from_us: when("--from", &args.from)?,
        to_us: when("--to", &args.to)?,
        decisions: args.decisions.clone(),
        enforce: args.enforce,
        reorder_cap_us: args.reorder_window.saturating_mul(1_000_000),
        suggest,
        progress: !args.quiet,
        max_line_len: args.max_line_length.max(1),
        max_keys: args.max_keys,
        instances: args.instances.map(|n| n.clamp(1, 1024)),
    })
}

fn run_inner(config: &Path, args: &ReplayArgs) -> Result<(), ReplayError> {
    let opts = options(args)?;
    let rt = load_config(config, opts.enforce)?;
    let mut summary = replay(&rt, &opts)?;
    // Replay the whole log again with every proposal in place: the zones of a route interact
    // (all-or-nothing), which the per-reference search does not see.
    if let Some(outcome) = summary.suggestions.as_mut() {
        if !opts.files.iter().any(|f| f == "-") {
            let mut proposed = load_config(config, opts.enforce)?;
            suggest::apply(&mut proposed, outcome);
            let again = Options { decisions: None, suggest: None, ..opts.clone() };
            let check = replay(&proposed, &again)?;
            outcome.verified = check.runs.first().map(|run| suggest::verify(&run.stats, outcome));
        }
    }
    if let Some(path) = &args.svg {
        let Some(run) = summary.runs.first() else {
            return Err(ReplayError(format!("{}: nothing to plot: no request was replayed", path.display())));
        };
        let title = format!("weir replay of {} ({})", opts.files.join(", "), run.assumption.describe());
        std::fs::write(path, plot::svg(&rt, &run.stats, &title))
            .map_err(|e| ReplayError(format!("{}: cannot write: {e}", path.display())))?;
    }
    if args.json {
        println!("{}", report::json(&rt, &summary));
    } else {
        print!("{}", report::table(&rt, &summary));
    }
    Ok(())
}

pub fn run(config: &Path, args: ReplayArgs) -> ExitCode {
    match run_inner(config, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir replay: {e}");
            ExitCode::FAILURE
        }
    }
}
