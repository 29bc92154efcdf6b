//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on
//! Weir's zones, so Envoy-based meshes (Istio, Envoy Gateway, Contour…) can use Weir's limits
//! without putting the proxy in their data path.
//!
//! Each `[[rls.domain]]` is compiled into a `Route` (config/rls.rs) whose `limit_req` references
//! are its rules' zones. A request's descriptors are matched against the rules (`rules`, pure),
//! become that route's keyed zones through the engine's `limit_req::keyed_zone` (`plan`: overrides
//! and exemptions are the engine's), and are decided by the engine's `limit_req::enforce`, the
//! proxy's and replay's own step, through the one call in [`decide`]; `answer` turns the verdict
//! into Envoy's response. The listener is `listener`, the gRPC glue `service`, `import`
//! translates envoyproxy/ratelimit YAML.

pub mod answer;
pub mod import;
pub mod listener;
pub mod plan;
pub mod proto;
pub mod rules;
pub mod service;

pub use crate::config::rls::{Domain, RlsSettings, Rule, ValueMatch};
use crate::config::{Route, Runtime};
use crate::engine::limit_req::{self, Enforcement, Stores};
use crate::engine::policy::Groups;
use crate::store::KeyedZone;

/// The one place the rate limit service decides: the engine's enforcement step (store, breaker,
/// deny cache, failure policy, dry run), on the domain's route and the descriptors' keyed zones.
pub async fn decide<'a>(
    rt: &Runtime,
    route: &'a Route,
    keyed: &Groups<KeyedZone<'a>>,
    stores: &Stores,
) -> Enforcement<'a> {
    limit_req::enforce(rt, route, keyed, stores).await
}
