//! Request-time rules over the compiled config, kept out of `config` (which only compiles): the
//! request target, host and method as upstreams read them, the canonical path, framing that an upstream could read differently, the client headers sent
//! upstream, allow/deny, and per-key overrides. Pure functions over `http` types; the proxy (and
//! `weir replay`) apply them.

pub mod access;
pub mod forwarded;
pub mod host;
pub mod hygiene;
pub mod ip_text;
pub mod method;
pub mod overrides;
pub mod path;
pub mod target;

pub use access::allowed;
pub use overrides::override_for;
pub use path::{normalize as normalize_path, EncodedSlash, PathError};
