//! Throwaway Redis deployments for tests: a Redis Cluster (masters with replicas) and a
//! master/replica pair watched by one Sentinel. Real `redis-server` processes on free loopback
//! ports, in a temp dir, killed (SIGKILL) and reaped on drop. Every wait is bounded.

use std::collections::BTreeMap;
use std::fs;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::poll::poll;

const SERVER: &str = "/usr/bin/redis-server";
const CLI: &str = "/usr/bin/redis-cli";
/// How long a fresh process may take to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

/// A loopback port that was free a moment ago, with `port + 10000` (a cluster node's bus port)
/// free too.
pub fn free_cluster_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// TLS for every node of a deployment: the nodes' certificate (also their client certificate
/// towards each other), the CA that signed it, and a client pair for the test's own connections.
/// Nodes then listen on TLS only and require client certificates.
#[derive(Clone)]
pub struct NodeTls {
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_cert: std::path::PathBuf,
    pub client_key: std::path::PathBuf,
}

impl NodeTls {
    /// `redis-server` arguments: TLS on `port`, no cleartext port, TLS to masters and replicas.
    fn args(&self, port: u16) -> Vec<String> {
        let mut args: Vec<String> =
            ["--port", "0", "--tls-port", &port.to_string()].iter().map(|s| s.to_string()).collect();
        for (flag, path) in
            [("--tls-cert-file", &self.cert), ("--tls-key-file", &self.key), ("--tls-ca-cert-file", &self.ca)]
        {
            args.push(flag.to_string());
            args.push(path.display().to_string());
        }
        args.extend(["--tls-replication", "yes", "--tls-auth-clients", "yes"].iter().map(|s| s.to_string()));
        args
    }
}

/// One `redis-server` process (a data node or a Sentinel).
pub struct Node {
    pub port: u16,
    child: Option<Child>,
    tls: Option<NodeTls>,
}

impl Node {
    /// Starts `redis-server` with `args` (after `--port P --bind 127.0.0.1`, or TLS on P only),
    /// waits until it answers PING. `None` if it exited first (port taken) or never answered.
    fn spawn(port: u16, args: &[String], dir: &std::path::Path, tls: Option<&NodeTls>) -> Option<Node> {
        let log = fs::File::create(dir.join(format!("redis-{port}.log"))).expect("log file");
        let listen = match tls {
            Some(tls) => tls.args(port),
            None => vec!["--port".to_string(), port.to_string()],
        };
        let mut child = Command::new(SERVER)
            .args(args)
            .args(&listen)
            .args(["--bind", "127.0.0.1"])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {SERVER}: {e}"));
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return None;
            }
            if let Ok(mut conn) = connect_with(port, tls) {
                let info: String = redis::cmd("INFO").arg("server").query(&mut conn).unwrap_or_default();
                if info.lines().any(|l| l.trim() == format!("process_id:{}", child.id())) {
                    return Some(Node { port, child: Some(child), tls: tls.cloned() });
                }
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no shutdown, no goodbye to the cluster or the replicas.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn connection(&self) -> redis::Connection {
        connect_with(self.port, self.tls.as_ref()).unwrap_or_else(|e| panic!("connect to redis on {}: {e}", self.port))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A synchronous connection to 127.0.0.1:`port`, with short timeouts.
pub fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    connect_with(port, None)
}

/// [`connect`], over TLS with the test's client certificate when `tls` is given.
pub fn connect_with(port: u16, tls: Option<&NodeTls>) -> redis::RedisResult<redis::Connection> {
    let client = match tls {
        None => redis::Client::open(format!("redis://127.0.0.1:{port}/"))?,
        Some(tls) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let read = |p: &std::path::Path| fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
            let certs = redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: read(&tls.client_cert),
                    client_key: read(&tls.client_key),
                }),
                root_cert: Some(read(&tls.ca)),
            };
            redis::Client::build_with_tls(format!("rediss://127.0.0.1:{port}/"), certs)?
        }
    };
    let conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(conn)
}

/// Starts a node on a fresh port (retried elsewhere if the port was taken meanwhile).
fn start_node(dir: &std::path::Path, args: impl Fn(u16) -> Vec<String>, port: impl Fn() -> u16) -> Node {
    start_node_with(dir, args, port, None)
}

