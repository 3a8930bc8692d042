//! Slurm: agents placed by `sbatch`, one per node, each on a port of its
//! own, found through files they write where the cluster's scratch
//! directory is (a filesystem the nodes share).
//!
//! - SL-1: nodes are read in a version-independent way: `squeue -o` text
//!   and this crate's own host-list expansion (not `squeue --json`, whose
//!   shape changed between 22.05 and 24.x; [`parse_squeue_json`] reads
//!   both for `slurm status`, and falls back to the text).
//! - SL-2: each agent listens on port 0 and writes `tcp:IP:PORT` to
//!   `agents/RANK_NODE.addr`, so agents sharing an address (several tasks
//!   per node, or simulated nodes) never collide.
//! - SL-3: nothing dangles: agents exit after `--idle-exit` without a
//!   controller, which ends the job step and so the allocation; batch mode
//!   ends the allocation with the program.
//! - SL-4: the token is in a file only (CL-1): the batch script names the
//!   file, and slurmctld (which keeps batch scripts) never sees the token.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Agent, ClusterError, command_output};

/// How long one Slurm command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// What `slurm up` and `slurm run` ask Slurm for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmSpec {
    /// The cluster's name (the job is `monarch-NAME`).
    pub name: String,
    /// Nodes, one agent each.
    pub nodes: u32,
    /// `--partition`.
    pub partition: Option<String>,
    /// `--time` (Slurm's formats: `MM`, `HH:MM:SS`, `D-HH`).
    pub time: Option<String>,
    /// `--gpus-per-node`.
    pub gpus_per_node: Option<u32>,
    /// `--account`.
    pub account: Option<String>,
    /// `--qos`.
    pub qos: Option<String>,
    /// More `sbatch` arguments, as given.
    pub sbatch_args: Vec<String>,
    /// Seconds an agent waits without a controller before it exits.
    pub idle_exit_s: u64,
}

impl SlurmSpec {
    /// The flags as a map, kept in the cluster file: a later `up` of the
    /// same name compares them.
    pub fn flags(&self) -> BTreeMap<String, String> {
        let mut flags = BTreeMap::new();
        flags.insert("nodes".into(), self.nodes.to_string());
        let optional = [
            ("partition", self.partition.clone()),
            ("time", self.time.clone()),
            ("gpus-per-node", self.gpus_per_node.map(|g| g.to_string())),
            ("account", self.account.clone()),
            ("qos", self.qos.clone()),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                flags.insert(key.into(), value);
            }
        }
        if !self.sbatch_args.is_empty() {
            flags.insert("sbatch-arg".into(), self.sbatch_args.join(" "));
        }
        flags.insert("idle-exit".into(), self.idle_exit_s.to_string());
        flags
    }

    /// `sbatch`'s arguments, the script excepted.
    pub fn sbatch_args(&self, output: &Path) -> Vec<String> {
        let mut args = vec![
            "--parsable".to_string(),
            format!("--job-name=monarch-{}", self.name),
            format!("--nodes={}", self.nodes),
            "--ntasks-per-node=1".to_string(),
            format!("--output={}", output.display()),
        ];
        let optional = [
            ("--partition", self.partition.clone()),
            ("--time", self.time.clone()),
            ("--gpus-per-node", self.gpus_per_node.map(|g| g.to_string())),
            ("--account", self.account.clone()),
            ("--qos", self.qos.clone()),
        ];
        for (flag, value) in optional {
            if let Some(value) = value {
                args.push(format!("{flag}={value}"));
            }
        }
        args.extend(self.sbatch_args.iter().cloned());
        args
    }
}

