//! Spill files: one per spill of an object, named by its id and the
//! spill's number (`SpillFile`), in the node's spill directory. Plain blocking file I/O, called on blocking threads;
//! the object table decides what is spilled and restored
//! (`prism_object_store::ObjectTable::pick_spills`).

use prism_object_store::{ObjectTable, Placement, Segment, SpillFile};
use prism_protocol::error::Error;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// How a node spills objects.
#[derive(Debug, Clone)]
pub struct SpillConfig {
    /// Whether objects are spilled at all (off: a full store is an error).
    pub enabled: bool,
    /// The store's fill level, as a fraction of its capacity, from which
    /// unpinned objects are spilled in the background.
    pub threshold: f64,
    /// Where spill files go.
    pub dir: PathBuf,
}

impl SpillConfig {
    /// Checks the settings and makes the directory, naming what is wrong.
    pub(crate) fn prepare(&self) -> Result<(), Error> {
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(Error::invalid(
                "object_spilling_threshold",
                format!(
                    "{}: give a fraction of the store in (0, 1], such as 0.8",
                    self.threshold
                ),
            ));
        }
        if !self.enabled {
            return Ok(());
        }
        let unusable = |e: std::io::Error| {
            Error::invalid(
                "object_spill_dir",
                format!(
                    "{} cannot hold spill files: {e}; give a writable directory, or turn \
                     spilling off with object_spilling = false",
                    self.dir.display()
                ),
            )
        };
        std::fs::create_dir_all(&self.dir).map_err(unusable)?;
        let probe = self.dir.join(".prism-probe");
        std::fs::write(&probe, b"ok").map_err(unusable)?;
        let _ = std::fs::remove_file(probe);
        Ok(())
    }

    /// Where a spill's file is.
    pub(crate) fn path(&self, file: SpillFile) -> PathBuf {
        self.dir.join(file.file_name())
    }

    /// Whether a spill's file is there.
    pub(crate) fn exists(&self, file: SpillFile) -> bool {
        self.path(file).exists()
    }

    /// Writes the object's bytes from the segment to its file: its whole
    /// footprint (a multiple of the store's page alignment) with direct
    /// I/O, bypassing the page cache, where the file system allows it.
    pub(crate) fn write(
        &self,
        segment: &Segment,
        file: SpillFile,
        at: Placement,
    ) -> Result<(), Error> {
        if let Some(e) = crate::faults::injected("spill_write") {
            return Err(e);
        }
        let (id, path) = (file.id, self.path(file));
        let len = ObjectTable::footprint(at.size);
        let ptr = segment.ptr(at.offset, len)?;
        // SAFETY: the range is in bounds (checked by `ptr`) and allocated to
        // this object, which is sealed (immutable) and kept allocated while
        // it is spilled.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
        let written = open_direct(&path, true).and_then(|mut f| f.write_all(bytes));
        written.map_err(|e| {
            let _ = std::fs::remove_file(&path);
            Error::io(format!("spill object {id} to {}", path.display()), e)
        })
    }

    /// Reads the object's file into its new range of the segment.
    pub(crate) fn read(
        &self,
        segment: &Segment,
        file: SpillFile,
        at: Placement,
    ) -> Result<(), Error> {
        if let Some(e) = crate::faults::injected("restore_read") {
            return Err(e);
        }
        let (id, path) = (file.id, self.path(file));
        let len = ObjectTable::footprint(at.size);
        let ptr = segment.ptr(at.offset, len)?;
        // SAFETY: the range is in bounds and reserved for this restore: no
        // one else writes or reads it until the table marks it restored.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len as usize) };
        open_direct(&path, false)
            .and_then(|mut f| f.read_exact(bytes))
            .map_err(|e| Error::io(format!("restore object {id} from {}", path.display()), e))
    }

    /// Removes a spill's file (its object was freed, restored, or
    /// replaced, or the spill was discarded).
    pub(crate) fn remove(&self, file: SpillFile) {
        let _ = std::fs::remove_file(self.path(file));
    }

    /// Removes every spill file (the node is stopping).
    pub(crate) fn remove_all(&self) {
        if self.enabled {
            remove_files_in(&self.dir);
        }
    }
}

/// Opens a spill file for writing (creating it) or reading, with
/// `O_DIRECT` where the file system supports it (not tmpfs, for one), and
/// without it elsewhere. Buffers and lengths are whole store pages, as
/// direct I/O requires.
fn open_direct(path: &Path, write: bool) -> std::io::Result<std::fs::File> {
    let open = |flags: i32| {
        let mut options = std::fs::OpenOptions::new();
        if write {
            options.write(true).create(true).truncate(true);
        } else {
            options.read(true);
        }
        options.custom_flags(flags).open(path)
    };
    match open(libc::O_DIRECT) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0),
        other => other,
    }
}

fn remove_files_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let _ = std::fs::remove_file(entry.path());
    }
    let _ = std::fs::remove_dir(dir);
}
