//! The programs this node knows ([`Programs`]): what the component is
//! built with, which file holds which program, and the locks of the
//! programs being fetched. Fetching them is in `crate::programs`.

use prism_protocol::ids::NodeId;
use prism_protocol::program::Program;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The programs this node knows: which file holds which program (so a
/// file is read once per change), and one lock per program being fetched
/// (a second lessee of it waits, then finds the copy; other programs are
/// fetched meanwhile).
#[derive(Debug)]
pub(crate) struct Programs {
    /// This node, named in errors.
    pub(super) node_id: NodeId,
    /// Where copies are kept: `<session>/programs`.
    pub(super) folder: PathBuf,
    fetching: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    named: parking_lot::Mutex<HashMap<PathBuf, (FileKey, Program)>>,
}

/// What tells one version of a file from another without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileKey {
    fn of(path: &Path) -> Option<FileKey> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        Some(FileKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

impl Programs {
    /// The programs of node `node_id`, whose copies go in `folder`.
    pub(crate) fn new(node_id: NodeId, folder: PathBuf) -> Self {
        Programs {
            node_id,
            folder,
            fetching: Default::default(),
            named: Default::default(),
        }
    }

    /// Says if the file at `path` holds `program`, reading the file (off
    /// the runtime's threads) only when it changed since last asked.
    pub(super) async fn holds(&self, path: &Path, program: &Program) -> bool {
        let Some(key) = FileKey::of(path) else {
            return false;
        };
        let known = self
            .named
            .lock()
            .get(path)
            .filter(|(k, _)| *k == key)
            .map(|(_, p)| p.clone());
        let named = match known {
            Some(p) => p,
            None => match name_file(path).await {
                Some(p) => {
                    self.named
                        .lock()
                        .insert(path.to_path_buf(), (key, p.clone()));
                    p
                }
                None => return false,
            },
        };
        same(&named, program)
    }

    pub(super) fn lock_for(&self, program: &Program) -> Arc<tokio::sync::Mutex<()>> {
        self.fetching
            .lock()
            .entry(program.id.clone())
            .or_default()
            .clone()
    }
}

/// The program in the file at `path`, read off the runtime's threads (a
/// file without a build id is hashed whole); `None` if it cannot be read.
pub(super) async fn name_file(path: &Path) -> Option<Program> {
    let at = path.to_path_buf();
    tokio::task::spawn_blocking(move || Program::of(&at))
        .await
        .ok()?
        .ok()
}

/// Whether two names are of one program (a whole file or its image).
pub(super) fn same(a: &Program, b: &Program) -> bool {
    a.same_image(b)
}
