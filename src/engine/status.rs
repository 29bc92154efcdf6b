//! nginx's status words (`$limit_req_status`, `$limit_conn_status`) for the zones of one request,
//! and the one that describes the request as a whole. limit_req and limit_conn record theirs with
//! the same functions, and the logging phase counts both with the same one.

/// nginx's `$limit_req_status` words (limit_conn uses PASSED, REJECTED and REJECTED_DRY_RUN).
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

    /// Its place among the words (0..5), for the metric handles (`metrics::ZoneMeters`).
    pub fn slot(self) -> usize {
        self as usize
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

    /// One zone's word, from what the store said of the request and of the zone; `None` when
    /// another zone rejected the request, so this one was not charged and has no say.
    pub fn of_zone(request_admitted: bool, zone_admitted: bool, delayed: bool, dry_run: bool) -> Option<Self> {
        Some(match (request_admitted, zone_admitted, delayed, dry_run) {
            (_, false, _, false) => LimitStatus::Rejected,
            (_, false, _, true) => LimitStatus::RejectedDryRun,
            (false, true, _, _) => return None,
            (true, true, true, false) => LimitStatus::Delayed,
            (true, true, true, true) => LimitStatus::DelayedDryRun,
            (true, true, false, _) => LimitStatus::Passed,
        })
    }

    /// The word of a request whose zones said `self` and `so_far`.
    pub fn worst(self, so_far: Option<LimitStatus>) -> LimitStatus {
        match so_far {
            Some(s) if s.severity() >= self.severity() => s,
            _ => self,
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

/// limit_conn's statuses for one request (limit_req's are in its zones' results, `ZoneResult`).
#[derive(Debug, Clone, Default)]
pub struct Statuses {
    /// The request's status: the most severe of its zones'; `None` when no zone had a say
    /// (nginx leaves the variable unset).
    pub overall: Option<LimitStatus>,
    /// Per zone that had a say: (zone index in the snapshot's zone list, status).
    pub zones: Vec<(usize, LimitStatus)>,
}

impl Statuses {
    /// Records the words of one group of zones decided together. `zones` gives, per zone of the
    /// group: (zone index, whether the zone admitted, whether it delayed).
    pub fn record_group(
        &mut self,
        request_admitted: bool,
        dry_run: bool,
        zones: impl Iterator<Item = (usize, bool, bool)>,
    ) {
        for (zone, zone_admitted, delayed) in zones {
            if let Some(status) = LimitStatus::of_zone(request_admitted, zone_admitted, delayed, dry_run) {
                self.record(zone, status);
            }
        }
    }

    /// Records one zone's word; the request's becomes it if it is more severe.
    pub fn record(&mut self, zone: usize, status: LimitStatus) {
        self.zones.push((zone, status));
        self.overall = Some(status.worst(self.overall));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_severe_word_describes_the_request() {
        let mut s = Statuses::default();
        s.record(0, LimitStatus::Passed);
        s.record(1, LimitStatus::RejectedDryRun);
        s.record(2, LimitStatus::Delayed);
        s.record(3, LimitStatus::DelayedDryRun);
        assert_eq!(s.overall, Some(LimitStatus::Delayed));
        assert_eq!(s.zones.len(), 4);
    }

    #[test]
    fn a_zone_another_one_rejected_has_no_say() {
        assert_eq!(LimitStatus::of_zone(false, true, false, false), None);
        assert_eq!(LimitStatus::of_zone(false, false, false, true), Some(LimitStatus::RejectedDryRun));
        assert_eq!(LimitStatus::of_zone(true, true, true, true), Some(LimitStatus::DelayedDryRun));
        assert_eq!(LimitStatus::of_zone(true, true, false, false), Some(LimitStatus::Passed));
    }
}
