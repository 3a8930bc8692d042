//! Mailboxes and ports: where messages land.
//!
//! Every actor, and every client attached to a proc, has a [`Mailbox`]: an
//! [`ActorId`] and a set of numbered ports. A port is where messages of one
//! type arrive:
//!
//! - handler ports, one per message type an actor exports, feed the actor's
//!   handlers;
//! - [`Port<M>`] is a port opened at run time that receives many messages;
//! - [`OncePort<M>`] receives exactly one message, usually the reply to a
//!   call, or the failure that stands in for it.
//!
//! The receiving end stays in the mailbox; what travels is a reference,
//! [`PortRef<M>`] or [`OncePortRef<M>`], which can be put inside a message to
//! another proc and still reaches the port from there.
//!
//! Invariants:
//! - MB-1: a once-port takes one delivery, message or failure, then closes.
//! - MB-2: a call's once-port fails, and the call ends, when the request is
//!   undeliverable, when the actor fails before replying, when the proc it
//!   waits on becomes unreachable, or when the call timeout passes.
//! - MB-3: dropping a port's receiving end closes the port; later messages
//!   to it are undeliverable (`UnknownPort`).
//! - MB-4: a call started with [`Mailbox::start_call_then`] hands its reply,
//!   or the failure that stands in for it, to its function in the task that
//!   delivers it, exactly once; [`PendingCall::expire`] ends it instead if
//!   it comes first. No task or timer waits for it.

use std::any::{Any, type_name};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::FastMap;
use crate::channel::ChannelAddr;
use crate::failure::{CallError, DeliveryFailure, Undeliverable};
use crate::id::{ActorId, PortId};
use crate::message::RemoteMessage;
use crate::proc::Proc;

/// The port every mailbox receives its undeliverable messages on.
pub(crate) const UNDELIVERABLE_PORT: u64 = 0;

/// Addressing that travels with a message, kept to report it if it fails.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub(crate) sender: ActorId,
    pub(crate) dest: PortId,
    pub(crate) return_port: Option<PortId>,
    pub(crate) message_type: TypeName,
}

/// The Rust type name of a message: static when sent from this proc, shared
/// when it came over a channel (one allocation per connection and type).
#[derive(Debug, Clone)]
pub(crate) enum TypeName {
    Static(&'static str),
    Shared(Arc<str>),
}

impl std::ops::Deref for TypeName {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            TypeName::Static(name) => name,
            TypeName::Shared(name) => name,
        }
    }
}

impl std::fmt::Display for TypeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

/// A message on its way into a port.
pub(crate) enum Payload<'a> {
    /// The value itself, from this proc.
    Local(Box<dyn Any + Send>),
    /// An archive from another proc, not yet validated.
    Remote(&'a [u8]),
}

impl Payload<'_> {
    /// Takes the message out as an `M`, validating and decoding an archive.
    pub(crate) fn into_message<M: RemoteMessage>(
        self,
        dest: &PortId,
    ) -> Result<M, DeliveryFailure> {
        match self {
            Payload::Local(value) => {
                value
                    .downcast::<M>()
                    .map(|m| *m)
                    .map_err(|_| DeliveryFailure::Malformed {
                        port: dest.clone(),
                        detail: format!("port does not take {}", type_name::<M>()),
                    })
            }
            Payload::Remote(bytes) => M::decode(bytes).map_err(|e| DeliveryFailure::Malformed {
                port: dest.clone(),
                detail: e.to_string(),
            }),
        }
    }
}

/// The messages queued for one actor and not yet taken by it: what a
/// receiver watches to stop reading a connection that outruns the actor
/// (PR-9).
#[derive(Default)]
pub(crate) struct Backlog {
    queued: std::sync::atomic::AtomicUsize,
    /// A receiver waits for the queue to fall to this; 0: nobody waits.
    low_water: std::sync::atomic::AtomicUsize,
    drained: tokio::sync::Notify,
}

