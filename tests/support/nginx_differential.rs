//! What the nginx-vs-import differentials share (tests/import_nginx.rs, tests/import_ingress.rs):
//! a whole nginx config run in the foreground, the client that sends one request to nginx and to
//! Weir at the same moment and records what each answered, and one seeded schedule of bursts —
//! many client addresses (source addresses in 127.0.0.0/8, or forwarded headers), paths, hosts,
//! methods, extra headers — with idle gaps between them.
//!
//! Timing: the gaps between bursts are chosen so that no rate in the corpora (≤ 5 r/s) refills
//! near a decision: a gap of 1.25 s leaves every bucket a quarter or a half of a request away
//! from a boundary.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// nginx running a whole config file of ours in the foreground, killed on drop. `$NGINX` in the
/// config stands for the loopback address picked for it.
pub struct NginxConf {
    child: Child,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
}

impl NginxConf {
    pub fn start(conf: &str) -> NginxConf {
        let dir = tempfile::tempdir().expect("tempdir");
        let prefix = dir.path().display().to_string();
        let port = super::weir::free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("a loopback address");
        let head = format!("daemon off;\nmaster_process off;\nworker_processes 1;\npid {prefix}/nginx.pid;\nerror_log {prefix}/error.log info;\n");
        let temps = format!(
            "http {{\n    access_log off;\n    client_body_temp_path {prefix}/body;\n    proxy_temp_path {prefix}/proxy;\n    fastcgi_temp_path {prefix}/fastcgi;\n    uwsgi_temp_path {prefix}/uwsgi;\n    scgi_temp_path {prefix}/scgi;\n"
        );
        let text = format!("{head}{}", conf.replacen("http {", &temps, 1).replace("$NGINX", &addr.to_string()));
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, text).expect("write nginx.conf");
        let child = Command::new(super::nginx::bin())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        let mut n = NginxConf { child, dir, addr };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(s)) = n.child.try_wait() {
                panic!("nginx exited ({s}): {}", n.error_log());
            }
            assert!(Instant::now() < deadline, "nginx not up: {}", n.error_log());
            std::thread::sleep(Duration::from_millis(20));
        }
        n
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for NginxConf {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Status { status: u16, delayed: bool },
    Closed,
}

/// A request longer than this was delayed by a limit (the upstream answers at once).
pub const DELAYED: Duration = Duration::from_millis(300);

#[derive(Debug, Clone)]
pub struct Req {
    pub from: String,
    pub method: &'static str,
    pub host: String,
    pub path: String,
    pub forwarded: Option<String>,
    /// One more header line (a bypass token, …), or "".
    pub header: &'static str,
}

pub async fn send(to: SocketAddr, r: &Req) -> Outcome {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind(format!("{}:0", r.from).parse().expect("a loopback source address")).expect("bind the source");
    let started = Instant::now();
    let Ok(mut stream) = socket.connect(to).await else { return Outcome::Closed };
    let fwd = r.forwarded.as_ref().map_or(String::new(), |f| format!("X-Forwarded-For: {f}\r\n"));
    let extra = if r.header.is_empty() { String::new() } else { format!("{}\r\n", r.header) };
    let body = if r.method == "GET" { "" } else { "Content-Length: 0\r\n" };
    let head =
        format!("{} {} HTTP/1.1\r\nHost: {}\r\n{fwd}{extra}{body}Connection: close\r\n\r\n", r.method, r.path, r.host);
    if stream.write_all(head.as_bytes()).await.is_err() {
        return Outcome::Closed;
    }
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut buf)).await;
    if read.is_err() || buf.len() < 12 {
        return Outcome::Closed;
    }
    let status = std::str::from_utf8(&buf[9..12]).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    Outcome::Status { status, delayed: started.elapsed() >= DELAYED }
}

/// Where the client address comes from.
#[derive(Clone, Copy, PartialEq)]
pub enum Fwd {
    /// The source address (in 127.0.0.0/8).
    Peer,
    /// X-Forwarded-For from 127.0.0.1 (trusted): the client as 10.x.y.z.
    Client,
    /// X-Forwarded-For "client, proxy" with the proxy in 192.168.2.0/24 (trusted too).
    ClientAndProxy,
}

