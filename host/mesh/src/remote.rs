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

/// Keeps a session alive.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AgentHeartbeat {
    /// The cluster token.
    pub token: String,
    /// The session.
    pub session: String,
    /// Ok while the agent knows the session.
    pub reply: OncePortRef<Result<(), String>>,
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

/// The agent of one host; see the module docs.
pub struct HostAgent {
    token: String,
    command: BootstrapCommand,
    registry: Arc<Registry>,
    ip: IpAddr,
    sessions: Arc<Mutex<HashMap<String, Session>>>,
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
            .handle::<AgentSpawn>()
            .handle::<AgentHeartbeat>()
            .handle::<AgentPutBlob>()
            .handle::<AgentKill>()
            .handle::<AgentStopProcs>()
            .handle::<AgentStop>();
    }

    async fn init(&mut self, _cx: &Context<Self>) -> anyhow::Result<()> {
        // RM-2: sessions whose controller went quiet end with their procs.
        let sessions = Arc::downgrade(&self.sessions);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let Some(sessions) = sessions.upgrade() else {
                    return;
                };
                let now = Instant::now();
                sessions.lock().retain(|id, session| {
                    let alive = now.duration_since(session.last_heard) < session.keepalive;
                    if !alive {
                        tracing::warn!(session = %id, "controller silent past the keepalive; stopping its procs");
                        session.allocator.stop_all();
                    }
                    alive
                });
            }
        });
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
            let mut sessions = self.sessions.lock();
            match sessions.get_mut(&request.session) {
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
            }
        };
        // Ends of procs go to the controller as they happen.
        let (stopped, mut stopped_rx) = mpsc::unbounded_channel();
        let (events, mailbox) = (request.events.clone(), (**cx).clone());
        tokio::spawn(async move {
            while let Some(event) = stopped_rx.recv().await {
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
            match self.sessions.lock().get_mut(&beat.session) {
                Some(session) => {
                    session.last_heard = Instant::now();
                    Ok(())
                }
                None => Err(format!("no session {}", beat.session)),
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
            let sessions = self.sessions.lock();
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
            && let Some(session) = self.sessions.lock().get(&request.session)
        {
            session.allocator.stop(&request.procs);
        }
        Ok(())
    }
}

impl Handler<AgentStop> for HostAgent {
    async fn handle(&mut self, _cx: &Context<Self>, request: AgentStop) -> anyhow::Result<()> {
        if self.check(&request.token).is_ok()
            && let Some(session) = self.sessions.lock().remove(&request.session)
        {
            session.allocator.stop_all();
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

/// Serves a host agent on `addr` (RM-1); procs start as `command`, and the
/// host keeps blobs where `registry` says. Returns the agent's proc.
pub async fn serve_agent(
    addr: ChannelAddr,
    token: Option<String>,
    command: BootstrapCommand,
    registry: Registry,
) -> Result<Proc, AgentError> {
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
    let agent = HostAgent {
        token,
        command,
        registry: Arc::new(registry),
        ip,
        sessions: Arc::default(),
    };
    proc.spawn(HOST_AGENT, 0, agent)
        .map_err(|e| AgentError::Serve(e.to_string()))?;
    Ok(proc)
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
        for addr in &addrs {
            allocator
                .ping(addr, true)
                .await
                .map_err(|e| AllocError(format!("agent at {addr}: {e}")))?;
        }
        allocator.start_heartbeats();
        Ok(allocator)
    }

    /// Asks `addr` whether it is alive; `open` creates the session.
    async fn ping(&self, addr: &ChannelAddr, open: bool) -> Result<(), String> {
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
                Ok(result) => result.map(|_| ()),
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
                    let (addr, lost) = {
                        let hosts = this.hosts.lock();
                        (hosts[index].addr.clone(), hosts[index].lost)
                    };
                    if lost {
                        return;
                    }
                    let started = Instant::now();
                    match this.ping(&addr, false).await {
                        Ok(()) => last_ok = Instant::now(),
                        Err(e) => tracing::debug!(%addr, error = %e, "missed heartbeat"),
                    }
                    if last_ok.elapsed() >= this.liveness.host_timeout {
                        this.host_lost(index, last_ok.elapsed());
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
    fn host_lost(&self, index: usize, silent: Duration) {
        let (addr, procs) = {
            let mut hosts = self.hosts.lock();
            let host = &mut hosts[index];
            host.lost = true;
            (host.addr.clone(), std::mem::take(&mut host.procs))
        };
        tracing::warn!(%addr, "host lost: no heartbeat answered for {silent:?}");
        if let Some(stopped) = self.stopped.lock().as_ref() {
            for proc in procs {
                let _ = stopped.send(MeshEvent::ProcStopped {
                    proc,
                    reason: format!(
                        "lost with its host {addr} (no heartbeat answered for {} ms)",
                        silent.as_millis()
                    ),
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
        let err = serve_agent(
            "tcp:10.1.2.3:0".parse().unwrap(),
            None,
            command.clone(),
            registry(),
        )
        .await
        .err()
        .expect("refused");
        assert!(matches!(err, AgentError::NoToken(_)), "{err}");
        let err = serve_agent(
            "tcp:0.0.0.0:0".parse().unwrap(),
            Some("t".into()),
            command.clone(),
            registry(),
        )
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
        let agent = serve_agent(
            "tcp:127.0.0.1:0".parse().unwrap(),
            Some("right".into()),
            command.clone(),
            registry(),
        )
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
        let open = serve_agent(
            "tcp:127.0.0.1:0".parse().unwrap(),
            None,
            command,
            registry(),
        )
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
}
