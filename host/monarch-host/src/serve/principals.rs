//! Who may use a server, and how much: each token is a **principal** with
//! a name, a role and quotas.
//!
//! A tokens file (`serve --tokens-file`) names them, one a line:
//!
//! ```text
//! # NAME   ROLE   TOKEN                 [QUOTA=VALUE ...]
//! alice    user   3c1f0a...             max_jobs=2 max_procs=8
//! ops      admin  9d2e77...
//! ```
//!
//! `#` starts a comment line; blank lines are skipped. A quota named on a
//! line overrides the server's flag for that principal
//! (`max_jobs`, `max_procs`, `max_memory_mib`; `0` means no limit). The
//! legacy `--token-file` (one token a line) makes each token an `admin`
//! named by its fingerprint.
//!
//! - PR-1: a line that is not `NAME ROLE TOKEN [KEY=VALUE...]` with a known
//!   role and quota stops the server at start, naming `file:line` and why;
//!   so do a repeated name or token.
//! - PR-2: a presented token is compared with every known one in time that
//!   does not depend on where they differ (both are hashed, then compared
//!   whole).
//! - PR-3: a `user` sees and acts on what it owns (jobs, components it
//!   uploaded, sessions, persistent meshes it created); an `admin` on
//!   everything. Listings leave out what the caller may not see.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sees and acts on everything on the server.
    Admin,
    /// Sees and acts on what it owns.
    User,
}

impl Role {
    /// The role as tokens files and the API spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
        }
    }
}

/// Per-principal caps; `None`: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Unfinished (queued or running) jobs, console sessions included.
    pub max_jobs: Option<u64>,
    /// Procs of its unfinished jobs' fresh meshes (each counts its
    /// `limits.procs`) and of its persistent meshes.
    pub max_procs: Option<u64>,
    /// MiB of Wasm memory its unfinished jobs ask for (`limits.memory_mib`).
    pub max_memory_mib: Option<u64>,
}

impl Quota {
    /// `self`'s caps, where set, over `defaults`.
    fn over(self, defaults: Quota) -> Quota {
        Quota {
            max_jobs: self.max_jobs.or(defaults.max_jobs),
            max_procs: self.max_procs.or(defaults.max_procs),
            max_memory_mib: self.max_memory_mib.or(defaults.max_memory_mib),
        }
    }
}

/// One principal.
#[derive(Debug, Clone)]
pub struct Principal {
    /// Its name, as listings and errors show it.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// Its caps: the tokens file's, over the server's flags.
    pub quota: Quota,
    /// The caps its line of the tokens file set (a refusal names where
    /// its cap comes from: that line, or the server's flag).
    pub overridden: Quota,
    digest: [u8; 32],
}

impl Principal {
    /// Whether it sees and acts on everything.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// A user named `name` with no token: a job's owner whom the tokens
    /// file no longer names.
    pub fn former(name: &str) -> Principal {
        Principal {
            name: name.to_string(),
            role: Role::User,
            quota: Quota::default(),
            overridden: Quota::default(),
            digest: [0; 32],
        }
    }

    /// The principal of a server without tokens: everyone, as admin.
    pub fn anonymous(quota: Quota) -> Principal {
        Principal {
            name: "-".into(),
            role: Role::Admin,
            quota,
            overridden: Quota::default(),
            digest: [0; 32],
        }
    }
}

/// The principals a server knows.
#[derive(Debug, Default)]
pub struct Principals {
    all: Vec<Arc<Principal>>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// Compares two digests in time independent of their contents (PR-2).
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The shortest token accepted in a tokens file.
const MIN_TOKEN_LEN: usize = 16;

impl Principals {
    /// Whether the server asks for tokens at all.
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// How many principals there are.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// The principal whose token is `presented`, if any. Every known
    /// token is compared, each whole (PR-2).
    pub fn find(&self, presented: &str) -> Option<Arc<Principal>> {
        let presented = digest(presented.as_bytes());
        let mut found = None;
        for principal in &self.all {
            if same(&principal.digest, &presented) && found.is_none() {
                found = Some(principal.clone());
            }
        }
        found
    }

