//! The connection to Redis, whatever the deployment: one server, a Redis Cluster, or a master
//! found through Sentinels (see `url.rs` for the URLs).
//!
//! Every kind is connected lazily, on the first call, so that its driver tasks live on the
//! proxy's runtime, and a failed connect is not cached: the next call tries again.
//!
//! * single: one `ConnectionManager` (pipelines, reconnects by itself);
//! * cluster: one `cluster_async::ClusterConnection`, which keeps a connection per node, routes
//!   each command by its first key's slot, follows MOVED/ASK and refreshes the slot map after a
//!   failover by itself;
//! * sentinel: a `MultiplexedConnection` to the master the Sentinels name. A connection error, a
//!   READONLY/MASTERDOWN/LOADING reply (the master was demoted or is not ready), or three
//!   decisions in a row that time out drop it, and the next call asks the Sentinels again: a
//!   failover is followed by itself.
//!
//! Scripts are called with EVALSHA. On NOSCRIPT a single server or a Sentinel master gets
//! `SCRIPT LOAD` and the EVALSHA again; a cluster node gets the script's body with EVAL, routed by
//! the first key like the EVALSHA, which also caches it on that node (a `SCRIPT LOAD` would go to
//! every node and fail while one is down).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use ::redis::io::tcp::TcpSettings;
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelNodeConnectionInfo, SentinelServerType};
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, Pipeline, RedisError,
    RedisFuture, RedisResult, Script, ServerErrorKind, TlsMode, ToRedisArgs, Value,
};
use tokio::sync::OnceCell;
use tracing::{info, warn};

use super::url::{parse_redis_url, RedisTopology};
use crate::store::StoreError;

/// Decisions in a row that time out before a Sentinel-resolved connection is dropped.
const SENTINEL_TIMEOUTS_TO_DROP: u32 = 3;

/// Makes (lazily) and hands out connections of one deployment.
pub(super) struct Connector {
    kind: Kind,
}

enum Kind {
    Single { client: Client, conn: OnceCell<ConnectionManager>, timeout: Duration },
    Cluster { client: ClusterClient, conn: OnceCell<ClusterConnection> },
    Sentinel(Arc<SentinelState>),
}

