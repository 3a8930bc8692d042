//! Time: [`sleep`], [`sleep_until`] and [`timeout`], driven by the same
//! event loop as calls.
//!
//! A program has one thread, which waits in the host's `next-events`
//! whenever every task is pending. A timer is a deadline the reactor keeps:
//! [`block_on`](crate::block_on) asks the host to wait no longer than the
//! earliest one (rounded up to whole milliseconds), and wakes the timers
//! that are due after each wait. So a sleeping program makes no host calls
//! until its deadline or an event, and a sleep and calls can be awaited
//! together, in the controller and in actors' handlers alike.
//!
//! To wait for whichever comes first, a call or a deadline, use
//! [`timeout`], or [`select!`](crate::select!) with a [`sleep`]:
//!
//! ```
//! # use monarch_guest::prelude::*;
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize)] struct Step;
//! # impl Message for Step { const ENDPOINT: &'static str = "step"; type Reply = u64; }
//! # struct Worker;
//! # impl Actor for Worker {
//! #     const CLASS: &'static str = "Worker";
//! #     type Init = ();
//! #     fn create((): (), _cx: &Context) -> Result<Self, String> { Ok(Worker) }
//! #     fn endpoints(endpoints: &mut Endpoints<Self>) { endpoints.handle::<Step>(); }
//! # }
//! # impl Handler<Step> for Worker {
//! #     async fn handle(&mut self, _cx: &Context, _: Step) -> Result<u64, EndpointError> { Ok(1) }
//! # }
//! use std::time::Duration;
//! use futures::FutureExt as _;
//! use monarch_guest::{select, sleep, timeout};
//!
//! # async fn example(workers: ActorMesh<Worker>) -> Result<(), String> {
//! // A reply within 2 s, or `Elapsed` (the call's reply is then dropped).
//! match timeout(Duration::from_secs(2), workers.call(&Step)).await {
//!     Ok(replies) => info!("{:?}", replies?.values()),
//!     Err(elapsed) => warn!("step: {elapsed}"),
//! }
//!
//! // The same with `select!`: `sleep` is a fused future; fuse the call.
//! select! {
//!     replies = workers.call(&Step).fuse() => info!("{:?}", replies?.values()),
//!     () = sleep(Duration::from_secs(2)) => warn!("no reply within 2 s"),
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::{Either, FusedFuture, select};

use crate::executor::{try_with_reactor, with_reactor};

/// Waits for `duration`; see the [module](self) docs.
///
/// ```no_run
/// # async fn example() {
/// monarch_guest::sleep(std::time::Duration::from_millis(200)).await;
/// # }
/// ```
pub fn sleep(duration: Duration) -> Sleep {
    // A duration too long to add is, for this program, forever.
    let now = Instant::now();
    let deadline = now
        .checked_add(duration)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
    sleep_until(deadline)
}

/// Waits until `deadline`: at once if it has passed.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        timer: None,
        done: false,
    }
}

/// The future of [`sleep`] and [`sleep_until`]. It is a
/// [`FusedFuture`], so it can go straight into
/// [`select!`](crate::select!).
#[must_use = "futures do nothing unless awaited"]
#[derive(Debug)]
pub struct Sleep {
    deadline: Instant,
    /// The reactor's key for this timer, once it has been polled.
    timer: Option<u64>,
    done: bool,
}

impl Sleep {
    /// When the sleep ends.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.done {
            return Poll::Ready(());
        }
        let (deadline, timer) = (self.deadline, self.timer);
        if Instant::now() >= deadline {
            if let Some(timer) = timer {
                try_with_reactor(|r| r.cancel_timer(deadline, timer));
            }
            self.timer = None;
            self.done = true;
            return Poll::Ready(());
        }
        let timer = with_reactor(|r| r.set_timer(deadline, timer, cx.waker()));
        self.timer = Some(timer);
        Poll::Pending
    }
}

impl FusedFuture for Sleep {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(timer) = self.timer {
            try_with_reactor(|r| r.cancel_timer(self.deadline, timer));
        }
    }
}

/// Awaits `future` for at most `duration`: its output, or [`Elapsed`] once
/// the time is up, in which case `future` is dropped (a call's reply is
/// then dropped when it comes; the request is not recalled).
///
/// ```no_run
/// # async fn example() {
/// use std::time::Duration;
/// let long = monarch_guest::sleep(Duration::from_secs(60));
/// let result = monarch_guest::timeout(Duration::from_millis(100), long).await;
/// assert!(result.is_err());
/// # }
/// ```
pub async fn timeout<F: IntoFuture>(duration: Duration, future: F) -> Result<F::Output, Elapsed> {
    let future = pin!(future.into_future());
    match select(future, sleep(duration)).await {
        Either::Left((output, _)) => Ok(output),
        Either::Right(((), _)) => Err(Elapsed { after: duration }),
    }
}

/// The error of [`timeout`]: the time ran out first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Elapsed {
    after: Duration,
}

impl Elapsed {
    /// The time the future was given.
    pub fn after(&self) -> Duration {
        self.after
    }
}

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no result within {} ms", self.after.as_millis())
    }
}

impl std::error::Error for Elapsed {}

impl From<Elapsed> for String {
    fn from(e: Elapsed) -> Self {
        e.to_string()
    }
}
