//! The storage seam: every file-system call the journal makes goes through [`Fs`], so that a test
//! can replace the disk with one that loses unsynced writes, tears pages and fails calls
//! (`sim::SimFs`, the storage fault simulator, feature `sim`). The relay uses [`OsFs`], the real calls;
//! the journal's types take the file system as a generic parameter that defaults to it, so the
//! seam costs nothing in the release build (one implementation, monomorphized).
//!
//! Writes of record bytes are not calls: the journal copies records into a shared mapping
//! ([`FsMap::ptr`]) and makes them durable with [`FsMap::flush`] (msync). What a crash may keep of
//! bytes written but not flushed is the file system's business; `journal/FORMAT.md`, "Recovery",
//! says what the journal assumes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::Path;

use memmap2::{MmapOptions, MmapRaw};

/// The journal's directories and files are its owner's alone: its records hold each queue's keys
/// and DH secret (`docs/ARCHITECTURE.md` §5). A file that exists keeps its mode.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// A file system: the directory operations and the files the journal opens.
pub trait Fs: Clone + Send + Sync + 'static {
    type File: FsFile;
    type Map: FsMap;
    /// An exclusive lock on a file (the group's `.lock`), released when dropped.
    type Lock: Send + Sync;

    /// Creates `dir` and every missing directory above it.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names of the entries of `dir` (files and directories), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn is_dir(&self, path: &Path) -> bool;
    /// Takes an exclusive lock on `path` (created if missing) without waiting: `Ok(None)` when
    /// someone else holds it.
    fn try_lock(&self, path: &Path) -> io::Result<Option<Self::Lock>>;
    /// Opens an existing file, for reading, or for reading and writing.
    fn open(&self, path: &Path, write: bool) -> io::Result<Self::File>;
    /// Creates a new file for reading and writing; fails if it exists.
    fn create_new(&self, path: &Path) -> io::Result<Self::File>;
    /// Creates or truncates a file, for writing.
    fn create(&self, path: &Path) -> io::Result<Self::File>;
    /// The whole content of a file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// fsync of a directory: the creations, renames and removals in it become durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Maps the first `len` bytes of `file` shared, for reading and writing.
    fn map(&self, file: &Self::File, path: &Path, len: u64) -> io::Result<Self::Map>;
}

/// An open file.
pub trait FsFile: Send + Sync + Sized + 'static {
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Allocates disk for the first `len` bytes and makes the file that long (fallocate): a full
    /// disk shows up here, never later as a fault on a mapped page.
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// fsync: data and metadata durable.
    fn sync_all(&self) -> io::Result<()>;
    /// fdatasync.
    fn sync_data(&self) -> io::Result<()>;
    fn try_clone(&self) -> io::Result<Self>;
}

/// A shared mapping of a file's first bytes.
pub trait FsMap: Send + Sync + 'static {
    /// The first byte. Valid for `len` bytes for as long as the mapping lives; the journal's
    /// `Segment` says who may read and write which bytes.
    fn ptr(&self) -> *mut u8;
    /// msync (MS_SYNC) of `[from, from + len)`: those bytes are durable when it returns `Ok`.
    fn flush(&self, from: usize, len: usize) -> io::Result<()>;
    /// Whether every page of `[from, to)` is in memory (reading them takes no disk read).
    fn resident(&self, from: u64, to: u64) -> bool;
    /// Drops the mapping's clean pages from memory; later reads fault them in again.
    fn evict(&self) -> io::Result<()>;
}

/// Whether an I/O error means the disk (or a quota, or the file size limit) has no room.
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG)
    )
}

// ---------------------------------------------------------------------------------------------
// The real file system.

/// The operating system's files: what the relay and the `smp-journal` tool use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OsFs;

