//! The driver: an actor that calls another actor and times it.
//!
//! Measuring from inside an actor is what an application sees when one
//! actor calls another: the request leaves through the driver's mailbox, the
//! reply lands on a once-port of it, and the driver's task wakes up. The
//! suite asks the driver for a batch of measurements with one call, so the
//! cost of reaching the driver is outside every timing.

use std::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hyperactor::testing::{Echo, EchoActor, Numbered, StreamReport};
use hyperactor::{Actor, ActorId, ActorRef, Context, Exports, Handler, OncePortRef};

/// Times `calls` sequential [`Echo`] calls to `target`, each with a payload
/// of `payload` bytes; replies with each round trip in nanoseconds.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct TimeCalls {
    /// An [`EchoActor`].
    pub target: ActorId,
    /// How many calls, one after another.
    pub calls: u32,
    /// Payload size in bytes.
    pub payload: u32,
    /// Where the timings go.
    pub reply: OncePortRef<Vec<u64>>,
}

/// Keeps `in_flight` [`Echo`] calls to `target` outstanding for `millis`
/// milliseconds, starting a new one as each completes, then waits for the
/// rest; replies with how many completed and how long it took.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Pipeline {
    /// An [`EchoActor`].
    pub target: ActorId,
    /// Calls outstanding at once.
    pub in_flight: u32,
    /// Payload size in bytes.
    pub payload: u32,
    /// How long to keep starting calls.
    pub millis: u64,
    /// Where the count goes.
    pub reply: OncePortRef<Completed>,
}

/// Sends `count` [`Numbered`] messages of stream `stream` to `target`
/// without waiting, then one [`StreamReport`] call, which the target answers
/// after it has handled them all (messages from one sender arrive in order).
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct OneWay {
    /// An [`EchoActor`].
    pub target: ActorId,
    /// A stream number not used before with this target.
    pub stream: u64,
    /// How many messages.
    pub count: u64,
    /// Where the outcome goes.
    pub reply: OncePortRef<Completed>,
}

/// How much work completed, and in what time.
#[derive(Debug, Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Completed {
    /// Calls completed, or messages the target received.
    pub count: u64,
    /// Messages the target saw out of order (one-way runs only).
    pub out_of_order: u64,
    /// Wall time from the first send to the last reply, in nanoseconds.
    pub nanos: u64,
}

impl Completed {
    /// Completions per second.
    pub fn per_second(&self) -> f64 {
        self.count as f64 / (self.nanos.max(1) as f64 / 1e9)
    }
}

/// The driver actor. Stateless: each request names its target.
#[derive(Debug, Default)]
pub struct Driver;

impl Actor for Driver {
    fn exports(exports: &mut Exports<Self>) {
        exports
            .handle::<TimeCalls>()
            .handle::<Pipeline>()
            .handle::<OneWay>();
    }
}

fn nanos_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Handler<TimeCalls> for Driver {
    async fn handle(&mut self, cx: &Context<Self>, request: TimeCalls) -> anyhow::Result<()> {
        let echo = ActorRef::<EchoActor>::attest(request.target);
        let payload = vec![0x5a_u8; request.payload as usize];
        let mut nanos = Vec::with_capacity(request.calls as usize);
        for _ in 0..request.calls {
            let message = payload.clone();
            let start = Instant::now();
            let back = echo
                .call(cx, |reply| Echo {
                    payload: message,
                    reply,
                })
                .await?;
            nanos.push(nanos_since(start));
            anyhow::ensure!(back == payload, "the echo came back changed");
        }
        request.reply.send(cx, nanos);
        Ok(())
    }
}

impl Handler<Pipeline> for Driver {
    async fn handle(&mut self, cx: &Context<Self>, request: Pipeline) -> anyhow::Result<()> {
        let echo = ActorRef::<EchoActor>::attest(request.target);
        let payload = vec![0x5a_u8; request.payload as usize];
        let call = || {
            echo.call(cx, |reply| Echo {
                payload: payload.clone(),
                reply,
            })
        };
        let start = Instant::now();
        let deadline = start + std::time::Duration::from_millis(request.millis);
        let mut pending: FuturesUnordered<_> = (0..request.in_flight).map(|_| call()).collect();
        let mut completed = 0_u64;
        while let Some(result) = pending.next().await {
            let back = result?;
            anyhow::ensure!(back.len() == payload.len(), "the echo came back changed");
            completed += 1;
            if Instant::now() < deadline {
                pending.push(call());
            }
        }
        let nanos = nanos_since(start);
        request.reply.send(
            cx,
            Completed {
                count: completed,
                out_of_order: 0,
                nanos,
            },
        );
        Ok(())
    }
}

impl Handler<OneWay> for Driver {
    async fn handle(&mut self, cx: &Context<Self>, request: OneWay) -> anyhow::Result<()> {
        let echo = ActorRef::<EchoActor>::attest(request.target);
        let stream = request.stream;
        let port = echo.port::<Numbered>().id().clone();
        let start = Instant::now();
        for seq in 0..request.count {
            // LK-8: wait for the link's window rather than queue the whole
            // burst on this side.
            cx.ready(&port).await;
            echo.send(cx, Numbered { stream, seq });
        }
        let stats = echo
            .call(cx, |reply| StreamReport { stream, reply })
            .await?;
        let nanos = nanos_since(start);
        request.reply.send(
            cx,
            Completed {
                count: stats.received,
                out_of_order: stats.out_of_order,
                nanos,
            },
        );
        Ok(())
    }
}
