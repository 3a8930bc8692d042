//! The ring all-reduce: the worker's side of
//! [`crate::mesh::TensorMesh::all_reduce`] for large CPU shards
//! ([`RingCommand`]s).
//!
//! The `n` ranks of a group sit on a ring; each sends only to the next
//! one's **ring port** (a port the worker opens once, [`RingCommand::Port`])
//! and receives only from the one before. A rank's shard is cut into `n`
//! segments and every segment into chunks:
//!
//! - **reduce-scatter**, steps `0 .. n - 1`: at step 0 rank `r` sends its
//!   own segment `r`; a rank that receives a chunk adds its own elements
//!   into it and sends it on, so after `n - 1` steps rank `r` holds the
//!   whole sum of segment `r + 1`, which it writes into its shard;
//! - **all-gather**, steps `n - 1 .. 2 (n - 1)`: the final sums go round
//!   once more, each rank writing every chunk it receives into its shard
//!   and passing it on, until every rank has every segment.
//!
//! Each rank sends `2 (n - 1) / n` of its shard and receives as much,
//! instead of the whole shard to the controller and back. A received
//! chunk is summed into, and sent on from, the buffer it was decoded into;
//! only a rank's own chunks at step 0 are copied out of its shard.
//!
//! - RG-1: every rank ends with the same bytes: each segment's sum is made
//!   once, by one rank, and copied to the others.
//! - RG-2: a run ends on every rank of the ring: with the sum, or with an
//!   error when a rank finds its shard poisoned, missing or of another
//!   size, a chunk of the wrong length arrives, the controller aborts it
//!   (a rank of the group failed), or its deadline passes. A rank that
//!   fails sends [`RingMessage::Abort`] on once, so the others stop too.
//! - RG-3: a shard that was written in part (a final sum landed) is
//!   poisoned by a failed run; one that was not keeps its values.
//! - RG-4: messages of other runs are told apart by the run's number:
//!   those of earlier runs (an aborted run's leftovers) are dropped,
//!   those of later runs (a neighbour that finished first) are kept for
//!   their run.

use std::collections::VecDeque;
use std::time::Duration;

use hyperactor::{Context, Mailbox, Port, PortId};
use hyperactor_mesh::Reducer;
use tokio::time::Instant;

use super::{Reply, TensorWorker, check_endpoint};
use crate::mesh::command::{RING_ENDPOINTS, RingCommand, RingMessage};
use crate::mesh::sharding::block;
use crate::{DType, Tensor};

/// A worker's ring port and the messages that came early (RG-4).
pub(in crate::mesh) struct RingPort {
    port: Port<RingMessage>,
    early: VecDeque<RingMessage>,
}

/// One run, as a rank sees it.
struct Run {
    op: u64,
    n: usize,
    me: usize,
    numel: usize,
    size: usize,
    dtype: DType,
    chunk: usize,
    next: PortId,
}

impl Run {
    /// Elements `start, len` of chunk `c` of segment `g`.
    fn range(&self, g: usize, c: usize) -> (usize, usize) {
        let (start, len) = block(self.numel, self.n, g);
        let from = c * self.chunk;
        (start + from, self.chunk.min(len.saturating_sub(from)))
    }

    /// Chunks of segment `g`.
    fn chunks(&self, g: usize) -> usize {
        block(self.numel, self.n, g).1.div_ceil(self.chunk)
    }

    /// The segment whose chunks arrive at `step`.
    fn received_segment(&self, step: usize) -> usize {
        let n = self.n;
        if step < n - 1 {
            (self.me + n - 1 - step) % n
        } else {
            (self.me + n - (step - (n - 1))) % n
        }
    }

    /// How many chunks arrive in the whole run.
    fn expected(&self) -> usize {
        (0..2 * (self.n - 1))
            .map(|step| self.chunks(self.received_segment(step)))
            .sum()
    }

    fn send(&self, mailbox: &Mailbox, step: usize, chunk: usize, bytes: Vec<u8>) {
        mailbox.post(
            &self.next,
            RingMessage::Chunk {
                op: self.op,
                step: step as u32,
                chunk: chunk as u64,
                bytes,
            },
        );
    }

