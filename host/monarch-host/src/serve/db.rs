//! The server's state on disk: components and jobs in an embedded SQLite
//! database (`state.db` in the data directory). Logs are files beside it.
//!
//! A job's row is written when it is submitted and updated as it starts and
//! finishes, each in its own statement, so a crash loses at most the
//! transition in flight. At the next start ([`Recovered`]):
//! - JR-1: no accepted job is lost: a job still `queued` (never started)
//!   is run again, in the order of submission, with its owner, limits,
//!   grants, environment and mesh as submitted (one whose persistent mesh
//!   is gone fails, saying so);
//! - JR-2: a job that was `running` is marked `failed` ("server
//!   restarted"): it may have had effects, so it is not run again.
//!
//! Durability: the database is in WAL mode with `synchronous = NORMAL`. A
//! transaction is in the WAL (the operating system's page cache) when its
//! statement returns, so a killed server process (`kill -9`, a crash)
//! loses nothing it answered: a job's 201 is sent after its row's insert
//! returns. A power loss or kernel crash may lose the last transactions
//! before a checkpoint (never corrupting the database); `FULL` would close
//! that window at the cost of an fsync per job transition.
//!
//! Persistent proc meshes are recorded in `meshes`, so that a restart
//! starts them again (`serve::Server::start`) until they are deleted.
//!
//! Jobs record the principal that submitted them (`owner`), and
//! `component_owners` which principals uploaded which component (the
//! same bytes uploaded by two principals are one file with two owners).
//!
//! The schema's version is SQLite's `user_version`; [`Db::open`] brings a
//! database of an older server up to date (see [`MIGRATIONS`]), so a new
//! server opens the state of an old one.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::api::{ComponentInfo, JobInfo, JobStatus, Limits};
use crate::engine::Grants;

/// The database; statements are short and run under one lock.
pub(crate) struct Db {
    conn: Mutex<Connection>,
}

/// The reason given to jobs that a restart interrupted.
pub(crate) const RESTARTED: &str = "server restarted";

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

type Result<T> = std::result::Result<T, String>;

fn db_err(e: rusqlite::Error) -> String {
    format!("database error: {e}")
}

impl Db {
    /// Opens (or creates) the database at `path`, and settles what a
    /// previous run of the server left unfinished (see [`Recovered`]).
    pub(crate) fn open(path: &Path) -> Result<(Db, Recovered)> {
        let conn = Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA busy_timeout = 5000;
             CREATE TABLE IF NOT EXISTS components (
                 id TEXT PRIMARY KEY,
                 size INTEGER NOT NULL,
                 world TEXT NOT NULL,
                 uploaded_at_ms INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS jobs (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 component TEXT NOT NULL,
                 args TEXT NOT NULL,
                 mesh TEXT,
                 limits TEXT NOT NULL,
                 status TEXT NOT NULL,
                 error TEXT,
                 created_at_ms INTEGER NOT NULL,
                 started_at_ms INTEGER,
                 finished_at_ms INTEGER
             );",
        )
        .map_err(db_err)?;
        migrate(&conn)?;
        let recovered = recover(&conn)?;
        Ok((
            Db {
                conn: Mutex::new(conn),
            },
            recovered,
        ))
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the persistent mesh `name` (replacing an older record of
    /// that name), so that the next start of the server starts it again.
    pub(crate) fn record_mesh(&self, mesh: &MeshRecord) -> Result<()> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO meshes (name, procs, owner, origin, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    mesh.name,
                    mesh.procs as i64,
                    mesh.owner,
                    mesh.origin,
                    mesh.created_at_ms
                ],
            )
            .map_err(db_err)?;
        Ok(())
    }

    /// Forgets the persistent mesh `name` (it was deleted): it does not
    /// come back at the next start.
    pub(crate) fn forget_mesh(&self, name: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM meshes WHERE name = ?1", params![name])
            .map_err(db_err)?;
        Ok(())
    }

    /// Records the persistent actor meshes that live now (`live`), in
    /// place of those recorded before; a lost one of a live one's name is
    /// forgotten (it was spawned again).
    pub(crate) fn sync_actor_meshes(&self, live: &[ActorMeshRecord]) -> Result<()> {
        let conn = self.conn();
        let write = || -> rusqlite::Result<()> {
            let tx = conn.unchecked_transaction()?;
            tx.execute("DELETE FROM actor_meshes WHERE lost_at_ms IS NULL", [])?;
            for mesh in live {
                tx.execute(
                    "INSERT OR REPLACE INTO actor_meshes
                     (name, mesh, class, spawned_by, extent, lost_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, NULL)",
                    params![
                        mesh.name,
                        mesh.mesh,
                        mesh.class,
                        mesh.spawned_by,
                        serde_json::to_string(&mesh.extent).unwrap_or_default()
                    ],
                )?;
            }
            tx.commit()
        };
        write().map_err(db_err)
    }

