//! TLS between hosts, as a user meets it: `monarch-host certs new`, agents
//! and controllers with `--tls-dir`, the refusal of a plain agent off
//! loopback, and what travels on the wire (hyperactor's TL-1, TL-2).

#[path = "support/cli.rs"]
mod cli;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cli::monarch_host_command;

const TOKEN: &str = "tls-test-token-7f3a9c";
const LIMIT: Duration = Duration::from_secs(120);

/// A fresh directory under the system's temporary one.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tls-test-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `monarch-host certs new --dir DIR ARGS...`, which must succeed.
fn certs_new(dir: &Path, args: &[&str]) {
    let dir = dir.display().to_string();
    let mut all = vec!["certs", "new", "--dir", &dir];
    all.extend_from_slice(args);
    let out = monarch_host_command(&all, LIMIT, &[]);
    assert_eq!(out.code, Some(0), "{out:?}");
}

/// A running `monarch-host agent`, killed when dropped.
struct Agent {
    child: Child,
    addr: String,
    /// Its stderr up to "serving on".
    said: String,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `monarch-host agent ARGS...` and waits until it says where it
/// serves; the rest of its stderr is drained.
fn agent(args: &[&str]) -> Agent {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .arg("agent")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start monarch-host agent");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !said.contains("serving on") {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 || Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent ended before serving: {said}");
        }
        said.push_str(&line);
    }
    std::thread::spawn(move || for _ in stderr.lines() {});
    let addr = said
        .split("serving on tcp:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    Agent { child, addr, said }
}

fn token_file(dir: &Path, token: &str) -> String {
    let path = dir.join(format!("token-{token}"));
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.display().to_string()
}

/// `monarch-host run hello.wasm --hosts HOSTS --token-file T EXTRA...`.
fn run_hello(hosts: &str, token: &str, extra: &[&str]) -> cli::Command {
    let mut args = vec![
        "run",
        env!("GUEST_HELLO"),
        "--hosts",
        hosts,
        "--token-file",
        token,
        "--heartbeat-timeout",
        "5",
    ];
    args.extend_from_slice(extra);
    monarch_host_command(&args, LIMIT, &[])
}

/// `certs new` writes the CA, a host pair and one pair per --hosts name
/// (keys private to their owner), and will not replace a CA unless told.
#[test]
fn certs_new_makes_a_cluster_ca_and_keeps_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("certs");
    let tls = dir.join("tls");
    certs_new(&tls, &["--hosts", "node1,10.0.0.7", "--days", "30"]);
    for file in [
        "ca.pem",
        "ca.key",
        "host.pem",
        "host.key",
        "node1/ca.pem",
        "node1/host.pem",
        "node1/host.key",
        "10.0.0.7/host.pem",
        "10.0.0.7/host.key",
    ] {
        assert!(tls.join(file).is_file(), "{file} is missing");
    }
    assert!(!tls.join("node1/ca.key").exists(), "a host got the CA key");
    for key in ["ca.key", "host.key", "node1/host.key"] {
        let mode = std::fs::metadata(tls.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key} is readable by others");
    }
    let ca = std::fs::read(tls.join("ca.pem")).unwrap();

    let again = monarch_host_command(
        &["certs", "new", "--dir", &tls.display().to_string()],
        LIMIT,
        &[],
    );
    assert_ne!(again.code, Some(0), "{again:?}");
    assert!(again.stderr.contains("--force"), "{again:?}");
    assert_eq!(
        std::fs::read(tls.join("ca.pem")).unwrap(),
        ca,
        "the CA changed"
    );

    certs_new(&tls, &["--force"]);
    assert_ne!(
        std::fs::read(tls.join("ca.pem")).unwrap(),
        ca,
        "--force kept the CA"
    );

    let bad = monarch_host_command(
        &[
            "certs",
            "new",
            "--dir",
            &dir.join("x").display().to_string(),
            "--hosts",
            "../up",
        ],
        LIMIT,
        &[],
    );
    assert_ne!(bad.code, Some(0), "{bad:?}");
    std::fs::remove_dir_all(dir).ok();
}

/// TL-1 end to end: an agent and a controller with `--tls-dir` from one
/// `certs new` run a program on the agent's procs; the token still
/// decides inside TLS; a controller with another CA's directory fails
/// soon, saying why.
#[test]
fn tl1_a_program_runs_on_an_agent_over_tls() {
    let dir = scratch("e2e");
    let tls = dir.join("tls");
    let other = dir.join("other");
    certs_new(&tls, &["--hosts", "agent"]);
    certs_new(&other, &[]);
    let token = token_file(&dir, TOKEN);
    let agent_dir = tls.join("agent").display().to_string();
    let agent = agent(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        &token,
        "--tls-dir",
        &agent_dir,
    ]);

    let tls_dir = tls.display().to_string();
    let out = run_hello(&agent.addr, &token, &["--tls-dir", &tls_dir]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        !out.lines_with("hello from rank 3 of 4").is_empty(),
        "{out:?}"
    );

    // The token still authorizes, inside TLS.
    let wrong = token_file(&dir, "wrong-token");
    let out = run_hello(&agent.addr, &wrong, &["--tls-dir", &tls_dir]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("cluster token"), "{out:?}");

    // Another cluster's certificates: refused, soon and by name.
    let other_dir = other.display().to_string();
    let out = run_hello(&agent.addr, &token, &["--tls-dir", &other_dir]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.stderr.contains("TLS"), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(60), "{out:?}");

    // A controller without TLS gets nowhere either.
    let out = run_hello(&agent.addr, &token, &[]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(60), "{out:?}");
    drop(agent);
    std::fs::remove_dir_all(dir).ok();
}

