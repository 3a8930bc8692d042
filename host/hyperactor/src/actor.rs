//! Actors: private state plus handlers, one message at a time.
//!
//! An actor is a Rust value that implements [`Actor`] and one [`Handler<M>`]
//! per message type it takes. A proc runs each actor as its own tokio task,
//! so actors of one proc run concurrently while each handles its messages one
//! at a time, in the order they arrived.
//!
//! Lifecycle, as [`ActorStatus`]:
//!
//! ```text
//! Created --init ok--> Running --stop()--> Stopping --queue drained--> Stopped
//!    |                    |
//!    +--init fails--------+--handler panics or returns Err--> Failed
//! ```
//!
//! Invariants:
//! - AC-1: an actor handles one message at a time, in arrival order.
//! - AC-2: stop is graceful: messages queued before `stop` are handled;
//!   messages that arrive after it are undeliverable (`StoppedReceiver`).
//! - AC-3: a handler that panics or returns `Err` fails only its actor: the
//!   proc and the other actors go on. The actor's owner receives an
//!   [`ActorSupervisionEvent`]; the call being handled and every queued call
//!   fail with that event, and so do calls that arrive later.
//! - AC-4: an owner that does not handle a child's supervision event fails
//!   with it, so failures climb until someone handles them; the proc's
//!   supervision stream receives what root actors do not handle.
//! - AC-5: a handler an actor registers to run at delivery
//!   ([`Exports::handle_inline`]) takes a message from another proc in the
//!   task that read it, and only while the actor is running, idle (no
//!   handler running or suspended) and has nothing queued; otherwise, or
//!   when it declines, the message queues for [`Handler::handle`] as
//!   usual. So it never overtakes a message that came before it (AC-1),
//!   and a panic in it fails the actor as a handler's would (AC-3).

use std::any::type_name;
use std::future::Future;
use std::marker::PhantomData;
use std::ops::Deref;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{OnceLock, Weak};
use std::time::Duration;

use futures::FutureExt;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use crate::failure::{ActorSupervisionEvent, CallError, DeliveryFailure, Undeliverable};
use crate::id::ActorId;
use crate::mailbox::{
    Backlog, Mailbox, MailboxEntry, Meta, OncePortRef, Payload, PortRef, PortSink, TypeName,
    UNDELIVERABLE_PORT,
};
use crate::message::{RemoteMessage, handler_port};
use crate::proc::{Proc, ProcError, ProcInner};

/// An actor: state that handles messages one at a time.
///
/// Implement [`Handler<M>`] for each message type, and list in
/// [`Actor::exports`] the ones that others may send through an
/// [`ActorRef`].
pub trait Actor: Send + Sized + 'static {
    /// Registers the message types this actor takes from refs, in this proc
    /// or another: `exports.handle::<M>()` for each `M` it handles.
    fn exports(exports: &mut Exports<Self>) {
        let _ = exports;
    }

    /// Registers handlers that run at delivery, in the task that read the
    /// message ([`Exports::handle_inline`]; AC-5). Called once, with the
    /// actor, before it starts; the default registers none.
    fn inline_exports(&self, exports: &mut Exports<Self>) {
        let _ = exports;
    }

    /// Runs once, before the first message. An error fails the actor.
    fn init(&mut self, cx: &Context<Self>) -> impl Future<Output = anyhow::Result<()>> + Send {
        let _ = cx;
        async { Ok(()) }
    }

    /// A child actor failed. `Ok(true)` means handled: carry on. `Ok(false)`
    /// (the default) or `Err` fails this actor too, which passes the failure
    /// to its own owner (AC-4).
    fn handle_supervision_event(
        &mut self,
        cx: &Context<Self>,
        event: &ActorSupervisionEvent,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send {
        let _ = (cx, event);
        async { Ok(false) }
    }

    /// A message this actor sent came back. The default logs it; calls waiting
    /// on a reply fail on their own, so nothing else is needed for them.
    fn handle_undeliverable(
        &mut self,
        cx: &Context<Self>,
        undeliverable: Undeliverable,
    ) -> impl Future<Output = anyhow::Result<()>> + Send {
        tracing::warn!(actor = %cx.actor_id(), %undeliverable, "message returned");
        async { Ok(()) }
    }
}

