//! The program child procs run: the binary that starts them, or a copy of
//! it that the kernel can map with 2 MiB pages.
//!
//! A proc's turn on a crowded machine is short and comes after the turns
//! of the other procs on its core, so the code it runs has left the TLB in
//! between: over 16 procs on 2 cores, the misses cost about a quarter of a
//! proc's CPU per message (docs/benchmarks.md, "Issue 19"). Linux maps a
//! file's pages with one 2 MiB entry where the page cache holds them as
//! one 2 MiB folio and the mapping is aligned to 2 MiB in the file and in
//! memory. `monarch-host` and `monarch-bench` are linked with 2 MiB
//! segment alignment (their `build.rs`); the page cache holds a file in
//! 2 MiB folios when it was written in 2 MiB writes (ext4 and XFS on
//! recent kernels), which a linker's output usually is not. So a binary
//! whose code is aligned so starts its procs from a copy of itself written
//! that way, kept in the cache directory under a name made of its size,
//! its modification time and its inode, and shared by every proc that
//! runs it, so that the code stays in the page cache once; `monarch-host
//! run` and `serve` and `monarch-bench` start themselves again from it
//! ([`run_from_copy`]).
//!
//! The kernel may drop the copy's pages from its cache while no process
//! uses them (memory pressure, or reclaim of idle memory: this project's
//! VMs page out with DAMON whatever went untouched for 60 s), and read back
//! from disk they come in small folios, mapped with 4 KiB pages: procs
//! started from such a copy gathered 5 - 12 % slower. So a copy is checked
//! before it is used (its code mapped here, aligned, and counted in
//! `/proc/self/smaps`), and written again where its pages are no longer
//! 2 MiB folios.
//!
//! Anything that fails on the way (a binary without the alignment, no
//! cache directory, a full disk) leaves the original program; so does
//! `MONARCH_HUGE_TEXT=0`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// 2 MiB: the size of a huge page, and of each write of the copy.
const HUGE: u64 = 2 << 20;

/// How long a copy of an earlier build is kept.
const OLD_COPY: std::time::Duration = std::time::Duration::from_secs(600);

/// How long a process trusts that the copy it checked is still in 2 MiB
/// folios ([`still_in_huge_folios`]): a kernel may drop the pages of a
/// file no process has used for a while (this project's VMs page out,
/// with DAMON, what was not touched for 60 s), and a long-lived process
/// (`serve`) starts procs minutes apart.
const RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// Turns the copy off when set to `0`.
pub const HUGE_TEXT_ENV: &str = "MONARCH_HUGE_TEXT";

/// Names, in the environment of a process that [`run_from_copy`] started
/// again, the program it was started as.
const STARTED_AS_ENV: &str = "MONARCH_HUGE_TEXT_STARTED_AS";

/// The program this process was started as, where [`run_from_copy`]
/// moved it onto the copy.
static STARTED_AS: OnceLock<PathBuf> = OnceLock::new();

/// What [`for_procs`] chose for each program, and when it last checked.
static CHOSEN: Mutex<Option<HashMap<PathBuf, (PathBuf, Instant)>>> = Mutex::new(None);

/// Starts this process again from the copy of its binary that
/// [`for_procs`] gives, where that is not the binary itself, so that its
/// own code too is mapped with 2 MiB pages: a controller's turn in a
/// gather over 16 procs on 2 cores comes between the procs' turns as
/// theirs do, and the controller's CPU a 16-proc gather was 13 % lower
/// run from the copy (docs/benchmarks.md, "Issue 19"). The process keeps
/// its id, arguments, environment and open files (`execve`).
///
/// Call it first thing in `main`, before any other thread starts. It
/// returns without starting anything where the copy would not help or
/// cannot be made (see the module docs), where `execve` fails, and in the
/// process it started, which it tells by a variable in the environment
/// that it then removes; [`current_exe`] still names the program the
/// process was started as.
pub fn run_from_copy() {
    if let Some(program) = std::env::var_os(STARTED_AS_ENV) {
        // SAFETY: the caller calls this before any other thread starts.
        unsafe { std::env::remove_var(STARTED_AS_ENV) };
        let program = PathBuf::from(program);
        name_as(&program);
        // The process before this `execve` chose and checked the copy
        // this one runs: procs start from it without a second check.
        if let Ok(copy) = std::env::current_exe() {
            let mut chosen = CHOSEN.lock().unwrap_or_else(|p| p.into_inner());
            chosen
                .get_or_insert_with(HashMap::new)
                .insert(program.clone(), (copy, Instant::now()));
        }
        let _ = STARTED_AS.set(program);
        return;
    }
    let Ok(program) = std::env::current_exe() else {
        return;
    };
    let copy = for_procs(&program);
    if copy == program {
        return;
    }
    let mut args = std::env::args_os();
    let arg0 = args
        .next()
        .unwrap_or_else(|| program.clone().into_os_string());
    // Returns only if it failed: this process goes on as it is.
    let _failed = std::process::Command::new(&copy)
        .arg0(arg0)
        .args(args)
        .env(STARTED_AS_ENV, &program)
        .exec();
}