impl Connector {
    /// Parses the URL and prepares the client; does no I/O. `timeout` is the budget of one
    /// decision: the client's own connect and response timeouts are derived from it.
    pub(super) fn new(url: &str, timeout: Duration, tls: Option<&super::RedisTls>) -> Result<Self, StoreError> {
        let topology = parse_redis_url(url).map_err(|e| {
            StoreError::Redis(RedisError::from((ErrorKind::InvalidClientConfig, "invalid store url", e)))
        })?;
        // redis-rs builds its rustls config on the process's default provider.
        crate::tls::install_default_provider();
        let response_timeout = timeout.max(Duration::from_millis(50));
        let connection_timeout = timeout.max(Duration::from_millis(200));
        let kind = match topology {
            RedisTopology::Single(url) => {
                let info = url.as_str().into_connection_info()?.set_tcp_settings(no_delay());
                let client = match tls {
                    Some(tls) => Client::build_with_tls(info, tls.certificates())?,
                    None => Client::open(info)?,
                };
                Kind::Single { client, conn: OnceCell::new(), timeout }
            }
            RedisTopology::Cluster(nodes) => {
                // Few, short retries: a decision waits at most `timeout` anyway (a request whose
                // caller has gone is dropped, not retried), but a MOVED after a failover needs one.
                let mut builder = ClusterClientBuilder::new(nodes);
                if let Some(tls) = tls {
                    builder = builder.certs(tls.certificates());
                }
                let client = builder
                    .connection_timeout(connection_timeout)
                    .response_timeout(response_timeout)
                    .retries(3)
                    .min_retry_wait(10)
                    .max_retry_wait(100)
                    .tcp_settings(no_delay())
                    .build()?;
                Kind::Cluster { client, conn: OnceCell::new() }
            }
            RedisTopology::Sentinel { sentinels, master, data_node, tls: over_tls } => {
                let settings = data_node.as_str().into_connection_info()?.redis_settings().clone();
                let client = if over_tls {
                    sentinel_tls_client(&sentinels, &master, &settings, tls)?
                } else {
                    let node = SentinelNodeConnectionInfo::default()
                        .set_redis_connection_info(settings)
                        .set_tcp_settings(no_delay());
                    SentinelClient::build(sentinels, master.clone(), Some(node), SentinelServerType::Master)?
                };
                Kind::Sentinel(Arc::new(SentinelState {
                    client: tokio::sync::Mutex::new(client),
                    master,
                    config: AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(connection_timeout))
                        .set_response_timeout(Some(response_timeout)),
                    current: Mutex::new(None),
                    generation: AtomicU64::new(0),
                    timeouts: AtomicU32::new(0),
                }))
            }
        };
        Ok(Self { kind })
    }

    /// Whether keys of different slots need separate calls.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster { .. })
    }

    /// "single", "cluster" or "sentinel".
    pub(super) fn kind(&self) -> &'static str {
        match self.kind {
            Kind::Single { .. } => "single",
            Kind::Cluster { .. } => "cluster",
            Kind::Sentinel(_) => "sentinel",
        }
    }

    /// A connection, made on first use (and, for Sentinel, after the last one was dropped).
    pub(super) async fn get(&self) -> Result<RedisConn, StoreError> {
        match &self.kind {
            Kind::Single { client, conn, timeout } => {
                let conn = conn
                    .get_or_try_init(|| async {
                        // Short redis-side bounds and few retries: a decision waits at most
                        // `timeout` anyway, and a backlog of reconnect attempts only delays
                        // recovery.
                        let cfg = ConnectionManagerConfig::new()
                            .set_number_of_retries(2)
                            .set_min_delay(Duration::from_millis(50))
                            .set_max_delay(Duration::from_millis(500))
                            .set_response_timeout(Some((*timeout).max(Duration::from_millis(50))))
                            .set_connection_timeout(Some((*timeout).max(Duration::from_millis(200))));
                        ConnectionManager::new_with_config(client.clone(), cfg).await
                    })
                    .await?;
                Ok(RedisConn::Single(conn.clone()))
            }
            Kind::Cluster { client, conn } => {
                let conn = conn.get_or_try_init(|| client.get_async_connection()).await?;
                Ok(RedisConn::Cluster(conn.clone()))
            }
            Kind::Sentinel(state) => state.connection().await.map_err(StoreError::from),
        }
    }

    /// A decision gave up waiting (its connection may be to a hung master).
    pub(super) fn note_timeout(&self) {
        if let Kind::Sentinel(state) = &self.kind {
            if state.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= SENTINEL_TIMEOUTS_TO_DROP {
                state.drop_current(None, "decisions keep timing out");
            }
        }
    }

    /// Whether the deployment answers: PING for a server, `CLUSTER INFO` of any node saying
    /// `cluster_state:ok` for a cluster (a PING would go to every master and fail until a dead
    /// one is forgotten).
    ///
    /// Then a write of `probe_key` (a short-lived key): a server that answers but refuses writes
    /// (`OOM command not allowed`, `BUSY`, `READONLY`) cannot decide either.
    pub(super) async fn ping(&self, probe_key: &[u8]) -> Result<(), StoreError> {
        let mut conn = self.get().await?;
        self.answers(&mut conn).await?;
        ::redis::cmd("SET")
            .arg(probe_key)
            .arg(std::process::id())
            .arg("PX")
            .arg(10_000)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    async fn answers(&self, conn: &mut RedisConn) -> Result<(), StoreError> {
        match conn {
            RedisConn::Cluster(cluster) => {
                let mut info = ::redis::cmd("CLUSTER");
                info.arg("INFO");
                let reply = cluster.route_command(info, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random)).await?;
                let text: String =
                    ::redis::from_redis_value(reply).map_err(|e| StoreError::Reply(format!("CLUSTER INFO: {e}")))?;
                if text.lines().any(|l| l.trim() == "cluster_state:ok") {
                    Ok(())
                } else {
                    Err(StoreError::Reply("the cluster reports cluster_state other than ok".into()))
                }
            }
            _ => Ok(::redis::cmd("PING").query_async::<()>(conn).await?),
        }
    }
}

/// `rediss+sentinel://`: the Sentinels and the master they name, both over TLS with the same CA
/// (system and Mozilla roots without `tls_ca`) and client certificate; the master's name is
/// verified against the address the Sentinels give (usually an IP: its certificate must name it).
/// TCP_NODELAY: redis-rs leaves Nagle's algorithm on, which holds back a small command while an
/// earlier one is unacknowledged (tens of ms with delayed ACKs); a decision is one small command.
fn no_delay() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

fn sentinel_tls_client(
    sentinels: &[String],
    master: &str,
    data: &::redis::RedisConnectionInfo,
    tls: Option<&super::RedisTls>,
) -> RedisResult<SentinelClient> {
    let addrs = sentinels
        .iter()
        .map(|s| s.as_str().into_connection_info().map(|info| info.addr().clone()))
        .collect::<RedisResult<Vec<_>>>()?;
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
        .set_client_to_redis_tls_mode(TlsMode::Secure)
        .set_client_to_redis_db(data.db())
        .set_client_to_redis_protocol(data.protocol())
        .set_client_to_redis_tcp_settings(no_delay());
    if let Some(user) = data.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = data.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(tls) = tls {
        builder = builder
            .set_client_to_sentinel_certificates(tls.certificates())
            .set_client_to_redis_certificates(tls.certificates());
    }
    builder.build()
}

