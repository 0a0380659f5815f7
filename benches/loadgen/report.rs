//! What the load generator prints: the machine (cores, CPU model, load), and each run as
//! rows of Markdown tables that paste straight into BENCHMARKS.md.
//!
//! Load is recorded twice because the machine is shared: the 1-minute load average at
//! the start and end of each run (which our own run raises), and the CPU other processes
//! used *during* the run (`/proc/stat` busy time minus this process's own), which is the
//! number that says whether a measurement was disturbed.

use crate::engine::{RunResult, percentile};
use ratelimit::pb::Source;
use std::fmt::Write as _;
use std::time::Duration;

/// Clock ticks per second in `/proc` (USER_HZ; 100 on every Linux build we know of).
pub const TICKS_PER_SEC: f64 = 100.0;
/// Other processes using more than this many cores during a run disturbed it.
pub const FOREIGN_CPU_WARN: f64 = 0.25;

/// The 1-minute load average, or NaN where `/proc/loadavg` is unreadable.
pub fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// The machine, for the report's header.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    let profile = if cfg!(debug_assertions) {
        "DEBUG build (numbers meaningless; use cargo bench)"
    } else {
        "optimised build"
    };
    format!(
        "machine: {cores} cores, {model}; load average {}; {profile}",
        load.join(" ")
    )
}

/// Busy CPU ticks of the whole machine and of this process.
pub fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)? + v.get(7)?;
    let me = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_comm = me.rsplit_once(')')?.1;
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of proc(5) (utime, stime); the slice starts at field 3.
    let own = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((busy, own))
}

/// Measures the CPU other processes use between `start` and `foreign_cores`.
pub struct CpuSampler {
    at: std::time::Instant,
    ticks: Option<(u64, u64)>,
}

impl CpuSampler {
    pub fn start() -> Self {
        Self {
            at: std::time::Instant::now(),
            ticks: cpu_ticks(),
        }
    }

    /// Cores' worth of CPU used by other processes since `start`.
    pub fn foreign_cores(&self) -> Option<f64> {
        let (busy0, own0) = self.ticks?;
        let (busy1, own1) = cpu_ticks()?;
        let secs = self.at.elapsed().as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        let foreign = (busy1.saturating_sub(busy0)) as f64 - (own1.saturating_sub(own0)) as f64;
        Some((foreign / TICKS_PER_SEC / secs).max(0.0))
    }
}

/// A latency for humans: µs below 1 ms, ms below 1 s, else s.
pub fn fmt_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns < 1e6 {
        format!("{:.0} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

fn pct(sorted: &[u64], p: f64) -> String {
    percentile(sorted, p).map_or_else(|| "–".into(), fmt_ns)
}

fn load_cell(r: &RunResult) -> String {
    let foreign = r
        .foreign_cores
        .map_or_else(|| "?".into(), |c| format!("{c:.2}"));
    format!("{:.2}→{:.2} / {foreign}", r.load.0, r.load.1)
}

/// Throughput and latency of every run.
pub fn throughput_table(runs: &[RunResult]) -> String {
    let mut t = String::from(
        "| run | clients | conns | keys | limit | checks | secs | checks/s | p50 | p90 | p99 | p99.9 | max | allowed | denied | unshared | errors | load 1m start→end / other procs (cores) |\n\
         |---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n",
    );
    for r in runs {
        let errors: u64 = r.errors.values().sum();
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.spec.label,
            r.spec.concurrency,
            r.connections,
            r.spec.keys,
            if r.spec.limit.is_empty() {
                "(default)"
            } else {
                &r.spec.limit
            },
            r.checks(),
            r.elapsed.as_secs_f64(),
            r.throughput(),
            pct(&r.sorted_ns, 50.0),
            pct(&r.sorted_ns, 90.0),
            pct(&r.sorted_ns, 99.0),
            pct(&r.sorted_ns, 99.9),
            pct(&r.sorted_ns, 100.0),
            r.allowed(),
            r.denied(),
            r.unshared(),
            errors,
            load_cell(r),
        );
    }
    t
}

/// Store requests per check against the ADR's baseline of a read plus a write per check.
pub fn store_table(runs: &[RunResult]) -> String {
    let mut t = String::from(
        "| run | checks | allowed | denied | from deny cache | from lease | emulator requests (GET / PUT / 412) | successful writes | requests per check | writes per admitted | PUTs per admitted | ADR baseline: 2 per check | ours vs baseline |\n\
         |---|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|\n",
    );
    for r in runs {
        let Some(s) = &r.store else { continue };
        let checks = r.checks();
        let baseline = 2 * checks;
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} ({} / {} / {}) | {} | {:.3} | {} | {} | {} | {:.1} % |",
            r.spec.label,
            checks,
            r.allowed(),
            r.denied(),
            r.by_source(Source::DenyCache),
            r.by_source(Source::Lease),
            s.requests,
            s.gets,
            s.puts,
            s.conflicts,
            s.writes,
            s.requests as f64 / checks.max(1) as f64,
            match r.allowed() {
                0 => "–".to_owned(),
                a => format!("{:.3}", s.writes as f64 / a as f64),
            },
            match r.allowed() {
                0 => "–".to_owned(),
                a => format!("{:.3}", s.puts as f64 / a as f64),
            },
            baseline,
            100.0 * s.requests as f64 / baseline.max(1) as f64,
        );
    }
    t
}

