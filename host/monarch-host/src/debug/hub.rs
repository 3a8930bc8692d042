//! The debug hub of a run.
