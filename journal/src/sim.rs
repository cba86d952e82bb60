//! The storage fault simulator's file system: an [`Fs`] in memory that keeps, for every file and
//! directory, what the process sees (the page cache) apart from what is durable, so that a test
//! can crash it at any call and look at what a power loss would have left
//! (`docs/ARCHITECTURE.md` §5, "Proving durability").
//!
//! What is durable, call by call:
//! - record bytes written through a mapping, and bytes written with `write_all_at`: only once a
//!   flush (msync) covers them, or the file is synced (`sync_all`, `sync_data`); a successful
//!   flush or sync also makes the file's length durable;
//! - a directory's entries (created, renamed, removed files and directories): once the directory
//!   is synced (`sync_dir`); until then each change is pending, in order;
//! - nothing else: a crash loses the rest, or keeps any part of it ([`CrashMode`]).
//!
//! Calls that change something or sync are numbered from 0 ([`SimFs::ops`]). A test plans a crash
//! at call `k` ([`SimFs::crash_at`]: calls 0 to k-1 happen, call `k` and every later one fail with
//! `EIO`, and the image of the disk at that moment is kept for [`SimFs::image`]) and faults at
//! chosen calls ([`SimFs::fail_at`]). A failed flush or sync persists any part of what it covered
//! and leaves the rest unwritable for good, as Linux may mark the pages of a failed write-back
//! clean: a later successful sync proves nothing about them.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fs::{Fs, FsFile, FsMap};

/// Disk sectors: the unit a torn write tears at.
pub const SECTOR: u64 = 512;
/// Pages: the unit the page cache writes back.
pub const PAGE: u64 = 4096;

/// What a crash keeps of what was not durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Exactly the durable bytes and directory entries.
    Durable,
    /// The durable state, any subset of the pages written since their last flush, any length
    /// change not yet synced or not, and per directory a prefix of its pending changes.
    SomeUnsynced,
    /// As `SomeUnsynced`, a page torn at sector granularity: some of its sectors new, some old.
    Torn,
}

/// A call that fails on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `EIO`. A failed flush or sync persists part of its range and makes the rest unwritable.
    Io,
    /// `ENOSPC`.
    NoSpace,
}

/// A file system in memory; clones share it. See the module comment.
#[derive(Clone)]
pub struct SimFs {
    inner: Arc<Mutex<State>>,
}

impl std::fmt::Debug for SimFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimFs({:p})", Arc::as_ptr(&self.inner))
    }
}

/// Two handles are equal when they are the same file system.
impl PartialEq for SimFs {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for SimFs {}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Entry {
    File(usize),
    Dir,
}

/// A change of one directory's entries, applied whole (a rename is one).
type Change = Vec<(String, Option<Entry>)>;

#[derive(Default)]
struct Dir {
    entries: BTreeMap<String, Entry>,
    durable: BTreeMap<String, Entry>,
    pending: Vec<Change>,
}

struct Inode {
    /// What the process sees: `len` bytes of an allocation of `cap` (a leaked `Box<[u8]>`, freed
    /// when the file system goes). Mappings point into it, so it never moves while `mapped`.
    buf: *mut u8,
    cap: usize,
    len: usize,
    /// What a power loss keeps: its length is the durable length.
    durable: Vec<u8>,
    /// Pages whose write-back failed, with their bytes then: as with Linux, which marks such a
    /// page clean, they are not written to `durable` again until the process writes the page
    /// anew (here: until its bytes differ from these).
    lost: BTreeMap<u64, Vec<u8>>,
    mapped: bool,
}

struct State {
    inodes: Vec<Inode>,
    dirs: BTreeMap<PathBuf, Dir>,
    ops: u64,
    crash: Option<(u64, CrashMode)>,
    faults: BTreeMap<u64, Fault>,
    /// The disk as the planned crash left it, once it happened.
    image: Option<SimFs>,
    dead: bool,
    locks: BTreeSet<PathBuf>,
    rng: u64,
    /// The calls so far, named, when a test asked for them ([`SimFs::log_calls`]).
    calls: Option<Vec<String>>,
}

// SAFETY: the raw pointers in `Inode` point to allocations owned by the `State` (freed in its
// `Drop`), which moves between threads with it; every access to those bytes through the state
// happens under the file system's mutex, and accesses through mappings follow the journal's
// rules for its mapped segments (`Segment`): no byte is written by one thread while another
// reads or writes it.
unsafe impl Send for State {}

impl Drop for State {
    fn drop(&mut self) {
        for i in &self.inodes {
            // SAFETY: `buf` came from `Box::<[u8]>::into_raw` of exactly `cap` bytes and is freed
            // once, here; the mappings that point into it hold the state alive (`SimMap::fs`), so
            // none is left.
            unsafe {
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    i.buf, i.cap,
                )))
            };
        }
    }
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn leak(cap: usize) -> *mut u8 {
    Box::into_raw(vec![0u8; cap].into_boxed_slice()).cast()
}

