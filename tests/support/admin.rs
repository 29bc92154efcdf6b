//! Weir's admin API (`/metrics`, `/config`, `/limits`, `/reload`, the probes) as tests call it.
//!
//! Tests put the admin listener on the second placeholder address: [`LISTEN`] in `[server]`,
//! then [`addr`] of the running weir.

use std::net::SocketAddr;

use super::http::{self, Request, Response};
use super::weir::Weir;

/// The `[server]` line that puts the admin listener on `$LISTEN2`.
pub const LISTEN: &str = r#"admin = "$LISTEN2""#;

/// The admin listener of a weir whose config has [`LISTEN`].
pub fn addr(w: &Weir) -> SocketAddr {
    w.addrs[1]
}

/// `METHOD target` on the admin listener, with `Authorization: auth` when given, on a fresh
/// connection; panics on an I/O error.
pub fn request(admin: SocketAddr, method: &str, target: &str, auth: Option<&str>) -> Response {
    let mut req = Request::new(method, target);
    if let Some(a) = auth {
        req = req.header("Authorization", a);
    }
    http::must_send(admin, &req)
}
