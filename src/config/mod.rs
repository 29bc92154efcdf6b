//! Configuration: `conf/routes.toml` parsed (`schema`), validated and compiled (`compile`) into an
//! immutable [`Runtime`] that requests read without further checks. `weir check` and every load
//! share this one path. Compiling touches nothing outside the text but through [`Outside`]
//! (files, environment, DNS, clock): [`load`] hands it this machine, tests fixed answers.

mod access;
mod buffering;
mod checks;
mod compile;
pub mod conditions;
mod defaults;
mod each;
mod error;
mod interpolate;
mod json_schema;
mod jwt;
mod lease;
mod limit_conn;
mod limit_rate;
mod limit_req;
mod outside;
mod redact;
mod report;
pub mod rls;
mod route;
mod route_match;
mod schema;
mod secrets;
mod spanned;
mod store;
mod tls;
mod top;
mod traces;
mod upstream;

use std::path::Path;

pub use access::AccessRule;
pub use checks::parse_duration;
pub use compile::{AccessBuffer, ClientLimits, LogSettings, Runtime, ServerSettings, UnderscoreHeaders};
pub use error::{one_line, shown, ConfigError, MAX_REPORTED};
pub use interpolate::EnvUse;
pub use json_schema::json_schema_text;
pub use lease::{check_lines as lease_check_lines, leased_references, DEFAULT_CHECK_INSTANCES};
pub use limit_conn::{ConnLimit, ConnZone};
pub use limit_rate::LimitRate;
pub use limit_req::{Override, OverrideMatch, ResponseCost, Zone, BODY_BYTES_FIELD, RESPONSE_FIELD_PREFIX};
pub use outside::{Fixed, Machine, Outside};
pub use route::OwnBody;
pub use route::{Cost, HeaderMode, Route, ZoneLimit};
pub use secrets::{Secret, SecretSource, Secrets};
pub use store::{store_label, FailurePolicy, Resilience, StoreSettings, DEFAULT_LEASE_TTL};
pub use top::TopSettings;
pub use traces::TraceSettings;

/// Reads and compiles a config file. Errors name the file and, where possible, the line.
pub fn load(path: &Path) -> Result<Runtime, ConfigError> {
    load_with_text(path).map(|(runtime, _)| runtime)
}

/// Like [`load`], also returning the text that was compiled (reloads fingerprint it).
pub fn load_with_text(path: &Path) -> Result<(Runtime, String), ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: None,
        message: format!("cannot read the config file: {e}"),
    })?;
    compile::compile(&text, &file, &Machine).map(|runtime| (runtime, text))
}

/// Like [`load`], with every error the file has (`weir check`), in the order of their lines.
pub fn load_all(path: &Path) -> Result<Runtime, Vec<ConfigError>> {
    load_all_with_text(path).map(|(runtime, _)| runtime)
}

/// Like [`load_with_text`], with every error the file has (a reload), in the order of their lines.
pub fn load_all_with_text(path: &Path) -> Result<(Runtime, String), Vec<ConfigError>> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        vec![ConfigError { file: file.clone(), line: None, message: format!("cannot read the config file: {e}") }]
    })?;
    from_text_all(&text, &file).map(|runtime| (runtime, text))
}

/// Like [`from_text`], with every error the text has, in the order of their lines.
pub fn from_text_all(text: &str, file: &str) -> Result<Runtime, Vec<ConfigError>> {
    compile::compile_all(text, file, &Machine).map_err(|mut errors| {
        // Stable: errors of one line keep the order they were found in; those without a line last.
        errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
        errors
    })
}

/// Compiles config text; `file` names it in error messages and is the directory relative paths
/// start from.
pub fn from_text(text: &str, file: &str) -> Result<Runtime, ConfigError> {
    compile::compile(text, file, &Machine)
}

/// [`from_text`] with the files, environment, DNS and clock of `outside` instead of this
/// machine's.
pub fn from_text_with(text: &str, file: &str, outside: &dyn Outside) -> Result<Runtime, ConfigError> {
    compile::compile(text, file, outside)
}
