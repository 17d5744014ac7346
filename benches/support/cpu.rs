//! Where the machine's CPU went while a phase ran, by process, read from `/proc`: so a
//! rate can be printed beside what each part spent per unit of work (PostgreSQL, Inlet,
//! the benchmark's own HTTP target, the peer's Node.js process), and a gap explained by
//! a figure instead of a guess.
//!
//! A thread reads every process's `utime + stime` every 250 ms and keeps the last
//! reading of each, so a process that exits during the phase (an autovacuum worker, a
//! backend whose connection closed) is counted up to its last reading. A process seen
//! at the start counts from that reading; one that appears later counts from zero (it
//! started inside the phase). Times in `/proc` are in `USER_HZ` ticks, which Linux
//! reports as 100 per second on every architecture it runs on (`sysconf(_SC_CLK_TCK)`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TICKS_PER_SECOND: f64 = 100.0;
const PERIOD: Duration = Duration::from_millis(250);

/// A running measurement; [`CpuMeter::stop`] ends it.
pub struct CpuMeter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Readings>>,
}

/// What one process was seen to spend.
struct Seen {
    comm: String,
    from: u64,
    last: u64,
}

struct Readings {
    procs: HashMap<u32, Seen>,
    wall: Duration,
    /// (idle + iowait, all) ticks of the whole machine over the phase.
    idle: (u64, u64),
}

/// CPU seconds by group over one phase.
pub struct CpuSpent {
    pub wall: Duration,
    groups: HashMap<&'static str, f64>,
    /// Share of all cores' time that was idle.
    pub idle: f64,
}

impl CpuSpent {
    /// CPU seconds of a group (0 if no process of it ran).
    pub fn seconds(&self, group: &str) -> f64 {
        self.groups.get(group).copied().unwrap_or(0.0)
    }

    /// Microseconds of CPU of a group per unit of work, for `units` units.
    pub fn micros_per(&self, group: &str, units: usize) -> f64 {
        self.seconds(group) * 1e6 / units.max(1) as f64
    }
}

impl CpuMeter {
    pub fn start() -> CpuMeter {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let began = Instant::now();
            let idle_before = machine_ticks();
            let mut procs: HashMap<u32, Seen> = HashMap::new();
            for (pid, comm, ticks) in processes() {
                procs.insert(pid, Seen { comm, from: ticks, last: ticks });
            }
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(PERIOD);
                read_into(&mut procs);
            }
            read_into(&mut procs);
            let idle_after = machine_ticks();
            Readings {
                procs,
                wall: began.elapsed(),
                idle: (idle_after.0.saturating_sub(idle_before.0), idle_after.1.saturating_sub(idle_before.1)),
            }
        });
        CpuMeter { stop, thread: Some(thread) }
    }

    /// Ends the measurement; `group` names each process's group from its pid and its
    /// command name (`comm`, at most 15 bytes).
    pub fn stop(mut self, group: impl Fn(u32, &str) -> &'static str) -> CpuSpent {
        self.stop.store(true, Ordering::Relaxed);
        let readings = self.thread.take().expect("stopped once").join().expect("the CPU meter thread panicked");
        let mut groups = HashMap::new();
        for (pid, seen) in &readings.procs {
            let spent = seen.last.saturating_sub(seen.from) as f64 / TICKS_PER_SECOND;
            if spent > 0.0 {
                *groups.entry(group(*pid, &seen.comm)).or_insert(0.0) += spent;
            }
        }
        let (idle, all) = readings.idle;
        CpuSpent { wall: readings.wall, groups, idle: if all == 0 { 0.0 } else { idle as f64 / all as f64 } }
    }
}

impl Drop for CpuMeter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn read_into(procs: &mut HashMap<u32, Seen>) {
    for (pid, comm, ticks) in processes() {
        let seen = procs.entry(pid).or_insert_with(|| Seen { comm: comm.clone(), from: 0, last: 0 });
        if seen.comm != comm && ticks < seen.last {
            // The pid was reused by a new process within the phase (rare over a few
            // seconds): the old one stays as last seen, the new one is not counted.
            continue;
        }
        seen.last = seen.last.max(ticks);
    }
}

/// Every process: (pid, comm, utime + stime in ticks). Processes that vanish while
/// being read are skipped.
fn processes() -> Vec<(u32, String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (comm, ticks) = parse_stat(&stat)?;
        Some((pid, comm, ticks))
    })
    .collect()
}

/// `pid (comm) state ppid … utime stime …`: the command name may hold spaces and
/// parentheses, so the fields are counted from the last `)`; utime and stime are the
/// 14th and 15th fields.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let mut rest = stat.get(close + 1..)?.split_ascii_whitespace().skip(11);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

/// The machine's (idle + iowait, all) ticks so far, from `/proc/stat`'s `cpu` line.
fn machine_ticks() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else { return (0, 0) };
    let fields: Vec<u64> = line.split_ascii_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let all: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (idle, all)
}
