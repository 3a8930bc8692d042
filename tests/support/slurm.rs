//! A Slurm cluster on this machine for the tests: `munged`, `slurmctld`
//! and N `slurmd`s (nodes `n1`..`nN`, all at 127.0.0.1 on ports of their
//! own), from Debian's packages, in a scratch directory of their own and
//! stopped when dropped. Needs root (the daemons run as root).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct SlurmCluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
    /// Where cluster files go (`MONARCH_CLUSTER_DIR`).
    pub clusters: PathBuf,
    daemons: Vec<Child>,
}

impl SlurmCluster {
    /// Why the cluster cannot run here, if it cannot.
    pub fn unavailable() -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("the Slurm tests need root".into());
        }
        for program in [
            "/usr/sbin/munged",
            "/usr/sbin/slurmctld",
            "/usr/sbin/slurmd",
            "/usr/bin/sbatch",
        ] {
            if !Path::new(program).exists() {
                return Some(format!(
                    "{program} is missing: scripts/setup installs Slurm and munge"
                ));
            }
        }
        None
    }

    /// Starts a cluster of `nodes` nodes; panics if it does not come up.
    pub fn start(nodes: usize) -> SlurmCluster {
        let dir = std::env::temp_dir().join(format!(
            "monarch-slurm-{}-{}",
            std::process::id(),
            PORTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["state", "log", "munge", "clusters"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        for n in 1..=nodes {
            std::fs::create_dir_all(dir.join(format!("spool/n{n}"))).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("munge"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let key = dir.join("munge/key");
        std::fs::write(&key, random_key()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let socket = dir.join("munge/socket");
        let ports: Vec<u16> = (0..nodes + 2).map(|_| free_port()).collect();
        let mut conf = format!(
            "ClusterName=monarch{}\n\
             SlurmctldHost=localhost(127.0.0.1)\n\
             SlurmctldPort={}\n\
             SlurmdPort={}\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={socket}\n\
             CryptoType=crypto/munge\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             StateSaveLocation={dir}/state\n\
             SlurmdSpoolDir={dir}/spool/%n\n\
             SlurmctldPidFile={dir}/slurmctld.pid\n\
             SlurmdPidFile={dir}/slurmd-%n.pid\n\
             SlurmctldLogFile={dir}/log/slurmctld.log\n\
             SlurmdLogFile={dir}/log/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             SchedulerType=sched/backfill\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\n\
             ReturnToService=2\n\
             MpiDefault=none\n\
             SwitchType=switch/none\n\
             JobCompType=jobcomp/none\n\
             AccountingStorageType=accounting_storage/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             MinJobAge=300\n\
             KillWait=5\n\
             InactiveLimit=0\n\
             SlurmdTimeout=30\n",
            ports[0],
            ports[0],
            ports[1],
            socket = socket.display(),
            dir = dir.display(),
        );
        for n in 1..=nodes {
            conf += &format!(
                "NodeName=n{n} NodeAddr=127.0.0.1 Port={} CPUs=2 State=UNKNOWN\n",
                ports[n + 1]
            );
        }
        conf += &format!(
            "PartitionName=debug Nodes=n[1-{nodes}] Default=YES MaxTime=INFINITE State=UP\n"
        );
        let conf_path = dir.join("slurm.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let mut cluster = SlurmCluster {
            clusters: dir.join("clusters"),
            dir: dir.clone(),
            conf: conf_path.clone(),
            daemons: Vec::new(),
        };
        let log = |name: &str| std::fs::File::create(dir.join("log").join(name)).unwrap();
        cluster.spawn(
            Command::new("/usr/sbin/munged")
                .args(["-F", "--force"])
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--pid-file={}", dir.join("munge/pid").display()))
                .arg(format!("--log-file={}", dir.join("munge/log").display()))
                .arg(format!("--seed-file={}", dir.join("munge/seed").display()))
                .stdout(log("munged.out"))
                .stderr(log("munged.err")),
        );
        wait_until(Duration::from_secs(10), "munged's socket", || {
            socket.exists()
        });
        cluster.spawn(
            Command::new("/usr/sbin/slurmctld")
                .args(["-D", "-i", "-f"])
                .arg(&conf_path)
                .stdout(log("slurmctld.out"))
                .stderr(log("slurmctld.err")),
        );
        for n in 1..=nodes {
            cluster.spawn(
                Command::new("/usr/sbin/slurmd")
                    .args(["-D", "-N", &format!("n{n}"), "-f"])
                    .arg(&conf_path)
                    .stdout(log(&format!("slurmd-n{n}.out")))
                    .stderr(log(&format!("slurmd-n{n}.err"))),
            );
        }
        let want = format!("{nodes} idle");
        wait_until(Duration::from_secs(60), "every node idle", || {
            cluster
                .slurm("sinfo", &["-h", "-o", "%D %t"])
                .is_some_and(|out| out.trim() == want)
        });
        cluster
    }

    fn spawn(&mut self, command: &mut Command) {
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        self.daemons.push(child);
    }

    /// The environment a Slurm client, or `monarch-host`, needs here.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("SLURM_CONF".into(), self.conf.display().to_string()),
            (
                "MONARCH_CLUSTER_DIR".into(),
                self.clusters.display().to_string(),
            ),
        ]
    }

    /// Runs a Slurm client command; its stdout, or None if it failed.
    pub fn slurm(&self, program: &str, args: &[&str]) -> Option<String> {
        let out = Command::new(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The jobs Slurm has in its queue that are not over.
    pub fn active_jobs(&self) -> Vec<String> {
        self.slurm("squeue", &["-h", "-o", "%i %T"])
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// A job's state (`squeue -t all`).
    pub fn job_state(&self, job: &str) -> String {
        self.slurm("squeue", &["-h", "-t", "all", "-j", job, "-o", "%T"])
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The `monarch-host` processes that Slurm started for this cluster
    /// (agents, the procs they start, a batch job's controller): those
    /// with this cluster's SLURM_CONF in their environment, `monarch-host
    /// slurm` commands excepted.
    pub fn monarch_processes(&self) -> Vec<(u32, String)> {
        let mine = format!("SLURM_CONF={}", self.conf.display());
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let (Ok(cmdline), Ok(environ)) = (
                std::fs::read(entry.path().join("cmdline")),
                std::fs::read(entry.path().join("environ")),
            ) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let ours = environ.split(|b| *b == 0).any(|var| var == mine.as_bytes());
            let slurm_command = cmdline.split(' ').nth(1) == Some("slurm");
            let program = cmdline.split(' ').next().unwrap_or("");
            let monarch = Path::new(program)
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("monarch-host"));
            if ours && monarch && !slurm_command {
                found.push((pid, cmdline));
            }
        }
        found
    }

    /// The daemons' logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for entry in std::fs::read_dir(self.dir.join("log"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let body = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = body.lines().rev().take(15).collect();
            text += &format!("== {}\n", entry.path().display());
            for line in tail.into_iter().rev() {
                text += line;
                text += "\n";
            }
        }
        text
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        // Jobs first, so that slurmd ends their steps.
        let _ = self.slurm("scancel", &["--full", "-u", "root"]);
        std::thread::sleep(Duration::from_millis(300));
        for child in self.daemons.iter_mut().rev() {
            // SAFETY: signalling a child of this process.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let until = Instant::now() + Duration::from_secs(5);
        for child in self.daemons.iter_mut().rev() {
            while Instant::now() < until && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Anything of ours the daemons left behind.
        for (pid, _) in self.monarch_processes() {
            // SAFETY: killing a process this test's cluster started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static PORTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn random_key() -> Vec<u8> {
    use std::io::Read;
    let mut key = vec![0u8; 128];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut urandom| urandom.read_exact(&mut key))
        .expect("random bytes for munge's key");
    key
}

/// Polls `ready` until it holds; panics after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < until, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
