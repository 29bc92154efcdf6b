//! The limit step of one request: its keyed zones go to the store, the verdict becomes an action
//! (forward, delay, reject), response headers and nginx-style statuses for logs and metrics.
//!
//! Zones in dry run are decided in a separate atomic call from enforced ones, so a shadow limit
//! can never change what an enforced one decides (or charge it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::warn;

use super::headers::{self, ZoneInfo};
use crate::config::{HeaderMode, Route, Runtime};
use crate::limit::Verdict;
use crate::metrics::METRICS;
use crate::store::{LimitStore, StoreError, ZoneCheck};

/// The cost of one request; per-route and per-header costs come with the algorithms work.
const COST: u64 = 1;

/// A zone of the route whose key for this request is not empty.
pub struct KeyedZone {
    /// Index into `route.limits`.
    pub limit: usize,
    pub key: Vec<u8>,
}

/// nginx's `$limit_req_status` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitStatus {
    Passed,
    Delayed,
    Rejected,
    DelayedDryRun,
    RejectedDryRun,
}

impl LimitStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitStatus::Passed => "PASSED",
            LimitStatus::Delayed => "DELAYED",
            LimitStatus::Rejected => "REJECTED",
            LimitStatus::DelayedDryRun => "DELAYED_DRY_RUN",
            LimitStatus::RejectedDryRun => "REJECTED_DRY_RUN",
        }
    }

    pub fn metric_label(self) -> &'static str {
        match self {
            LimitStatus::Passed => "passed",
            LimitStatus::Delayed => "delayed",
            LimitStatus::Rejected => "rejected",
            LimitStatus::DelayedDryRun => "delayed_dry_run",
            LimitStatus::RejectedDryRun => "rejected_dry_run",
        }
    }

    /// Which of two statuses describes the request as a whole: enforcement beats dry run,
    /// rejection beats delay beats pass.
    fn severity(self) -> u8 {
        match self {
            LimitStatus::Passed => 0,
            LimitStatus::DelayedDryRun => 1,
            LimitStatus::RejectedDryRun => 2,
            LimitStatus::Delayed => 3,
            LimitStatus::Rejected => 4,
        }
    }
}

pub enum Action {
    Forward,
    Delay(Duration),
    Reject { status: u16, body: String },
}

