//! The server's state on disk: components and jobs in an embedded SQLite
//! database (`state.db` in the data directory). Logs are files beside it.
//!
//! A job's row is written when it is submitted and updated as it starts and
//! finishes, each in its own statement, so a crash loses at most the
//! transition in flight; at the next start, jobs still `queued` or
//! `running` are marked `failed` with the reason "server restarted".

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::api::{ComponentInfo, JobInfo, JobStatus, Limits};

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
    ) -> Result<u64> {
        let conn = self.conn();
        conn.prepare_cached(
            "INSERT INTO jobs (component, args, mesh, limits, status, created_at_ms)
             VALUES (?1, ?2, ?3, ?4, 'queued', ?5)",
        )
        .and_then(|mut s| {
            s.execute(params![
                component,
                serde_json::to_string(args).unwrap_or_default(),
                mesh,
                serde_json::to_string(limits).unwrap_or_default(),
                now_ms()
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

const JOB_COLUMNS: &str = "SELECT id, component, args, mesh, limits, status, error,
    created_at_ms, started_at_ms, finished_at_ms FROM jobs";

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
    Ok(JobInfo {
        id: row.get::<_, i64>(0)? as u64,
        component: row.get(1)?,
        args: serde_json::from_str(&args).unwrap_or_default(),
        mesh: row.get(3)?,
        limits: serde_json::from_str(&limits).unwrap_or_default(),
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
        {
            let (db, interrupted) = Db::open(&path).unwrap();
            assert_eq!(interrupted, 0);
            let done = db.insert_job("c", &["a".into()], None, &limits).unwrap();
            assert!(db.start_job(done).unwrap());
            assert!(db.finish_job(done, JobStatus::Succeeded, None).unwrap());
            // A final status is final.
            assert!(
                !db.finish_job(done, JobStatus::Failed, Some("late"))
                    .unwrap()
            );
            let running = db.insert_job("c", &[], Some("m"), &limits).unwrap();
            assert!(db.start_job(running).unwrap());
            let queued = db.insert_job("c", &[], None, &limits).unwrap();
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
        let next = db.insert_job("c", &[], None, &limits).unwrap();
        assert_eq!(next, jobs[0].id + 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