impl Backlog {
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    pub(crate) fn added(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    /// The actor took one message.
    pub(crate) fn taken(&self) {
        let before = self.queued.fetch_sub(1, Ordering::AcqRel);
        let low = self.low_water.load(Ordering::Acquire);
        if low != 0 && before <= low + 1 {
            self.low_water.store(0, Ordering::Release);
            self.drained.notify_waiters();
        }
    }

    /// Waits until at most `low` messages are queued, or the queue has not
    /// moved for `stall`; whether it drained.
    pub(crate) async fn drain_to(&self, low: usize, stall: std::time::Duration) -> bool {
        let low = low.max(1);
        let mut last = self.queued();
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            self.low_water.store(low, Ordering::Release);
            let now = self.queued();
            if now <= low {
                self.low_water.store(0, Ordering::Release);
                return true;
            }
            if tokio::time::timeout(stall, drained).await.is_err() {
                let now = self.queued();
                if now >= last {
                    self.low_water.store(0, Ordering::Release);
                    return false;
                }
                last = now;
            }
        }
    }
}

/// The receiving end of a port, as the router sees it.
pub(crate) trait PortSink: Send + Sync {
    /// The queue of the actor this port feeds, for the receivers' window
    /// (PR-9); `None` for ports that queue nothing an actor must work off.
    fn backlog(&self) -> Option<&Arc<Backlog>> {
        None
    }
    /// Takes a message.
    fn deliver(&self, payload: Payload<'_>, meta: Meta) -> Result<(), DeliveryFailure>;
    /// Takes a failure that stands in for a message (once-ports end with it).
    fn fail(&self, failure: DeliveryFailure) {
        let _ = failure;
    }
    /// Takes a message that came back undelivered (the undeliverable port only).
    fn undeliverable(&self, undeliverable: Undeliverable) {
        tracing::warn!(%undeliverable, "undeliverable message dropped");
    }
    /// A once-port leaves the mailbox when it takes its delivery.
    fn is_once(&self) -> bool {
        false
    }
    /// The proc a once-port waits on, to fail it if that proc becomes unreachable.
    fn expects_from(&self) -> Option<&ChannelAddr> {
        None
    }
}

/// A mailbox as the proc's router holds it.
pub(crate) struct MailboxEntry {
    pub(crate) id: ActorId,
    ports: Mutex<FastMap<u64, Arc<dyn PortSink>>>,
    next_port: AtomicU64,
    /// Whether a stopped or failed actor may be replaced by a new one.
    pub(crate) terminated: Box<dyn Fn() -> bool + Send + Sync>,
}

impl MailboxEntry {
    pub(crate) fn new(id: ActorId, terminated: Box<dyn Fn() -> bool + Send + Sync>) -> Self {
        MailboxEntry {
            id,
            ports: Mutex::new(FastMap::default()),
            next_port: AtomicU64::new(1),
            terminated,
        }
    }

    pub(crate) fn bind(&self, port: u64, sink: Arc<dyn PortSink>) {
        self.ports.lock().insert(port, sink);
    }

    fn open(&self, sink: Arc<dyn PortSink>) -> u64 {
        let port = self.next_port.fetch_add(1, Ordering::Relaxed);
        self.bind(port, sink);
        port
    }

    pub(crate) fn close(&self, port: u64) {
        self.ports.lock().remove(&port);
    }

    fn sink(&self, port: u64) -> Option<Arc<dyn PortSink>> {
        let mut ports = self.ports.lock();
        let sink = ports.get(&port)?;
        if sink.is_once() {
            ports.remove(&port)
        } else {
            Some(sink.clone())
        }
    }

    /// Delivers a message to one of this mailbox's ports.
    pub(crate) fn deliver(&self, payload: Payload<'_>, meta: Meta) -> Result<(), DeliveryFailure> {
        self.deliver_within(payload, meta, usize::MAX).map(|_| ())
    }

    /// Delivers a message; the actor's queue when it now holds more than
    /// `window` messages (PR-9).
    pub(crate) fn deliver_within(
        &self,
        payload: Payload<'_>,
        meta: Meta,
        window: usize,
    ) -> Result<Option<Arc<Backlog>>, DeliveryFailure> {
        match self.sink(meta.dest.index()) {
            Some(sink) => {
                sink.deliver(payload, meta)?;
                Ok(sink
                    .backlog()
                    .filter(|backlog| backlog.queued() > window)
                    .cloned())
            }
            None => Err(DeliveryFailure::UnknownPort {
                port: meta.dest.clone(),
                message_type: meta.message_type.to_string(),
            }),
        }
    }

