//! [`Call`] and [`CallStream`]: requests in flight, as a future and as a
//! stream.
//!
//! A request is sent when the [`ActorMesh`](crate::ActorMesh) method that
//! makes it returns, not when it is first polled, so several calls made one
//! after another run concurrently even when awaited one at a time.
//! Dropping a `Call` does not recall the request; its reply is dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use serde::de::DeserializeOwned;

use crate::bindings::monarch::host::types as wit;
use crate::executor::{RequestId, try_with_reactor, with_reactor};
use crate::{CallError, ValueMesh, codec};

/// The rank a [`CallStream`] item carries when the host failed the stream
/// as a whole (say, an `invalid` request) rather than one rank of it.
pub const NO_RANK: u32 = u32::MAX;

/// The outcome of a request as its `done` event carries it.
pub(crate) type Done = Result<wit::Reply, wit::CallError>;

/// A request in flight; await it for the reply.
///
/// Made by the call methods of [`ActorMesh`](crate::ActorMesh). The output
/// is `Result<T, CallError>`. It is a
/// [`FusedFuture`](futures::future::FusedFuture), so it can go straight into
/// [`select!`](crate::select!).
#[must_use = "the request is already sent; await the call for its reply"]
pub struct Call<T> {
    state: State,
    decode: fn(Done) -> Result<T, CallError>,
}

enum State {
    InFlight(RequestId),
    Refused(CallError),
    Finished,
}

impl<T> Call<T> {
    /// A call for the request `id`, whose `done` is decoded by `decode`.
    pub(crate) fn in_flight(id: RequestId, decode: fn(Done) -> Result<T, CallError>) -> Self {
        with_reactor(|r| r.register(id));
        Self {
            state: State::InFlight(id),
            decode,
        }
    }

    /// A call that was never sent; it completes at once with `error`.
    pub(crate) fn refused(error: CallError) -> Self {
        Self {
            state: State::Refused(error),
            decode: |_| Err(CallError::invalid("internal: a refused call was decoded")),
        }
    }
}

impl<T> Future for Call<T> {
    type Output = Result<T, CallError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::InFlight(id) => match with_reactor(|r| r.poll_event(id, cx.waker())) {
                Poll::Pending => {
                    self.state = State::InFlight(id);
                    Poll::Pending
                }
                Poll::Ready(Some(wit::EventKind::Done(done))) => Poll::Ready((self.decode)(done)),
                Poll::Ready(Some(other)) => {
                    try_with_reactor(|r| r.cancel(id));
                    Poll::Ready(Err(CallError::invalid(format!(
                        "the host answered request {id} with {other:?} instead of `done`"
                    ))))
                }
                Poll::Ready(None) => Poll::Ready(Err(CallError::invalid(format!(
                    "internal: request {id} has no slot in the reactor"
                )))),
            },
            State::Refused(error) => Poll::Ready(Err(error)),
            State::Finished => panic!("a monarch_guest::Call was polled after it completed"),
        }
    }
}

/// A finished call is terminated, so a `Call` can go straight into
/// [`select!`](crate::select!) without `.fuse()`.
impl<T> futures::future::FusedFuture for Call<T> {
    fn is_terminated(&self) -> bool {
        matches!(self.state, State::Finished)
    }
}

impl<T> Drop for Call<T> {
    fn drop(&mut self) {
        if let State::InFlight(id) = self.state {
            try_with_reactor(|r| r.cancel(id));
        }
    }
}

/// The replies of a `stream` request, one item per rank as they arrive:
/// `(rank, Result<T, CallError>)`.
///
/// It implements [`futures::Stream`]: read it with
/// [`StreamExt::next`](futures::StreamExt::next) (the
/// [`prelude`](crate::prelude) brings `StreamExt` into scope). When the host fails the request as a whole (an
/// `invalid` request, say) rather than one rank of it, the stream yields
/// that error once, with the rank [`NO_RANK`], and ends.
#[must_use = "the request is already sent; read the stream for the replies"]
pub struct CallStream<T> {
    state: StreamState,
    decode: fn(&[u8]) -> Result<T, CallError>,
}

enum StreamState {
    InFlight(RequestId),
    Refused(CallError),
    Ended,
}

impl<T: DeserializeOwned + 'static> CallStream<T> {
    /// A stream of the replies to the request `id`.
    pub(crate) fn start(id: RequestId) -> Self {
        with_reactor(|r| r.register(id));
        Self::with_state(StreamState::InFlight(id))
    }

    /// A stream that was never sent: it yields `error` once, for
    /// [`NO_RANK`], then ends.
    pub(crate) fn refused(error: CallError) -> Self {
        Self::with_state(StreamState::Refused(error))
    }

    fn with_state(state: StreamState) -> Self {
        Self {
            state,
            decode: |bytes| codec::decode(bytes).map_err(|e| CallError::decode(e.to_string())),
        }
    }
}

