//! The decision lane: the `limit_req` decisions of one proxy thread go to one Redis server over a
//! connection of that thread's own, so a decision never crosses threads, and they are
//! **coalesced**: every decision queued when the lane's task runs goes out in ONE call of
//! `lua/limit_req.lua` (its batch mode), which decides each request on its own, atomically, one
//! after the other. One request's zones stay all-or-nothing; one request's error or rejection never
//! affects another's. A batch is flushed as soon as the runtime has run everything else that was
//! ready (the task yields once before it drains the queue), never by waiting on a timer. A request
//! whose arguments equal the previous one's (same zones, costs, flags) sends "=" in their place,
//! and the script reads them once per batch.
//!
//! Used for `redis://` single servers over TCP, and for each master of a plain-TCP Redis Cluster
//! (`slot_owners.rs` says which lane a request goes to). On a Cluster a script's keys must all be
//! in one hash slot, so a batch holds the requests of one slot: a lane's queue is split per slot
//! into one call each, pipelined on the one connection. A call Redis did not run (`MOVED`, `ASK`,
//! `CLUSTERDOWN`, `TRYAGAIN`, or a connection that could not be made) is answered
//! `LaneError::NotRun`, so the caller may send it another way without charging twice. TLS, Unix
//! sockets and Sentinel go through redis-rs (`connection.rs`). Commands are encoded straight into
//! a reused buffer (`resp.rs`) and the script (`script.rs`: joined from its parts) is loaded once
//! per connection (and again after a `NOSCRIPT`).
//! A connection is made on the first decision and after a failure; every decision queued or in
//! flight on a failed connection gets an error at once (the caller's failure policy decides), and a
//! connection that stops answering is dropped.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use ::redis::{ConnectionAddr, IntoConnectionInfo, Value};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::resp::{self, CommandWriter, Reply};
use crate::metrics::METRICS;
use crate::store::StoreError;

/// The most requests in one script call. Redis's instructions per decision (callgrind, one
/// leaky-bucket zone, Redis TIME, compact reply, requests of equal arguments): 142k alone, 83k in
/// batches of 4, 71k of 8, 68k of 16, 69k of 32, 77k of 64 (the Lua heap a large batch builds
/// costs more than the call it saves). 16 keeps a call well under a millisecond of Redis.
const MAX_BATCH: usize = 16;
/// Bytes read from the socket at once.
const READ_CHUNK: usize = 64 * 1024;

static SCRIPT_BODY: &str = super::script::LIMIT_REQ_SCRIPT;
static SCRIPT_SHA: LazyLock<String> = LazyLock::new(|| ::redis::Script::new(SCRIPT_BODY).get_hash().to_string());

/// Where the lanes of one store connect. A store without one (TLS, Cluster, …) uses redis-rs.
#[derive(Debug)]
pub(super) struct Target {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    /// A decision's budget; connects and stalls are judged against it.
    timeout: Duration,
}

/// Why a lane gave no verdict.
#[derive(Debug)]
pub(super) enum LaneError {
    /// Redis did not run the call (a redirect, a cluster that is down, no connection): sending
    /// it elsewhere charges nothing twice.
    NotRun(StoreError),
    /// Anything else, the script possibly run.
    Failed(StoreError),
}

impl From<LaneError> for StoreError {
    fn from(e: LaneError) -> Self {
        match e {
            LaneError::NotRun(e) | LaneError::Failed(e) => e,
        }
    }
}

impl Target {
    /// The lane's target for a single-server URL, if the lane can serve it (plain TCP).
    pub(super) fn for_url(url: &str, timeout: Duration) -> Option<Arc<Self>> {
        let info = url.into_connection_info().ok()?;
        let ConnectionAddr::Tcp(host, port) = info.addr() else { return None };
        let settings = info.redis_settings();
        Some(Arc::new(Self {
            host: host.clone(),
            port: *port,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
            timeout,
        }))
    }