/// Handles messages of type `M`.
pub trait Handler<M: RemoteMessage>: Actor {
    /// Handles one message. `Err` is fatal: the actor fails (AC-3). Errors a
    /// caller should see while the actor lives on go in the reply instead.
    fn handle(
        &mut self,
        cx: &Context<Self>,
        message: M,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// The state of an actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActorStatus {
    /// Spawned; `init` has not finished. Messages queue.
    Created,
    /// Handling messages.
    Running,
    /// Asked to stop: handling what was queued, refusing new messages.
    Stopping,
    /// Stopped after draining its queue.
    Stopped,
    /// Failed; the event says why.
    Failed(ActorSupervisionEvent),
}

impl ActorStatus {
    /// Whether the actor has ended, stopped or failed.
    pub fn is_terminal(&self) -> bool {
        matches!(self, ActorStatus::Stopped | ActorStatus::Failed(_))
    }
}

const CREATED: u8 = 0;
const RUNNING: u8 = 1;
const STOPPING: u8 = 2;
const STOPPED: u8 = 3;
const FAILED: u8 = 4;

/// What the router and the handles share about an actor.
pub(crate) struct ActorCell {
    id: ActorId,
    state: AtomicU8,
    failure: OnceLock<ActorSupervisionEvent>,
    status: watch::Sender<ActorStatus>,
    /// Messages queued and not yet handled (PR-9).
    backlog: Arc<Backlog>,
    /// Held while the actor works on an item of its queue, or while a
    /// handler runs at delivery (AC-5).
    busy: AtomicBool,
}

/// The hold on an actor's [`ActorCell::busy`]; dropping it lets go.
struct Claim<'a>(&'a AtomicBool);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl ActorCell {
    fn new(id: ActorId) -> Self {
        ActorCell {
            backlog: Arc::default(),
            busy: AtomicBool::new(false),
            id,
            state: AtomicU8::new(CREATED),
            failure: OnceLock::new(),
            status: watch::Sender::new(ActorStatus::Created),
        }
    }

    /// Why a new message is refused, if it is.
    fn refusal(&self) -> Option<DeliveryFailure> {
        match self.state.load(Ordering::Acquire) {
            CREATED | RUNNING => None,
            FAILED => Some(self.failed_reason()),
            _ => Some(DeliveryFailure::StoppedReceiver {
                actor: self.id.clone(),
            }),
        }
    }

    fn failed_reason(&self) -> DeliveryFailure {
        match self.failure.get() {
            Some(event) => DeliveryFailure::ActorFailed(event.clone()),
            None => DeliveryFailure::StoppedReceiver {
                actor: self.id.clone(),
            },
        }
    }

