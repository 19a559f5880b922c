//! Whole files as rows (Ray's `read_binary_files`): each file is one row
//! whose `bytes` column holds its contents, optionally after a `path`
//! column.
//! The files are listed and sized when the dataset is made, grouped into
//! blocks of about [`BLOCK_BYTES`], and read by the blocks' tasks.

use super::batch::{Batch, Column};
use super::error::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A block of files holds about this many bytes (a single larger file is
/// a block of its own).
pub(crate) const BLOCK_BYTES: u64 = 64 << 20;

/// At most this many files make one block, however small they are.
pub(crate) const BLOCK_FILES: usize = 1024;

/// The files of a `read_binary_files` source, in order, with their sizes
/// when listed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct BinaryFiles {
    pub(crate) files: Vec<(PathBuf, u64)>,
    pub(crate) include_paths: bool,
}

fn io(path: &Path, source: std::io::Error) -> DataError {
    DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The regular files under `dir` with their sizes, recursively, skipping
/// names that start with `.` (hidden files, editors' and tools'
/// temporaries).
fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| io(dir, e)))
        .collect::<Result<_>>()?;
    entries.sort();
    for path in entries {
        let hidden = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        // Links followed, as `read` will.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(&path, out)?;
        } else if meta.is_file() {
            out.push((path, meta.len()));
        }
    }
    Ok(())
}

/// Lists `paths` (files, or directories read recursively in name order)
/// and sizes each file.
pub(crate) fn scan(paths: Vec<PathBuf>, include_paths: bool) -> Result<BinaryFiles> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(&path).map_err(|e| io(&path, e))?;
        if meta.is_dir() {
            walk(&path, &mut files)?;
        } else {
            files.push((path, meta.len()));
        }
    }
    Ok(BinaryFiles {
        files,
        include_paths,
    })
}

impl BinaryFiles {
    /// The files, cut into the groups that blocks read.
    pub(crate) fn groups(&self) -> Vec<Vec<PathBuf>> {
        let mut groups = Vec::new();
        let mut group: Vec<PathBuf> = Vec::new();
        let mut bytes = 0u64;
        for (path, size) in &self.files {
            let full = bytes + size > BLOCK_BYTES || group.len() == BLOCK_FILES;
            if full && !group.is_empty() {
                groups.push(std::mem::take(&mut group));
                bytes = 0;
            }
            group.push(path.clone());
            bytes += size;
        }
        if !group.is_empty() {
            groups.push(group);
        }
        groups
    }
}

/// Reads `files` into batches of up to `chunk_rows` rows.
pub(crate) fn read(
    files: &[PathBuf],
    include_paths: bool,
    chunk_rows: usize,
) -> Result<Vec<Batch>> {
    let mut out = Vec::new();
    for chunk in files.chunks(chunk_rows.max(1)) {
        let mut contents = Vec::with_capacity(chunk.len());
        for path in chunk {
            contents.push(std::fs::read(path).map_err(|e| io(path, e))?);
        }
        let mut columns = Vec::with_capacity(2);
        if include_paths {
            let paths = chunk.iter().map(|p| p.display().to_string()).collect();
            columns.push(("path".to_string(), Column::Str(paths)));
        }
        columns.push(("bytes".to_string(), Column::Bytes(contents)));
        out.push(Batch::new(columns)?);
    }
    Ok(out)
}