    /// The same credentials and budget for another node (a Cluster master).
    pub(super) fn at(&self, host: &str, port: u16) -> Arc<Self> {
        Arc::new(Self {
            host: host.to_owned(),
            port,
            username: self.username.clone(),
            password: self.password.clone(),
            db: self.db,
            timeout: self.timeout,
        })
    }

    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `host:port`.
    pub(super) fn addr(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// How long a connection may leave a call unanswered before it is dropped.
    fn stall_limit(&self) -> Duration {
        (self.timeout * 4).max(Duration::from_secs(1))
    }
}

/// One request's script call, encoded: its keys then its arguments (the single-call layout of
/// `lua/limit_req.lua`), as RESP bulk strings.
pub(super) struct Call {
    frame: Vec<u8>,
    /// Where the keys end and the arguments start in `frame`.
    keys_end: usize,
    keys: usize,
    args: usize,
    /// The hash slot of the keys on a Cluster (0 elsewhere): only calls of one slot share a batch.
    slot: u16,
}

impl Call {
    pub(super) fn new(keys: usize, zones: usize) -> Self {
        Self { frame: Vec::with_capacity(64 * zones + 48), keys_end: 0, keys, args: 0, slot: 0 }
    }

    /// Marks the call as one of Cluster hash slot `slot`.
    pub(super) fn in_slot(mut self, slot: u16) -> Self {
        self.slot = slot;
        self
    }

    /// Appends a key (all keys come before the first argument).
    pub(super) fn key(&mut self, key: &[u8]) {
        CommandWriter::append(&mut self.frame).bytes(key);
        self.keys_end = self.frame.len();
    }

    pub(super) fn arg(&mut self, value: &[u8]) -> &mut Self {
        CommandWriter::append(&mut self.frame).bytes(value);
        self.args += 1;
        self
    }

    pub(super) fn int(&mut self, value: impl itoa::Integer) -> &mut Self {
        CommandWriter::append(&mut self.frame).int(value);
        self.args += 1;
        self
    }

    /// Appends arguments (a zone's), encoded once per thread for the values seen recently.
    pub(super) fn ints<const N: usize>(&mut self, values: &[i64; N]) -> &mut Self {
        CommandWriter::append(&mut self.frame).ints(values);
        self.args += N;
        self
    }

    /// Whether both calls have the same number of keys and the same arguments.
    fn same_args(&self, other: &Call) -> bool {
        self.keys == other.keys && self.frame[self.keys_end..] == other.frame[other.keys_end..]
    }
}

struct Job {
    call: Call,
    reply: oneshot::Sender<Result<Vec<Value>, LaneError>>,
}

/// The lanes of one store, one per proxy thread that decides.
pub(super) struct Lanes {
    target: Arc<Target>,
}

thread_local! {
    /// This thread's lanes: the store they serve (dead once it is dropped) and the lane's queue.
    static LANES: RefCell<Vec<(Weak<Target>, mpsc::UnboundedSender<Job>)>> = const { RefCell::new(Vec::new()) };
}

impl Lanes {
    pub(super) fn new(target: Arc<Target>) -> Self {
        Self { target }
    }

    /// Decides one request through this thread's lane; the reply is the script's array.
    pub(super) async fn decide(&self, call: Call) -> Result<Vec<Value>, StoreError> {
        Ok(decide_on(&self.target, call).await?)
    }
}

/// Decides one request through this thread's lane to `target` (made on first use).
pub(super) async fn decide_on(target: &Arc<Target>, call: Call) -> Result<Vec<Value>, LaneError> {
    let (reply, answer) = oneshot::channel();
    enqueue(target, Job { call, reply }).map_err(LaneError::NotRun)?;
    answer.await.map_err(|_| LaneError::Failed(StoreError::Connection("the decision lane stopped".into())))?
}

fn enqueue(target: &Arc<Target>, job: Job) -> Result<(), StoreError> {
    LANES.with(|lanes| {
        let mut lanes = lanes.borrow_mut();
        let mine = lanes.iter().position(|(t, q)| std::ptr::eq(t.as_ptr(), Arc::as_ptr(target)) && !q.is_closed());
        let queue = match mine {
            Some(i) => &lanes[i].1,
            None => {
                // Lanes of dropped stores (an old config's) and of ended runtimes go.
                lanes.retain(|(t, q)| t.strong_count() > 0 && !q.is_closed());
                let runtime = tokio::runtime::Handle::try_current()
                    .map_err(|_| StoreError::Connection("no async runtime on this thread".into()))?;
                let (queue, jobs) = mpsc::unbounded_channel();
                runtime.spawn(run(target.clone(), jobs));
                lanes.push((Arc::downgrade(target), queue));
                &lanes[lanes.len() - 1].1
            }
        };
        queue.send(job).map_err(|_| StoreError::Connection("the decision lane stopped".into()))
    })
}

/// What a reply in flight answers.
enum Pending {
    /// One request, sent in the single-call layout.
    One(Job, Instant),
    /// Several requests in one batch call.
    Batch(Vec<Job>, Instant),
    /// A `SCRIPT LOAD` (its reply is only checked for an error).
    Load(Instant),
}

impl Pending {
    /// What `encode` wrote for `batch` (never empty), sent now: one request in the single-call
    /// layout, several in batch mode.
    fn sent(batch: Vec<Job>) -> Self {
        match <[Job; 1]>::try_from(batch) {
            Ok([job]) => Pending::One(job, Instant::now()),
            Err(batch) => Pending::Batch(batch, Instant::now()),
        }
    }