    /// Handles one chunk from the rank before: sums or stores it, and
    /// passes it on unless this rank is its last stop.
    fn take(
        &self,
        mailbox: &Mailbox,
        tensor: &mut Tensor,
        wrote: &mut bool,
        step: usize,
        chunk: usize,
        mut bytes: Vec<u8>,
    ) -> Result<(), String> {
        let n = self.n;
        if step >= 2 * (n - 1) {
            return Err(format!(
                "a chunk of step {step} arrived; a ring of {n} has {} steps",
                2 * (n - 1)
            ));
        }
        let g = self.received_segment(step);
        if chunk >= self.chunks(g) {
            return Err(format!(
                "chunk {chunk} of step {step} arrived; its segment has {}",
                self.chunks(g)
            ));
        }
        let (start, len) = self.range(g, chunk);
        let span = start * self.size..(start + len) * self.size;
        if bytes.len() != span.len() {
            return Err(format!(
                "chunk {chunk} of step {step} holds {} bytes, not {}: the ranks' shards differ",
                bytes.len(),
                span.len()
            ));
        }
        if step < n - 1 {
            let own = tensor.as_bytes().map_err(|e| e.to_string())?;
            add_into(self.dtype, &mut bytes, &own[span.clone()]);
        }
        if step >= n - 2 {
            // A final sum: the last reduce-scatter step made it, the
            // all-gather steps carry it.
            let storage = tensor.as_bytes_mut().map_err(|e| e.to_string())?;
            storage[span].copy_from_slice(&bytes);
            *wrote = true;
        }
        if step < 2 * (n - 1) - 1 {
            self.send(mailbox, step + 1, chunk, bytes);
        }
        Ok(())
    }
}

impl TensorWorker {
    /// Handles a [`RingCommand`]; `None` when `endpoint` is not one of
    /// [`RING_ENDPOINTS`].
    pub(super) async fn call_ring(
        &mut self,
        cx: &Context<Self>,
        endpoint: &str,
        message: &[u8],
    ) -> Option<Reply> {
        if !RING_ENDPOINTS.contains(&endpoint) {
            return None;
        }
        Some(self.run_ring(cx, endpoint, message).await)
    }

    async fn run_ring(&mut self, cx: &Context<Self>, endpoint: &str, message: &[u8]) -> Reply {
        let command = RingCommand::decode(message)?;
        check_endpoint(endpoint, command.endpoint())?;
        let port = self.ring.get_or_insert_with(|| RingPort {
            port: cx.open_port(),
            early: VecDeque::new(),
        });
        match command {
            RingCommand::Port => rkyv::to_bytes::<rkyv::rancor::Error>(port.port.id())
                .map(|bytes| bytes.to_vec())
                .map_err(|e| format!("cannot archive the ring port's id: {e}")),
            RingCommand::AllReduce {
                id,
                op,
                numel,
                dtype,
                position,
                ports,
                chunk_bytes,
                window,
                timeout_ms,
            } => {
                // TW-1: a timeout past what an instant can hold waits a year.
                let now = Instant::now();
                let deadline = now
                    .checked_add(Duration::from_millis(timeout_ms.max(1)))
                    .unwrap_or(now + Duration::from_secs(365 * 24 * 3600));
                let me = position as usize;
                let n = ports.len();
                if me >= n {
                    return Err(format!("position {me} is not in a ring of {n}"));
                }
                let dtype: DType = dtype.into();
                let size = dtype.size_of();
                let run = Run {
                    op,
                    n,
                    me,
                    numel: usize::try_from(numel).unwrap_or(usize::MAX),
                    size,
                    dtype,
                    chunk: (usize::try_from(chunk_bytes).unwrap_or(usize::MAX) / size).max(1),
                    next: ports[(me + 1) % n].clone(),
                };
                self.ring_all_reduce(cx, id, run, window.max(1) as usize, deadline)
                    .await
            }
        }
    }

