//! The HTTP API's types, shared by the server, its OpenAPI document and
//! the CLI client.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The stacks of a running job (`GET /v1/jobs/{id}/stacks`).
pub use crate::debug::stacks::Report as StacksReport;

/// An error: what went wrong, in a sentence.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// What went wrong.
    pub error: String,
}

/// An uploaded component.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ComponentInfo {
    /// The sha256 of its bytes, in hex: the same bytes get the same id.
    pub id: String,
    /// Its size in bytes.
    pub size: u64,
    /// The WIT world it was checked against.
    pub world: String,
    /// When it was first uploaded.
    pub uploaded_at_ms: i64,
}

/// The answer to an upload.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UploadReply {
    /// The component's id (its sha256).
    pub id: String,
    /// Its size in bytes.
    pub size: u64,
    /// The WIT world it was checked against.
    pub world: String,
    /// How long compiling took (0 when it was uploaded before).
    pub compile_ms: u64,
    /// Whether the same bytes had been uploaded before.
    pub existing: bool,
}

/// Uploaded components.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ComponentList {
    /// Newest first.
    pub components: Vec<ComponentInfo>,
}

/// Limits of one job; each is capped by the server's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Linear memory per instance, in MiB.
    pub memory_mib: u32,
    /// Wall-clock limit of the whole job, in seconds.
    pub timeout_s: u64,
    /// The default timeout of each call, in seconds.
    pub call_timeout_s: u64,
    /// The most procs a job on a fresh mesh may start.
    pub procs: u32,
    /// The default deadline of each actor handler on the job's meshes, in
    /// seconds, unless a mesh or a call sets its own; null: no deadline.
    pub handler_timeout_s: Option<f64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mib: 256,
            timeout_s: 300,
            call_timeout_s: 60,
            procs: 64,
            handler_timeout_s: None,
        }
    }
}

/// Where a job runs: a persistent mesh by name, or a fresh mesh.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MeshChoice {
    /// A persistent mesh (see `POST /v1/meshes`).
    Name(String),
    /// A fresh mesh of child procs, started as the job asks for them and
    /// stopped when it ends.
    Spec(MeshSpec),
}

/// A fresh mesh for one job.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshSpec {
    /// The most procs the job may start.
    pub procs: u32,
}

/// A job to run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    /// The component's id, from `POST /v1/components`.
    pub component: String,
    /// The arguments of the controller's `run`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Limits; the server's defaults where left out.
    #[serde(default)]
    pub limits: Option<PartialLimits>,
    /// Where the job runs; a fresh mesh when left out.
    #[serde(default)]
    pub mesh: Option<MeshChoice>,
    /// Directories of the server's machine preopened for the program and
    /// its actors, each `HOST[::GUEST][:ro|:rw]` (read-only unless `:rw`;
    /// guests see it at `GUEST`, else at `HOST`). `HOST` is an absolute
    /// path inside a directory the server allows (`serve --allow-dir`).
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Environment variables of the program and its actors, each
    /// `KEY=VALUE`.
    #[serde(default)]
    pub env: Vec<String>,
    /// Turns breakpoints on: an actor at one pauses until `monarch-host
    /// debug --server URL JOB` continues it (see docs/debugging.md).
    /// Without it breakpoints do nothing.
    #[serde(default)]
    pub debug: bool,
}

/// Where a debugger reaches a running job's debug hub
/// (`GET /v1/jobs/{id}/debug`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DebugEndpoint {
    /// The hub's TCP address, `IP:PORT`.
    pub addr: String,
    /// The secret the hub asks for.
    pub token: String,
}

/// Limits a job asks for; what it leaves out is the server's default.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PartialLimits {
    /// Linear memory per instance, in MiB.
    pub memory_mib: Option<u32>,
    /// Wall-clock limit of the whole job, in seconds.
    pub timeout_s: Option<u64>,
    /// The default timeout of each call, in seconds.
    pub call_timeout_s: Option<u64>,
    /// The most procs a job on a fresh mesh may start.
    pub procs: Option<u32>,
    /// The default deadline of each actor handler, in seconds (fractions
    /// allowed): more than 0, at most the server's cap of `timeout_s`.
    pub handler_timeout_s: Option<f64>,
}

/// The answer to a submission.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Created {
    /// The new job's id.
    pub id: u64,
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Waiting for a slot.
    Queued,
    /// Its controller runs.
    Running,
    /// `run` returned Ok.
    Succeeded,
    /// `run` returned an error, trapped, timed out, or the server failed.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl JobStatus {
    /// The status as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// Reads a status as the API spells it.
    pub fn parse(text: &str) -> Option<JobStatus> {
        Some(match text {
            "queued" => JobStatus::Queued,
            "running" => JobStatus::Running,
            "succeeded" => JobStatus::Succeeded,
            "failed" => JobStatus::Failed,
            "cancelled" => JobStatus::Cancelled,
            _ => return None,
        })
    }

    /// Whether the job has ended.
    pub fn is_final(self) -> bool {
        !matches!(self, JobStatus::Queued | JobStatus::Running)
    }
}