impl Fs for OsFs {
    type File = File;
    type Map = OsMap;
    type Lock = File;

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR_MODE)
            .create(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            out.push(e?.file_name().to_string_lossy().into_owned());
        }
        Ok(out)
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<File>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(PRIVATE_FILE_MODE)
            .open(path)?;
        // SAFETY: plain syscall on a descriptor we own.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok(Some(f));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(None)
        } else {
            Err(e)
        }
    }

    fn open(&self, path: &Path, write: bool) -> io::Result<File> {
        OpenOptions::new().read(true).write(write).open(path)
    }

    fn create_new(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(PRIVATE_FILE_MODE)
            .open(path)
    }

    fn create(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(PRIVATE_FILE_MODE)
            .open(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn map(&self, file: &File, _path: &Path, len: u64) -> io::Result<OsMap> {
        // Why mapping is sound (memmap2's `map_raw` is a safe call only because it hands out a
        // raw pointer; the slices the journal's `Segment` builds from it rely on the following).
        // A mapped file could be truncated (the next access would SIGBUS) or changed by someone
        // else while mapped. Segment files are preallocated to their full length before they are
        // mapped and the journal never truncates or resizes them (no `set_len`, no `ftruncate`
        // anywhere): they only ever go away whole by unlink, which keeps the inode alive while
        // mapped. Only one `Journal` per group has them mapped, guaranteed by the exclusive
        // `flock` on the group's lock file held for as long as any handle of that journal lives;
        // `repair` takes the same lock and the reader never maps. A person truncating a segment
        // of a running relay by hand is outside this contract.
        let map = MmapOptions::new().len(len as usize).map_raw(file)?;
        Ok(OsMap {
            map,
            file: file.try_clone()?,
        })
    }
}

impl FsFile for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        // SAFETY: plain syscalls on a file descriptor we own, no memory passed.
        let r = unsafe { libc::fallocate(self.as_raw_fd(), 0, 0, len as libc::off_t) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
        // File systems without fallocate: posix_fallocate writes the blocks instead.
        // SAFETY: as above.
        let r = unsafe { libc::posix_fallocate(self.as_raw_fd(), 0, len as libc::off_t) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(r))
        }
    }

    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }

    fn try_clone(&self) -> io::Result<File> {
        File::try_clone(self)
    }
}

/// A shared mapping of a real file.
pub struct OsMap {
    map: MmapRaw,
    /// For `posix_fadvise` in `evict`.
    file: File,
}

impl FsMap for OsMap {
    fn ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn flush(&self, from: usize, len: usize) -> io::Result<()> {
        self.map.flush_range(from, len)
    }

    fn resident(&self, from: u64, to: u64) -> bool {
        const PAGE: u64 = 4096;
        let to = to.min(self.map.len() as u64);
        if from >= to {
            return true;
        }
        let start = from / PAGE * PAGE;
        let pages = (to - start).div_ceil(PAGE) as usize;
        // A record is at most a segment; most take one or two pages.
        let mut small = [0u8; 8];
        let mut large = Vec::new();
        let vec: &mut [u8] = if pages <= small.len() {
            &mut small[..pages]
        } else {
            large.resize(pages, 0);
            &mut large
        };
        // SAFETY: `start` is page-aligned (the mapping starts on a page and `start` is a multiple
        // of 4096, the page size of every Linux platform this runs on; on a larger page size
        // mincore fails with EINVAL and we say "not resident") and `[start, to)` lies inside the
        // mapping, which lives as long as `self`. mincore only reads the page tables for that
        // range and writes one byte per page into `vec`, which has room for `pages` bytes.
        let r = unsafe {
            libc::mincore(
                self.map.as_mut_ptr().add(start as usize).cast(),
                (to - start) as usize,
                vec.as_mut_ptr(),
            )
        };
        r == 0 && vec.iter().all(|b| b & 1 == 1)
    }

    fn evict(&self) -> io::Result<()> {
        // SAFETY: the range is exactly our live mapping. MADV_DONTNEED on a MAP_SHARED file
        // mapping only drops this process's page-table entries: the next access faults the page
        // in again from the page cache or the file, so no data is lost and no reference into
        // the mapping becomes invalid.
        let r = unsafe {
            libc::madvise(
                self.map.as_mut_ptr().cast(),
                self.map.len(),
                libc::MADV_DONTNEED,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: plain syscall on a descriptor we own, no memory passed.
        let r =
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(())
    }
}