/// Quotes `text` for a POSIX shell.
pub fn sh_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:=+@%,".contains(c))
    {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The files of one job of a cluster, under its scratch directory.
#[derive(Debug, Clone)]
pub struct JobFiles {
    /// The scratch directory.
    pub dir: PathBuf,
}

impl JobFiles {
    /// The batch script of the next job.
    pub fn script(&self) -> PathBuf {
        self.dir.join("job.sbatch")
    }

    /// The job's output (`%j` is the job id).
    pub fn output_pattern(&self) -> PathBuf {
        self.dir.join("slurm-%j.out")
    }

    /// Job `job_id`'s output.
    pub fn output(&self, job_id: &str) -> PathBuf {
        self.dir.join(format!("slurm-{job_id}.out"))
    }

    /// Where job `job_id`'s agents write their addresses (SL-2).
    pub fn agents(&self, job_id: &str) -> PathBuf {
        self.dir.join(job_id).join("agents")
    }

    /// Where batch mode writes the program's exit status.
    pub fn status(&self, job_id: &str) -> PathBuf {
        self.dir.join(job_id).join("status")
    }
}

/// The `srun` line that starts one agent per node (SL-2, SL-4). `$AGENTS`
/// is set by the script to the job's agents directory.
fn srun_agents(binary: &Path, token_file: &Path, idle_exit_s: u64) -> String {
    // The node's address is Slurm's NodeAddr (an IP or a name), else the
    // node's name. Arguments pass as $0..$3, never spliced into the code.
    let body = r#"node="$SLURMD_NODENAME"; addr=$(scontrol show node "$node" -o 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p'); exec "$0" agent --listen "${addr:-$node}:0" --token-file "$1" --address-file "$2/${SLURM_PROCID}_$node.addr" --idle-exit "$3" --node "$node" --insecure"#;
    format!(
        "srun --quiet --ntasks-per-node=1 --kill-on-bad-exit=0 /bin/sh -c {} {} {} \"$AGENTS\" {}",
        sh_quote(body),
        sh_quote(&binary.display().to_string()),
        sh_quote(&token_file.display().to_string()),
        idle_exit_s
    )
}

/// The batch script of `slurm up`: agents only; the job ends when they
/// exit (SL-3).
pub fn up_script(spec: &SlurmSpec, binary: &Path, token_file: &Path, files: &JobFiles) -> String {
    format!(
        "#!/bin/sh\n\
         # monarch-host slurm up --name {name}: one agent per node. The job ends\n\
         # when they exit: on scancel (slurm down), or {idle}s without a controller.\n\
         AGENTS={dir}/\"$SLURM_JOB_ID\"/agents\n\
         mkdir -p \"$AGENTS\" || exit 1\n\
         {srun}\n",
        name = spec.name,
        idle = spec.idle_exit_s,
        dir = sh_quote(&files.dir.display().to_string()),
        srun = srun_agents(binary, token_file, spec.idle_exit_s),
    )
}

/// The batch script of `slurm run`: agents on every node, the controller
/// (`monarch-host run --hosts-file ... RUN_ARGS`) on the first; the job,
/// and so the allocation, ends with the program (SL-3).
pub fn run_script(
    spec: &SlurmSpec,
    binary: &Path,
    token_file: &Path,
    files: &JobFiles,
    run_args: &[String],
    agents_timeout_s: u64,
) -> String {
    let run = run_args
        .iter()
        .map(|a| sh_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "#!/bin/sh\n\
         # monarch-host slurm run: agents on {nodes} nodes, the program on this one;\n\
         # the allocation ends with the program.\n\
         JOB={dir}/\"$SLURM_JOB_ID\"\n\
         AGENTS=\"$JOB/agents\"\n\
         mkdir -p \"$AGENTS\" || exit 1\n\
         {srun} > \"$JOB/agents.log\" 2>&1 &\n\
         agents=$!\n\
         waited=0\n\
         while [ \"$(ls \"$AGENTS\" | grep -c '\\.addr$')\" -lt {nodes} ]; do\n\
         \x20   if ! kill -0 \"$agents\" 2>/dev/null || [ \"$waited\" -ge {timeout_ds} ]; then\n\
         \x20       echo \"monarch-host slurm run: the agents did not all start:\" >&2\n\
         \x20       cat \"$JOB/agents.log\" >&2\n\
         \x20       kill \"$agents\" 2>/dev/null; echo 1 > \"$JOB/status\"; exit 1\n\
         \x20   fi\n\
         \x20   sleep 0.1; waited=$((waited + 1))\n\
         done\n\
         cat \"$AGENTS\"/*.addr > \"$JOB/hosts\"\n\
         {binary} run --hosts-file \"$JOB/hosts\" --token-file {token} {run}\n\
         status=$?\n\
         echo \"$status\" > \"$JOB/status\"\n\
         kill \"$agents\" 2>/dev/null\n\
         wait \"$agents\"\n\
         exit \"$status\"\n",
        nodes = spec.nodes,
        dir = sh_quote(&files.dir.display().to_string()),
        srun = srun_agents(binary, token_file, spec.idle_exit_s),
        timeout_ds = agents_timeout_s * 10,
        binary = sh_quote(&binary.display().to_string()),
        token = sh_quote(&token_file.display().to_string()),
    )
}

/// The job id in `sbatch --parsable`'s answer (`123` or `123;cluster`).
pub fn parse_job_id(stdout: &str) -> Result<String, ClusterError> {
    let id = stdout.trim().split(';').next().unwrap_or("").trim();
    match !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()) {
        true => Ok(id.to_string()),
        false => Err(ClusterError::Scheduler(format!(
            "sbatch answered `{}`, not a job id",
            stdout.trim()
        ))),
    }
}

