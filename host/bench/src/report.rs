//! Results: summary statistics and the one-line JSON records on stdout.
//!
//! Stdout carries nothing but records, one JSON object a line, so that a
//! script can read it without parsing prose; everything for people goes to
//! stderr through `tracing`.

use std::io::Write;

/// Units the suites report in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Microseconds, for round trips.
    Micros,
    /// Completed calls per second.
    CallsPerSec,
    /// Delivered messages per second.
    MsgsPerSec,
    /// Nanoseconds, for host calls.
    Nanos,
    /// Milliseconds, for spawning.
    Millis,
    /// Seconds, for whole runs of a program.
    Seconds,
    /// Mebibytes, for memory held.
    MiB,
}

impl Unit {
    /// The unit as written in a record.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Micros => "us",
            Unit::CallsPerSec => "calls/s",
            Unit::MsgsPerSec => "msgs/s",
            Unit::Nanos => "ns",
            Unit::Millis => "ms",
            Unit::Seconds => "s",
            Unit::MiB => "MiB",
        }
    }

    /// Rounds a value to the precision worth printing in this unit: times
    /// to two decimals (seconds to three), but to three significant digits
    /// below one unit, so that a small figure keeps its precision.
    fn round(self, value: f64) -> f64 {
        let decimals = |places: i32| {
            let scale = 10_f64.powi(places);
            (value * scale).round() / scale
        };
        match self {
            Unit::Micros | Unit::Nanos | Unit::Millis | Unit::Seconds | Unit::MiB => {
                let places = if self == Unit::Seconds { 3 } else { 2 };
                if value.abs() >= 1.0 || value == 0.0 || !value.is_finite() {
                    decimals(places)
                } else {
                    // Three significant digits: 0.0123 has its first at 10^-2.
                    let first = value.abs().log10().floor() as i32;
                    decimals(places.max(2 - first))
                }
            }
            Unit::CallsPerSec | Unit::MsgsPerSec => value.round(),
        }
    }
}

/// Units of bulk throughput, for the data plane. Apart from [`Unit`] so
/// that the suites that match on every [`Unit`] need not know them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// Gigabits (10^9 bits) per second, for bytes moved.
    Gbps,
    /// Billions of floating-point operations per second, for matmul.
    Gflops,
}

impl Rate {
    /// The unit as written in a record.
    pub fn as_str(self) -> &'static str {
        match self {
            Rate::Gbps => "Gbit/s",
            Rate::Gflops => "GFLOP/s",
        }
    }

    /// Rounds a value to the precision worth printing: two decimals.
    fn round(self, value: f64) -> f64 {
        (value * 100.0).round() / 100.0
    }
}

/// Writes one record to stdout and flushes it, so that a reader sees each
/// figure as soon as it is measured.
pub fn emit(suite: &str, metric: &str, value: f64, unit: Unit) -> anyhow::Result<()> {
    write_record(suite, metric, value, unit.round(value), unit.as_str())
}

/// [`emit`] for a figure in a [`Rate`] unit.
pub fn emit_rate(suite: &str, metric: &str, value: f64, unit: Rate) -> anyhow::Result<()> {
    write_record(suite, metric, value, unit.round(value), unit.as_str())
}

fn write_record(
    suite: &str,
    metric: &str,
    value: f64,
    rounded: f64,
    unit: &str,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        rounded.is_finite() && rounded > 0.0,
        "{metric} measured {value} {unit}, which is not a positive time or rate",
    );
    let record = record(suite, metric, rounded, unit);
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{record}")?;
    stdout.flush()?;
    Ok(())
}

/// One record as a JSON line, fields in the documented order (suite,
/// metric, value, unit), which `serde_json`'s maps would sort.
fn record(suite: &str, metric: &str, value: f64, unit: &str) -> String {
    let text = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "{{\"suite\":{},\"metric\":{},\"value\":{},\"unit\":{}}}",
        text(suite),
        text(metric),
        serde_json::Value::from(value),
        text(unit)
    )
}

/// The `q`-quantile (0.0 ..= 1.0) of `samples`, by the nearest-rank method
/// on a sorted copy. `None` for no samples.
pub fn quantile(samples: &[f64], q: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64).round() as usize;
    Some(sorted[rank])
}

