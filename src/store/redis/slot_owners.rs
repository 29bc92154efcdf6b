//! Which Cluster master owns each hash slot, for the decision lanes (`lane.rs`): a request whose
//! zones share one slot goes to the lane of that slot's master, so the requests of one slot that
//! are queued together go out in one batch call.
//!
//! The map comes from `CLUSTER SLOTS`, asked of the seed nodes and the masters last known, on
//! first use and again after a call Redis did not run (`MOVED`, `ASK`, `CLUSTERDOWN`, no
//! connection: a failover or a resharding), at most once per `MIN_REFRESH`. It is read in the
//! background: until it is there (and for the call that found it wrong) a request goes through
//! redis-rs's cluster connection, which follows redirects itself. Node targets keep their identity
//! across refreshes, so each thread's lane to a master (and its connection) survives them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ::redis::Value;

use super::lane::Target;
use super::slots::SLOTS;

/// The least time between two reads of the slot map.
const MIN_REFRESH: Duration = Duration::from_millis(200);

pub(super) struct SlotOwners {
    /// The credentials and budget every node's target copies; also the first seed.
    template: Arc<Target>,
    /// The `redis://` URLs of the seed nodes.
    seeds: Vec<String>,
    map: RwLock<Option<Arc<Map>>>,
    /// A refresh is wanted (or running).
    stale: AtomicBool,
    refreshing: AtomicBool,
    last_refresh: Mutex<Option<Instant>>,
}

struct Map {
    /// Per slot, an index into `nodes` (`u16::MAX`: no owner known).
    owner: Vec<u16>,
    nodes: Vec<Arc<Target>>,
}

impl SlotOwners {
    /// For a plain-TCP cluster given by `seeds` (`redis://` URLs); `None` when a seed is not one.
    pub(super) fn new(seeds: Vec<String>, timeout: Duration) -> Option<Arc<Self>> {
        let template = Target::for_url(seeds.first()?, timeout)?;
        for seed in &seeds {
            Target::for_url(seed, timeout)?;
        }
        Some(Arc::new(Self {
            template,
            seeds,
            map: RwLock::new(None),
            stale: AtomicBool::new(true),
            refreshing: AtomicBool::new(false),
            last_refresh: Mutex::new(None),
        }))
    }

    /// The lane target of `slot`'s master, if known; starts a refresh of the map when it is due.
    pub(super) fn owner(self: &Arc<Self>, slot: u16) -> Option<Arc<Target>> {
        if self.stale.load(Ordering::Relaxed) {
            self.refresh_soon();
        }
        let map = self.map.read().ok()?.clone()?;
        let node = *map.owner.get(usize::from(slot))?;
        map.nodes.get(usize::from(node)).cloned()
    }

    /// A call was not run where the map said: read the map again.
    pub(super) fn mark_stale(self: &Arc<Self>) {
        self.stale.store(true, Ordering::Relaxed);
        self.refresh_soon();
    }

    fn refresh_soon(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let due = match self.last_refresh.lock() {
            Ok(last) => last.is_none_or(|at| at.elapsed() >= MIN_REFRESH),
            Err(_) => false,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        if !due {
            self.refreshing.store(false, Ordering::Release);
            return;
        }
        let owners = self.clone();
        runtime.spawn(async move {
            owners.stale.store(false, Ordering::Relaxed);
            if let Ok(mut last) = owners.last_refresh.lock() {
                *last = Some(Instant::now());
            }
            if let Err(why) = owners.refresh().await {
                tracing::warn!(reason = %why, "reading the Redis Cluster slot map for the decision lanes");
                owners.stale.store(true, Ordering::Relaxed);
            }
            owners.refreshing.store(false, Ordering::Release);
        });
    }

    /// Asks the masters last known, then the seeds, for `CLUSTER SLOTS` until one answers.
    async fn refresh(&self) -> Result<(), String> {
        let known: Vec<Arc<Target>> = self.current().map(|m| m.nodes.clone()).unwrap_or_default();
        let mut asked: Vec<String> = known.iter().map(|t| node_url(&self.seeds[0], t)).collect();
        asked.extend(self.seeds.iter().cloned());
        let mut errors = Vec::new();
        for url in asked {
            match self.slots_from(&url).await {
                Ok(ranges) => {
                    let map = self.build(ranges, &known);
                    if let Ok(mut slot) = self.map.write() {
                        *slot = Some(Arc::new(map));
                    }
                    return Ok(());
                }
                Err(e) => errors.push(format!("{url}: {e}")),
            }
        }
        Err(format!("no node answered CLUSTER SLOTS ({})", errors.join("; ")))
    }

    fn current(&self) -> Option<Arc<Map>> {
        self.map.read().ok()?.clone()
    }

    async fn slots_from(&self, url: &str) -> Result<Vec<(u16, u16, String, u16)>, String> {
        let budget = self.template.timeout().max(Duration::from_millis(200));
        let ask = async {
            let client = ::redis::Client::open(url).map_err(|e| e.to_string())?;
            let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
            let reply: Value =
                ::redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn).await.map_err(|e| e.to_string())?;
            parse_slots(&reply, host_of(url))
        };
        tokio::time::timeout(budget, ask).await.map_err(|_| format!("no answer within {budget:?}"))?
    }

