//! The `weir` command line: run the proxy, check a config, or serve a demo upstream.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `weir --version`: the release and the commit it was built from (build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("WEIR_COMMIT"), ")");

/// The sections of a man page, after the commands and options of `weir --help` (`-h`: short).
const MANUAL: &str = "\
Files:
  /etc/weir/routes.toml   the config of the Debian package and the container image (-c FILE)
  conf/*.toml             examples, one per feature, each passing `weir check`
  docs/weir.schema.json   the config's JSON Schema (`weir schema`), for editors

Signals:
  SIGHUP                  reload the config: it is checked whole first; a bad file is refused,
                          logged and counted (weir_config_reload_failures_total), and the running
                          config keeps serving. Saving the file and POST /reload do the same.
  SIGTERM                 stop: the listeners close at once, requests in flight get a second

Environment:
  RUST_LOG                overrides [log] level, e.g. RUST_LOG=debug
  TMPDIR                  where Pingora writes its pid file and upgrade socket
  ${NAME} in the config   any string value may use environment variables (docs/configuration.md)

Exit status:
  0  `weir check`: the config is good; `weir`: stopped cleanly
  1  the config has errors (each printed as FILE:LINE: message), or the proxy could not start

Examples:
  weir check -c /etc/weir/routes.toml
  weir -c /etc/weir/routes.toml
  systemctl reload weir            (the Debian package's unit: SIGHUP)
  weir top --admin 127.0.0.1:9901

See also: README.md, docs/configuration.md, docs/operating.md, docs/production.md";

#[derive(Parser)]
#[command(
    name = "weir",
    version = VERSION,
    about = "Rate-limiting reverse proxy: nginx limit_req semantics, shared by a fleet through Redis",
    long_about = "Rate-limiting reverse proxy: nginx limit_req semantics, shared by a fleet through Redis.\n\n\
                  `weir -c conf/routes.toml` runs the proxy; `weir check -c FILE` validates a config \
                  and exits 0 or 1, like `nginx -t`.",
    after_long_help = MANUAL
)]
struct Cli {
    /// The config file (TOML; see conf/routes.toml).
    #[arg(short = 'c', long = "config", global = true, default_value = "conf/routes.toml")]
    config: PathBuf,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default when no command is given).
    Run,
    /// Validate a config file without starting: exit 0 if it is good, 1 with the error if not.
    Check,
    /// Print the JSON Schema of the config file (for editors: docs/production.md).
    Schema,
    /// Serve a tiny upstream that answers 200 to every request (for demos and benchmarks).
    Echo {
        /// Address to listen on.
        #[arg(short, long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
    },
    /// A live view of an instance (its admin address): rates per route and zone, the keys being limited; reset a key.
    Top(weir::tui::TopArgs),
    /// Translate envoyproxy/ratelimit YAML configs (files, or its runtime config directories) into one Weir TOML
    /// (stdout); refuses what envoyproxy/ratelimit refuses, with its reason, and what Weir would decide otherwise.
    ImportRls {
        /// The envoyproxy/ratelimit configs: files, or directories (their *.yaml and *.yml files, by name).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The rate limit service's address in the output's `[rls] listen`.
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: String,
        /// Merge files of one domain, like envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG (else a domain's second file is refused).
        #[arg(long)]
        merge_domains: bool,
        /// Leave out (and name on stderr) the domains Weir cannot express, instead of refusing the whole import.
        #[arg(long)]
        allow_unexpressed: bool,
    },
    /// Replay access logs through the config's limits: what would they have done? (`--suggest`: which limits to choose.)
    Replay(Box<weir::replay::cli::ReplayArgs>),
}

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Schema => {
            print!("{}", weir::config::json_schema_text());
            ExitCode::SUCCESS
        }
        Command::Replay(args) => weir::replay::cli::run(&cli.config, *args),
        Command::Top(args) => match weir::tui::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("weir top: {e}");
                ExitCode::FAILURE
            }
        },
        Command::ImportRls { paths, listen, merge_domains, allow_unexpressed } => {
            import_rls(&paths, weir::rls::import::Options { listen, merge_domains, allow_unexpressed })
        }
        Command::Check => match weir::config::load_all(&cli.config) {
            Ok(rt) => {
                for warning in &rt.warnings {
                    eprintln!("weir: warning: {warning}");
                }
                let rls = rt.rls.as_ref().map_or(String::new(), |r| format!(", {} rls domains", r.domains.len()));
                println!(
                    "{}: ok ({} routes, {} limit_req zones, {} upstreams{rls})",
                    cli.config.display(),
                    rt.routes.len(),
                    rt.zones.len(),
                    rt.upstreams.len()
                );
                // Where secrets come from, never their values.
                for source in &rt.secrets.sources {
                    println!("  {}: from {}", source.setting, source.from);
                }
                for used in &rt.secrets.env {
                    let names: Vec<String> = used.variables.iter().map(|v| format!("${{{v}}}")).collect();
                    println!("  {}: from the environment ({})", used.setting, names.join(", "));
                }
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for e in &errors {
                    eprintln!("weir: {e}");
                }
                if errors.len() > 1 {
                    eprintln!("weir: {} errors in {}", errors.len(), cli.config.display());
                }
                ExitCode::FAILURE
            }
        },
        Command::Run => {
            let reloader = match weir::config::load_with_text(&cli.config) {
                Ok((runtime, text)) => {
                    weir::logging::init(&runtime.log);
                    if let Err(e) = weir::trace::install(runtime.tracing.as_ref()) {
                        eprintln!("weir: {e}");
                        return ExitCode::FAILURE;
                    }
                    weir::process::reload::Reloader::new(&cli.config, runtime, &text)
                }
                Err(e) => {
                    eprintln!("weir: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let served = weir::process::server::run(std::sync::Arc::new(reloader));
            weir::trace::shutdown();
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("weir: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Echo { listen } => {
            weir::logging::init(&weir::config::LogSettings {
                level: "info".into(),
                json: false,
                access_log: false,
                access_buffer: None,
            });
            match weir::process::echo::run(listen) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("weir echo: cannot serve on {listen}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `weir import-rls`: the TOML on stdout, notes on stderr; a refusal (or an unreadable file) exits 1.
fn import_rls(paths: &[PathBuf], options: weir::rls::import::Options) -> ExitCode {
    let mut files = Vec::new();
    for path in paths {
        if let Err(e) = read_rls_configs(path, &mut files) {
            eprintln!("weir import-rls: cannot read {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    match weir::rls::import::import(&files, &options) {
        Ok(imported) => {
            print!("{}", imported.toml);
            for note in &imported.notes {
                eprintln!("weir import-rls: note: {note}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir import-rls: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A file, or a directory's `*.yaml`/`*.yml` files and subdirectories in name order. Names
/// starting with `.` are skipped: a Kubernetes ConfigMap volume holds each file twice, once
/// under `..data`.
fn read_rls_configs(path: &std::path::Path, files: &mut Vec<(String, String)>) -> std::io::Result<()> {
    read_rls_configs_within(path, files, 0)
}

/// Directories nested deeper than this are refused (a symlink loop would never end).
const MAX_RLS_CONFIG_DEPTH: usize = 16;

fn read_rls_configs_within(
    path: &std::path::Path,
    files: &mut Vec<(String, String)>,
    depth: usize,
) -> std::io::Result<()> {
    if depth > MAX_RLS_CONFIG_DEPTH {
        return Err(std::io::Error::other(format!(
            "directories nested over {MAX_RLS_CONFIG_DEPTH} deep (a symlink loop?)"
        )));
    }
    if !path.is_dir() {
        files.push((path.display().to_string(), std::fs::read_to_string(path)?));
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    entries.sort();
    for entry in entries {
        let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let yaml = entry.extension().is_some_and(|x| x == "yaml" || x == "yml");
        if !name.starts_with('.') && (entry.is_dir() || yaml) {
            read_rls_configs_within(&entry, files, depth + 1)?;
        }
    }
    Ok(())
}