    /// The persistent actor meshes lost with a restart, with when.
    pub(crate) fn lost_actor_meshes(&self) -> Result<Vec<(ActorMeshRecord, i64)>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare(
                "SELECT name, mesh, class, spawned_by, extent, lost_at_ms FROM actor_meshes
                 WHERE lost_at_ms IS NOT NULL ORDER BY name",
            )
            .map_err(db_err)?;
        let rows = statement
            .query_map([], |row| {
                let extent: String = row.get(4)?;
                Ok((
                    ActorMeshRecord {
                        name: row.get(0)?,
                        mesh: row.get(1)?,
                        class: row.get(2)?,
                        spawned_by: row.get(3)?,
                        extent: serde_json::from_str(&extent).unwrap_or_default(),
                    },
                    row.get(5)?,
                ))
            })
            .map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }

    /// Forgets the lost persistent actor mesh `name`; false when there was
    /// none.
    pub(crate) fn forget_lost_actor_mesh(&self, name: &str) -> Result<bool> {
        let gone = self
            .conn()
            .execute(
                "DELETE FROM actor_meshes WHERE name = ?1 AND lost_at_ms IS NOT NULL",
                params![name],
            )
            .map_err(db_err)?;
        Ok(gone == 1)
    }

    /// The recorded persistent meshes, oldest first.
    pub(crate) fn recorded_meshes(&self) -> Result<Vec<MeshRecord>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare(
                "SELECT name, procs, owner, origin, created_at_ms FROM meshes
                 ORDER BY created_at_ms, name",
            )
            .map_err(db_err)?;
        let rows = statement
            .query_map([], |row| {
                Ok(MeshRecord {
                    name: row.get(0)?,
                    procs: row.get::<_, i64>(1)?.clamp(0, u32::MAX as i64) as u32,
                    owner: row.get(2)?,
                    origin: row.get(3)?,
                    created_at_ms: row.get(4)?,
                })
            })
            .map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }

    /// Records a new session, running as `job`; false when a session of
    /// that name is active already (an ended one's row is replaced).
    pub(crate) fn insert_session(&self, row: &SessionRow) -> Result<bool> {
        let conn = self.conn();
        let active: Option<String> = conn
            .query_row(
                "SELECT state FROM sessions WHERE name = ?1",
                params![row.name],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err)?;
        if active.as_deref() == Some("active") {
            return Ok(false);
        }
        conn.execute(
            "INSERT OR REPLACE INTO sessions
             (name, job, owner, mesh, idle_ttl_s, state, reason, created_at_ms, ended_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, 'active', NULL, ?6, NULL)",
            params![
                row.name,
                row.job as i64,
                row.owner,
                row.mesh,
                row.idle_ttl_s as i64,
                row.created_at_ms
            ],
        )
        .map_err(db_err)?;
        Ok(true)
    }

    /// Marks session `name` ended, with `state` and why.
    pub(crate) fn end_session(&self, name: &str, state: &str, reason: &str) -> Result<()> {
        self.conn()
            .execute(
                "UPDATE sessions SET state = ?2, reason = ?3, ended_at_ms = ?4
                 WHERE name = ?1 AND state = 'active'",
                params![name, state, reason, now_ms()],
            )
            .map_err(db_err)?;
        Ok(())
    }

    /// Session `name`, active or ended.
    pub(crate) fn session(&self, name: &str) -> Result<Option<SessionRow>> {
        self.conn()
            .query_row(
                &format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE name = ?1"),
                params![name],
                session_row,
            )
            .optional()
            .map_err(db_err)
    }

    /// The newest `limit` sessions, active or ended.
    pub(crate) fn sessions(&self, limit: usize) -> Result<Vec<SessionRow>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare_cached(&format!(
                "SELECT {SESSION_COLUMNS} FROM sessions ORDER BY created_at_ms DESC LIMIT ?1"
            ))
            .map_err(db_err)?;
        let rows = statement
            .query_map(params![limit as i64], session_row)
            .map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }

    /// Records a component; false when it was there already.
    pub(crate) fn insert_component(&self, info: &ComponentInfo) -> Result<bool> {
        let added = self
            .conn()
            .prepare_cached(
                "INSERT OR IGNORE INTO components (id, size, world, uploaded_at_ms)
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    info.id,
                    info.size as i64,
                    info.world,
                    info.uploaded_at_ms
                ])
            })
            .map_err(db_err)?;
        Ok(added == 1)
    }

    pub(crate) fn component(&self, id: &str) -> Result<Option<ComponentInfo>> {
        self.conn()
            .query_row(
                "SELECT id, size, world, uploaded_at_ms FROM components WHERE id = ?1",
                params![id],
                component_row,
            )
            .optional()
            .map_err(db_err)
    }

    /// Components, newest first: every one (`owner` None), or those
    /// `owner` uploaded.
    pub(crate) fn components(&self, owner: Option<&str>) -> Result<Vec<ComponentInfo>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare(
                "SELECT id, size, world, uploaded_at_ms FROM components
                 WHERE ?1 IS NULL
                    OR id IN (SELECT component FROM component_owners WHERE owner = ?1)
                 ORDER BY uploaded_at_ms DESC",
            )
            .map_err(db_err)?;
        let rows = statement
            .query_map(params![owner], component_row)
            .map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }

    /// Records that `owner` uploaded component `id`.
    pub(crate) fn add_component_owner(&self, id: &str, owner: &str) -> Result<()> {
        self.conn()
            .prepare_cached(
                "INSERT OR IGNORE INTO component_owners (component, owner, added_at_ms)
                 VALUES (?1, ?2, ?3)",
            )
            .and_then(|mut s| s.execute(params![id, owner, now_ms()]))
            .map_err(db_err)?;
        Ok(())
    }

    /// Whether `owner` uploaded component `id`.
    pub(crate) fn owns_component(&self, id: &str, owner: &str) -> Result<bool> {
        self.conn()
            .prepare_cached("SELECT 1 FROM component_owners WHERE component = ?1 AND owner = ?2")
            .and_then(|mut s| s.exists(params![id, owner]))
            .map_err(db_err)
    }

    /// Records a queued job of principal `owner` and returns its id.
    #[allow(clippy::too_many_arguments)]
    /// Records that job `id` runs with breakpoints (`debug`), so that a
    /// restart requeues it so.
    pub(crate) fn set_job_debug(&self, id: u64) -> Result<()> {
        self.conn()
            .execute(
                "UPDATE jobs SET debug = 1 WHERE id = ?1",
                params![id as i64],
            )
            .map(|_| ())
            .map_err(db_err)
    }

    pub(crate) fn insert_job(
        &self,
        owner: &str,
        component: &str,
        args: &[String],
        mesh: Option<&str>,
        limits: &Limits,
        grants: &Grants,
    ) -> Result<u64> {
        let conn = self.conn();
        conn.prepare_cached(
            "INSERT INTO jobs (component, args, mesh, limits, status, created_at_ms, grants, owner)
             VALUES (?1, ?2, ?3, ?4, 'queued', ?5, ?6, ?7)",
        )
        .and_then(|mut s| {
            s.execute(params![
                component,
                serde_json::to_string(args).unwrap_or_default(),
                mesh,
                serde_json::to_string(limits).unwrap_or_default(),
                now_ms(),
                serde_json::to_string(grants).unwrap_or_default(),
                owner,
            ])
        })
        .map_err(db_err)?;
        Ok(conn.last_insert_rowid() as u64)
    }

    /// Moves a queued job to running; false when it is no longer queued
    /// (it was cancelled meanwhile).
    pub(crate) fn start_job(&self, id: u64) -> Result<bool> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE jobs SET status = 'running', started_at_ms = ?2
                 WHERE id = ?1 AND status = 'queued'",
            )
            .and_then(|mut s| s.execute(params![id as i64, now_ms()]))
            .map_err(db_err)?;
        Ok(changed == 1)
    }

    /// Gives an unfinished job its final status; false when it had one.
    pub(crate) fn finish_job(
        &self,
        id: u64,
        status: JobStatus,
        error: Option<&str>,
    ) -> Result<bool> {
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE jobs SET status = ?2, error = ?3, finished_at_ms = ?4
                 WHERE id = ?1 AND status IN ('queued', 'running')",
            )
            .and_then(|mut s| s.execute(params![id as i64, status.as_str(), error, now_ms()]))
            .map_err(db_err)?;
        Ok(changed == 1)
    }

    pub(crate) fn job(&self, id: u64) -> Result<Option<JobInfo>> {
        self.conn()
            .prepare_cached(&format!("{JOB_COLUMNS} WHERE id = ?1"))
            .and_then(|mut s| s.query_row(params![id as i64], job_row).optional())
            .map_err(db_err)
    }

    /// The newest `limit` jobs, newest first: of every principal (`owner`
    /// None), or of `owner`.
    pub(crate) fn jobs(&self, limit: usize, owner: Option<&str>) -> Result<Vec<JobInfo>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare(&format!(
                "{JOB_COLUMNS} WHERE ?2 IS NULL OR owner = ?2 ORDER BY id DESC LIMIT ?1"
            ))
            .map_err(db_err)?;
        let rows = statement
            .query_map(params![limit as i64, owner], job_row)
            .map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }

    /// Records the metrics sample `sample` taken at `t`, and forgets
    /// those taken before `keep_from` (the table stays bounded).
    pub(crate) fn insert_metric_sample(&self, t: i64, sample: &str, keep_from: i64) -> Result<()> {
        let conn = self.conn();
        conn.prepare_cached("INSERT OR REPLACE INTO metric_samples (t, sample) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![t, sample]))
            .map_err(db_err)?;
        conn.prepare_cached("DELETE FROM metric_samples WHERE t < ?1")
            .and_then(|mut s| s.execute(params![keep_from]))
            .map_err(db_err)?;
        Ok(())
    }

    /// The metrics samples taken from `since` to before `until`, oldest
    /// first, as their JSON.
    pub(crate) fn metric_samples(&self, since: i64, until: i64) -> Result<Vec<(i64, String)>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare_cached(
                "SELECT t, sample FROM metric_samples WHERE t >= ?1 AND t < ?2 ORDER BY t",
            )
            .map_err(db_err)?;
        let rows = statement
            .query_map(params![since, until], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }

    /// The newest `limit` jobs that had not ended by `since` (ms), newest
    /// first: of every principal (`owner` None), or of `owner`.
    pub(crate) fn jobs_since(
        &self,
        since: i64,
        limit: usize,
        owner: Option<&str>,
    ) -> Result<Vec<JobInfo>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare_cached(&format!(
                "{JOB_COLUMNS} WHERE (finished_at_ms IS NULL OR finished_at_ms >= ?1)
                 AND (?3 IS NULL OR owner = ?3) ORDER BY id DESC LIMIT ?2"
            ))
            .map_err(db_err)?;
        let rows = statement
            .query_map(params![since, limit as i64, owner], job_row)
            .map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }

    /// How many jobs ended with each status, for the metrics.
    pub(crate) fn status_counts(&self) -> Result<Vec<(String, u64)>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare("SELECT status, COUNT(*) FROM jobs GROUP BY status")
            .map_err(db_err)?;
        let rows = statement
            .query_map([], |row| Ok((row.get(0)?, row.get::<_, i64>(1)? as u64)))
            .map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }
}

