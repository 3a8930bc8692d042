//! Actors and messages shared by tests, benchmarks and demos, so that a
//! worker process and the process driving it agree on the types.

use crate::{Actor, Context, Exports, Handler, OncePortRef};

/// Replies with its payload.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Echo {
    /// Bytes to send back.
    pub payload: Vec<u8>,
    /// Where to send them.
    pub reply: OncePortRef<Vec<u8>>,
}

/// One message of a numbered stream; the receiver checks the numbering.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Numbered {
    /// Which stream (one per sender).
    pub stream: u64,
    /// Position in the stream, from 0.
    pub seq: u64,
}

/// Asks how a stream of [`Numbered`] messages arrived.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct StreamReport {
    /// Which stream.
    pub stream: u64,
    /// Where to send the [`StreamStats`].
    pub reply: OncePortRef<StreamStats>,
}

/// How a stream arrived.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct StreamStats {
    /// Messages received.
    pub received: u64,
    /// Messages whose number was not the one expected next.
    pub out_of_order: u64,
}

/// Makes the handler panic with this text.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Panic {
    /// The panic message.
    pub text: String,
    /// Never answered: the actor fails first.
    pub reply: OncePortRef<()>,
}

/// Makes the handler return an error with this text.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Fail {
    /// The error message.
    pub text: String,
    /// Never answered: the actor fails first.
    pub reply: OncePortRef<()>,
}

/// Replies after sleeping, to keep calls in flight.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Sleep {
    /// How long, in milliseconds.
    pub millis: u64,
    /// Answered when the sleep ends.
    pub reply: OncePortRef<()>,
}

/// An actor that echoes, checks stream order, and fails on request.
#[derive(Debug, Default)]
pub struct EchoActor {
    streams: std::collections::HashMap<u64, StreamStats>,
}

impl Actor for EchoActor {
    fn exports(exports: &mut Exports<Self>) {
        exports
            .handle::<Echo>()
            .handle::<Numbered>()
            .handle::<StreamReport>()
            .handle::<Panic>()
            .handle::<Fail>()
            .handle::<Sleep>();
    }
}

impl Handler<Echo> for EchoActor {
    async fn handle(&mut self, cx: &Context<Self>, message: Echo) -> anyhow::Result<()> {
        message.reply.send(cx, message.payload);
        Ok(())
    }
}

impl Handler<Numbered> for EchoActor {
    async fn handle(&mut self, _cx: &Context<Self>, message: Numbered) -> anyhow::Result<()> {
        let stats = self.streams.entry(message.stream).or_insert(StreamStats {
            received: 0,
            out_of_order: 0,
        });
        if message.seq != stats.received {
            stats.out_of_order += 1;
        }
        stats.received += 1;
        Ok(())
    }
}

impl Handler<StreamReport> for EchoActor {
    async fn handle(&mut self, cx: &Context<Self>, message: StreamReport) -> anyhow::Result<()> {
        let stats = self
            .streams
            .get(&message.stream)
            .cloned()
            .unwrap_or(StreamStats {
                received: 0,
                out_of_order: 0,
            });
        message.reply.send(cx, stats);
        Ok(())
    }
}

impl Handler<Panic> for EchoActor {
    async fn handle(&mut self, _cx: &Context<Self>, message: Panic) -> anyhow::Result<()> {
        panic!("{}", message.text);
    }
}

impl Handler<Fail> for EchoActor {
    async fn handle(&mut self, _cx: &Context<Self>, message: Fail) -> anyhow::Result<()> {
        anyhow::bail!("{}", message.text)
    }
}

impl Handler<Sleep> for EchoActor {
    async fn handle(&mut self, cx: &Context<Self>, message: Sleep) -> anyhow::Result<()> {
        tokio::time::sleep(std::time::Duration::from_millis(message.millis)).await;
        message.reply.send(cx, ());
        Ok(())
    }
}

/// Serves the peer that tests and demos drive from another process: a proc
/// named `worker` on `addr` with two [`EchoActor`]s, `echo[0]` and `echo[1]`.
pub async fn serve_echo_worker(addr: crate::ChannelAddr) -> Result<crate::Proc, crate::ProcError> {
    let proc = crate::Proc::serve("worker", addr).await?;
    proc.spawn("echo", 0, EchoActor::default())?;
    proc.spawn("echo", 1, EchoActor::default())?;
    Ok(proc)
}

/// Returns when this process's stdin reaches its end, which is when the
/// parent that holds its other end exits or closes it: a worker that waits
/// for this never outlives the test or demo that started it.
///
/// A pipe or socket is watched by the runtime's event loop; anything else
/// (a file, `/dev/null`, a terminal) is read on a blocking thread, which a
/// pipe does not need: a child proc starts one thread fewer (AL-6).
pub async fn stdin_closed() -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    if stdin_is_pipe() {
        return pipe_closed().await;
    }
    let mut stdin = tokio::io::stdin();
    let mut sink = [0u8; 64];
    while stdin.read(&mut sink).await? > 0 {}
    Ok(())
}

/// Whether fd 0 is a pipe or a socket.
fn stdin_is_pipe() -> bool {
    // SAFETY: fstat(2) into a zeroed struct this frame owns.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(0, &mut stat) } != 0 {
        return false;
    }
    matches!(stat.st_mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFSOCK)
}

/// [`stdin_closed`] for a pipe on fd 0: waits in the event loop until the
/// other end hangs up, reading and dropping whatever is written meanwhile.
/// Leaves the pipe blocking (its flags are shared with whoever else has it
/// open): bytes are read only as many as are waiting.
async fn pipe_closed() -> std::io::Result<()> {
    use std::os::fd::BorrowedFd;
    // SAFETY: fd 0 stays open for the life of the process, and is not
    // replaced while watched; it is only polled and read here.
    let watched = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(
            BorrowedFd::borrow_raw(0),
            tokio::io::Interest::READABLE,
        )?
    };
    let mut sink = [0u8; 64];
    loop {
        let mut ready = watched.readable().await?;
        let mut polled = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd this frame owns, not waiting.
        if unsafe { libc::poll(&mut polled, 1, 0) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if polled.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
            ready.clear_ready();
            continue;
        }
        // Readable with nothing to read: the other end is closed.
        if !has_bytes() {
            return Ok(());
        }
        // SAFETY: read(2) into a buffer this frame owns; bytes are waiting,
        // so it does not block.
        match unsafe { libc::read(0, sink.as_mut_ptr().cast(), sink.len()) } {
            0 => return Ok(()),
            n if n < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            _ => {}
        }
    }
}

/// Whether bytes wait on fd 0.
fn has_bytes() -> bool {
    let mut waiting: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int this frame owns.
    unsafe { libc::ioctl(0, libc::FIONREAD, &mut waiting) == 0 && waiting > 0 }
}
