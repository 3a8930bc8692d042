//! Several "hosts" on one machine, made of Linux network namespaces.
//!
//! A [`NetCluster`] creates one network namespace per host, each holding the
//! inner end (`eth0`) of a veth pair whose outer end is a port of a fresh bridge
//! in the root namespace. The bridge has `10.<a>.<b>.1/24` (the root side, where
//! a controller in the test process is reachable) and host `i` has
//! `10.<a>.<b>.(i+2)/24`; hosts reach each other and the root side directly on
//! that subnet (no IP forwarding, no default route). [`NetCluster::command`]
//! runs a program inside a host, and [`NetCluster::partition`] cuts a host off,
//! so a test can lose a host in the middle of a call.
//!
//! It needs root, Linux and iproute2 (`ip`, `bridge`). Tests call
//! [`NetCluster::unavailable`] first and, when it gives a reason, print it and
//! return early (skip) instead of failing.
//!
//! Root-to-host traffic is delivered locally, so it never meets a forwarding
//! firewall; host-to-host traffic is bridged, and with `br_netfilter` loaded
//! and `bridge-nf-call-iptables=1` (as here) it passes the root namespace's
//! iptables FORWARD chain, which a Docker-style `DROP` policy would block.
//!
//! Names are `mh<pid in hex>x<counter>` plus a suffix (`b` for the bridge,
//! `r<i>` for a root-side veth, `-<i>` for a namespace), short enough for the
//! 15-character limit on interface names. Creating a cluster first deletes
//! whatever a crashed run left behind: every `mh…` namespace or interface whose
//! process no longer exists (in this pid namespace), and anything with the
//! name about to be used.

#![allow(dead_code)]

use std::fs;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result, bail};

/// Distinguishes the clusters of one process.
static COUNTER: AtomicU32 = AtomicU32::new(0);
/// Serialises cluster creation in this process, so that two clusters never
/// pick the same free subnet.
static CREATE: Mutex<()> = Mutex::new(());
/// How many `/24` subnets there are to pick from: `10.200.0.0` to `10.249.255.0`.
const SUBNETS: u32 = 50 * 256;

/// Several network namespaces joined by a bridge in the root namespace.
pub struct NetCluster {
    /// The prefix of every name belonging to this cluster, e.g. `mh1f2ax3`.
    name: String,
    /// The first three octets of the subnet, e.g. `10.201.7`.
    subnet: String,
    /// The namespace of each host.
    namespaces: Vec<String>,
}

impl NetCluster {
    /// Why multi-host tests cannot run here (not Linux, not root, no `ip` or
    /// `bridge`, namespace creation refused), or `None`. Probes once per process by
    /// making (and removing) a one-host cluster.
    pub fn unavailable() -> Option<String> {
        static WHY: OnceLock<Option<String>> = OnceLock::new();
        WHY.get_or_init(|| {
            if !cfg!(target_os = "linux") {
                return Some("network namespaces need Linux".into());
            }
            let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
            let euid = status.lines().find_map(|l| l.strip_prefix("Uid:"));
            if euid.and_then(|ids| ids.split_whitespace().nth(1)) != Some("0") {
                return Some("multi-host tests need root (to make network namespaces)".into());
            }
            if let Err(e) = ip("-V").and_then(|_| run("bridge", "-V")) {
                return Some(format!("iproute2 is not usable: {e:#}"));
            }
            let probe = NetCluster::new(1).err();
            probe.map(|e| format!("cannot make network namespaces: {e:#}"))
        })
        .clone()
    }