    /// Delivers a failure to a port; a port that is gone needs no news (DF-2).
    pub(crate) fn fail(&self, port: u64, failure: DeliveryFailure) {
        if let Some(sink) = self.sink(port) {
            sink.fail(failure);
        }
    }

    /// Hands a returned message to this mailbox's owner.
    pub(crate) fn undeliverable(&self, undeliverable: Undeliverable) {
        match self.ports.lock().get(&UNDELIVERABLE_PORT).cloned() {
            Some(sink) => sink.undeliverable(undeliverable),
            None => tracing::warn!(%undeliverable, "undeliverable message dropped"),
        }
    }

    /// Fails every once-port waiting on a reply from `addr`.
    pub(crate) fn fail_expecting(&self, addr: &ChannelAddr, failure: &DeliveryFailure) {
        let waiting: Vec<Arc<dyn PortSink>> = {
            let mut ports = self.ports.lock();
            let keys: Vec<u64> = ports
                .iter()
                .filter(|(_, sink)| sink.expects_from() == Some(addr))
                .map(|(port, _)| *port)
                .collect();
            keys.iter().filter_map(|port| ports.remove(port)).collect()
        };
        for sink in waiting {
            sink.fail(failure.clone());
        }
    }
}

/// A mailbox: an identity that can send messages and open ports.
///
/// Actors reach theirs through their [`Context`](crate::Context); code outside
/// actors gets one from [`Proc::attach`].
#[derive(Clone)]
pub struct Mailbox {
    pub(crate) proc: Proc,
    pub(crate) entry: Arc<MailboxEntry>,
    _client: Option<Arc<ClientGuard>>,
}

/// Removes a client mailbox from its proc when its last clone goes.
struct ClientGuard {
    proc: Proc,
    id: ActorId,
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.proc.unregister(&self.id);
    }
}

impl Mailbox {
    pub(crate) fn for_actor(proc: Proc, entry: Arc<MailboxEntry>) -> Self {
        Mailbox {
            proc,
            entry,
            _client: None,
        }
    }

    pub(crate) fn for_client(
        proc: Proc,
        entry: Arc<MailboxEntry>,
    ) -> (Self, mpsc::UnboundedReceiver<Undeliverable>) {
        let (tx, rx) = mpsc::unbounded_channel();
        entry.bind(UNDELIVERABLE_PORT, Arc::new(ClientUndeliverable(tx)));
        let guard = Arc::new(ClientGuard {
            proc: proc.clone(),
            id: entry.id.clone(),
        });
        (
            Mailbox {
                proc,
                entry,
                _client: Some(guard),
            },
            rx,
        )
    }

    /// This mailbox's identity; messages it sends carry it as their sender.
    pub fn actor_id(&self) -> &ActorId {
        &self.entry.id
    }

    /// The proc this mailbox lives in.
    pub fn proc(&self) -> &Proc {
        &self.proc
    }

    /// Sends `message` to the port `dest`, in this proc or another.
    /// Failure comes back as an [`Undeliverable`].
    pub fn post<M: RemoteMessage>(&self, dest: &PortId, message: M) {
        self.proc.post(&self.entry.id, dest, message, None);
    }

    /// Waits until a message to `dest` can be sent without queuing past the
    /// window of the link to its proc (LK-8). Sends never wait by
    /// themselves; a sender that may outrun its receiver (a burst, a
    /// stream) awaits this before each one, and so holds at most a window
    /// of unacknowledged bytes however slow the receiver is.
    pub async fn ready(&self, dest: &PortId) {
        self.proc.ready(dest.actor_id()).await
    }

    /// Opens a port that receives many messages of type `M`.
    pub fn open_port<M: RemoteMessage>(&self) -> Port<M> {
        let (tx, rx) = mpsc::unbounded_channel();
        let port = self.entry.open(Arc::new(StreamSink(tx)));
        Port {
            id: self.entry.id.port_id(port),
            rx,
            entry: self.entry.clone(),
        }
    }

    /// Opens a port that receives one message of type `M`.
    pub fn open_once_port<M: RemoteMessage>(&self) -> OncePort<M> {
        self.open_once_port_from(None)
    }

