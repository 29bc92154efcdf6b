//! A zone's `lease = { tokens = 100, lifetime = "1s" }` (docs/leases.md): read and checked against
//! what the model can lease (`limit::lease::leasable`) and the sizes its bound assumes; and the
//! leased references of a config, with their bound, for `weir check`.

use super::checks::parse_duration;
use super::error::{ConfigError, Source};
use super::spanned::Spanned;
use super::{schema, Route, Runtime, StoreSettings};
use crate::limit::lease::{leasable, Bound, LeaseSpec};
use crate::limit::{Algorithm, LimitReq};

/// The largest `tokens` of a lease: one instance holding more would make the bound's `N·T` term
/// larger than any burst this config accepts.
const MAX_TOKENS: i64 = 1_000_000;
/// The longest lifetime: a lease lives at most an hour, so the `r·L` term stays an hour of rate.
const MAX_LIFETIME_US: u64 = 3_600_000_000;

/// The fleet size `weir check` states the bound for when `--instances` is not given.
pub const DEFAULT_CHECK_INSTANCES: u64 = 4;

/// Reads a zone's `lease`; refuses it where the zone's settings cannot lease, with the reason.
pub(super) fn compile_lease(
    src: &Source<'_>,
    lease: &Spanned<schema::Lease>,
    zone: &str,
    algorithm: Algorithm,
    counts_statuses: bool,
    costs_from_response: bool,
) -> Result<LeaseSpec, ConfigError> {
    let at = lease.span();
    let refuse = |why: &str| src.error_at(&at, format!("limit_req_zone {zone:?}: lease: {why}"));
    if counts_statuses {
        return Err(refuse(
            "count_statuses charges a request after its response, which a lease spent before forwarding cannot \
             know: remove one of them",
        ));
    }
    if costs_from_response {
        return Err(refuse(
            "cost_from_response charges what the response reports, possibly into debt, which a lease taken ahead of \
             time cannot cover: remove one of them",
        ));
    }
    // The algorithm alone (a reference's delay is checked per reference, `references_lease`).
    let probe = LimitReq {
        algorithm,
        rate: crate::limit::Rate { count: 1, period_us: 1_000_000 },
        burst: 0,
        delay: crate::limit::DelayPolicy::NoDelay,
    };
    leasable(&probe).map_err(refuse)?;
    let lease = lease.get_ref();
    let tokens = *lease.tokens.get_ref();
    if !(1..=MAX_TOKENS).contains(&tokens) {
        return Err(src.error_at(
            &lease.tokens.span(),
            format!("limit_req_zone {zone:?}: lease.tokens must be 1..={MAX_TOKENS}, got {tokens}"),
        ));
    }
    let lifetime_us = parse_duration(lease.lifetime.get_ref())
        .map(|d| d.as_micros() as u64)
        .filter(|us| (1_000..=MAX_LIFETIME_US).contains(us))
        .ok_or_else(|| {
            src.error_at(
                &lease.lifetime.span(),
                format!(
                    "limit_req_zone {zone:?}: lease.lifetime: expected a duration from \"1ms\" to \"1h\" like \"1s\", \
                     got {:?}",
                    lease.lifetime.get_ref()
                ),
            )
        })?;
    Ok(LeaseSpec { tokens: tokens as u64, lifetime_us })
}

/// A limit_conn zone holds places, not a budget: it has nothing to lease.
pub(super) fn not_for_limit_conn(zone: &str) -> String {
    format!(
        "limit_conn_zone {zone:?}: lease: a limit_conn zone counts requests in flight, which are taken and given back \
         one by one; there is no budget to lease (leases are for limit_req zones: docs/leases.md)"
    )
}

/// Every route's (and rls domain's) reference to a leased zone must be leasable as referenced
/// (a leaky bucket's queued burst is the reference's), and its lease no larger than what the
/// reference's bucket or window ever holds (a lease is a debit of it: `tokens` above its capacity
/// could never be granted whole, so the bound's `N·T` would not be what the zone does).
pub(super) fn references_lease(src: &Source<'_>, runtime: &Runtime) -> Result<(), ConfigError> {
    for (route, zone, spec, limit) in leased_references(runtime) {
        leasable(limit).map_err(|why| {
            src.error(format!("route {route:?}: limit_req zone {zone:?} has a lease, which it cannot use here: {why}"))
        })?;
        if spec.tokens > limit.capacity() {
            return Err(src.error(format!(
                "route {route:?}: limit_req zone {zone:?}: lease.tokens ({}) is more than the {} the zone ever holds \
                 here (burst + 1, or the window's limit); a lease is a debit of that: give at most {}",
                spec.tokens,
                limit.capacity(),
                limit.capacity()
            )));
        }
    }
    Ok(())
}

/// (route name, zone name, lease, the reference's limit) of every reference to a leased zone, in
/// the routes' then the rls domains' order.
pub fn leased_references(runtime: &Runtime) -> Vec<(&str, &str, LeaseSpec, &LimitReq)> {
    let rls_routes = runtime.rls.iter().flat_map(|r| r.domains.iter().map(|d| &d.route));
    let routes: Vec<&Route> = runtime.routes.iter().chain(rls_routes).collect();
    let mut out = Vec::new();
    for route in routes {
        for zl in &route.limits {
            let zone = &runtime.zones[zl.zone];
            if let Some(spec) = zone.lease {
                out.push((route.name.as_str(), zone.name.as_str(), spec, &zl.limit));
            }
        }
    }
    out
}

/// `weir check`'s lines about leases: each leased reference's bound for `instances`, and a note
/// when the store is in memory (one process: nothing to lease, the zones decide exactly).
pub fn check_lines(runtime: &Runtime, instances: u64) -> Vec<String> {
    let refs = leased_references(runtime);
    if refs.is_empty() {
        return vec![];
    }
    let mut lines = Vec::new();
    if matches!(runtime.store, StoreSettings::Memory) {
        lines.push(
            "  note: lease is ignored on the memory store (one process decides every request in memory already): \
             these zones are exact"
                .to_string(),
        );
    }
    for (route, zone, spec, limit) in refs {
        let bound = Bound::new(limit, spec, instances);
        lines.push(format!("  lease {zone:?} on route {route:?}: {}", bound.describe()));
    }
    lines
}
