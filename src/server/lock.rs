//! The data directory's exclusive lock. SO_REUSEPORT would silently let a second relay share the port
//! and give a queue two owners, so `start` holds `flock(LOCK_EX)` on `<data-dir>/lock` for its lifetime.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::config::LOCK_FILE;

/// Held while the relay runs; the kernel releases the lock when the process exits, however it exits.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another smp-relay is already running on the data directory {0} (its lock file is held); stop it first or use another --data-dir")]
    Held(PathBuf),
    #[error("cannot open the lock file {0}: {1}")]
    Io(PathBuf, io::Error),
}

pub fn lock_data_dir(data_dir: &Path) -> Result<DataDirLock, LockError> {
    let path = data_dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| LockError::Io(path.clone(), e))?;
    // SAFETY: flock takes a file descriptor that `file` owns and keeps open for the call; it has no
    // memory-safety preconditions.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            LockError::Held(data_dir.to_path_buf())
        } else {
            LockError::Io(path, err)
        });
    }
    Ok(DataDirLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused() {
        let dir = std::env::temp_dir().join(format!("smp-relay-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = lock_data_dir(&dir).unwrap();
        // flock locks belong to the open file description, so a second open in the same process
        // conflicts just as another process would.
        assert!(matches!(lock_data_dir(&dir), Err(LockError::Held(_))));
        drop(first);
        assert!(lock_data_dir(&dir).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