    /// The principal named `name`, if any.
    pub fn named(&self, name: &str) -> Option<Arc<Principal>> {
        self.all.iter().find(|p| p.name == name).cloned()
    }

    /// Adds the tokens of a legacy token file (one a line), each an admin
    /// named by its fingerprint (as console sessions' owners were named).
    pub fn add_legacy(&mut self, text: &str, defaults: Quota) -> Result<(), String> {
        for token in text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
        {
            let principal = Principal {
                name: super::handlers::fingerprint(token),
                role: Role::Admin,
                quota: defaults,
                overridden: Quota::default(),
                digest: digest(token.as_bytes()),
            };
            self.push(principal)
                .map_err(|why| format!("--token-file: {why}"))?;
        }
        Ok(())
    }

    /// Adds the principals of tokens file `path`, whose text is `text`
    /// (PR-1); `defaults` are the server's quota flags.
    pub fn add_file(&mut self, path: &Path, text: &str, defaults: Quota) -> Result<(), String> {
        for (at, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            parse_line(line, defaults)
                .and_then(|principal| self.push(principal))
                .map_err(|why| format!("{}:{}: {why}", path.display(), at + 1))?;
        }
        Ok(())
    }

    fn push(&mut self, principal: Principal) -> Result<(), String> {
        if self.all.iter().any(|p| p.name == principal.name) {
            return Err(format!(
                "the name `{}` is given twice; each principal needs its own name",
                principal.name
            ));
        }
        if self.all.iter().any(|p| same(&p.digest, &principal.digest)) {
            return Err(format!(
                "`{}` has the token of another principal; give each its own token",
                principal.name
            ));
        }
        self.all.push(Arc::new(principal));
        Ok(())
    }

