//! What the crate's test files share: temporary directories and a deterministic number mixer.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh directory under the system's temp directory, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "smp-journal-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Its `journal/` directory, where a relay's data directory keeps the journals.
    pub fn journal(&self) -> PathBuf {
        self.0.join("journal")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// SplitMix64: a well-mixed number from `x`, the same in every process.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A size-limited tmpfs mounted on a fresh directory, unmounted (lazily, so that a file still
/// open does not keep it) and removed when dropped: a real file system that runs out of space.
pub struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_bytes`; `None` (after saying why on stderr) when this process may
    /// not mount (not root, or in a container without the capability): the caller skips its test.
    pub fn mount(name: &str, size_bytes: u64) -> Option<Tmpfs> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let dir = TempDir::new(name);
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let data = CString::new(format!("size={size_bytes}")).unwrap();
        // SAFETY: mount(2) with NUL-terminated strings that live for the call.
        let r = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs here ({e}); run as root to test a full disk"
                );
                return None;
            }
            panic!("mount tmpfs on {}: {e}", dir.path().display());
        }
        Some(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the file system with `name` until it is full; returns the bytes written.
    pub fn fill(&self, name: &str) -> u64 {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path().join(name)).unwrap();
        let chunk = vec![0x55u8; 4096];
        let mut n = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(k) => n += k as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {name}: {e}"),
            }
        }
        n
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let target = CString::new(self.dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: umount2(2) with a NUL-terminated string that lives for the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        // `dir` is removed after this (field drop), now that nothing is mounted on it.
    }
}
