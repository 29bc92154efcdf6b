//! One RLQS stream's state and its decisions, pure and on caller-given times: which buckets it
//! holds, when a report goes to the ledger and when it is only added up, when a clamped bucket is
//! asked again, and when a bucket has gone quiet and is abandoned. Hostile input is bounded
//! here: buckets per stream, messages per interval, and ledger work per bucket (at most one
//! report every half interval; more are added to the next).

use std::collections::HashMap;
use std::time::Duration;

use super::assign::Grant;
use crate::rls::proto::quota::BucketId;

/// A bucket with no request for this many report intervals is abandoned.
pub const QUIET_INTERVALS: u32 = 3;
/// Messages one stream may send per report interval (Envoy sends one per interval, plus one per
/// bucket it starts: a stream that starts `max_buckets` buckets at once stays under this).
pub const MESSAGES_PER_INTERVAL_BASE: u64 = 16;

/// What was last sent for a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    AllowAll,
    DenyAll,
    Bucket(Grant),
}

/// One bucket the stream holds.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// As Envoy sent it: echoed in every action.
    pub id: BucketId,
    /// Its holder name in the ledger (stream and bucket).
    pub holder: String,
    /// When its usage last went to the ledger; `None`: not yet.
    pub reported_us: Option<u64>,
    /// When a report last counted requests (or the bucket started).
    pub busy_us: u64,
    /// When Envoy last reported it at all.
    pub seen_us: u64,
    /// Usage added up since the last ledger report (reports that came too soon).
    pub pending: (u64, u64),
    /// Its last demand (requests per second).
    pub demand: f64,
    pub sent: Option<Sent>,
    /// Asked less than it got: ask again at this time.
    pub recheck_us: Option<u64>,
}

/// Why a stream is ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// INVALID_ARGUMENT
    Invalid(String),
    /// RESOURCE_EXHAUSTED
    Exhausted(String),
}

/// A bucket's report, once it is due for the ledger.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Due {
    pub allowed: u64,
    pub denied: u64,
    /// Since its previous ledger report, by Weir's clock.
    pub measured: Option<Duration>,
}

pub struct StreamState {
    /// The domain of the stream's first message.
    pub domain: Option<String>,
    /// Prefix of the stream's holder names: unique in the fleet.
    name: String,
    buckets: HashMap<Vec<u8>, Tracked>,
    window_start_us: u64,
    messages: u64,
}

impl StreamState {
    pub fn new(name: String, now_us: u64) -> Self {
        StreamState { domain: None, name, buckets: HashMap::new(), window_start_us: now_us, messages: 0 }
    }

    /// The stream's name (`<instance>-<n>`): its holders' prefix.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The first message names the domain; later ones may repeat it, not change it.
    pub fn domain_of(&mut self, domain: &str) -> Result<String, Refusal> {
        match (self.domain.as_deref(), domain) {
            (None, "") => Err(Refusal::Invalid("the stream's first report must name its domain".into())),
            (None, d) => {
                self.domain = Some(d.to_string());
                Ok(d.to_string())
            }
            (Some(mine), d) if d.is_empty() || d == mine => Ok(mine.to_string()),
            (Some(mine), d) => Err(Refusal::Invalid(format!(
                "a stream keeps the domain of its first report ({:?}, not {:?}): open another stream",
                crate::safe_text::escape(mine),
                crate::safe_text::escape(d)
            ))),
        }
    }

    /// Counts one message against the stream's budget per interval.
    pub fn message(&mut self, now_us: u64, interval: Duration, max_buckets: usize) -> Result<(), Refusal> {
        let window = interval.as_micros() as u64;
        if now_us.saturating_sub(self.window_start_us) >= window {
            self.window_start_us = now_us;
            self.messages = 0;
        }
        self.messages += 1;
        let allowed = MESSAGES_PER_INTERVAL_BASE + 2 * max_buckets as u64;
        if self.messages > allowed {
            return Err(Refusal::Exhausted(format!(
                "more than {allowed} reports in one report interval ({interval:?}): report once per interval"
            )));
        }
        Ok(())
    }

    /// A bucket's usage: whether it goes to the ledger now (`Some`) or is added up for later.
    pub fn usage(
        &mut self,
        now_us: u64,
        canonical: Vec<u8>,
        id: &BucketId,
        used: (u64, u64),
        interval: Duration,
        max_buckets: usize,
    ) -> Result<Option<Due>, Refusal> {
        let held = self.buckets.len();
        let name = &self.name;
        let tracked = match self.buckets.get_mut(&canonical) {
            Some(t) => t,
            None => {
                if held >= max_buckets {
                    return Err(Refusal::Exhausted(format!(
                        "a stream holds at most {max_buckets} buckets (rls.max_quota_buckets)"
                    )));
                }
                let holder = format!("{name}/{}", hex16(&canonical));
                let t = Tracked {
                    id: id.clone(),
                    holder,
                    reported_us: None,
                    busy_us: now_us,
                    seen_us: now_us,
                    pending: (0, 0),
                    demand: 0.0,
                    sent: None,
                    recheck_us: None,
                };
                self.buckets.entry(canonical).or_insert(t)
            }
        };
        tracked.seen_us = now_us;
        tracked.pending.0 = tracked.pending.0.saturating_add(used.0);
        tracked.pending.1 = tracked.pending.1.saturating_add(used.1);
        if used.0 > 0 || used.1 > 0 {
            tracked.busy_us = now_us;
        }
        let half = interval.as_micros() as u64 / 2;
        match tracked.reported_us {
            Some(at) if now_us.saturating_sub(at) < half => Ok(None),
            previous => {
                let (allowed, denied) = std::mem::take(&mut tracked.pending);
                tracked.reported_us = Some(now_us);
                let measured = previous.map(|at| Duration::from_micros(now_us.saturating_sub(at)));
                Ok(Some(Due { allowed, denied, measured }))
            }
        }
    }

