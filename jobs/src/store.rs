//! The job table on the head's disk: one folder per job, holding its
//! record (`job.json`, replaced whole on each change: written beside,
//! synced, renamed), its log (`driver.log`) and, once its entrypoint
//! exited, the exit status (`exit_status`).

use crate::error::JobError;
use crate::model::JobDetails;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A job's record: what the API shows, and what finds its process again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JobRecord {
    /// Submission order, for listing and retention.
    pub(crate) seq: u64,
    pub(crate) details: JobDetails,
    /// The entrypoint's process (its process group leader), once started.
    pub(crate) pid: Option<u32>,
    /// When that process started, in clock ticks since boot
    /// (`/proc/<pid>/stat`), so that a reused pid is not taken for it.
    pub(crate) pid_start: Option<u64>,
    /// A user asked to stop it (kept, so that a head started again still
    /// reports it STOPPED rather than FAILED).
    #[serde(default)]
    pub(crate) stop_requested: bool,
}

/// The folders of the job table.
#[derive(Debug, Clone)]
pub(crate) struct JobFiles {
    dir: PathBuf,
}

impl JobFiles {
    pub(crate) fn open(dir: PathBuf) -> Result<JobFiles, JobError> {
        std::fs::create_dir_all(&dir)
            .map_err(JobError::disk("cannot make the jobs folder", &dir))?;
        Ok(JobFiles { dir })
    }

    pub(crate) fn folder(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    pub(crate) fn log(&self, id: &str) -> PathBuf {
        self.folder(id).join("driver.log")
    }

    pub(crate) fn exit_status(&self, id: &str) -> PathBuf {
        self.folder(id).join("exit_status")
    }

    /// Every record found, oldest first; a folder whose record cannot be
    /// read is logged and skipped (never deleted).
    pub(crate) fn load(&self) -> Result<Vec<JobRecord>, JobError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(JobError::disk("cannot read the jobs folder", &self.dir))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path().join("job.json");
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            match serde_json::from_slice::<JobRecord>(&bytes) {
                Ok(record) => out.push(record),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "skipped a job record that cannot be read")
                }
            }
        }
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    /// Writes a record durably.
    pub(crate) fn save(&self, record: &JobRecord) -> Result<(), JobError> {
        let id = record.details.submission_id.as_deref().unwrap_or_default();
        let folder = self.folder(id);
        std::fs::create_dir_all(&folder)
            .map_err(JobError::disk("cannot make the job's folder", &folder))?;
        let path = folder.join("job.json");
        let partial = folder.join("job.json.partial");
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| JobError::Disk {
            what: "cannot encode the record of",
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        write_synced(&partial, &bytes).map_err(JobError::disk("cannot write", &partial))?;
        std::fs::rename(&partial, &path).map_err(JobError::disk("cannot replace", &path))
    }

    pub(crate) fn remove(&self, id: &str) -> Result<(), JobError> {
        let folder = self.folder(id);
        match std::fs::remove_dir_all(&folder) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(JobError::disk("cannot remove", &folder)(e)),
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