/// A job as `squeue` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// The job id.
    pub job_id: String,
    /// PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, ...
    pub state: String,
    /// Why it pends or ended (`Resources`, `None`, ...).
    pub reason: String,
    /// Time left, as Slurm writes it (`9:58`, `UNLIMITED`), when known.
    pub time_left: Option<String>,
    /// Its nodes, expanded, once it has some.
    pub nodes: Vec<String>,
}

impl JobInfo {
    /// Whether the job is over (its nodes are free, or being freed).
    pub fn is_over(&self) -> bool {
        is_terminal(&self.state)
    }
}

/// Whether `state` is one a job does not leave.
pub fn is_terminal(state: &str) -> bool {
    !matches!(
        state,
        "PENDING"
            | "RUNNING"
            | "CONFIGURING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "REQUEUE_HOLD"
            | "REQUEUE_FED"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "RESV_DEL_HOLD"
            | "STOPPED"
    )
}

/// The squeue format [`parse_squeue_line`] reads (SL-1).
pub const SQUEUE_FORMAT: &str = "%i|%T|%r|%L|%N";

/// Reads one line of `squeue -h -o SQUEUE_FORMAT`.
pub fn parse_squeue_line(line: &str) -> Result<JobInfo, ClusterError> {
    let fields: Vec<&str> = line.trim().split('|').collect();
    let [id, state, reason, left, nodes] = fields[..] else {
        return Err(ClusterError::Scheduler(format!(
            "cannot read squeue's line `{}`",
            line.trim()
        )));
    };
    Ok(JobInfo {
        job_id: id.to_string(),
        state: state.to_string(),
        reason: reason.to_string(),
        time_left: Some(left.to_string()).filter(|l| !l.is_empty() && l != "INVALID"),
        nodes: crate::hostlist::expand(nodes)?,
    })
}

/// Job `job_id` as `squeue` shows it (also once over, while slurmctld
/// remembers it); None when it does not know the job.
pub fn job(job_id: &str) -> Result<Option<JobInfo>, ClusterError> {
    let out = command_output(
        "squeue",
        &["-h", "-t", "all", "-j", job_id, "-o", SQUEUE_FORMAT],
        COMMAND_TIMEOUT,
    );
    let out = match out {
        Ok(out) => out,
        // squeue fails for a job id it has forgotten.
        Err(ClusterError::Scheduler(e)) if e.contains("Invalid job id") => return Ok(None),
        Err(e) => return Err(e),
    };
    match out.lines().find(|l| l.split('|').next() == Some(job_id)) {
        Some(line) => parse_squeue_line(line).map(Some),
        None => Ok(None),
    }
}

