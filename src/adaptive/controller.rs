//! The concurrency limit learned from latency: pure, on a clock the caller passes in (µs).
//!
//! Each window (at least `window` long and `MIN_SAMPLES` answers) yields the median latency of
//! the last answers that ended in it. The upstream's *ideal* latency is the lowest window median
//! since the last probe: as long as the limit keeps the upstream's queue short, windows without
//! a queue keep it honest, so it is measured by the traffic itself — not by pinning the limit to
//! a floor every window (Envoy's minRTT), and a sample is one answer's own time, so requests in
//! flight across a window boundary do not skew it. A probe (one window at ¾ of the queue-free
//! estimate) replaces it: at start-up, and while requests are refused for a sustained time.
//!
//! - median ≤ tolerance × ideal (healthy): a limit the window used (at least half of it) grows:
//!   doubling during start-up, +25 % while latency is well below the tolerance, +1 near it. An
//!   idle or lightly loaded upstream does not teach a limit it never tried.
//! - median > tolerance × ideal (queueing): limit × gradient + 1, the gradient tolerance × ideal
//!   / median at least ½ (Gradient2's form). A queue of q over the k the upstream serves at once
//!   multiplies latency by (k + q) / k, so the gradient removes it in a step or two; instances of
//!   a fleet see the same latency and cut by the same factor, and the +1 keeps any of them from
//!   being cut to nothing while another grows (docs/adaptive.md, "Fleet").

use std::time::Duration;

/// Answers a window needs before it is judged (its median must mean something).
pub const MIN_SAMPLES: usize = 32;
/// How much slower than the ideal latency a window's upper quartile may get (the objective is a
/// p99 within twice the unloaded latency).
const TAIL_TOLERANCE: f64 = 1.5;
/// The tail the window is judged by: its upper quartile, not its p95. A queue at the upstream
/// slows every answer behind it, so it moves the quartile; a few slow answers (a heavy endpoint,
/// one client's slowness) are up to a quarter of the window without moving it.
const TAIL_QUANTILE: f64 = 0.75;
/// A window whose mean latency is more than this times its median is mixed: most answers are
/// much cheaper than where the upstream's time goes (a flood of answers the upstream gives at
/// once). Such a window does not lower the baseline (its median is not the latency of the work).
const MIXED: f64 = 2.0;
/// The limit grows to at most this times the bursts of the window's work in flight: `w + 3√w`,
/// `w` the sum of its answers' latencies over its length (Little's law: the requests the upstream
/// held on average). Cheap answers held in flight by their number, not by the upstream, do not
/// teach a limit that heavy requests would then all get in under.
const WORK_HEADROOM: f64 = 2.0;
/// A window median more than this times (peak in flight × ideal) cannot be a queue of this
/// instance's making (a queue of q behind k servers slows answers by (k + q) / k, never more than
/// the requests in flight): the baseline is what is wrong (cheap answers dragged it down), and
/// cutting the limit would only starve this instance's clients. A probe is taken at once, and
/// what it measures becomes the baseline.
const IMPLAUSIBLE: f64 = 2.0;
/// A probe that has not closed its window after this long (µs; or 4 windows, each as long as the
/// setting or the last window took, if longer) is called off: places held by requests that do
/// not end (slow readers) must not keep it running for ever.
const PROBE_DEADLINE_US: u64 = 3_000_000;
/// Latencies kept per window for its median; beyond, later answers overwrite earlier ones.
const MAX_KEPT: usize = 64;
/// Largest cut per window.
const MAX_DECREASE: f64 = 0.5;
/// Added per healthy window the limit was used in (after start-up).
const GROWTH_STEP: f64 = 1.0;
/// Growth per window while latency is clearly below the tolerance.
const FAST_GROWTH: f64 = 0.25;
/// Consecutive windows with requests refused (or nearly) before a probe: sustained overload.
const PRESSED_BEFORE_PROBE: u32 = 4;
/// Added back after a cut: where cut and allowance balance is the equilibrium, a little above
/// the tolerance (`limit × (1 − gradient) = allowance`).
const QUEUE_ALLOWANCE: f64 = 1.0;
/// Without an answer for this long (µs), the window in progress is dropped.
const IDLE_GAP_US: u64 = 1_000_000;
/// Weight of a window's median in the smoothed median the baseline follows down.
const SMOOTHING: f64 = 0.3;
/// The start-up probe's share of the initial limit.
const START_UP_SHARE: f64 = 0.25;
/// While shedding, at most one probe window per this long (µs), on the clock's grid ...
const PROBE_INTERVAL_US: u64 = 10_000_000;
/// ... doubled after each probe that found the baseline right, up to this.
const MAX_PROBE_INTERVAL_US: u64 = 160_000_000;
/// A probe window runs at this share of the queue-free estimate.
const PROBE_SHARE: f64 = 0.75;