/// The median of `samples`; `None` for no samples.
pub fn median(samples: &[f64]) -> Option<f64> {
    quantile(samples, 0.5)
}

/// Median, 10th and 90th percentile of round-trip samples, for the log.
pub struct Spread {
    /// 10th percentile.
    pub p10: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Spread {
    /// The spread of `samples`; `None` for no samples.
    pub fn of(samples: &[f64]) -> Option<Spread> {
        Some(Spread {
            p10: quantile(samples, 0.10)?,
            p50: quantile(samples, 0.50)?,
            p90: quantile(samples, 0.90)?,
            p99: quantile(samples, 0.99)?,
        })
    }
}

/// Logs the spread of `samples` of `metric` (samples, p10, p50, p90,
/// p99) with the message `what` (what they are and their unit); nothing
/// for no samples.
pub fn log_spread(metric: &str, samples: &[f64], what: &str) {
    if let Some(spread) = Spread::of(samples) {
        tracing::info!(
            metric,
            samples = samples.len(),
            p10 = format!("{:.2}", spread.p10),
            p50 = format!("{:.2}", spread.p50),
            p90 = format!("{:.2}", spread.p90),
            p99 = format!("{:.2}", spread.p99),
            "{what}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts_picks_a_middle_sample() {
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        let even = median(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert!(even == 2.0 || even == 3.0, "{even}");
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn quantiles_span_the_samples() {
        let samples: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(quantile(&samples, 0.0), Some(1.0));
        assert_eq!(quantile(&samples, 0.1), Some(11.0));
        assert_eq!(quantile(&samples, 0.99), Some(100.0));
        assert_eq!(quantile(&samples, 1.0), Some(101.0));
    }

    #[test]
    fn units_round_to_what_is_worth_printing() {
        assert_eq!(Unit::Micros.round(14.236), 14.24);
        assert_eq!(Unit::CallsPerSec.round(1234.6), 1235.0);
        assert_eq!(Unit::Millis.round(0.123_456), 0.123);
        assert_eq!(Unit::Millis.round(0.004_567_8), 0.004_57);
        assert_eq!(Unit::Seconds.round(12.345_67), 12.346);
        assert_eq!(Unit::Seconds.round(0.028_76), 0.028_8);
        assert_eq!(Unit::Seconds.round(0.287_6), 0.288);
        assert_eq!(Rate::Gbps.round(14.356), 14.36);
        assert_eq!(Rate::Gflops.round(103.114), 103.11);
    }

    #[test]
    fn rates_of_bytes_and_flops_have_their_units() {
        let line = record("dataplane", "raw_tcp_gbps", 14.36, Rate::Gbps.as_str());
        assert_eq!(
            line,
            r#"{"suite":"dataplane","metric":"raw_tcp_gbps","value":14.36,"unit":"Gbit/s"}"#
        );
        let line = record("dataplane", "matmul_gflops", 103.11, Rate::Gflops.as_str());
        assert!(line.ends_with(r#""unit":"GFLOP/s"}"#), "{line}");
        assert!(emit_rate("t", "m", 0.001, Rate::Gbps).is_err());
    }

    #[test]
    fn records_are_json_in_the_documented_order() {
        let line = record("runtime", "ipc_call_rtt_us", 14.2, Unit::Micros.as_str());
        assert_eq!(
            line,
            r#"{"suite":"runtime","metric":"ipc_call_rtt_us","value":14.2,"unit":"us"}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["value"], 14.2);
        let rate = record(
            "runtime",
            "ipc_calls_per_s",
            141678.0,
            Unit::CallsPerSec.as_str(),
        );
        assert!(
            rate.contains(r#""value":141678.0,"unit":"calls/s""#),
            "{rate}"
        );
    }

    #[test]
    fn a_zero_or_non_finite_figure_is_refused() {
        assert!(emit("t", "m", 0.0, Unit::Micros).is_err());
        assert!(emit("t", "m", f64::NAN, Unit::Micros).is_err());
        assert!(emit("t", "m", f64::INFINITY, Unit::CallsPerSec).is_err());
        assert!(emit_rate("t", "m", f64::NAN, Rate::Gflops).is_err());
    }
}
