//! Logging through the host: [`log`] and the macros [`info!`](crate::info!),
//! [`warn!`](crate::warn!), [`error!`](crate::error!),
//! [`debug!`](crate::debug!) and [`trace!`](crate::trace!), which format
//! like `format!`.
//!
//! The host prefixes each line with the caller's mesh and rank (or the
//! controller) and decides which levels it shows; programs use `info` for
//! what the user should see.

use crate::bindings::monarch::host::logging as wit;

/// How much a log line matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Step-by-step detail.
    Trace,
    /// Detail for whoever debugs the program.
    Debug,
    /// What the user should see.
    Info,
    /// Something unexpected that the program survives.
    Warn,
    /// Something failed.
    Error,
}

impl From<Level> for wit::Level {
    fn from(level: Level) -> Self {
        match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        }
    }
}

/// Logs one line through the host. Outside Wasm (unit tests, doc tests)
/// the line goes to standard error instead.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    wit::log(level.into(), message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// Logs a formatted line at info level: `info!("rank {rank}: {reply}")`.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => {
        $crate::log::log($crate::log::Level::Info, &::std::format!($($arg)+))
    };
}

/// Logs a formatted line at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => {
        $crate::log::log($crate::log::Level::Warn, &::std::format!($($arg)+))
    };
}

/// Logs a formatted line at error level.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => {
        $crate::log::log($crate::log::Level::Error, &::std::format!($($arg)+))
    };
}

/// Logs a formatted line at debug level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => {
        $crate::log::log($crate::log::Level::Debug, &::std::format!($($arg)+))
    };
}

/// Logs a formatted line at trace level.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => {
        $crate::log::log($crate::log::Level::Trace, &::std::format!($($arg)+))
    };
}
