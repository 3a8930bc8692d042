//! Remote hosts: an agent on every machine starts procs for a controller,
//! and the controller's [`RemoteAllocator`] talks to the agents.
//!
//! `monarch-host agent --listen tcp:IP:PORT --token-file F` runs
//! [`serve_agent`]: a proc with a [`HostAgent`] actor. A controller opens a
//! *session* with every agent it was given; each request carries the
//! cluster token, and the agent refuses requests with a wrong one. The
//! agent starts procs as its own child processes (so they die with it),
//! reports their ends to the controller, and stores blobs once per host.
//!
//! - RM-1: an agent refuses to listen on a non-loopback address without a
//!   token, and answers every request with a wrong token with an error.
//! - RM-2: no orphans: an agent stops a session's procs when the session's
//!   controller has not been heard from for the keepalive; a controller
//!   heartbeats every agent well within it.
//! - RM-3: a host whose agent misses heartbeats for the host timeout is
//!   lost: each of its procs is reported stopped, once, with the reason.
//! - RM-4: every proc of a cluster with a token (agents, the procs they
//!   start, the controller's) requires it of the procs that connect to it
//!   (hyperactor's PR-6), so strangers cannot reach any of them.
//! - RM-5: a controller says hello to every agent before anything else;
//!   an agent of another monarch-host version is refused, naming both.
//! - RM-6: each start of an agent has a fresh random incarnation, which
//!   answers every heartbeat. A controller that sees another incarnation,
//!   or an agent that no longer knows its session, at an address it uses
//!   knows the agent restarted: the host is lost at once, and its procs
//!   with it, instead of after the host timeout.
//! - RM-7: an agent told to go (`monarch-host agent` on SIGTERM, e.g. a
//!   Slurm job cancelled or out of time) reports each of its procs stopped
//!   with the reason it was given, before stopping them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor::message::handler_port;
use hyperactor::{
    Actor, ChannelAddr, Context, Exports, Handler, Mailbox, OncePortRef, PortRef, Proc, ProcId,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::agent::{BoxFuture, MeshEvent, Registry};
use crate::alloc::{AllocError, Allocated, Allocator, BootstrapCommand, LocalAllocator};

/// The name of the host agent actor.
pub const HOST_AGENT: &str = "hostagent";

/// Timing of sessions between a controller and its agents.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    /// How often the controller heartbeats each agent.
    pub heartbeat: Duration,
    /// A host whose agent has not answered for this long is lost (RM-3).
    pub host_timeout: Duration,
    /// An agent stops a session's procs after this long without a
    /// heartbeat (RM-2).
    pub keepalive: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            heartbeat: Duration::from_millis(500),
            host_timeout: Duration::from_secs(5),
            keepalive: Duration::from_secs(10),
        }
    }
}

/// Starts procs for a session.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentSpawn {
    /// The cluster token.
    pub token: String,
    /// The controller's session.
    pub session: String,
    /// The procs' names.
    pub names: Vec<String>,
    /// Where the procs' actors report, and where their ends are reported.
    pub events: PortRef<MeshEvent>,
    /// How long the session may go without a heartbeat (ms).
    pub keepalive_ms: u64,
    /// The procs and their pids.
    pub reply: OncePortRef<Result<Vec<(ProcId, u32)>, String>>,
}

/// The first request of a controller (RM-5): checks the token and the
/// version, and learns the agent's incarnation.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentHello {
    /// The cluster token.
    pub token: String,
    /// The controller's monarch-host version.
    pub version: String,
    /// Who the agent is, or why it refuses.
    pub reply: OncePortRef<Result<AgentInfo, String>>,
}

/// What an agent says of itself.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentInfo {
    /// Its monarch-host version.
    pub version: String,
    /// Random, fresh at every start of the agent (RM-6).
    pub incarnation: u64,
    /// The node it runs on.
    pub node: String,
}

/// Keeps a session alive.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentHeartbeat {
    /// The cluster token.
    pub token: String,
    /// The session.
    pub session: String,
    /// The agent's incarnation while it knows the session (RM-6).
    pub reply: OncePortRef<Result<u64, String>>,
}

/// Stores a blob on the agent's host.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentPutBlob {
    /// The cluster token.
    pub token: String,
    /// The sha256 of the bytes.
    pub sha256: String,
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Ok once stored.
    pub reply: OncePortRef<Result<(), String>>,
}

/// Sends a signal to one proc of a session (tests and chaos drills).
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentKill {
    /// The cluster token.
    pub token: String,
    /// The session.
    pub session: String,
    /// The proc.
    pub proc: ProcId,
    /// The signal.
    pub signal: i32,
    /// Ok once sent.
    pub reply: OncePortRef<Result<(), String>>,
}

/// Stops some procs of a session.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentStopProcs {
    /// The cluster token.
    pub token: String,
    /// The session.
    pub session: String,
    /// The procs.
    pub procs: Vec<ProcId>,
}