fn err(kind: io::ErrorKind, what: &str) -> io::Error {
    io::Error::new(kind, what.to_string())
}

fn not_found() -> io::Error {
    err(io::ErrorKind::NotFound, "no such file or directory")
}

impl Inode {
    fn new() -> Inode {
        Inode {
            buf: leak(0),
            cap: 0,
            len: 0,
            durable: Vec::new(),
            lost: BTreeMap::new(),
            mapped: false,
        }
    }

    fn bytes(&self, from: usize, n: usize) -> &[u8] {
        assert!(from + n <= self.len);
        // SAFETY: in bounds of the allocation (`len <= cap`); see `State`'s `Send` for who
        // writes these bytes meanwhile.
        unsafe { std::slice::from_raw_parts(self.buf.add(from), n) }
    }

    fn write(&mut self, from: usize, data: &[u8]) {
        self.grow(from + data.len());
        // SAFETY: in bounds after `grow`; the caller holds the state's mutex.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.buf.add(from), data.len()) };
    }

    /// Makes the file at least `len` bytes long (zeros).
    fn grow(&mut self, len: usize) {
        if len <= self.len {
            return;
        }
        if len > self.cap {
            assert!(!self.mapped, "a mapped file grows past its mapping");
            let cap = len.max(self.cap * 2);
            let new = leak(cap);
            // SAFETY: both allocations are at least `self.len` bytes; the old one is freed once.
            unsafe {
                std::ptr::copy_nonoverlapping(self.buf, new, self.len);
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.buf, self.cap,
                )));
            }
            self.buf = new;
            self.cap = cap;
        }
        // Bytes between the old and the new length are zero: the allocation was zeroed and
        // nothing shrinks a file.
        self.len = len;
    }

    /// Whether `page` is one whose write-back failed and that nothing wrote since: the page
    /// cache holds it as clean, so no flush writes it.
    fn still_lost(&self, page: u64) -> bool {
        self.lost
            .get(&page)
            .is_some_and(|then| *then == self.page_bytes(page))
    }

    /// The bytes of `page` as the process sees them.
    fn page_bytes(&self, page: u64) -> Vec<u8> {
        let from = ((page * PAGE) as usize).min(self.len);
        let n = (PAGE as usize).min(self.len - from);
        self.bytes(from, n).to_vec()
    }

    /// Writes `[from, to)` (and the length) to the durable copy, except pages still lost.
    fn persist(&mut self, from: usize, to: usize) {
        let to = to.min(self.len);
        self.durable.resize(self.len, 0);
        let mut p = from;
        while p < to {
            let page = p as u64 / PAGE;
            let end = (((page + 1) * PAGE) as usize).min(to);
            if !self.still_lost(page) {
                self.lost.remove(&page);
                let src = self.bytes(p, end - p).to_vec();
                self.durable[p..end].copy_from_slice(&src);
            }
            p = end;
        }
    }

    /// A failed write-back of `[from, to)`: each page is written or not, and every one is lost
    /// until the process writes it again.
    fn fail_persist(&mut self, from: usize, to: usize, rng: &mut u64) {
        let to = to.min(self.len);
        let mut p = from / PAGE as usize * PAGE as usize;
        while p < to {
            let end = (p + PAGE as usize).min(to);
            let page = p as u64 / PAGE;
            if splitmix(rng) % 2 == 0 {
                self.persist(p.max(from), end);
            }
            let then = self.page_bytes(page);
            self.lost.insert(page, then);
            p = end;
        }
    }
}

impl State {
    fn new(seed: u64) -> State {
        let mut dirs = BTreeMap::new();
        dirs.insert(PathBuf::from("/"), Dir::default());
        State {
            inodes: Vec::new(),
            dirs,
            ops: 0,
            crash: None,
            faults: BTreeMap::new(),
            image: None,
            dead: false,
            locks: BTreeSet::new(),
            rng: seed,
            calls: None,
        }
    }

