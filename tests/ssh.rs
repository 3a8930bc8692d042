//! `monarch-host run --hosts ssh:...` against real `sshd`s, one in each of
//! two network namespaces, logged into as root with a key made for the test.
//!
//! What a user would notice: the run starts an agent on each host over ssh
//! and runs the program there, with ranks on both hosts; the first run
//! copies the binary and the next finds it; the token is in no process's
//! arguments or environment; when the run ends, no agent or proc is left;
//! and a refused key or a host that is down fails the run by name, within
//! the timeout, leaving nothing behind.
//!
//! These tests need root, iproute2 and OpenSSH's server and client; without
//! them they say why and pass.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/netns.rs"]
mod netns;

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use netns::NetCluster;

const SSHD: &str = "/usr/sbin/sshd";
/// A run copies a debug build (hundreds of MB) to two hosts.
const RUN_LIMIT: Duration = Duration::from_secs(300);
/// How long agents and procs may outlive their run.
const STOP_LIMIT: Duration = Duration::from_secs(5);

/// Why these tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    if let Some(reason) = NetCluster::unavailable() {
        return Some(reason);
    }
    if !Path::new(SSHD).exists() {
        return Some(format!(
            "{SSHD} is missing (apt-get install openssh-server)"
        ));
    }
    for tool in ["ssh", "ssh-keygen"] {
        // Both exist if they start; `-V` asks ssh for its version only.
        let started = Command::new(tool)
            .arg("-V")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if started.is_err() {
            return Some(format!(
                "{tool} is missing (apt-get install openssh-client)"
            ));
        }
    }
    None
}

fn skip() -> bool {
    match unavailable() {
        Some(reason) => {
            eprintln!("skipped: {reason}");
            true
        }
        None => false,
    }
}

/// Two hosts, each with an sshd; the sshds are killed and the directory
/// removed when dropped, also when a test panics.
struct Hosts {
    net: NetCluster,
    dir: PathBuf,
    sshds: Vec<Child>,
    /// The key the sshds accept.
    key: PathBuf,
    /// A key they do not.
    wrong_key: PathBuf,
    /// `$MONARCH_SSH_REMOTE_DIR`.
    remote_dir: PathBuf,
    /// `$MONARCH_CACHE_DIR` of the controller.
    cache: PathBuf,
}

impl Hosts {
    fn new() -> Hosts {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "monarch-ssh-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let net = NetCluster::new(2).expect("namespaces");
        let mut hosts = Hosts {
            net,
            key: dir.join("client_key"),
            wrong_key: dir.join("wrong_key"),
            remote_dir: dir.join("remote/bin"),
            cache: dir.join("cache"),
            dir,
            sshds: Vec::new(),
        };
        for key in ["host_key", "client_key", "wrong_key"] {
            keygen(&hosts.dir.join(key));
        }
        std::fs::copy(
            hosts.dir.join("client_key.pub"),
            hosts.dir.join("authorized_keys"),
        )
        .unwrap();
        // sshd's privilege separation directory.
        std::fs::create_dir_all("/run/sshd").unwrap();
        std::fs::set_permissions("/run/sshd", std::fs::Permissions::from_mode(0o755)).unwrap();
        for i in 0..2 {
            let sshd = hosts.start_sshd(i);
            hosts.sshds.push(sshd);
        }
        for i in 0..2 {
            hosts.wait_for_sshd(i);
        }
        hosts
    }

