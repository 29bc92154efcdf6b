//! The decision engine: every front door — the proxy, `weir replay`, the rate limit service —
//! turns its input into a request's facts ([`Head`], or keyed zones) and drives one [`Ticket`]
//! per request, so a rule that decides anything is written once, here.
//!
//! # The ticket's contract
//!
//! In the style of Pingora's `ProxyHttp` phases: each call, when it runs, what it returns, what
//! the front door does before the next one, and what happens when the next one never comes.
//!
//! 1. [`Ticket::rule`] (`async`), once, when the request's head is in. Admits it (target, host,
//!    method, route, allow/deny, keys, cost: `admit.rs`) and decides its `limit_req` zones, all
//!    of them at once, all or nothing (`limit_req.rs`, the failure policy in `store_failure.rs`).
//!    Returns [`Ruling::Refuse`] with the [`Answer`] to send (400, 401, 403, 404, 429, …; the
//!    ticket is settled, go to 4) or [`Ruling::Forward`] with the rewrite to apply (the request
//!    is forwarded exactly as decided on) and a delay. The front door waits the delay out without
//!    blocking anything; if the client leaves meanwhile it calls [`Ticket::client_gone`] and
//!    goes to 4 (nothing further is taken for it, as nginx drops it).
//!    The rate limit service keys zones from descriptors and calls [`Ticket::rule_zones`]
//!    instead (twice for envoyproxy/ratelimit's soft limits): the same [`Ruling`], then 4.
//!    At any point [`Ticket::report`] is what was decided so far, in the one shape every front
//!    door reads: per keyed zone a [`ZoneResult`] (key, limit, cost, word, delay, what is left),
//!    and for the request its outcome, words, delay and failure policy. The observers are handed
//!    the same [`Report`] when the ticket is finished.
//! 2. [`Ticket::hold`] (`async`), once, after the delay: `limit_conn`'s leases, all or none.
//!    `Err(answer)`: send it, go to 4. A front door's own refusals after this point (the
//!    upstream busy or down, the adaptive limit) are recorded with [`Ticket::settle_as`].
//! 3. Settle, as the answer arrives: [`Ticket::forwarded`] when the request goes upstream (from
//!    here its response-decided charges are owed, whatever the client does);
//!    [`Ticket::at_head`] (`async`) with the upstream's status and headers, before the head goes
//!    to the client (it charges what is due at the head and returns the `RateLimit` fields to
//!    add); [`Ticket::body_ended`] when the upstream's body ends; [`Ticket::at_trailers`]
//!    (`async`) with its trailers. Each may never come: the upstream failed, the client left.
//! 4. [`Ticket::finish`] (`async`), exactly once, however the request ended: charges what is
//!    still owed (a client that left early owes the most its answer could have cost), gives the
//!    leases back, reports the request to the [`Observer`]. A ticket dropped unfinished is still
//!    reported and its leases still go back (their own `Drop`), but the charges it owed are lost:
//!    every front door calls `finish`.
//!
//! On the proxy's hot path each `async` step has a synchronous twin for when it has nothing to do
//! ([`Ticket::wants_leases`] before `hold`, [`Ticket::owes`] with [`Ticket::head_fields`] for
//! `at_head`, [`Ticket::finish_settled`] before `finish`; their own `impl` block): an `async`
//! step's future is moved into the phase's state even when it returns at once, and those moves
//! were ~1 % of a request.
//! `rule` itself stays small for the same reason: the in-process store decides without a future
//! (`limit_req::enforce_at_once`), and a store that must be awaited (Redis) gets its ~1 KB future
//! boxed inside `rule`, so only requests with zones on such a store pay for it.
//!
//! # Rooms
//! - `ticket.rs`: the order above; `admit.rs`: the pure step before any limit; `keyed.rs`: the
//!   key step of both limit kinds; `limit_req.rs`, `limit_conn.rs` + `lease.rs`: the two limit
//!   kinds through the stores; `dry_run.rs`: enforced zones apart from dry-run ones;
//!   `store_failure.rs`: a failed store call through the failure policy; `fleet_share.rs`: the
//!   `local` policy's share of each limit;
//!   `after_response.rs`: charges decided by the response; `pacing.rs`: `limit_rate`.
//! - What was decided: [`Report`] and [`ZoneResult`] (`result.rs`: the one result every front
//!   door and observer reads), [`Outcome`] (one vocabulary for metrics, logs, the rate limit
//!   service, replay and the live view), `status.rs` (nginx's `$limit_req_status` words),
//!   [`Answer`] and [`Refusal`] (every answer Weir writes in place of the upstream's, and its
//!   body). The store's verdicts stay inside (`limit_req.rs`).
//! - Who is told: [`Observer`] (`observe.rs`); `metrics/` and `top/` implement it, the engine
//!   imports neither.

mod access;
mod admit;
mod after_response;
mod conditions;
mod dry_run;
mod fleet_share;
mod headers;
mod keyed;
mod lease;
mod limit_conn;
mod limit_req;
mod observe;
mod outcome;
mod overrides;
mod pacing;
mod refusal;
mod result;
mod status;
mod store_failure;
mod stores;
mod ticket;

use std::net::IpAddr;

use http::HeaderMap;

// The engine's public face: front doors and observers name these, never an inner module.
pub use access::allowed;
pub use admit::{BadRequest, Forward, Head};
pub use after_response::{response_cost_fields, Ending};
pub use conditions::applies as conditions_apply;
pub use dry_run::Groups;
pub use keyed::keyed_zone;
pub use lease::LeaseKeeper;
pub use observe::{Observer, Unobserved};
pub use outcome::Outcome;
pub use refusal::{Answer, Refusal};
pub use result::{Counts, Door, Report, ZoneResult};
pub use status::{LimitStatus, Statuses};
pub use stores::{ConnStores, Stores};
pub use ticket::{Ruling, Ticket};

use crate::config::Runtime;

/// The client a request counts against: the TCP peer, or the address the trusted proxies in
/// front of Weir forwarded (`[real_ip]`).
pub fn client_ip(rt: &Runtime, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
    crate::keys::client_ip(peer, headers, rt.real_ip.as_ref())
}