/// A job.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobInfo {
    /// Its id.
    pub id: u64,
    /// The component it runs.
    pub component: String,
    /// The arguments of `run`.
    pub args: Vec<String>,
    /// The persistent mesh it runs on; null for a fresh mesh.
    pub mesh: Option<String>,
    /// Where it stands.
    pub status: JobStatus,
    /// Why it failed or was cancelled.
    pub error: Option<String>,
    /// Its limits.
    pub limits: Limits,
    /// The directories granted to it, as `HOST::GUEST:ro|rw` with the
    /// host path resolved.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// The names of the environment variables granted to it (their values
    /// are not shown).
    #[serde(default)]
    pub env: Vec<String>,
    /// When it was submitted.
    pub created_at_ms: i64,
    /// When its controller started.
    pub started_at_ms: Option<i64>,
    /// When it ended.
    pub finished_at_ms: Option<i64>,
    /// The principal that submitted it (`-` on a server without tokens);
    /// null for a job of a server older than principals.
    #[serde(default)]
    pub owner: Option<String>,
    /// How long its controller ran (or has run, while it runs), in ms;
    /// null before it starts.
    #[serde(default)]
    pub duration_ms: Option<i64>,
}

/// Jobs.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    /// Newest first.
    pub jobs: Vec<JobInfo>,
}

/// How a log stream ended.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogEnd {
    /// The job's final status.
    pub status: JobStatus,
    /// Why it failed or was cancelled.
    pub error: Option<String>,
}

/// The post-mortem records of a job's trapped actors
/// (`GET /v1/jobs/{id}/dumps`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DumpList {
    /// The job.
    pub job: u64,
    /// Its records, by mesh and rank; each names its core dump (a file
    /// beside it, `GET /v1/jobs/{id}/dumps/{file}`), if any.
    pub dumps: Vec<crate::debug::dumps::Dump>,
}

/// A persistent mesh to create.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshRequest {
    /// Its name: letters, digits, `-` and `_`, at most 64.
    pub name: String,
    /// How many procs it has.
    pub procs: u32,
}

/// A proc of a mesh.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcInfo {
    /// Its rank in the mesh.
    pub rank: u32,
    /// Its address.
    pub id: String,
    /// `running` or `stopped`.
    pub state: String,
    /// Why it stopped.
    pub reason: Option<String>,
    /// Its OS process, where the server knows it (a persistent mesh's
    /// procs on this machine).
    #[serde(default)]
    pub pid: Option<u32>,
    /// How many times a dead proc at this rank of a persistent mesh was
    /// replaced by a new one.
    #[serde(default)]
    pub replaced: u32,
    /// The latest such replacement.
    #[serde(default)]
    pub last_replacement: Option<Replacement>,
}

/// A dead proc of a persistent mesh replaced by a new one at its rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Replacement {
    /// The rank.
    pub rank: u32,
    /// Why the old proc ended.
    pub reason: String,
    /// When it was replaced, in milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// One rank of an actor mesh.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RankInfo {
    /// The actor's rank.
    pub rank: u32,
    /// The rank of its proc in the mesh.
    pub proc: u32,
    /// `running`, `failed` or `stopped`.
    pub state: String,
    /// Why it failed or stopped.
    pub reason: Option<String>,
}

/// An actor mesh on a mesh's procs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActorsInfo {
    /// Its name (`j<job>.<name>` on a persistent mesh).
    pub name: String,
    /// The job that spawned it.
    pub job: u64,
    /// Its actor class.
    pub class: String,
    /// Its ranks.
    pub ranks: Vec<RankInfo>,
}

/// The principal a request is made as (`GET /v1/principal`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PrincipalInfo {
    /// Its name (`-` on a server without tokens).
    pub name: String,
    /// `admin` (sees and acts on everything) or `user` (on its own).
    pub role: String,
    /// Its quotas; null: no cap.
    pub max_jobs: Option<u64>,
    /// The most procs its unfinished jobs and persistent meshes may hold.
    pub max_procs: Option<u64>,
    /// The most Wasm memory its unfinished jobs may ask for, in MiB.
    pub max_memory_mib: Option<u64>,
    /// What it holds now: unfinished jobs (sessions included).
    pub jobs: u64,
    /// Procs held now.
    pub procs: u64,
    /// MiB of Wasm memory asked for now.
    pub memory_mib: u64,
}

