//! The floor: a bare socket ping-pong between two processes, and a bare
//! gather over many.
//!
//! Plain blocking std sockets, one thread per connection, no framing, no
//! runtime: the client writes the payload and reads the same number of
//! bytes back. This is about the least a round trip through the kernel can
//! cost on the machine at hand, so the runtime's round trips are read as a
//! multiple of it.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Instant;

use anyhow::{Context as _, bail};
use hyperactor::ChannelAddr;

/// A connected socket of either kind.
pub enum RawStream {
    /// A Unix domain socket.
    Unix(UnixStream),
    /// A TCP socket with Nagle off.
    Tcp(TcpStream),
}

impl RawStream {
    /// Connects to what a `raw-echo` worker printed after `READY `.
    pub fn connect(ready: &str) -> anyhow::Result<RawStream> {
        let addr: ChannelAddr = ready
            .parse()
            .with_context(|| format!("the raw echo worker reported a bad address {ready:?}"))?;
        match addr {
            ChannelAddr::Unix(path) => Ok(RawStream::Unix(
                UnixStream::connect(&path).with_context(|| format!("cannot connect to {path}"))?,
            )),
            ChannelAddr::Tcp(sock) => {
                let stream = TcpStream::connect(sock)
                    .with_context(|| format!("cannot connect to {sock}"))?;
                stream.set_nodelay(true)?;
                Ok(RawStream::Tcp(stream))
            }
            ChannelAddr::Local(_) => bail!("a raw echo worker cannot serve {addr}"),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            RawStream::Unix(s) => s.write_all(buf),
            RawStream::Tcp(s) => s.write_all(buf),
        }
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        match self {
            RawStream::Unix(s) => s.read_exact(buf),
            RawStream::Tcp(s) => s.read_exact(buf),
        }
    }

    /// Times `count` round trips of `payload` bytes each, in microseconds.
    pub fn round_trips(&mut self, payload: usize, count: usize) -> anyhow::Result<Vec<f64>> {
        let out = vec![0x5a_u8; payload];
        let mut back = vec![0_u8; payload];
        let mut micros = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            self.write_all(&out)?;
            self.read_exact(&mut back)?;
            micros.push(start.elapsed().as_secs_f64() * 1e6);
        }
        anyhow::ensure!(back == out, "the raw echo worker sent back other bytes");
        Ok(micros)
    }
}

/// Times `count` gathers over `streams`, in microseconds: each writes
/// `payload` bytes to every stream, then reads as many back from each, in
/// order. The floor of a gathered call over as many procs: every echo
/// worker is woken once and answers once, with no framing or runtime.
pub fn gathers(
    streams: &mut [RawStream],
    payload: usize,
    count: usize,
) -> anyhow::Result<Vec<f64>> {
    let out = vec![0x5a_u8; payload];
    let mut back = vec![0_u8; payload];
    let mut micros = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        for stream in streams.iter_mut() {
            stream.write_all(&out)?;
        }
        for stream in streams.iter_mut() {
            stream.read_exact(&mut back)?;
            anyhow::ensure!(back == out, "a raw echo worker sent back other bytes");
        }
        micros.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(micros)
}

/// The `raw-echo` subcommand: serves `addr` (`unix:` or `tcp:`), prints
/// `READY <address>` and echoes every byte on every connection until stdin
/// closes.
pub fn serve_echo(addr: ChannelAddr) -> anyhow::Result<()> {
    let socket_file = addr.unix_path();
    match addr {
        ChannelAddr::Unix(path) => {
            let listener =
                UnixListener::bind(&path).with_context(|| format!("cannot bind unix:{path}"))?;
            println!("READY unix:{path}");
            exit_when_stdin_closes(socket_file);
            for conn in listener.incoming() {
                let conn = conn.context("accept failed")?;
                std::thread::spawn(move || echo(conn));
            }
        }
        ChannelAddr::Tcp(sock) => {
            let listener =
                TcpListener::bind(sock).with_context(|| format!("cannot bind {sock}"))?;
            println!("READY tcp:{}", listener.local_addr()?);
            exit_when_stdin_closes(None);
            for conn in listener.incoming() {
                let conn = conn.context("accept failed")?;
                conn.set_nodelay(true)?;
                std::thread::spawn(move || echo(conn));
            }
        }
        ChannelAddr::Local(_) => bail!("raw-echo serves unix: or tcp: addresses, not {addr}"),
    }
    Ok(())
}

/// Echoes until the peer closes; errors end the connection quietly, since
/// the client reports what it missed.
fn echo(mut conn: impl Read + Write) {
    let mut buf = [0_u8; 64 * 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Ends the process when stdin reaches its end, removing `socket_file`.
fn exit_when_stdin_closes(socket_file: Option<std::path::PathBuf>) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        if let Some(path) = socket_file {
            let _ = std::fs::remove_file(path);
        }
        std::process::exit(0);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream whose other end an echo thread serves, flipping every byte
    /// when `flip`.
    fn echoed(flip: bool) -> RawStream {
        let (mine, theirs) = UnixStream::pair().expect("a socket pair");
        std::thread::spawn(move || {
            if !flip {
                return echo(theirs);
            }
            let mut theirs = theirs;
            let mut buf = [0_u8; 64];
            while let Ok(n @ 1..) = theirs.read(&mut buf) {
                let flipped: Vec<u8> = buf[..n].iter().map(|b| !b).collect();
                if theirs.write_all(&flipped).is_err() {
                    return;
                }
            }
        });
        RawStream::Unix(mine)
    }

    #[test]
    fn a_gather_times_each_round_over_every_stream() {
        let mut streams: Vec<RawStream> = (0..3).map(|_| echoed(false)).collect();
        let micros = gathers(&mut streams, 64, 5).expect("gathers");
        assert_eq!(micros.len(), 5);
        assert!(micros.iter().all(|us| *us > 0.0), "{micros:?}");
    }

    #[test]
    fn a_gather_fails_when_a_worker_answers_other_bytes() {
        let mut streams = vec![echoed(false), echoed(true)];
        let error = gathers(&mut streams, 64, 1).expect_err("a wrong echo is an error");
        assert!(error.to_string().contains("other bytes"), "{error}");
    }
}
