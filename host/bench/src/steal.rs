//! CPU time the hypervisor took from this machine while a figure was
//! measured ("steal" in `/proc/stat`).
//!
//! On a shared virtual machine a vCPU that wants to run may wait while the
//! host runs another guest. The guest's kernel counts that time as stolen.
//! On the 2-vCPU VMs of `docs/benchmarks.md`, the hypervisor took 14 - 36 %
//! of the machine's CPU time in some minutes and about none in others.
//! A 16-proc gather then took 1.7 - 3.5 times as long. A suite that compares
//! systems measured minutes apart uses this to see which rounds ran on a
//! whole machine.

use std::path::Path;

/// The machine's CPU time so far, in clock ticks, from `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks a vCPU wanted to run and the hypervisor ran something else.
    stolen: u64,
    /// Ticks of every kind: user, nice, system, idle, iowait, irq,
    /// softirq and steal (guest time is already in user).
    total: u64,
}

impl CpuTimes {
    /// The machine's CPU times now; `None` where there is no `/proc/stat`
    /// (not Linux) or it cannot be read.
    pub fn now() -> Option<CpuTimes> {
        read(Path::new("/proc/stat"))
    }

    /// The share of all CPU time between `self` (earlier) and `later`
    /// that was stolen, in percent; `None` when no time passed.
    pub fn stolen_pct_until(&self, later: &CpuTimes) -> Option<f64> {
        let total = later.total.checked_sub(self.total)?;
        let stolen = later.stolen.checked_sub(self.stolen)?;
        (total > 0).then(|| 100.0 * stolen as f64 / total as f64)
    }

    /// Times of `stolen` out of `total` ticks, for tests.
    #[cfg(test)]
    pub fn from_ticks(stolen: u64, total: u64) -> Option<CpuTimes> {
        Some(CpuTimes { stolen, total })
    }
}

fn read(path: &Path) -> Option<CpuTimes> {
    parse(&std::fs::read_to_string(path).ok()?)
}

/// The aggregate `cpu` line of a `/proc/stat` text.
fn parse(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    // Kernels before 2.6.11 have no steal column.
    let stolen = *ticks.get(7)?;
    Some(CpuTimes {
        stolen,
        total: ticks.iter().sum(),
    })
}

/// The stolen share of a span of work: started with [`Span::begin`],
/// read with [`Span::stolen_pct`].
#[derive(Debug, Clone, Copy)]
pub struct Span(Option<CpuTimes>);

impl Span {
    /// A span that begins now.
    pub fn begin() -> Span {
        Span(CpuTimes::now())
    }

    /// The machine's CPU times when the span began.
    pub fn start(&self) -> Option<CpuTimes> {
        self.0
    }

    /// The percentage of the machine's CPU time stolen since the span
    /// began; `None` where that cannot be told.
    pub fn stolen_pct(&self) -> Option<f64> {
        self.0?.stolen_pct_until(&CpuTimes::now()?)
    }
}

/// A stolen share for the log: `12.3 %`, or `?` when it cannot be told.
pub fn pct(stolen: Option<f64>) -> String {
    stolen.map_or_else(|| "?".to_string(), |s| format!("{s:.1} %"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "cpu  2676227 217586 303468 2137000 8934 0 8771 36686 0 0\n\
                          cpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2 3\n";
    const AFTER: &str = "cpu  2676540 217586 303576 2137595 8934 0 8774 37120 0 0\n";

    #[test]
    fn the_stolen_share_is_steal_over_every_kind_of_tick() {
        let before = parse(BEFORE).unwrap();
        let after = parse(AFTER).unwrap();
        // user 313, system 108, idle 595, softirq 3, steal 434: 1453 ticks.
        let pct = before.stolen_pct_until(&after).unwrap();
        assert!((pct - 100.0 * 434.0 / 1453.0).abs() < 1e-9, "{pct}");
        assert_eq!(before.stolen_pct_until(&before), None);
        // A counter that went back (another machine's text) tells nothing.
        assert_eq!(after.stolen_pct_until(&before), None);
    }

    #[test]
    fn a_stat_without_a_steal_column_or_a_cpu_line_tells_nothing() {
        assert_eq!(parse("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(parse("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(pct(None), "?");
        assert_eq!(pct(Some(12.34)), "12.3 %");
    }

    #[test]
    fn this_machine_s_span_reads_when_it_has_proc_stat() {
        let span = Span::begin();
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(60) {
            std::hint::spin_loop();
        }
        if Path::new("/proc/stat").exists() {
            let stolen = span
                .stolen_pct()
                .expect("ticks passed in 60 ms of spinning");
            assert!((0.0..=100.0).contains(&stolen), "{stolen}");
        }
    }
}