/// A mesh: persistent, or a running job's fresh one.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MeshInfo {
    /// Its name (`job-<id>` for a job's fresh mesh).
    pub name: String,
    /// Whether it outlives jobs.
    pub persistent: bool,
    /// The job that owns a fresh mesh.
    pub job: Option<u64>,
    /// How many dead procs of a persistent mesh were replaced, in all.
    #[serde(default)]
    pub replaced: u64,
    /// The latest replacement.
    #[serde(default)]
    pub last_replacement: Option<Replacement>,
    /// Its procs.
    pub procs: Vec<ProcInfo>,
    /// The actor meshes on it.
    pub actors: Vec<ActorsInfo>,
}

/// A persistent actor mesh (`spawn(..., persist=True)`): it belongs to the
/// server, not to the job that spawned it; later jobs and sessions find it
/// with `lookup_actor_mesh(name)`, and `DELETE /v1/meshes/{name}` stops it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActorMeshInfo {
    /// Its name (letters, digits, `-` and `_`).
    pub name: String,
    /// Its actor class.
    pub class: String,
    /// The persistent mesh whose procs it runs on.
    pub mesh: String,
    /// Who spawned it (`job 7`).
    pub spawned_by: String,
    /// Its shape, as `[name, size]` pairs.
    pub extent: Vec<(String, u32)>,
    /// `running`, `failed` (a rank failed; the mesh runs on, and no job
    /// fails for it), `stopped`, or `lost` (it lived before the server's
    /// last restart, which does not restore it; no ranks).
    pub state: String,
    /// Why it failed (its first failed rank) or stopped.
    pub reason: Option<String>,
    /// Its ranks.
    pub ranks: Vec<RankInfo>,
}

/// Meshes.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MeshList {
    /// Persistent meshes first, by name, then fresh ones.
    pub meshes: Vec<MeshInfo>,
    /// Persistent actor meshes, by name.
    #[serde(default)]
    pub actor_meshes: Vec<ActorMeshInfo>,
}

/// What `DELETE /v1/meshes/{name}` stopped: a persistent mesh (with the
/// persistent actor meshes on it), or a persistent actor mesh.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StoppedMesh {
    /// A persistent mesh of procs.
    Procs(MeshInfo),
    /// A persistent actor mesh.
    Actors(ActorMeshInfo),
}

/// A request to open a console session (`POST /v1/sessions`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SessionRequest {
    /// Its name (letters, digits, `-`, `_`, `.`; at most 64); a free one
    /// (`s<job>`) when absent. A name in use by an active session is a
    /// 409.
    pub name: Option<String>,
    /// The component that runs it: an uploaded component of the
    /// `session` (or `session-program`) world; the built-in Python REPL
    /// when absent.
    pub component: Option<String>,
    /// The persistent mesh its procs come from (`serve --mesh`); fresh
    /// procs, stopped with the session, when absent.
    pub mesh: Option<String>,
    /// Seconds without input after which it is closed; the server's
    /// default (`serve --session-idle-ttl`, 8 h) when absent.
    pub idle_ttl_s: Option<u64>,
    /// Arguments of its `init`.
    pub args: Vec<String>,
    /// Limits of its instances, as a job's.
    pub limits: Option<PartialLimits>,
}

/// A console session.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    /// Its name.
    pub name: String,
    /// The job it runs as (its log, stacks and dumps are the job's).
    pub job: u64,
    /// The principal that owns it: its name in the tokens file, the
    /// fingerprint of a `--token-file` token (the first 12 hex digits of
    /// its sha256), or `-` on a server without tokens.
    pub owner: String,
    /// `starting`, `active`, `closed`, `expired`, `failed` or `lost`.
    pub state: String,
    /// Why it ended, for an ended one.
    pub reason: Option<String>,
    /// The persistent mesh it runs on, if any.
    pub mesh: Option<String>,
    /// The actor meshes it has spawned and not stopped.
    pub meshes: Vec<String>,
    /// Seconds since its last input (or its start).
    pub idle_s: u64,
    /// Its idle TTL, in seconds.
    pub idle_ttl_s: u64,
    /// Whether an input is running.
    pub busy: bool,
    /// The prompt for its next line.
    pub prompt: String,
    /// When it was opened.
    pub created_at_ms: i64,
}

/// Sessions, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    /// Active ones, then ended ones.
    pub sessions: Vec<SessionInfo>,
}

/// One line for a session (`POST /v1/sessions/{name}/input`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    /// The line, without its newline.
    pub line: String,
}

