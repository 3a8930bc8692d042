//! Progress on stderr for the command line's long steps: compiling a
//! component, starting the procs of a mesh, uploading a program, waiting
//! for a Slurm allocation.
//!
//! A command turns progress on with [`enable`]; library code then asks for
//! a [`spinner`], a [`bar`] or a [`bytes`] bar, and gets one that draws
//! only when it may. Every bar of the process sits in one
//! [`indicatif::MultiProgress`], so that lines written through [`say`] or
//! [`suspend`] land above the bars instead of through them.
//!
//! - PG-1: nothing is drawn unless the command enabled progress, stderr is
//!   a terminal, and the user did not ask for quiet ([`shown`]). Servers,
//!   agents, child procs, tests and pipes see no progress at all.
//! - PG-2: progress goes to stderr only: stdout carries the programs'
//!   output.
//! - PG-3: a step that ends leaves at most one line, its summary
//!   ([`Progress::finish`]); a step dropped unfinished leaves nothing.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether this process draws progress (PG-1); off until [`enable`].
static ENABLED: AtomicBool = AtomicBool::new(false);

/// How many bars are drawn now: lines go above them only while there
/// are some, and are plain lines otherwise.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// How often a spinner turns.
const TICK: Duration = Duration::from_millis(100);

/// A step of unknown length: `⠋ compiling app.wasm 1s`.
const SPINNER: &str = "{spinner} {msg} {elapsed}";
/// A step of countable parts: `⠋ 3 of 16 procs up [====>     ] 1s`.
const COUNTER: &str = "{spinner} {pos} of {len} {msg} [{bar:30}] {elapsed}";
/// A transfer: `⠋ uploading app.wasm [===>      ] 1.2 MiB/4.0 MiB 9 MiB/s`.
const BYTES: &str = "{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}";

/// Whether progress is drawn, given whether stderr is a terminal and
/// whether the user asked for quiet (PG-1).
pub fn shown(stderr_is_terminal: bool, quiet: bool) -> bool {
    stderr_is_terminal && !quiet
}

/// Turns progress on for this process, if stderr is a terminal and not
/// `quiet`; commands that run long steps call it first.
pub fn enable(quiet: bool) {
    ENABLED.store(
        shown(std::io::stderr().is_terminal(), quiet),
        Ordering::Relaxed,
    );
}

/// Whether this process draws progress now.
pub fn active() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The bars of this process, drawn on stderr (PG-2).
fn multi() -> &'static MultiProgress {
    static MULTI: OnceLock<MultiProgress> = OnceLock::new();
    MULTI.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// A step of unknown length, shown as a spinner with `message` and the
/// time so far.
pub fn spinner(message: impl Into<Cow<'static, str>>) -> Progress {
    Progress::start(None, SPINNER, message)
}

/// A step of `len` parts, shown as `N of LEN MESSAGE` (e.g. `procs up`)
/// and a bar.
pub fn bar(len: u64, message: impl Into<Cow<'static, str>>) -> Progress {
    Progress::start(Some(len), COUNTER, message)
}

/// A transfer of `len` bytes, shown with `message`, a bar and the rate.
pub fn bytes(len: u64, message: impl Into<Cow<'static, str>>) -> Progress {
    Progress::start(Some(len), BYTES, message)
}

/// Writes `line` to stderr, above any progress being drawn; the way to
/// report while a step shows progress.
pub fn say(line: &str) {
    if LIVE.load(Ordering::Relaxed) > 0 && multi().println(line).is_ok() {
        return;
    }
    eprintln!("{line}");
}

/// Runs `f` with the progress being drawn taken off the screen, so that
/// what `f` writes (e.g. a program's output on stdout, on the same
/// terminal) is not overwritten by a redraw.
pub fn suspend<R>(f: impl FnOnce() -> R) -> R {
    match active() {
        true => multi().suspend(f),
        false => f(),
    }
}

/// The style of `template`; every template here is checked by a test.
fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .progress_chars("=> ")
}

/// One step's progress: drawn while it lives if progress is on, else
/// nothing (PG-1); cleared when dropped (PG-3).
#[must_use = "progress is cleared when dropped"]
pub struct Progress {
    bar: Option<ProgressBar>,
    started: Instant,
}