    fn is_terminal(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), STOPPED | FAILED)
    }

    /// Holds the actor for one item of its queue. A handler at delivery
    /// holds it only for a moment (it never waits), so on a runtime with
    /// several threads the actor's task yields until it is done; on one
    /// thread it is never held here.
    fn claim(&self) -> Claim<'_> {
        while self.busy.swap(true, Ordering::Acquire) {
            std::thread::yield_now();
        }
        Claim(&self.busy)
    }

    /// Holds the actor for a handler at delivery (AC-5): only while it
    /// runs, is idle and has nothing queued.
    fn try_claim_idle(&self) -> Option<Claim<'_>> {
        if self.state.load(Ordering::Acquire) != RUNNING || self.busy.swap(true, Ordering::Acquire)
        {
            return None;
        }
        let claim = Claim(&self.busy);
        (self.backlog.queued() == 0).then_some(claim)
    }

    fn set_status(&self, state: u8, status: ActorStatus) {
        self.state.store(state, Ordering::Release);
        self.status.send_replace(status);
    }

    /// Moves to `Stopping` unless already past `Running`; true if it did.
    fn begin_stop(&self) -> bool {
        let moved = [CREATED, RUNNING].into_iter().any(|from| {
            self.state
                .compare_exchange(from, STOPPING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        if moved {
            self.status.send_replace(ActorStatus::Stopping);
        }
        moved
    }
}

/// One queued item of an actor.
pub(crate) enum Work<A: Actor> {
    Message {
        handler: Box<dyn HandleOnce<A>>,
        meta: Meta,
    },
    Supervision(ActorSupervisionEvent),
    Undeliverable(Undeliverable),
    /// A handler at delivery panicked on this message (AC-5).
    Failed {
        reason: String,
        meta: Meta,
    },
    Stop,
}

type HandleFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'a>>;

/// A message bound to the handler of its type.
pub(crate) trait HandleOnce<A: Actor>: Send {
    fn handle<'a>(self: Box<Self>, actor: &'a mut A, cx: &'a Context<A>) -> HandleFuture<'a>;
}

struct Typed<M>(M);

impl<A: Handler<M>, M: RemoteMessage> HandleOnce<A> for Typed<M> {
    fn handle<'a>(self: Box<Self>, actor: &'a mut A, cx: &'a Context<A>) -> HandleFuture<'a> {
        Box::pin(actor.handle(cx, self.0))
    }
}

/// The handler port of `A` for messages of type `M`.
struct HandlerSink<A: Actor, M> {
    cell: Arc<ActorCell>,
    queue: mpsc::UnboundedSender<Work<A>>,
    _message: PhantomData<fn(M)>,
}

impl<A: Handler<M>, M: RemoteMessage> PortSink for HandlerSink<A, M> {
    fn backlog(&self) -> Option<&Arc<Backlog>> {
        Some(&self.cell.backlog)
    }

    fn deliver(&self, payload: Payload<'_>, meta: Meta) -> Result<(), DeliveryFailure> {
        if let Some(refusal) = self.cell.refusal() {
            return Err(refusal);
        }
        let message = payload.into_message::<M>(&meta.dest)?;
        self.enqueue(message, meta)
    }
}

impl<A: Handler<M>, M: RemoteMessage> HandlerSink<A, M> {
    /// Queues a decoded message for the actor's task.
    fn enqueue(&self, message: M, meta: Meta) -> Result<(), DeliveryFailure> {
        let _span =
            tracing::trace_span!("deliver", actor = %self.cell.id, message = %meta.message_type)
                .entered();
        self.cell.backlog.added();
        self.queue
            .send(Work::Message {
                handler: Box::new(Typed(message)),
                meta,
            })
            .map_err(|_| {
                self.cell.backlog.taken();
                self.cell
                    .refusal()
                    .unwrap_or_else(|| self.cell.failed_reason())
            })
    }
}

/// What a handler at delivery runs: it takes the message, or hands it back
/// to be queued for [`Handler::handle`].
type InlineFn<M> = dyn Fn(&Mailbox, M) -> Option<M> + Send + Sync;

/// Where an actor's handlers at delivery find its mailbox: set when the
/// mailbox is made, held weakly (the mailbox holds the handlers).
type Home = OnceLock<(Weak<ProcInner>, Weak<MailboxEntry>)>;

/// The handler port of `A` for `M` with a handler at delivery (AC-5).
struct InlineSink<A: Actor, M> {
    queued: HandlerSink<A, M>,
    home: Arc<Home>,
    inline: Box<InlineFn<M>>,
}

impl<A: Handler<M>, M: RemoteMessage> InlineSink<A, M> {
    fn mailbox(&self) -> Option<Mailbox> {
        let (proc, entry) = self.home.get()?;
        Some(Mailbox::for_actor(Proc::upgrade(proc)?, entry.upgrade()?))
    }
}

impl<A: Handler<M>, M: RemoteMessage> PortSink for InlineSink<A, M> {
    fn backlog(&self) -> Option<&Arc<Backlog>> {
        Some(&self.queued.cell.backlog)
    }

    fn deliver(&self, payload: Payload<'_>, meta: Meta) -> Result<(), DeliveryFailure> {
        // Messages from this proc keep to the queue: their sender may
        // hold locks that the handler would take.
        if !matches!(payload, Payload::Remote(_)) {
            return self.queued.deliver(payload, meta);
        }
        let cell = &self.queued.cell;
        if let Some(refusal) = cell.refusal() {
            return Err(refusal);
        }
        let mut message = payload.into_message::<M>(&meta.dest)?;
        if let Some(claim) = cell.try_claim_idle()
            && let Some(mailbox) = self.mailbox()
        {
            let _span =
                tracing::trace_span!("handle inline", actor = %cell.id, message = %meta.message_type)
                    .entered();
            let inline = &self.inline;
            match std::panic::catch_unwind(AssertUnwindSafe(move || inline(&mailbox, message))) {
                Ok(None) => return Ok(()),
                Ok(Some(declined)) => message = declined,
                Err(panic) => {
                    drop(claim);
                    let reason = panic_text(panic.as_ref());
                    cell.backlog.added();
                    return self
                        .queued
                        .queue
                        .send(Work::Failed { reason, meta })
                        .map_err(|_| cell.refusal().unwrap_or_else(|| cell.failed_reason()));
                }
            }
        }
        self.queued.enqueue(message, meta)
    }
}

/// The undeliverable port of an actor: returned messages go to its queue.
struct UndeliverableSink<A: Actor> {
    queue: mpsc::UnboundedSender<Work<A>>,
}

impl<A: Actor> PortSink for UndeliverableSink<A> {
    fn deliver(&self, _: Payload<'_>, meta: Meta) -> Result<(), DeliveryFailure> {
        Err(DeliveryFailure::UnknownPort {
            port: meta.dest,
            message_type: meta.message_type.to_string(),
        })
    }

    fn undeliverable(&self, undeliverable: Undeliverable) {
        if let Err(mpsc::error::SendError(Work::Undeliverable(u))) =
            self.queue.send(Work::Undeliverable(undeliverable))
        {
            tracing::debug!(undeliverable = %u, "returned to an actor that has ended");
        }
    }
}

/// The message types an actor takes from refs; see [`Actor::exports`].
pub struct Exports<A: Actor> {
    cell: Arc<ActorCell>,
    queue: mpsc::UnboundedSender<Work<A>>,
    home: Arc<Home>,
    pub(crate) ports: Vec<(u64, Arc<dyn PortSink>)>,
}

impl<A: Actor> Exports<A> {
    /// Exports the handler for `M`.
    pub fn handle<M: RemoteMessage>(&mut self) -> &mut Self
    where
        A: Handler<M>,
    {
        let sink = self.handler_sink::<M>();
        self.ports.push((handler_port::<M>(), Arc::new(sink)));
        self
    }

    fn handler_sink<M: RemoteMessage>(&self) -> HandlerSink<A, M> {
        HandlerSink {
            cell: self.cell.clone(),
            queue: self.queue.clone(),
            _message: PhantomData,
        }
    }

    /// Exports the handler for `M` with `inline` in front of it: a message
    /// from another proc that finds the actor idle runs `inline` in the
    /// task that read it, with the actor's mailbox, instead of waking the
    /// actor (AC-5). `inline` returns `None` when it took the message, or
    /// hands it back to be queued for [`Handler::handle`]. It must not
    /// wait, and it sees only what it captured, not the actor itself.
    pub fn handle_inline<M: RemoteMessage>(
        &mut self,
        inline: impl Fn(&Mailbox, M) -> Option<M> + Send + Sync + 'static,
    ) -> &mut Self
    where
        A: Handler<M>,
    {
        let port = handler_port::<M>();
        self.ports.retain(|(p, _)| *p != port);
        let sink = InlineSink::<A, M> {
            queued: self.handler_sink(),
            home: self.home.clone(),
            inline: Box::new(inline),
        };
        self.ports.push((port, Arc::new(sink)));
        self
    }
}

/// Where an actor's supervision events go.
pub(crate) trait Owner: Send + Sync {
    fn supervise(&self, event: ActorSupervisionEvent);
}

impl<A: Actor> Owner for ActorHandle<A> {
    fn supervise(&self, event: ActorSupervisionEvent) {
        if let Err(mpsc::error::SendError(Work::Supervision(event))) =
            self.queue.send(Work::Supervision(event))
        {
            // The owner has ended; its own owner hears of it through the proc.
            tracing::error!(%event, "supervision event for an owner that has ended");
        }
    }
}

/// What an actor's handlers see: its mailbox, identity and children.
///
/// Dereferences to the actor's [`Mailbox`], so `cx` sends and calls.
pub struct Context<A: Actor> {
    mailbox: Mailbox,
    handle: ActorHandle<A>,
    children: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl<A: Actor> Context<A> {
    /// A reference to this actor.
    pub fn bind(&self) -> ActorRef<A> {
        self.handle.bind()
    }

    /// Spawns a child actor in this proc, owned by this actor: its
    /// supervision events come here, and it stops when this actor ends.
    pub fn spawn<C: Actor>(
        &self,
        name: &str,
        rank: u32,
        actor: C,
    ) -> Result<ActorHandle<C>, ProcError> {
        let owner: Arc<dyn Owner> = Arc::new(self.handle.clone());
        let child = self.mailbox.proc.spawn_owned(name, rank, actor, owner)?;
        let stopper = child.clone();
        self.children.lock().push(Box::new(move || stopper.stop()));
        Ok(child)
    }

    /// Asks this actor to stop after the messages already queued (AC-2).
    pub fn stop(&self) {
        self.handle.stop();
    }
}

impl<A: Actor> Deref for Context<A> {
    type Target = Mailbox;

    fn deref(&self) -> &Mailbox {
        &self.mailbox
    }
}

/// A local handle to a spawned actor: its status, stop and join.
pub struct ActorHandle<A: Actor> {
    cell: Arc<ActorCell>,
    queue: mpsc::UnboundedSender<Work<A>>,
}

impl<A: Actor> Clone for ActorHandle<A> {
    fn clone(&self) -> Self {
        ActorHandle {
            cell: self.cell.clone(),
            queue: self.queue.clone(),
        }
    }
}

impl<A: Actor> ActorHandle<A> {
    /// The actor's id.
    pub fn actor_id(&self) -> &ActorId {
        &self.cell.id
    }

    /// A reference to the actor that can be sent anywhere.
    pub fn bind(&self) -> ActorRef<A> {
        ActorRef::attest(self.cell.id.clone())
    }

    /// The actor's current status.
    pub fn status(&self) -> ActorStatus {
        self.cell.status.borrow().clone()
    }

    /// Asks the actor to stop after the messages already queued (AC-2).
    pub fn stop(&self) {
        if self.cell.begin_stop() {
            let _ = self.queue.send(Work::Stop);
        }
    }

    /// Waits until the actor has finished `init` (or ended without it), and
    /// returns its status then.
    pub async fn started(&self) -> ActorStatus {
        let mut status = self.cell.status.subscribe();
        match status
            .wait_for(|status| !matches!(status, ActorStatus::Created))
            .await
        {
            Ok(status) => status.clone(),
            Err(_) => self.status(),
        }
    }

    /// Waits until the actor has stopped or failed, and says which.
    pub async fn join(&self) -> ActorStatus {
        let mut status = self.cell.status.subscribe();
        match status.wait_for(ActorStatus::is_terminal).await {
            Ok(status) => status.clone(),
            Err(_) => self.status(),
        }
    }
}

/// A reference to an actor of type `A` that can travel inside messages.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ActorRef<A> {
    id: ActorId,
    #[rkyv(with = rkyv::with::Skip)]
    _actor: PhantomData<fn() -> A>,
}

impl<A> Clone for ActorRef<A> {
    fn clone(&self) -> Self {
        ActorRef {
            id: self.id.clone(),
            _actor: PhantomData,
        }
    }
}

impl<A> std::fmt::Debug for ActorRef<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ActorRef<{}>({})", type_name::<A>(), self.id)
    }
}

