//! What happened to a request, as one value, in one vocabulary for every front door: the
//! `outcome` label of `weir_requests_total` and `weir_rls_requests_total`, the access log's and
//! replay's words come from here, never from string literals at the call sites.

use crate::config::FailurePolicy;
use crate::engine::status::LimitStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No zone of the route had a key for the request (or the route has no limits).
    Unlimited,
    /// limit_req decided: passed, delayed, rejected, or their dry-run twins.
    Limit(LimitStatus),
    /// limit_conn rejected it.
    ConnRejected,
    /// The store failed and the policy let it through (`allow`) ...
    FailOpen,
    /// ... or refused it (`deny`).
    FailClosed,
    NoRoute,
    /// `allow`/`deny` refused the client address.
    Denied,
    /// Refused before any limit: bad framing, path, key or cost.
    BadRequest,
    /// Refused with 401: a zone keyed on a JWT claim, and no valid token.
    Unauthorized,
    /// Every upstream server was at `max_conns`.
    UpstreamBusy,
    /// No upstream server was up (active or passive health).
    UpstreamDown,
    /// The client left while its request was delayed.
    ClientGone,
    /// The upstream's adaptive concurrency limit refused it (src/adaptive/).
    AdaptiveShed,
}

impl Outcome {
    /// Every outcome, once.
    pub const ALL: [Outcome; 17] = [
        Outcome::Unlimited,
        Outcome::Limit(LimitStatus::Passed),
        Outcome::Limit(LimitStatus::Delayed),
        Outcome::Limit(LimitStatus::Rejected),
        Outcome::Limit(LimitStatus::DelayedDryRun),
        Outcome::Limit(LimitStatus::RejectedDryRun),
        Outcome::ConnRejected,
        Outcome::FailOpen,
        Outcome::FailClosed,
        Outcome::NoRoute,
        Outcome::Denied,
        Outcome::BadRequest,
        Outcome::UpstreamBusy,
        Outcome::UpstreamDown,
        Outcome::ClientGone,
        Outcome::Unauthorized,
        Outcome::AdaptiveShed,
    ];

    /// After limit_req: the failure policy that decided, else the request's status.
    pub fn of_limit_req(fallback: Option<FailurePolicy>, status: Option<LimitStatus>) -> Self {
        match (fallback, status) {
            (Some(FailurePolicy::Allow), _) => Outcome::FailOpen,
            (Some(FailurePolicy::Deny), _) => Outcome::FailClosed,
            (_, Some(status)) => Outcome::Limit(status),
            (_, None) => Outcome::Unlimited,
        }
    }

    /// A limit_conn rejection: by a full zone, or by the `deny` policy.
    pub fn of_conn_rejection(fallback: Option<FailurePolicy>) -> Self {
        match fallback {
            Some(FailurePolicy::Deny) => Outcome::FailClosed,
            _ => Outcome::ConnRejected,
        }
    }

    /// Its place among the outcomes (0..16), for the metric handles (`metrics::RouteMeters`).
    pub fn slot(self) -> usize {
        match self {
            Outcome::Limit(status) => status.slot(),
            Outcome::Unlimited => 5,
            Outcome::ConnRejected => 6,
            Outcome::FailOpen => 7,
            Outcome::FailClosed => 8,
            Outcome::NoRoute => 9,
            Outcome::Denied => 10,
            Outcome::BadRequest => 11,
            Outcome::UpstreamBusy => 12,
            Outcome::UpstreamDown => 13,
            Outcome::ClientGone => 14,
            Outcome::Unauthorized => 15,
            Outcome::AdaptiveShed => 16,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Unlimited => "unlimited",
            Outcome::Limit(status) => status.metric_label(),
            Outcome::ConnRejected => "conn_rejected",
            Outcome::FailOpen => "fail_open",
            Outcome::FailClosed => "fail_closed",
            Outcome::NoRoute => "no_route",
            Outcome::Denied => "denied",
            Outcome::BadRequest => "bad_request",
            Outcome::UpstreamBusy => "upstream_busy",
            Outcome::UpstreamDown => "upstream_down",
            Outcome::ClientGone => "client_gone",
            Outcome::Unauthorized => "unauthorized",
            Outcome::AdaptiveShed => "adaptive_shed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_slots_are_distinct() {
        let all = Outcome::ALL;
        let labels: std::collections::HashSet<_> = all.iter().map(|o| o.label()).collect();
        assert_eq!(labels.len(), all.len());
        let slots: std::collections::HashSet<_> = all.iter().map(|o| o.slot()).collect();
        assert_eq!(slots.len(), all.len(), "one metric handle per outcome");
    }
}
