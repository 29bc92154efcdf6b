//! Adaptive limits by upstream name: what was learned survives a reload, like the upstream's
//! pool (`src/upstream/registry.rs`).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use super::limiter::{AdaptiveLimit, AdaptiveSpec};

static LIMITS: LazyLock<Mutex<HashMap<String, Arc<AdaptiveLimit>>>> = LazyLock::new(Default::default);

/// The upstream's limit, made on first use and given the newest settings.
pub fn attach(upstream: &str, spec: AdaptiveSpec) -> Arc<AdaptiveLimit> {
    let mut limits = LIMITS.lock().unwrap_or_else(|p| p.into_inner());
    match limits.get(upstream) {
        Some(limit) => {
            limit.reconfigure(spec);
            limit.clone()
        }
        None => {
            let limit = Arc::new(AdaptiveLimit::new(upstream, spec));
            limits.insert(upstream.to_string(), limit.clone());
            limit
        }
    }
}

/// The limits in use, for the status page and the live view.
pub fn all() -> Vec<Arc<AdaptiveLimit>> {
    let limits = LIMITS.lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<_> = limits.values().cloned().collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