/// Gives this thread (the main one: `ps` and `top` show its name for the
/// process) the name of `program` rather than its copy's.
fn name_as(program: &Path) {
    let Some(name) = program.file_name() else {
        return;
    };
    let mut name: Vec<u8> = name.as_encoded_bytes().iter().take(15).copied().collect();
    name.push(0);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16
    // bytes, which `name` is.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// The program this process was started as: `std::env::current_exe()`,
/// or, after [`run_from_copy`], the binary it was started as rather than
/// the copy (which a later build may remove). Procs started later and
/// binaries copied to other hosts use it.
pub fn current_exe() -> std::io::Result<PathBuf> {
    if let Some(program) = STARTED_AS.get().or_else(|| READ_AS.get()) {
        return Ok(program.clone());
    }
    let program = std::env::current_exe()?;
    Ok(READ_AS.get_or_init(|| program).clone())
}

/// What [`current_exe`] read from `/proc/self/exe`, once a process: a
/// fork server reads it before it forks, so its procs do not.
static READ_AS: OnceLock<PathBuf> = OnceLock::new();

/// Where monarch-host keeps what it can make again (compiled components,
/// copies of its binary): `$MONARCH_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/monarch-host`, else `~/.cache/monarch-host`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MONARCH_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("monarch-host"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/monarch-host"))
}

/// The program to start procs with instead of `program`: its copy in
/// `cache_dir()/exe` where that helps (see the module docs), else
/// `program` itself. Made once per program; a copy that has gone since, or
/// whose pages the kernel dropped from its cache, is made again (checked
/// at most every [`RECHECK`] in one process).
pub fn for_procs(program: &Path) -> PathBuf {
    if std::env::var_os(HUGE_TEXT_ENV).is_some_and(|v| v == "0") {
        return program.to_path_buf();
    }
    let Some(dir) = cache_dir() else {
        return program.to_path_buf();
    };
    let mut chosen = CHOSEN.lock().unwrap_or_else(|p| p.into_inner());
    let chosen = chosen.get_or_insert_with(HashMap::new);
    if let Some((path, checked)) = chosen.get(program)
        && (path == program || (path.exists() && checked.elapsed() < RECHECK))
    {
        return path.clone();
    }
    let path = match copy_for_huge_pages(program, &dir.join("exe")) {
        Ok(Some(copy)) => copy,
        Ok(None) => program.to_path_buf(),
        Err(e) => {
            tracing::debug!(program = %program.display(), "procs run the program itself, not a copy mapped with 2 MiB pages: {e}");
            program.to_path_buf()
        }
    };
    chosen.insert(program.to_path_buf(), (path.clone(), Instant::now()));
    path
}

