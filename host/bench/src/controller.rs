//! The `controller` suite: a Wasm controller program measures host calls,
//! calls to Wasm actors in this process, and spawning, with the monotonic
//! clock WASI grants it, and logs `BENCH <metric> <value> <unit>` lines;
//! this side runs it on `monarch-host`'s library and prints the records
//! (see [`crate::guest`]).
//! The floor is the same call between two native actors in one proc.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use hyperactor::testing::{Echo, EchoActor};
use hyperactor::{Actor, Context, Exports, Handler, OncePortRef, Proc};

use crate::guest;
use crate::report::{Unit, emit};

const SUITE: &str = "controller";

/// Arguments of the controller suite.
#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Far fewer iterations: a smoke test of a few seconds.
    #[arg(long)]
    quick: bool,
    /// Threads of the runtime, as `monarch-host run --threads`: 1 (the
    /// default, as there) is a current-thread runtime.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// The guest program.
    #[arg(long, default_value = guest::DEFAULT_PROGRAM)]
    program: PathBuf,
}

/// Times calls from inside an actor, as a controller would make them.
struct Timer {
    echo: hyperactor::ActorRef<EchoActor>,
}

#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct TimeCalls {
    count: u32,
    reply: OncePortRef<Vec<u64>>,
}

impl Actor for Timer {
    fn exports(exports: &mut Exports<Self>) {
        exports.handle::<TimeCalls>();
    }
}

impl Handler<TimeCalls> for Timer {
    async fn handle(&mut self, cx: &Context<Self>, message: TimeCalls) -> anyhow::Result<()> {
        let mut nanos = Vec::with_capacity(message.count as usize);
        for _ in 0..message.count {
            let started = Instant::now();
            self.echo
                .call(cx, |reply| Echo {
                    payload: vec![7; 64],
                    reply,
                })
                .await?;
            nanos.push(started.elapsed().as_nanos() as u64);
        }
        message.reply.send(cx, nanos);
        Ok(())
    }
}

async fn native_floor(samples: u32) -> anyhow::Result<f64> {
    let proc = Proc::serve("floor", "local:controller-bench-floor".parse()?).await?;
    let echo = proc.spawn("echo", 0, EchoActor::default())?.bind();
    let timer = proc.spawn("timer", 0, Timer { echo })?.bind();
    let (client, _) = proc.attach("client")?;
    timer
        .call(&client, |reply| TimeCalls {
            count: 2_000,
            reply,
        })
        .await?;
    let mut nanos = timer
        .call(&client, |reply| TimeCalls {
            count: samples,
            reply,
        })
        .await?;
    nanos.sort_unstable();
    Ok(nanos[nanos.len() / 2] as f64 / 1e3)
}

/// Every metric the guest reports in this suite.
const GUEST_METRICS: [&str; 5] = [
    "hostcall_ns",
    "controller_call_rtt_us",
    "controller_calls_per_s",
    "actor_instantiate_us",
    "spawn_1000_actors_ms",
];

/// Runs the suite.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    guest::check_program(&args.program)?;
    let sandbox = monarch_host::Sandbox {
        max_procs: 1_100,
        deadline: Duration::from_secs(120),
        ..monarch_host::Sandbox::default()
    };
    let guest_args: Vec<String> = if args.quick {
        vec!["quick".into()]
    } else {
        vec![]
    };
    let records = guest::run(&args.program, &guest_args, sandbox)
        .await
        .context("the controller benchmark program failed")?;
    guest::expect_metrics(&records, &GUEST_METRICS)?;
    for record in &records {
        emit(SUITE, &record.metric, record.value, record.unit)?;
    }
    let floor = native_floor(if args.quick { 1_000 } else { 20_000 }).await?;
    emit(SUITE, "native_call_rtt_us", floor, Unit::Micros)?;
    Ok(())
}