/// Job `job_id` in `squeue --json`'s output, in the shape of Slurm 22.05
/// (`job_state` a string, times plain numbers) or of 23.x and 24.x
/// (`job_state` a list, times `{set, infinite, number}`) (SL-1).
pub fn parse_squeue_json(
    text: &str,
    job_id: &str,
    now_unix: u64,
) -> Result<Option<JobInfo>, ClusterError> {
    let bad = |why: String| ClusterError::Scheduler(format!("cannot read squeue --json: {why}"));
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let jobs = value["jobs"]
        .as_array()
        .ok_or_else(|| bad("no `jobs` list".into()))?;
    let Some(job) = jobs
        .iter()
        .find(|j| number(&j["job_id"]).map(|n| n.to_string()).as_deref() == Some(job_id))
    else {
        return Ok(None);
    };
    let state = match &job["job_state"] {
        serde_json::Value::String(state) => state.clone(),
        // 23.02 on: a list of the base state and its flags.
        serde_json::Value::Array(states) => states
            .first()
            .and_then(|s| s.as_str())
            .unwrap_or("UNKNOWN")
            .to_string(),
        other => return Err(bad(format!("job_state is {other}"))),
    };
    let reason = job["state_reason"].as_str().unwrap_or("None").to_string();
    let nodes = crate::hostlist::expand(job["nodes"].as_str().unwrap_or(""))?;
    let time_left = match (
        state.as_str(),
        number(&job["end_time"]),
        infinite(&job["time_limit"]),
    ) {
        ("RUNNING", _, true) => Some("UNLIMITED".to_string()),
        ("RUNNING", Some(end), false) => Some(format_left(end.saturating_sub(now_unix))),
        _ => None,
    };
    Ok(Some(JobInfo {
        job_id: job_id.to_string(),
        state,
        reason,
        time_left,
        nodes,
    }))
}

/// A number in either shape: `5` or `{"set": true, "number": 5}`.
fn number(value: &serde_json::Value) -> Option<u64> {
    match value {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::Object(o) if o.get("set").and_then(|s| s.as_bool()) != Some(false) => {
            o.get("number").and_then(|n| n.as_u64())
        }
        _ => None,
    }
}

/// Whether a time limit is unlimited, in either shape (22.05 writes no
/// number, or a huge one).
fn infinite(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Object(o) => o.get("infinite").and_then(|i| i.as_bool()) == Some(true),
        serde_json::Value::Number(n) => n.as_u64().is_none_or(|n| n >= u32::MAX as u64 - 1),
        _ => true,
    }
}

/// Seconds as Slurm writes time left: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`.
fn format_left(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    match (d, h) {
        (0, 0) => format!("{m}:{s:02}"),
        (0, _) => format!("{h}:{m:02}:{s:02}"),
        _ => format!("{d}-{h:02}:{m:02}:{s:02}"),
    }
}

/// Job `job_id` through `squeue --json` where this Slurm has it, else the
/// text format.
pub fn job_detailed(job_id: &str) -> Result<Option<JobInfo>, ClusterError> {
    if let Ok(text) = command_output("squeue", &["--json"], COMMAND_TIMEOUT)
        && let Ok(Some(info)) = parse_squeue_json(&text, job_id, crate::now_unix())
    {
        return Ok(Some(info));
    }
    job(job_id)
}