    fn open_once_port_from<M: RemoteMessage>(
        &self,
        expects_from: Option<ChannelAddr>,
    ) -> OncePort<M> {
        let (tx, rx) = oneshot::channel();
        let (port, _) = self.open_once_sink(expects_from, move |result| {
            let _ = tx.send(result);
        });
        OncePort {
            id: self.entry.id.port_id(port),
            rx,
            entry: self.entry.clone(),
        }
    }

    /// Opens a once-port whose delivery, message or failure, goes to
    /// `then` (MB-1).
    fn open_once_sink<M, F>(
        &self,
        expects_from: Option<ChannelAddr>,
        then: F,
    ) -> (u64, Arc<OnceSink<M, F>>)
    where
        M: RemoteMessage,
        F: FnOnce(Result<M, CallError>) + Send + 'static,
    {
        let sink = Arc::new(OnceSink {
            then: Mutex::new(Some(then)),
            expects_from,
            _message: PhantomData,
        });
        (self.entry.open(sink.clone()), sink)
    }

    /// The proc a reply from `dest` comes from, when it is not this one: a
    /// call's once-port fails if that proc becomes unreachable (MB-2).
    fn reply_from(&self, dest: &PortId) -> Option<ChannelAddr> {
        let proc = dest.actor_id().proc_id();
        (!proc.same(self.proc.id())).then(|| proc.addr().clone())
    }

    /// Sends the message `make` builds around a fresh reply port to `dest`
    /// now, and runs `then` with the reply, or the failure that stands in
    /// for it, in whichever task delivers it (MB-4): no task waits for
    /// the reply and no timer is set. `then` runs at most once and must
    /// not block; it never runs if the port is closed first (this mailbox
    /// ends, or [`PendingCall::expire`] is too late). The caller bounds
    /// the wait: a call whose callee never answers holds its port until
    /// [`PendingCall::expire`].
    pub fn start_call_then<M, R>(
        &self,
        dest: &PortId,
        make: impl FnOnce(OncePortRef<R>) -> M,
        then: impl FnOnce(Result<R, CallError>) + Send + 'static,
    ) -> PendingCall<R>
    where
        M: RemoteMessage,
        R: RemoteMessage,
    {
        let (port, sink) = self.open_once_sink(self.reply_from(dest), then);
        let id = self.entry.id.port_id(port);
        let message = make(OncePortRef {
            id: id.clone(),
            _message: PhantomData,
        });
        self.proc.post(&self.entry.id, dest, message, Some(id));
        let sink: Arc<dyn RunOnce<R>> = sink;
        PendingCall {
            entry: Arc::downgrade(&self.entry),
            port,
            sink: Arc::downgrade(&sink),
        }
    }

    /// Sends the message `make` builds around a fresh reply port to `dest`,
    /// and waits for the reply, at most `timeout`.
    ///
    /// Every call ends: with the reply, or with a [`CallError`] if the message
    /// is undeliverable, the actor fails, its proc becomes unreachable, or the
    /// timeout passes (MB-2).
    pub async fn call_port<M, R>(
        &self,
        dest: &PortId,
        make: impl FnOnce(OncePortRef<R>) -> M,
        timeout: Duration,
    ) -> Result<R, CallError>
    where
        M: RemoteMessage,
        R: RemoteMessage,
    {
        self.start_call(dest, make).recv_timeout(timeout).await
    }

    /// Sends the message `make` builds around a fresh reply port to `dest`
    /// now, and returns the port the reply (or the failure that stands in
    /// for it) will arrive on. [`Mailbox::call_port`] is this plus the wait.
    pub fn start_call<M, R>(
        &self,
        dest: &PortId,
        make: impl FnOnce(OncePortRef<R>) -> M,
    ) -> OncePort<R>
    where
        M: RemoteMessage,
        R: RemoteMessage,
    {
        let reply = self.open_once_port_from::<R>(self.reply_from(dest));
        let message = make(reply.bind());
        self.proc
            .post(&self.entry.id, dest, message, Some(reply.id.clone()));
        reply
    }
}

/// The undeliverable port of a client mailbox.
struct ClientUndeliverable(mpsc::UnboundedSender<Undeliverable>);

impl PortSink for ClientUndeliverable {
    fn deliver(&self, _: Payload<'_>, meta: Meta) -> Result<(), DeliveryFailure> {
        Err(DeliveryFailure::UnknownPort {
            port: meta.dest,
            message_type: meta.message_type.to_string(),
        })
    }

