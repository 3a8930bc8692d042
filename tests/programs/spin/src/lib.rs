//! spin: computes forever without calling the host, so only the host's
//! epoch interruption can take the thread back.
//!
//! - `spin`: the controller spins. The run must end at its deadline
//!   (`--timeout`) with an error that says so.
//! - `spin actor`: a `Spinner` actor spins inside its `spin` endpoint. The
//!   controller's call must end with a timeout error after the call timeout,
//!   and the controller then returns Ok while the actor still spins.
//! - `spin stacks PROCS RANK SECONDS`: a `Spinner` on each of PROCS procs;
//!   the one at RANK spins, the others stay idle, and the controller waits
//!   SECONDS in the host before it returns: what `monarch-host stacks`
//!   samples (tests/stacks.rs). This crate keeps its line tables (see
//!   guest-sdk/Cargo.toml) so that the stack names the spinning line.
//! - `spin nested SECONDS`: an `Owner` actor spawns procs of its own and a
//!   `Spinner` on them, which spins; the controller waits SECONDS.

use std::time::Duration;

use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// `spin`: never replies.
#[derive(Serialize, Deserialize)]
struct Spin;

impl Message for Spin {
    const ENDPOINT: &'static str = "spin";
    type Reply = ();
}

struct Spinner;

impl Actor for Spinner {
    const CLASS: &'static str = "Spinner";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Ok(Spinner)
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Spin>();
    }
}

impl Handler<Spin> for Spinner {
    async fn handle(&mut self, cx: &Context, _: Spin) -> Result<(), EndpointError> {
        info!("spinner {} starts spinning", cx.rank());
        spin_forever()
    }
}

/// A loop the optimizer must keep, with no call out of the instance.
fn spin_forever() -> ! {
    loop {
        core::hint::black_box(());
    }
}

/// `grow`: the owner spawns a proc of its own and a spinning `Spinner`
/// mesh `inner` on it.
#[derive(Serialize, Deserialize)]
struct Grow;

impl Message for Grow {
    const ENDPOINT: &'static str = "grow";
    type Reply = ();
}

/// Owns a spinner on procs it spawned, kept as long as it lives.
struct Owner {
    inner: Option<(ProcMesh, ActorMesh<Spinner>)>,
}

impl Actor for Owner {
    const CLASS: &'static str = "Owner";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Ok(Owner { inner: None })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Grow>();
    }
}

impl Handler<Grow> for Owner {
    async fn handle(&mut self, _cx: &Context, _: Grow) -> Result<(), EndpointError> {
        let procs = spawn_procs(&extent!(procs = 1))?;
        let inner = procs.spawn::<Spinner>("inner", &())?;
        inner.broadcast(&Spin)?;
        self.inner = Some((procs, inner));
        Ok(())
    }
}

async fn main(args: Vec<String>) -> Result<(), String> {
    match args.first().map(String::as_str) {
        None => {
            info!("the controller starts spinning");
            spin_forever()
        }
        Some("actor") => {
            let procs = spawn_procs(&extent!(procs = 1))?;
            let spinners = procs.spawn::<Spinner>("spinners", &())?;
            let timeout = Duration::from_millis(500);
            monarch_guest::set_call_timeout(timeout);
            match spinners.call_one(&Spin).await {
                Err(e) if e.kind() == ErrorKind::Timeout => {
                    info!("the call to the spinner timed out after {timeout:?}: {e}");
                    Ok(())
                }
                other => Err(format!("expected the call to time out, got {other:?}")),
            }
        }
        Some("stacks") => stacks(&args[1..]).await,
        Some("nested") => {
            let seconds: u64 = args
                .get(1)
                .and_then(|arg| arg.parse().ok())
                .ok_or("usage: spin nested SECONDS")?;
            let procs = spawn_procs(&extent!(procs = 1))?;
            let owners = procs.spawn::<Owner>("owners", &())?;
            owners.call_one(&Grow).await?;
            info!("the owner's spinner was asked to spin");
            sleep(Duration::from_secs(seconds)).await;
            Ok(())
        }
        Some(other) => Err(format!(
            "usage: spin [actor | stacks PROCS RANK SECONDS | nested SECONDS]; unknown mode `{other}`"
        )),
    }
}

/// `spin stacks PROCS RANK SECONDS`; see the crate docs.
async fn stacks(args: &[String]) -> Result<(), String> {
    let number = |i: usize| {
        args.get(i)
            .and_then(|arg| arg.parse::<u32>().ok())
            .ok_or("usage: spin stacks PROCS RANK SECONDS")
    };
    let (procs, rank, seconds) = (number(0)?, number(1)?, number(2)?);
    let procs = spawn_procs(&extent!(procs = procs))?;
    let spinners = procs.spawn::<Spinner>("spinners", &())?;
    spinners.at("procs", rank)?.broadcast(&Spin)?;
    info!("spinner {rank} was asked to spin");
    sleep(Duration::from_secs(seconds.into())).await;
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Spinner, Owner],
}