fn start_node_with(
    dir: &std::path::Path,
    args: impl Fn(u16) -> Vec<String>,
    port: impl Fn() -> u16,
    tls: Option<&NodeTls>,
) -> Node {
    for _ in 0..5 {
        let p = port();
        if let Some(node) = Node::spawn(p, &args(p), dir, tls) {
            return node;
        }
    }
    panic!("could not start {SERVER} in {}", dir.display());
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------------------------

/// A Redis Cluster of `masters` masters with one replica each, `cluster-node-timeout` 1 s.
pub struct Cluster {
    pub nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl Cluster {
    pub fn start(masters: usize) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut nodes = Vec::new();
        for _ in 0..masters * 2 {
            let path = dir.path().to_path_buf();
            nodes.push(start_node(
                &path,
                |p| {
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{p}.conf"),
                        "--cluster-node-timeout",
                        "1000",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        // A replica that has not completed its first sync cannot be promoted:
                        // start that sync at once (the default waits 5 s for more replicas).
                        "--repl-diskless-sync-delay",
                        "0",
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
                },
                free_cluster_port,
            ));
        }
        let cluster = Cluster { nodes, dir };
        let mut create = Command::new(CLI);
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {CLI}: {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let took = cluster.wait_ok(Duration::from_secs(20));
        assert!(took.is_some(), "cluster_state:ok not reached on every node within 20 s");
        cluster
    }

    /// `redis+cluster://` URL naming every node.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    /// Waits (bounded) until every running node says `cluster_state:ok` and agrees on who serves
    /// every slot, that owner is running, and every replica is in sync with its master: how long it
    /// took, or `None`.
    pub fn wait_ok(&self, timeout: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        poll(
            timeout,
            POLL,
            || {
                let running: Vec<u16> = self.running().map(|n| n.port).collect();
                let mut maps = Vec::new();
                for &port in &running {
                    let Ok(mut conn) = connect(port) else { return false };
                    let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).unwrap_or_default();
                    if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                        return false;
                    }
                    let Some(map) = slot_owners(&mut conn) else { return false };
                    maps.push(map);
                    // A replica must be in sync to take over from its master.
                    let replication: String =
                        redis::cmd("INFO").arg("replication").query(&mut conn).unwrap_or_default();
                    if replication.lines().any(|l| l.trim() == "role:slave")
                        && !replication.lines().any(|l| l.trim() == "master_link_status:up")
                    {
                        return false;
                    }
                }
                let Some(first) = maps.first() else { return false };
                maps.iter().all(|m| m == first)
                    && first.values().all(|p| running.contains(p))
                    && first.keys().map(|(a, b)| (b - a) as usize + 1).sum::<usize>() == 16384
            },
            |&ok| ok,
        )
        .ok()
        .map(|_| t0.elapsed())
    }

    /// `CLUSTER KEYSLOT key`, asked of a running node.
    pub fn keyslot(&self, key: &str) -> u16 {
        let mut conn = self.any_connection();
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut conn).expect("CLUSTER KEYSLOT")
    }

    /// The port of the master serving `slot`, as a running node sees it.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        self.slot_map().master_of(slot)
    }

    /// Who serves which slots, as a running node sees it now.
    pub fn slot_map(&self) -> SlotMap {
        let mut conn = self.any_connection();
        SlotMap(slot_owners(&mut conn).expect("CLUSTER SLOTS"))
    }

    /// The port of the master serving `key`.
    pub fn master_of(&self, key: &str) -> u16 {
        self.master_of_slot(self.keyslot(key))
    }

    /// A connection to the master serving `key` (so that key commands are not MOVED).
    pub fn connection_for(&self, key: &str) -> redis::Connection {
        let port = self.master_of(key);
        connect(port).unwrap_or_else(|e| panic!("connect to master {port}: {e}"))
    }

    pub fn node(&self, port: u16) -> &Node {
        self.nodes.iter().find(|n| n.port == port).unwrap_or_else(|| panic!("no node on {port}"))
    }

    pub fn node_mut(&mut self, port: u16) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.port == port).unwrap_or_else(|| panic!("no node on {port}"))
    }

    fn any_connection(&self) -> redis::Connection {
        self.running().find_map(|n| connect(n.port).ok()).expect("no cluster node answers")
    }
}

/// Slot ranges and the port of the master serving each.
pub struct SlotMap(BTreeMap<(u16, u16), u16>);

impl SlotMap {
    pub fn master_of(&self, slot: u16) -> u16 {
        self.0
            .iter()
            .find(|((a, b), _)| (*a..=*b).contains(&slot))
            .map(|(_, port)| *port)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The masters' ports.
    pub fn masters(&self) -> std::collections::BTreeSet<u16> {
        self.0.values().copied().collect()
    }
}

/// Slot ranges and the port of the master serving each (`CLUSTER SLOTS`).
fn slot_owners(conn: &mut redis::Connection) -> Option<BTreeMap<(u16, u16), u16>> {
    let slots: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(conn).ok()?;
    let redis::Value::Array(ranges) = slots else { return None };
    let mut owners = BTreeMap::new();
    for range in ranges {
        let redis::Value::Array(fields) = range else { return None };
        let (redis::Value::Int(a), redis::Value::Int(b), redis::Value::Array(master)) =
            (fields.first()?, fields.get(1)?, fields.get(2)?)
        else {
            return None;
        };
        let redis::Value::Int(port) = master.get(1)? else { return None };
        owners.insert((*a as u16, *b as u16), *port as u16);
    }
    Some(owners)
}

// ---------------------------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------------------------

/// A master, its replica, and one Sentinel monitoring them as "mymaster" (quorum 1,
/// down-after 1 s, failover-timeout 3 s).
pub struct SentinelSetup {
    pub master: Node,
    pub replica: Node,
    pub sentinel: Node,
    tls: Option<NodeTls>,
    _dir: tempfile::TempDir,
}

pub const MASTER_NAME: &str = "mymaster";

impl SentinelSetup {
    pub fn start() -> SentinelSetup {
        SentinelSetup::start_with(None)
    }