    async fn ring_all_reduce(
        &mut self,
        cx: &Context<Self>,
        id: u64,
        run: Run,
        window: usize,
        deadline: Instant,
    ) -> Reply {
        let mut tensor = match self.tensors.remove(&id) {
            Some(Ok(tensor)) => tensor,
            Some(Err(reason)) => {
                self.tensors.insert(id, Err(reason.clone()));
                return Err(abort(cx, &run, reason));
            }
            None => {
                let reason = format!(
                    "tensor {id} does not exist on rank {} (never created, or dropped)",
                    self.rank
                );
                return Err(abort(cx, &run, reason));
            }
        };
        let fits = if !tensor.device().is_cpu() {
            Err(format!(
                "a ring all-reduce needs a CPU shard; tensor {id}'s is on {}",
                tensor.device()
            ))
        } else if tensor.dtype() != run.dtype || tensor.numel() != run.numel {
            Err(format!(
                "tensor {id} on rank {} holds {} {} elements; the group's hold {} {}",
                self.rank,
                tensor.numel(),
                tensor.dtype(),
                run.numel,
                run.dtype
            ))
        } else {
            Ok(())
        };
        if let Err(reason) = fits {
            self.tensors.insert(id, Ok(tensor));
            return Err(abort(cx, &run, reason));
        }
        let Some(mut port) = self.ring.take() else {
            self.tensors.insert(id, Ok(tensor));
            return Err(abort(cx, &run, "the worker has no ring port".into()));
        };
        let mut wrote = false;
        let result = run
            .steps(cx, &mut port, &mut tensor, &mut wrote, window, deadline)
            .await;
        self.ring = Some(port);
        match result {
            Ok(()) => {
                self.tensors.insert(id, Ok(tensor));
                Ok(Vec::new())
            }
            Err(reason) => {
                let reason = abort(cx, &run, reason);
                if wrote {
                    // RG-3: some segments hold sums, others not.
                    let poison = format!("tensor {id}: ring all-reduce failed: {reason}");
                    self.tensors.insert(id, Err(poison));
                } else {
                    self.tensors.insert(id, Ok(tensor));
                }
                Err(reason)
            }
        }
    }
}

impl Run {
    /// The whole run on this rank: this rank's own chunks, up to `window`
    /// ahead, and every chunk from the rank before, until all arrived.
    async fn steps(
        &self,
        cx: &Mailbox,
        port: &mut RingPort,
        tensor: &mut Tensor,
        wrote: &mut bool,
        window: usize,
        deadline: Instant,
    ) -> Result<(), String> {
        if self.n < 2 {
            return Ok(());
        }
        let own = self.chunks(self.me);
        let mut sent = 0;
        let send_own = |sent: &mut usize, tensor: &Tensor| -> Result<(), String> {
            let (start, len) = self.range(self.me, *sent);
            let bytes = tensor.as_bytes().map_err(|e| e.to_string())?;
            self.send(
                cx,
                0,
                *sent,
                bytes[start * self.size..(start + len) * self.size].to_vec(),
            );
            *sent += 1;
            Ok(())
        };
        while sent < own.min(window) {
            send_own(&mut sent, tensor)?;
        }
        let mut left = self.expected();
        // RG-4: drop what earlier runs left.
        port.early.retain(|m| m.op() >= self.op);
        while left > 0 {
            let message = match port.early.iter().position(|m| m.op() == self.op) {
                Some(at) => port.early.remove(at),
                None => None,
            };
            let message = match message {
                Some(message) => message,
                None => match tokio::time::timeout_at(deadline, port.port.recv()).await {
                    Ok(Some(message)) => message,
                    Ok(None) => return Err("the ring port closed".into()),
                    Err(_) => {
                        return Err(format!(
                            "no chunk from the rank before within the deadline ({left} of {} missing)",
                            self.expected()
                        ));
                    }
                },
            };
            if message.op() < self.op {
                continue;
            }
            if message.op() > self.op {
                port.early.push_back(message);
                continue;
            }
            match message {
                // Passed on like any failure: once by every rank.
                RingMessage::Abort { reason, .. } => return Err(reason),
                RingMessage::Chunk {
                    step, chunk, bytes, ..
                } => {
                    self.take(cx, tensor, wrote, step as usize, chunk as usize, bytes)?;
                    left -= 1;
                }
            }
            if sent < own {
                send_own(&mut sent, tensor)?;
            }
        }
        Ok(())
    }
}