/// A copy of `program` in `dir` written in 2 MiB writes, made now or
/// earlier; `None` where a copy would not help: its code is not aligned to
/// 2 MiB, or it is this process's own binary and its code is already
/// mapped with 2 MiB pages.
pub fn copy_for_huge_pages(program: &Path, dir: &Path) -> std::io::Result<Option<PathBuf>> {
    let mut file = File::open(program)?;
    let Some(blocks) = huge_code_blocks(&mut file)? else {
        return Ok(None);
    };
    if own_code_on_huge_pages(program) {
        return Ok(None);
    }
    let meta = file.metadata()?;
    let name = program
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "program".into());
    let mtime = (meta.mtime() as i128) * 1_000_000_000 + meta.mtime_nsec() as i128;
    let key = format!("{name}-{:x}-{mtime:x}-{:x}", meta.size(), meta.ino());
    let dest = dir.join(&key);
    if std::fs::metadata(&dest).is_ok_and(|m| m.len() == meta.size()) {
        if still_in_huge_folios(&dest, blocks) {
            return Ok(Some(dest));
        }
        // Written again under the same name: procs running the old one
        // keep it while they map it.
        tracing::info!(copy = %dest.display(), "the copy's code is no longer in 2 MiB folios; copying the program again");
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{key}.{}.tmp", std::process::id()));
    let written = write_in_huge_chunks(&mut file, &tmp, meta.size());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))?;
    std::fs::rename(&tmp, &dest)?;
    forget_older_copies(dir, &name, &key);
    Ok(Some(dest))
}

fn write_in_huge_chunks(from: &mut File, to: &Path, size: u64) -> std::io::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    let mut chunk = vec![0u8; HUGE as usize];
    let mut copied = 0u64;
    loop {
        // Fill the whole chunk: each write starts at a multiple of 2 MiB
        // and, but for the last, is 2 MiB long.
        let mut filled = 0;
        while filled < chunk.len() {
            match from.read(&mut chunk[filled..])? {
                0 => break,
                n => filled += n,
            }
        }
        if filled == 0 {
            break;
        }
        out.write_all(&chunk[..filled])?;
        copied += filled as u64;
    }
    if copied != size {
        return Err(std::io::Error::other(format!(
            "the program changed while it was copied ({copied} bytes of {size})"
        )));
    }
    out.sync_all()
}

/// Removes copies of `name` other than `keep` made more than 10 minutes
/// ago, so that rebuilds (188 MB each for a release `monarch-host`) do not
/// fill the disk. A proc already started from one keeps running (its file
/// lives while it is mapped); a controller that starts more procs after
/// its copy went starts them from its program ([`for_procs`] makes the
/// copy again, the spawn falls back on `ENOENT`).
fn forget_older_copies(dir: &Path, name: &str, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{name}-");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        if file == keep || !file.starts_with(&prefix) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > OLD_COPY);
        if old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The bytes of the ELF file, from and to a multiple of 2 MiB, that 2 MiB
/// pages map of its executable segment, where that segment is aligned to
/// 2 MiB (its address and its offset in the file agree modulo 2 MiB) and
/// spans at least one whole huge page; `None` where it is not.
fn huge_code_blocks(file: &mut File) -> std::io::Result<Option<std::ops::Range<u64>>> {
    let mut header = [0u8; 64];
    if file.read(&mut header)? < header.len() || &header[..4] != b"\x7fELF" {
        return Ok(None);
    }
    // 64-bit, little-endian.
    if header[4] != 2 || header[5] != 1 {
        return Ok(None);
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
    let u64_at = |b: &[u8], at: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(v)
    };
    let phoff = u64_at(&header, 0x20);
    let phentsize = u16_at(&header, 0x36);
    let phnum = u16_at(&header, 0x38);
    if phentsize < 56 || phnum == 0 || phnum > 256 {
        return Ok(None);
    }
    let mut table = vec![0u8; phentsize * phnum];
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(phoff))?;
    file.read_exact(&mut table)?;
    file.seek(std::io::SeekFrom::Start(0))?;
    const PT_LOAD: u32 = 1;
    const PF_X: u32 = 1;
    Ok(table.chunks_exact(phentsize).find_map(|ph| {
        let kind = u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]);
        let flags = u32::from_le_bytes([ph[4], ph[5], ph[6], ph[7]]);
        let (offset, vaddr) = (u64_at(ph, 8), u64_at(ph, 16));
        let (filesz, align) = (u64_at(ph, 32), u64_at(ph, 48));
        let usable = kind == PT_LOAD
            && flags & PF_X != 0
            && align >= HUGE
            && vaddr.wrapping_sub(offset) % HUGE == 0
            && filesz >= 2 * HUGE;
        let start = offset.div_ceil(HUGE) * HUGE;
        let end = (offset + filesz) / HUGE * HUGE;
        (usable && end > start).then_some(start..end)
    }))
}