impl<A: Actor> ActorRef<A> {
    /// A reference to the actor `id`, trusted to be an `A`.
    pub fn attest(id: ActorId) -> Self {
        ActorRef {
            id,
            _actor: PhantomData,
        }
    }

    /// The actor's id.
    pub fn actor_id(&self) -> &ActorId {
        &self.id
    }

    /// The actor's handler port for `M`.
    pub fn port<M: RemoteMessage>(&self) -> PortRef<M>
    where
        A: Handler<M>,
    {
        PortRef::attest(self.id.port_id(handler_port::<M>()))
    }

    /// Sends `message` from `sender`; failure comes back as an [`Undeliverable`].
    pub fn send<M: RemoteMessage>(&self, sender: &Mailbox, message: M)
    where
        A: Handler<M>,
    {
        sender.post(&self.id.port_id(handler_port::<M>()), message);
    }

    /// Sends the message `make` builds around a reply port and waits for the
    /// reply, within the proc's call timeout. See [`Mailbox::call_port`].
    pub async fn call<M, R>(
        &self,
        sender: &Mailbox,
        make: impl FnOnce(OncePortRef<R>) -> M,
    ) -> Result<R, CallError>
    where
        A: Handler<M>,
        M: RemoteMessage,
        R: RemoteMessage,
    {
        let timeout = sender.proc().config().call_timeout;
        self.call_timeout(sender, make, timeout).await
    }

