//! What guests print: an actor's stdout and stderr, line by line, to the
//! log sink of the program that spawned it (the controller's terminal, or
//! a server job's log), each line prefixed with the actor's mesh and rank
//! (`[trainers 3] loss 0.25`).
//!
//! - OUT-1: lines of one stream of one actor arrive in the order printed;
//!   a last line without a newline is sent when the guest flushes or the
//!   stream is dropped (the instance ends).
//! - OUT-2: a line longer than [`MAX_LINE`] is cut into pieces of at most
//!   that many bytes, so a guest that never prints a newline cannot grow
//!   the host's memory.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use crate::host::LogSink;

/// The longest line kept whole, in bytes (OUT-2).
pub const MAX_LINE: usize = 64 * 1024;

/// A stdout or stderr that sends each line to a log sink; see the module
/// docs.
#[derive(Clone)]
pub struct LineOutput {
    sink: LogSink,
    prefix: String,
}

impl LineOutput {
    /// Lines go to `sink` as `<prefix><line>`.
    pub fn new(sink: LogSink, prefix: String) -> Self {
        LineOutput { sink, prefix }
    }
}

impl IsTerminal for LineOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LineOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(LineWriter {
            output: self.clone(),
            partial: Vec::new(),
        })
    }
}

/// The writer behind one [`LineOutput`] stream.
struct LineWriter {
    output: LineOutput,
    partial: Vec<u8>,
}

impl LineWriter {
    fn emit(&mut self, line: &[u8]) {
        let line = String::from_utf8_lossy(line);
        let line = line.strip_suffix('\r').unwrap_or(&line);
        (self.output.sink)(&format!("{}{line}", self.output.prefix));
    }

    fn take(&mut self, mut bytes: &[u8]) {
        while let Some(at) = bytes.iter().position(|&b| b == b'\n') {
            if self.partial.is_empty() {
                self.emit(&bytes[..at]);
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(&bytes[..at]);
                self.emit(&line);
            }
            bytes = &bytes[at + 1..];
        }
        self.partial.extend_from_slice(bytes);
        while self.partial.len() >= MAX_LINE {
            let rest = self.partial.split_off(MAX_LINE);
            let piece = std::mem::replace(&mut self.partial, rest);
            self.emit(&piece);
        }
    }

    fn flush_partial(&mut self) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.emit(&line);
        }
    }
}

impl AsyncWrite for LineWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.take(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A guest flushes after every `print!` in Rust's std; keeping the
        // partial line until its newline keeps lines whole.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.flush_partial();
        Poll::Ready(Ok(()))
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        self.flush_partial();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn collect() -> (LogSink, Arc<Mutex<Vec<String>>>) {
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink_lines = lines.clone();
        let sink: LogSink = Arc::new(move |line: &str| {
            sink_lines.lock().unwrap().push(line.to_string());
        });
        (sink, lines)
    }

    #[test]
    fn out1_lines_keep_their_order_and_the_last_one_comes_at_the_end() {
        let (sink, lines) = collect();
        let mut writer = LineWriter {
            output: LineOutput::new(sink, "[w 3] ".into()),
            partial: Vec::new(),
        };
        writer.take(b"one\ntw");
        writer.take(b"o\r\nthree\nfou");
        assert_eq!(
            *lines.lock().unwrap(),
            ["[w 3] one", "[w 3] two", "[w 3] three"]
        );
        drop(writer);
        assert_eq!(lines.lock().unwrap().last().unwrap(), "[w 3] fou");
    }

    #[test]
    fn out2_a_line_without_newlines_is_cut_at_the_limit() {
        let (sink, lines) = collect();
        let mut writer = LineWriter {
            output: LineOutput::new(sink, String::new()),
            partial: Vec::new(),
        };
        writer.take(&vec![b'x'; MAX_LINE * 2 + 5]);
        assert_eq!(lines.lock().unwrap().len(), 2);
        assert_eq!(writer.partial.len(), 5);
    }
}