/// Tells the next rank that the run failed (RG-2) and returns the reason.
/// Every rank passes an abort on once; the one that started it gets it
/// back after its run ended, and drops it (RG-4).
fn abort(mailbox: &Mailbox, run: &Run, reason: String) -> String {
    if run.n > 1 {
        mailbox.post(
            &run.next,
            RingMessage::Abort {
                op: run.op,
                reason: reason.clone(),
            },
        );
    }
    reason
}

/// Adds `own`'s little-endian elements into `acc`'s, element by element
/// (integers wrapping); both are equally long. The same sum as the
/// multicast tree's reducers.
fn add_into(dtype: DType, acc: &mut [u8], own: &[u8]) {
    let reducer = match dtype {
        DType::F32 => Reducer::SumF32s,
        DType::F64 => Reducer::SumF64s,
        DType::I64 => Reducer::SumI64s,
    };
    reducer.combine_elements(acc, own);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(n: usize, me: usize, numel: usize, chunk: usize) -> Run {
        Run {
            op: 1,
            n,
            me,
            numel,
            size: 4,
            dtype: DType::F32,
            chunk,
            next: "local:one,one,a[0]"
                .parse::<hyperactor::ActorId>()
                .unwrap()
                .port_id(0),
        }
    }

    #[test]
    fn rg1_every_segment_arrives_twice_less_one_at_each_rank() {
        // 4 ranks, 10 elements in segments of 3, 3, 2, 2, chunks of 2.
        for me in 0..4 {
            let r = run(4, me, 10, 2);
            // Reduce-scatter: the segments before this rank's, then the
            // all-gather: this rank's own and the ones before it.
            let segments: Vec<usize> = (0..6).map(|s| r.received_segment(s)).collect();
            let expected = [
                (me + 3) % 4,
                (me + 2) % 4,
                (me + 1) % 4,
                me,
                (me + 3) % 4,
                (me + 2) % 4,
            ];
            assert_eq!(segments, expected, "rank {me}");
            // The last reduce-scatter step completes segment me + 1, which
            // the next rank receives first in the all-gather.
            assert_eq!(r.received_segment(2), (me + 1) % 4);
            let chunks: usize = segments.iter().map(|&g| r.chunks(g)).sum();
            assert_eq!(r.expected(), chunks);
        }
        let r = run(4, 0, 10, 2);
        assert_eq!((r.range(0, 0), r.range(0, 1)), ((0, 2), (2, 1)));
        assert_eq!(r.range(3, 0), (8, 2));
        // Fewer elements than ranks: empty segments have no chunks.
        let tiny = run(4, 3, 2, 8);
        assert_eq!(tiny.chunks(3), 0);
        assert_eq!(tiny.chunks(0), 1);
    }

    #[test]
    fn sums_wrap_for_integers_and_add_in_their_precision_for_floats() {
        let mut acc: Vec<u8> = [i64::MAX, 5].iter().flat_map(|v| v.to_le_bytes()).collect();
        let own: Vec<u8> = [1i64, -7].iter().flat_map(|v| v.to_le_bytes()).collect();
        add_into(DType::I64, &mut acc, &own);
        let got: Vec<i64> = acc
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![i64::MIN, -2]);
        let mut acc: Vec<u8> = [1.5f32, 1e8].iter().flat_map(|v| v.to_le_bytes()).collect();
        let own: Vec<u8> = [2.25f32, 1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        add_into(DType::F32, &mut acc, &own);
        let got: Vec<f32> = acc
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![3.75, 1e8], "1e8 + 1 is 1e8 in f32");
    }
}