/// Whether the page cache still holds `path`'s `blocks` (from and to a
/// multiple of 2 MiB) as 2 MiB folios, nearly all of them: the kernel may
/// have dropped a copy's pages since it was written (memory pressure,
/// reclaim), and read back from disk they come in smaller folios, which
/// 4 KiB pages map. Told by mapping them here, aligned, touching each
/// block and reading how much of the mapping `/proc/self/smaps` counts
/// as mapped with 2 MiB pages. `true` where it cannot tell.
fn still_in_huge_folios(path: &Path, blocks: std::ops::Range<u64>) -> bool {
    use std::os::fd::AsRawFd as _;
    let Ok(file) = File::open(path) else {
        return true;
    };
    // Only what the file holds: a page past its end would fault.
    let size = file.metadata().map_or(0, |m| m.len());
    let end = blocks.end.min(size / HUGE * HUGE);
    if end <= blocks.start {
        return true;
    }
    let len = (end - blocks.start) as usize;
    let huge = HUGE as usize;
    // SAFETY: a fresh anonymous reservation, inaccessible, at an address
    // the kernel picks; unmapped below.
    let reserved = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + huge,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if reserved == libc::MAP_FAILED {
        return true;
    }
    let aligned = (reserved as usize).div_ceil(huge) * huge;
    // SAFETY: `aligned .. aligned + len` lies inside the reservation, which
    // this replaces with a read-only shared mapping of the file, as the
    // loader maps code; nothing else uses the reservation.
    let mapped = unsafe {
        libc::mmap(
            aligned as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.as_raw_fd(),
            blocks.start as libc::off_t,
        )
    };
    let verdict = if mapped == libc::MAP_FAILED {
        true
    } else {
        for block in (0..len).step_by(huge) {
            // SAFETY: inside the mapping, which is readable and within
            // the file's size.
            unsafe { std::ptr::read_volatile((aligned + block) as *const u8) };
        }
        let head = format!("{aligned:x}-");
        match std::fs::read_to_string("/proc/self/smaps") {
            Ok(smaps) => mostly_pmd_mapped(&smaps, |header| header.starts_with(&head)),
            Err(_) => true,
        }
    };
    // SAFETY: the whole reservation, the file's mapping included, is this
    // function's own.
    unsafe { libc::munmap(reserved, len + huge) };
    verdict
}

/// Whether `program` is this process's binary and its code is already
/// mapped with 2 MiB pages (its page cache holds 2 MiB folios), nearly all
/// of it: a linker's output can come to hold some 2 MiB folios too, but
/// not all.
fn own_code_on_huge_pages(program: &Path) -> bool {
    let Ok(me) = std::env::current_exe() else {
        return false;
    };
    if me != program {
        return false;
    }
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return false;
    };
    code_mostly_pmd_mapped(&smaps, &me.to_string_lossy())
}

/// Whether, in `smaps` (as `/proc/self/smaps` gives it), the executable
/// mappings of `path` are at least nine tenths mapped with 2 MiB pages.
fn code_mostly_pmd_mapped(smaps: &str, path: &str) -> bool {
    mostly_pmd_mapped(smaps, |header| {
        let perms = header.split_whitespace().nth(1).unwrap_or("");
        perms.contains('x') && header.ends_with(path)
    })
}