    fn start_sshd(&self, i: usize) -> Child {
        let dir = self.dir.display();
        let config = self.dir.join(format!("sshd_config-{i}"));
        std::fs::write(
            &config,
            format!(
                "ListenAddress {ip}\n\
                 Port 22\n\
                 HostKey {dir}/host_key\n\
                 PidFile {dir}/sshd-{i}.pid\n\
                 AuthorizedKeysFile {dir}/authorized_keys\n\
                 PermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 SetEnv MONARCH_CACHE_DIR={dir}/remote-cache-{i}\n",
                ip = self.net.host_ip(i),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(self.dir.join(format!("sshd-{i}.log"))).unwrap();
        self.net
            .command(i, Path::new(SSHD))
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sshd")
    }

    /// Waits until host `i`'s sshd accepts connections.
    fn wait_for_sshd(&mut self, i: usize) {
        let addr = format!("{}:22", self.net.host_ip(i)).parse().unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.sshds[i].try_wait() {
                panic!("sshd {i} ended ({status}):\n{}", self.sshd_log(i));
            }
            assert!(
                Instant::now() < until,
                "sshd {i} does not listen:\n{}",
                self.sshd_log(i)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn sshd_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("sshd-{i}.log"))).unwrap_or_default()
    }

    /// `--hosts ssh:root@IP0,root@IP1`.
    fn spec(&self) -> String {
        format!(
            "ssh:root@{},root@{}",
            self.net.host_ip(0),
            self.net.host_ip(1)
        )
    }

    /// `$MONARCH_SSH` with `key`.
    fn ssh_command(&self, key: &Path) -> String {
        format!(
            "ssh -i {} -o IdentitiesOnly=yes -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
            key.display()
        )
    }

    /// Runs `monarch-host run ARGS` with the key the hosts accept,
    /// watching for `token`; see [`Watch`].
    fn run_watched(&self, args: &[&str], token: Option<&str>) -> (cli::Command, Seen) {
        self.run(args, &self.key, &[], token)
    }

    /// Runs `monarch-host run ARGS` with `key` and `extra` variables,
    /// while watching every process; see [`Watch`].
    fn run(
        &self,
        args: &[&str],
        key: &Path,
        extra: &[(&str, &str)],
        token: Option<&str>,
    ) -> (cli::Command, Seen) {
        let ssh = self.ssh_command(key);
        let remote_dir = self.remote_dir.display().to_string();
        let cache = self.cache.display().to_string();
        let mut env = vec![
            ("MONARCH_SSH", ssh.as_str()),
            ("MONARCH_SSH_REMOTE_DIR", remote_dir.as_str()),
            ("MONARCH_CACHE_DIR", cache.as_str()),
        ];
        env.extend_from_slice(extra);
        let watch = Watch::start(
            self.remote_dir.clone(),
            key.to_path_buf(),
            token.map(str::to_string),
        );
        let run = cli::monarch_host_env(args, RUN_LIMIT, &env);
        (run, watch.stop())
    }

    /// The namespace inode of host `i`.
    fn netns_inode(&self, i: usize) -> u64 {
        let path = format!("/run/netns/{}", self.net.namespace(i));
        std::fs::metadata(&path).unwrap().ino()
    }

    /// Waits until no process runs the copied binary: no agent, no proc.
    fn assert_nothing_left(&self) {
        let until = Instant::now() + STOP_LIMIT;
        loop {
            let left: Vec<(u32, Vec<String>)> = processes()
                .into_iter()
                .filter(|(_, argv)| runs_from(argv, &self.remote_dir))
                .collect();
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < until,
                "still running {STOP_LIMIT:?} after the run: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The files in the remote directory, with their sizes and modes.
    fn remote_files(&self) -> Vec<(String, u64, u32)> {
        let Ok(entries) = std::fs::read_dir(&self.remote_dir) else {
            return Vec::new();
        };
        let mut files: Vec<_> = entries
            .flatten()
            .map(|e| {
                let meta = e.metadata().unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    meta.len(),
                    meta.permissions().mode() & 0o777,
                )
            })
            .collect();
        files.sort();
        files
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for sshd in &mut self.sshds {
            let _ = sshd.kill();
            let _ = sshd.wait();
        }
        // Whatever a failed test left running from the copied binary.
        for (pid, argv) in processes() {
            if runs_from(&argv, &self.remote_dir) {
                // SAFETY: kill(2) with a pid and a signal number.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "monarch-ssh-test",
            "-f",
        ])
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .expect("run ssh-keygen");
    assert!(status.success(), "ssh-keygen {}: {status}", path.display());
}

/// Every process: its pid and argv.
fn processes() -> Vec<(u32, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, argv_of(pid)?)))
        .collect()
}

/// Process `pid`'s argv, from `/proc`.
fn argv_of(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Whether `argv` runs a binary from `dir`.
fn runs_from(argv: &[String], dir: &Path) -> bool {
    argv.first()
        .is_some_and(|program| Path::new(program).starts_with(dir))
}

/// What a [`Watch`] saw.
#[derive(Default, Debug)]
struct Seen {
    /// The argv of each agent.
    agents: BTreeSet<Vec<String>>,
    /// The network namespace inodes of the processes the agents started.
    proc_namespaces: BTreeSet<u64>,
    /// Processes whose argv or environment held the token, as `PID: WHERE`.
    leaks: BTreeSet<String>,
    /// When the first ssh with the test's key ran.
    first_ssh: Option<Instant>,
}

/// Watches every process while a run goes on: the agents and procs that
/// run from the remote directory, the first ssh, and whether any argv or
/// environment holds `token` (SSH-1).
struct Watch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Seen>,
}

