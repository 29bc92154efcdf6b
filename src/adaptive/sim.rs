//! A simulated upstream on a simulated clock for the controller's tests: `servers` requests are
//! processed at once, each for its service time (±20 %), the rest wait in its FIFO queue — the
//! shape of a thread-pool server. Clients send Bernoulli arrivals (Poisson-like) every 100 µs
//! through their own controller and admission rule, as Weir instances would.
//!
//! Beside the honest traffic, a client may carry [`Attack`]s, the hostile schedules of issue 46:
//! keep-alive connections on a slow endpoint or with a pausing upload, a flood of answers the
//! upstream gives at once, slow readers that hold their place after the answer. A request holds
//! its place as the proxy does: from admission, through its upload (the upstream sees it once it
//! is fully sent), its time at the upstream, and for `hold` after the answer (a response still
//! being sent to a slow client, whose end the proxy has not read from the upstream yet). The
//! latency sample is the proxy's: from fully sent to the answer.

use std::collections::VecDeque;
use std::time::Duration;

use super::admission::{Occupancy, Priority};
use super::controller::{Controller, Settings};

const TICK_US: u64 = 100;
/// A refused connection tries again after this (as the integration tests' clients do).
const RETRY_AFTER_REFUSAL_US: u64 = 10_000;

/// A deterministic generator (the tests must be reproducible).
struct Lcg(u64);

impl Lcg {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What a request costs and how long it holds its place besides.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// The upstream's work (µs); 0: the upstream's current service time.
    service_us: u64,
    /// The client's upload before the request is fully sent (µs).
    upload_us: u64,
    /// The place stays taken this long after the answer (µs).
    hold_us: u64,
}

struct Job {
    client: usize,
    priority: Priority,
    /// When it was fully sent to the upstream (the sample starts here).
    sent_us: u64,
    shape: Shape,
    honest: bool,
    /// The attack connection that sent it: (attack, connection).
    conn: Option<(usize, usize)>,
}

/// A hostile schedule beside the honest traffic (issue 46).
#[derive(Debug, Clone)]
pub enum Attack {
    /// `connections` keep-alive connections, each sending its next request when its last one
    /// ended (or 10 ms after a refusal): `service` at the upstream, `upload` of the client's
    /// own body before it is fully sent, its place held `hold` after the answer.
    Connections { connections: usize, priority: Priority, service: Duration, upload: Duration, hold: Duration },
    /// Open-loop arrivals at `rate`/s (at most 10,000/s) that the upstream answers in
    /// `service`; each place held `hold` after the answer (Weir sending the answer).
    Flood { rate: f64, priority: Priority, service: Duration, hold: Duration },
    /// A slow reader following the limit by its own refusals: it takes every place its
    /// priority may, each held `hold` after an ordinary answer.
    Fill { priority: Priority, hold: Duration },
}

/// One sending instance: its offered load per priority and its controller.
pub struct Client {
    pub controller: Controller,
    /// Requests per second, per priority.
    pub rates: Vec<(Priority, f64)>,
    /// Hostile schedules sent through the same instance.
    pub attacks: Vec<Attack>,
    /// Per attack, when each of its connections sends next (`u64::MAX`: waiting for an answer).
    next_send: Vec<Vec<u64>>,
    occupancy: Occupancy,
}

impl Client {
    pub fn new(settings: Settings, rates: Vec<(Priority, f64)>) -> Self {
        Self {
            controller: Controller::new(settings),
            rates,
            attacks: Vec::new(),
            next_send: Vec::new(),
            occupancy: Occupancy::default(),
        }
    }

    /// Starts (or replaces) the client's attacks.
    pub fn attack(&mut self, attacks: Vec<Attack>) {
        self.next_send = attacks
            .iter()
            .map(|a| match a {
                Attack::Connections { connections, .. } => vec![0; *connections],
                _ => Vec::new(),
            })
            .collect();
        self.attacks = attacks;
    }

    /// Places in flight on this instance now.
    pub fn in_flight(&self) -> u32 {
        self.occupancy.total()
    }
}

/// Per simulated second.
#[derive(Debug, Default, Clone)]
pub struct Second {
    /// Answers per client.
    pub served: Vec<u64>,
    /// Answers within the latency objective, per client.
    pub good: Vec<u64>,
    pub shed: Vec<u64>,
    /// Honest requests per priority: (sent, shed).
    pub by_priority: [(u64, u64); 3],
    /// Honest answers within the latency objective, per priority.
    pub good_by_priority: [u64; 3],
    /// The limit per client at the end of the second.
    pub limits: Vec<u32>,
    /// The most places in flight per client during the second.
    pub peak_places: Vec<u32>,
    /// The most requests at the upstream (in service and queued) during the second.
    pub peak_upstream: usize,
    /// Latencies (µs) of the answers ended in this second (all clients).
    pub latencies_us: Vec<u64>,
}

