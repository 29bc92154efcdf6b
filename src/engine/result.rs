//! What the engine decided of one request, in one shape every front door reads (Limitador's
//! `CheckResult` in kind): per keyed `limit_req` zone a [`ZoneResult`] (its key, limit, cost,
//! nginx word, own delay, and what is left), and for the request as a whole the ticket's
//! [`Report`]. The proxy's access log and trace span, the rate limit service's answer, replay's
//! decisions and the observers (metrics, the live view) all read these; none reads the store's
//! verdicts or re-derives which zones were enforced.

use std::net::IpAddr;
use std::time::Duration;

use super::outcome::Outcome;
use super::status::{LimitStatus, Statuses};
use crate::config::FailurePolicy;
use crate::limit::LimitReq;

/// The front door a ticket came through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Door {
    /// The proxy: the request's route is one of the snapshot's.
    Proxy,
    /// The rate limit service: one call of this domain (`-`: unknown).
    Rls { domain: Box<String> },
}

/// One keyed `limit_req` zone of a ruled request, and what it said.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneResult {
    /// Index into the route's `limits` (the rate limit service: its domain's route).
    pub reference: usize,
    /// Index into the snapshot's `zones`.
    pub zone: usize,
    pub key: Vec<u8>,
    /// The limit applied to this key (the reference's, or an override's).
    pub limit: LimitReq,
    pub cost: u64,
    pub dry_run: bool,
    /// nginx's word for this zone; `None`: another zone rejected the request, this one was not
    /// charged (or no store decided: the failure policy denied).
    pub status: Option<LimitStatus>,
    /// This zone's own delay (none where its group was rejected).
    pub delay_us: u64,
    /// What is left, when a store (or the `local` policy) decided the zone's group.
    pub counts: Option<Counts>,
}

impl ZoneResult {
    /// Its own limit refused the request (enforced, not dry run).
    pub fn refused(&self) -> bool {
        self.status == Some(LimitStatus::Rejected)
    }
}

/// A zone's `RateLimit` numbers: what could pass right now, and the whole seconds until its quota
/// is whole again (when it refused: until the request would pass).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub remaining: u64,
    pub reset_secs: u64,
}

/// One request as the engine saw it (`Ticket::report`): what the front doors log, answer and
/// count, and what the observers are told when the ticket is finished.
pub struct Report<'a> {
    pub door: &'a Door,
    /// The snapshot's route (the proxy's); `None` before one matched and for the rate limit
    /// service, whose rules are per domain.
    pub route: Option<usize>,
    /// The address the request counts against.
    pub client_ip: Option<IpAddr>,
    pub outcome: Outcome,
    /// limit_req's word for the request (nginx's `$limit_req_status`): the most severe of its
    /// zones'; `None` when no zone had a say.
    pub limit_req: Option<LimitStatus>,
    /// Each keyed limit_req zone, enforced ones first, then dry-run ones (the order of `Groups`).
    pub zones: &'a [ZoneResult],
    /// limit_conn's words, per zone (zone indices of the snapshot's `conn_zones`).
    pub limit_conn: &'a Statuses,
    /// How long limit_req held it.
    pub delay: Duration,
    /// When the limits were decided (µs since the epoch: the store's clock when one decided).
    pub decided_us: Option<u64>,
    /// The failure policy that decided limit_req, when the store could not.
    pub fallback: Option<FailurePolicy>,
    /// The client left owing a response-decided charge.
    pub client_left_owing: bool,
}

impl Report<'_> {
    /// (zone index, word) of each limit_req zone that had a say, in the order of `zones`.
    pub fn zone_words(&self) -> impl Iterator<Item = (usize, LimitStatus)> + '_ {
        self.zones.iter().filter_map(|z| z.status.map(|s| (z.zone, s)))
    }
}