    /// Counts a call that changes something or syncs; the planned crash or fault, if it is this
    /// call's.
    fn op(&mut self, what: impl FnOnce() -> String) -> io::Result<Option<Fault>> {
        if let Some(calls) = &mut self.calls {
            calls.push(format!("{} {}", self.ops, what()));
        }
        if self.dead {
            return Err(err(io::ErrorKind::Other, "the simulated disk crashed"));
        }
        let n = self.ops;
        self.ops += 1;
        if let Some((at, mode)) = self.crash {
            if n >= at {
                let image = self.image(mode);
                self.image = Some(image);
                self.dead = true;
                return Err(err(io::ErrorKind::Other, "the simulated disk crashed"));
            }
        }
        Ok(self.faults.remove(&n))
    }

    fn check_alive(&self) -> io::Result<()> {
        if self.dead {
            Err(err(io::ErrorKind::Other, "the simulated disk crashed"))
        } else {
            Ok(())
        }
    }

    fn split(path: &Path) -> io::Result<(PathBuf, String)> {
        let name = path
            .file_name()
            .ok_or_else(|| err(io::ErrorKind::InvalidInput, "no file name"))?
            .to_string_lossy()
            .into_owned();
        Ok((norm(path.parent().unwrap_or(Path::new("/"))), name))
    }

    fn lookup(&self, path: &Path) -> io::Result<Entry> {
        let path = norm(path);
        if self.dirs.contains_key(&path) {
            return Ok(Entry::Dir);
        }
        let (dir, name) = Self::split(&path)?;
        self.dirs
            .get(&dir)
            .and_then(|d| d.entries.get(&name))
            .copied()
            .ok_or_else(not_found)
    }

    fn file(&self, path: &Path) -> io::Result<usize> {
        match self.lookup(path)? {
            Entry::File(ino) => Ok(ino),
            Entry::Dir => Err(err(io::ErrorKind::Other, "is a directory")),
        }
    }

    fn change(&mut self, dir: &Path, change: Change) {
        let d = self.dirs.get_mut(dir).expect("the directory exists");
        for (name, e) in &change {
            match e {
                Some(e) => {
                    d.entries.insert(name.clone(), *e);
                }
                None => {
                    d.entries.remove(name);
                }
            }
        }
        d.pending.push(change);
    }

    /// The disk a crash now would leave (see [`CrashMode`]), as a new file system.
    fn image(&mut self, mode: CrashMode) -> SimFs {
        let mut rng = self.rng ^ 0x5eed_cafe;
        let mut st = State::new(splitmix(&mut rng));
        // Each directory's entries: the durable ones and a prefix of the pending changes.
        let mut entries: BTreeMap<PathBuf, BTreeMap<String, Entry>> = BTreeMap::new();
        for (path, d) in &self.dirs {
            let mut e = d.durable.clone();
            let keep = match mode {
                CrashMode::Durable => 0,
                _ => (splitmix(&mut rng) % (d.pending.len() as u64 + 1)) as usize,
            };
            for change in &d.pending[..keep] {
                for (name, x) in change {
                    match x {
                        Some(x) => e.insert(name.clone(), *x),
                        None => e.remove(name),
                    };
                }
            }
            entries.insert(path.clone(), e);
        }
        // What exists: from the root down, directories their parents name.
        let mut inode_map: BTreeMap<usize, usize> = BTreeMap::new();
        let mut stack = vec![PathBuf::from("/")];
        while let Some(dir) = stack.pop() {
            let mut new_dir = Dir::default();
            for (name, e) in entries.get(&dir).cloned().unwrap_or_default() {
                let e = match e {
                    Entry::Dir => {
                        if entries.contains_key(&dir.join(&name)) {
                            stack.push(dir.join(&name));
                            Entry::Dir
                        } else {
                            continue;
                        }
                    }
                    Entry::File(ino) => {
                        let new = match inode_map.get(&ino) {
                            Some(&n) => n,
                            None => {
                                let n = st.inodes.len();
                                st.inodes.push(self.inodes[ino].crashed(mode, &mut rng));
                                inode_map.insert(ino, n);
                                n
                            }
                        };
                        Entry::File(new)
                    }
                };
                new_dir.entries.insert(name, e);
            }
            new_dir.durable = new_dir.entries.clone();
            st.dirs.insert(dir, new_dir);
        }
        SimFs {
            inner: Arc::new(Mutex::new(st)),
        }
    }
}

