//! The `ranks(...)` selection grammar of `monarch_dbg>`.
