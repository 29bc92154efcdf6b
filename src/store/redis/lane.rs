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
//! Used for `redis://` single servers over TCP; TLS, Unix sockets, Cluster and Sentinel go
//! through redis-rs (`connection.rs`). Commands are encoded straight into a reused buffer
//! (`resp.rs`) and the script is loaded once per connection (and again after a `NOSCRIPT`).
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

static SCRIPT_BODY: &str = include_str!("../../../lua/limit_req.lua");
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
}

impl Call {
    pub(super) fn new(keys: usize, zones: usize) -> Self {
        Self { frame: Vec::with_capacity(64 * zones + 48), keys_end: 0, keys, args: 0 }
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

    /// Whether both calls have the same number of keys and the same arguments.
    fn same_args(&self, other: &Call) -> bool {
        self.keys == other.keys && self.frame[self.keys_end..] == other.frame[other.keys_end..]
    }
}

struct Job {
    call: Call,
    reply: oneshot::Sender<Result<Vec<Value>, StoreError>>,
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
        let (reply, answer) = oneshot::channel();
        self.enqueue(Job { call, reply })?;
        answer.await.map_err(|_| StoreError::Connection("the decision lane stopped".into()))?
    }

    fn enqueue(&self, job: Job) -> Result<(), StoreError> {
        LANES.with(|lanes| {
            let mut lanes = lanes.borrow_mut();
            let mine =
                lanes.iter().position(|(t, q)| std::ptr::eq(t.as_ptr(), Arc::as_ptr(&self.target)) && !q.is_closed());
            let queue = match mine {
                Some(i) => &lanes[i].1,
                None => {
                    // Lanes of dropped stores (an old config's) and of ended runtimes go.
                    lanes.retain(|(t, q)| t.strong_count() > 0 && !q.is_closed());
                    let runtime = tokio::runtime::Handle::try_current()
                        .map_err(|_| StoreError::Connection("no async runtime on this thread".into()))?;
                    let (queue, jobs) = mpsc::unbounded_channel();
                    runtime.spawn(run(self.target.clone(), jobs));
                    lanes.push((Arc::downgrade(&self.target), queue));
                    &lanes[lanes.len() - 1].1
                }
            };
            queue.send(job).map_err(|_| StoreError::Connection("the decision lane stopped".into()))
        })
    }
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
    let _ = job.reply.send(Err(StoreError::Connection(why.to_string())));
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
    loop {
        let Some(live) = conn.as_mut() else {
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
                Err(why) => batch.into_iter().for_each(|job| fail(job, &why)),
            }
            continue;
        };
        let stall = live.in_flight.front().map(|p| p.sent_at() + target.stall_limit());
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
            _ = sleep_until(stall), if stall.is_some() => {
                Err(format!("Redis left a call unanswered for {:?}", target.stall_limit()))
            }
        };
        if let Err(why) = outcome {
            if let Some(dead) = conn.take() {
                drop_connection(dead, &why);
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
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
    let stream = tokio::time::timeout(budget, TcpStream::connect(&addr))
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
    METRICS.redis_batch_size.observe(batch.len() as f64);
    conn.write.clear();
    encode(&mut conn.write, &batch);
    conn.in_flight.push_back(Pending::sent(batch));
    write(conn, target).await
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
            Pending::Batch(..) => resp::parse_each(&conn.read),
            Pending::One(..) | Pending::Load(_) => resp::parse(&conn.read).map(|r| r.map(|(one, n)| (vec![one], n))),
        }
        .map_err(|e| format!("malformed reply from Redis: {}", e.0))?;
        let Some((replies, used)) = parsed else { break };
        conn.read.advance(used);
        let Some(pending) = conn.in_flight.pop_front() else { break };
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
                } else {
                    match split_batch(replies, jobs.len()) {
                        Ok(each) => jobs.into_iter().zip(each).for_each(|(job, reply)| answer(job, reply)),
                        Err(why) => jobs.into_iter().for_each(|job| fail(job, &why)),
                    }
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
        encode(&mut conn.write, &reload);
        conn.in_flight.push_back(Pending::sent(reload));
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

/// A batch call's reply: one array with, per request, its reply as an array (the script's general
/// path), or flat, its number of values followed by them (the leaky-bucket path: a nested array
/// per request costs Redis a Lua table and its conversion each), or its error. Returns each
/// request's reply as the single-call layout has it.
fn split_batch(items: Vec<Reply>, requests: usize) -> Result<Vec<Reply>, String> {
    let mut out = Vec::with_capacity(requests);
    let mut items = items.into_iter();
    while let Some(item) = items.next() {
        match item {
            Ok(Value::Int(n)) => {
                let n = usize::try_from(n).map_err(|_| format!("a batch reply announces {n} values"))?;
                let values = items
                    .by_ref()
                    .take(n)
                    .collect::<Result<Vec<Value>, String>>()
                    .map_err(|e| format!("an error among a request's values in a batch reply: {e}"))?;
                if values.len() != n {
                    return Err(format!("a batch reply ends within a request's {n} values"));
                }
                out.push(Ok(Value::Array(values)));
            }
            other => out.push(other),
        }
    }
    if out.len() != requests {
        return Err(format!("a batch of {requests} requests got {} replies", out.len()));
    }
    Ok(out)
}

fn is_noscript(reply: &Reply) -> bool {
    matches!(reply, Err(e) if e.starts_with("NOSCRIPT"))
}

fn answer(job: Job, reply: Reply) {
    let result = match reply {
        Ok(Value::Array(values)) => Ok(values),
        Ok(other) => Err(StoreError::Reply(format!("expected the script's array, got {other:?}"))),
        Err(e) => Err(StoreError::Server(e)),
    };
    let _ = job.reply.send(result);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Vec<Reply> {
        values.iter().map(|&n| Ok(Value::Int(n))).collect()
    }

    #[test]
    fn a_batch_reply_splits_per_request_flat_nested_or_failed() {
        // Request 1 flat (2 values), request 2 nested, request 3 an error, request 4 flat (0 values).
        let mut items = ints(&[2, 1, 0]);
        items.push(Ok(Value::Array(vec![Value::Int(7)])));
        items.push(Err("limit_req: zone 1: unknown algorithm 99".into()));
        items.extend(ints(&[0]));
        let each = split_batch(items, 4).expect("split");
        assert_eq!(each[0], Ok(Value::Array(vec![Value::Int(1), Value::Int(0)])));
        assert_eq!(each[1], Ok(Value::Array(vec![Value::Int(7)])));
        assert_eq!(each[2], Err("limit_req: zone 1: unknown algorithm 99".to_string()));
        assert_eq!(each[3], Ok(Value::Array(vec![])));
    }

    #[test]
    fn a_batch_reply_of_the_wrong_shape_is_refused() {
        // One reply short; values cut off; a negative count; an error among a request's values.
        assert!(split_batch(ints(&[1, 5]), 2).is_err());
        assert!(split_batch(ints(&[3, 1, 2]), 1).is_err());
        assert!(split_batch(ints(&[-1]), 1).is_err());
        let mut items = ints(&[2, 1]);
        items.push(Err("x".into()));
        assert!(split_batch(items, 1).is_err());
        // More replies than requests.
        assert!(split_batch(ints(&[0, 0]), 1).is_err());
    }
}
