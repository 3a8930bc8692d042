//! A command on a pty, driven as a user drives it: it is the command's
//! controlling terminal (so Ctrl-C is SIGINT to it), what it prints is
//! read as it comes, and lines are typed into it.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A command on a pty.
pub struct Terminal {
    child: Child,
    master: std::fs::File,
    output: mpsc::Receiver<Vec<u8>>,
    /// Output read and not yet consumed by `expect`.
    pending: String,
    /// Everything read, for failure messages.
    pub seen: String,
}

impl Terminal {
    /// Starts `program args` on a new pty with `envs`.
    pub fn spawn(program: &str, args: &[&str], envs: &[(&str, &std::ffi::OsStr)]) -> Terminal {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty fills two new descriptors.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // No echo: what is read is what the command printed (a line
        // editor draws what is typed itself).
        // SAFETY: `slave` is a terminal we own; termios is plain data.
        unsafe {
            let mut termios: libc::termios = std::mem::zeroed();
            libc::tcgetattr(slave, &mut termios);
            termios.c_lflag &= !libc::ECHO;
            libc::tcsetattr(slave, libc::TCSANOW, &termios);
        }
        // SAFETY: both descriptors are ours alone from here.
        let slave = unsafe { OwnedFd::from_raw_fd(slave) };
        let master = unsafe { std::fs::File::from_raw_fd(master) };
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .env("TERM", "xterm")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: setsid and ioctl are async-signal-safe; the child makes
        // the pty (its stdin) its controlling terminal, so that Ctrl-C
        // typed into it is SIGINT to the child.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("start the command on a pty");
        let mut reader = master.try_clone().unwrap();
        let mut answerer = master.try_clone().unwrap();
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        // A line editor asks where the cursor is; a
                        // terminal answers (row 1, column 1).
                        if buf[..n].windows(4).any(|w| w == b"\x1b[6n") {
                            let _ = answerer.write_all(b"\x1b[1;1R");
                        }
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Terminal {
            child,
            master,
            output,
            pending: String::new(),
            seen: String::new(),
        }
    }

    /// The command's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Types `line` and Enter.
    pub fn type_line(&mut self, line: &str) {
        self.type_raw(&format!("{line}\r"));
    }

    /// Types `text` as it is (`"\x03"` is Ctrl-C, `"\x04"` Ctrl-D).
    pub fn type_raw(&mut self, text: &str) {
        self.master
            .write_all(text.as_bytes())
            .expect("type into the terminal");
        self.master.flush().expect("type into the terminal");
    }

    fn read_more(&mut self, until: Instant) -> bool {
        let left = until.saturating_duration_since(Instant::now());
        match self.output.recv_timeout(left) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes).replace('\r', "");
                self.seen.push_str(&text);
                self.pending.push_str(&text);
                true
            }
            Err(_) => false,
        }
    }

    /// Reads until the output holds `needle`; returns what came before it
    /// and consumes both.
    pub fn expect(&mut self, needle: &str, within: Duration) -> String {
        let until = Instant::now() + within;
        loop {
            if let Some(at) = self.pending.find(needle) {
                let before = self.pending[..at].to_string();
                self.pending.drain(..at + needle.len());
                return before;
            }
            if !self.read_more(until) {
                panic!(
                    "no {needle:?} within {within:?}; the terminal shows:\n{}",
                    self.seen
                );
            }
        }
    }

    /// Reads until the output holds every one of `needles`, in any order
    /// (what actors print travels beside the controller's own output, not
    /// in order with it); consumes up to the last of them.
    pub fn expect_all(&mut self, needles: &[&str], within: Duration) {
        let until = Instant::now() + within;
        loop {
            let found: Option<Vec<usize>> = needles
                .iter()
                .map(|needle| self.pending.find(needle).map(|at| at + needle.len()))
                .collect();
            if let Some(ends) = found {
                let last = ends.into_iter().max().unwrap_or(0);
                self.pending.drain(..last);
                return;
            }
            if !self.read_more(until) {
                panic!(
                    "not all of {needles:?} within {within:?}; the terminal shows:\n{}",
                    self.seen
                );
            }
        }
    }

    /// Reads for `during`; panics if `needle` shows.
    pub fn expect_not(&mut self, needle: &str, during: Duration) {
        let until = Instant::now() + during;
        while Instant::now() < until {
            self.read_more(until);
        }
        assert!(
            !self.pending.contains(needle),
            "{needle:?} showed; the terminal shows:\n{}",
            self.seen
        );
    }

    /// Types `line` and returns its answer, up to the next `prompt`.
    pub fn ask(&mut self, line: &str, prompt: &str, within: Duration) -> String {
        self.type_line(line);
        self.expect(prompt, within)
    }

    /// Kills the command at once (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `within` for the command to exit; its exit code.
    pub fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let until = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            if Instant::now() >= until {
                return None;
            }
            // Keep reading, so that a command blocked on a full pty
            // finishes.
            self.read_more(Instant::now() + Duration::from_millis(50));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
