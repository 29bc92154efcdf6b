//! Configuration: `conf/routes.toml` parsed (`schema`), validated and compiled (`compile`) into an
//! immutable [`Runtime`] that requests read without further checks. `weir check` and every load
//! share this one path.

mod compile;
mod error;
mod schema;

use std::path::Path;

pub use compile::{parse_duration, Route, Runtime, ServerSettings, StoreSettings, Zone, ZoneLimit};
pub use error::ConfigError;

/// Reads and compiles a config file. Errors name the file and, where possible, the line.
pub fn load(path: &Path) -> Result<Runtime, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: None,
        message: format!("cannot read the config file: {e}"),
    })?;
    compile::compile(&text, &file)
}

/// Compiles config text; `file` is only used in error messages.
pub fn from_str(text: &str, file: &str) -> Result<Runtime, ConfigError> {
    compile::compile(text, file)
}