/// Ends a session and its procs.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentStop {
    /// The cluster token.
    pub token: String,
    /// The session.
    pub session: String,
}

struct Session {
    allocator: Arc<LocalAllocator>,
    last_heard: Instant,
    keepalive: Duration,
}

/// What an agent and its handle share.
struct Shared {
    sessions: Mutex<HashMap<String, Session>>,
    /// Set once the agent is told to go (RM-7): every proc's end is
    /// reported with this reason.
    going: Mutex<Option<String>>,
    /// Since when the agent has had no session.
    idle_since: Mutex<Option<Instant>>,
    info: AgentInfo,
}

impl Shared {
    /// Notes whether any session is left.
    fn note_sessions(&self, sessions: &HashMap<String, Session>) {
        let mut idle = self.idle_since.lock();
        match (sessions.is_empty(), idle.is_some()) {
            (true, false) => *idle = Some(Instant::now()),
            (false, true) => *idle = None,
            _ => {}
        }
    }
}

/// The agent of one host; see the module docs.
pub struct HostAgent {
    token: String,
    command: BootstrapCommand,
    registry: Arc<Registry>,
    ip: IpAddr,
    shared: Arc<Shared>,
}

/// Whether `given` is the agent's token (none: the empty token), in time
/// that does not depend on where they differ.
fn same_token(given: &str, agent: &str) -> bool {
    match hyperactor::ClusterToken::new(agent) {
        Some(token) => token.matches(given.as_bytes()),
        None => given.is_empty(),
    }
}

impl HostAgent {
    fn check(&self, token: &str) -> Result<(), String> {
        if same_token(token, &self.token) {
            Ok(())
        } else {
            Err("unauthorized: the cluster token does not match this agent's".into())
        }
    }
}

impl Actor for HostAgent {
    fn exports(exports: &mut Exports<Self>) {
        exports
            .handle::<AgentHello>()
            .handle::<AgentSpawn>()
            .handle::<AgentHeartbeat>()
            .handle::<AgentPutBlob>()
            .handle::<AgentKill>()
            .handle::<AgentStopProcs>()
            .handle::<AgentStop>();
    }

    async fn handle_undeliverable(
        &mut self,
        cx: &Context<Self>,
        undeliverable: hyperactor::Undeliverable,
    ) -> anyhow::Result<()> {
        // What an agent sends goes to controllers: a report that comes back
        // is one about procs of a run that has ended (its controller went
        // first), which nobody is left to hear.
        tracing::debug!(actor = %cx.actor_id(), %undeliverable, "report to a controller that is gone");
        Ok(())
    }

    async fn init(&mut self, _cx: &Context<Self>) -> anyhow::Result<()> {
        // RM-2: sessions whose controller went quiet end with their procs.
        let shared = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let now = Instant::now();
                let mut sessions = shared.sessions.lock();
                sessions.retain(|id, session| {
                    let alive = now.duration_since(session.last_heard) < session.keepalive;
                    if !alive {
                        tracing::warn!(session = %id, "controller silent past the keepalive; stopping its procs");
                        session.allocator.stop_all();
                    }
                    alive
                });
                shared.note_sessions(&sessions);
            }
        });
        Ok(())
    }
}

impl Handler<AgentHello> for HostAgent {
    async fn handle(&mut self, cx: &Context<Self>, hello: AgentHello) -> anyhow::Result<()> {
        let info = &self.shared.info;
        let result = self.check(&hello.token).and_then(|()| {
            if hello.version == info.version {
                Ok(info.clone())
            } else {
                Err(format!(
                    "version mismatch: the agent on {} runs monarch-host {}, the controller {}; run the same version on both",
                    info.node, info.version, hello.version
                ))
            }
        });
        hello.reply.send(cx, result);
        Ok(())
    }
}

/// The most procs an agent starts for one request.
pub const MAX_PROCS_PER_REQUEST: usize = 1024;