/// Admitted checks per window, for runs where the limit can be reached.
pub fn admitted_lines(runs: &[RunResult]) -> String {
    let mut t = String::new();
    for r in runs {
        let per: Vec<String> = r
            .admitted_by_window
            .iter()
            .map(|(w, n)| format!("window {w}: {n}"))
            .collect();
        let _ = writeln!(
            t,
            "- {}: admitted {} of {} ({}); shared {}, local fallback {}, deny cache {}",
            r.spec.label,
            r.allowed(),
            r.checks(),
            if per.is_empty() {
                "none".to_owned()
            } else {
                per.join(", ")
            },
            r.shared(),
            r.by_source(Source::LocalFallback),
            r.by_source(Source::DenyCache),
        );
        if !r.errors.is_empty() {
            let _ = writeln!(t, "  - errors: {:?}", r.errors);
        }
    }
    t
}

/// Latency per time slice of one run (by send time), with the store requests that
/// arrived and the breaker state at each slice's end.
pub fn slice_table(r: &RunResult) -> String {
    let Some(every) = r.spec.slice else {
        return String::new();
    };
    let every_us = every.as_micros().max(1);
    let n = r
        .samples
        .iter()
        .map(|s| (u128::from(s.at_us) / every_us) as usize + 1)
        .max()
        .unwrap_or(0);
    let mut t = String::from(
        "| sent during | checks | p50 | p90 | p99 | max | shared | local fallback | store requests arrived | breaker at end |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n",
    );
    for k in 0..n {
        let in_slice: Vec<_> = r
            .samples
            .iter()
            .filter(|s| (u128::from(s.at_us) / every_us) as usize == k)
            .collect();
        let mut lat: Vec<u64> = in_slice
            .iter()
            .filter(|s| s.source >= 0)
            .map(|s| s.latency_ns)
            .collect();
        lat.sort_unstable();
        let shared = in_slice.iter().filter(|s| s.shared).count();
        let local = in_slice
            .iter()
            .filter(|s| s.source == Source::LocalFallback as i32)
            .count();
        let (arrived, breaker) = match (r.slices.get(k), r.slices.get(k + 1)) {
            (Some(a), Some(b)) => (
                match (a.received, b.received) {
                    (Some(x), Some(y)) => (y - x).to_string(),
                    _ => "–".into(),
                },
                b.breaker.map_or("–", |s| s.as_str()).to_owned(),
            ),
            _ => ("–".into(), "(run ended)".into()),
        };
        let from = Duration::from_micros((every_us * k as u128) as u64);
        let to = from + every;
        let _ = writeln!(
            t,
            "| {:.1}–{:.1} s | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            from.as_secs_f64(),
            to.as_secs_f64(),
            in_slice.len(),
            pct(&lat, 50.0),
            pct(&lat, 90.0),
            pct(&lat, 99.0),
            pct(&lat, 100.0),
            shared,
            local,
            arrived,
            breaker,
        );
    }
    t
}

/// The first `n` checks (by send time) of a run: what callers see when an outage starts.
pub fn first_checks_line(r: &RunResult, n: usize) -> String {
    let mut first: Vec<_> = r.samples.clone();
    first.sort_by_key(|s| s.at_us);
    first.truncate(n);
    let mut lat: Vec<u64> = first.iter().map(|s| s.latency_ns).collect();
    lat.sort_unstable();
    let rest: Vec<u64> = {
        let mut all: Vec<_> = r.samples.clone();
        all.sort_by_key(|s| s.at_us);
        let mut v: Vec<u64> = all.iter().skip(n).map(|s| s.latency_ns).collect();
        v.sort_unstable();
        v
    };
    format!(
        "- first {} checks: p50 {}, max {}; the {} after them: p50 {}, p99 {}, p99.9 {}, max {}",
        lat.len(),
        pct(&lat, 50.0),
        pct(&lat, 100.0),
        rest.len(),
        pct(&rest, 50.0),
        pct(&rest, 99.0),
        pct(&rest, 99.9),
        pct(&rest, 100.0),
    )
}

/// A warning when other processes used a noticeable share of the CPU during a run.
pub fn disturbance(runs: &[RunResult]) -> Option<String> {
    let bad: Vec<String> = runs
        .iter()
        .filter(|r| r.foreign_cores.is_some_and(|c| c > FOREIGN_CPU_WARN))
        .map(|r| {
            format!(
                "{} ({:.2} cores)",
                r.spec.label,
                r.foreign_cores.unwrap_or_default()
            )
        })
        .collect();
    (!bad.is_empty()).then(|| {
        format!(
            "WARNING: other processes used more than {FOREIGN_CPU_WARN} cores during: {}; re-run these.",
            bad.join(", ")
        )
    })
}
