//! The `weir` command line: run the proxy (the default), `check` a config (every error, FILE:LINE),
//! print its JSON `schema`, `replay` access logs through it, watch an instance (`top`), translate
//! other configs (`import-rls`, `import-nginx`, `import-ingress`), or serve a demo upstream (`echo`).

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
    /// Prints each leased zone's overshoot bound for a fleet of `--instances` (docs/leases.md).
    Check {
        /// The fleet size the bound of leased zones is stated for.
        #[arg(long, default_value_t = weir::config::DEFAULT_CHECK_INSTANCES)]
        instances: u64,
    },
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
    /// Translate an nginx config (a main file with its includes, site files, or `nginx -T` output) into one Weir
    /// TOML (stdout), every zone and route naming its nginx file:line; refuses what Weir cannot decide as nginx does.
    ImportNginx {
        /// nginx config files, or a file holding the output of `nginx -T`.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The nginx listen port to import when servers listen on several.
        #[arg(long)]
        port: Option<u16>,
        /// The output's `[server] listen` address (default 0.0.0.0:PORT).
        #[arg(long)]
        listen: Option<String>,
        /// Leave out (and name on stderr) what Weir cannot express, with stand-in routes that deny it uncharged.
        #[arg(long)]
        allow_unexpressed: bool,
    },
    /// Translate Kubernetes Ingress manifests with ingress-nginx annotations (and the controller's ConfigMap) into one
    /// Weir TOML (stdout), as ingress-nginx generated its nginx config.
    ImportIngress {
        /// Manifests: files (multi-document YAML) or directories of *.yaml / *.yml.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Send every backend Service to this address (default: SERVICE.NAMESPACE.svc.cluster.local:PORT).
        #[arg(long)]
        upstream: Option<String>,
        /// The output's `[server] listen` address.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: String,
        /// ingress-nginx controller replicas: print what each limit effectively was across them.
        #[arg(long)]
        replicas: Option<u64>,
        /// With --replicas: write the total of all replicas (rate and burst × N) as the fleet-wide limit.
        #[arg(long, requires = "replicas")]
        keep_total: bool,
        /// Leave out (and name on stderr) the Ingresses Weir cannot express.
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
        Command::ImportNginx { paths, port, listen, allow_unexpressed } => {
            import_nginx(&paths, weir::import::nginx::Options { allow_unexpressed, port, listen })
        }
        Command::ImportIngress { paths, upstream, listen, replicas, keep_total, allow_unexpressed } => {
            let options = weir::import::ingress::Options { upstream, listen, replicas, keep_total, allow_unexpressed };
            run_import("import-ingress", &paths, |files| {
                weir::import::ingress::import(files, &options).map(|i| (i.toml, i.notes))
            })
        }
        Command::Check { instances } => match weir::config::load_all(&cli.config) {
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
                for line in weir::config::lease_check_lines(&rt, instances.max(1)) {
                    println!("{line}");
                }
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for e in weir::config::shown(&errors) {
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
    run_import("import-rls", paths, |files| weir::rls::import::import(files, &options).map(|i| (i.toml, i.notes)))
}

/// `weir import-nginx`: the TOML on stdout, notes on stderr; a refusal exits 1.
fn import_nginx(paths: &[PathBuf], options: weir::import::nginx::Options) -> ExitCode {
    run_import("import-nginx", paths, |files| {
        weir::import::nginx::import(files, &weir::import::nginx::files::Disk, &options).map(|i| (i.toml, i.notes))
    })
}

/// Every importer's frame: its inputs read with import-rls's bounded reads (no device, FIFO or
/// endless file), the TOML it makes on stdout and its notes on stderr; a refusal or an unreadable
/// input exits 1, named after `command`.
fn run_import<E: std::fmt::Display>(
    command: &str,
    paths: &[PathBuf],
    import: impl FnOnce(&[(String, String)]) -> Result<(String, Vec<String>), E>,
) -> ExitCode {
    let files = match weir::rls::import_input::read_configs(paths) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("weir {command}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match import(&files) {
        Ok((toml, notes)) => {
            print!("{toml}");
            for note in &notes {
                eprintln!("weir {command}: note: {note}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir {command}: {e}");
            ExitCode::FAILURE
        }
    }
}