    /// Sends the message `make` builds around a reply port now, and returns
    /// that port; see [`Mailbox::start_call`].
    pub fn start_call<M, R>(
        &self,
        sender: &Mailbox,
        make: impl FnOnce(OncePortRef<R>) -> M,
    ) -> crate::OncePort<R>
    where
        A: Handler<M>,
        M: RemoteMessage,
        R: RemoteMessage,
    {
        sender.start_call(&self.id.port_id(handler_port::<M>()), make)
    }

    /// [`ActorRef::call`] with its own timeout.
    pub async fn call_timeout<M, R>(
        &self,
        sender: &Mailbox,
        make: impl FnOnce(OncePortRef<R>) -> M,
        timeout: Duration,
    ) -> Result<R, CallError>
    where
        A: Handler<M>,
        M: RemoteMessage,
        R: RemoteMessage,
    {
        let dest = self.id.port_id(handler_port::<M>());
        sender.call_port(&dest, make, timeout).await
    }
}

/// Builds an actor's mailbox and ports and starts its task.
pub(crate) fn start<A: Actor>(
    proc: &Proc,
    id: ActorId,
    actor: A,
    owner: Arc<dyn Owner>,
) -> Result<ActorHandle<A>, ProcError> {
    let (queue, rx) = mpsc::unbounded_channel();
    let cell = Arc::new(ActorCell::new(id.clone()));
    let home = Arc::new(Home::new());
    let mut exports = Exports {
        cell: cell.clone(),
        queue: queue.clone(),
        home: home.clone(),
        ports: Vec::new(),
    };
    A::exports(&mut exports);
    actor.inline_exports(&mut exports);
    let terminated = {
        let cell = cell.clone();
        Box::new(move || cell.is_terminal())
    };
    let entry = Arc::new(crate::mailbox::MailboxEntry::new(id, terminated));
    let _ = home.set((proc.downgrade(), Arc::downgrade(&entry)));
    for (port, sink) in exports.ports {
        entry.bind(port, sink);
    }
    entry.bind(
        UNDELIVERABLE_PORT,
        Arc::new(UndeliverableSink::<A> {
            queue: queue.clone(),
        }),
    );
    proc.register(entry.clone())?;
    let handle = ActorHandle { cell, queue };
    let cx = Context {
        mailbox: Mailbox::for_actor(proc.clone(), entry),
        handle: handle.clone(),
        children: Mutex::new(Vec::new()),
    };
    proc.runtime().spawn(run(actor, cx, rx, owner));
    Ok(handle)
}

/// Why the run loop ended.
enum Exit {
    Stopped,
    Failed {
        reason: String,
        current: Option<Meta>,
    },
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

/// Runs a future that may panic; a panic becomes an error text.
async fn guarded<T>(fut: impl Future<Output = anyhow::Result<T>>) -> Result<T, String> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(format!("{err:#}")),
        Err(panic) => Err(panic_text(panic.as_ref())),
    }
}