    /// Creates `hosts` (1 to 99) namespaces, each with loopback up and a veth
    /// pair to a fresh bridge in the root namespace; see the module doc.
    pub fn new(hosts: usize) -> Result<NetCluster> {
        if !(1..=99).contains(&hosts) {
            bail!("a NetCluster has 1 to 99 hosts, not {hosts}");
        }
        let _guard = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) % 1000;
        let name = format!("mh{pid:x}x{n}");
        sweep(|cluster, owner| cluster == name || !Path::new(&format!("/proc/{owner}")).exists());
        let seed = pid
            .wrapping_mul(2_654_435_761)
            .wrapping_add(n.wrapping_mul(40_503));
        let subnet = free_subnet(seed)?;
        let namespaces = (0..hosts).map(|i| format!("{name}-{i}")).collect();
        // From here on, dropping `cluster` removes whatever was made.
        let cluster = NetCluster {
            name,
            subnet,
            namespaces,
        };
        let bridge = format!("{}b", cluster.name);
        ip(&format!("link add {bridge} type bridge"))?;
        ip(&format!("addr add {}/24 dev {bridge}", cluster.root_ip()))?;
        ip(&format!("link set {bridge} up"))?;
        for i in 0..hosts {
            let (ns, outer, addr) = (cluster.namespace(i), cluster.outer(i), cluster.host_ip(i));
            ip(&format!("netns add {ns}"))?;
            ip(&format!(
                "link add {outer} type veth peer name eth0 netns {ns}"
            ))?;
            ip(&format!("link set {outer} master {bridge} up"))?;
            ip(&format!("-n {ns} link set lo up"))?;
            ip(&format!("-n {ns} addr add {addr}/24 dev eth0"))?;
            ip(&format!("-n {ns} link set eth0 up"))?;
        }
        Ok(cluster)
    }

    /// The IP address of host `i`, e.g. `10.201.7.3`.
    pub fn host_ip(&self, i: usize) -> String {
        assert!(i < self.namespaces.len(), "no host {i} in this cluster");
        format!("{}.{}", self.subnet, i + 2)
    }

    /// The address of the bridge in the root namespace, where a listener in
    /// the test process is reachable from every host.
    pub fn root_ip(&self) -> String {
        format!("{}.1", self.subnet)
    }

    /// The namespace name of host `i`.
    pub fn namespace(&self, i: usize) -> &str {
        &self.namespaces[i]
    }

    /// A command that runs `program` inside host `i`'s namespace, through
    /// `ip netns exec`, which execs `program` (so the child's pid is the
    /// program's own). The caller adds arguments and stdio, spawns and kills it.
    pub fn command(&self, i: usize, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.namespace(i)]).arg(program);
        cmd
    }

    /// Cuts host `i` off: its port on the bridge is disabled, so every frame
    /// it sends or is sent is dropped silently, while both veth ends stay up
    /// (the host keeps its address and route, as with a real network fault).
    /// Established TCP connections stall, retransmitting, with no RST or
    /// error; new connections either way time out.
    pub fn partition(&self, i: usize) -> Result<()> {
        self.set_port_state(i, "0")
    }

    /// Undoes [`partition`](Self::partition). New connections work at once;
    /// stalled ones resume at their next retransmission, which TCP backs off
    /// exponentially (a few seconds after a partition of a few seconds).
    pub fn heal(&self, i: usize) -> Result<()> {
        self.set_port_state(i, "3")
    }

    /// Sets the bridge port state of host `i` (0 disabled, 3 forwarding) and
    /// checks that it took: the kernel ignores some states silently.
    fn set_port_state(&self, i: usize, state: &str) -> Result<()> {
        let outer = self.outer(i);
        run("bridge", &format!("link set dev {outer} state {state}"))?;
        let path = format!("/sys/class/net/{outer}/brport/state");
        let now = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        if now.trim() != state {
            bail!("bridge port {outer} stayed in state {}", now.trim());
        }
        Ok(())
    }

    /// The root-side end of host `i`'s veth pair.
    fn outer(&self, i: usize) -> String {
        format!("{}r{i}", self.name)
    }
}

impl Drop for NetCluster {
    /// Deletes the veths, the bridge and the namespaces, ignoring errors.
    /// Processes still running in a namespace keep it alive (with only its
    /// loopback, since its veth goes with the pair) until they exit.
    fn drop(&mut self) {
        sweep(|cluster, _| cluster == self.name);
    }
}

/// Runs `ip <args>`, returning its standard output.
fn ip(args: &str) -> Result<String> {
    run("ip", args)
}

