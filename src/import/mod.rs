//! Importers from other proxies' configs into one Weir TOML: `nginx` (`weir import-nginx`, a
//! config with its includes or `nginx -T` output). Each is pure: text in, TOML text and notes
//! out, refusals naming the source's file:line; the command line (src/main.rs) only reads files.

pub mod ingress;
pub mod nginx;
pub mod toml_text;
