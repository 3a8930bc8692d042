//! Faults: what went wrong with an actor, as a value that keeps its kind,
//! origin and backtrace across procs.
//!
//! hyperactor carries an actor's failure as a reason string (an
//! [`ActorSupervisionEvent`](hyperactor::ActorSupervisionEvent)'s
//! `reason`), and a mesh endpoint's error as the error text of its reply.
//! A layer that knows more (the Wasm host knows a trap from a deadline,
//! and an endpoint error's type name) encodes a [`Fault`] into that string
//! with [`Fault::encode`]; whoever reads it back calls [`Fault::decode`],
//! which also accepts plain text (a panic message, an older peer) as a
//! fault of the kind the reader expects there.
//!
//! - FT-1: `decode(encode(f)) == f` for every fault.
//! - FT-2: decoding never fails: text that is not an encoded fault is the
//!   message of a fault of the reader's default kind.

use std::fmt;

/// What kind of thing went wrong; the WIT `error-kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// An endpoint returned an error.
    Endpoint,
    /// The actor trapped or panicked.
    Trap,
    /// A handler ran past its deadline.
    Deadline,
    /// The actor's memory reached its cap.
    OutOfMemory,
    /// The actor's proc exited, was killed, or its host was lost.
    ProcLost,
    /// The actor, its mesh or its procs were stopped by their owner.
    Stopped,
    /// No reply within the call timeout.
    Timeout,
    /// The request was not valid.
    Invalid,
    /// A mesh the actor owned failed, and the actor did not handle it.
    Supervision,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Endpoint,
        FaultKind::Trap,
        FaultKind::Deadline,
        FaultKind::OutOfMemory,
        FaultKind::ProcLost,
        FaultKind::Stopped,
        FaultKind::Timeout,
        FaultKind::Invalid,
        FaultKind::Supervision,
    ];

    /// The kind's name, as the WIT spells it (`proc-lost`).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Endpoint => "endpoint",
            FaultKind::Trap => "trap",
            FaultKind::Deadline => "deadline",
            FaultKind::OutOfMemory => "out-of-memory",
            FaultKind::ProcLost => "proc-lost",
            FaultKind::Stopped => "stopped",
            FaultKind::Timeout => "timeout",
            FaultKind::Invalid => "invalid",
            FaultKind::Supervision => "supervision",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fault {
    /// The kind.
    pub kind: FaultKind,
    /// What happened, in words.
    pub message: String,
    /// The endpoint being handled, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The type of an endpoint's error, as the guest named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// A guest backtrace or traceback, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backtrace: Option<String>,
}

/// What starts an encoded fault; no panic message or error text a person
/// writes starts with it.
const MARK: &str = "\u{1}fault";

impl Fault {
    /// A fault of `kind` with `message` and nothing else.
    pub fn new(kind: FaultKind, message: impl Into<String>) -> Fault {
        Fault {
            kind,
            message: message.into(),
            endpoint: None,
            type_name: None,
            backtrace: None,
        }
    }

    /// The same fault, naming `endpoint`.
    pub fn at_endpoint(mut self, endpoint: impl Into<String>) -> Fault {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// The fault as a string that travels where hyperactor carries text
    /// (FT-1).
    pub fn encode(&self) -> String {
        // Serializing a struct of strings to JSON cannot fail.
        let json = serde_json::to_string(self).unwrap_or_default();
        format!("{MARK}{json}")
    }

    /// Reads a string made by [`Fault::encode`], or plain text as a fault
    /// of `default` (FT-2). Text before the encoded fault (a layer's
    /// "init failed: ") is kept in front of its message.
    pub fn decode(text: &str, default: FaultKind) -> Fault {
        let decoded = text.find(MARK).and_then(|at| {
            let mut fault: Fault = serde_json::from_str(&text[at + MARK.len()..]).ok()?;
            fault.message.insert_str(0, &text[..at]);
            Some(fault)
        });
        decoded.unwrap_or_else(|| Fault::new(default, text))
    }

    /// The message of an encoded fault, or the text itself: for logs and
    /// for errors shown to people.
    pub fn readable(text: &str) -> String {
        match text.contains(MARK) {
            true => Fault::decode(text, FaultKind::Trap).to_string(),
            false => text.to_string(),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(type_name) = &self.type_name {
            write!(f, "{type_name}: ")?;
        }
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ft1_an_encoded_fault_decodes_to_itself() {
        let fault = Fault {
            kind: FaultKind::Deadline,
            message: "the handler of `spin` ran past its deadline of 1000 ms".into(),
            endpoint: Some("spin".into()),
            type_name: Some("TimeoutError".into()),
            backtrace: Some("0: spin\n1: handle".into()),
        };
        assert_eq!(Fault::decode(&fault.encode(), FaultKind::Trap), fault);
        let bare = Fault::new(FaultKind::ProcLost, "killed by signal 9");
        assert_eq!(Fault::decode(&bare.encode(), FaultKind::Trap), bare);
        assert!(
            !bare.encode().contains("backtrace"),
            "absent fields stay out"
        );
    }

    #[test]
    fn ft2_plain_text_is_a_fault_of_the_default_kind() {
        let fault = Fault::decode("panicked at src/lib.rs:3: boom", FaultKind::Trap);
        assert_eq!(fault.kind, FaultKind::Trap);
        assert_eq!(fault.message, "panicked at src/lib.rs:3: boom");
        // A mark followed by garbage is text too, never an error.
        let odd = format!("{MARK}{{not json");
        assert_eq!(Fault::decode(&odd, FaultKind::Endpoint).message, odd);
    }

    #[test]
    fn text_in_front_of_a_fault_joins_its_message() {
        let fault = Fault::new(FaultKind::Deadline, "create ran past 1000 ms");
        let decoded = Fault::decode(&format!("init failed: {}", fault.encode()), FaultKind::Trap);
        assert_eq!(decoded.kind, FaultKind::Deadline);
        assert_eq!(decoded.message, "init failed: create ran past 1000 ms");
    }

    #[test]
    fn readable_text_hides_the_encoding() {
        let mut fault = Fault::new(FaultKind::Endpoint, "bad value");
        fault.type_name = Some("ValueError".into());
        assert_eq!(Fault::readable(&fault.encode()), "ValueError: bad value");
        assert_eq!(Fault::readable("plain"), "plain");
    }

    #[test]
    fn kinds_are_named_as_the_wit_names_them() {
        let json = serde_json::to_string(&FaultKind::OutOfMemory).unwrap();
        assert_eq!(json, "\"out-of-memory\"");
        assert_eq!(FaultKind::ProcLost.name(), "proc-lost");
    }
}
