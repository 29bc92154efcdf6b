//! The process metrics every Prometheus client exports (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`, `process_threads`), read from /proc/self at
//! each scrape. The `prometheus` crate's own collector needs `procfs`, one more dependency tree
//! for a few numbers that /proc gives as text. Elsewhere than Linux the family is empty.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, IntGauge, Opts};

/// What one read of /proc/self gives, in base units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
    /// Seconds since the epoch.
    pub start_time: f64,
}

/// Parses `/proc/self/stat` (`ticks`: clock ticks per second, `page`: page size in bytes,
/// `boot_time`: `btime` of /proc/stat). The command name, in parentheses, may hold spaces and
/// parentheses itself: the fields are counted from the last `)`.
pub fn parse_stat(stat: &str, ticks: f64, page: u64, boot_time: u64) -> Option<Sample> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. of proc(5); index 0 here is field 3 (state).
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let (utime, stime) = (field(14)?, field(15)?);
    Some(Sample {
        cpu_seconds: (utime + stime) as f64 / ticks,
        threads: field(20)?,
        start_time: boot_time as f64 + field(22)? as f64 / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)?.saturating_mul(page),
    })
}

/// `btime` of `/proc/stat`: the boot time, seconds since the epoch.
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

pub struct ProcessCollector {
    descs: Vec<Desc>,
    cpu: Counter,
    resident: IntGauge,
    virtual_memory: IntGauge,
    open_fds: IntGauge,
    max_fds: IntGauge,
    start_time: Gauge,
    threads: IntGauge,
}

impl ProcessCollector {
    pub fn new() -> Result<Self, prometheus::Error> {
        let cpu = Counter::with_opts(Opts::new("process_cpu_seconds_total", "User and system CPU time, in seconds."))?;
        let resident =
            IntGauge::with_opts(Opts::new("process_resident_memory_bytes", "Resident memory size in bytes."))?;
        let virtual_memory =
            IntGauge::with_opts(Opts::new("process_virtual_memory_bytes", "Virtual memory size in bytes."))?;
        let open_fds = IntGauge::with_opts(Opts::new("process_open_fds", "Open file descriptors."))?;
        let max_fds = IntGauge::with_opts(Opts::new(
            "process_max_fds",
            "The limit on open file descriptors (soft RLIMIT_NOFILE).",
        ))?;
        let start_time = Gauge::with_opts(Opts::new(
            "process_start_time_seconds",
            "Start time of the process, in seconds since the Unix epoch.",
        ))?;
        let threads = IntGauge::with_opts(Opts::new("process_threads", "Threads of the process."))?;
        let mut descs = Vec::new();
        for collector in
            [&cpu as &dyn Collector, &resident, &virtual_memory, &open_fds, &max_fds, &start_time, &threads]
        {
            descs.extend(collector.desc().into_iter().cloned());
        }
        Ok(Self { descs, cpu, resident, virtual_memory, open_fds, max_fds, start_time, threads })
    }

    fn read(&self) -> Option<()> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
        let sample = parse_stat(&stat, clock_ticks(), page_size(), boot)?;
        // A counter only goes up: add what the process used since the last scrape.
        let used = sample.cpu_seconds - self.cpu.get();
        if used > 0.0 {
            self.cpu.inc_by(used);
        }
        self.resident.set(i64::try_from(sample.resident_bytes).unwrap_or(i64::MAX));
        self.virtual_memory.set(i64::try_from(sample.virtual_bytes).unwrap_or(i64::MAX));
        self.threads.set(i64::try_from(sample.threads).unwrap_or(i64::MAX));
        self.start_time.set(sample.start_time);
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle read_dir holds is one of them.
            self.open_fds.set(fds.count().saturating_sub(1) as i64);
        }
        if let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::NOFILE) {
            self.max_fds.set(i64::try_from(soft).unwrap_or(i64::MAX));
        }
        Some(())
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is shared.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

fn page_size() -> u64 {
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if self.read().is_none() {
            return Vec::new();
        }
        [&self.cpu as &dyn Collector, &self.resident, &self.virtual_memory, &self.open_fds, &self.max_fds]
            .into_iter()
            .chain([&self.start_time as &dyn Collector, &self.threads])
            .flat_map(|c| c.collect())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_a_name_that_has_spaces_and_parentheses() {
        // proc(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime priority nice num_threads itrealvalue starttime vsize rss …
        let stat = "4242 (we ir) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 12000 \
                    104857600 2560 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(stat, 100.0, 4096, 1_700_000_000).expect("parsed");
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.threads, 7);
        assert_eq!(s.start_time, 1_700_000_120.0);
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.resident_bytes, 2560 * 4096);
        assert_eq!(parse_stat("12 (cut) S 1 2", 100.0, 4096, 0), None);
        assert_eq!(parse_boot_time("cpu 1 2 3\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000));
    }

    #[test]
    fn reads_this_process() {
        let c = ProcessCollector::new().expect("collector");
        let families = c.collect();
        let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
        assert_eq!(names.len(), 7, "{names:?}");
        let value = |name: &str| {
            let f = families.iter().find(|f| f.name() == name).unwrap_or_else(|| panic!("{name}"));
            let m = &f.get_metric()[0];
            m.get_gauge().get_value().max(m.get_counter().get_value())
        };
        assert!(value("process_resident_memory_bytes") > 1_000_000.0);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        assert!(value("process_threads") >= 1.0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let start = value("process_start_time_seconds");
        assert!(start <= now + 1.0 && start > now - 3600.0, "started {start}, now {now}");
    }
}
