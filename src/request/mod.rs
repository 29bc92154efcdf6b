//! How a request is read, the way upstreams read it: the target, host and method, the canonical
//! path, framing that an upstream could read differently, and the client headers sent upstream.
//! Pure functions over `http` types, with no config: the engine decides with them (and the
//! proxy writes the forwarded headers).

pub mod forwarded;
pub mod host;
pub mod hygiene;
pub mod ip_text;
pub mod method;
pub mod path;
pub mod target;

pub use path::{normalize as normalize_path, EncodedSlash, PathError};