pub struct Enforcement {
    pub action: Action,
    /// Rate-limit fields for the response (rejection or upstream's), per the route's header mode.
    pub headers: Vec<(&'static str, String)>,
    /// The request's overall status; `None` when no zone had a key (nginx leaves it unset).
    pub status: Option<LimitStatus>,
    /// Per zone of the route: (zone index, status). Zones of a rejected request that did not
    /// reject are not listed (they were not charged).
    pub zones: Vec<(usize, LimitStatus)>,
    /// The store failed and the request was let through.
    pub store_failed: bool,
}

pub async fn enforce(
    rt: &Runtime,
    route: &Route,
    keyed: &[KeyedZone],
    store: &dyn LimitStore,
) -> Enforcement {
    let (shadow, enforced): (Vec<&KeyedZone>, Vec<&KeyedZone>) =
        keyed.iter().partition(|k| route.limits[k.limit].dry_run);
    let enforced_checks = checks(rt, route, &enforced);
    let shadow_checks = checks(rt, route, &shadow);
    let (enforced_verdict, shadow_verdict) = tokio::join!(
        timed_decide(store, &enforced_checks),
        timed_decide(store, &shadow_checks)
    );

    let mut result = Enforcement {
        action: Action::Forward,
        headers: Vec::new(),
        status: None,
        zones: Vec::new(),
        store_failed: false,
    };
    for (group, verdict, dry_run) in [
        (&enforced, &enforced_verdict, false),
        (&shadow, &shadow_verdict, true),
    ] {
        match verdict {
            Some(Ok(v)) => record_statuses(&mut result, route, group, v, dry_run),
            Some(Err(e)) => {
                result.store_failed = true;
                report_store_error(store.kind(), &route.name, e);
            }
            None => {}
        }
    }

    if let Some(Ok(verdict)) = &enforced_verdict {
        let infos: Vec<ZoneInfo<'_>> = enforced_checks
            .iter()
            .map(|c| ZoneInfo {
                name: c.zone,
                limit: &c.limit,
                cost: c.cost,
            })
            .collect();
        result.headers = match route.headers {
            HeaderMode::Draft => vec![
                ("RateLimit-Policy", headers::policy(&infos)),
                ("RateLimit", headers::remaining(&infos, verdict)),
            ],
            HeaderMode::Legacy => headers::legacy(&infos, verdict),
            HeaderMode::None => Vec::new(),
        };
        result.action = if !verdict.admitted {
            let zone = headers::rejecting_zone(&infos, verdict).unwrap_or("");
            let retry = verdict.retry_after_us.map(headers::retry_after_secs);
            if let Some(secs) = retry {
                result.headers.push(("Retry-After", secs.to_string()));
            }
            Action::Reject {
                status: route.status,
                body: headers::rejection_body(&route.name, zone, retry),
            }
        } else if verdict.delay_us > 0 {
            Action::Delay(Duration::from_micros(verdict.delay_us))
        } else {
            Action::Forward
        };
    }
    result
}

fn checks<'a>(rt: &'a Runtime, route: &'a Route, group: &[&'a KeyedZone]) -> Vec<ZoneCheck<'a>> {
    group
        .iter()
        .map(|k| {
            let zl = &route.limits[k.limit];
            ZoneCheck {
                zone: &rt.zones[zl.zone].name,
                key: &k.key,
                limit: zl.limit,
                cost: COST,
            }
        })
        .collect()
}

/// One atomic store call for a group of zones, timed; `None` for an empty group (no round trip).
async fn timed_decide(
    store: &dyn LimitStore,
    checks: &[ZoneCheck<'_>],
) -> Option<Result<Verdict, StoreError>> {
    if checks.is_empty() {
        return None;
    }
    let started = Instant::now();
    let verdict = store.decide(checks).await;
    METRICS
        .store_duration
        .with_label_values(&[store.kind()])
        .observe(started.elapsed().as_secs_f64());
    Some(verdict)
}

fn record_statuses(
    result: &mut Enforcement,
    route: &Route,
    group: &[&KeyedZone],
    verdict: &Verdict,
    dry_run: bool,
) {
    for (k, out) in group.iter().zip(&verdict.zones) {
        let status = match (verdict.admitted, out.admitted, out.delay_us > 0, dry_run) {
            (_, false, _, false) => LimitStatus::Rejected,
            (_, false, _, true) => LimitStatus::RejectedDryRun,
            // Another zone rejected: this one was not charged and has no say.
            (false, true, _, _) => continue,
            (true, true, true, false) => LimitStatus::Delayed,
            (true, true, true, true) => LimitStatus::DelayedDryRun,
            (true, true, false, _) => LimitStatus::Passed,
        };
        result.zones.push((route.limits[k.limit].zone, status));
        if result
            .status
            .is_none_or(|s| status.severity() > s.severity())
        {
            result.status = Some(status);
        }
    }
    if !dry_run && verdict.admitted && verdict.delay_us == 0 && result.status.is_none() {
        result.status = Some(LimitStatus::Passed);
    }
}

/// Logs store failures at most once a second: a dead Redis must not flood the log.
fn report_store_error(store: &'static str, route: &str, error: &StoreError) {
    let cause = match error {
        StoreError::Timeout(_) => "timeout",
        StoreError::Redis(_) => "redis",
        StoreError::Reply(_) => "reply",
    };
    METRICS
        .store_errors
        .with_label_values(&[store, cause])
        .inc();
    static LAST_LOG_SECS: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST_LOG_SECS.swap(now, Ordering::Relaxed) != now {
        warn!(route, store, error = %error, "limit store failed; request allowed (fail open)");
    }
}
