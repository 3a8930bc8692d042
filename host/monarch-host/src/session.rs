//! Interactive sessions (the WIT world `session`): a controller that lives
//! across inputs. [`crate::run::Prepared::run_session`] instantiates the
//! component once, calls `init(args)`, then `on-input(line)` and `prompt()`
//! for each line sent through a [`SessionDriver`], on one store, so the
//! guest's variables and mesh handles persist between inputs. The server
//! (`serve::sessions`) keeps the driver's other end, so a session outlives
//! the console that typed into it.
//!
//! - SE-1: inputs run one at a time, in the order sent; each gets exactly
//!   one [`InputDone`] (its result, or why the session ended under it).
//! - SE-2: Ctrl-C ([`ConsoleFlag::raise`]) never stops the store: the
//!   guest polls `console.interrupted` and stops the input as its language
//!   does (Python's `KeyboardInterrupt`); `next-events` returns early once
//!   it is raised, so waits for replies notice at once.
//! - SE-3: a session with no input for its idle TTL ends, and what it
//!   spawned is stopped as at the end of a run.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use wasmtime::component::{Instance, Linker, TypedFunc};
use wasmtime::{AsContextMut, StoreContextMut};

use crate::host::HostState;

/// The interface the session world imports beyond a controller's.
const CONSOLE: &str = "monarch:host/console@0.2.0";

/// A session's Ctrl-C: raised by the user, read (and cleared, with
/// [`crate::host::Interrupt::take`]) by the guest (SE-2).
pub type ConsoleFlag = crate::host::Interrupt;

/// Adds `console.interrupted` to `linker`: false for every instance that
/// is not a session's controller.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let mut console = linker.instance(CONSOLE)?;
    console.func_wrap(
        "interrupted",
        |store: StoreContextMut<'_, HostState>, (): ()| {
            let raised = store
                .data()
                .console
                .as_ref()
                .is_some_and(|flag| flag.take());
            Ok((raised,))
        },
    )?;
    Ok(())
}

/// One line for the session, and where its result goes.
pub struct Input {
    /// The line, without its newline.
    pub line: String,
    /// Gets the result of running it (SE-1).
    pub done: oneshot::Sender<InputDone>,
}

/// What an input came to.
#[derive(Debug, Clone, PartialEq)]
pub enum InputDone {
    /// `on-input` returned: text to show (Ok) or an error to show (Err),
    /// and the prompt for the next line.
    Ran {
        /// The guest's answer.
        result: Result<String, String>,
        /// The next prompt.
        prompt: String,
    },
    /// The session ended before or while running it.
    Ended(String),
}

/// What drives a session from outside: its arguments, the lines typed
/// into it, its Ctrl-C, and how long it may sit idle.
pub struct SessionDriver {
    /// For `init`.
    pub args: Vec<String>,
    /// Lines, in order; the session ends (closed) when every sender is
    /// dropped.
    pub inputs: mpsc::Receiver<Input>,
    /// Ctrl-C.
    pub console: Arc<ConsoleFlag>,
    /// The session ends after this long with no input (SE-3).
    pub idle_ttl: Duration,
    /// Told once `init` returned: the first prompt, or why it failed.
    pub ready: Option<oneshot::Sender<Result<String, String>>>,
}

/// Why a session's loop ended without a trap.
pub(crate) enum Ended {
    /// Every input sender was dropped (the session was closed).
    Closed,
    /// No input for the idle TTL.
    Idle(Duration),
}

type InitFunc = TypedFunc<(Vec<String>,), (Result<(), String>,)>;
type InputFunc = TypedFunc<(String,), (Result<String, String>,)>;
type PromptFunc = TypedFunc<(), (String,)>;

/// The exports of a session component, looked up by name.
struct Exports {
    init: InitFunc,
    on_input: InputFunc,
    prompt: PromptFunc,
}

impl Exports {
    fn of(
        mut store: impl AsContextMut<Data = HostState>,
        instance: &Instance,
    ) -> Result<Exports, String> {
        let mut store = store.as_context_mut();
        let wrong = |name: &str, e: wasmtime::Error| {
            format!("the component's `{name}` is not the session world's: {e:#}")
        };
        Ok(Exports {
            init: instance
                .get_typed_func(&mut store, "init")
                .map_err(|e| wrong("init", e))?,
            on_input: instance
                .get_typed_func(&mut store, "on-input")
                .map_err(|e| wrong("on-input", e))?,
            prompt: instance
                .get_typed_func(&mut store, "prompt")
                .map_err(|e| wrong("prompt", e))?,
        })
    }
}

