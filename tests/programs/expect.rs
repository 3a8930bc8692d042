//! What the test programs (`semantics`, `tree`) share: collecting what
//! differed from expectations, and a supervisor that records failures.
//! Each includes this file with `#[path]`; it is not a crate of its own.

#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;

use monarch_guest::{CallError, SupervisionFailure, supervise};

/// `ok`, or the error's kind as the WIT names it.
pub fn kind_of<T>(result: &Result<T, CallError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.kind().name(),
    }
}

/// What differed from expectations; the run fails with all of it.
#[derive(Default)]
pub struct Expect {
    problems: Vec<String>,
}

impl Expect {
    /// Notes `what` unless `ok`.
    pub fn that(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.problems.push(what());
        }
    }

    /// Notes a call whose kind (`ok` for success) is not `expected`.
    pub fn kind<T>(&mut self, what: &str, result: &Result<T, CallError>, expected: &str) {
        let got = kind_of(result);
        self.that(got == expected, || match result {
            Err(e) => format!("{what}: expected {expected}, got {got} ({e})"),
            Ok(_) => format!("{what}: expected {expected}, the call succeeded"),
        });
    }

    /// Ok, or everything that differed.
    pub fn done(self) -> Result<(), String> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(self.problems.join("; "))
        }
    }
}

/// A supervisor that handles every failure and keeps a copy.
pub fn record_failures() -> Rc<RefCell<Vec<SupervisionFailure>>> {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let record = seen.clone();
    supervise(move |failure| {
        record.borrow_mut().push(failure.clone());
        true
    });
    seen
}
