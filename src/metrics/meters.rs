//! Handles to the request path's series, held per config: a route's or zone's counter is looked
//! up by its labels once, on first use, and then incremented directly. `with_label_values` hashes
//! the labels, takes the vector's lock (one cache line every proxy thread touches) and clones the
//! handle on every call; four of those a request (outcome, zone, upstream status and time) were
//! measurable in `bench/run.sh --instructions`. Series still appear only once something counts
//! them, as before.

use std::sync::OnceLock;

use prometheus::{Histogram, IntCounter, IntCounterVec};

use super::METRICS;

/// The handles of one config (`Runtime::meters`), by route and zone index.
#[derive(Debug, Default)]
pub struct Meters {
    routes: Vec<RouteMeters>,
    /// Requests no route matched (`route="-"`).
    no_route: RouteMeters,
    zones: Vec<ZoneMeters>,
    conn_zones: Vec<ZoneMeters>,
}

impl Meters {
    pub fn new<'a>(
        routes: impl IntoIterator<Item = &'a str>,
        zones: impl IntoIterator<Item = &'a str>,
        conn_zones: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        Self {
            routes: routes.into_iter().map(RouteMeters::new).collect(),
            no_route: RouteMeters::new("-"),
            zones: zones.into_iter().map(|z| ZoneMeters::new(z, &METRICS.zone_decisions)).collect(),
            conn_zones: conn_zones.into_iter().map(|z| ZoneMeters::new(z, &METRICS.conn_decisions)).collect(),
        }
    }

    /// The route's handles; `None`: no route (`route="-"`).
    pub fn route(&self, route: Option<usize>) -> &RouteMeters {
        route.and_then(|i| self.routes.get(i)).unwrap_or(&self.no_route)
    }

    /// `weir_zone_decisions_total{zone}` of limit_req zone `zone`.
    pub fn zone(&self, zone: usize) -> Option<&ZoneMeters> {
        self.zones.get(zone)
    }

    /// `weir_conn_decisions_total{zone}` of limit_conn zone `zone`.
    pub fn conn_zone(&self, zone: usize) -> Option<&ZoneMeters> {
        self.conn_zones.get(zone)
    }
}

/// One route's series. Outcomes and zone statuses come with a slot number (`Outcome::slot`,
/// `LimitStatus::slot`) so that the handle is found without comparing labels.
#[derive(Debug, Default)]
pub struct RouteMeters {
    route: String,
    requests: Slots<IntCounter, OUTCOME_SLOTS>,
    responses: StatusCounters,
    upstream_duration: OnceLock<Histogram>,
    delay: OnceLock<Histogram>,
}

/// More than the proxy's outcomes (`Outcome::slot`); a larger slot is looked up each time.
pub const OUTCOME_SLOTS: usize = 17;

impl RouteMeters {
    fn new(route: &str) -> Self {
        Self { route: route.to_string(), ..Self::default() }
    }

    /// `weir_requests_total{route, outcome}` += 1.
    pub fn request(&self, slot: usize, outcome: &str) {
        self.requests.get(slot, || METRICS.requests.with_label_values(&[&self.route, outcome]), |c| c.inc());
    }

    /// `weir_upstream_responses_total{route, status}` += 1 and the upstream's time.
    pub fn upstream_response(&self, status: u16, seconds: f64) {
        self.responses.inc(status, &self.route);
        self.upstream_duration
            .get_or_init(|| METRICS.upstream_duration.with_label_values(&[&self.route]))
            .observe(seconds);
    }

    /// `weir_delay_seconds{route}`.
    pub fn delay(&self, seconds: f64) {
        self.delay.get_or_init(|| METRICS.delay_seconds.with_label_values(&[&self.route])).observe(seconds);
    }
}

/// One zone's decisions by status word, in `metric{zone, status}` (limit_req's or limit_conn's).
#[derive(Debug)]
pub struct ZoneMeters {
    zone: String,
    metric: &'static IntCounterVec,
    decisions: Slots<IntCounter, STATUS_SLOTS>,
}

/// More than the zone status words (`LimitStatus::slot`).
pub const STATUS_SLOTS: usize = 8;

impl ZoneMeters {
    fn new(zone: &str, metric: &'static IntCounterVec) -> Self {
        Self { zone: zone.to_string(), metric, decisions: Slots::default() }
    }