/// A differential config: the corpus file, the paths of its locations, hosts, methods, extra
/// header lines (one picked per client run) and where the client address comes from.
pub struct Case {
    pub file: &'static str,
    pub paths: &'static [&'static str],
    pub hosts: &'static [&'static str],
    pub methods: &'static [&'static str],
    pub headers: &'static [&'static str],
    pub forwarded: Fwd,
    /// A client's run is 1 to `max_run - 1` requests (ingress-nginx's bursts are 5× the rate:
    /// its manifests need longer runs to meet them).
    pub max_run: usize,
}

pub const PLAIN: Case = Case {
    file: "",
    paths: &["/"],
    hosts: &["localhost"],
    methods: &["GET"],
    headers: &[""],
    forwarded: Fwd::Peer,
    max_run: 9,
};

/// One seeded schedule of bursts: each burst picks a few clients, each sends a run of requests.
pub fn schedule(case: &Case, seed: u64) -> Vec<Vec<Req>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bursts = Vec::new();
    for _ in 0..14 {
        let mut burst = Vec::new();
        for _ in 0..rng.gen_range(1..4) {
            let client = format!("127.0.{}.{}", rng.gen_range(0..2), rng.gen_range(2..7));
            let path = case.paths[rng.gen_range(0..case.paths.len())];
            let host = case.hosts[rng.gen_range(0..case.hosts.len())];
            let method = case.methods[rng.gen_range(0..case.methods.len())];
            let header = case.headers[rng.gen_range(0..case.headers.len())];
            let proxy = format!("192.168.2.{}", rng.gen_range(1..3));
            for _ in 0..rng.gen_range(1..case.max_run) {
                let (from, forwarded) = match case.forwarded {
                    Fwd::Peer => (client.clone(), None),
                    Fwd::Client => ("127.0.0.1".to_string(), Some(client.replace("127.", "10."))),
                    Fwd::ClientAndProxy => {
                        ("127.0.0.1".to_string(), Some(format!("{}, {proxy}", client.replace("127.", "10."))))
                    }
                };
                burst.push(Req { from, method, host: host.into(), path: path.into(), forwarded, header });
            }
        }
        bursts.push(burst);
    }
    bursts
}

/// What one schedule gave.
#[derive(Debug, Default)]
pub struct Tally {
    /// Requests compared (those nginx answered itself and Weir denied uncharged are not).
    pub total: usize,
    pub agree: usize,
    pub diffs: Vec<String>,
    /// nginx's rejections (429, 503, closed) and delays among the compared.
    pub rejected: usize,
    pub delayed: usize,
}

impl Tally {
    pub fn share(&self) -> f64 {
        self.agree as f64 / self.total.max(1) as f64
    }

    /// `file: agreed/total (x %; nginx rejected r, delayed d)`, the line the tests print.
    pub fn line(&self, file: &str) -> String {
        format!(
            "{file}: {}/{} ({:.1} %; nginx rejected {}, delayed {})",
            self.agree,
            self.total,
            self.share() * 100.0,
            self.rejected,
            self.delayed
        )
    }
}

/// Runs the seeded schedule of `case` against nginx and Weir, each request to both at once.
pub fn compare(case: &Case, nginx: SocketAddr, weir: SocketAddr, seed: u64) -> Tally {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let mut t = Tally::default();
    for (b, burst) in schedule(case, seed).into_iter().enumerate() {
        for r in burst {
            let (n, w) = rt.block_on(async {
                let (r1, r2) = (r.clone(), r.clone());
                let n = tokio::spawn(async move { send(nginx, &r1).await });
                let w = tokio::spawn(async move { send(weir, &r2).await });
                (n.await.expect("the nginx request"), w.await.expect("the Weir request"))
            });
            // What nginx answers itself (files: 404, `return`) is not Weir's decision: Weir's
            // stand-in route must deny it (uncharged: the later requests of the key agree).
            let nginx_answered = matches!(n, Outcome::Status { status, .. } if ![200, 403, 429, 503].contains(&status));
            if nginx_answered && matches!(w, Outcome::Status { status: 403, .. }) {
                continue;
            }
            t.total += 1;
            match n {
                Outcome::Status { status: 429 | 503, .. } | Outcome::Closed => t.rejected += 1,
                Outcome::Status { delayed: true, .. } => t.delayed += 1,
                _ => {}
            }
            if n == w {
                t.agree += 1;
            } else {
                t.diffs.push(format!(
                    "burst {b}: {} {} {} {:?} {:?} from {}: nginx {n:?}, weir {w:?}",
                    r.method, r.host, r.path, r.header, r.forwarded, r.from
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(1250));
    }
    t
}