impl Inode {
    /// This file as a crash leaves it.
    fn crashed(&self, mode: CrashMode, rng: &mut u64) -> Inode {
        let mut out = self.durable.clone();
        if mode != CrashMode::Durable {
            // The length: the durable one or the current one.
            if self.len > out.len() && splitmix(rng) % 2 == 0 {
                out.resize(self.len, 0);
            }
            let len = out.len().min(self.len);
            let mut p = 0;
            while p < len {
                let end = (p + PAGE as usize).min(len);
                let page = p as u64 / PAGE;
                let cur = self.bytes(p, end - p);
                if !self.still_lost(page) && cur != &out[p..end] && splitmix(rng) % 2 == 0 {
                    if mode == CrashMode::Torn && splitmix(rng) % 2 == 0 {
                        let mut s = p;
                        while s < end {
                            let e = (s + SECTOR as usize).min(end);
                            if splitmix(rng) % 2 == 0 {
                                out[s..e].copy_from_slice(&cur[s - p..e - p]);
                            }
                            s = e;
                        }
                    } else {
                        out[p..end].copy_from_slice(cur);
                    }
                }
                p = end;
            }
        }
        let mut i = Inode::new();
        i.write(0, &out);
        i.durable = out;
        i
    }
}

/// `path` without `.` components and trailing separators (the journal never uses `..`).
fn norm(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        if let Component::Normal(x) = c {
            out.push(x);
        }
    }
    out
}

impl SimFs {
    /// An empty file system with only `/`; `seed` decides what crashes and failed syncs keep.
    pub fn new(seed: u64) -> SimFs {
        SimFs {
            inner: Arc::new(Mutex::new(State::new(seed))),
        }
    }

    fn st(&self) -> MutexGuard<'_, State> {
        // A panic under this lock leaves plain data behind.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls that changed something or synced so far.
    pub fn ops(&self) -> u64 {
        self.st().ops
    }

    /// Crash at call `k` (counted from the first call ever; one in the past crashes at the next
    /// call), keeping what `mode` says.
    pub fn crash_at(&self, k: u64, mode: CrashMode) {
        self.st().crash = Some((k, mode));
    }

    /// Makes call `k` fail with `fault`.
    pub fn fail_at(&self, k: u64, fault: Fault) {
        self.st().faults.insert(k, fault);
    }

    /// Keeps the calls made from now on, named, for [`SimFs::calls`].
    pub fn log_calls(&self) {
        self.st().calls.get_or_insert_with(Vec::new);
    }

    /// The calls named since [`SimFs::log_calls`].
    pub fn calls(&self) -> Vec<String> {
        self.st().calls.clone().unwrap_or_default()
    }

    /// Drops the faults planned and not reached yet.
    pub fn clear_faults(&self) {
        self.st().faults.clear();
    }

    /// Whether the planned crash happened.
    pub fn crashed(&self) -> bool {
        self.st().dead
    }

    /// The disk the planned crash left, once it happened.
    pub fn image(&self) -> Option<SimFs> {
        self.st().image.clone()
    }

    /// Crashes now: every later call fails, and the disk as the crash leaves it is returned.
    pub fn power_loss(&self, mode: CrashMode) -> SimFs {
        let mut st = self.st();
        if let Some(img) = &st.image {
            return img.clone();
        }
        let img = st.image(mode);
        st.image = Some(img.clone());
        st.dead = true;
        img
    }

    /// The files under `dir` (recursively), as paths, in order.
    pub fn files(&self, dir: &Path) -> Vec<PathBuf> {
        let st = self.st();
        let dir = norm(dir);
        let mut out = Vec::new();
        for (path, d) in st.dirs.range(dir.clone()..) {
            if !path.starts_with(&dir) {
                break;
            }
            for (name, e) in &d.entries {
                if matches!(e, Entry::File(_)) {
                    out.push(path.join(name));
                }
            }
        }
        out.sort();
        out
    }