    /// The map for `ranges`, reusing the targets of `known` nodes.
    fn build(&self, ranges: Vec<(u16, u16, String, u16)>, known: &[Arc<Target>]) -> Map {
        let mut owner = vec![u16::MAX; usize::from(SLOTS)];
        let mut nodes: Vec<Arc<Target>> = Vec::new();
        let mut index: HashMap<(String, u16), u16> = HashMap::new();
        for (start, end, host, port) in ranges {
            let i = *index.entry((host.clone(), port)).or_insert_with(|| {
                let target = known
                    .iter()
                    .find(|t| t.addr() == (host.as_str(), port))
                    .cloned()
                    .unwrap_or_else(|| self.template.at(&host, port));
                nodes.push(target);
                (nodes.len() - 1) as u16
            });
            for slot in start..=end.min(SLOTS - 1) {
                owner[usize::from(slot)] = i;
            }
        }
        Map { owner, nodes }
    }
}

/// `redis://[credentials@]host:port` of `target`, with the credentials of `seed` (a URL).
fn node_url(seed: &str, target: &Target) -> String {
    let (host, port) = target.addr();
    let head = match seed.rsplit_once('@') {
        Some((credentials, _)) => format!("{credentials}@"),
        None => "redis://".to_string(),
    };
    if host.contains(':') {
        format!("{head}[{host}]:{port}")
    } else {
        format!("{head}{host}:{port}")
    }
}

/// The host of a `redis://` URL (for `CLUSTER SLOTS` entries that leave it empty: "the node asked").
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or(rest);
    hostport.rsplit_once(':').map_or(hostport, |(h, _)| h).trim_matches(['[', ']']).to_string()
}

/// `CLUSTER SLOTS`: per range, start, end, then the master as [host, port, id, ...].
fn parse_slots(reply: &Value, asked_host: String) -> Result<Vec<(u16, u16, String, u16)>, String> {
    let Value::Array(ranges) = reply else { return Err(format!("CLUSTER SLOTS replied {reply:?}")) };
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).map_err(|_| format!("{n} is no slot or port")),
        other => Err(format!("expected an integer in CLUSTER SLOTS, got {other:?}")),
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(parts) = range else { return Err(format!("a CLUSTER SLOTS range {range:?}")) };
            let [start, end, master, ..] = parts.as_slice() else {
                return Err(format!("a CLUSTER SLOTS range of {} values", parts.len()));
            };
            let Value::Array(node) = master else { return Err(format!("a CLUSTER SLOTS master {master:?}")) };
            let [host, port, ..] = node.as_slice() else { return Err("a CLUSTER SLOTS master without port".into()) };
            let host = match host {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                other => return Err(format!("a CLUSTER SLOTS host {other:?}")),
            };
            // "" or "?" : the node's address is not known to it; it is the one asked.
            let host = if host.is_empty() || host == "?" { asked_host.clone() } else { host };
            Ok((int(start)?, int(end)?, host, int(port)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn cluster_slots_parse_with_empty_hosts_taken_as_the_node_asked() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("10.0.0.1"), Value::Int(7000), bulk("id1")]),
                Value::Array(vec![bulk("10.0.0.4"), Value::Int(7003), bulk("id4")]),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), Value::Array(vec![bulk(""), Value::Int(7001)])]),
        ]);
        let ranges = parse_slots(&reply, "127.0.0.1".into()).expect("parse");
        assert_eq!(ranges, vec![(0, 5460, "10.0.0.1".to_string(), 7000), (5461, 16383, "127.0.0.1".to_string(), 7001)]);
        assert!(parse_slots(&Value::Array(vec![Value::Array(vec![Value::Int(0)])]), String::new()).is_err());
        assert!(parse_slots(&Value::Int(3), String::new()).is_err());
        assert_eq!(host_of("redis://u:p@10.1.2.3:7000"), "10.1.2.3");
        assert_eq!(host_of("redis://[::1]:7000/"), "::1");
        let target = Target::for_url("redis://10.0.0.9:7005", Duration::from_secs(1)).expect("target");
        assert_eq!(node_url("redis://u:p@10.1.2.3:7000", &target), "redis://u:p@10.0.0.9:7005");
        assert_eq!(node_url("redis://10.1.2.3:7000", &target), "redis://10.0.0.9:7005");
    }
}