impl Second {
    pub fn p99_us(&self) -> u64 {
        let mut l = self.latencies_us.clone();
        l.sort_unstable();
        l.get((l.len() * 99 / 100).min(l.len().saturating_sub(1))).copied().unwrap_or(0)
    }

    pub fn total_served(&self) -> u64 {
        self.served.iter().sum()
    }

    pub fn total_shed(&self) -> u64 {
        self.shed.iter().sum()
    }
}

/// The share of honest requests of `priority` answered within the objective over `seconds`.
pub fn honest_goodput(seconds: &[Second], priority: Priority) -> f64 {
    let sent: u64 = seconds.iter().map(|s| s.by_priority[priority as usize].0).sum();
    let good: u64 = seconds.iter().map(|s| s.good_by_priority[priority as usize]).sum();
    good as f64 / sent.max(1) as f64
}

pub struct Sim {
    pub clients: Vec<Client>,
    service_us: u64,
    /// In service: (ends at, job).
    busy: Vec<(u64, Job)>,
    queue: VecDeque<Job>,
    /// Being uploaded by their clients: (fully sent at, job).
    uploading: Vec<(u64, Job)>,
    /// Answered, the place still held: (released at, job).
    held: Vec<(u64, Job)>,
    rng: Lcg,
    now_us: u64,
    /// Answers slower than this are not "good" (the objective): twice the unloaded p99.
    pub slo_us: u64,
}

impl Sim {
    pub fn new(service: Duration, clients: Vec<Client>) -> Self {
        let service_us = service.as_micros() as u64;
        Self {
            clients,
            service_us,
            busy: Vec::new(),
            queue: VecDeque::new(),
            uploading: Vec::new(),
            held: Vec::new(),
            rng: Lcg(7),
            now_us: 0,
            slo_us: 2 * service_us * 12 / 10,
        }
    }

    /// The upstream becomes faster or slower (for requests it starts from now on).
    pub fn set_service(&mut self, service: Duration) {
        self.service_us = service.as_micros() as u64;
    }

    /// Runs `seconds` with `servers` processing at once; one record per second.
    pub fn run(&mut self, seconds: u64, servers: usize) -> Vec<Second> {
        let n = self.clients.len();
        let mut out = Vec::new();
        for _ in 0..seconds {
            let mut second = Second {
                served: vec![0; n],
                good: vec![0; n],
                shed: vec![0; n],
                peak_places: vec![0; n],
                ..Default::default()
            };
            for _ in 0..(1_000_000 / TICK_US) {
                self.tick(servers, &mut second);
            }
            second.limits = self.clients.iter().map(|c| c.controller.limit()).collect();
            out.push(second);
        }
        out
    }

    /// `n` requests of `priority` arrive at client 0 at once (a burst), each `service` at the
    /// upstream; returns how many were admitted.
    pub fn burst(&mut self, n: usize, priority: Priority, service: Duration) -> usize {
        let shape = Shape { service_us: service.as_micros() as u64, upload_us: 0, hold_us: 0 };
        let mut second = Second {
            served: vec![0; 1],
            good: vec![0; 1],
            shed: vec![0; 1],
            peak_places: vec![0; 1],
            ..Default::default()
        };
        (0..n).filter(|_| self.arrive(0, priority, shape, false, None, &mut second)).count()
    }

    /// One request at client `c`: admitted (true) or shed.
    fn arrive(
        &mut self,
        c: usize,
        priority: Priority,
        shape: Shape,
        honest: bool,
        conn: Option<(usize, usize)>,
        second: &mut Second,
    ) -> bool {
        let now = self.now_us;
        if honest {
            second.by_priority[priority as usize].0 += 1;
        }
        let client = &mut self.clients[c];
        if client.controller.probing() {
            client.controller.expire(now);
        }
        if !client.occupancy.may_enter(client.controller.limit(), priority) {
            second.shed[c] += 1;
            if honest {
                second.by_priority[priority as usize].1 += 1;
            }
            return false;
        }
        client.occupancy.enter(priority);
        client.controller.observe_in_flight(client.occupancy.total());
        if let Some(peak) = second.peak_places.get_mut(c) {
            *peak = (*peak).max(client.occupancy.total());
        }
        let job = Job { client: c, priority, sent_us: now + shape.upload_us, shape, honest, conn };
        if shape.upload_us > 0 {
            self.uploading.push((now + shape.upload_us, job));
        } else {
            self.queue.push_back(job);
        }
        true
    }

