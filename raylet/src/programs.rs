//! The programs of jobs that started on other nodes.
//!
//! Workers run their driver's own executable. A process of another node
//! that leases workers here says which program it runs (its build id, see
//! [`prism_protocol::program`]) and where its file lies on its own
//! machine. This node runs that file when it has the same program at the
//! same path (a shared file system, or the same install on every machine);
//! otherwise it reads the program from the leasing process itself, over the
//! connection it registered on (`ReadProgram`), once: the copy is kept in
//! `<session>/programs/<id>/` and serves every later job of that program.
//! Only the program's runnable image is read (see
//! [`prism_protocol::program`]: a debug build's sections stay behind). The
//! copy is checked by its build id and size (the bytes themselves are
//! guarded by TCP's checksums, and by TLS where the cluster speaks it).

pub(crate) mod state;

use prism_protocol::error::Error;
use prism_protocol::messages::{ReadProgram, PROGRAM_CHUNK};
use prism_protocol::program::Program;
use prism_protocol::rpc::Connection;
pub(crate) use state::Programs;
use state::{name_file, same};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long one chunk may take to arrive.
const CHUNK_LIMIT: Duration = Duration::from_secs(60);
/// Chunks asked for at once.
const IN_FLIGHT: usize = 3;

impl Programs {
    /// The file to start the job's workers from: `path` if it holds
    /// `program` (or no program was named), else this node's copy of it,
    /// fetched from the process on `lessee` if this node has none.
    pub(crate) async fn program_file(
        &self,
        path: PathBuf,
        program: Option<Program>,
        lessee: &Connection,
    ) -> Result<PathBuf, Error> {
        let refuse = |reason: String| Error::ProgramUnavailable {
            holder: format!("node {}", self.node_id),
            reason,
        };
        let Some(program) = program else {
            if path.is_file() {
                return Ok(path);
            }
            return Err(refuse(format!(
                "{} is not on this machine (every node must have the driver's binary at the \
                 same path)",
                path.display()
            )));
        };
        program.runs_here().map_err(refuse)?;
        if self.holds(&path, &program).await {
            return Ok(path);
        }
        let name = copy_name(&path);
        let programs = &self.folder;
        let folder = programs.join(program.folder_name());
        let copy = folder.join(name);
        if copy.is_file() {
            return Ok(copy);
        }
        let lock = self.lock_for(&program);
        let _one_at_a_time = lock.lock().await;
        if copy.is_file() {
            return Ok(copy);
        }
        let started = Instant::now();
        // Written beside the programs' folders, never inside one: no
        // program's file can be taken for it.
        let partial = programs.join(format!(".fetching-{}", program.folder_name()));
        fetch(lessee, &program, &partial, &folder, &copy)
            .await
            .map_err(|e| refuse(format!("fetching it from {}: {e}", lessee.peer())))?;
        tracing::info!(
            program = %program.id,
            bytes = program.image_len(),
            of = program.size,
            from = %lessee.peer(),
            ms = started.elapsed().as_millis() as u64,
            file = %copy.display(),
            "fetched a job's program"
        );
        Ok(copy)
    }
}

/// Reads `program` from `lessee` into `copy` (through `partial`, renamed
/// once whole and checked).
async fn fetch(
    lessee: &Connection,
    program: &Program,
    partial: &Path,
    folder: &Path,
    copy: &Path,
) -> Result<(), String> {
    std::fs::create_dir_all(folder).map_err(|e| format!("make {}: {e}", folder.display()))?;
    let written = write_chunks(lessee, program, partial).await;
    let checked = match written {
        Ok(()) => check(partial, program).await,
        Err(e) => Err(e),
    };
    if let Err(e) = checked {
        let _ = std::fs::remove_file(partial);
        return Err(e);
    }
    std::fs::rename(partial, copy).map_err(|e| format!("keep {}: {e}", copy.display()))
}

async fn write_chunks(
    lessee: &Connection,
    program: &Program,
    partial: &Path,
) -> Result<(), String> {
    let mut file =
        std::fs::File::create(partial).map_err(|e| format!("create {}: {e}", partial.display()))?;
    let mut asked = 0u64;
    let mut pending = VecDeque::new();
    loop {
        while pending.len() < IN_FLIGHT && asked < program.image_len() {
            let len = PROGRAM_CHUNK.min(program.image_len() - asked);
            let (conn, read) = (
                lessee.clone(),
                ReadProgram {
                    id: program.id.clone(),
                    offset: asked,
                    len,
                },
            );
            pending.push_back((
                len,
                tokio::spawn(
                    async move { tokio::time::timeout(CHUNK_LIMIT, conn.request(read)).await },
                ),
            ));
            asked += len;
        }
        let Some((len, chunk)) = pending.pop_front() else {
            return Ok(());
        };
        let chunk = match chunk.await {
            Ok(Ok(Ok(chunk))) => Ok(chunk),
            Ok(Ok(Err(e))) => Err(format!(
                "{e} (the job's process may have exited; run the job again)"
            )),
            Ok(Err(_)) => Err(format!(
                "no chunk arrived within {CHUNK_LIMIT:?} (is the network between the nodes \
                 working? run the job again)"
            )),
            Err(e) => Err(e.to_string()),
        };
        let written = chunk.and_then(|chunk| {
            if chunk.len() as u64 != len {
                return Err(format!(
                    "a chunk of {} bytes came for one of {len}; are both sides built from \
                     the same Prism version?",
                    chunk.len()
                ));
            }
            file.write_all(&chunk).map_err(|e| {
                format!(
                    "write {}: {e} (is the node's disk full?)",
                    partial.display()
                )
            })
        });
        if let Err(e) = written {
            for (_, asked) in pending {
                asked.abort();
            }
            return Err(e);
        }
    }
}

/// The name of a copy of the program at `path`: its file name, without the
/// ` (deleted)` Linux adds to a running program's path once its file is
/// removed or replaced (as a rebuild does).
fn copy_name(path: &Path) -> std::ffi::OsString {
    let Some(name) = path.file_name() else {
        return "program".into();
    };
    match name.to_str().and_then(|n| n.strip_suffix(" (deleted)")) {
        Some(kept) if !kept.is_empty() => kept.into(),
        _ => name.to_os_string(),
    }
}

/// Checks that the fetched file is the program, and makes it executable.
async fn check(partial: &Path, program: &Program) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    program
        .seal_image(partial)
        .map_err(|e| format!("finish {}: {e}", partial.display()))?;
    if !name_file(partial).await.is_some_and(|p| same(&p, program)) {
        return Err(format!(
            "the bytes fetched are not program {} ({} bytes of {}): was the driver's binary \
             rebuilt while the job started? run the job again",
            program.id,
            program.image_len(),
            program.size
        ));
    }
    std::fs::set_permissions(partial, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("make {} executable: {e}", partial.display()))
}

#[cfg(test)]
mod tests {
    use super::copy_name;
    use std::path::Path;

    #[test]
    fn a_copy_is_named_after_the_program_without_deleted() {
        assert_eq!(copy_name(Path::new("/a/driver")), "driver");
        assert_eq!(copy_name(Path::new("/a/driver (deleted)")), "driver");
        assert_eq!(copy_name(Path::new("/a/ (deleted)")), " (deleted)");
        assert_eq!(copy_name(Path::new("/")), "program");
    }
}