impl Handler<AgentSpawn> for HostAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: AgentSpawn) -> anyhow::Result<()> {
        if let Err(e) = self.check(&request.token) {
            request.reply.send(cx, Err(e));
            return Ok(());
        }
        if request.names.len() > MAX_PROCS_PER_REQUEST {
            let asked = request.names.len();
            request.reply.send(
                cx,
                Err(format!(
                    "asked for {asked} procs; an agent starts at most {MAX_PROCS_PER_REQUEST} at once"
                )),
            );
            return Ok(());
        }
        let allocator = {
            let mut sessions = self.shared.sessions.lock();
            let allocator = match sessions.get_mut(&request.session) {
                Some(session) => {
                    session.last_heard = Instant::now();
                    session.allocator.clone()
                }
                None => {
                    let allocator =
                        match LocalAllocator::new(self.command.clone(), self.registry.clone()) {
                            Ok(allocator) => Arc::new(
                                allocator
                                    .listen_tcp(self.ip)
                                    .with_cluster_token(Some(self.token.clone())),
                            ),
                            Err(e) => {
                                request
                                    .reply
                                    .send(cx, Err(format!("cannot prepare procs: {e}")));
                                return Ok(());
                            }
                        };
                    sessions.insert(
                        request.session.clone(),
                        Session {
                            allocator: allocator.clone(),
                            last_heard: Instant::now(),
                            keepalive: Duration::from_millis(request.keepalive_ms.max(100)),
                        },
                    );
                    allocator
                }
            };
            self.shared.note_sessions(&sessions);
            allocator
        };
        // Ends of procs go to the controller as they happen; once the
        // agent is told to go, with the reason it was given (RM-7).
        let (stopped, mut stopped_rx) = mpsc::unbounded_channel();
        let (events, mailbox) = (request.events.clone(), (**cx).clone());
        let shared = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            while let Some(mut event) = stopped_rx.recv().await {
                let going = shared.upgrade().and_then(|s| s.going.lock().clone());
                if let (Some(going), MeshEvent::ProcStopped { reason, .. }) = (going, &mut event) {
                    *reason = going;
                }
                events.send(&mailbox, event);
            }
        });
        let result = allocator
            .allocate(request.names, request.events, stopped)
            .await
            .map(|procs| {
                procs
                    .into_iter()
                    .map(|a| (a.proc, a.pid.unwrap_or(0)))
                    .collect()
            })
            .map_err(|e| e.to_string());
        request.reply.send(cx, result);
        Ok(())
    }
}

impl Handler<AgentHeartbeat> for HostAgent {
    async fn handle(&mut self, cx: &Context<Self>, beat: AgentHeartbeat) -> anyhow::Result<()> {
        let result = self.check(&beat.token).and_then(|()| {
            match self.shared.sessions.lock().get_mut(&beat.session) {
                Some(session) => {
                    session.last_heard = Instant::now();
                    Ok(self.shared.info.incarnation)
                }
                None => Err(format!("{NO_SESSION} {}", beat.session)),
            }
        });
        beat.reply.send(cx, result);
        Ok(())
    }
}

impl Handler<AgentPutBlob> for HostAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: AgentPutBlob) -> anyhow::Result<()> {
        if let Err(e) = self.check(&request.token) {
            request.reply.send(cx, Err(e));
            return Ok(());
        }
        let registry = self.registry.clone();
        let result = tokio::task::spawn_blocking(move || {
            registry
                .put_blob(&request.sha256, &request.bytes)
                .map(|_| ())
        })
        .await
        .unwrap_or_else(|e| Err(format!("storing the blob panicked: {e}")));
        request.reply.send(cx, result);
        Ok(())
    }
}

impl Handler<AgentKill> for HostAgent {
    async fn handle(&mut self, cx: &Context<Self>, request: AgentKill) -> anyhow::Result<()> {
        let result = self.check(&request.token).and_then(|()| {
            let sessions = self.shared.sessions.lock();
            let session = sessions
                .get(&request.session)
                .ok_or_else(|| format!("no session {}", request.session))?;
            session
                .allocator
                .kill(&request.proc, request.signal)
                .map_err(|e| e.to_string())
        });
        request.reply.send(cx, result);
        Ok(())
    }
}

impl Handler<AgentStopProcs> for HostAgent {
    async fn handle(&mut self, _cx: &Context<Self>, request: AgentStopProcs) -> anyhow::Result<()> {
        if self.check(&request.token).is_ok()
            && let Some(session) = self.shared.sessions.lock().get(&request.session)
        {
            session.allocator.stop(&request.procs);
        }
        Ok(())
    }
}

impl Handler<AgentStop> for HostAgent {
    async fn handle(&mut self, _cx: &Context<Self>, request: AgentStop) -> anyhow::Result<()> {
        if self.check(&request.token).is_ok() {
            let mut sessions = self.shared.sessions.lock();
            if let Some(session) = sessions.remove(&request.session) {
                session.allocator.stop_all();
            }
            self.shared.note_sessions(&sessions);
        }
        Ok(())
    }
}

/// Why an agent cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// RM-1.
    #[error(
        "refusing to listen on {0} without a cluster token: anyone who reaches it could run code here. Give --token-file, or listen on a loopback address"
    )]
    NoToken(ChannelAddr),
    /// Agents listen on TCP at a specific address.
    #[error(
        "an agent listens on tcp:IP:PORT with a specific IP (its procs are reached at that IP), not {0}"
    )]
    BadAddress(ChannelAddr),
    /// The proc could not start.
    #[error("cannot serve the agent: {0}")]
    Serve(String),
}