    /// A place is given back; an attack connection sends again.
    fn release(&mut self, job: &Job) {
        let client = &mut self.clients[job.client];
        client.occupancy.leave(job.priority);
        if let Some((a, k)) = job.conn {
            if let Some(at) = client.next_send.get_mut(a).and_then(|v| v.get_mut(k)) {
                *at = self.now_us;
            }
        }
    }

    fn tick(&mut self, servers: usize, second: &mut Second) {
        self.now_us += TICK_US;
        let now = self.now_us;
        // Places held after their answer are given back.
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].0 <= now {
                let (_, job) = self.held.swap_remove(i);
                self.release(&job);
            } else {
                i += 1;
            }
        }
        // Uploads that ended reach the upstream.
        let mut i = 0;
        while i < self.uploading.len() {
            if self.uploading[i].0 <= now {
                let (_, job) = self.uploading.swap_remove(i);
                self.queue.push_back(job);
            } else {
                i += 1;
            }
        }
        // Answers.
        let mut i = 0;
        while i < self.busy.len() {
            if self.busy[i].0 <= now {
                let (_, job) = self.busy.swap_remove(i);
                let latency = now - job.sent_us;
                if job.shape.hold_us == 0 {
                    self.release(&job);
                }
                let client = &mut self.clients[job.client];
                client.controller.sample(now, Duration::from_micros(latency), client.occupancy.total());
                Self::count(second, &job, latency, self.slo_us);
                if job.shape.hold_us > 0 {
                    self.held.push((now + job.shape.hold_us, job));
                }
            } else {
                i += 1;
            }
        }
        // Arrivals through each client's limit.
        for c in 0..self.clients.len() {
            for r in 0..self.clients[c].rates.len() {
                let (priority, rate) = self.clients[c].rates[r];
                if self.rng.next_f64() >= rate * TICK_US as f64 / 1e6 {
                    continue;
                }
                let shape = Shape { service_us: 0, upload_us: 0, hold_us: 0 };
                self.arrive(c, priority, shape, true, None, second);
            }
            for a in 0..self.clients[c].attacks.len() {
                let attack = self.clients[c].attacks[a].clone();
                let us = |d: Duration| d.as_micros() as u64;
                match attack {
                    Attack::Connections { priority, service, upload, hold, .. } => {
                        let shape = Shape { service_us: us(service), upload_us: us(upload), hold_us: us(hold) };
                        for k in 0..self.clients[c].next_send[a].len() {
                            if self.clients[c].next_send[a][k] > now {
                                continue;
                            }
                            self.clients[c].next_send[a][k] = u64::MAX;
                            if !self.arrive(c, priority, shape, false, Some((a, k)), second) {
                                self.clients[c].next_send[a][k] = now + RETRY_AFTER_REFUSAL_US;
                            }
                        }
                    }
                    Attack::Flood { rate, priority, service, hold } => {
                        if self.rng.next_f64() < rate * TICK_US as f64 / 1e6 {
                            let shape = Shape { service_us: us(service).max(1), upload_us: 0, hold_us: us(hold) };
                            self.arrive(c, priority, shape, false, None, second);
                        }
                    }
                    Attack::Fill { priority, hold } => {
                        let shape = Shape { service_us: 0, upload_us: 0, hold_us: us(hold) };
                        while self.arrive(c, priority, shape, false, None, second) {}
                    }
                }
            }
        }
        // The upstream starts what it has room for.
        while self.busy.len() < servers {
            let Some(job) = self.queue.pop_front() else { break };
            let jitter = 0.8 + 0.4 * self.rng.next_f64();
            let service = if job.shape.service_us == 0 { self.service_us } else { job.shape.service_us };
            let ends = now + ((service as f64 * jitter) as u64).max(1);
            self.busy.push((ends, job));
        }
        second.peak_upstream = second.peak_upstream.max(self.busy.len() + self.queue.len());
    }

    fn count(second: &mut Second, job: &Job, latency: u64, slo_us: u64) {
        second.served[job.client] += 1;
        if latency <= slo_us {
            second.good[job.client] += 1;
            if job.honest {
                second.good_by_priority[job.priority as usize] += 1;
            }
        }
        second.latencies_us.push(latency);
    }
}
