//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on
//! Weir's zones, so Envoy-based meshes (Istio, Contour, Gloo…) can use Weir's limits
//! without putting the proxy in their data path.
//!
//! Each `[[rls.domain]]` is compiled into a `Route` (config/rls.rs) whose `limit_req` references
//! are its rules' zones. A request's descriptors are matched against the rules (`rules`, pure),
//! become that route's keyed zones through the engine's `keyed::keyed_zone` (`plan`: overrides
//! and exemptions are the engine's), and are decided on the call's engine `Ticket`, the proxy's
//! and replay's own (through `decide`, which adds the peer's soft quota limits); `answer` turns
//! the verdict into Envoy's response. The listener is `listener`, the
//! gRPC glue `service`; `import` translates envoyproxy/ratelimit YAML read by `peer_yaml` as the
//! peer's own loader reads it, from files `import_input` reads within bounds.

pub mod answer;
pub mod coalesce;
pub mod decide;
pub mod import;
pub mod import_input;
pub mod listener;
pub mod peer_yaml;
pub mod plan;
pub mod proto;
pub mod quota;
pub mod rules;
pub mod service;

pub use crate::config::rls::{Domain, PatternOrder, RlsSettings, Rule, ValueMatch};
