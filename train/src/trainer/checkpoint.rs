//! Checkpoints: directories of files, persisted whole or not at all.

use super::error::{io_err, TrainError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A checkpoint: a directory of files a training function wrote (Ray's
/// `Checkpoint`).
///
/// A worker makes one from any directory with [`Checkpoint::from_directory`]
/// and hands it to [`crate::report`]; the Trainer copies it into the run's
/// folder as `checkpoint_NNNNNN`. A resumed worker reads it back with
/// [`crate::get_checkpoint`].
///
/// ```
/// use prism_train::Checkpoint;
///
/// let dir = std::env::temp_dir().join(format!("ckpt-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// std::fs::write(dir.join("model.bin"), b"weights")?;
/// let checkpoint = Checkpoint::from_directory(&dir);
/// let copy = dir.with_extension("copy");
/// checkpoint.to_directory(&copy)?;
/// assert_eq!(std::fs::read(copy.join("model.bin"))?, b"weights");
/// # std::fs::remove_dir_all(&dir)?; std::fs::remove_dir_all(&copy)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    path: PathBuf,
}

impl Checkpoint {
    /// The checkpoint in `path` (its files are read when it is reported or
    /// copied).
    pub fn from_directory(path: impl Into<PathBuf>) -> Self {
        Checkpoint { path: path.into() }
    }

    /// Where its files are.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Copies its files into `dest` (created if needed), returning `dest`.
    pub fn to_directory(&self, dest: impl AsRef<Path>) -> Result<PathBuf, TrainError> {
        let dest = dest.as_ref();
        copy_tree(&self.path, dest)?;
        Ok(dest.to_path_buf())
    }
}

/// Copies the files under `from` into `to`, merging with what is there.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<(), TrainError> {
    std::fs::create_dir_all(to).map_err(|e| io_err("create", to, e))?;
    let entries =
        std::fs::read_dir(from).map_err(|e| io_err("read the checkpoint folder", from, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_err("read the checkpoint folder", from, e))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let kind = entry.file_type().map_err(|e| io_err("inspect", &src, e))?;
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            // Copy under a name of this process, then rename: ranks merging
            // files of the same name never leave a torn one.
            let partial = to.join(format!(
                ".{}.partial-{}",
                entry.file_name().to_string_lossy(),
                std::process::id()
            ));
            std::fs::copy(&src, &partial).map_err(|e| io_err("copy", &src, e))?;
            std::fs::rename(&partial, &dst).map_err(|e| io_err("rename into place", &dst, e))?;
        }
    }
    Ok(())
}

/// Flushes a finished file or folder to disk.
pub(crate) fn sync_path(path: &Path) -> Result<(), TrainError> {
    let f = std::fs::File::open(path).map_err(|e| io_err("open", path, e))?;
    f.sync_all().map_err(|e| io_err("sync", path, e))
}

/// Syncs every file under `dir`, then `dir` itself.
pub(crate) fn sync_tree(dir: &Path) -> Result<(), TrainError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_err("read", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_err("read", dir, e))?;
        let path = entry.path();
        if entry
            .file_type()
            .map_err(|e| io_err("inspect", &path, e))?
            .is_dir()
        {
            sync_tree(&path)?;
        } else {
            sync_path(&path)?;
        }
    }
    sync_path(dir)
}