impl Progress {
    fn start(len: Option<u64>, template: &str, message: impl Into<Cow<'static, str>>) -> Progress {
        let bar = active().then(|| {
            let bar = multi().add(make(len, template, ProgressDrawTarget::hidden()));
            LIVE.fetch_add(1, Ordering::Relaxed);
            bar.set_message(message);
            bar.enable_steady_tick(TICK);
            bar
        });
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    /// Progress that draws nothing.
    pub fn hidden() -> Progress {
        Progress {
            bar: None,
            started: Instant::now(),
        }
    }

    /// Whether it is drawn.
    pub fn is_shown(&self) -> bool {
        self.bar.is_some()
    }

    /// How long since the step began.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Changes the message.
    pub fn set_message(&self, message: impl Into<Cow<'static, str>>) {
        if let Some(bar) = &self.bar {
            bar.set_message(message);
        }
    }

    /// Counts `n` more parts (or bytes) done.
    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    /// A function that counts parts done, for hooks called from other
    /// tasks or threads.
    pub fn counter(&self) -> impl Fn(u64) + Send + Sync + 'static {
        let bar = self.bar.clone();
        move |n| {
            if let Some(bar) = &bar {
                bar.inc(n);
            }
        }
    }

    /// Ends the step, leaving `summary` on stderr in its place if the
    /// progress was drawn (PG-3).
    pub fn finish(mut self, summary: &str) {
        if let Some(bar) = self.bar.take() {
            end(&bar);
            say(summary);
        }
    }

    /// Ends the step and leaves nothing (PG-3).
    pub fn clear(mut self) {
        if let Some(bar) = self.bar.take() {
            end(&bar);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            end(&bar);
        }
    }
}

/// Takes `bar` off the screen and out of the process's bars.
fn end(bar: &ProgressBar) {
    bar.finish_and_clear();
    multi().remove(bar);
    LIVE.fetch_sub(1, Ordering::Relaxed);
}

/// A bar of `len` (a spinner without) in `template`, drawn on `target`.
fn make(len: Option<u64>, template: &str, target: ProgressDrawTarget) -> ProgressBar {
    let bar = match len {
        Some(len) => ProgressBar::with_draw_target(Some(len), target),
        None => ProgressBar::with_draw_target(None, target),
    };
    bar.set_style(style(template));
    bar
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use indicatif::TermLike;

    use super::*;

    /// A terminal that keeps what is written to it.
    #[derive(Debug, Clone, Default)]
    struct Screen(Arc<Mutex<String>>);

    impl Screen {
        fn text(&self) -> String {
            self.0.lock().unwrap().clone()
        }
    }

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            100
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.write_str(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// PG-1: progress is drawn on a terminal only, and never when quiet.
    #[test]
    fn pg1_progress_is_shown_only_on_a_terminal_and_not_when_quiet() {
        assert!(shown(true, false));
        assert!(!shown(false, false));
        assert!(!shown(true, true));
        assert!(!shown(false, true));
    }

    /// PG-1: until a command enables it, asking for progress draws
    /// nothing (a library caller, a server, a test), and reporting a line
    /// still reports it.
    #[test]
    fn pg1_progress_is_hidden_until_a_command_enables_it() {
        assert!(!active());
        let spinner = spinner("compiling x.wasm");
        assert!(!spinner.is_shown());
        spinner.set_message("still compiling");
        spinner.finish("compiled x.wasm in 1 ms");
        let bar = bar(16, "procs up");
        let count = bar.counter();
        count(3);
        assert!(!bar.is_shown());
        assert!(!Progress::hidden().is_shown());
        assert_eq!(suspend(|| 7), 7);
    }

    /// Every template parses (a bad one would fall back to a bare
    /// spinner), and a counter reads `N of LEN MESSAGE`.
    #[test]
    fn the_templates_parse_and_a_counter_says_how_many_are_up() {
        for template in [SPINNER, COUNTER, BYTES] {
            assert!(ProgressStyle::with_template(template).is_ok(), "{template}");
        }
        let screen = Screen::default();
        let bar = make(
            Some(16),
            COUNTER,
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
        );
        bar.set_message("procs up");
        bar.set_position(3);
        bar.tick();
        assert!(
            screen.text().contains("3 of 16 procs up"),
            "{}",
            screen.text()
        );
        let screen = Screen::default();
        let bar = make(
            Some(4 << 20),
            BYTES,
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
        );
        bar.set_message("uploading app.wasm");
        bar.set_position(1 << 20);
        bar.tick();
        let text = screen.text();
        assert!(
            text.contains("uploading app.wasm") && text.contains("1.00 MiB/4.00 MiB"),
            "{text}"
        );
    }
}