/// An agent asked to listen off loopback without TLS refuses, naming
/// the ways out; with --insecure it serves, warning that all is in clear.
#[test]
fn an_agent_off_loopback_needs_tls_or_insecure() {
    let dir = scratch("insecure");
    let token = token_file(&dir, TOKEN);
    let refused = monarch_host_command(
        &["agent", "--listen", "0.0.0.0:0", "--token-file", &token],
        LIMIT,
        &[],
    );
    assert_ne!(refused.code, Some(0), "{refused:?}");
    for needle in ["--tls-dir", "monarch-host certs new", "--insecure"] {
        assert!(refused.stderr.contains(needle), "{needle}: {refused:?}");
    }

    // An agent listens on one address of its machine, not on all.
    let Some(ip) = own_address() else {
        eprintln!("skipped the rest: this machine has no address off loopback");
        return;
    };
    let listen = format!("{ip}:0");
    let insecure = agent(&["--listen", &listen, "--token-file", &token, "--insecure"]);
    assert!(
        insecure.said.contains("WARNING") && insecure.said.contains("in clear"),
        "{}",
        insecure.said
    );
    drop(insecure);

    // With TLS it needs no --insecure, and warns of nothing.
    let tls = dir.join("tls");
    certs_new(&tls, &[]);
    let secure = agent(&[
        "--listen",
        &listen,
        "--token-file",
        &token,
        "--tls-dir",
        &tls.display().to_string(),
    ]);
    assert!(!secure.said.contains("WARNING"), "{}", secure.said);
    drop(secure);
    std::fs::remove_dir_all(dir).ok();
}

/// An IPv4 address of this machine off loopback, if it has one.
fn own_address() -> Option<std::net::Ipv4Addr> {
    let mut found = None;
    // SAFETY: getifaddrs hands a list that stays valid until freeifaddrs;
    // each entry's address, when not null, is a sockaddr of its family.
    unsafe {
        let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut addrs) != 0 {
            return None;
        }
        let mut entry = addrs;
        while !entry.is_null() && found.is_none() {
            let ifa = &*entry;
            if !ifa.ifa_addr.is_null() && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() && !ip.is_unspecified() {
                    found = Some(ip);
                }
            }
            entry = ifa.ifa_next;
        }
        libc::freeifaddrs(addrs);
    }
    found
}

/// A TCP relay on 127.0.0.1 to `target` that keeps every byte it passes,
/// both ways.
fn relay(target: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
    let kept = seen.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                let seen = kept.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64 << 10];
                    loop {
                        match from.read(&mut buf) {
                            Ok(0) | Err(_) => {
                                let _ = to.shutdown(std::net::Shutdown::Write);
                                return;
                            }
                            Ok(n) => {
                                seen.lock().unwrap().extend_from_slice(&buf[..n]);
                                if to.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        }
    });
    (addr, seen)
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// TL-1 on the wire: through a relay, a TLS agent's traffic never shows
/// the cluster token; a plain one's does (so the check can fail).
#[test]
fn tl1_the_token_never_crosses_the_wire_in_clear() {
    let dir = scratch("wire");
    let tls = dir.join("tls");
    certs_new(&tls, &[]);
    let tls_dir = tls.display().to_string();
    let token = token_file(&dir, TOKEN);
    for secure in [true, false] {
        let mut args = vec!["--listen", "127.0.0.1:0", "--token-file", &token];
        if secure {
            args.extend(["--tls-dir", &tls_dir]);
        }
        let agent = agent(&args);
        let (relayed, seen) = relay(agent.addr.clone());
        let extra: &[&str] = if secure {
            &["--tls-dir", &tls_dir]
        } else {
            &[]
        };
        let out = run_hello(&relayed, &token, extra);
        assert_eq!(out.code, Some(0), "{out:?}");
        let seen = seen.lock().unwrap();
        assert!(!seen.is_empty(), "nothing went through the relay");
        assert_eq!(
            holds(&seen, TOKEN.as_bytes()),
            !secure,
            "secure: {secure}, {} bytes seen",
            seen.len()
        );
    }
    std::fs::remove_dir_all(dir).ok();
}