/// What [`Db::open`] found unfinished from the previous run of the
/// server, already settled in the database:
/// - jobs that were `running` are `failed` ("server restarted"; one that
///   ran on a persistent mesh says that the mesh's procs are new): they
///   may have had effects, so they are not run again;
/// - the jobs of console sessions that were active are `failed`, and the
///   sessions `lost`;
/// - jobs still `queued` (never started) stay queued, for the server to
///   run again in their order ([`Recovered::queued`]).
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    /// How many jobs were marked failed.
    pub(crate) failed: usize,
    /// The queued jobs, oldest first.
    pub(crate) queued: Vec<QueuedJob>,
}

/// A job accepted but not started before a restart, as it was submitted.
#[derive(Debug, Clone)]
pub(crate) struct QueuedJob {
    pub(crate) id: u64,
    pub(crate) owner: String,
    pub(crate) component: String,
    pub(crate) args: Vec<String>,
    pub(crate) mesh: Option<String>,
    pub(crate) limits: Limits,
    pub(crate) grants: Grants,
    /// Submitted with breakpoints (`debug`).
    pub(crate) debug: bool,
}

/// A persistent proc mesh's record: it is started again at each start of
/// the server until it is deleted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MeshRecord {
    pub(crate) name: String,
    pub(crate) procs: u32,
    /// The principal that created it; None for the server's own.
    pub(crate) owner: Option<String>,
    /// How it was made: `flag` (`serve --mesh`) or `api` (`POST /v1/meshes`).
    pub(crate) origin: String,
    pub(crate) created_at_ms: i64,
}