    /// Each principal's name and role, for the startup log.
    pub fn summary(&self) -> Vec<(String, &'static str)> {
        self.all
            .iter()
            .map(|p| (p.name.clone(), p.role.as_str()))
            .collect()
    }
}

/// One line of a tokens file: `NAME ROLE TOKEN [KEY=VALUE...]`.
fn parse_line(line: &str, defaults: Quota) -> Result<Principal, String> {
    let mut fields = line.split_whitespace();
    let usage = "expected `NAME ROLE TOKEN [max_jobs=N] [max_procs=N] [max_memory_mib=N]`";
    let (Some(name), Some(role), Some(token)) = (fields.next(), fields.next(), fields.next())
    else {
        return Err(format!(
            "{usage}, found {} field(s)",
            line.split_whitespace().count()
        ));
    };
    let name_ok = name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'));
    if !name_ok || name == "-" {
        return Err(format!(
            "bad name `{}`: use 1 to 64 letters, digits, `-`, `_`, `.` and `@`",
            name.escape_debug()
        ));
    }
    let role = match role {
        "admin" => Role::Admin,
        "user" => Role::User,
        other => {
            return Err(format!(
                "unknown role `{}` for `{name}`: the roles are `admin` and `user`",
                other.escape_debug()
            ));
        }
    };
    if token.contains('=') && token.len() < MIN_TOKEN_LEN {
        return Err(format!("{usage}: `{token}` is where the token goes"));
    }
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!(
            "the token of `{name}` has {} characters; use at least {MIN_TOKEN_LEN} (for example `openssl rand -hex 32`)",
            token.len()
        ));
    }
    let mut overridden = Quota::default();
    let mut seen = HashSet::new();
    for field in fields {
        let (key, value) = field
            .split_once('=')
            .ok_or_else(|| format!("`{field}` is not KEY=VALUE; {usage}"))?;
        if !seen.insert(key) {
            return Err(format!("`{key}` is given twice"));
        }
        let value: u64 = value.parse().map_err(|_| {
            format!(
                "`{key}={}`: the value is not a whole number",
                value.escape_debug()
            )
        })?;
        // 0: no cap for this principal, whatever the flag says.
        let value = Some(if value == 0 { u64::MAX } else { value });
        match key {
            "max_jobs" => overridden.max_jobs = value,
            "max_procs" => overridden.max_procs = value,
            "max_memory_mib" => overridden.max_memory_mib = value,
            other => {
                return Err(format!(
                    "unknown quota `{}`: the quotas are max_jobs, max_procs and max_memory_mib",
                    other.escape_debug()
                ));
            }
        }
    }
    let quota = overridden.over(defaults);
    let unbounded = |v: Option<u64>| v.filter(|v| *v != u64::MAX);
    Ok(Principal {
        name: name.to_string(),
        role,
        quota: Quota {
            max_jobs: unbounded(quota.max_jobs),
            max_procs: unbounded(quota.max_procs),
            max_memory_mib: unbounded(quota.max_memory_mib),
        },
        overridden,
        digest: digest(token.as_bytes()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbb";

    fn parse(text: &str) -> Result<Principals, String> {
        let mut all = Principals::default();
        let defaults = Quota {
            max_jobs: Some(4),
            max_procs: None,
            max_memory_mib: Some(1024),
        };
        all.add_file(Path::new("tokens"), text, defaults)?;
        Ok(all)
    }

    #[test]
    fn pr_1_a_tokens_file_names_principals_with_roles_and_quotas() {
        let all = parse(&format!(
            "# who\n\nalice user {A} max_jobs=2 max_procs=8\n  ops\tadmin {B} max_memory_mib=0\n"
        ))
        .unwrap();
        assert_eq!(all.len(), 2);
        let alice = all.find(A).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.role, Role::User);
        assert_eq!(alice.quota.max_jobs, Some(2));
        assert_eq!(alice.quota.max_procs, Some(8));
        assert_eq!(alice.quota.max_memory_mib, Some(1024));
        let ops = all.find(B).unwrap();
        assert!(ops.is_admin());
        assert_eq!(ops.quota.max_jobs, Some(4));
        assert_eq!(ops.quota.max_memory_mib, None, "0 lifts the cap");
        assert!(all.find("aaaaaaaaaaaaaaaaaaaaaaab").is_none());
        assert!(all.find("").is_none());
    }

    #[test]
    fn pr_1_a_bad_line_is_refused_with_file_line_and_why() {
        for (line, why) in [
            (format!("alice {A}"), "found 2 field(s)"),
            (format!("alice root {A}"), "unknown role `root`"),
            ("alice user short".to_string(), "at least 16"),
            (format!("alice user {A} max_jobs"), "is not KEY=VALUE"),
            (format!("alice user {A} max_jobs=two"), "not a whole number"),
            (
                format!("alice user {A} max_cpus=2"),
                "unknown quota `max_cpus`",
            ),
            (format!("al/ice user {A}"), "bad name"),
        ] {
            let error = parse(&format!("# header\n{line}\n")).err().unwrap();
            assert!(error.starts_with("tokens:2: "), "{line}: {error}");
            assert!(error.contains(why), "{line}: {error}");
        }
        let error = parse(&format!("a user {A}\na admin {B}\n")).err().unwrap();
        assert!(
            error.starts_with("tokens:2:") && error.contains("twice"),
            "{error}"
        );
        let error = parse(&format!("a user {A}\nb admin {A}\n")).err().unwrap();
        assert!(
            error.starts_with("tokens:2:") && error.contains("token of another"),
            "{error}"
        );
    }

    #[test]
    fn legacy_tokens_are_admins_named_by_their_fingerprint() {
        let mut all = Principals::default();
        all.add_legacy("one-token\n# c\n\nother-token\n", Quota::default())
            .unwrap();
        let one = all.find("one-token").unwrap();
        assert!(one.is_admin());
        assert_eq!(one.name, super::super::handlers::fingerprint("one-token"));
        assert!(all.find("other-token").is_some());
        assert!(all.find("one-toke").is_none());
    }
}