/// What [`serve_agent`] needs.
pub struct AgentConfig {
    /// Where to listen: `tcp:IP:PORT` with a specific IP (port 0 picks
    /// one).
    pub addr: ChannelAddr,
    /// The cluster token; required off loopback (RM-1).
    pub token: Option<String>,
    /// How procs start.
    pub command: BootstrapCommand,
    /// Where the host keeps blobs, and the actors it can make.
    pub registry: Registry,
    /// The node this runs on, as reasons name it.
    pub node: String,
}

/// A running agent: its proc, and what can be asked of it.
pub struct Agent {
    proc: Proc,
    shared: Arc<Shared>,
}

impl std::ops::Deref for Agent {
    type Target = Proc;

    fn deref(&self) -> &Proc {
        &self.proc
    }
}

impl Agent {
    /// Who it is (RM-5, RM-6).
    pub fn info(&self) -> &AgentInfo {
        &self.shared.info
    }

    /// How long it has been without a controller; None while it has one.
    pub fn idle_for(&self) -> Option<Duration> {
        self.shared.idle_since.lock().map(|since| since.elapsed())
    }

    /// Stops every session's procs, reporting each stopped with `reason`
    /// (RM-7); returns once they have ended or `grace` has passed.
    pub async fn go(&self, reason: String, grace: Duration) {
        *self.shared.going.lock() = Some(reason);
        let allocators: Vec<Arc<LocalAllocator>> = self
            .shared
            .sessions
            .lock()
            .values()
            .map(|s| s.allocator.clone())
            .collect();
        for allocator in &allocators {
            allocator.stop_all();
        }
        let until = Instant::now() + grace;
        while Instant::now() < until && allocators.iter().any(|a| !a.pids().is_empty()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The last reports leave through the agent's proc.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The start of an error that means the agent no longer knows a session.
const NO_SESSION: &str = "no session";

/// The monarch-host version agents and controllers compare (RM-5).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Serves a host agent (RM-1); procs start as `config.command`, and the
/// host keeps blobs where `config.registry` says.
pub async fn serve_agent(config: AgentConfig) -> Result<Agent, AgentError> {
    let AgentConfig {
        addr,
        token,
        command,
        registry,
        node,
    } = config;
    let ChannelAddr::Tcp(socket) = &addr else {
        return Err(AgentError::BadAddress(addr));
    };
    let ip = socket.ip();
    if ip.is_unspecified() {
        return Err(AgentError::BadAddress(addr));
    }
    let token = match token {
        Some(token) if !token.is_empty() => token,
        _ if ip.is_loopback() => String::new(),
        _ => return Err(AgentError::NoToken(addr)),
    };
    let config = hyperactor::ProcConfig {
        cluster_token: hyperactor::ClusterToken::new(&token),
        ..hyperactor::ProcConfig::default()
    };
    let proc = Proc::serve_with_config("agent", addr, config)
        .await
        .map_err(|e| AgentError::Serve(e.to_string()))?;
    let shared = Arc::new(Shared {
        sessions: Mutex::default(),
        going: Mutex::default(),
        idle_since: Mutex::new(Some(Instant::now())),
        info: AgentInfo {
            version: VERSION.to_string(),
            incarnation: incarnation(),
            node,
        },
    });
    let agent = HostAgent {
        token,
        command,
        registry: Arc::new(registry),
        ip,
        shared: shared.clone(),
    };
    proc.spawn(HOST_AGENT, 0, agent)
        .map_err(|e| AgentError::Serve(e.to_string()))?;
    Ok(Agent { proc, shared })
}

/// A random incarnation (RM-6): the clock's nanoseconds mixed with the
/// pid and an address, which differ at every start.
fn incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn agent_port<M: hyperactor::RemoteMessage>(agent: &ChannelAddr) -> Result<PortRef<M>, String> {
    let proc = ProcId::new(agent.clone(), "agent").map_err(|e| e.to_string())?;
    let actor = proc.actor_id(HOST_AGENT, 0).map_err(|e| e.to_string())?;
    Ok(PortRef::attest(actor.port_id(handler_port::<M>())))
}

struct Host {
    addr: ChannelAddr,
    procs: Vec<ProcId>,
    lost: bool,
    /// What the agent said in its hello (RM-5).
    info: Option<AgentInfo>,
}

/// Starts procs through agents on other hosts; see the module docs.
pub struct RemoteAllocator {
    mailbox: Mailbox,
    _proc: Proc,
    token: String,
    session: String,
    liveness: Liveness,
    call_timeout: Duration,
    hosts: Arc<Mutex<Vec<Host>>>,
    stopped: Arc<Mutex<Option<mpsc::UnboundedSender<MeshEvent>>>>,
    next_host: Mutex<usize>,
}

impl RemoteAllocator {
    /// An allocator over the agents at `agents`, reached from a proc of
    /// its own at `local` (an address the agents can reach back).
    pub async fn new(
        local: ChannelAddr,
        agents: Vec<ChannelAddr>,
        token: String,
        liveness: Liveness,
    ) -> Result<Arc<RemoteAllocator>, AllocError> {
        if agents.is_empty() {
            return Err(AllocError("no hosts given".into()));
        }
        let config = hyperactor::ProcConfig {
            cluster_token: hyperactor::ClusterToken::new(&token),
            ..hyperactor::ProcConfig::default()
        };
        let proc = Proc::serve_with_config("allocator", local, config)
            .await
            .map_err(|e| AllocError(format!("cannot start the allocator's proc: {e}")))?;
        let (mailbox, _undeliverable) = proc
            .attach("alloc")
            .map_err(|e| AllocError(e.to_string()))?;
        let session = format!(
            "{}-{}-{}",
            std::process::id(),
            proc.id().addr(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let allocator = Arc::new(RemoteAllocator {
            mailbox,
            _proc: proc,
            token,
            session,
            liveness,
            call_timeout: Duration::from_secs(30),
            hosts: Arc::new(Mutex::new(
                agents
                    .into_iter()
                    .map(|addr| Host {
                        addr,
                        procs: Vec::new(),
                        lost: false,
                        info: None,
                    })
                    .collect(),
            )),
            stopped: Arc::default(),
            next_host: Mutex::new(0),
        });
        // Every agent must answer before the first proc is asked for.
        let addrs: Vec<ChannelAddr> = allocator
            .hosts
            .lock()
            .iter()
            .map(|h| h.addr.clone())
            .collect();
        let hellos = addrs.iter().map(|addr| {
            let allocator = allocator.clone();
            async move {
                let info = allocator.hello(addr).await?;
                allocator.ping(addr, true).await?;
                Ok::<_, String>(info)
            }
        });
        let infos = futures::future::join_all(hellos).await;
        for (index, (addr, info)) in addrs.iter().zip(infos).enumerate() {
            let info = info.map_err(|e| AllocError(format!("agent at {addr}: {e}")))?;
            allocator.hosts.lock()[index].info = Some(info);
        }
        allocator.start_heartbeats();
        Ok(allocator)
    }

    /// The agent's hello (RM-5).
    async fn hello(&self, addr: &ChannelAddr) -> Result<AgentInfo, String> {
        let port = agent_port::<AgentHello>(addr)?;
        let reply = self.mailbox.start_call(port.id(), |reply| AgentHello {
            token: self.token.clone(),
            version: VERSION.to_string(),
            reply,
        });
        match reply.recv_timeout(self.liveness.host_timeout).await {
            Ok(result) => result,
            Err(e) => Err(format!(
                "no answer ({e}): is the agent running there, with the same cluster token (--token-file)?"
            )),
        }
    }

    /// What each agent said in its hello, in host order.
    pub fn agents(&self) -> Vec<(ChannelAddr, Option<AgentInfo>)> {
        self.hosts
            .lock()
            .iter()
            .map(|h| (h.addr.clone(), h.info.clone()))
            .collect()
    }

    /// Asks `addr` whether it is alive; `open` creates the session.
    /// A heartbeat answers the agent's incarnation.
    async fn ping(&self, addr: &ChannelAddr, open: bool) -> Result<u64, String> {
        if open {
            // An empty spawn opens the session and checks the token.
            let port = agent_port::<AgentSpawn>(addr)?;
            let events = self.mailbox.open_port::<MeshEvent>().bind();
            let reply = self.mailbox.start_call(port.id(), |reply| AgentSpawn {
                token: self.token.clone(),
                session: self.session.clone(),
                names: Vec::new(),
                events,
                keepalive_ms: self.liveness.keepalive.as_millis() as u64,
                reply,
            });
            return match reply.recv_timeout(self.liveness.host_timeout).await {
                Ok(result) => result.map(|_| 0),
                Err(e) => Err(format!(
                    "no answer ({e}): is the agent running there, with the same cluster token (--token-file)?"
                )),
            };
        }
        let port = agent_port::<AgentHeartbeat>(addr)?;
        let reply = self.mailbox.start_call(port.id(), |reply| AgentHeartbeat {
            token: self.token.clone(),
            session: self.session.clone(),
            reply,
        });
        match reply.recv_timeout(self.liveness.heartbeat * 2).await {
            Ok(result) => result,
            Err(e) => Err(e.to_string()),
        }
    }

    fn start_heartbeats(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let count = self.hosts.lock().len();
        for index in 0..count {
            let weak = weak.clone();
            tokio::spawn(async move {
                let mut last_ok = Instant::now();
                loop {
                    let Some(this) = weak.upgrade() else { return };
                    let (addr, lost, known) = {
                        let hosts = this.hosts.lock();
                        let host = &hosts[index];
                        let known = host.info.as_ref().map(|i| i.incarnation);
                        (host.addr.clone(), host.lost, known)
                    };
                    if lost {
                        return;
                    }
                    let started = Instant::now();
                    // RM-6: another incarnation, or an agent that lost
                    // the session, is a restarted agent: lost at once.
                    let restarted = match this.ping(&addr, false).await {
                        Ok(incarnation) if known.is_none_or(|k| k == incarnation) => {
                            last_ok = Instant::now();
                            None
                        }
                        Ok(_) => {
                            Some("the agent there restarted (another incarnation)".to_string())
                        }
                        Err(e) if e.starts_with(NO_SESSION) => Some(format!(
                            "the agent there no longer knows this controller ({e}): it restarted, or timed the session out"
                        )),
                        Err(e) => {
                            tracing::debug!(%addr, error = %e, "missed heartbeat");
                            None
                        }
                    };
                    if let Some(why) = restarted {
                        this.host_lost(index, why);
                        return;
                    }
                    if last_ok.elapsed() >= this.liveness.host_timeout {
                        let silent = last_ok.elapsed();
                        this.host_lost(
                            index,
                            format!("no heartbeat answered for {} ms", silent.as_millis()),
                        );
                        return;
                    }
                    let pause = this.liveness.heartbeat.saturating_sub(started.elapsed());
                    drop(this);
                    tokio::time::sleep(pause).await;
                }
            });
        }
    }

    /// RM-3: every proc of a lost host is reported stopped, once.
    fn host_lost(&self, index: usize, why: String) {
        let (addr, procs) = {
            let mut hosts = self.hosts.lock();
            let host = &mut hosts[index];
            host.lost = true;
            (host.addr.clone(), std::mem::take(&mut host.procs))
        };
        tracing::warn!(%addr, "host lost: {why}");
        if let Some(stopped) = self.stopped.lock().as_ref() {
            for proc in procs {
                let _ = stopped.send(MeshEvent::ProcStopped {
                    proc,
                    reason: format!("lost with its host {addr} ({why})"),
                });
            }
        }
    }
}

impl Allocator for Arc<RemoteAllocator> {
    fn host_name(&self, host: usize) -> String {
        self.hosts
            .lock()
            .get(host)
            .map_or_else(|| format!("host{host}"), |h| h.addr.to_string())
    }

    fn allocate(
        &self,
        names: Vec<String>,
        events: PortRef<MeshEvent>,
        stopped: mpsc::UnboundedSender<MeshEvent>,
    ) -> BoxFuture<Result<Vec<Allocated>, AllocError>> {
        *self.stopped.lock() = Some(stopped);
        let this = self.clone();
        Box::pin(async move {
            // Round-robin over live hosts, continuing where the last
            // request stopped.
            let live: Vec<usize> = this
                .hosts
                .lock()
                .iter()
                .enumerate()
                .filter(|(_, h)| !h.lost)
                .map(|(i, _)| i)
                .collect();
            if live.is_empty() {
                return Err(AllocError("every host is lost".into()));
            }
            let mut per_host: HashMap<usize, Vec<(usize, String)>> = HashMap::new();
            {
                let mut next = this.next_host.lock();
                for (i, name) in names.into_iter().enumerate() {
                    let host = live[*next % live.len()];
                    *next += 1;
                    per_host.entry(host).or_default().push((i, name));
                }
            }
            let calls = per_host.into_iter().map(|(host, named)| {
                let this = this.clone();
                let events = events.clone();
                async move {
                    let addr = this.hosts.lock()[host].addr.clone();
                    let port = agent_port::<AgentSpawn>(&addr).map_err(AllocError)?;
                    let names: Vec<String> = named.iter().map(|(_, n)| n.clone()).collect();
                    let reply = this.mailbox.start_call(port.id(), |reply| AgentSpawn {
                        token: this.token.clone(),
                        session: this.session.clone(),
                        names,
                        events,
                        keepalive_ms: this.liveness.keepalive.as_millis() as u64,
                        reply,
                    });
                    let procs = reply
                        .recv_timeout(this.call_timeout)
                        .await
                        .map_err(|e| AllocError(format!("agent at {addr}: {e}")))?
                        .map_err(|e| AllocError(format!("agent at {addr}: {e}")))?;
                    this.hosts.lock()[host]
                        .procs
                        .extend(procs.iter().map(|(p, _)| p.clone()));
                    crate::alloc::procs_up(procs.len());
                    Ok::<_, AllocError>(
                        named
                            .into_iter()
                            .zip(procs)
                            .map(|((i, _), (proc, pid))| {
                                (
                                    i,
                                    Allocated {
                                        proc,
                                        host,
                                        pid: Some(pid),
                                    },
                                )
                            })
                            .collect::<Vec<_>>(),
                    )
                }
            });
            let mut all = Vec::new();
            for result in futures::future::join_all(calls).await {
                all.extend(result?);
            }
            all.sort_by_key(|(i, _)| *i);
            Ok(all.into_iter().map(|(_, a)| a).collect())
        })
    }

    fn put_blob(&self, sha256: String, bytes: Arc<Vec<u8>>) -> BoxFuture<Result<(), AllocError>> {
        let this = self.clone();
        Box::pin(async move {
            let addrs: Vec<ChannelAddr> = this
                .hosts
                .lock()
                .iter()
                .filter(|h| !h.lost)
                .map(|h| h.addr.clone())
                .collect();
            let calls = addrs.into_iter().map(|addr| {
                let (this, sha256, bytes) = (this.clone(), sha256.clone(), bytes.clone());
                async move {
                    let port = agent_port::<AgentPutBlob>(&addr).map_err(AllocError)?;
                    let reply = this.mailbox.start_call(port.id(), |reply| AgentPutBlob {
                        token: this.token.clone(),
                        sha256,
                        bytes: bytes.as_ref().clone(),
                        reply,
                    });
                    reply
                        .recv_timeout(this.call_timeout)
                        .await
                        .map_err(|e| AllocError(format!("agent at {addr}: {e}")))?
                        .map_err(|e| AllocError(format!("agent at {addr}: {e}")))
                }
            });
            for result in futures::future::join_all(calls).await {
                result?;
            }
            Ok(())
        })
    }

    fn stop_all(&self) {
        for host in self.hosts.lock().iter() {
            if let Ok(port) = agent_port::<AgentStop>(&host.addr) {
                port.send(
                    &self.mailbox,
                    AgentStop {
                        token: self.token.clone(),
                        session: self.session.clone(),
                    },
                );
            }
        }
    }

    fn stop(&self, procs: &[ProcId]) {
        for host in self.hosts.lock().iter() {
            let mine: Vec<ProcId> = procs
                .iter()
                .filter(|p| host.procs.contains(p))
                .cloned()
                .collect();
            if !mine.is_empty()
                && let Ok(port) = agent_port::<AgentStopProcs>(&host.addr)
            {
                port.send(
                    &self.mailbox,
                    AgentStopProcs {
                        token: self.token.clone(),
                        session: self.session.clone(),
                        procs: mine,
                    },
                );
            }
        }
    }

    fn kill(&self, proc: &ProcId, signal: i32) -> Result<(), AllocError> {
        let addr = self
            .hosts
            .lock()
            .iter()
            .find(|h| h.procs.contains(proc))
            .map(|h| h.addr.clone())
            .ok_or_else(|| AllocError(format!("no proc {proc} on any host")))?;
        let port = agent_port::<AgentKill>(&addr).map_err(AllocError)?;
        // The answer does not matter: the proc's end is reported anyway.
        let _reply = self.mailbox.start_call(port.id(), |reply| AgentKill {
            token: self.token.clone(),
            session: self.session.clone(),
            proc: proc.clone(),
            signal,
            reply,
        });
        Ok(())
    }
}

/// Says hello to each agent at `agents` (RM-5) without opening a
/// session: what each answered and how long it took, or why it did not.
/// For `slurm status` and `slurm up`'s check of every agent.
pub async fn probe(
    agents: &[ChannelAddr],
    token: &str,
    timeout: Duration,
) -> Vec<Result<(AgentInfo, Duration), String>> {
    probe_as(agents, token, VERSION, timeout).await
}

/// [`probe`], saying `version` is the controller's.
async fn probe_as(
    agents: &[ChannelAddr],
    token: &str,
    version: &str,
    timeout: Duration,
) -> Vec<Result<(AgentInfo, Duration), String>> {
    let Some(first) = agents.first() else {
        return Vec::new();
    };
    let ip = local_ip_towards(first).unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let local = ChannelAddr::Tcp(std::net::SocketAddr::new(ip, 0));
    let config = hyperactor::ProcConfig {
        cluster_token: hyperactor::ClusterToken::new(token),
        ..hyperactor::ProcConfig::default()
    };
    let proc = match Proc::serve_with_config("probe", local, config).await {
        Ok(proc) => proc,
        Err(e) => {
            let why = format!("cannot start a proc to reach the agents: {e}");
            return agents.iter().map(|_| Err(why.clone())).collect();
        }
    };
    let mailbox = match proc.attach("probe") {
        Ok((mailbox, _undeliverable)) => mailbox,
        Err(e) => return agents.iter().map(|_| Err(e.to_string())).collect(),
    };
    let calls = agents.iter().map(|addr| {
        let mailbox = mailbox.clone();
        async move {
            let port = agent_port::<AgentHello>(addr)?;
            let started = Instant::now();
            let reply = mailbox.start_call(port.id(), |reply| AgentHello {
                token: token.to_string(),
                version: version.to_string(),
                reply,
            });
            match reply.recv_timeout(timeout).await {
                Ok(Ok(info)) => Ok((info, started.elapsed())),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(format!("no answer within {timeout:?} ({e})")),
            }
        }
    });
    futures::future::join_all(calls).await
}

/// The local address from which this machine reaches `peer`: where a
/// controller listens so that procs on `peer`'s host can reach it.
pub fn local_ip_towards(peer: &ChannelAddr) -> Option<IpAddr> {
    let ChannelAddr::Tcp(peer) = peer else {
        return None;
    };
    let socket = std::net::UdpSocket::bind(("0.0.0.0", 0)).ok()?;
    socket.connect(peer).ok()?;
    socket.local_addr().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rm1_tokens_compare_whole() {
        assert!(same_token("secret", "secret"));
        assert!(!same_token("secret", "secreT"));
        assert!(!same_token("secret", "secret2"));
        assert!(!same_token("", "x"));
    }

    #[tokio::test]
    async fn rm1_an_agent_needs_a_token_off_loopback_and_a_specific_ip() {
        let command = BootstrapCommand {
            program: "/bin/false".into(),
            args: vec![],
        };
        let registry = || Registry::new(std::env::temp_dir());
        let err = serve_agent(AgentConfig {
            addr: "tcp:10.1.2.3:0".parse().unwrap(),
            token: None,
            command: command.clone(),
            registry: registry(),
            node: "test".into(),
        })
        .await
        .err()
        .expect("refused");
        assert!(matches!(err, AgentError::NoToken(_)), "{err}");
        let err = serve_agent(AgentConfig {
            addr: "tcp:0.0.0.0:0".parse().unwrap(),
            token: Some("t".into()),
            command: command.clone(),
            registry: registry(),
            node: "test".into(),
        })
        .await
        .err()
        .expect("refused");
        assert!(matches!(err, AgentError::BadAddress(_)), "{err}");
        let quick = Liveness {
            heartbeat: Duration::from_millis(100),
            host_timeout: Duration::from_millis(500),
            keepalive: Duration::from_secs(1),
        };
        // RM-4: a controller with the wrong token does not get through the
        // agent's channel, and is told to check the token.
        let agent = serve_agent(AgentConfig {
            addr: "tcp:127.0.0.1:0".parse().unwrap(),
            token: Some("right".into()),
            command: command.clone(),
            registry: registry(),
            node: "test".into(),
        })
        .await
        .unwrap();
        let wrong = RemoteAllocator::new(
            "tcp:127.0.0.1:0".parse().unwrap(),
            vec![agent.id().addr().clone()],
            "wrong".into(),
            quick,
        )
        .await
        .err()
        .expect("a wrong token is refused");
        assert!(wrong.to_string().contains("cluster token"), "{wrong}");
        // A controller with a token and an agent without one cannot talk
        // either: the agent's replies do not carry the token.
        let open = serve_agent(AgentConfig {
            addr: "tcp:127.0.0.1:0".parse().unwrap(),
            token: None,
            command,
            registry: registry(),
            node: "test".into(),
        })
        .await
        .unwrap();
        let wrong = RemoteAllocator::new(
            "tcp:127.0.0.1:0".parse().unwrap(),
            vec![open.id().addr().clone()],
            "unexpected".into(),
            quick,
        )
        .await
        .err()
        .expect("a token the agent does not have is refused");
        assert!(wrong.to_string().contains("cluster token"), "{wrong}");
    }

    /// RM-5 and RM-6: a hello answers the agent's version, node and
    /// incarnation, fresh at each start; a controller of another version is
    /// refused, naming both versions.
    #[tokio::test]
    async fn rm5_hello_names_the_agent_and_refuses_another_version() {
        let start = || async {
            serve_agent(AgentConfig {
                addr: "tcp:127.0.0.1:0".parse().unwrap(),
                token: Some("right".into()),
                command: BootstrapCommand {
                    program: "/bin/false".into(),
                    args: vec![],
                },
                registry: Registry::new(std::env::temp_dir()),
                node: "n7".into(),
            })
            .await
            .unwrap()
        };
        let agent = start().await;
        let addrs = vec![agent.id().addr().clone()];
        let timeout = Duration::from_secs(5);
        let answers = probe(&addrs, "right", timeout).await;
        let (info, _) = answers[0].as_ref().expect("a hello");
        assert_eq!(info, agent.info());
        assert_eq!((info.node.as_str(), info.version.as_str()), ("n7", VERSION));
        let other = probe_as(&addrs, "right", "9.9.9", timeout).await;
        let e = other[0].as_ref().unwrap_err();
        assert!(
            e.contains("version mismatch")
                && e.contains(VERSION)
                && e.contains("9.9.9")
                && e.contains("n7"),
            "{e}"
        );
        // Another start is another incarnation.
        let again = start().await;
        assert_ne!(again.info().incarnation, agent.info().incarnation);
    }
}