/// A persistent actor mesh as recorded: what the API shows of one that a
/// restart lost.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ActorMeshRecord {
    pub(crate) name: String,
    /// The persistent proc mesh it ran on.
    pub(crate) mesh: String,
    pub(crate) class: String,
    pub(crate) spawned_by: String,
    pub(crate) extent: Vec<(String, u32)>,
}

/// Settles what the last run left unfinished, in one transaction: a kill
/// while it runs leaves the database as it was, and the next start does
/// it again.
fn recover(conn: &Connection) -> Result<Recovered> {
    let now = now_ms();
    let settle = || -> rusqlite::Result<Recovered> {
        let tx = conn.unchecked_transaction()?;
        // A session's job is driven by its console, which is gone.
        let mut failed = tx.execute(
            "UPDATE jobs SET status = 'failed', error = ?1, finished_at_ms = ?2
             WHERE status IN ('queued', 'running')
               AND id IN (SELECT job FROM sessions WHERE state = 'active')",
            params![RESTARTED, now],
        )?;
        tx.execute(
            "UPDATE sessions SET state = 'lost', reason = ?1, ended_at_ms = ?2
             WHERE state = 'active'",
            params![RESTARTED, now],
        )?;
        tx.execute(
            "UPDATE actor_meshes SET lost_at_ms = ?1 WHERE lost_at_ms IS NULL",
            params![now],
        )?;
        failed += tx.execute(
            "UPDATE jobs SET status = 'failed', finished_at_ms = ?2,
                 error = CASE WHEN mesh IS NULL THEN ?1
                     ELSE ?1 || ': it ran on the persistent mesh `' || mesh
                          || '`, whose procs were started anew' END
             WHERE status = 'running'",
            params![RESTARTED, now],
        )?;
        let queued = {
            let mut statement = tx.prepare(
                "SELECT id, owner, component, args, mesh, limits, grants, debug FROM jobs
                 WHERE status = 'queued' ORDER BY id",
            )?;
            let rows = statement.query_map([], |row| {
                let args: String = row.get(3)?;
                let limits: String = row.get(5)?;
                Ok(QueuedJob {
                    id: row.get::<_, i64>(0)? as u64,
                    owner: row
                        .get::<_, Option<String>>(1)?
                        .unwrap_or_else(|| "-".into()),
                    component: row.get(2)?,
                    args: serde_json::from_str(&args).unwrap_or_default(),
                    mesh: row.get(4)?,
                    limits: serde_json::from_str(&limits).unwrap_or_default(),
                    grants: row
                        .get::<_, Option<String>>(6)?
                        .and_then(|text| serde_json::from_str(&text).ok())
                        .unwrap_or_default(),
                    debug: row.get::<_, i64>(7)? != 0,
                })
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()?
        };
        tx.commit()?;
        Ok(Recovered { failed, queued })
    };
    settle().map_err(db_err)
}

/// A session's row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionRow {
    pub(crate) name: String,
    pub(crate) job: u64,
    pub(crate) owner: String,
    pub(crate) mesh: Option<String>,
    pub(crate) idle_ttl_s: u64,
    pub(crate) state: String,
    pub(crate) reason: Option<String>,
    pub(crate) created_at_ms: i64,
    pub(crate) ended_at_ms: Option<i64>,
}

const SESSION_COLUMNS: &str =
    "name, job, owner, mesh, idle_ttl_s, state, reason, created_at_ms, ended_at_ms";

fn session_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        name: row.get(0)?,
        job: row.get::<_, i64>(1)? as u64,
        owner: row.get(2)?,
        mesh: row.get(3)?,
        idle_ttl_s: row.get::<_, i64>(4)? as u64,
        state: row.get(5)?,
        reason: row.get(6)?,
        created_at_ms: row.get(7)?,
        ended_at_ms: row.get(8)?,
    })
}