/// The controller's settings (from `[upstream.adaptive]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub min_limit: u32,
    pub max_limit: u32,
    pub initial_limit: u32,
    /// How much slower than the ideal latency the median may get before the limit shrinks.
    pub tolerance: f64,
    pub window: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self { min_limit: 2, max_limit: 1000, initial_limit: 20, tolerance: 1.25, window: Duration::from_millis(250) }
    }
}

/// How the last judged window was read (for metrics and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    Queueing,
}

/// A probe window in progress.
#[derive(Debug, Clone, Copy)]
struct Probe {
    /// The limit before it, restored (scaled) when it ends.
    before: f64,
    /// The ideal latency before it (µs); 0: the start-up probe.
    ideal_before: u64,
    /// When it started (µs): at its first sample for the start-up probe.
    started_us: Option<u64>,
    /// Taken because the baseline could not be right (`IMPLAUSIBLE`): what it measures is
    /// taken whole, not halfway.
    doubted: bool,
}

#[derive(Debug, Clone)]
pub struct Controller {
    settings: Settings,
    limit: f64,
    /// Start-up: the limit doubles per healthy window until a window shows queueing.
    slow_start: bool,
    window_start_us: Option<u64>,
    latencies_us: Vec<u64>,
    seen_in_window: usize,
    /// The sum of every latency seen in the window (µs), kept or not: its mean and its work.
    sum_us: u64,
    /// How long the last window took to fill (µs): a probe is given a few of those.
    last_window_us: u64,
    peak_in_flight: u32,
    /// The lowest window median since the last probe (µs): the latency without a queue.
    ideal_us: Option<u64>,
    /// Window medians smoothed (µs): the baseline follows these down, not single windows, so
    /// that noise does not drag it ever lower over hours.
    smoothed_us: f64,
    last_verdict: Option<Verdict>,
    /// When the last probe started (µs); `None`: never, so the first overload probes at once.
    last_probe_us: Option<u64>,
    /// The current probe interval (µs): doubles while probes confirm the baseline.
    probe_interval_us: u64,
    /// Probes so far, the start-up one excluded.
    probes: u64,
    /// During a probe window: the limit and ideal from before it, and when it started.
    probing: Option<Probe>,
    last_sample_us: Option<u64>,
    /// Consecutive windows whose peak reached the limit.
    pressed_windows: u32,
}

impl Controller {
    pub fn new(settings: Settings) -> Self {
        let (min, max) = (f64::from(settings.min_limit), f64::from(settings.max_limit));
        let initial = f64::from(settings.initial_limit).clamp(min, max);
        Self {
            settings,
            // Start-up: the first window is a probe at a quarter of the initial limit, so that
            // the baseline is not measured in a queue that Weir's own traffic built.
            limit: (initial * START_UP_SHARE).floor().clamp(min, max),
            slow_start: true,
            window_start_us: None,
            latencies_us: Vec::with_capacity(64),
            seen_in_window: 0,
            sum_us: 0,
            last_window_us: 0,
            peak_in_flight: 0,
            ideal_us: None,
            smoothed_us: 0.0,
            last_verdict: None,
            last_probe_us: None,
            probe_interval_us: PROBE_INTERVAL_US,
            probes: 0,
            probing: Some(Probe { before: initial, ideal_before: 0, started_us: None, doubted: false }),
            last_sample_us: None,
            pressed_windows: 0,
        }
    }

    /// The current limit (whole requests).
    pub fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// The upstream's latency without a queue, as learned; `None` before the first window.
    pub fn ideal(&self) -> Option<Duration> {
        self.ideal_us.map(Duration::from_micros)
    }

    pub fn last_verdict(&self) -> Option<Verdict> {
        self.last_verdict
    }

    /// Probes made so far (the start-up probe excluded).
    pub fn probes(&self) -> u64 {
        self.probes
    }

    /// Whether a probe window is running (start-up included).
    pub fn probing(&self) -> bool {
        self.probing.is_some()
    }