    /// Replaces a file's content, durably (what an operator or a broken disk does to a stopped
    /// relay's files: not counted as a call).
    pub fn overwrite(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        let mut st = self.st();
        let ino = st.file(path)?;
        let mut new = Inode::new();
        new.write(0, data);
        new.durable = data.to_vec();
        assert!(!st.inodes[ino].mapped, "overwrite of a mapped file");
        st.inodes[ino] = new;
        Ok(())
    }

    /// Removes a file, durably (not counted as a call).
    pub fn delete(&self, path: &Path) -> io::Result<()> {
        let mut st = self.st();
        st.file(path)?;
        let (dir, name) = State::split(&norm(path))?;
        let d = st.dirs.get_mut(&dir).ok_or_else(not_found)?;
        d.entries.remove(&name);
        d.durable.remove(&name);
        Ok(())
    }
}

impl Fs for SimFs {
    type File = SimFile;
    type Map = SimMap;
    type Lock = SimLock;

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.st();
        let dir = norm(dir);
        let mut at = PathBuf::from("/");
        for c in dir.components().skip(1) {
            let next = at.join(c);
            if !st.dirs.contains_key(&next) {
                if st.lookup(&next).is_ok() {
                    return Err(err(io::ErrorKind::AlreadyExists, "a file is in the way"));
                }
                if st.op(|| format!("mkdir {}", next.display()))? == Some(Fault::NoSpace) {
                    return Err(io::Error::from_raw_os_error(libc::ENOSPC));
                }
                st.dirs.insert(next.clone(), Dir::default());
                let name = c.as_os_str().to_string_lossy().into_owned();
                st.change(&at, vec![(name, Some(Entry::Dir))]);
            }
            at = next;
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.st();
        st.check_alive()?;
        let d = st.dirs.get(&norm(dir)).ok_or_else(not_found)?;
        Ok(d.entries.keys().cloned().collect())
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.st().dirs.contains_key(&norm(path))
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<SimLock>> {
        let mut st = self.st();
        st.check_alive()?;
        let path = norm(path);
        if st.lookup(&path).is_err() {
            let (dir, name) = State::split(&path)?;
            if !st.dirs.contains_key(&dir) {
                return Err(not_found());
            }
            st.op(|| format!("create {}", path.display()))?;
            let ino = st.inodes.len();
            st.inodes.push(Inode::new());
            st.change(&dir, vec![(name, Some(Entry::File(ino)))]);
        }
        if !st.locks.insert(path.clone()) {
            return Ok(None);
        }
        Ok(Some(SimLock {
            fs: self.clone(),
            path,
        }))
    }

    fn open(&self, path: &Path, write: bool) -> io::Result<SimFile> {
        let st = self.st();
        st.check_alive()?;
        let ino = st.file(path)?;
        Ok(SimFile {
            fs: self.clone(),
            ino,
            write,
        })
    }

    fn create_new(&self, path: &Path) -> io::Result<SimFile> {
        let mut st = self.st();
        let path = norm(path);
        if st.lookup(&path).is_ok() {
            return Err(err(io::ErrorKind::AlreadyExists, "file exists"));
        }
        let (dir, name) = State::split(&path)?;
        if !st.dirs.contains_key(&dir) {
            return Err(not_found());
        }
        if st.op(|| format!("create_new {}", path.display()))? == Some(Fault::NoSpace) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let ino = st.inodes.len();
        st.inodes.push(Inode::new());
        if let Some(calls) = &mut st.calls {
            calls.push(format!("  = ino {ino}"));
        }
        st.change(&dir, vec![(name, Some(Entry::File(ino)))]);
        Ok(SimFile {
            fs: self.clone(),
            ino,
            write: true,
        })
    }

    fn create(&self, path: &Path) -> io::Result<SimFile> {
        let mut st = self.st();
        let path = norm(path);
        let (dir, name) = State::split(&path)?;
        if !st.dirs.contains_key(&dir) {
            return Err(not_found());
        }
        if st.op(|| format!("create {}", path.display()))? == Some(Fault::NoSpace) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if let Ok(Entry::File(ino)) = st.lookup(&path) {
            // Truncated: what it held is no longer seen; the durable copy stays until a sync.
            let i = &mut st.inodes[ino];
            assert!(!i.mapped, "truncation of a mapped file");
            // SAFETY: in bounds of the allocation; the caller holds the state's mutex.
            unsafe { std::ptr::write_bytes(i.buf, 0, i.len) };
            i.len = 0;
            return Ok(SimFile {
                fs: self.clone(),
                ino,
                write: true,
            });
        }
        let ino = st.inodes.len();
        st.inodes.push(Inode::new());
        st.change(&dir, vec![(name, Some(Entry::File(ino)))]);
        Ok(SimFile {
            fs: self.clone(),
            ino,
            write: true,
        })
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.st();
        st.check_alive()?;
        let i = &st.inodes[st.file(path)?];
        Ok(i.bytes(0, i.len).to_vec())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.st();
        let e = st.lookup(from)?;
        let (fd, fname) = State::split(&norm(from))?;
        let (td, tname) = State::split(&norm(to))?;
        if st
            .op(|| format!("rename {} {}", from.display(), to.display()))?
            .is_some()
        {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if fd == td {
            st.change(&fd, vec![(tname, Some(e)), (fname, None)]);
        } else {
            st.change(&td, vec![(tname, Some(e))]);
            st.change(&fd, vec![(fname, None)]);
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.st();
        st.file(path)?;
        let (dir, name) = State::split(&norm(path))?;
        if st.op(|| format!("unlink {}", path.display()))?.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        st.change(&dir, vec![(name, None)]);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.st();
        let dir = norm(dir);
        if !st.dirs.contains_key(&dir) {
            return Err(not_found());
        }
        if st.op(|| format!("sync_dir {}", dir.display()))?.is_some() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let d = st.dirs.get_mut(&dir).expect("checked");
        d.durable = d.entries.clone();
        d.pending.clear();
        Ok(())
    }

    fn map(&self, file: &SimFile, path: &Path, len: u64) -> io::Result<SimMap> {
        let mut st = self.st();
        st.check_alive()?;
        if let Some(calls) = &mut st.calls {
            calls.push(format!("  map {} = ino {}", path.display(), file.ino));
        }
        let i = &mut st.inodes[file.ino];
        if (i.len as u64) < len {
            return Err(err(
                io::ErrorKind::InvalidInput,
                "mapping past the file's end",
            ));
        }
        i.mapped = true;
        Ok(SimMap {
            fs: self.clone(),
            ino: file.ino,
            ptr: i.buf,
        })
    }
}

/// An open file of a [`SimFs`].
pub struct SimFile {
    fs: SimFs,
    ino: usize,
    write: bool,
}

impl FsFile for SimFile {
    fn size(&self) -> io::Result<u64> {
        let st = self.fs.st();
        st.check_alive()?;
        Ok(st.inodes[self.ino].len as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let st = self.fs.st();
        st.check_alive()?;
        let i = &st.inodes[self.ino];
        let at = offset as usize;
        if at + buf.len() > i.len {
            return Err(err(io::ErrorKind::UnexpectedEof, "read past the end"));
        }
        buf.copy_from_slice(i.bytes(at, buf.len()));
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.write {
            return Err(err(io::ErrorKind::PermissionDenied, "opened read-only"));
        }
        let mut st = self.fs.st();
        match st.op(|| format!("pwrite ino {} at {offset} len {}", self.ino, buf.len()))? {
            Some(Fault::NoSpace) => return Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(Fault::Io) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            None => {}
        }
        st.inodes[self.ino].write(offset as usize, buf);
        Ok(())
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        let mut st = self.fs.st();
        match st.op(|| format!("allocate ino {} {len}", self.ino))? {
            Some(Fault::NoSpace) => return Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(Fault::Io) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            None => {}
        }
        st.inodes[self.ino].grow(len as usize);
        Ok(())
    }

    fn sync_all(&self) -> io::Result<()> {
        let mut st = self.fs.st();
        let fault = st.op(|| format!("fsync ino {}", self.ino))?;
        let st = &mut *st;
        let i = &mut st.inodes[self.ino];
        let len = i.len;
        if fault.is_some() {
            i.fail_persist(0, len, &mut st.rng);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        i.persist(0, len);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync_all()
    }

    fn try_clone(&self) -> io::Result<SimFile> {
        Ok(SimFile {
            fs: self.fs.clone(),
            ino: self.ino,
            write: self.write,
        })
    }
}

/// A mapping of a [`SimFile`]: the file's bytes themselves (there is no page cache apart from
/// them).
pub struct SimMap {
    /// Keeps the allocation `ptr` points into alive.
    fs: SimFs,
    ino: usize,
    ptr: *mut u8,
}

// SAFETY: `ptr` points into an allocation owned by the file system's state, which `fs` keeps
// alive; the bytes are accessed as the journal accesses a real shared mapping (see `State`).
unsafe impl Send for SimMap {}
// SAFETY: as for `Send`: the mapping itself is never changed, only the bytes it points to, under
// the journal's rules.
unsafe impl Sync for SimMap {}

impl FsMap for SimMap {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn flush(&self, from: usize, len: usize) -> io::Result<()> {
        let mut st = self.fs.st();
        let fault = st.op(|| format!("msync ino {} {from}+{len}", self.ino))?;
        let st = &mut *st;
        let i = &mut st.inodes[self.ino];
        if fault.is_some() {
            i.fail_persist(from, from + len, &mut st.rng);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        i.persist(from, from + len);
        Ok(())
    }

    fn resident(&self, _from: u64, _to: u64) -> bool {
        true
    }

    fn evict(&self) -> io::Result<()> {
        Ok(())
    }
}

/// A held lock of a [`SimFs`].
pub struct SimLock {
    fs: SimFs,
    path: PathBuf,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.fs.st().locks.remove(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(fs: &SimFs, path: &str, data: &[u8]) -> SimFile {
        let f = fs.create_new(Path::new(path)).unwrap();
        f.write_all_at(data, 0).unwrap();
        f
    }

    #[test]
    fn only_synced_bytes_and_entries_survive_a_durable_crash() {
        let fs = SimFs::new(1);
        fs.create_dir_all(Path::new("/d")).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        let a = write(&fs, "/d/a", b"hello");
        a.sync_all().unwrap();
        fs.sync_dir(Path::new("/d")).unwrap();
        a.write_all_at(b"HELLO", 0).unwrap();
        let _b = write(&fs, "/d/b", b"unsynced");
        let img = fs.power_loss(CrashMode::Durable);
        assert_eq!(img.read(Path::new("/d/a")).unwrap(), b"hello");
        assert!(
            img.read(Path::new("/d/b")).is_err(),
            "its name was never synced"
        );
        assert!(
            fs.read(Path::new("/d/a")).is_err(),
            "the crashed disk refuses calls"
        );
    }

    #[test]
    fn a_crash_at_a_call_keeps_the_calls_before_it() {
        let fs = SimFs::new(2);
        fs.create_dir_all(Path::new("/d")).unwrap(); // call 0
        fs.sync_dir(Path::new("/")).unwrap(); // 1
        let a = write(&fs, "/d/a", b"one"); // 2, 3
        fs.sync_dir(Path::new("/d")).unwrap(); // 4
        fs.crash_at(6, CrashMode::Durable);
        a.sync_all().unwrap(); // 5
        assert!(fs.rename(Path::new("/d/a"), Path::new("/d/b")).is_err()); // 6: crashed
        let img = fs.image().expect("crashed");
        assert_eq!(img.read(Path::new("/d/a")).unwrap(), b"one");
    }

    #[test]
    fn a_failed_flush_loses_pages_until_they_are_written_again() {
        let fs = SimFs::new(3);
        fs.create_dir_all(Path::new("/d")).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
        let f = fs.create_new(Path::new("/d/m")).unwrap();
        f.allocate(3 * PAGE).unwrap();
        f.sync_all().unwrap();
        fs.sync_dir(Path::new("/d")).unwrap();
        let m = fs.map(&f, Path::new("/d/m"), 3 * PAGE).unwrap();
        // SAFETY: in bounds of the mapping; nothing else uses it.
        unsafe { std::ptr::write_bytes(m.ptr(), 7, (3 * PAGE) as usize) };
        fs.fail_at(fs.ops(), Fault::Io);
        assert!(m.flush(0, (3 * PAGE) as usize).is_err());
        m.flush(0, (3 * PAGE) as usize).unwrap();
        // Written again, a lost page is dirty again and the next flush writes it.
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(m.ptr(), 9, PAGE as usize) };
        m.flush(0, (3 * PAGE) as usize).unwrap();
        let img = fs.power_loss(CrashMode::Durable);
        let got = img.read(Path::new("/d/m")).unwrap();
        assert!(
            got[PAGE as usize..(3 * PAGE) as usize].contains(&0),
            "a later successful flush did not write what the failed one lost"
        );
        assert!(
            got[..PAGE as usize].iter().all(|&b| b == 9),
            "a flush after the page was written again did not write it"
        );
    }
}