/// The schema changes since the first version, in order: the database's
/// `user_version` is how many it has had.
const MIGRATIONS: &[&str] = &[
    // 1: what a job was granted, as the JSON of `engine::Grants`; null for
    // the jobs of older servers, which were granted nothing.
    "ALTER TABLE jobs ADD COLUMN grants TEXT",
    // 2: console sessions (`serve::sessions`): each runs as the job `job`;
    // `state` is `active`, `closed`, `expired`, `failed` or `lost`.
    "CREATE TABLE sessions (
         name TEXT PRIMARY KEY,
         job INTEGER NOT NULL,
         owner TEXT NOT NULL,
         mesh TEXT,
         idle_ttl_s INTEGER NOT NULL,
         state TEXT NOT NULL,
         reason TEXT,
         created_at_ms INTEGER NOT NULL,
         ended_at_ms INTEGER
     )",
    // 3: principals (`serve::principals`): a job's `owner` (null for the
    // jobs of older servers: only admins see them), and who uploaded each
    // component (one row per principal that uploaded the same bytes).
    "ALTER TABLE jobs ADD COLUMN owner TEXT;
     CREATE INDEX jobs_owner ON jobs (owner, id);
     CREATE TABLE component_owners (
         component TEXT NOT NULL,
         owner TEXT NOT NULL,
         added_at_ms INTEGER NOT NULL,
         PRIMARY KEY (component, owner)
     )",
    // 4: persistent proc meshes (`serve --mesh`, `POST /v1/meshes`),
    // started again at each start until deleted; `origin` is `flag` or
    // `api`.
    // The persistent actor meshes on them, as the server last saw them;
    // `lost_at_ms` is set at the start after them: they are not restored.
    "CREATE TABLE meshes (
         name TEXT PRIMARY KEY,
         procs INTEGER NOT NULL,
         owner TEXT,
         origin TEXT NOT NULL,
         created_at_ms INTEGER NOT NULL
     );
     CREATE TABLE actor_meshes (
         name TEXT PRIMARY KEY,
         mesh TEXT NOT NULL,
         class TEXT NOT NULL,
         spawned_by TEXT NOT NULL,
         extent TEXT NOT NULL,
         lost_at_ms INTEGER
     )",
    // 5: whether a job was submitted with `debug` (breakpoints), so that
    // a job a restart requeues keeps it (JR-1).
    "ALTER TABLE jobs ADD COLUMN debug INTEGER NOT NULL DEFAULT 0",
    // 6: the metrics sampler's samples (`serve::metrics`), each the JSON
    // of one sample, for the last hour only.
    "CREATE TABLE metric_samples (
         t INTEGER PRIMARY KEY,
         sample TEXT NOT NULL
     )",
];