/// The Sentinel side: the Sentinels' client and the master connection found through them.
struct SentinelState {
    /// Asks the Sentinels; one lookup at a time.
    client: tokio::sync::Mutex<SentinelClient>,
    master: String,
    config: AsyncConnectionConfig,
    /// The master connection and its generation (so that a late error of an old connection
    /// does not drop a new one).
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    /// Decisions in a row that timed out.
    timeouts: AtomicU32,
}

impl SentinelState {
    fn current(self: &Arc<Self>) -> Option<RedisConn> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().map(|(generation, conn)| {
            RedisConn::Sentinel(SentinelConn { conn: conn.clone(), state: self.clone(), generation: *generation })
        })
    }

    async fn connection(self: &Arc<Self>) -> RedisResult<RedisConn> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let mut client = self.client.lock().await;
        // Another call may have found the master while this one waited.
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let master = client.async_get_client().await?;
        let conn = master.get_multiplexed_async_connection_with_config(&self.config).await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        info!(
            master = %self.master,
            addr = %master.get_connection_info().addr(),
            "redis sentinel: connected to the master"
        );
        self.timeouts.store(0, Ordering::Relaxed);
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some((generation, conn.clone()));
        Ok(RedisConn::Sentinel(SentinelConn { conn, state: self.clone(), generation }))
    }

    /// Forgets the master connection (of `generation`, or whichever when `None`): the next call
    /// asks the Sentinels again.
    fn drop_current(&self, generation: Option<u64>, why: &str) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((g, _)) = current.as_ref() {
            if generation.is_none_or(|want| want == *g) {
                *current = None;
                self.timeouts.store(0, Ordering::Relaxed);
                warn!(master = %self.master, reason = why, "redis sentinel: dropping the master connection; asking the sentinels again");
            }
        }
    }

    fn observe<T>(&self, generation: u64, result: &RedisResult<T>) {
        match result {
            Ok(_) => self.timeouts.store(0, Ordering::Relaxed),
            Err(e) if means_another_master(e) => self.drop_current(Some(generation), &e.to_string()),
            Err(_) => {}
        }
    }
}

/// Errors after which the master may be elsewhere: the connection broke, or the server is no
/// (writable) master any more.
fn means_another_master(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
            )
        )
}

/// A connection to the master the Sentinels named.
#[derive(Clone)]
pub(super) struct SentinelConn {
    conn: MultiplexedConnection,
    state: Arc<SentinelState>,
    generation: u64,
}

/// One connection of any kind; cheap to clone (a handle).
#[derive(Clone)]
pub(super) enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConn),
}

impl RedisConn {
    fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
            RedisConn::Sentinel(s) => Box::pin(async move {
                let result = s.conn.req_packed_command(cmd).await;
                s.state.observe(s.generation, &result);
                result
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Sentinel(s) => Box::pin(async move {
                let result = s.conn.req_packed_commands(pipeline, offset, count).await;
                s.state.observe(s.generation, &result);
                result
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
            RedisConn::Sentinel(s) => s.conn.get_db(),
        }
    }
}

/// A Lua script: its body (for EVAL) and SHA-1 (for EVALSHA).
pub(super) struct LuaScript {
    body: &'static str,
    script: Script,
}

impl LuaScript {
    pub(super) fn new(body: &'static str) -> Self {
        Self { body, script: Script::new(body) }
    }

    pub(super) fn call(&'static self) -> ScriptCall {
        ScriptCall { script: self, keys: Vec::new(), args: Vec::new() }
    }
}

/// One call of a script: its keys and arguments, owned (so that it can be sent again later, e.g.
/// by a rollback that outlives its request).
#[derive(Clone)]
pub(super) struct ScriptCall {
    script: &'static LuaScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    pub(super) fn key(&mut self, key: impl AsRef<[u8]>) -> &mut Self {
        self.keys.push(key.as_ref().to_vec());
        self
    }

    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    fn command(&self, verb: &str, script: &str) -> Cmd {
        let mut cmd = ::redis::cmd(verb);
        cmd.arg(script).arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(key.as_slice());
        }
        for arg in &self.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }

    /// EVALSHA, loading the script on NOSCRIPT (see the module docs).
    pub(super) async fn invoke<T: FromRedisValue>(&self, conn: &mut RedisConn) -> RedisResult<T> {
        let hash = self.script.script.get_hash();
        match self.command("EVALSHA", hash).query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                if conn.is_cluster() {
                    self.command("EVAL", self.script.body).query_async(conn).await
                } else {
                    ::redis::cmd("SCRIPT").arg("LOAD").arg(self.script.body).query_async::<()>(conn).await?;
                    self.command("EVALSHA", hash).query_async(conn).await
                }
            }
            other => other,
        }
    }
}