    fn sent_at(&self) -> Instant {
        match self {
            Pending::One(_, at) | Pending::Batch(_, at) | Pending::Load(at) => *at,
        }
    }

    fn fail(self, why: &str) {
        match self {
            Pending::One(job, _) => fail(job, why),
            Pending::Batch(jobs, _) => jobs.into_iter().for_each(|job| fail(job, why)),
            Pending::Load(_) => {}
        }
    }
}

fn fail(job: Job, why: &str) {
    let _ = job.reply.send(Err(LaneError::Failed(StoreError::Connection(why.to_string()))));
}

fn not_run(job: Job, why: StoreError) {
    let _ = job.reply.send(Err(LaneError::NotRun(why)));
}

struct Connection {
    reader: OwnedReadHalf,
    writer: OwnedWriteHalf,
    read: BytesMut,
    write: Vec<u8>,
    in_flight: VecDeque<Pending>,
}

/// The lane's task: until every queue handle is gone.
async fn run(target: Arc<Target>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut conn: Option<Connection> = None;
    // Fires when the oldest call in flight may have stalled. Armed once and left alone while
    // calls come and go (re-arming per batch would cost a timer-wheel update per batch): when it
    // fires early, because the call it was armed for was answered, it is armed again for the
    // oldest one then in flight.
    let stall_timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(stall_timer);
    let mut stall_armed = false;
    loop {
        let Some(live) = conn.as_mut() else {
            stall_armed = false;
            let Some(first) = jobs.recv().await else { return };
            let batch = gather(first, &mut jobs).await;
            if batch.is_empty() {
                continue;
            }
            match connect(&target).await {
                Ok(mut fresh) => match send(&mut fresh, batch, &target).await {
                    Ok(()) => conn = Some(fresh),
                    Err(why) => drop_connection(fresh, &why),
                },
                // Nothing was sent: the caller may send these elsewhere.
                Err(why) => batch.into_iter().for_each(|job| not_run(job, StoreError::Connection(why.clone()))),
            }
            continue;
        };
        match live.in_flight.front() {
            Some(oldest) if !stall_armed => {
                stall_timer.as_mut().reset((oldest.sent_at() + target.stall_limit()).into());
                stall_armed = true;
            }
            Some(_) => {}
            None => stall_armed = false,
        }
        let outcome = tokio::select! {
            biased;
            read = live.reader.read_buf(&mut live.read) => match read {
                Ok(0) => Err("Redis closed the connection".to_string()),
                Ok(_) => dispatch(live),
                Err(e) => Err(format!("reading from Redis: {e}")),
            },
            job = jobs.recv() => match job {
                None => return,
                Some(first) => {
                    let batch = gather(first, &mut jobs).await;
                    if batch.is_empty() { Ok(()) } else { send(live, batch, &target).await }
                }
            },
            () = &mut stall_timer, if stall_armed => {
                stall_armed = false;
                match live.in_flight.front() {
                    Some(oldest) if oldest.sent_at().elapsed() >= target.stall_limit() => {
                        Err(format!("Redis left a call unanswered for {:?}", target.stall_limit()))
                    }
                    _ => Ok(()),
                }
            }
        };
        if let Err(why) = outcome {
            if let Some(dead) = conn.take() {
                drop_connection(dead, &why);
            }
        }
    }
}

/// `first` and whatever else is queued once the runtime has run the other ready tasks (so the
/// decisions they make join this batch), up to `MAX_BATCH`; callers that gave up are skipped.
async fn gather(first: Job, jobs: &mut mpsc::UnboundedReceiver<Job>) -> Vec<Job> {
    let mut batch = Vec::with_capacity(8);
    batch.push(first);
    tokio::task::yield_now().await;
    while batch.len() < MAX_BATCH {
        match jobs.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    batch.retain(|job| !job.reply.is_closed());
    batch
}

fn drop_connection(conn: Connection, why: &str) {
    tracing::warn!(reason = why, "dropping the Redis decision connection");
    for pending in conn.in_flight {
        pending.fail(why);
    }
}

async fn connect(target: &Target) -> Result<Connection, String> {
    let budget = target.timeout.max(Duration::from_millis(200));
    let addr = format!("{}:{}", target.host, target.port);
    let stream = tokio::time::timeout(budget, TcpStream::connect((target.host.as_str(), target.port)))
        .await
        .map_err(|_| format!("connecting to Redis at {addr} took over {budget:?}"))?
        .map_err(|e| format!("connecting to Redis at {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| format!("TCP_NODELAY on the Redis connection: {e}"))?;
    let (reader, writer) = stream.into_split();
    let mut conn = Connection {
        reader,
        writer,
        read: BytesMut::with_capacity(READ_CHUNK),
        write: Vec::new(),
        in_flight: VecDeque::new(),
    };
    if let Some(password) = &target.password {
        let mut buf = Vec::new();
        match &target.username {
            Some(user) => {
                CommandWriter::new(&mut buf, 3).bytes(b"AUTH").bytes(user.as_bytes()).bytes(password.as_bytes())
            }
            None => CommandWriter::new(&mut buf, 2).bytes(b"AUTH").bytes(password.as_bytes()),
        };
        request(&mut conn, &buf, budget).await.map_err(|e| format!("AUTH: {e}"))?;
    }
    if target.db != 0 {
        let mut buf = Vec::new();
        CommandWriter::new(&mut buf, 2).bytes(b"SELECT").int(target.db);
        request(&mut conn, &buf, budget).await.map_err(|e| format!("SELECT {}: {e}", target.db))?;
    }
    let mut buf = Vec::new();
    script_load(&mut buf);
    request(&mut conn, &buf, budget).await.map_err(|e| format!("SCRIPT LOAD of lua/limit_req.lua: {e}"))?;
    Ok(conn)
}

fn script_load(buf: &mut Vec<u8>) {
    CommandWriter::new(buf, 3).bytes(b"SCRIPT").bytes(b"LOAD").bytes(SCRIPT_BODY.as_bytes());
}

/// One command and its reply, before the connection is in use.
async fn request(conn: &mut Connection, command: &[u8], budget: Duration) -> Result<Value, String> {
    let exchange = async {
        conn.writer.write_all(command).await.map_err(|e| e.to_string())?;
        loop {
            if let Some((reply, used)) = resp::parse(&conn.read).map_err(|e| e.0)? {
                conn.read.advance(used);
                return reply;
            }
            if conn.reader.read_buf(&mut conn.read).await.map_err(|e| e.to_string())? == 0 {
                return Err("connection closed".into());
            }
        }
    };
    tokio::time::timeout(budget, exchange).await.map_err(|_| format!("no reply within {budget:?}"))?
}

/// Writes one call for `batch` (single layout for one request) and records it as in flight.
async fn send(conn: &mut Connection, batch: Vec<Job>, target: &Target) -> Result<(), String> {
    conn.write.clear();
    queue_calls(conn, batch);
    write(conn, target).await
}

/// Encodes one call per hash slot of `batch` (one call off a Cluster) into the write buffer and
/// records each as in flight.
fn queue_calls(conn: &mut Connection, batch: Vec<Job>) {
    for group in by_slot(batch) {
        METRICS.redis_batch_size.observe(group.len() as f64);
        encode(&mut conn.write, &group);
        conn.in_flight.push_back(Pending::sent(group));
    }
}

/// `batch` split per hash slot, in the order each slot first appears.
fn by_slot(batch: Vec<Job>) -> Vec<Vec<Job>> {
    let first = batch.first().map(|j| j.call.slot);
    if batch.iter().all(|j| Some(j.call.slot) == first) {
        return vec![batch];
    }
    let mut groups: Vec<Vec<Job>> = Vec::new();
    for job in batch {
        match groups.iter_mut().find(|g| g[0].call.slot == job.call.slot) {
            Some(group) => group.push(job),
            None => groups.push(vec![job]),
        }
    }
    groups
}

async fn write(conn: &mut Connection, target: &Target) -> Result<(), String> {
    let limit = target.stall_limit();
    match tokio::time::timeout(limit, conn.writer.write_all(&conn.write)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing to Redis: {e}")),
        Err(_) => Err(format!("Redis accepted no bytes for {limit:?}")),
    }
}

/// `EVALSHA <sha> <keys> <keys...> <args...>`: one request as is, several in batch mode.
fn encode(buf: &mut Vec<u8>, batch: &[Job]) {
    let keys: usize = batch.iter().map(|j| j.call.keys).sum();
    let calls = batch.iter().map(|j| &j.call);
    if let [one] = batch {
        let mut w = CommandWriter::new(buf, 3 + one.call.keys + one.call.args);
        w.bytes(b"EVALSHA").bytes(SCRIPT_SHA.as_bytes()).int(keys);
        buf.extend_from_slice(&one.call.frame);
        return;
    }
    // A request whose arguments equal the previous one's (the same zones, costs and flags: the
    // usual batch) sends "=" instead, and the script reads them once.
    let repeats: Vec<bool> =
        std::iter::once(false).chain(batch.windows(2).map(|w| w[1].call.same_args(&w[0].call))).collect();
    let args: usize =
        2 + batch.iter().zip(&repeats).map(|(j, &repeat)| 1 + if repeat { 1 } else { j.call.args }).sum::<usize>();
    CommandWriter::new(buf, 3 + keys + args).bytes(b"EVALSHA").bytes(SCRIPT_SHA.as_bytes()).int(keys);
    for call in calls.clone() {
        buf.extend_from_slice(&call.frame[..call.keys_end]);
    }
    CommandWriter::append(buf).bytes(b"batch").int(batch.len());
    for (call, repeat) in calls.zip(repeats) {
        CommandWriter::append(buf).int(call.keys);
        if repeat {
            CommandWriter::append(buf).bytes(b"=");
        } else {
            buf.extend_from_slice(&call.frame[call.keys_end..]);
        }
    }
}

/// Hands every complete reply in the read buffer to its waiting requests.
fn dispatch(conn: &mut Connection) -> Result<(), String> {
    let mut reload = Vec::new();
    loop {
        let Some(front) = conn.in_flight.front() else {
            if conn.read.is_empty() {
                break;
            }
            return Err("Redis sent a reply nobody asked for".into());
        };
        let parsed = match front {
            Pending::Batch(..) => resp::parse_batch(&conn.read),
            Pending::One(..) | Pending::Load(_) => {
                resp::parse(&conn.read).map(|r| r.map(|(one, n)| (Ok(vec![one]), n)))
            }
        }
        .map_err(|e| format!("malformed reply from Redis: {}", e.0))?;
        let Some((replies, used)) = parsed else { break };
        conn.read.advance(used);
        let Some(pending) = conn.in_flight.pop_front() else { break };
        let replies = match replies {
            Ok(replies) => replies,
            Err(why) => {
                pending.fail(&why);
                continue;
            }
        };
        match pending {
            Pending::Load(_) => {
                if let Some(Err(e)) = replies.into_iter().next() {
                    return Err(format!("SCRIPT LOAD of lua/limit_req.lua: {e}"));
                }
            }
            Pending::One(job, _) => {
                let reply = replies.into_iter().next().unwrap_or(Ok(Value::Nil));
                if is_noscript(&reply) {
                    reload.push(job);
                } else {
                    answer(job, reply);
                }
            }
            Pending::Batch(jobs, _) => {
                if replies.len() == 1 && is_noscript(&replies[0]) {
                    reload.extend(jobs);
                } else if let [Err(e)] = replies.as_slice() {
                    // The call as a whole was refused (OOM, BUSY, …): each request gets why.
                    jobs.into_iter().for_each(|job| answer(job, Err(e.clone())));
                } else if replies.len() != jobs.len() {
                    let why = format!("a batch of {} requests got {} replies", jobs.len(), replies.len());
                    jobs.into_iter().for_each(|job| fail(job, &why));
                } else {
                    jobs.into_iter().zip(replies).for_each(|(job, reply)| answer(job, reply));
                }
            }
        }
    }
    if !reload.is_empty() {
        // The script cache was flushed (SCRIPT FLUSH, a restart behind a proxy): load it and send
        // the same requests again; they were not decided.
        tracing::info!("Redis no longer has lua/limit_req.lua cached; loading it again");
        conn.write.clear();
        script_load(&mut conn.write);
        conn.in_flight.push_back(Pending::Load(Instant::now()));
        queue_calls(conn, reload);
        // Written by the caller's next turn: the write must not block the read side here.
        return resend(conn);
    }
    Ok(())
}

/// Writes what `dispatch` queued without awaiting (a `SCRIPT LOAD` and one call fit in the socket
/// buffer of a healthy connection); what does not fit fails the connection.
fn resend(conn: &mut Connection) -> Result<(), String> {
    let mut written = 0;
    while written < conn.write.len() {
        match conn.writer.try_write(&conn.write[written..]) {
            Ok(0) => return Err("Redis closed the connection".into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err("Redis's socket is full while reloading the script".into())
            }
            Err(e) => return Err(format!("writing to Redis: {e}")),
        }
    }
    Ok(())
}

/// A Cluster's refusal to run a call here: the slot is elsewhere (`MOVED`), migrating (`ASK`,
/// `TRYAGAIN`), or the cluster cannot serve it now (`CLUSTERDOWN`).
fn refused_unrun(error: &str) -> bool {
    ["MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN"].iter().any(|p| error.starts_with(p))
}

fn is_noscript(reply: &Reply) -> bool {
    matches!(reply, Err(e) if e.starts_with("NOSCRIPT"))
}

fn answer(job: Job, reply: Reply) {
    let result = match reply {
        Ok(Value::Array(values)) => Ok(values),
        Ok(other) => Err(LaneError::Failed(StoreError::Reply(format!("expected the script's array, got {other:?}")))),
        Err(e) if refused_unrun(&e) => Err(LaneError::NotRun(StoreError::Server(e))),
        Err(e) => Err(LaneError::Failed(StoreError::Server(e))),
    };
    let _ = job.reply.send(result);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(slot: u16, id: u8) -> Job {
        let mut call = Call::new(1, 1).in_slot(slot);
        call.key(&[id]);
        Job { call, reply: oneshot::channel().0 }
    }

    #[test]
    fn a_batch_splits_per_slot_in_order_of_first_appearance() {
        let ids = |groups: &[Vec<Job>]| -> Vec<Vec<(u16, u8)>> {
            groups
                .iter()
                .map(|g| g.iter().map(|j| (j.call.slot, j.call.frame[j.call.frame.len() - 3])).collect())
                .collect()
        };
        let one = by_slot(vec![job(0, 1), job(0, 2)]);
        assert_eq!(ids(&one), [vec![(0, 1), (0, 2)]]);
        let mixed = by_slot(vec![job(7, 1), job(3, 2), job(7, 3), job(9, 4), job(3, 5)]);
        assert_eq!(ids(&mixed), [vec![(7, 1), (7, 3)], vec![(3, 2), (3, 5)], vec![(9, 4)]]);
        // MOVED, ASK, TRYAGAIN, CLUSTERDOWN were not run; other errors may have been.
        assert!(refused_unrun("MOVED 3999 127.0.0.1:6381"));
        assert!(refused_unrun("ASK 3999 127.0.0.1:6381"));
        assert!(refused_unrun("CLUSTERDOWN The cluster is down"));
        assert!(refused_unrun("TRYAGAIN Multiple keys request during rehashing of slot"));
        assert!(!refused_unrun("ERR Error running script"));
        assert!(!refused_unrun("BUSY Redis is busy running a script"));
    }
}