async fn run<A: Actor>(
    mut actor: A,
    cx: Context<A>,
    mut rx: mpsc::UnboundedReceiver<Work<A>>,
    owner: Arc<dyn Owner>,
) {
    let cell = cx.handle.cell.clone();
    let exit = match guarded(actor.init(&cx)).await {
        Err(reason) => Exit::Failed {
            reason: format!("init failed: {reason}"),
            current: None,
        },
        Ok(()) => {
            let _ = cell
                .state
                .compare_exchange(CREATED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                .map(|_| cell.status.send_replace(ActorStatus::Running));
            handle_messages(&mut actor, &cx, &mut rx).await
        }
    };
    rx.close();
    let proc = cx.mailbox.proc.clone();
    match exit {
        Exit::Stopped => {
            let refusal = DeliveryFailure::StoppedReceiver {
                actor: cell.id.clone(),
            };
            fail_queue(&proc, &mut rx, &refusal);
            cell.set_status(STOPPED, ActorStatus::Stopped);
            tracing::debug!(actor = %cell.id, "stopped");
        }
        Exit::Failed { reason, current } => {
            let event = ActorSupervisionEvent {
                actor_id: cell.id.clone(),
                reason,
                message: current.as_ref().map(|meta| meta.message_type.to_string()),
            };
            let _ = cell.failure.set(event.clone());
            cell.state.store(FAILED, Ordering::Release);
            tracing::error!(%event, "actor failed");
            let failure = DeliveryFailure::ActorFailed(event.clone());
            if let Some(meta) = current {
                proc.fail_delivery(&meta, failure.clone());
            }
            fail_queue(&proc, &mut rx, &failure);
            cell.status.send_replace(ActorStatus::Failed(event.clone()));
            owner.supervise(event);
        }
    }
    for stop_child in cx.children.lock().drain(..) {
        stop_child();
    }
}

async fn handle_messages<A: Actor>(
    actor: &mut A,
    cx: &Context<A>,
    rx: &mut mpsc::UnboundedReceiver<Work<A>>,
) -> Exit {
    while let Some(work) = rx.recv().await {
        // Taken before the backlog falls, so that a handler at delivery
        // does not run ahead of this item (AC-5).
        let _claim = cx.handle.cell.claim();
        match work {
            Work::Failed { reason, meta } => {
                cx.handle.cell.backlog.taken();
                return Exit::Failed {
                    reason,
                    current: Some(meta),
                };
            }
            Work::Message { handler, meta } => {
                cx.handle.cell.backlog.taken();
                let span = tracing::debug_span!("handle", actor = %cx.actor_id(), message = %meta.message_type);
                let outcome = guarded(handler.handle(actor, cx)).instrument(span).await;
                if let Err(reason) = outcome {
                    return Exit::Failed {
                        reason,
                        current: Some(meta),
                    };
                }
            }
            Work::Supervision(event) => match guarded(actor.handle_supervision_event(cx, &event))
                .await
            {
                Ok(true) => tracing::info!(actor = %cx.actor_id(), %event, "child failure handled"),
                Ok(false) => {
                    return Exit::Failed {
                        reason: format!("unhandled failure of child: {event}"),
                        current: None,
                    };
                }
                Err(reason) => {
                    return Exit::Failed {
                        reason: format!("supervision handler failed: {reason}"),
                        current: None,
                    };
                }
            },
            Work::Undeliverable(undeliverable) => {
                if let Err(reason) = guarded(actor.handle_undeliverable(cx, undeliverable)).await {
                    return Exit::Failed {
                        reason: format!("undeliverable handler failed: {reason}"),
                        current: None,
                    };
                }
            }
            Work::Stop => return Exit::Stopped,
        }
    }
    Exit::Stopped
}

/// Fails everything still queued after the actor ended (AC-2, AC-3).
fn fail_queue<A: Actor>(
    proc: &Proc,
    rx: &mut mpsc::UnboundedReceiver<Work<A>>,
    failure: &DeliveryFailure,
) {
    while let Ok(work) = rx.try_recv() {
        match work {
            Work::Message { meta, .. } | Work::Failed { meta, .. } => {
                proc.fail_delivery(&meta, failure.clone())
            }
            Work::Supervision(event) => {
                tracing::error!(%event, "supervision event for an actor that has ended")
            }
            Work::Undeliverable(_) | Work::Stop => {}
        }
    }
}

pub(crate) fn meta_for<M: 'static>(
    sender: &ActorId,
    dest: &crate::id::PortId,
    return_port: Option<crate::id::PortId>,
) -> Meta {
    Meta {
        sender: sender.clone(),
        dest: dest.clone(),
        return_port,
        message_type: TypeName::Static(type_name::<M>()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::testing::{Echo, EchoActor, Panic};
    use crate::{ChannelAddr, ProcConfig};

    async fn proc(name: &str) -> Proc {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let addr: ChannelAddr = format!(
            "local:actor-test-{name}-{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
        .parse()
        .unwrap();
        Proc::serve_with_config(name, addr, ProcConfig::default())
            .await
            .unwrap()
    }

    /// Spawns a child on init and reports its failures on a port.
    struct Parent {
        handled: bool,
        child: Option<ActorRef<EchoActor>>,
        events: Option<PortRef<String>>,
    }

    #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct GetChild {
        reply: OncePortRef<ActorRef<EchoActor>>,
        events: PortRef<String>,
    }

    impl Actor for Parent {
        fn exports(exports: &mut Exports<Self>) {
            exports.handle::<GetChild>();
        }

        async fn init(&mut self, cx: &Context<Self>) -> anyhow::Result<()> {
            self.child = Some(cx.spawn("child", 0, EchoActor::default())?.bind());
            Ok(())
        }

        async fn handle_supervision_event(
            &mut self,
            cx: &Context<Self>,
            event: &ActorSupervisionEvent,
        ) -> anyhow::Result<bool> {
            if let Some(events) = &self.events {
                events.send(cx, event.reason.clone());
            }
            Ok(self.handled)
        }
    }

    impl Handler<GetChild> for Parent {
        async fn handle(&mut self, cx: &Context<Self>, message: GetChild) -> anyhow::Result<()> {
            self.events = Some(message.events);
            let child = self
                .child
                .clone()
                .ok_or_else(|| anyhow::anyhow!("no child"))?;
            message.reply.send(cx, child);
            Ok(())
        }
    }

    async fn parent_with_child(
        handled: bool,
    ) -> (
        Proc,
        ActorHandle<Parent>,
        ActorRef<EchoActor>,
        Mailbox,
        crate::Port<String>,
    ) {
        let proc = proc("sup").await;
        let parent = proc
            .spawn(
                "parent",
                0,
                Parent {
                    handled,
                    child: None,
                    events: None,
                },
            )
            .unwrap();
        let (client, _) = proc.attach("client").unwrap();
        let events = client.open_port::<String>();
        let events_ref = events.bind();
        let child = parent
            .bind()
            .call(&client, |reply| GetChild {
                reply,
                events: events_ref,
            })
            .await
            .unwrap();
        (proc, parent, child, client, events)
    }

    #[tokio::test]
    async fn lifecycle_moves_through_running_to_stopped() {
        let proc = proc("life").await;
        let actor = proc.spawn("echo", 0, EchoActor::default()).unwrap();
        let (client, _) = proc.attach("client").unwrap();
        actor
            .bind()
            .call(&client, |reply| Echo {
                payload: vec![],
                reply,
            })
            .await
            .unwrap();
        assert_eq!(actor.status(), ActorStatus::Running);
        actor.stop();
        assert!(matches!(
            actor.status(),
            ActorStatus::Stopping | ActorStatus::Stopped
        ));
        assert_eq!(actor.join().await, ActorStatus::Stopped);
    }

    #[tokio::test]
    async fn failing_init_fails_the_actor() {
        struct Broken;
        impl Actor for Broken {
            async fn init(&mut self, _cx: &Context<Self>) -> anyhow::Result<()> {
                anyhow::bail!("no config")
            }
        }
        let proc = proc("init").await;
        let mut events = proc.supervision_events().unwrap();
        let actor = proc.spawn("broken", 0, Broken).unwrap();
        let ActorStatus::Failed(event) = actor.join().await else {
            panic!("expected failure")
        };
        assert!(event.reason.contains("init failed: no config"), "{event}");
        assert_eq!(events.recv().await.unwrap(), event);
    }

    #[tokio::test]
    async fn ac4_a_handled_child_failure_keeps_the_parent_running() {
        let (_proc, parent, child, client, mut events) = parent_with_child(true).await;
        let err = child
            .call(&client, |reply| Panic {
                text: "child died".into(),
                reply,
            })
            .await
            .unwrap_err();
        assert!(matches!(err, CallError::Supervision(_)));
        let reason = events.recv().await.unwrap();
        assert!(reason.contains("child died"), "{reason}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(parent.status(), ActorStatus::Running);
    }

    #[tokio::test]
    async fn ac4_an_unhandled_child_failure_climbs_to_the_proc() {
        let (proc, parent, child, client, _events) = parent_with_child(false).await;
        let mut root_events = proc.supervision_events().unwrap();
        let _ = child
            .call(&client, |reply| Panic {
                text: "child died".into(),
                reply,
            })
            .await;
        let ActorStatus::Failed(event) = parent.join().await else {
            panic!("the parent fails with its child")
        };
        assert_eq!(event.actor_id, *parent.actor_id());
        assert!(
            event.reason.contains("unhandled failure of child"),
            "{event}"
        );
        assert!(event.reason.contains("child died"), "{event}");
        assert_eq!(root_events.recv().await.unwrap(), event);
    }

    #[tokio::test]
    async fn stopping_a_parent_stops_its_children() {
        let (_proc, parent, child, client, _events) = parent_with_child(true).await;
        parent.stop();
        parent.join().await;
        // The child's stop is requested as the parent ends; give it a moment.
        let mut refused = false;
        for _ in 0..100 {
            let result = child
                .call(&client, |reply| Echo {
                    payload: vec![],
                    reply,
                })
                .await;
            if matches!(
                result,
                Err(CallError::Undeliverable(
                    DeliveryFailure::StoppedReceiver { .. }
                ))
            ) {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(refused, "the child stopped with its parent");
    }

    /// A note to log; the handler at delivery takes those whose text
    /// begins with `inline`, and panics at `panic`.
    #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Note {
        text: String,
        /// How long the queued handler waits before it logs.
        hold_ms: u64,
    }

    /// Logs where each [`Note`] was handled.
    struct Inliner {
        log: Arc<Mutex<Vec<String>>>,
    }

    impl Actor for Inliner {
        fn exports(exports: &mut Exports<Self>) {
            exports.handle::<Note>();
        }

        fn inline_exports(&self, exports: &mut Exports<Self>) {
            let log = self.log.clone();
            exports.handle_inline::<Note>(move |_mailbox, note| {
                assert!(note.text != "panic", "inline handler panicked");
                if !note.text.starts_with("inline") {
                    return Some(note);
                }
                log.lock().push(format!("inline {}", note.text));
                None
            });
        }
    }

    impl Handler<Note> for Inliner {
        async fn handle(&mut self, _cx: &Context<Self>, note: Note) -> anyhow::Result<()> {
            tokio::time::sleep(Duration::from_millis(note.hold_ms)).await;
            self.log.lock().push(format!("queued {}", note.text));
            Ok(())
        }
    }

    /// An [`Inliner`] on a proc of its own and a client on another, joined
    /// by a Unix socket (only messages from another proc run inline).
    async fn inliner(
        test: &str,
    ) -> (
        Proc,
        Proc,
        ActorHandle<Inliner>,
        Mailbox,
        Arc<Mutex<Vec<String>>>,
    ) {
        let addr = |side: &str| -> ChannelAddr {
            format!(
                "unix:{}/ac5-{test}-{side}-{}.sock",
                std::env::temp_dir().display(),
                std::process::id()
            )
            .parse()
            .unwrap()
        };
        let here = Proc::serve_with_config("here", addr("here"), ProcConfig::default())
            .await
            .unwrap();
        let there = Proc::serve_with_config("there", addr("there"), ProcConfig::default())
            .await
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let actor = here
            .spawn("inliner", 0, Inliner { log: log.clone() })
            .unwrap();
        assert_eq!(actor.started().await, ActorStatus::Running);
        let (client, _) = there.attach("client").unwrap();
        (here, there, actor, client, log)
    }

    async fn logged(log: &Mutex<Vec<String>>, count: usize) -> Vec<String> {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while log.lock().len() < count && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        log.lock().clone()
    }

    fn note(text: &str, hold_ms: u64) -> Note {
        Note {
            text: text.into(),
            hold_ms,
        }
    }

    #[tokio::test]
    async fn ac5_a_message_to_an_idle_actor_runs_at_delivery_and_a_declined_one_queues() {
        let (_here, _there, actor, client, log) = inliner("idle").await;
        let to = actor.bind();
        to.send(&client, note("inline first", 0));
        assert_eq!(logged(&log, 1).await, ["inline inline first"]);
        to.send(&client, note("declined", 0));
        assert_eq!(logged(&log, 2).await[1], "queued declined");
        to.send(&client, note("inline after", 0));
        assert_eq!(
            logged(&log, 3).await,
            [
                "inline inline first",
                "queued declined",
                "inline inline after"
            ]
        );
    }

    #[tokio::test]
    async fn ac5_a_message_to_a_busy_actor_waits_its_turn() {
        let (_here, _there, actor, client, log) = inliner("busy").await;
        let to = actor.bind();
        // The handler of the first is suspended while the others arrive:
        // they queue behind it in order, none runs ahead at delivery.
        to.send(&client, note("slow", 200));
        to.send(&client, note("inline behind", 0));
        to.send(&client, note("last", 0));
        assert_eq!(
            logged(&log, 3).await,
            ["queued slow", "queued inline behind", "queued last"]
        );
        // Idle again: the next runs at delivery.
        to.send(&client, note("inline idle", 0));
        assert_eq!(logged(&log, 4).await[3], "inline inline idle");
    }

    #[tokio::test]
    async fn ac5_a_panic_at_delivery_fails_the_actor() {
        let (_here, _there, actor, client, _log) = inliner("panic").await;
        actor.bind().send(&client, note("panic", 0));
        let ActorStatus::Failed(event) =
            tokio::time::timeout(Duration::from_secs(10), actor.join())
                .await
                .unwrap()
        else {
            panic!("expected the actor to fail");
        };
        assert!(event.reason.contains("inline handler panicked"), "{event}");
    }
}