    /// During a probe: the limit it returns to if called off.
    #[cfg(test)]
    fn probing_from(&self) -> Option<u32> {
        self.probing.map(|p| p.before as u32)
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// New settings on reload: what was learned stays, within the new bounds.
    pub fn reconfigure(&mut self, settings: Settings) {
        self.settings = settings;
        self.limit = self.limit.clamp(f64::from(settings.min_limit), f64::from(settings.max_limit));
    }

    /// Requests in flight now (after a place was taken): the window's peak.
    pub fn observe_in_flight(&mut self, in_flight: u32) {
        self.peak_in_flight = self.peak_in_flight.max(in_flight);
    }

    /// A probe running past its deadline is called off (the limit from before it returns, the
    /// baseline stays). The limiter calls this before it admits while a probe runs, so that a
    /// probe ends even when no answer comes (every place held by requests that do not end).
    pub fn expire(&mut self, now_us: u64) {
        let Some(probe) = self.probing else { return };
        let window = (self.settings.window.as_micros() as u64).max(self.last_window_us);
        let deadline = PROBE_DEADLINE_US.max(4 * window);
        if probe.started_us.is_some_and(|at| now_us.saturating_sub(at) > deadline) {
            self.probing = None;
            self.limit = probe.before;
            self.clear_window();
        }
    }

    fn clear_window(&mut self) {
        self.window_start_us = None;
        self.latencies_us.clear();
        self.seen_in_window = 0;
        self.sum_us = 0;
    }

    /// One answer's latency, ending at `now_us`, with `in_flight` places still taken after it.
    /// Returns the verdict when it closed a window.
    pub fn sample(&mut self, now_us: u64, latency: Duration, in_flight: u32) -> Option<Verdict> {
        self.expire(now_us);
        if let Some(probe) = &mut self.probing {
            probe.started_us.get_or_insert(now_us);
        }
        if self.probing.is_some() && f64::from(in_flight) > self.limit {
            // A probe measures once the queue from before it has drained (or its deadline).
            self.clear_window();
            self.last_sample_us = Some(now_us);
            return None;
        }
        let last = self.last_sample_us.replace(now_us);
        let gap = last.map_or(0, |last| now_us.saturating_sub(last));
        if gap > IDLE_GAP_US {
            // The upstream had no traffic: a window half from before the pause says nothing
            // about now. Start a new one; what was learned stays (a probe is called off).
            if let Some(probe) = self.probing.take() {
                self.limit = probe.before;
            }
            self.peak_in_flight = in_flight;
            self.clear_window();
        }
        let start = *self.window_start_us.get_or_insert(now_us);
        let us = latency.as_micros().min(u128::from(u64::MAX / 2)) as u64;
        if self.latencies_us.len() < MAX_KEPT {
            self.latencies_us.push(us);
        } else {
            let slot = self.seen_in_window % MAX_KEPT;
            self.latencies_us[slot] = us;
        }
        self.seen_in_window += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        let long_enough = now_us.saturating_sub(start) >= self.settings.window.as_micros() as u64;
        if !(long_enough && self.seen_in_window >= MIN_SAMPLES) {
            return None;
        }
        self.last_window_us = now_us.saturating_sub(start);
        let verdict = self.close_window(now_us, self.last_window_us);
        self.window_start_us = Some(now_us);
        Some(verdict)
    }

    fn close_window(&mut self, now_us: u64, length_us: u64) -> Verdict {
        let mid = self.latencies_us.len() / 2;
        let median = *self.latencies_us.select_nth_unstable(mid).1;
        // The tail after the median's selection: the upper half is above `mid`, unordered.
        let tail_at =
            ((self.latencies_us.len() as f64 * TAIL_QUANTILE) as usize).clamp(mid, self.latencies_us.len() - 1);
        let tail = *self.latencies_us.select_nth_unstable(tail_at).1;
        let mean = self.sum_us as f64 / self.seen_in_window.max(1) as f64;
        // Little's law: the requests the upstream held on average while this window's answers
        // were made (what the window asked of it, whatever number of places it took).
        let work = self.sum_us as f64 / length_us.max(1) as f64;
        self.clear_window();
        let peak = f64::from(std::mem::take(&mut self.peak_in_flight));
        let median = median.max(1);
        // Most answers far cheaper than where the upstream's time goes: this median is not the
        // latency of the upstream's work, and must not become the baseline.
        let mixed = mean > MIXED * median as f64;
        // A probe's window measures the latency without a queue: it replaces the baseline, down
        // at once, up by half (the upstream may have become slower for good). Other windows only
        // lower it. A mixed window lowers nothing.
        let ideal_us = match (self.probing.is_some(), self.ideal_us) {
            (false, Some(ideal)) if mixed => ideal,
            (false, Some(ideal)) => {
                self.smoothed_us += SMOOTHING * (median as f64 - self.smoothed_us);
                ideal.min(self.smoothed_us as u64)
            }
            // A probe raises the baseline halfway to what it measured: one window's noise must
            // not ratchet it up probe after probe; a slower upstream is learned in a few probes.
            // A probe taken because the baseline was implausibly low takes what it measured.
            (true, Some(ideal)) if median > ideal => {
                let doubted = self.probing.is_some_and(|p| p.doubted);
                let raised = if doubted { median } else { ideal + (median - ideal) / 2 };
                self.smoothed_us = raised as f64;
                raised
            }
            (true, Some(ideal)) if mixed => ideal,
            _ => {
                self.smoothed_us = median as f64;
                median
            }
        };
        self.ideal_us = Some(ideal_us);
        let ideal = ideal_us as f64;
        let tolerated = self.settings.tolerance * ideal;
        let (min, max) = (f64::from(self.settings.min_limit), f64::from(self.settings.max_limit));
        if let Some(Probe { before, ideal_before, .. }) = self.probing.take() {
            // The probe's answer: back to the limit from before, scaled by what the baseline
            // learned (a queue hidden in the old baseline is now removed). A probe that found
            // one may be followed by another at once. The start-up probe (no baseline before)
            // goes back to the initial limit.
            let scale = if ideal_before == 0 { 1.0 } else { ideal / ideal_before as f64 };
            self.limit = (before * scale).clamp(min, max);
            // A probe that confirmed the baseline makes the next one wait twice as long: a
            // sustained overload pays for fewer and fewer probes (the interval is the same on
            // every instance that saw the same, so a fleet stays on one grid).
            let confirmed = (0.9..=1.1).contains(&scale) && ideal_before > 0;
            self.probe_interval_us =
                if confirmed { (self.probe_interval_us * 2).min(MAX_PROBE_INTERVAL_US) } else { PROBE_INTERVAL_US };
            if ideal_before > 0 && ideal < ideal_before as f64 * 0.9 {
                self.last_probe_us = None;
            }
            self.last_verdict = Some(Verdict::Healthy);
            return Verdict::Healthy;
        }
        // Requests were refused (or nearly) in this window; the limit was used (at least half).
        let pressed = peak >= self.limit.floor();
        let used = peak * 2.0 >= self.limit.floor();
        // The tail too: bursts (of a higher priority using its reserve) that take the places in
        // flight up to the limit show in the upper quartile before the median.
        let tail_bound = TAIL_TOLERANCE * ideal;
        let gradient = (tolerated / median as f64).min(tail_bound / tail.max(1) as f64).clamp(MAX_DECREASE, 1.0);
        self.pressed_windows = if pressed { self.pressed_windows + 1 } else { 0 };
        let verdict = if gradient >= 1.0 {
            if used {
                // Near the tolerance, every instance adds the same step (fair shares); well
                // below it there is no queue to fear, and a limit cut by a burst comes back fast.
                let clear = (median as f64) < ideal * (1.0 + (self.settings.tolerance - 1.0) / 2.0);
                let step = if self.slow_start {
                    self.limit
                } else if clear {
                    (self.limit * FAST_GROWTH).max(GROWTH_STEP)
                } else {
                    GROWTH_STEP
                };
                // Never beyond a few times the work the window actually asked of the upstream.
                let earned = (WORK_HEADROOM * (work + 3.0 * work.sqrt())).max(self.limit);
                self.limit = (self.limit + step).min(earned).clamp(min, max);
            }
            Verdict::Healthy
        } else {
            self.slow_start = false;
            // Gradient2's form: the cut is proportional to the excess latency and a step is
            // added back, so instances whose baselines differ by noise settle at different but
            // stable shares instead of one cutting while the other grows. A limit far above
            // what was used falls to twice the use, then by the gradient.
            self.limit =
                if used { self.limit * gradient + QUEUE_ALLOWANCE } else { self.limit.min(2.0 * peak) * gradient }
                    .clamp(min, max);
            Verdict::Queueing
        };
        // Due on a grid of the clock: instances of a fleet (wall clocks within a window of each
        // other) probe together, so together they drain the upstream's queue and each sees it.
        let every = self.probe_interval_us;
        let probe_due = self.last_probe_us.is_none_or(|at| now_us / every > at / every);
        let doubted = median as f64 > IMPLAUSIBLE * peak.max(1.0) * ideal;
        if doubted || (self.pressed_windows >= PRESSED_BEFORE_PROBE && probe_due) {
            self.probe(now_us, peak, median, ideal, doubted);
        }
        self.last_verdict = Some(verdict);
        verdict
    }

    /// The limit is pressed on (requests are being refused): the baseline may hide a queue (it
    /// was first measured under load, or load never let up). One window runs at ¾ of the
    /// queue-free estimate (`peak × ideal / median`); if a queue was hidden, that window's median
    /// is lower and becomes the baseline. Only while shedding anyway — never below capacity,
    /// never at a fixed floor — and at most every `probe_interval_us` (10 s, doubling up to 160 s
    /// while probes confirm the baseline).
    ///
    /// A `doubted` baseline (a latency no queue of this instance could explain) is probed at
    /// once, at ¾ of the peak in flight.
    fn probe(&mut self, now_us: u64, peak: f64, median: u64, ideal: f64, doubted: bool) {
        let (min, max) = (f64::from(self.settings.min_limit), f64::from(self.settings.max_limit));
        self.last_probe_us = Some(now_us);
        self.probes += 1;
        self.probing =
            Some(Probe { before: self.limit, ideal_before: ideal as u64, started_us: Some(now_us), doubted });
        let queue_free = if doubted { peak } else { peak * (ideal / median as f64).min(1.0) };
        self.limit = (queue_free * PROBE_SHARE).clamp(min, max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::admission::Priority;
    use crate::adaptive::sim::{Client, Second, Sim};

    const SERVICE: Duration = Duration::from_millis(20);
    /// Twice the simulated upstream's unloaded p99 (service time + 20 %).
    const P99_BOUND_US: u64 = 48_000;

    fn one_client(rate: f64) -> Sim {
        Sim::new(SERVICE, vec![Client::new(Settings::default(), vec![(Priority::Normal, rate)])])
    }

    fn goodput(seconds: &[Second]) -> f64 {
        seconds.iter().map(|s| s.good.iter().sum::<u64>() as f64).sum::<f64>() / seconds.len() as f64
    }

    fn worst_p99_us(seconds: &[Second]) -> u64 {
        seconds.iter().map(Second::p99_us).max().unwrap_or(0)
    }

    #[test]
    fn under_twice_its_capacity_the_upstream_is_kept_busy_without_a_queue() {
        // 10 servers × 20 ms = 500 requests/s; 1000 offered.
        let mut sim = one_client(1000.0);
        let run = sim.run(30, 10);
        let settled = &run[5..];
        let goodput = goodput(settled);
        assert!(goodput >= 450.0, "goodput {goodput}/s of 500");
        let p99 = worst_p99_us(settled);
        assert!(p99 <= P99_BOUND_US, "p99 {p99} µs against 20 ms unloaded");
    }

    #[test]
    fn below_capacity_nothing_is_shed() {
        for rate in [50.0, 200.0, 350.0] {
            let mut sim = one_client(rate);
            // After the start-up window (start_up_refuses_only_during_its_first_window).
            sim.run(1, 10);
            let run = sim.run(60, 10);
            let shed: u64 = run.iter().map(Second::total_shed).sum();
            assert_eq!(shed, 0, "at {rate}/s of 500: {shed} shed");
        }
        // At 80 % random arrivals queue at the upstream itself now and then (p99 over twice the
        // unloaded latency): the limit reacts to those bursts, and sheds next to nothing
        // (measured: 45 of 24 000, 0.19 %).
        let mut sim = one_client(400.0);
        sim.run(1, 10);
        let run = sim.run(60, 10);
        let shed: u64 = run.iter().map(Second::total_shed).sum();
        assert!(shed * 400 <= 400 * 60, "at 400/s of 500: {shed} shed");
    }

    #[test]
    fn a_capacity_drop_and_rise_are_followed_within_five_seconds() {
        let mut sim = one_client(1000.0);
        let before = sim.run(20, 10);
        let dropped = sim.run(20, 5);
        let raised = sim.run(20, 10);
        assert!(goodput(&before[5..]) >= 450.0);
        let after_drop = &dropped[5..];
        assert!(goodput(after_drop) >= 225.0, "goodput {} of 250 after the drop", goodput(after_drop));
        assert!(worst_p99_us(after_drop) <= P99_BOUND_US, "p99 {} after the drop", worst_p99_us(after_drop));
        let after_rise = &raised[5..];
        assert!(goodput(after_rise) >= 450.0, "goodput {} of 500 after the rise", goodput(after_rise));
        assert!(worst_p99_us(after_rise) <= P99_BOUND_US);
    }

    #[test]
    fn the_limit_stays_within_its_bounds() {
        let settings = Settings { min_limit: 5, max_limit: 12, ..Settings::default() };
        // Far more capacity than the max: the limit stops at max.
        let mut sim = Sim::new(SERVICE, vec![Client::new(settings, vec![(Priority::Normal, 3000.0)])]);
        let run = sim.run(20, 100);
        assert!(run.iter().all(|s| s.limits[0] <= 12));
        assert_eq!(run.last().map(|s| s.limits[0]), Some(12));
        // Far less (one server): it stays at or just above min, never below.
        let mut sim = Sim::new(SERVICE, vec![Client::new(settings, vec![(Priority::Normal, 3000.0)])]);
        let run = sim.run(20, 1);
        assert!(run.iter().all(|s| s.limits[0] >= 5));
        assert!(
            run[10..].iter().all(|s| s.limits[0] <= 8),
            "{:?}",
            run.iter().map(|s| s.limits[0]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn two_instances_sharing_one_upstream_settle_without_oscillating() {
        let client = || Client::new(Settings::default(), vec![(Priority::Normal, 500.0)]);
        let mut sim = Sim::new(SERVICE, vec![client(), client()]);
        let run = sim.run(60, 10);
        let settled = &run[10..];
        assert!(goodput(settled) >= 450.0, "goodput {}", goodput(settled));
        assert!(worst_p99_us(settled) <= P99_BOUND_US, "p99 {}", worst_p99_us(settled));
        for s in settled {
            let (a, b) = (s.limits[0], s.limits[1]);
            let sum = a + b;
            // Neither starves the other, and together they hold the upstream near its 10.
            assert!(a.min(b) * 3 >= a.max(b), "limits {a} and {b}");
            assert!((10..=20).contains(&sum), "limits sum to {sum}");
        }
        // No oscillation: from one second to the next, the sum moves little.
        for pair in settled.windows(2) {
            let (before, after) = (pair[0].limits.iter().sum::<u32>(), pair[1].limits.iter().sum::<u32>());
            assert!(before.abs_diff(after) <= 5, "the sum jumped from {before} to {after}");
        }
        // Each gets a share worth having over the run.
        let served: Vec<u64> = (0..2).map(|c| settled.iter().map(|s| s.served[c]).sum()).collect();
        let ratio = served[0] as f64 / served[1] as f64;
        assert!((0.5..=2.0).contains(&ratio), "served {served:?}");
    }

    #[test]
    fn an_idle_upstream_keeps_what_was_learned() {
        let mut sim = one_client(1000.0);
        sim.run(20, 10);
        sim.clients[0].rates = vec![(Priority::Normal, 0.0)];
        let idle = sim.run(60, 10);
        // (The requests still in flight when the traffic stopped end in its first second.)
        let learned = idle[0].limits[0];
        assert!(idle.iter().all(|s| s.limits[0] == learned), "the limit moved without traffic");
        // Traffic below capacity after the pause: next to nothing shed (the limit learned under
        // overload, 13 or so, meets Poisson bursts of a 60 % load before it grows again).
        sim.clients[0].rates = vec![(Priority::Normal, 300.0)];
        let back = sim.run(20, 10);
        let shed = back.iter().map(Second::total_shed).sum::<u64>();
        assert!(shed <= 300 * 20 / 1000, "{shed} shed");
    }

    #[test]
    fn under_overload_high_priority_keeps_its_success_rate() {
        let rates = vec![(Priority::High, 250.0), (Priority::Low, 750.0)];
        let mut sim = Sim::new(SERVICE, vec![Client::new(Settings::default(), rates)]);
        let run = sim.run(40, 10);
        let settled = &run[5..];
        let (high_sent, high_shed) =
            settled.iter().fold((0, 0), |(a, b), s| (a + s.by_priority[2].0, b + s.by_priority[2].1));
        let (low_sent, low_shed) =
            settled.iter().fold((0, 0), |(a, b), s| (a + s.by_priority[0].0, b + s.by_priority[0].1));
        let high_ok = 1.0 - high_shed as f64 / high_sent as f64;
        assert!(high_ok >= 0.99, "high priority: {high_shed} of {high_sent} shed");
        assert!(low_shed as f64 >= 0.4 * low_sent as f64, "low priority absorbs: {low_shed} of {low_sent}");
        assert!(goodput(settled) >= 450.0);
    }

    #[test]
    fn start_up_probes_once_then_doubles_until_the_first_queue() {
        let mut c = Controller::new(Settings::default());
        // The first window runs at a quarter of the initial limit and sets the baseline ...
        assert_eq!(c.limit(), 5);
        let mut now = 0;
        // `in_flight` requests of `latency` ms each, back to back (an answer every latency /
        // in_flight: what the upstream is asked is what is in flight), until a window closes.
        let mut window = |c: &mut Controller, in_flight: u32, latency: u64| {
            let every = latency * 1000 / u64::from(in_flight);
            loop {
                c.observe_in_flight(in_flight);
                now += every;
                if c.sample(now, Duration::from_millis(latency), in_flight.saturating_sub(1)).is_some() {
                    break;
                }
            }
        };
        window(&mut c, 5, 10);
        assert_eq!(c.ideal(), Some(Duration::from_millis(10)));
        // ... then the initial limit applies and doubles while latency holds.
        assert_eq!(c.limit(), 20);
        window(&mut c, 15, 10);
        assert_eq!(c.limit(), 40);
        window(&mut c, 30, 11);
        assert_eq!(c.limit(), 80);
        // The first queue ends the doubling: 80 × 1.25 × 10 / 25 + 1.
        window(&mut c, 80, 25);
        assert_eq!(c.limit(), 41);
        assert_eq!(c.last_verdict(), Some(Verdict::Queueing));
    }

    #[test]
    fn a_slower_upstream_is_learned_through_probes() {
        // Overloaded at 20 ms, then the service time doubles for good.
        let mut sim = one_client(1000.0);
        sim.run(20, 10);
        let before = sim.clients[0].controller.ideal().unwrap_or_default();
        assert!(before < Duration::from_millis(22), "ideal {before:?}");
        sim.set_service(Duration::from_millis(40));
        let run = sim.run(60, 10);
        let after = sim.clients[0].controller.ideal().unwrap_or_default();
        assert!(after >= Duration::from_millis(35), "ideal {after:?} for a 40 ms upstream");
        // Capacity is now 250/s: served again once the baseline moved.
        let served: u64 = run[40..].iter().map(Second::total_served).sum::<u64>() / 20;
        assert!(served >= 225, "{served}/s of 250");
    }

    #[test]
    fn probes_grow_rare_while_they_confirm_the_baseline() {
        // Sustained 2x overload for 5 minutes: probes at 10, 20, 40, 80, 160 s apart at most.
        let mut sim = one_client(1000.0);
        let run = sim.run(300, 10);
        let probes = sim.clients[0].controller.probes();
        // Every 10 s would be about 30; doubling from 10 s to 160 s: 10 + 20 + 40 + 80 + 160 > 300.
        assert!((1..=6).contains(&probes), "{probes} probes in 300 s");
        assert!(goodput(&run[5..]) >= 450.0);
    }

    #[test]
    fn the_start_up_probe_holds_on_a_wall_clock() {
        // The first sample's time is far from zero (µs since 1970): no "idle gap" before it.
        let mut c = Controller::new(Settings::default());
        c.sample(1_790_000_000_000_000, Duration::from_millis(10), 0);
        assert_eq!(c.limit(), 5);
    }

    #[test]
    fn start_up_refuses_only_during_its_first_window() {
        let mut sim = one_client(250.0);
        let run = sim.run(30, 10);
        assert!(run[0].total_shed() > 0, "the start-up probe runs at 5 of 20 places");
        assert_eq!(run[1..].iter().map(Second::total_shed).sum::<u64>(), 0);
    }

    #[test]
    fn a_tail_over_the_objective_cuts_even_with_a_healthy_median() {
        let mut c = Controller::new(Settings::default());
        let mut now = 0;
        // Start-up: a baseline of 10 ms, then the initial 20.
        for _ in 0..MIN_SAMPLES {
            c.observe_in_flight(5);
            now += 20_000;
            c.sample(now, Duration::from_millis(10), 4);
        }
        assert_eq!(c.limit(), 20);
        // The limit is used; the median stays at the ideal, but a burst queued 12 answers of 32
        // (37 %) to 3x: the upper quartile is over 1.5x, so the window is queueing and the limit
        // shrinks.
        let mut window = |c: &mut Controller, slow: usize, slow_ms: u64| {
            for i in 0..MIN_SAMPLES {
                c.observe_in_flight(20);
                now += 20_000;
                let ms = if i < slow { slow_ms } else { 10 };
                c.sample(now, Duration::from_millis(ms), 19);
            }
        };
        window(&mut c, 12, 30);
        assert_eq!(c.last_verdict(), Some(Verdict::Queueing));
        // 20 x min(1.25, 1.5 x 10 / 30 = 0.5) + 1 = 11.
        assert_eq!(c.limit(), 11);
        // Four slow answers in 32 (12 %: a heavy endpoint, or one client's slow answers) are
        // under the upper quartile: no cut. (Judged by the p95, as before issue 46, two would
        // have cut it.)
        let before = c.limit();
        window(&mut c, 4, 400);
        assert_eq!(c.last_verdict(), Some(Verdict::Healthy));
        assert!(c.limit() >= before);
    }

    #[test]
    fn a_probe_that_cannot_drain_ends_by_its_deadline() {
        let mut c = Controller::new(Settings::default());
        let mut now = 0;
        for _ in 0..MIN_SAMPLES {
            c.observe_in_flight(5);
            now += 20_000;
            c.sample(now, Duration::from_millis(10), 4);
        }
        assert_eq!(c.limit(), 20);
        // Pressed on (every place taken, healthy latency): after 4 windows a probe starts.
        let press = |c: &mut Controller, now: &mut u64| {
            for _ in 0..100_000 {
                if c.probing() {
                    return;
                }
                let in_flight = c.limit();
                c.observe_in_flight(in_flight);
                *now += 1_000;
                c.sample(*now, Duration::from_millis(10), in_flight);
            }
            panic!("no probe under sustained pressure");
        };
        press(&mut c, &mut now);
        let held = c.probing_from().unwrap_or_default();
        let probe_limit = c.limit();
        assert!(probe_limit < held, "the probe runs at {probe_limit} of {held}");
        let started = now;
        // Slow readers hold every place from before and never end: the probe's samples are all
        // dropped (in flight above its limit), and it is called off at its deadline, the limit
        // restored.
        while c.probing() {
            now += 10_000;
            c.sample(now, Duration::from_millis(10), held);
            assert!(now - started <= PROBE_DEADLINE_US + 10_000, "still probing after {} µs", now - started);
        }
        assert!(now - started >= PROBE_DEADLINE_US, "called off after {} µs", now - started);
        assert_eq!(c.limit(), held);
        // And without any answer at all: the limiter's `expire` ends it.
        press(&mut c, &mut now);
        let held = c.probing_from().unwrap_or_default();
        c.expire(now + PROBE_DEADLINE_US / 2);
        assert!(c.probing());
        c.expire(now + PROBE_DEADLINE_US + 1);
        assert!(!c.probing());
        assert_eq!(c.limit(), held);
    }

    #[test]
    fn an_unused_limit_does_not_grow() {
        let mut c = Controller::new(Settings::default());
        let mut now = 0;
        for _ in 0..10 * MIN_SAMPLES {
            c.observe_in_flight(3);
            now += 20_000;
            c.sample(now, Duration::from_millis(10), 0);
        }
        assert_eq!(c.limit(), 20);
    }
}

/// The benchmark's shape on the simulated clock (bench/adaptive/run.py): K servers × 100 ms, 2x
/// overload with 15 % high priority, K 8 → 4 → 8; judged per second as the benchmark judges
/// its 1-s windows (goodput ≥ 90 % of capacity, p99 within 2x the unloaded p99).
#[cfg(test)]
mod capacity_changes {
    use super::*;
    use crate::adaptive::admission::Priority;
    use crate::adaptive::sim::{Client, Second, Sim};

    const SERVICE: Duration = Duration::from_millis(100);
    /// Twice the simulated upstream's unloaded p99 (100 ms + 20 % jitter).
    const P99_BOUND_US: u64 = 240_000;

    fn fleet(n: usize, offered: f64) -> Sim {
        let clients = (0..n).map(|_| Client::new(Settings::default(), rates(n, offered))).collect();
        Sim::new(SERVICE, clients)
    }

    fn rates(n: usize, offered: f64) -> Vec<(Priority, f64)> {
        let each = offered / n as f64;
        vec![(Priority::High, 0.15 * each), (Priority::Low, 0.85 * each)]
    }

    fn offer(sim: &mut Sim, offered: f64) {
        let n = sim.clients.len();
        for c in &mut sim.clients {
            c.rates = rates(n, offered);
        }
    }

    fn met(s: &Second, k: u64) -> bool {
        s.good.iter().sum::<u64>() * 10 >= k * 10 * 9 && s.p99_us() <= P99_BOUND_US
    }

    /// (first second that met the target, share of the later seconds that missed it).
    fn convergence(run: &[Second], k: u64) -> (usize, f64) {
        let first = run.iter().position(|s| met(s, k)).unwrap_or(run.len());
        let later = &run[first.min(run.len())..];
        let missed = later.iter().filter(|s| !met(s, k)).count();
        (first, missed as f64 / later.len().max(1) as f64)
    }

    fn limit_sums(run: &[Second]) -> Vec<u32> {
        run.iter().map(|s| s.limits.iter().sum()).collect()
    }

    fn drop_and_rise(n: usize) {
        let mut sim = fleet(n, 160.0);
        sim.run(20, 8);
        offer(&mut sim, 80.0);
        let dropped = sim.run(20, 4);
        offer(&mut sim, 160.0);
        let raised = sim.run(20, 8);
        for (name, run, k) in [("drop", &dropped, 4), ("rise", &raised, 8)] {
            let (first, missed) = convergence(run, k);
            let sums = limit_sums(run);
            assert!(first < 5, "{n} instance(s), {name}: first met in second {first}; limits {sums:?}");
            assert!(missed <= 0.2, "{n} instance(s), {name}: {missed:.2} of the later seconds missed; limits {sums:?}");
            // No oscillation: once met, the limits' sum stays within a band of its median.
            let mut settled = sums[first..].to_vec();
            settled.sort_unstable();
            let median = settled[settled.len() / 2];
            let (lo, hi) = (settled[0], settled[settled.len() - 1]);
            assert!(hi <= 2 * median && 2 * lo >= median, "{n} instance(s), {name}: limits {sums:?}");
        }
    }

    #[test]
    fn one_instance_follows_a_drop_and_a_rise_within_five_seconds() {
        drop_and_rise(1);
    }

    #[test]
    fn a_fleet_of_two_follows_a_drop_and_a_rise_within_five_seconds() {
        drop_and_rise(2);
    }

    #[test]
    fn under_overload_high_priority_is_served_through_the_changes() {
        let mut sim = fleet(2, 160.0);
        let mut runs = sim.run(20, 8);
        offer(&mut sim, 80.0);
        runs.extend(sim.run(20, 4));
        offer(&mut sim, 160.0);
        runs.extend(sim.run(20, 8));
        let (sent, shed) = runs[2..].iter().fold((0, 0), |(a, b), s| (a + s.by_priority[2].0, b + s.by_priority[2].1));
        assert!(shed * 100 <= sent, "high priority: {shed} of {sent} shed");
    }

    #[test]
    fn below_capacity_after_the_changes_nothing_is_shed() {
        let mut sim = fleet(2, 160.0);
        sim.run(20, 8);
        offer(&mut sim, 80.0);
        sim.run(20, 4);
        offer(&mut sim, 160.0);
        sim.run(20, 8);
        offer(&mut sim, 48.0);
        let run = sim.run(30, 8);
        // The first second still holds the overload's tail (its places are still taken).
        let shed: Vec<u64> = run[1..].iter().map(Second::total_shed).collect();
        assert_eq!(shed.iter().sum::<u64>(), 0, "shed per second at 60 % of capacity: {shed:?}");
    }
}