/// Runs `program <args>` (split at whitespace; our names have none),
/// returning its standard output.
fn run(program: &str, args: &str) -> Result<String> {
    let output = Command::new(program)
        .args(args.split_whitespace())
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running `{program} {args}`"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("`{program} {args}`: {}: {}", output.status, stderr.trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Deletes the interfaces, then the namespaces, of every cluster for which
/// `doomed(cluster name, owner pid)` holds, ignoring errors.
fn sweep(mut doomed: impl FnMut(&str, u32) -> bool) {
    for (dir, kind) in [("/sys/class/net", "link"), ("/run/netns", "netns")] {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            match cluster_of(&name) {
                // The bridge goes by itself; a root-side veth takes its peer along.
                Some((cluster, owner)) if doomed(cluster, owner) => {
                    let _ = ip(&format!("{kind} delete {name}"));
                }
                _ => {}
            }
        }
    }
}

/// The cluster name and owner pid of one of our interface or namespace names
/// (`mh<hex pid>x<decimal counter>` followed by `b`, `r<i>` or `-<i>`).
fn cluster_of(name: &str) -> Option<(&str, u32)> {
    let (pid, rest) = name.strip_prefix("mh")?.split_once('x')?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    if digits == 0 || !matches!(rest.as_bytes()[digits], b'b' | b'r' | b'-') {
        return None;
    }
    let pid = u32::from_str_radix(pid, 16).ok()?;
    Some((&name[..name.len() - rest.len() + digits], pid))
}

/// A `10.a.b` subnet that no address or route of the root namespace uses,
/// searching from `seed`.
fn free_subnet(seed: u32) -> Result<String> {
    let mut seen = ip("-4 -o addr show")?;
    seen += &ip("-4 route show table all")?;
    let words: Vec<&str> = seen.split_whitespace().collect();
    for k in 0..SUBNETS {
        let h = seed.wrapping_add(k) % SUBNETS;
        let subnet = format!("10.{}.{}", 200 + h / 256, h % 256);
        let prefix = format!("{subnet}.");
        if !words.iter().any(|w| w.starts_with(&prefix)) {
            return Ok(subnet);
        }
    }
    bail!("no free 10.200-249.x.0/24 subnet for a NetCluster")
}

/// A host agent (or any server) started in one host; killed, with its
/// procs, when dropped.
pub struct Agent {
    pub child: Child,
    /// Where it serves: `IP:PORT`.
    pub addr: String,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `program args` in host `i`; its first line on stdout ends with
/// where it serves (`... tcp:IP:PORT`).
pub fn start_agent(net: &NetCluster, i: usize, program: &str, args: &[String]) -> Agent {
    let mut child = net
        .command(i, Path::new(program))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start an agent");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .expect("the agent says where it serves");
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .trim_start_matches("tcp:")
        .to_string();
    assert!(!addr.is_empty(), "agent printed {line:?}");
    Agent { child, addr }
}

/// A mesh client in the root namespace whose procs the `agents` start,
/// all with the cluster `token`.
pub async fn mesh_client(
    net: &NetCluster,
    agents: &[Agent],
    token: &str,
    liveness: hyperactor_mesh::remote::Liveness,
) -> std::sync::Arc<hyperactor_mesh::client::MeshClient> {
    let local = format!("tcp:{}:0", net.root_ip());
    let allocator = hyperactor_mesh::remote::RemoteAllocator::new(
        local.parse().expect("an address"),
        agents
            .iter()
            .map(|a| format!("tcp:{}", a.addr).parse().expect("an address"))
            .collect(),
        token.into(),
        liveness,
    )
    .await
    .expect("the agents answer");
    hyperactor_mesh::client::MeshClient::with_config(
        local.parse().expect("an address"),
        hyperactor::ProcConfig {
            cluster_token: hyperactor::ClusterToken::new(token),
            ..hyperactor::ProcConfig::default()
        },
        std::sync::Arc::new(allocator),
        std::sync::Arc::new(|_: &str| {}),
    )
    .await
    .expect("a mesh client")
}