impl Watch {
    fn start(remote_dir: PathBuf, key: PathBuf, token: Option<String>) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let key = key.display().to_string();
        let thread = std::thread::spawn(move || {
            let mut seen = Seen::default();
            let mut last = false;
            while !last {
                last = stopped.load(Ordering::SeqCst);
                for (pid, argv) in processes() {
                    if seen.first_ssh.is_none() && argv.contains(&key) {
                        seen.first_ssh = Some(Instant::now());
                    }
                    let ours = runs_from(&argv, &remote_dir);
                    let agent = ours && argv.get(1).map(String::as_str) == Some("agent");
                    if let Some(token) = &token {
                        // A proc has the token in its environment: its agent
                        // hands it the mesh's bootstrap config there.
                        let environ = !ours || agent;
                        seen.leaks.extend(leaks(pid, &argv, token, environ));
                    }
                    if !ours {
                        continue;
                    }
                    if agent {
                        seen.agents.insert(argv);
                    } else if let Some(inode) = netns_of(pid) {
                        seen.proc_namespaces.insert(inode);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        });
        Watch { stop, thread }
    }

    fn stop(self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the watch panicked")
    }
}

/// The inode of process `pid`'s network namespace.
fn netns_of(pid: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let link = link.to_string_lossy();
    link.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// Where process `pid`, seen running `argv`, holds `token`: `PID:
/// cmdline`, or with `environ` also `PID: environ`. An environment read
/// after the process exec'd something else (a proc its agent just
/// started, seen with the agent's argv) is not counted: it is the new
/// program's, which the next look classifies by its own argv.
fn leaks(pid: u32, argv: &[String], token: &str, environ: bool) -> Vec<String> {
    let places: &[&str] = match environ {
        true => &["cmdline", "environ"],
        false => &["cmdline"],
    };
    places
        .iter()
        .filter(|what| {
            std::fs::read(format!("/proc/{pid}/{what}"))
                .is_ok_and(|raw| String::from_utf8_lossy(&raw).contains(token))
                && (**what != "environ" || argv_of(pid).as_deref() == Some(argv))
        })
        .map(|what| format!("{pid}: {what}"))
        .collect()
}

/// The agent argv that `run --hosts ssh:` gives host `i` (SSH-1: no token).
fn agent_argv(hosts: &Hosts, binary: &str, i: usize) -> Vec<String> {
    let ip = hosts.net.host_ip(i);
    let argv = [
        &hosts.remote_dir.join(binary).display().to_string(),
        "agent",
        "--listen",
        &format!("{ip}:0"),
        "--token-file",
        "-",
        "--node",
        &ip,
        "--idle-exit",
        "0",
        "--insecure",
    ];
    argv.iter().map(|a| a.to_string()).collect()
}

/// SSH-1, SSH-3, SSH-4: two runs over ssh. The first copies the binary to
/// both hosts, the second finds it there; both run ranks on both hosts,
/// and leave no agent or proc behind; the token is in no argv or
/// environment while the agents run.
#[test]
fn runs_start_agents_over_ssh_copy_once_and_leave_nothing_behind() {
    if skip() {
        return;
    }
    let hosts = Hosts::new();
    let (ip0, ip1) = (hosts.net.host_ip(0), hosts.net.host_ip(1));
    let both: BTreeSet<u64> = [hosts.netns_inode(0), hosts.netns_inode(1)].into();
    let token = "ssh-test-token-0123456789abcdef";
    let token_file = hosts.dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let token_file = token_file.display().to_string();
    let spec = hosts.spec();

    // The first run copies the binary to both hosts.
    let args = [
        "--hosts",
        &spec,
        "--token-file",
        &token_file,
        env!("GUEST_HELLO"),
    ];
    let (run, seen) = hosts.run_watched(&args, Some(token));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        !run.lines_with("hello from rank 3 of 4").is_empty(),
        "{run:?}"
    );
    for ip in [&ip0, &ip1] {
        let copying = "monarch-host: copying monarch-host (";
        let line = run
            .stderr
            .lines()
            .find(|l| l.starts_with(copying) && l.contains(&format!("MB) to root@{ip} ...")));
        assert!(line.is_some(), "no copy to {ip}: {run:?}");
    }
    let files = hosts.remote_files();
    assert_eq!(files.len(), 1, "one binary, no temporary file: {files:?}");
    let (binary, size, mode) = &files[0];
    let local = std::fs::metadata(env!("CARGO_BIN_EXE_monarch-host-cli")).unwrap();
    assert_eq!(*size, local.len());
    assert_eq!(*mode, 0o755);
    let version = env!("CARGO_PKG_VERSION");
    let hash = binary
        .strip_prefix(&format!("monarch-host-{version}-"))
        .unwrap_or_else(|| panic!("{binary} is not monarch-host-{version}-HASH"));
    assert!(
        hash.len() == 12 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{binary}"
    );
    let expected: BTreeSet<Vec<String>> = (0..2).map(|i| agent_argv(&hosts, binary, i)).collect();
    assert_eq!(seen.agents, expected, "the agents' argv");
    assert!(seen.leaks.is_empty(), "the token leaked: {:?}", seen.leaks);
    assert_eq!(seen.proc_namespaces, both, "procs on both hosts: {seen:?}");
    hosts.assert_nothing_left();

    // The second, with a fresh token, finds the binary on both hosts.
    let args = ["--hosts", &spec, env!("GUEST_SEMANTICS"), "--", "print"];
    let (run, seen) = hosts.run_watched(&args, None);
    assert_eq!(run.code, Some(0), "{run:?}");
    for line in [
        "[printers 0] hello from 0",
        "[printers 1] err: hello from 1",
    ] {
        assert!(
            run.stdout.iter().any(|(_, l)| l == line),
            "{line:?} in {run:?}"
        );
    }
    assert!(!run.stderr.contains("copying"), "{run:?}");
    for ip in [&ip0, &ip1] {
        let already = format!("monarch-host: root@{ip} has monarch-host {version} already");
        assert!(run.stderr.contains(&already), "{already:?} in {run:?}");
    }
    assert_eq!(hosts.remote_files(), files);
    assert_eq!(seen.agents, expected, "the agents' argv");
    assert_eq!(seen.proc_namespaces, both, "procs on both hosts: {seen:?}");
    hosts.assert_nothing_left();
}

/// SSH-2, SSH-5, SSH-6: a key the hosts refuse, and a host that is down,
/// fail the run by name within the timeout, and leave nothing running and
/// nothing copied.
#[test]
fn a_refused_key_or_a_host_that_is_down_fails_by_name_within_the_timeout() {
    if skip() {
        return;
    }
    let hosts = Hosts::new();
    let (ip0, ip1) = (hosts.net.host_ip(0), hosts.net.host_ip(1));
    let spec = hosts.spec();
    let args = ["--hosts", &spec, env!("GUEST_HELLO")];

    let (run, seen) = hosts.run(&args, &hosts.wrong_key, &[], None);
    assert_ne!(run.code, Some(0), "{run:?}");
    // The first host to refuse is named; the other's ssh is cut short.
    let named = [&ip0, &ip1].iter().any(|ip| {
        run.stderr
            .contains(&format!("cannot run a command on root@{ip} over ssh"))
    });
    assert!(named, "{run:?}");
    assert!(
        run.stderr.contains("Permission denied (publickey)"),
        "{run:?}"
    );
    assert!(seen.agents.is_empty(), "{seen:?}");
    assert!(
        hosts.remote_files().is_empty(),
        "{:?}",
        hosts.remote_files()
    );

    // Host 1 is down: its port on the bridge drops everything.
    hosts.net.partition(1).unwrap();
    let timeout = 3;
    let (run, seen) = hosts.run(
        &args,
        &hosts.key,
        &[("MONARCH_SSH_TIMEOUT", &timeout.to_string())],
        None,
    );
    assert_ne!(run.code, Some(0), "{run:?}");
    let first_ssh = seen.first_ssh.expect("ssh ran");
    let failed_after = first_ssh.elapsed();
    assert!(
        failed_after < Duration::from_secs(timeout + 5),
        "failed {failed_after:?} after the first ssh: {run:?}"
    );
    let error = run
        .stderr
        .lines()
        .find(|l| l.starts_with("monarch-host: error:"))
        .unwrap_or_else(|| panic!("no error line: {run:?}"));
    assert!(error.contains(&format!("root@{ip1}")), "{run:?}");
    assert!(
        !error.contains(&format!("root@{ip0}")),
        "only host 1 failed: {run:?}"
    );
    hosts.assert_nothing_left();
    // Host 0 answered, but nothing is copied before every host has.
    assert!(
        hosts.remote_files().is_empty(),
        "{:?}",
        hosts.remote_files()
    );
}
