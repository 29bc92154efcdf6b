//! The decision engine: one pure step from a request's facts to a plan or a refusal, and one
//! enforcement step from a plan and the stores to a verdict. Every front door — the proxy,
//! `weir replay`, and any other — translates its input into a [`Head`] and calls these, so a
//! rule that decides anything is written once.
//!
//! - [`admit`]: target, host, method, headers, route, allow/deny, keys and cost → [`Plan`] or
//!   [`Refused`] (`admit.rs`);
//! - [`limit_req::enforce`]: the plan's rate zones through the store, the dry-run split and the
//!   failure policy → an action (forward, delay, reject) with its `RateLimit` fields;
//! - [`limit_conn::acquire`]: the plan's concurrency zones → leases, or a rejection.

pub mod access;
pub mod admit;
pub mod after_response;
pub mod headers;
pub mod lease;
pub mod limit_conn;
pub mod limit_req;
pub mod overrides;
pub mod pacing;
pub mod policy;
pub mod refusal;
pub mod status;

use std::net::IpAddr;

use http::HeaderMap;

pub use admit::{admit, BadRequest, Forward, Head, Plan, Refused};
pub use refusal::Refusal;

use crate::config::Runtime;

/// The client a request counts against: the TCP peer, or the address the trusted proxies in
/// front of Weir forwarded (`[real_ip]`).
pub fn client_ip(rt: &Runtime, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
    crate::keys::client_ip(peer, headers, rt.real_ip.as_ref())
}