/// Whether, in `smaps`, the mappings whose header line `picks` are at
/// least nine tenths mapped with 2 MiB pages (`FilePmdMapped` against
/// `Size`); false where it picks none.
fn mostly_pmd_mapped(smaps: &str, picks: impl Fn(&str) -> bool) -> bool {
    let (mut size_kb, mut pmd_kb) = (0u64, 0u64);
    let mut picked = false;
    let kb = |fields: &mut std::str::SplitWhitespace| {
        fields
            .next()
            .and_then(|kb| kb.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            picked = picks(line);
        } else if picked && first == "Size:" {
            size_kb += kb(&mut fields);
        } else if picked && first == "FilePmdMapped:" {
            pmd_kb += kb(&mut fields);
        }
    }
    size_kb > 0 && pmd_kb * 10 >= size_kb * 9
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header and one program header.
    fn elf(align: u64, vaddr: u64, offset: u64, filesz: u64, flags: u32) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let ph = &mut b[64..];
        ph[0..4].copy_from_slice(&1u32.to_le_bytes());
        ph[4..8].copy_from_slice(&flags.to_le_bytes());
        ph[8..16].copy_from_slice(&offset.to_le_bytes());
        ph[16..24].copy_from_slice(&vaddr.to_le_bytes());
        ph[32..40].copy_from_slice(&filesz.to_le_bytes());
        ph[48..56].copy_from_slice(&align.to_le_bytes());
        b
    }

    fn aligned(bytes: &[u8]) -> bool {
        let dir = std::env::temp_dir().join(format!("exe-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!(
            "elf-{:x}",
            bytes.iter().map(|&b| b as u64).sum::<u64>()
        ));
        std::fs::write(&path, bytes).unwrap();
        let result = huge_code_blocks(&mut File::open(&path).unwrap())
            .unwrap()
            .is_some();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    #[test]
    fn own_code_counts_as_on_huge_pages_when_nearly_all_of_it_is() {
        let smaps = |pmd_kb: u64| {
            format!(
                "55d000000000-55d001a00000 r--p 00000000 fd:00 12 /bin/prog\n\
                 Size:              26624 kB\n\
                 FilePmdMapped:         0 kB\n\
                 55d001a00000-55d003600000 r-xp 01a00000 fd:00 12 /bin/prog\n\
                 Size:              28672 kB\n\
                 Rss:               20000 kB\n\
                 FilePmdMapped:     {pmd_kb} kB\n\
                 7f0000000000-7f0000200000 r-xp 00000000 fd:00 13 /lib/libc.so.6\n\
                 Size:               2048 kB\n\
                 FilePmdMapped:      2048 kB\n"
            )
        };
        assert!(code_mostly_pmd_mapped(&smaps(28672), "/bin/prog"));
        assert!(code_mostly_pmd_mapped(&smaps(26624), "/bin/prog"));
        // A linker's output with some 2 MiB folios: the copy still helps.
        assert!(!code_mostly_pmd_mapped(&smaps(16384), "/bin/prog"));
        assert!(!code_mostly_pmd_mapped(&smaps(0), "/bin/prog"));
        assert!(!code_mostly_pmd_mapped(&smaps(28672), "/bin/other"));
    }

    #[test]
    fn the_pmd_mapped_size_is_read_from_the_mapping_at_its_address() {
        let smaps = "200000-400000 r-xp 00000000 fd:00 12 /bin/prog\n\
                     Size:               2048 kB\n\
                     FilePmdMapped:         0 kB\n\
                     7f0000200000-7f0000a00000 r-xp 00200000 fd:00 14 /cache/copy\n\
                     Size:               8192 kB\n\
                     FilePmdMapped:      6144 kB\n\
                     VmFlags: rd ex sh\n\
                     7f0000a00000-7f0000c00000 ---p 00000000 00:00 0\n\
                     Size:               2048 kB\n";
        let at = |start: usize| {
            let head = format!("{start:x}-");
            move |header: &str| header.starts_with(&head)
        };
        // 6 of 8 MiB: under nine tenths.
        assert!(!mostly_pmd_mapped(smaps, at(0x7f0000200000)));
        assert!(mostly_pmd_mapped(
            &smaps.replace("6144 kB", "8192 kB"),
            at(0x7f0000200000)
        ));
        assert!(!mostly_pmd_mapped(smaps, at(0x200000)));
        // No such mapping, or one without the field.
        assert!(!mostly_pmd_mapped(smaps, at(0x300000)));
        assert!(!mostly_pmd_mapped(smaps, at(0x7f0000a00000)));
    }

    /// The kernel can drop a copy's pages from its cache (memory pressure,
    /// reclaim); read back from disk they are no longer 2 MiB folios and
    /// procs started from it would run on 4 KiB pages (5 - 12 % slower
    /// gathers over 16 procs on 2 vCPUs). Such a copy is made again.
    #[test]
    fn a_copy_whose_pages_left_the_cache_is_made_again() {
        let mib = 1 << 20;
        let dir = std::env::temp_dir().join(format!("exe-copy-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join("prog");
        let mut bytes = elf(2 * mib, 2 * mib, 2 * mib, 6 * mib, 5);
        bytes.resize(8 * mib as usize, 0x90);
        std::fs::write(&program, &bytes).unwrap();
        let copies = dir.join("exe");
        let copy = copy_for_huge_pages(&program, &copies).unwrap().unwrap();
        let blocks = 2 * mib..8 * mib;
        if !still_in_huge_folios(&copy, blocks.clone()) {
            eprintln!(
                "skipped: the file system under {} does not keep 2 MiB folios for a file written in 2 MiB writes",
                dir.display()
            );
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        let first = std::fs::metadata(&copy).unwrap().ino();
        // Made once, then reused while its pages stay.
        let again = copy_for_huge_pages(&program, &copies).unwrap().unwrap();
        assert_eq!(
            (again.as_path(), std::fs::metadata(&again).unwrap().ino()),
            (copy.as_path(), first)
        );
        // Its pages leave the cache (it is not mapped anywhere now).
        {
            use std::os::fd::AsRawFd as _;
            let file = File::open(&copy).unwrap();
            // SAFETY: an advice on an open file's cached pages.
            let advised =
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(advised, 0);
        }
        assert!(!still_in_huge_folios(&copy, blocks.clone()));
        let remade = copy_for_huge_pages(&program, &copies).unwrap().unwrap();
        assert_eq!(remade, copy);
        assert_ne!(
            std::fs::metadata(&remade).unwrap().ino(),
            first,
            "copied again"
        );
        assert!(still_in_huge_folios(&remade, blocks));
        assert_eq!(std::fs::read(&remade).unwrap(), bytes);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_code_aligned_to_2_mib_counts() {
        let mib = 1 << 20;
        assert!(aligned(&elf(2 * mib, 0x832340, 0x632340, 27 * mib, 5)));
        // The layout of a linker's default (4 KiB alignment).
        assert!(!aligned(&elf(0x1000, 0x633480, 0x632480, 27 * mib, 5)));
        // Aligned, but the address and the offset disagree modulo 2 MiB.
        assert!(!aligned(&elf(2 * mib, 0x833480, 0x632480, 27 * mib, 5)));
        // Not executable, or too small to hold a huge page.
        assert!(!aligned(&elf(2 * mib, 0x832340, 0x632340, 27 * mib, 4)));
        assert!(!aligned(&elf(2 * mib, 0x832340, 0x632340, mib, 5)));
        assert!(!aligned(
            b"#!/bin/sh\necho not an ELF file, but long enough to hold a header......"
        ));
    }

    #[test]
    fn the_copy_is_the_program_made_once_and_again_when_it_changes() {
        let dir = std::env::temp_dir().join(format!("exe-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let program = dir.join("prog");
        // An aligned header followed by 5 MiB of varied bytes: the copy
        // spans three writes, the last one short.
        let mut bytes = elf(HUGE, 0x832340, 0x632340, 3 * HUGE, 5);
        bytes.extend((0..5 * (1u32 << 20)).map(|i| (i % 251) as u8));
        std::fs::write(&program, &bytes).unwrap();
        let cache = dir.join("cache");

        let copy = copy_for_huge_pages(&program, &cache)
            .unwrap()
            .expect("a copy");
        assert_eq!(std::fs::read(&copy).unwrap(), bytes);
        let mode = std::fs::metadata(&copy).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "the copy runs, for its owner only");
        let again = copy_for_huge_pages(&program, &cache)
            .unwrap()
            .expect("a copy");
        assert_eq!(again, copy, "the copy is made once");

        // A rebuilt program (another size) gets a copy of its own.
        bytes.extend_from_slice(b"rebuilt");
        std::fs::write(&program, &bytes).unwrap();
        let rebuilt = copy_for_huge_pages(&program, &cache)
            .unwrap()
            .expect("a copy");
        assert_ne!(rebuilt, copy);
        assert_eq!(std::fs::read(&rebuilt).unwrap(), bytes);
        let names: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");

        // A program without the alignment is not copied.
        let plain = dir.join("plain");
        std::fs::write(&plain, elf(0x1000, 0x633480, 0x632480, 3 * HUGE, 5)).unwrap();
        assert_eq!(copy_for_huge_pages(&plain, &cache).unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
