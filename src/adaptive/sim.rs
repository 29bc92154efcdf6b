//! A simulated upstream on a simulated clock for the controller's tests: `servers` requests are
//! processed at once, each for the service time (±20 %), the rest wait in its FIFO queue — the
//! shape of a thread-pool server. Clients send Bernoulli arrivals (Poisson-like) every 100 µs
//! through their own controller and admission rule, as Weir instances would.

use std::collections::VecDeque;
use std::time::Duration;

use super::admission::{Occupancy, Priority};
use super::controller::{Controller, Settings};

const TICK_US: u64 = 100;

/// A deterministic generator (the tests must be reproducible).
struct Lcg(u64);

impl Lcg {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Job {
    client: usize,
    priority: Priority,
    sent_us: u64,
}

/// One sending instance: its offered load per priority and its controller.
pub struct Client {
    pub controller: Controller,
    /// Requests per second, per priority.
    pub rates: Vec<(Priority, f64)>,
    occupancy: Occupancy,
}

impl Client {
    pub fn new(settings: Settings, rates: Vec<(Priority, f64)>) -> Self {
        Self { controller: Controller::new(settings), rates, occupancy: Occupancy::default() }
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
    /// Per priority: (sent, shed).
    pub by_priority: [(u64, u64); 3],
    /// The limit per client at the end of the second.
    pub limits: Vec<u32>,
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

pub struct Sim {
    pub clients: Vec<Client>,
    service_us: u64,
    /// In service: (ends at, job).
    busy: Vec<(u64, Job)>,
    queue: VecDeque<Job>,
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
            let mut second = Second { served: vec![0; n], good: vec![0; n], shed: vec![0; n], ..Default::default() };
            for _ in 0..(1_000_000 / TICK_US) {
                self.tick(servers, &mut second);
            }
            second.limits = self.clients.iter().map(|c| c.controller.limit()).collect();
            out.push(second);
        }
        out
    }

    fn tick(&mut self, servers: usize, second: &mut Second) {
        self.now_us += TICK_US;
        let now = self.now_us;
        // Answers.
        let mut i = 0;
        while i < self.busy.len() {
            if self.busy[i].0 <= now {
                let (_, job) = self.busy.swap_remove(i);
                let latency = now - job.sent_us;
                let client = &mut self.clients[job.client];
                client.occupancy.leave(job.priority);
                client.controller.sample(now, Duration::from_micros(latency), client.occupancy.total());
                second.served[job.client] += 1;
                if latency <= self.slo_us {
                    second.good[job.client] += 1;
                }
                second.latencies_us.push(latency);
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
                second.by_priority[priority as usize].0 += 1;
                let client = &mut self.clients[c];
                if client.occupancy.may_enter(client.controller.limit(), priority) {
                    client.occupancy.enter(priority);
                    client.controller.observe_in_flight(client.occupancy.total());
                    self.queue.push_back(Job { client: c, priority, sent_us: now });
                } else {
                    second.shed[c] += 1;
                    second.by_priority[priority as usize].1 += 1;
                }
            }
        }
        // The upstream starts what it has room for.
        while self.busy.len() < servers {
            let Some(job) = self.queue.pop_front() else { break };
            let jitter = 0.8 + 0.4 * self.rng.next_f64();
            let ends = now + (self.service_us as f64 * jitter) as u64;
            self.busy.push((ends, job));
        }
    }
}