/// Applies the migrations a database has not had, each with its version
/// bump in one transaction.
fn migrate(conn: &Connection) -> Result<()> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(db_err)?;
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Err(format!(
            "the database has schema version {version}, newer than this server's {known}: it was written by a newer monarch-host; run that one, or start with another --data"
        ));
    }
    for (at, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        conn.execute_batch(&format!(
            "BEGIN; {migration}; PRAGMA user_version = {}; COMMIT;",
            at + 1
        ))
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            format!(
                "cannot update the database to schema version {}: {e}",
                at + 1
            )
        })?;
    }
    Ok(())
}

const JOB_COLUMNS: &str = "SELECT id, component, args, mesh, limits, status, error,
    created_at_ms, started_at_ms, finished_at_ms, grants, owner FROM jobs";

fn component_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ComponentInfo> {
    Ok(ComponentInfo {
        id: row.get(0)?,
        size: row.get::<_, i64>(1)? as u64,
        world: row.get(2)?,
        uploaded_at_ms: row.get(3)?,
    })
}

fn job_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<JobInfo> {
    let args: String = row.get(2)?;
    let limits: String = row.get(4)?;
    let status: String = row.get(5)?;
    let grants: Grants = row
        .get::<_, Option<String>>(10)?
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    Ok(JobInfo {
        id: row.get::<_, i64>(0)? as u64,
        component: row.get(1)?,
        args: serde_json::from_str(&args).unwrap_or_default(),
        mesh: row.get(3)?,
        limits: serde_json::from_str(&limits).unwrap_or_default(),
        dirs: grants
            .dirs
            .iter()
            .map(|d| {
                let mode = if d.writable { "rw" } else { "ro" };
                format!("{}::{}:{mode}", d.host.display(), d.guest)
            })
            .collect(),
        env: grants.env.into_iter().map(|(key, _)| key).collect(),
        status: JobStatus::parse(&status).unwrap_or(JobStatus::Failed),
        error: row.get(6)?,
        created_at_ms: row.get(7)?,
        started_at_ms: row.get(8)?,
        finished_at_ms: row.get(9)?,
        owner: row.get(11)?,
        duration_ms: None,
    })
    .map(|mut job| {
        job.duration_ms = job
            .started_at_ms
            .map(|started| (job.finished_at_ms.unwrap_or_else(now_ms) - started).max(0));
        job
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jr_1_jr_2_a_restart_fails_running_jobs_requeues_queued_ones_and_keeps_the_rest() {
        let dir = std::env::temp_dir().join(format!("monarch-db-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        let limits = Limits::default();
        let none = Grants::default();
        let (done, running, fresh) = {
            let (db, recovered) = Db::open(&path).unwrap();
            assert_eq!(recovered.failed, 0);
            assert!(recovered.queued.is_empty());
            let done = db
                .insert_job("-", "c", &["a".into()], None, &limits, &none)
                .unwrap();
            assert!(db.start_job(done).unwrap());
            assert!(db.finish_job(done, JobStatus::Succeeded, None).unwrap());
            // A final status is final.
            assert!(
                !db.finish_job(done, JobStatus::Failed, Some("late"))
                    .unwrap()
            );
            let running = db
                .insert_job("-", "c", &[], Some("m"), &limits, &none)
                .unwrap();
            assert!(db.start_job(running).unwrap());
            let fresh = db.insert_job("-", "c", &[], None, &limits, &none).unwrap();
            assert!(db.start_job(fresh).unwrap());
            let granted = Grants {
                dirs: Vec::new(),
                env: vec![("KEY".into(), "value".into())],
            };
            let first = db
                .insert_job("alice", "c", &["q1".into()], Some("m"), &limits, &granted)
                .unwrap();
            assert_eq!(first, fresh + 1);
            let second = db
                .insert_job("-", "c", &["q2".into()], None, &limits, &none)
                .unwrap();
            assert_eq!(second, first + 1);
            db.set_job_debug(second).unwrap();
            (done, running, fresh)
        };
        let (db, recovered) = Db::open(&path).unwrap();
        assert_eq!(recovered.failed, 2);
        // The queued jobs come back in order, as submitted, still queued.
        let queued: Vec<(String, Vec<String>)> = recovered
            .queued
            .iter()
            .map(|q| (q.owner.clone(), q.args.clone()))
            .collect();
        // The second was submitted with breakpoints, and keeps them.
        let debug: Vec<bool> = recovered.queued.iter().map(|q| q.debug).collect();
        assert_eq!(debug, vec![false, true]);
        assert_eq!(
            queued,
            vec![
                ("alice".to_string(), vec!["q1".to_string()]),
                ("-".to_string(), vec!["q2".to_string()])
            ]
        );
        assert_eq!(recovered.queued[0].mesh.as_deref(), Some("m"));
        assert_eq!(
            recovered.queued[0].grants.env,
            vec![("KEY".into(), "value".into())]
        );
        let jobs = db.jobs(10, None).unwrap();
        assert_eq!(jobs.len(), 5);
        assert_eq!(db.jobs(10, Some("-")).unwrap().len(), 4);
        assert_eq!(db.jobs(10, Some("alice")).unwrap().len(), 1);
        assert!(db.jobs(10, Some("bob")).unwrap().is_empty());
        let by_id = |id: u64| jobs.iter().find(|j| j.id == id).unwrap().clone();
        assert_eq!(by_id(done).status, JobStatus::Succeeded);
        assert_eq!(by_id(done).args, vec!["a".to_string()]);
        assert_eq!(by_id(fresh).status, JobStatus::Failed);
        assert_eq!(by_id(fresh).error.as_deref(), Some(RESTARTED));
        // A job that ran on a persistent mesh says its procs are new.
        assert_eq!(by_id(running).status, JobStatus::Failed);
        let error = by_id(running).error.unwrap();
        assert!(
            error.starts_with(RESTARTED) && error.contains("`m`") && error.contains("anew"),
            "{error}"
        );
        for id in [recovered.queued[0].id, recovered.queued[1].id] {
            assert_eq!(by_id(id).status, JobStatus::Queued);
        }
        // Ids keep counting after a restart.
        let next = db.insert_job("-", "c", &[], None, &limits, &none).unwrap();
        assert_eq!(next, jobs[0].id + 1);
        // A queued job is a queued job until it starts: opening again
        // hands it back again.
        drop(db);
        let (db, recovered) = Db::open(&path).unwrap();
        assert_eq!(recovered.failed, 0);
        assert_eq!(recovered.queued.len(), 3);
        assert!(db.start_job(next).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A database as the server before grants wrote it: the first schema,
    /// `user_version` 0, one finished job.
    fn old_database(path: &Path) {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "CREATE TABLE components (
                 id TEXT PRIMARY KEY, size INTEGER NOT NULL, world TEXT NOT NULL,
                 uploaded_at_ms INTEGER NOT NULL);
             CREATE TABLE jobs (
                 id INTEGER PRIMARY KEY AUTOINCREMENT, component TEXT NOT NULL,
                 args TEXT NOT NULL, mesh TEXT, limits TEXT NOT NULL, status TEXT NOT NULL,
                 error TEXT, created_at_ms INTEGER NOT NULL, started_at_ms INTEGER,
                 finished_at_ms INTEGER);
             INSERT INTO jobs (component, args, mesh, limits, status, created_at_ms)
             VALUES ('c', '[\"x\"]', NULL,
                     '{\"memory_mib\":256,\"timeout_s\":300,\"call_timeout_s\":60,\"procs\":64}',
                     'succeeded', 1);",
        )
        .unwrap();
    }

    #[test]
    fn an_old_database_opens_and_its_jobs_keep_their_history() {
        let dir = std::env::temp_dir().join(format!("monarch-db-migrate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        old_database(&path);
        let grants = Grants {
            dirs: vec![crate::engine::DirGrant {
                host: dir.clone(),
                guest: "/data".into(),
                writable: false,
            }],
            env: vec![("GREETING".into(), "hi".into())],
        };
        let limits = Limits {
            handler_timeout_s: Some(1.5),
            ..Limits::default()
        };
        let new = {
            let (db, recovered) = Db::open(&path).unwrap();
            assert_eq!(recovered.failed, 0);
            let old = db.job(1).unwrap().unwrap();
            assert_eq!(old.status, JobStatus::Succeeded);
            assert_eq!(old.args, vec!["x".to_string()]);
            assert_eq!(old.limits, Limits::default());
            assert!(old.dirs.is_empty() && old.env.is_empty());
            // An old job has no owner: only admins (who list all) see it.
            assert_eq!(old.owner, None);
            assert_eq!(db.jobs(10, None).unwrap().len(), 1);
            assert!(db.jobs(10, Some("alice")).unwrap().is_empty());
            db.insert_job("-", "c", &[], None, &limits, &grants)
                .unwrap()
        };
        // Opening again migrates nothing more and keeps what was written.
        let (db, _) = Db::open(&path).unwrap();
        let job = db.job(new).unwrap().unwrap();
        assert_eq!(job.limits.handler_timeout_s, Some(1.5));
        assert_eq!(job.dirs, vec![format!("{}::/data:ro", dir.display())]);
        assert_eq!(job.env, vec!["GREETING".to_string()]);
        let version: i64 = db
            .conn()
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pr_3_components_are_owned_per_principal_and_jobs_by_their_submitter() {
        let dir = std::env::temp_dir().join(format!("monarch-db-owners-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (db, _) = Db::open(&dir.join("state.db")).unwrap();
        let info = ComponentInfo {
            id: "c1".into(),
            size: 1,
            world: "program".into(),
            uploaded_at_ms: 1,
        };
        assert!(db.insert_component(&info).unwrap());
        db.add_component_owner("c1", "alice").unwrap();
        assert!(db.owns_component("c1", "alice").unwrap());
        assert!(!db.owns_component("c1", "bob").unwrap());
        assert!(db.components(Some("bob")).unwrap().is_empty());
        // The same bytes from bob: one component, two owners.
        assert!(!db.insert_component(&info).unwrap());
        db.add_component_owner("c1", "bob").unwrap();
        db.add_component_owner("c1", "bob").unwrap();
        assert!(db.owns_component("c1", "bob").unwrap());
        assert_eq!(db.components(Some("bob")).unwrap().len(), 1);
        assert_eq!(db.components(None).unwrap().len(), 1);
        let limits = Limits::default();
        let none = Grants::default();
        let a = db
            .insert_job("alice", "c1", &[], None, &limits, &none)
            .unwrap();
        db.insert_job("bob", "c1", &[], None, &limits, &none)
            .unwrap();
        let mine = db.jobs(10, Some("alice")).unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].id, a);
        assert_eq!(mine[0].owner.as_deref(), Some("alice"));
        assert_eq!(db.jobs(10, None).unwrap().len(), 2);
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pm_1_persistent_meshes_are_recorded_until_deleted_and_actor_meshes_marked_lost() {
        let dir = std::env::temp_dir().join(format!("monarch-db-meshes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        let workers = MeshRecord {
            name: "workers".into(),
            procs: 2,
            owner: None,
            origin: "flag".into(),
            created_at_ms: 1,
        };
        let mine = MeshRecord {
            name: "mine".into(),
            procs: 3,
            owner: Some("alice".into()),
            origin: "api".into(),
            created_at_ms: 2,
        };
        {
            let (db, _) = Db::open(&path).unwrap();
            db.record_mesh(&workers).unwrap();
            db.record_mesh(&mine).unwrap();
            // Recording a name again replaces its record.
            db.record_mesh(&mine).unwrap();
        }
        let (db, _) = Db::open(&path).unwrap();
        assert_eq!(db.recorded_meshes().unwrap(), vec![workers.clone(), mine]);
        db.forget_mesh("mine").unwrap();
        drop(db);
        let (db, _) = Db::open(&path).unwrap();
        assert_eq!(db.recorded_meshes().unwrap(), vec![workers]);
        // Persistent actor meshes are not restored: the next start marks
        // those recorded lost, until one of that name lives again.
        let counter = ActorMeshRecord {
            name: "counter".into(),
            mesh: "workers".into(),
            class: "Counter".into(),
            spawned_by: "job 1".into(),
            extent: vec![("procs".into(), 2)],
        };
        db.sync_actor_meshes(std::slice::from_ref(&counter))
            .unwrap();
        assert!(db.lost_actor_meshes().unwrap().is_empty());
        drop(db);
        let (db, _) = Db::open(&path).unwrap();
        let lost = db.lost_actor_meshes().unwrap();
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].0, counter);
        db.sync_actor_meshes(&[]).unwrap();
        assert_eq!(db.lost_actor_meshes().unwrap().len(), 1);
        db.sync_actor_meshes(std::slice::from_ref(&counter))
            .unwrap();
        assert!(db.lost_actor_meshes().unwrap().is_empty());
        drop(db);
        let (db, _) = Db::open(&path).unwrap();
        assert!(db.forget_lost_actor_mesh("counter").unwrap());
        assert!(!db.forget_lost_actor_mesh("counter").unwrap());
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_database_of_a_newer_server_is_refused_with_a_reason() {
        let dir = std::env::temp_dir().join(format!("monarch-db-newer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA user_version = 99")
            .unwrap();
        let error = Db::open(&path).err().unwrap();
        assert!(error.contains("newer monarch-host"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