/// What an input came to; the same travels on the session's stream as a
/// `result` event, after the output the input printed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InputReply {
    /// The input's number in the session, from 1.
    pub seq: u64,
    /// Text to show (an expression's value); empty for none.
    pub output: Option<String>,
    /// An error to show (a traceback); the session goes on.
    pub error: Option<String>,
    /// The prompt for the next line.
    pub prompt: String,
}

/// The first event of a session's stream (`GET /v1/sessions/{name}/stream`):
/// what was printed since the last input began, then live `out` lines,
/// `result`s and, when it ends, `end`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionHello {
    /// The session.
    pub session: SessionInfo,
    /// Lines printed since its last input began (at most the last
    /// [`REPLAY_LINES`]).
    pub replay: Vec<String>,
    /// Whether older lines were dropped from `replay`.
    pub truncated: bool,
}

/// How many lines a session keeps for a re-attaching console.
pub const REPLAY_LINES: usize = 10_000;

/// The time series of `GET /v1/metrics/series`, and each sample of
/// `GET /v1/metrics/stream` (then each series has its newest point only).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetricsSeries {
    /// How often the server samples, in ms.
    pub interval_ms: u64,
    /// When this answer was made (ms since the epoch).
    pub now_ms: i64,
    /// One series per proc of a mesh.
    pub procs: Vec<ProcSeries>,
    /// One series per actor mesh that a job's controller called.
    pub meshes: Vec<ActorMeshSeries>,
    /// The jobs that ran within the window.
    pub jobs: Vec<JobSummary>,
}

/// The samples of one proc.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcSeries {
    /// Its mesh: a persistent mesh's name, or `job-<id>` for a job's fresh one.
    pub mesh: String,
    /// Its rank in the mesh.
    pub rank: u32,
    /// Its proc id.
    pub proc: String,
    /// Its OS process, when known.
    pub pid: Option<u32>,
    /// The job of a fresh mesh; null for a persistent mesh's proc.
    pub job: Option<u64>,
    /// Oldest first.
    pub points: Vec<ProcPoint>,
}

/// One sample of a proc.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcPoint {
    /// When (ms since the epoch).
    pub t: i64,
    /// CPU over the last interval, in percent of one core; null for the
    /// first sample of a proc.
    pub cpu_pct: Option<f64>,
    /// Resident memory, in bytes.
    pub rss_bytes: Option<u64>,
    /// The linear memory of the Wasm instances in the proc; null: procs
    /// do not report it (yet).
    pub wasm_bytes: Option<u64>,
}

/// The samples of the calls to one actor mesh.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActorMeshSeries {
    /// The job whose controller called it; null when not known.
    pub job: Option<u64>,
    /// The actor mesh, as its job named it.
    pub mesh: String,
    /// Oldest first.
    pub points: Vec<ActorMeshPoint>,
}

/// The calls to an actor mesh over one interval.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActorMeshPoint {
    /// When (ms since the epoch): the end of the interval.
    pub t: i64,
    /// Calls that completed, per second.
    pub calls_per_s: f64,
    /// The median latency, in ms; null without calls.
    pub p50_ms: Option<f64>,
    /// The 99th percentile latency, in ms; null without calls.
    pub p99_ms: Option<f64>,
    /// Calls that failed.
    pub errors: u64,
    /// Replies received.
    pub msgs_in: u64,
    /// Messages sent (one per rank a call addressed).
    pub msgs_out: u64,
}

/// A job's status and how long it ran.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobSummary {
    /// Its id.
    pub id: u64,
    /// Where it stands.
    pub status: JobStatus,
    /// When it was submitted.
    pub created_at_ms: i64,
    /// When its controller started.
    pub started_at_ms: Option<i64>,
    /// When it ended.
    pub ended_at_ms: Option<i64>,
    /// Ended (or now) minus started, in ms.
    pub duration_ms: Option<i64>,
}

/// An actor mesh a job's controller spawned (`GET /v1/jobs/{id}/actors`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobActorMesh {
    /// Its name, as the job gave it.
    pub mesh: String,
    /// Its actor class.
    pub class: String,
    /// Every rank.
    pub ranks: Vec<JobActorRank>,
}

/// One actor of a job's actor mesh.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobActorRank {
    /// Its rank.
    pub rank: u32,
    /// The proc it runs on.
    pub proc: String,
    /// `running`, `failed` or `stopped`.
    pub state: String,
    /// Why it failed or stopped.
    pub reason: Option<String>,
    /// The endpoint it was handling when it failed, when known.
    pub endpoint: Option<String>,
    /// The URL of its post-mortem record (`GET /v1/jobs/{id}/dumps`), if
    /// it left one.
    pub dump: Option<String>,
}