/// Submits `script` with `spec`'s flags; returns the job id.
pub fn submit(spec: &SlurmSpec, script: &Path, files: &JobFiles) -> Result<String, ClusterError> {
    let mut args = spec.sbatch_args(&files.output_pattern());
    args.push(script.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    parse_job_id(&command_output("sbatch", &args, COMMAND_TIMEOUT)?)
}

/// Waits until job `job_id` runs, saying on `progress` what it waits for
/// (whenever that changes, and every 10 s); a job that ends first is an
/// error.
pub fn wait_running(
    job_id: &str,
    timeout: Duration,
    progress: &dyn Fn(&str),
) -> Result<JobInfo, ClusterError> {
    let info = wait_started(job_id, timeout, progress)?;
    match info.is_over() {
        false => Ok(info),
        true => Err(ClusterError::Scheduler(format!(
            "job {job_id} ended {} ({}) before it ran",
            info.state, info.reason
        ))),
    }
}

/// Waits until job `job_id` has left the queue (it runs, or it already
/// ran and ended), saying on `progress` what it waits for.
pub fn wait_started(
    job_id: &str,
    timeout: Duration,
    progress: &dyn Fn(&str),
) -> Result<JobInfo, ClusterError> {
    let started = Instant::now();
    let mut said = (String::new(), Instant::now());
    loop {
        let info = job(job_id)?.ok_or_else(|| {
            ClusterError::Scheduler(format!("Slurm no longer knows job {job_id}"))
        })?;
        if !matches!(info.state.as_str(), "PENDING" | "CONFIGURING" | "REQUEUED") {
            return Ok(info);
        }
        let now = format!("{} ({})", info.state, info.reason);
        if now != said.0 || said.1.elapsed() >= Duration::from_secs(10) {
            progress(&format!(
                "job {job_id} is {now}; waited {}s",
                started.elapsed().as_secs()
            ));
            said = (now, Instant::now());
        }
        if started.elapsed() >= timeout {
            return Err(ClusterError::Timeout(format!(
                "job {job_id} was still {} after {}s (--wait); it is left queued: cancel it with `scancel {job_id}` or `monarch-host slurm down`",
                said.0,
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Waits until `count` agents of job `job_id` have written where they
/// listen (SL-2); returns them in rank order.
pub fn wait_agents(
    files: &JobFiles,
    job_id: &str,
    count: usize,
    timeout: Duration,
    progress: &dyn Fn(&str),
) -> Result<Vec<Agent>, ClusterError> {
    let dir = files.agents(job_id);
    let started = Instant::now();
    let mut seen = usize::MAX;
    let mut polls = 0u32;
    loop {
        polls += 1;
        let agents = read_agents(&dir)?;
        if agents.len() >= count {
            return Ok(agents);
        }
        if agents.len() != seen {
            progress(&format!("{}/{count} agents listening", agents.len()));
            seen = agents.len();
        }
        // The files are read every 200 ms; Slurm is asked once a second.
        if polls.is_multiple_of(5)
            && let Some(info) = job(job_id)?
            && info.is_over()
        {
            return Err(ClusterError::Scheduler(format!(
                "job {job_id} ended {} ({}) before its agents started; see {}",
                info.state,
                info.reason,
                files.output(job_id).display()
            )));
        }
        if started.elapsed() >= timeout {
            return Err(ClusterError::Timeout(format!(
                "only {}/{count} agents of job {job_id} said where they listen within {}s; see {}",
                agents.len(),
                timeout.as_secs(),
                files.output(job_id).display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The agents that wrote `RANK_NODE.addr` files in `dir`, by rank.
pub fn read_agents(dir: &Path) -> Result<Vec<Agent>, ClusterError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ClusterError::io(format!("reading {}", dir.display()))(e)),
    };
    let mut agents = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".addr") else {
            continue;
        };
        let Some((rank, node)) = stem.split_once('_') else {
            continue;
        };
        let Ok(rank) = rank.parse::<u32>() else {
            continue;
        };
        let addr = std::fs::read_to_string(entry.path()).map_err(ClusterError::io(format!(
            "reading {}",
            entry.path().display()
        )))?;
        let addr = addr.trim();
        if addr.is_empty() {
            continue;
        }
        let addr = addr.strip_prefix("tcp:").unwrap_or(addr).to_string();
        agents.push((
            rank,
            Agent {
                node: node.to_string(),
                addr,
            },
        ));
    }
    agents.sort_by_key(|(rank, _)| *rank);
    Ok(agents.into_iter().map(|(_, a)| a).collect())
}

/// Cancels job `job_id` and waits until it is over; returns its last
/// state.
pub fn cancel(
    job_id: &str,
    timeout: Duration,
    progress: &dyn Fn(&str),
) -> Result<String, ClusterError> {
    command_output("scancel", &[job_id], COMMAND_TIMEOUT)?;
    let started = Instant::now();
    let mut said = String::new();
    loop {
        match job(job_id)? {
            None => return Ok("gone".into()),
            Some(info) if info.is_over() => return Ok(info.state),
            Some(info) => {
                if info.state != said {
                    progress(&format!("job {job_id} is {}", info.state));
                    said = info.state;
                }
            }
        }
        if started.elapsed() >= timeout {
            return Err(ClusterError::Timeout(format!(
                "job {job_id} was still {said} {}s after scancel",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Why job `job_id` is ending, as a state (CANCELLED, TIMEOUT,
/// PREEMPTED, NODE_FAIL), asked when its processes get SIGTERM: then
/// `squeue` says COMPLETING (or still RUNNING), and the reason tells which.
/// `SIGTERM` when Slurm cannot say.
pub fn ending_state(job_id: &str) -> String {
    for _ in 0..2 {
        let asked = crate::command_output_with(
            "squeue",
            &["-h", "-t", "all", "-j", job_id, "-o", "%T|%r"],
            Duration::from_secs(3),
            true,
        );
        if let Ok(out) = asked
            && let Some((state, reason)) = out.trim().split_once('|')
        {
            return ending(state, reason);
        }
    }
    "SIGTERM".to_string()
}

/// The end that `squeue`'s state and reason mean (see [`ending_state`]).
pub fn ending(state: &str, reason: &str) -> String {
    if !matches!(state, "RUNNING" | "COMPLETING" | "SIGNALING" | "") {
        return state.to_string();
    }
    let reason = reason.to_ascii_lowercase();
    if reason.contains("timelimit") {
        "TIMEOUT".into()
    } else if reason.contains("preempt") {
        "PREEMPTED".into()
    } else if reason.contains("nodedown")
        || reason.contains("node_fail")
        || reason.contains("nodefail")
    {
        "NODE_FAIL".into()
    } else {
        "CANCELLED".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SQUEUE_22_05: &str = include_str!("../tests/fixtures/squeue-22.05.json");
    const SQUEUE_24_11: &str = include_str!("../tests/fixtures/squeue-24.11.json");

    #[test]
    fn slurm_22_05_json_is_read() {
        // Captured from Debian's Slurm 22.05.8: job 3 runs on n[1-3] with
        // a 30-minute limit; job 2 was cancelled.
        let now = 1796247518 - 600;
        let info = parse_squeue_json(SQUEUE_22_05, "3", now).unwrap().unwrap();
        assert_eq!(info.state, "RUNNING");
        assert_eq!(info.nodes, ["n1", "n2", "n3"]);
        assert_eq!(info.time_left.as_deref(), Some("10:00"));
        let cancelled = parse_squeue_json(SQUEUE_22_05, "2", now).unwrap().unwrap();
        assert!(cancelled.is_over(), "{cancelled:?}");
        assert_eq!(cancelled.nodes, ["n1", "n2"]);
        let unlimited = parse_squeue_json(SQUEUE_22_05, "4", now).unwrap().unwrap();
        assert_eq!(unlimited.time_left.as_deref(), Some("UNLIMITED"));
        assert_eq!(parse_squeue_json(SQUEUE_22_05, "99", now).unwrap(), None);
    }

    #[test]
    fn slurm_24_11_json_is_read() {
        // The 24.11 shape: job_state is a list, times are {set, infinite,
        // number}, and a pending job has no nodes yet.
        let info = parse_squeue_json(SQUEUE_24_11, "525", 1755290346)
            .unwrap()
            .unwrap();
        assert_eq!(info.state, "RUNNING");
        assert_eq!(info.nodes, ["gpu001", "gpu002", "gpu003", "gpu004"]);
        assert_eq!(info.time_left.as_deref(), Some("1:00:00"));
        let pending = parse_squeue_json(SQUEUE_24_11, "526", 0).unwrap().unwrap();
        assert_eq!(
            (pending.state.as_str(), pending.reason.as_str()),
            ("PENDING", "Resources")
        );
        assert!(pending.nodes.is_empty() && pending.time_left.is_none());
        assert!(!pending.is_over());
    }

    #[test]
    fn a_job_ending_is_named_by_its_state_or_reason() {
        // What squeue says to an agent as SIGTERM comes (seen on 22.05:
        // `COMPLETING|None` for scancel, `TimeLimit` for a time limit).
        assert_eq!(ending("COMPLETING", "None"), "CANCELLED");
        assert_eq!(ending("COMPLETING", "TimeLimit"), "TIMEOUT");
        assert_eq!(ending("RUNNING", "Preemption"), "PREEMPTED");
        assert_eq!(ending("COMPLETING", "NodeDown"), "NODE_FAIL");
        assert_eq!(ending("TIMEOUT", "TimeLimit"), "TIMEOUT");
        assert_eq!(ending("NODE_FAIL", "None"), "NODE_FAIL");
    }

    #[test]
    fn text_lines_and_job_ids() {
        let info = parse_squeue_line("12|RUNNING|None|9:58|n[1-3]").unwrap();
        assert_eq!(info.nodes, ["n1", "n2", "n3"]);
        assert_eq!(info.time_left.as_deref(), Some("9:58"));
        let pending = parse_squeue_line("13|PENDING|Resources|10:00|").unwrap();
        assert!(pending.nodes.is_empty());
        assert!(parse_squeue_line("garbage").is_err());
        assert_eq!(parse_job_id("42\n").unwrap(), "42");
        assert_eq!(parse_job_id("42;cluster2\n").unwrap(), "42");
        let e = parse_job_id("sbatch: error: x").unwrap_err().to_string();
        assert!(e.contains("not a job id"), "{e}");
    }

    #[test]
    fn scripts_never_hold_the_token_and_quote_paths() {
        let spec = SlurmSpec {
            name: "t".into(),
            nodes: 3,
            idle_exit_s: 600,
            ..Default::default()
        };
        let files = JobFiles {
            dir: "/shared/it's here".into(),
        };
        let script = up_script(
            &spec,
            Path::new("/bin/monarch-host"),
            Path::new("/s/t.token"),
            &files,
        );
        assert!(script.contains(r#"'/shared/it'\''s here'"#), "{script}");
        assert!(
            script.contains("--token-file \"$1\"") && script.contains("/s/t.token"),
            "{script}"
        );
        assert!(
            script.contains("srun --quiet --ntasks-per-node=1"),
            "{script}"
        );
        let args = spec.sbatch_args(&files.output_pattern());
        assert!(
            args.contains(&"--nodes=3".to_string()) && args.contains(&"--parsable".to_string())
        );
    }

    #[test]
    fn flags_tell_specs_apart() {
        let a = SlurmSpec {
            name: "t".into(),
            nodes: 2,
            ..Default::default()
        };
        let b = SlurmSpec {
            nodes: 3,
            ..a.clone()
        };
        assert_ne!(a.flags(), b.flags());
        assert_eq!(a.flags(), a.clone().flags());
    }

    #[test]
    fn agents_files_are_read_by_rank() {
        let dir = std::env::temp_dir().join(format!("monarch-agents-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("1_n2.addr"), "tcp:127.0.0.1:2\n").unwrap();
        std::fs::write(dir.join("0_n1.addr"), "tcp:127.0.0.1:1\n").unwrap();
        std::fs::write(dir.join("2_n3.addr.tmp.7"), "half").unwrap();
        let agents = read_agents(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            agents,
            [
                Agent {
                    node: "n1".into(),
                    addr: "127.0.0.1:1".into()
                },
                Agent {
                    node: "n2".into(),
                    addr: "127.0.0.1:2".into()
                },
            ]
        );
    }
}
