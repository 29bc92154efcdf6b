//! Request-time checks that come before routing and limits: the canonical path, framing that an
//! upstream could read differently, and the client headers sent upstream. Pure functions over
//! `http` types; the proxy applies them.

pub mod forwarded;
pub mod hygiene;
pub mod path;

pub use path::{normalize as normalize_path, EncodedSlash, PathError};
