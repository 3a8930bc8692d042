//! The server's state on disk: components and jobs in an embedded SQLite
//! database (`state.db` in the data directory). Logs are files beside it.
//!
//! A job's row is written when it is submitted and updated as it starts and
//! finishes, each in its own statement, so a crash loses at most the
//! transition in flight; at the next start, jobs still `queued` or
//! `running` are marked `failed` with the reason "server restarted".
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
    /// Opens (or creates) the database at `path`, and fails the jobs that
    /// a previous run of the server left unfinished. Returns how many.
    pub(crate) fn open(path: &Path) -> Result<(Db, usize)> {
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
        conn.execute(
            "UPDATE sessions SET state = 'lost', reason = ?1, ended_at_ms = ?2
             WHERE state = 'active'",
            params![RESTARTED, now_ms()],
        )
        .map_err(db_err)?;
        let interrupted = conn
            .execute(
                "UPDATE jobs SET status = 'failed', error = ?1, finished_at_ms = ?2
                 WHERE status IN ('queued', 'running')",
                params![RESTARTED, now_ms()],
            )
            .map_err(db_err)?;
        Ok((
            Db {
                conn: Mutex::new(conn),
            },
            interrupted,
        ))
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
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

    pub(crate) fn components(&self) -> Result<Vec<ComponentInfo>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare(
                "SELECT id, size, world, uploaded_at_ms FROM components
                 ORDER BY uploaded_at_ms DESC",
            )
            .map_err(db_err)?;
        let rows = statement.query_map([], component_row).map_err(db_err)?;
        rows.collect::<std::result::Result<_, _>>().map_err(db_err)
    }

    /// Records a queued job and returns its id.
    pub(crate) fn insert_job(
        &self,
        component: &str,
        args: &[String],
        mesh: Option<&str>,
        limits: &Limits,
        grants: &Grants,
    ) -> Result<u64> {
        let conn = self.conn();
        conn.prepare_cached(
            "INSERT INTO jobs (component, args, mesh, limits, status, created_at_ms, grants)
             VALUES (?1, ?2, ?3, ?4, 'queued', ?5, ?6)",
        )
        .and_then(|mut s| {
            s.execute(params![
                component,
                serde_json::to_string(args).unwrap_or_default(),
                mesh,
                serde_json::to_string(limits).unwrap_or_default(),
                now_ms(),
                serde_json::to_string(grants).unwrap_or_default(),
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

    /// The newest `limit` jobs, newest first.
    pub(crate) fn jobs(&self, limit: usize) -> Result<Vec<JobInfo>> {
        let conn = self.conn();
        let mut statement = conn
            .prepare(&format!("{JOB_COLUMNS} ORDER BY id DESC LIMIT ?1"))
            .map_err(db_err)?;
        let rows = statement
            .query_map(params![limit as i64], job_row)
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

/// The schema changes since the first version, in order: the database's
/// `user_version` is how many it has had.
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
    created_at_ms, started_at_ms, finished_at_ms, grants FROM jobs";

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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_fails_unfinished_jobs_and_keeps_the_rest() {
        let dir = std::env::temp_dir().join(format!("monarch-db-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.db");
        let limits = Limits::default();
        let none = Grants::default();
        {
            let (db, interrupted) = Db::open(&path).unwrap();
            assert_eq!(interrupted, 0);
            let done = db
                .insert_job("c", &["a".into()], None, &limits, &none)
                .unwrap();
            assert!(db.start_job(done).unwrap());
            assert!(db.finish_job(done, JobStatus::Succeeded, None).unwrap());
            // A final status is final.
            assert!(
                !db.finish_job(done, JobStatus::Failed, Some("late"))
                    .unwrap()
            );
            let running = db.insert_job("c", &[], Some("m"), &limits, &none).unwrap();
            assert!(db.start_job(running).unwrap());
            let queued = db.insert_job("c", &[], None, &limits, &none).unwrap();
            assert_eq!(queued, running + 1);
        }
        let (db, interrupted) = Db::open(&path).unwrap();
        assert_eq!(interrupted, 2);
        let jobs = db.jobs(10).unwrap();
        assert_eq!(jobs.len(), 3);
        assert_eq!(jobs[2].status, JobStatus::Succeeded);
        assert_eq!(jobs[2].args, vec!["a".to_string()]);
        for job in &jobs[..2] {
            assert_eq!(job.status, JobStatus::Failed);
            assert_eq!(job.error.as_deref(), Some(RESTARTED));
        }
        assert_eq!(jobs[1].mesh.as_deref(), Some("m"));
        // Ids keep counting after a restart.
        let next = db.insert_job("c", &[], None, &limits, &none).unwrap();
        assert_eq!(next, jobs[0].id + 1);
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
            let (db, interrupted) = Db::open(&path).unwrap();
            assert_eq!(interrupted, 0);
            let old = db.job(1).unwrap().unwrap();
            assert_eq!(old.status, JobStatus::Succeeded);
            assert_eq!(old.args, vec!["x".to_string()]);
            assert_eq!(old.limits, Limits::default());
            assert!(old.dirs.is_empty() && old.env.is_empty());
            db.insert_job("c", &[], None, &limits, &grants).unwrap()
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