    /// `metric{zone, status}` += 1.
    pub fn decision(&self, slot: usize, status: &str) {
        self.decisions.get(slot, || self.metric.with_label_values(&[&self.zone, status]), |c| c.inc());
    }
}

/// Handles by a small index, each bound on first use.
#[derive(Debug)]
struct Slots<M, const N: usize>([OnceLock<M>; N]);

impl<M, const N: usize> Default for Slots<M, N> {
    fn default() -> Self {
        Self(std::array::from_fn(|_| OnceLock::new()))
    }
}

impl<M, const N: usize> Slots<M, N> {
    /// Applies `f` to the handle in `slot`, made by `make` the first time; a slot out of range
    /// gets a fresh handle each time.
    fn get(&self, slot: usize, make: impl FnOnce() -> M, f: impl FnOnce(&M)) {
        match self.0.get(slot) {
            Some(cell) => f(cell.get_or_init(make)),
            None => f(&make()),
        }
    }
}

/// Upstream statuses of one route: the first few distinct ones get a handle (a route sees a
/// handful); any further status is looked up each time. Fixed size, whatever the upstream sends.
#[derive(Debug, Default)]
struct StatusCounters([OnceLock<(u16, IntCounter)>; 8]);

impl StatusCounters {
    fn inc(&self, status: u16, route: &str) {
        let make =
            || (status, METRICS.upstream_responses.with_label_values(&[route, itoa::Buffer::new().format(status)]));
        for cell in &self.0 {
            // Two threads binding different statuses race for a cell: the loser moves on.
            let (bound, counter) = cell.get_or_init(make);
            if *bound == status {
                counter.inc();
                return;
            }
        }
        make().1.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(vec: &prometheus::IntCounterVec, labels: &[&str]) -> u64 {
        vec.with_label_values(labels).get()
    }

    #[test]
    fn handles_count_in_the_same_series_as_label_lookups() {
        let m = Meters::new(["meters-test-route"], ["meters-test-zone"], ["meters-test-conn"]);
        let route = m.route(Some(0));
        for _ in 0..3 {
            route.request(1, "passed");
        }
        route.request(OUTCOME_SLOTS + 5, "odd_slot");
        assert_eq!(count(&METRICS.requests, &["meters-test-route", "passed"]), 3);
        assert_eq!(count(&METRICS.requests, &["meters-test-route", "odd_slot"]), 1);

        m.route(None).request(0, "meters-test-no-route");
        assert_eq!(count(&METRICS.requests, &["-", "meters-test-no-route"]), 1);
        assert_eq!(m.route(Some(7)).route, "-", "an index the config does not have is no route");

        let zone = m.zone(0).expect("zone 0");
        zone.decision(2, "rejected");
        zone.decision(2, "rejected");
        assert_eq!(count(&METRICS.zone_decisions, &["meters-test-zone", "rejected"]), 2);
        m.conn_zone(0).expect("conn zone 0").decision(0, "passed");
        assert_eq!(count(&METRICS.conn_decisions, &["meters-test-conn", "passed"]), 1);
        assert!(m.zone(1).is_none());
    }

    #[test]
    fn more_upstream_statuses_than_cells_are_all_counted() {
        let m = Meters::new(["meters-test-statuses"], [], []);
        let route = m.route(Some(0));
        let statuses: Vec<u16> = (200..212).collect();
        for round in 0..2 {
            for &s in &statuses {
                route.upstream_response(s, 0.001 * f64::from(round));
            }
        }
        for s in statuses {
            assert_eq!(count(&METRICS.upstream_responses, &["meters-test-statuses", &s.to_string()]), 2, "{s}");
        }
        let duration = METRICS.upstream_duration.with_label_values(&["meters-test-statuses"]);
        assert_eq!(duration.get_sample_count(), 24);
    }

    #[test]
    fn racing_threads_count_every_event() {
        let m = std::sync::Arc::new(Meters::new(["meters-test-race"], [], []));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..1000u16 {
                        m.route(Some(0)).upstream_response(500 + (i + t) % 10, 0.0);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("counting thread");
        }
        let total: u64 =
            (500..510).map(|s: u16| count(&METRICS.upstream_responses, &["meters-test-race", &s.to_string()])).sum();
        assert_eq!(total, 4000);
    }
}
