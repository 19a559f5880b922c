//! What can go wrong with a job, on the head and in a client.

use std::path::PathBuf;

/// An error of the Jobs API. On the head each kind maps to an HTTP status
/// ([`JobError::status`]); a client shows the server's message.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The request is malformed or asks for something not supported (400).
    #[error("{0}")]
    BadRequest(String),
    /// No job has this id (404).
    #[error("no job with submission id {0:?} (`prism job list` shows the jobs the head keeps)")]
    NoSuchJob(String),
    /// No package has this name (404).
    #[error("no package {0:?} was uploaded")]
    NoSuchPackage(String),
    /// A job with this id exists already (400, as Ray answers).
    #[error(
        "a job with submission id {0:?} exists already; choose another id, or none for a new one"
    )]
    Duplicate(String),
    /// The job is not in a state that allows it (409).
    #[error("{0}")]
    Conflict(String),
    /// An upload is larger than the limit (413).
    #[error(
        "the package is {size} bytes, over the limit of {limit} bytes \
             (PRISM_JOB_PACKAGE_LIMIT_BYTES on the head; leave large data out of the \
             working_dir and read it from shared storage)"
    )]
    TooLarge {
        /// The upload's size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The head's disk failed (500).
    #[error("{what} {}: {source}", path.display())]
    Disk {
        /// What was being done.
        what: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The head could not be reached, or answered with something that is
    /// not the Jobs API (client side).
    #[error("{0}")]
    Connect(String),
    /// The head answered with an error status (client side).
    #[error("the head answered {status}: {message}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// Its message.
        message: String,
    },
}

impl JobError {
    /// The HTTP status the head answers this error with.
    pub fn status(&self) -> u16 {
        match self {
            JobError::BadRequest(_) | JobError::Duplicate(_) => 400,
            JobError::NoSuchJob(_) | JobError::NoSuchPackage(_) => 404,
            JobError::Conflict(_) => 409,
            JobError::TooLarge { .. } => 413,
            JobError::Disk { .. } | JobError::Connect(_) => 500,
            JobError::Server { status, .. } => *status,
        }
    }

    pub(crate) fn disk(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> JobError {
        let path = path.into();
        move |source| JobError::Disk { what, path, source }
    }
}