    fn undeliverable(&self, undeliverable: Undeliverable) {
        tracing::debug!(%undeliverable, "returned to client");
        let _ = self.0.send(undeliverable);
    }
}

struct StreamSink<M>(mpsc::UnboundedSender<M>);

impl<M: RemoteMessage> PortSink for StreamSink<M> {
    fn deliver(&self, payload: Payload<'_>, meta: Meta) -> Result<(), DeliveryFailure> {
        let message = payload.into_message::<M>(&meta.dest)?;
        self.0
            .send(message)
            .map_err(|_| DeliveryFailure::UnknownPort {
                port: meta.dest,
                message_type: meta.message_type.to_string(),
            })
    }
}

/// A once-port: hands its one delivery, message or failure, to a function
/// (MB-1): the channel a [`OncePort`] waits on, or the function of a call
/// started with [`Mailbox::start_call_then`] (MB-4).
struct OnceSink<M, F> {
    then: Mutex<Option<F>>,
    expects_from: Option<ChannelAddr>,
    _message: PhantomData<fn(M)>,
}

/// What a [`PendingCall`] needs of its port's sink.
trait RunOnce<M>: Send + Sync {
    /// Runs the sink's function, unless it ran already.
    fn run(&self, result: Result<M, CallError>);
}

impl<M, F> RunOnce<M> for OnceSink<M, F>
where
    F: FnOnce(Result<M, CallError>) + Send,
{
    fn run(&self, result: Result<M, CallError>) {
        let then = self.then.lock().take();
        if let Some(then) = then {
            then(result);
        }
    }
}

impl<M, F> PortSink for OnceSink<M, F>
where
    M: RemoteMessage,
    F: FnOnce(Result<M, CallError>) + Send,
{
    fn deliver(&self, payload: Payload<'_>, meta: Meta) -> Result<(), DeliveryFailure> {
        let result = payload.into_message::<M>(&meta.dest);
        let malformed = result.as_ref().err().cloned();
        self.run(result.map_err(CallError::from));
        match malformed {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    fn fail(&self, failure: DeliveryFailure) {
        self.run(Err(CallError::from(failure)));
    }

    fn is_once(&self) -> bool {
        true
    }

    fn expects_from(&self) -> Option<&ChannelAddr> {
        self.expects_from.as_ref()
    }
}

/// A call started with [`Mailbox::start_call_then`]. Holding it keeps
/// nothing alive: it only lets the caller end the call.
pub struct PendingCall<M> {
    entry: std::sync::Weak<MailboxEntry>,
    port: u64,
    sink: std::sync::Weak<dyn RunOnce<M>>,
}

impl<M> PendingCall<M> {
    /// Whether the call is still waiting for its reply.
    pub fn waiting(&self) -> bool {
        self.sink.strong_count() > 0
    }

    /// Ends the call with `error` if it is still waiting: its port closes,
    /// and its function runs with the error.
    pub fn expire(&self, error: CallError) {
        let Some(sink) = self.sink.upgrade() else {
            return;
        };
        if let Some(entry) = self.entry.upgrade() {
            entry.close(self.port);
        }
        sink.run(Err(error));
    }
}

/// The receiving end of a port that takes many messages of type `M`.
/// Dropping it closes the port.
pub struct Port<M> {
    id: PortId,
    rx: mpsc::UnboundedReceiver<M>,
    entry: Arc<MailboxEntry>,
}

impl<M: RemoteMessage> Port<M> {
    /// The port's id.
    pub fn id(&self) -> &PortId {
        &self.id
    }

    /// A reference to this port that can be sent to other actors and procs.
    pub fn bind(&self) -> PortRef<M> {
        PortRef::attest(self.id.clone())
    }

    /// The next message; `None` never comes while the port is open.
    pub async fn recv(&mut self) -> Option<M> {
        self.rx.recv().await
    }
}

impl<M> Drop for Port<M> {
    fn drop(&mut self) {
        self.entry.close(self.id.index());
    }
}

/// The receiving end of a port that takes one message of type `M`.
/// Dropping it closes the port.
pub struct OncePort<M> {
    id: PortId,
    rx: oneshot::Receiver<Result<M, CallError>>,
    entry: Arc<MailboxEntry>,
}

impl<M: RemoteMessage> OncePort<M> {
    /// The port's id.
    pub fn id(&self) -> &PortId {
        &self.id
    }

    /// A reference to this port that can be sent to other actors and procs.
    pub fn bind(&self) -> OncePortRef<M> {
        OncePortRef {
            id: self.id.clone(),
            _message: PhantomData,
        }
    }

    /// Waits for the message, or the failure that stands in for it.
    pub async fn recv(mut self) -> Result<M, CallError> {
        match (&mut self.rx).await {
            Ok(result) => result,
            Err(_) => Err(CallError::Closed),
        }
    }

    /// Like [`OncePort::recv`], giving up with [`CallError::Timeout`] after `timeout`.
    pub async fn recv_timeout(self, timeout: Duration) -> Result<M, CallError> {
        match tokio::time::timeout(timeout, self.recv()).await {
            Ok(result) => result,
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }
}

impl<M> Drop for OncePort<M> {
    fn drop(&mut self) {
        self.entry.close(self.id.index());
    }
}

/// A reference to a [`Port<M>`] that can travel inside messages.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct PortRef<M> {
    id: PortId,
    #[rkyv(with = rkyv::with::Skip)]
    _message: PhantomData<fn() -> M>,
}

impl<M: RemoteMessage> PortRef<M> {
    /// A reference to the port `id`, trusted to take `M`s.
    pub fn attest(id: PortId) -> Self {
        PortRef {
            id,
            _message: PhantomData,
        }
    }

    /// The port's id.
    pub fn id(&self) -> &PortId {
        &self.id
    }

    /// Sends `message` to the port from `sender`.
    pub fn send(&self, sender: &Mailbox, message: M) {
        sender.post(&self.id, message);
    }

    /// Sends a copy of `message` to the port from `sender`: to another
    /// process it is archived straight from `message`, so that a sender
    /// of many similar messages (a cast to each child of a tree) can keep
    /// one value and change it between sends instead of building each.
    pub fn send_ref(&self, sender: &Mailbox, message: &M)
    where
        M: Clone,
    {
        sender.proc.post_ref(&sender.entry.id, &self.id, message);
    }
}

impl<M> Clone for PortRef<M> {
    fn clone(&self) -> Self {
        PortRef {
            id: self.id.clone(),
            _message: PhantomData,
        }
    }
}

impl<M> std::fmt::Debug for PortRef<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PortRef<{}>({})", type_name::<M>(), self.id)
    }
}

