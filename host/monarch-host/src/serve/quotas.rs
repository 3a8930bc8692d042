//! How much each principal may ask of the server: a request rate (a token
//! bucket per principal), and quotas on what its unfinished jobs and its
//! persistent meshes hold (jobs, procs, Wasm memory).
//!
//! - QU-1: a request beyond its principal's rate is answered 429 with
//!   `Retry-After`, before anything else is done for it.
//! - QU-2: a job, session or mesh that would take its principal over a
//!   quota is refused (429) with the quota, the use, the ask and where the
//!   cap comes from; nothing of it is stored. Checking and recording are
//!   one step under [`State::admission`](super::State), so two requests
//!   at once cannot both slip under a cap.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use super::State;
use super::handlers::{Fail, fail};
use super::principals::Principal;

/// Requests per second and burst of each principal; `per_second` 0: no
/// limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests per second, sustained.
    pub per_second: f64,
    /// Requests at once after a quiet spell.
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            per_second: 100.0,
            burst: 200,
        }
    }
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

/// A token bucket per principal (QU-1).
pub(crate) struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub(crate) fn new(limit: RateLimit) -> RateLimiter {
        RateLimiter {
            limit,
            buckets: Mutex::default(),
        }
    }

    /// Takes one request of `principal`'s; `Err(wait)` when its bucket is
    /// empty, with how long until the next token.
    pub(crate) fn take(&self, principal: &str, now: Instant) -> Result<(), Duration> {
        let RateLimit { per_second, burst } = self.limit;
        if per_second <= 0.0 {
            return Ok(());
        }
        let burst = f64::from(burst.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(principal.to_string()).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / per_second))
        }
    }
}

/// What a principal holds now, or what one request asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) jobs: u64,
    pub(crate) procs: u64,
    pub(crate) memory_mib: u64,
}

/// What `principal` holds: its unfinished jobs (sessions included), the
/// procs of their fresh meshes and of its persistent meshes, the memory
/// its jobs asked for.
pub(crate) fn usage(state: &State, principal: &str) -> Usage {
    let mut usage = Usage::default();
    for job in state.live().values().filter(|job| job.owner == principal) {
        usage.jobs += 1;
        usage.procs += job.procs;
        usage.memory_mib += job.memory_mib;
    }
    let meshes = state.persistent.lock().unwrap_or_else(|p| p.into_inner());
    for mesh in meshes
        .values()
        .filter(|m| m.owner.as_deref() == Some(principal))
    {
        usage.procs += u64::from(mesh.procs);
    }
    drop(meshes);
    let creating = state.creating.lock().unwrap_or_else(|p| p.into_inner());
    for (owner, procs) in creating.values() {
        if owner == principal {
            usage.procs += u64::from(*procs);
        }
    }
    usage
}

/// Refuses `ask` if it takes `principal` over a quota (QU-2). The caller
/// holds [`State::admission`](super::State) until what it asked for is
/// recorded.
pub(crate) fn check(state: &State, principal: &Principal, ask: Usage) -> Result<(), Fail> {
    let held = usage(state, &principal.name);
    let caps = [
        (
            "jobs",
            "max_jobs",
            "--max-jobs-per-principal",
            principal.quota.max_jobs,
            principal.overridden.max_jobs,
            held.jobs,
            ask.jobs,
            "",
        ),
        (
            "procs",
            "max_procs",
            "--max-procs-per-principal",
            principal.quota.max_procs,
            principal.overridden.max_procs,
            held.procs,
            ask.procs,
            "; ask for fewer with limits.procs (`submit --procs`)",
        ),
        (
            "memory",
            "max_memory_mib",
            "--max-memory-per-principal-mib",
            principal.quota.max_memory_mib,
            principal.overridden.max_memory_mib,
            held.memory_mib,
            ask.memory_mib,
            "; ask for less with limits.memory_mib (`submit --memory`)",
        ),
    ];
    for (what, key, flag, cap, overridden, held, ask, hint) in caps {
        let Some(cap) = cap else { continue };
        if ask == 0 || held.saturating_add(ask) <= cap {
            continue;
        }
        let from = match overridden {
            Some(_) => format!("{key}={cap} on its line of the tokens file"),
            None => format!("{flag} {cap}"),
        };
        let (held, ask) = match what {
            "jobs" => (format!("{held} unfinished job(s)"), "one more".to_string()),
            "memory" => (format!("{held} MiB"), format!("{ask} MiB")),
            _ => (format!("{held} proc(s)"), format!("{ask}")),
        };
        return Err(fail(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "over the {what} quota of principal `{}`: it holds {held} and asks for {ask}, over its cap ({from}){hint}",
                principal.name
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qu_1_a_bucket_allows_its_burst_then_its_rate() {
        let limiter = RateLimiter::new(RateLimit {
            per_second: 10.0,
            burst: 3,
        });
        let start = Instant::now();
        for _ in 0..3 {
            assert!(limiter.take("a", start).is_ok());
        }
        let wait = limiter.take("a", start).unwrap_err();
        assert!(
            wait > Duration::from_millis(50) && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        // Another principal has its own bucket.
        assert!(limiter.take("b", start).is_ok());
        // A tenth of a second later, one more.
        let later = start + Duration::from_millis(101);
        assert!(limiter.take("a", later).is_ok());
        assert!(limiter.take("a", later).is_err());
        let off = RateLimiter::new(RateLimit {
            per_second: 0.0,
            burst: 1,
        });
        for _ in 0..1000 {
            assert!(off.take("a", start).is_ok());
        }
    }
}