    /// Every node (master, replica, Sentinel) on TLS only, client certificates required, and
    /// TLS between them (`tls-replication yes`).
    pub fn start_tls(tls: NodeTls) -> SentinelSetup {
        SentinelSetup::start_with(Some(tls))
    }

    fn start_with(tls: Option<NodeTls>) -> SentinelSetup {
        let tls_ref = tls.as_ref();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_path_buf();
        let plain = |_: u16| ["--save", "", "--appendonly", "no"].iter().map(|s| s.to_string()).collect();
        let master = start_node_with(&path, plain, super::weir::free_port, tls_ref);
        let replica_of = master.port;
        let replica = start_node_with(
            &path,
            |_| {
                ["--save", "", "--appendonly", "no", "--replicaof", "127.0.0.1", &replica_of.to_string()]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            },
            super::weir::free_port,
            tls_ref,
        );
        let sentinel_dir = path.clone();
        let sentinel = start_node_with(
            &path,
            |port| {
                let conf = sentinel_dir.join(format!("sentinel-{port}.conf"));
                fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                         sentinel monitor {MASTER_NAME} 127.0.0.1 {replica_of} 1\n\
                         sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                         sentinel failover-timeout {MASTER_NAME} 3000\n",
                        dir = sentinel_dir.display()
                    ),
                )
                .expect("write sentinel.conf");
                vec![conf.display().to_string(), "--sentinel".to_string()]
            },
            super::weir::free_port,
            tls_ref,
        );
        let setup = SentinelSetup { master, replica, sentinel, tls, _dir: dir };
        // The Sentinel knows the master, and the replica (it learns it from the master's INFO).
        let ready = poll(
            Duration::from_secs(20),
            POLL,
            || {
                let Ok(mut conn) = setup.connect(setup.sentinel.port) else { return false };
                let replicas: redis::RedisResult<Vec<redis::Value>> =
                    redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME).query(&mut conn);
                setup.master_port() == Some(setup.master.port)
                    && replicas.map(|r| !r.is_empty()).unwrap_or(false)
                    && setup.replica_in_sync(setup.replica.port)
            },
            |&ok| ok,
        );
        assert!(ready.is_ok(), "the sentinel did not see the master and its replica within 20 s");
        setup
    }

    /// `redis+sentinel://127.0.0.1:S/mymaster` (`rediss+sentinel://` over TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss+sentinel" } else { "redis+sentinel" };
        format!("{scheme}://127.0.0.1:{}/{MASTER_NAME}", self.sentinel.port)
    }

    /// A connection to a node of this setup (over TLS if it is on TLS).
    pub fn connect(&self, port: u16) -> redis::RedisResult<redis::Connection> {
        connect_with(port, self.tls.as_ref())
    }

    /// `SENTINEL get-master-addr-by-name mymaster`: the master's port, as the Sentinel says.
    pub fn master_port(&self) -> Option<u16> {
        let mut conn = self.connect(self.sentinel.port).ok()?;
        let addr: Option<(String, String)> =
            redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(MASTER_NAME).query(&mut conn).ok()?;
        addr.and_then(|(_, port)| port.parse().ok())
    }

    /// Waits (bounded) until the Sentinel names `port` the master and that node says it is one:
    /// how long it took, or `None`.
    pub fn wait_master(&self, port: u16, timeout: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        poll(
            timeout,
            POLL,
            || {
                self.master_port() == Some(port)
                    && self
                        .connect(port)
                        .ok()
                        .and_then(|mut c| redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut c).ok())
                        .and_then(|role| role.first().cloned())
                        == Some(redis::Value::BulkString(b"master".to_vec()))
            },
            |&ok| ok,
        )
        .ok()
        .map(|_| t0.elapsed())
    }
}

impl SentinelSetup {
    /// Whether the replica on `port` has its link to the master up.
    fn replica_in_sync(&self, port: u16) -> bool {
        let Ok(mut conn) = self.connect(port) else { return false };
        let info: String = redis::cmd("INFO").arg("replication").query(&mut conn).unwrap_or_default();
        info.lines().any(|l| l.trim() == "master_link_status:up")
    }
}
