//! A zone's per-key overrides at request time: the first whose match fits the request.

use crate::config::{Override, OverrideMatch, Zone};
use crate::keys::RequestFacts;

/// The override of `zone` for this request, if one matches.
pub fn override_for<'z>(zone: &'z Zone, facts: &RequestFacts<'_>) -> Option<&'z Override> {
    zone.overrides.iter().find(|o| match &o.matcher {
        OverrideMatch::ClientIp(net) => facts.client_ip.is_some_and(|ip| net.contains(&ip)),
        OverrideMatch::Part(part, value) => part.value(facts) == *value,
    })
}
