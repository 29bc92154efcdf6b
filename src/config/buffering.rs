//! `[server.response_buffering]` (src/buffering/): how much of a response each client
//! connection may take ahead of a slow client, and the process's totals.

use std::path::PathBuf;

use super::error::{ConfigError, Source};
use super::limit_rate::parse_size;
use super::schema;
use super::spanned::Spanned;
use crate::buffering::ResponseBuffering;

/// The largest per-connection memory share: beyond it one client would be worth a process.
const MAX_MEMORY_PER_CONNECTION: u64 = 64 << 20;

pub(super) fn compile_buffering(
    src: &Source<'_>,
    section: Option<Spanned<schema::ResponseBuffering>>,
) -> Result<ResponseBuffering, Vec<ConfigError>> {
    let defaults = ResponseBuffering::default();
    let Some(section) = section else { return Ok(defaults) };
    let schema::ResponseBuffering { enabled, memory_per_connection, max_temp_file_size, temp_path, memory, temp_files } =
        section.into_inner();
    let mut errors = Vec::new();
    let mut size = |value: Option<Spanned<String>>, field: &str, default: u64| -> u64 {
        let Some(value) = value else { return default };
        match parse_size(value.get_ref()) {
            Ok(bytes) => bytes,
            Err(e) => {
                errors.push(src.error_at(&value.span(), format!("server.response_buffering.{field}: {e}")));
                default
            }
        }
    };
    let memory_per_connection = size(memory_per_connection, "memory_per_connection", defaults.memory_per_connection);
    let max_temp_file_size = size(max_temp_file_size, "max_temp_file_size", defaults.max_temp_file_size);
    let memory = size(memory, "memory", defaults.memory);
    let temp_files = size(temp_files, "temp_files", defaults.temp_files);
    if memory_per_connection > MAX_MEMORY_PER_CONNECTION {
        errors.push(src.error(format!(
            "server.response_buffering.memory_per_connection: at most \"64m\", got {memory_per_connection} bytes"
        )));
    }
    let temp_path = match temp_path {
        None => defaults.temp_path,
        Some(p) => {
            let path = PathBuf::from(p.get_ref());
            if !path.is_absolute() || !path.is_dir() {
                errors.push(src.error_at(
                    &p.span(),
                    format!(
                        "server.response_buffering.temp_path: {:?} is not an existing absolute directory",
                        p.get_ref()
                    ),
                ));
            }
            path
        }
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(ResponseBuffering {
        enabled: enabled.unwrap_or(defaults.enabled),
        memory_per_connection,
        max_temp_file_size,
        temp_path,
        memory,
        temp_files,
    })
}