/// Why a session's loop stopped.
pub(crate) enum LoopError {
    /// The component is not of the session world.
    WrongWorld(String),
    /// `init` returned an error.
    Init(String),
    /// The guest trapped.
    Trap(wasmtime::Error),
}

/// Runs the session on `instance` until it is closed, idles out, or the
/// guest traps (SE-1, SE-3).
pub(crate) async fn drive(
    mut store: impl AsContextMut<Data = HostState>,
    instance: &Instance,
    mut driver: SessionDriver,
) -> Result<Ended, LoopError> {
    let mut store = store.as_context_mut();
    let exports = match Exports::of(&mut store, instance) {
        Ok(exports) => exports,
        Err(e) => {
            if let Some(ready) = driver.ready.take() {
                let _ = ready.send(Err(e.clone()));
            }
            return Err(LoopError::WrongWorld(e));
        }
    };
    store.data_mut().console = Some(driver.console.clone());
    let init = call_init(&mut store, &exports, driver.args.clone()).await;
    let first = match init {
        Ok(Ok(())) => prompt(&mut store, &exports).await,
        Ok(Err(e)) => Ok(Err(e)),
        Err(trap) => Err(trap),
    };
    match first {
        Ok(Ok(prompt)) => {
            if let Some(ready) = driver.ready.take() {
                let _ = ready.send(Ok(prompt));
            }
        }
        Ok(Err(e)) => {
            if let Some(ready) = driver.ready.take() {
                let _ = ready.send(Err(format!("the session's init failed: {e}")));
            }
            return Err(LoopError::Init(e));
        }
        Err(trap) => {
            if let Some(ready) = driver.ready.take() {
                let _ = ready.send(Err(format!(
                    "the session trapped in init: {}",
                    crate::wasm_actor::trap_text(&trap)
                )));
            }
            return Err(LoopError::Trap(trap));
        }
    }
    loop {
        let input = tokio::select! {
            input = driver.inputs.recv() => input,
            _ = tokio::time::sleep(driver.idle_ttl) => return Ok(Ended::Idle(driver.idle_ttl)),
        };
        let Some(input) = input else {
            return Ok(Ended::Closed);
        };
        let ran = match call_input(&mut store, &exports, input.line).await {
            Ok(result) => prompt(&mut store, &exports)
                .await
                .map(|prompt| (result, prompt.unwrap_or_else(|_| ">>> ".into()))),
            Err(trap) => Err(trap),
        };
        // A Ctrl-C that came too late for this input is not for the next.
        driver.console.take();
        match ran {
            Ok((result, prompt)) => {
                let _ = input.done.send(InputDone::Ran { result, prompt });
            }
            Err(trap) => {
                let why = format!(
                    "the session trapped: {}",
                    crate::wasm_actor::trap_text(&trap)
                );
                let _ = input.done.send(InputDone::Ended(why));
                return Err(LoopError::Trap(trap));
            }
        }
    }
}

async fn call_init(
    store: &mut StoreContextMut<'_, HostState>,
    exports: &Exports,
    args: Vec<String>,
) -> wasmtime::Result<Result<(), String>> {
    let (result,) = exports.init.call_async(&mut *store, (args,)).await?;
    Ok(result)
}

async fn call_input(
    store: &mut StoreContextMut<'_, HostState>,
    exports: &Exports,
    line: String,
) -> wasmtime::Result<Result<String, String>> {
    let (result,) = exports.on_input.call_async(&mut *store, (line,)).await?;
    Ok(result)
}

/// The prompt; a prompt export that fails gives Err (the caller picks a
/// default), one that traps ends the session.
async fn prompt(
    store: &mut StoreContextMut<'_, HostState>,
    exports: &Exports,
) -> wasmtime::Result<Result<String, String>> {
    let (prompt,) = exports.prompt.call_async(&mut *store, ()).await?;
    Ok(Ok(prompt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn se2_ctrl_c_is_read_once() {
        let flag = ConsoleFlag::default();
        assert!(!flag.take());
        flag.raise();
        assert!(flag.is_raised());
        assert!(flag.take(), "the first read sees it");
        assert!(!flag.take(), "and clears it");
    }

    #[tokio::test]
    async fn se2_a_wait_ends_when_ctrl_c_is_pressed() {
        let flag = Arc::new(ConsoleFlag::default());
        let waiter = {
            let flag = flag.clone();
            tokio::spawn(async move { flag.raised().await })
        };
        tokio::task::yield_now().await;
        flag.raise();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the wait ended")
            .unwrap();
    }
}
