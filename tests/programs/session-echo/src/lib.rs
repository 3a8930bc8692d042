//! session-echo: a component of the WIT world `monarch:host/session`, the
//! host's interactive sessions (`monarch-host console`), written against
//! the bindings alone. It keeps its state across inputs, as a session
//! must, and answers one command per input line:
//!
//! | input | answer |
//! | --- | --- |
//! | `set NAME VALUE` | stores VALUE under NAME; `""` |
//! | `get NAME` | the value; error `no NAME` when unset |
//! | `sum` | the sum of the stored values that are integers |
//! | `args` | the arguments `init` was given, joined by spaces |
//! | `fail` | error `failed on purpose` |
//! | `block` | opens a block: the prompt is `... ` and lines are counted until an empty line, whose answer is the count |
//! | `wait MS` | waits MS milliseconds in `mesh.next-events`; error `interrupted` as soon as `console.interrupted` says so |
//! | `print TEXT` | prints TEXT to stdout; `""` |
//!
//! Anything else is an error that names the input. The prompt is `> `
//! outside a block.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "session",
});

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use monarch::host::console::interrupted;
use monarch::host::mesh::next_events;

/// What the session remembers between inputs.
#[derive(Default)]
struct State {
    /// `init`'s arguments.
    args: Vec<String>,
    /// The values `set` stored, by name.
    values: BTreeMap<String, String>,
    /// The lines of the open block, while one is open.
    block: Option<u32>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::default();
}

struct SessionEcho;

impl Guest for SessionEcho {
    fn init(args: Vec<String>) -> Result<(), String> {
        STATE.with_borrow_mut(|state| state.args = args);
        Ok(())
    }

    fn on_input(line: String) -> Result<String, String> {
        if let Some(count) = STATE.with_borrow(|state| state.block) {
            let next = if line.is_empty() {
                None
            } else {
                Some(count + 1)
            };
            STATE.with_borrow_mut(|state| state.block = next);
            return Ok(match next {
                None => count.to_string(),
                Some(_) => String::new(),
            });
        }
        let (command, rest) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        match command {
            "set" => {
                let (name, value) = rest
                    .split_once(' ')
                    .ok_or_else(|| "usage: set NAME VALUE".to_string())?;
                STATE.with_borrow_mut(|state| {
                    state.values.insert(name.to_string(), value.to_string())
                });
                Ok(String::new())
            }
            "get" => STATE
                .with_borrow(|state| state.values.get(rest).cloned())
                .ok_or_else(|| format!("no {rest}")),
            "sum" => Ok(STATE
                .with_borrow(|state| {
                    state
                        .values
                        .values()
                        .filter_map(|v| v.parse::<i64>().ok())
                        .sum::<i64>()
                })
                .to_string()),
            "args" => Ok(STATE.with_borrow(|state| state.args.join(" "))),
            "fail" => Err("failed on purpose".into()),
            "block" => {
                STATE.with_borrow_mut(|state| state.block = Some(0));
                Ok(String::new())
            }
            "wait" => {
                let ms: u64 = rest
                    .parse()
                    .map_err(|_| format!("usage: wait MS (not {rest:?})"))?;
                wait(Duration::from_millis(ms))
            }
            "print" => {
                println!("{rest}");
                Ok(String::new())
            }
            "" => Ok(String::new()),
            _ => Err(format!("unknown command {line:?}")),
        }
    }

    fn prompt() -> String {
        if STATE.with_borrow(|state| state.block.is_some()) {
            "... ".into()
        } else {
            "> ".into()
        }
    }
}

/// Waits `length` in the host's event mailbox, which returns early when
/// the user presses Ctrl-C; `interrupted` when they did.
fn wait(length: Duration) -> Result<String, String> {
    let deadline = Instant::now() + length;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(String::new());
        }
        // Events (there are none without meshes) are dropped.
        let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
        next_events(1, ms);
        if interrupted() {
            return Err("interrupted".into());
        }
    }
}

export!(SessionEcho);