/// A reference to a [`OncePort<M>`] that can travel inside messages; sending
/// consumes it.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct OncePortRef<M> {
    id: PortId,
    #[rkyv(with = rkyv::with::Skip)]
    _message: PhantomData<fn() -> M>,
}

impl<M: RemoteMessage> OncePortRef<M> {
    /// The port's id.
    pub fn id(&self) -> &PortId {
        &self.id
    }

    /// Sends the one message to the port from `sender`.
    pub fn send(self, sender: &Mailbox, message: M) {
        sender.post(&self.id, message);
    }
}

impl<M> std::fmt::Debug for OncePortRef<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OncePortRef<{}>({})", type_name::<M>(), self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProcConfig;

    async fn proc() -> Proc {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let addr: ChannelAddr = format!(
            "local:mailbox-test-{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
        .parse()
        .unwrap();
        Proc::serve_with_config("mb", addr, ProcConfig::default())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_port_takes_many_messages_in_order() {
        let proc = proc().await;
        let (client, _) = proc.attach("client").unwrap();
        let mut port = client.open_port::<u64>();
        let port_ref = port.bind();
        for i in 0..100 {
            port_ref.send(&client, i);
        }
        for i in 0..100 {
            assert_eq!(port.recv().await, Some(i));
        }
    }

    #[tokio::test]
    async fn mb1_a_once_port_takes_one_message_then_closes() {
        let proc = proc().await;
        let (client, mut returned) = proc.attach("client").unwrap();
        let port = client.open_once_port::<u64>();
        let id = port.id().clone();
        client.post(&id, 1u64);
        client.post(&id, 2u64);
        assert_eq!(port.recv().await.unwrap(), 1);
        let second = returned.recv().await.unwrap();
        assert!(
            matches!(second.reason, DeliveryFailure::UnknownPort { .. }),
            "{second}"
        );
    }

    #[tokio::test]
    async fn mb3_a_dropped_port_is_closed() {
        let proc = proc().await;
        let (client, mut returned) = proc.attach("client").unwrap();
        let port = client.open_port::<String>();
        let port_ref = port.bind();
        drop(port);
        port_ref.send(&client, "late".to_string());
        let undeliverable = returned.recv().await.unwrap();
        assert_eq!(undeliverable.dest, *port_ref.id());
        assert!(matches!(
            undeliverable.reason,
            DeliveryFailure::UnknownPort { .. }
        ));
    }

    /// A call of `start_call_then` whose function sends what it gets.
    fn call_then(
        client: &Mailbox,
        dest: &PortId,
        n: u64,
    ) -> (
        PendingCall<u64>,
        mpsc::UnboundedReceiver<Result<u64, CallError>>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let call = client.start_call_then(
            dest,
            |reply| (n, reply),
            move |result| {
                let _ = tx.send(result);
            },
        );
        (call, rx)
    }

    #[tokio::test]
    async fn mb4_a_call_hands_its_reply_to_its_function_once() {
        let proc = proc().await;
        let (server, _) = proc.attach("server").unwrap();
        let (client, _) = proc.attach("client").unwrap();
        let mut requests = server.open_port::<(u64, OncePortRef<u64>)>();
        let (call, mut got) = call_then(&client, requests.id(), 7);
        assert!(call.waiting());
        let (n, reply) = requests.recv().await.unwrap();
        reply.send(&server, n * 6);
        assert_eq!(got.recv().await.unwrap().unwrap(), 42);
        assert!(!call.waiting());
        // Too late: the function ran, and runs no more.
        call.expire(CallError::Timeout(Duration::from_secs(1)));
        assert!(got.recv().await.is_none(), "the function ran twice");
    }

    #[tokio::test]
    async fn mb4_an_expired_call_ends_with_its_error_and_its_port_closes() {
        let proc = proc().await;
        let (server, mut returned) = proc.attach("server").unwrap();
        let (client, _) = proc.attach("client").unwrap();
        let mut requests = server.open_port::<(u64, OncePortRef<u64>)>();
        let (call, mut got) = call_then(&client, requests.id(), 1);
        let (_, reply) = requests.recv().await.unwrap();
        call.expire(CallError::Timeout(Duration::from_millis(5)));
        assert!(matches!(
            got.recv().await.unwrap(),
            Err(CallError::Timeout(t)) if t == Duration::from_millis(5)
        ));
        assert!(!call.waiting());
        // The late reply finds no port, and the function does not run again.
        reply.send(&server, 2);
        let late = returned.recv().await.unwrap();
        assert!(
            matches!(late.reason, DeliveryFailure::UnknownPort { .. }),
            "{late}"
        );
        assert!(got.recv().await.is_none(), "the function ran twice");
    }

    #[tokio::test]
    async fn mb4_an_undeliverable_call_ends_with_the_failure() {
        let proc = proc().await;
        let (server, _) = proc.attach("server").unwrap();
        let (client, _) = proc.attach("client").unwrap();
        let requests = server.open_port::<(u64, OncePortRef<u64>)>();
        let dest = requests.id().clone();
        drop(requests);
        let (call, mut got) = call_then(&client, &dest, 1);
        assert!(matches!(
            got.recv().await.unwrap(),
            Err(CallError::Undeliverable(
                DeliveryFailure::UnknownPort { .. }
            ))
        ));
        assert!(!call.waiting());
    }

    #[tokio::test]
    async fn a_message_of_the_wrong_type_is_refused() {
        let proc = proc().await;
        let (client, mut returned) = proc.attach("client").unwrap();
        let port = client.open_port::<String>();
        client.post(port.id(), 5u32);
        let undeliverable = returned.recv().await.unwrap();
        assert!(
            matches!(undeliverable.reason, DeliveryFailure::Malformed { .. }),
            "{undeliverable}"
        );
    }

    #[tokio::test]
    async fn a_dropped_client_leaves_the_proc() {
        let proc = proc().await;
        let (client, _) = proc.attach("client").unwrap();
        assert!(matches!(
            proc.attach("client"),
            Err(crate::ProcError::Duplicate(_))
        ));
        drop(client);
        proc.attach("client").unwrap();
    }
}