impl<T> Stream for CallStream<T> {
    type Item = (u32, Result<T, CallError>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let id = match std::mem::replace(&mut self.state, StreamState::Ended) {
            StreamState::InFlight(id) => id,
            StreamState::Refused(error) => return Poll::Ready(Some((NO_RANK, Err(error)))),
            StreamState::Ended => return Poll::Ready(None),
        };
        let event = match with_reactor(|r| r.poll_event(id, cx.waker())) {
            Poll::Pending => {
                self.state = StreamState::InFlight(id);
                return Poll::Pending;
            }
            Poll::Ready(event) => event,
        };
        let (item, more) = match event {
            Some(wit::EventKind::Item((rank, Ok(bytes)))) => {
                (Some((rank, (self.decode)(&bytes))), true)
            }
            Some(wit::EventKind::Item((rank, Err(e)))) => (Some((rank, Err(e.into()))), true),
            Some(wit::EventKind::End) | None => (None, false),
            Some(wit::EventKind::Done(Err(e))) => (Some((NO_RANK, Err(e.into()))), false),
            Some(other) => {
                let why = format!("the host answered stream {id} with {other:?}");
                (Some((NO_RANK, Err(CallError::invalid(why)))), false)
            }
        };
        if more {
            self.state = StreamState::InFlight(id);
        } else {
            try_with_reactor(|r| r.cancel(id));
        }
        Poll::Ready(item)
    }
}

impl<T> Drop for CallStream<T> {
    fn drop(&mut self) {
        if let StreamState::InFlight(id) = self.state {
            try_with_reactor(|r| r.cancel(id));
        }
    }
}

/// Decodes a reply that is one payload: `call-one`, `choose`, a numeric
/// reducer.
pub(crate) fn decode_single<T: DeserializeOwned + 'static>(done: Done) -> Result<T, CallError> {
    match done? {
        wit::Reply::Single(bytes) => {
            codec::decode(&bytes).map_err(|e| CallError::decode(e.to_string()))
        }
        wit::Reply::Gathered(_) => Err(CallError::decode(
            "expected one reply, the host gathered a value mesh",
        )),
    }
}

/// Decodes the replies of a `call` without a reducer.
pub(crate) fn decode_gathered<T: DeserializeOwned + 'static>(
    done: Done,
) -> Result<ValueMesh<T>, CallError> {
    match done? {
        wit::Reply::Gathered(raw) => ValueMesh::decode(raw),
        wit::Reply::Single(_) => Err(CallError::decode(
            "expected a value mesh, the host sent one reply",
        )),
    }
}

/// Decodes the replies of a `call` with the `concat` reducer.
pub(crate) fn decode_concat<T: DeserializeOwned + 'static>(
    done: Done,
) -> Result<Vec<T>, CallError> {
    match done? {
        wit::Reply::Single(bytes) => {
            codec::decode_concat(&bytes).map_err(|e| CallError::decode(e.to_string()))
        }
        wit::Reply::Gathered(_) => Err(CallError::decode(
            "expected concatenated replies, the host gathered a value mesh",
        )),
    }
}

/// Leaves a reduced reply as the host's bytes.
pub(crate) fn decode_raw(done: Done) -> Result<Vec<u8>, CallError> {
    match done? {
        wit::Reply::Single(bytes) => Ok(bytes),
        wit::Reply::Gathered(_) => Err(CallError::decode(
            "expected one reduced reply, the host gathered a value mesh",
        )),
    }
}

/// Keeps only whether a request succeeded (its payload is empty).
pub(crate) fn decode_unit(done: Done) -> Result<(), CallError> {
    decode_raw(done).map(|_| ())
}

#[cfg(test)]
impl<T: DeserializeOwned + 'static> Call<T> {
    pub(crate) fn single(id: RequestId) -> Self {
        Self::in_flight(id, decode_single::<T>)
    }
}

#[cfg(test)]
impl<T: DeserializeOwned + 'static> Call<ValueMesh<T>> {
    pub(crate) fn gathered(id: RequestId) -> Self {
        Self::in_flight(id, decode_gathered::<T>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn host_errors_pass_through_every_decoder() {
        let timeout = || {
            Err(wit::CallError {
                kind: wit::ErrorKind::Timeout,
                origin: None,
                message: "no reply within 10 ms".into(),
                type_name: None,
                backtrace: None,
            })
        };
        let expected = CallError::new(crate::ErrorKind::Timeout, "no reply within 10 ms");
        assert_eq!(decode_single::<i64>(timeout()), Err(expected.clone()));
        assert_eq!(decode_gathered::<i64>(timeout()), Err(expected.clone()));
        assert_eq!(decode_concat::<i64>(timeout()), Err(expected.clone()));
        assert_eq!(decode_raw(timeout()), Err(expected));
    }

    #[test]
    fn reducer_replies_decode_as_the_reducer_writes_them() {
        // A CBOR integer (shortest head) for the i64 reducers.
        let sum = Ok(wit::Reply::Single(vec![0x18, 42]));
        assert_eq!(decode_single::<i64>(sum), Ok(42));
        // A 64-bit CBOR float for the f64 reducers.
        let mut max = vec![0xfb];
        max.extend(2.5f64.to_be_bytes());
        assert_eq!(decode_single::<f64>(Ok(wit::Reply::Single(max))), Ok(2.5));
        // `concat`: a CBOR sequence, one value per rank.
        let joined = vec![0x03, 0x24];
        assert_eq!(
            decode_concat::<i64>(Ok(wit::Reply::Single(joined))),
            Ok(vec![3, -5])
        );
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_a_decode_error() {
        let gathered = || {
            Ok(wit::Reply::Gathered(wit::ValueMesh {
                extent: vec![],
                values: vec![vec![]],
            }))
        };
        let kind = |e: CallError| e.kind();
        assert_eq!(
            decode_single::<i64>(gathered()).map_err(kind),
            Err(ErrorKind::Decode)
        );
        assert_eq!(decode_raw(gathered()).map_err(kind), Err(ErrorKind::Decode));
        assert_eq!(
            decode_gathered::<i64>(Ok(wit::Reply::Single(vec![]))).map_err(kind),
            Err(ErrorKind::Decode)
        );
    }
}