    pub fn get(&self, canonical: &[u8]) -> Option<&Tracked> {
        self.buckets.get(canonical)
    }

    pub fn get_mut(&mut self, canonical: &[u8]) -> Option<&mut Tracked> {
        self.buckets.get_mut(canonical)
    }

    /// Forgets a bucket (not tracked by any rule any more, or abandoned).
    pub fn remove(&mut self, canonical: &[u8]) -> Option<Tracked> {
        self.buckets.remove(canonical)
    }

    /// Buckets gone quiet (no request for [`QUIET_INTERVALS`] intervals, or not reported for as
    /// long): to abandon.
    pub fn quiet(&self, now_us: u64, interval: Duration) -> Vec<Vec<u8>> {
        let quiet = interval.as_micros() as u64 * QUIET_INTERVALS as u64;
        self.buckets
            .iter()
            .filter(|(_, t)| now_us.saturating_sub(t.busy_us) >= quiet || now_us.saturating_sub(t.seen_us) >= quiet)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Clamped buckets whose time to ask again has come.
    pub fn rechecks(&self, now_us: u64) -> Vec<Vec<u8>> {
        self.buckets
            .iter()
            .filter(|(_, t)| t.recheck_us.is_some_and(|at| at <= now_us))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every bucket held: (canonical id, holder) (the stream's end).
    pub fn holders(&self) -> impl Iterator<Item = (&Vec<u8>, &Tracked)> {
        self.buckets.iter()
    }
}

/// How soon a clamped bucket asks again: a quarter of the interval.
pub fn recheck_after(interval: Duration) -> Duration {
    interval / 4
}

/// The first 8 bytes of the id's SHA-256, in hex: enough to tell one stream's buckets apart.
fn hex16(canonical: &[u8]) -> String {
    let hashed = crate::keys::hashed(canonical);
    // `hashed` is "#" + 64 hex digits.
    String::from_utf8_lossy(&hashed[1..17.min(hashed.len())]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;
    const I: Duration = Duration::from_secs(5);

    fn id() -> BucketId {
        BucketId { bucket: [("name".to_string(), "api".to_string())].into_iter().collect() }
    }

    #[test]
    fn the_domain_is_the_first_reports() {
        let mut s = StreamState::new("s1".into(), 0);
        assert!(matches!(s.domain_of(""), Err(Refusal::Invalid(_))));
        assert_eq!(s.domain_of("edge").unwrap(), "edge");
        assert_eq!(s.domain_of("").unwrap(), "edge");
        assert_eq!(s.domain_of("edge").unwrap(), "edge");
        assert!(matches!(s.domain_of("other"), Err(Refusal::Invalid(m)) if m.contains("open another stream")));
    }

    #[test]
    fn reports_sooner_than_half_an_interval_are_added_to_the_next() {
        let mut s = StreamState::new("s1".into(), 0);
        let first = s.usage(0, b"a".to_vec(), &id(), (1, 0), I, 10).unwrap();
        assert_eq!(first, Some(Due { allowed: 1, denied: 0, measured: None }));
        assert_eq!(s.usage(S, b"a".to_vec(), &id(), (5, 1), I, 10).unwrap(), None);
        let next = s.usage(5 * S, b"a".to_vec(), &id(), (3, 2), I, 10).unwrap();
        assert_eq!(next, Some(Due { allowed: 8, denied: 3, measured: Some(Duration::from_secs(5)) }));
        assert!(s.get(b"a").unwrap().holder.starts_with("s1/"));
    }

    #[test]
    fn buckets_and_messages_are_bounded() {
        let mut s = StreamState::new("s".into(), 0);
        for i in 0..3u8 {
            s.usage(0, vec![i], &id(), (1, 0), I, 3).unwrap();
        }
        assert!(matches!(s.usage(0, vec![9], &id(), (1, 0), I, 3), Err(Refusal::Exhausted(_))));
        assert!(s.usage(0, vec![1], &id(), (1, 0), I, 3).is_ok(), "a held bucket still reports");
        let allowed = MESSAGES_PER_INTERVAL_BASE + 6;
        for _ in 0..allowed {
            s.message(S, I, 3).unwrap();
        }
        assert!(matches!(s.message(S, I, 3), Err(Refusal::Exhausted(_))));
        assert!(s.message(S + 5 * S, I, 3).is_ok(), "a new interval, a new budget");
    }

    #[test]
    fn quiet_buckets_are_found_after_three_intervals() {
        let mut s = StreamState::new("s".into(), 0);
        s.usage(0, b"busy".to_vec(), &id(), (1, 0), I, 10).unwrap();
        s.usage(0, b"idle".to_vec(), &id(), (1, 0), I, 10).unwrap();
        for t in 1..=3 {
            s.usage(t * 5 * S, b"busy".to_vec(), &id(), (1, 0), I, 10).unwrap();
            s.usage(t * 5 * S, b"idle".to_vec(), &id(), (0, 0), I, 10).unwrap();
        }
        assert_eq!(s.quiet(15 * S - 1, I), Vec::<Vec<u8>>::new());
        assert_eq!(s.quiet(15 * S, I), vec![b"idle".to_vec()]);
        // Not reported at all for as long: quiet too.
        assert_eq!(s.quiet(30 * S, I).len(), 2);
        s.get_mut(b"busy").unwrap().recheck_us = Some(7 * S);
        assert!(s.rechecks(7 * S - 1).is_empty());
        assert_eq!(s.rechecks(7 * S), vec![b"busy".to_vec()]);
    }
}
