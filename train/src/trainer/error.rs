//! The Trainer's errors.

use crate::collective::CollectiveError;
use crate::data::DataError;
use crate::portable::PortableFnError;
use std::path::{Path, PathBuf};

/// What went wrong in a training run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A setting cannot work.
    #[error("invalid {field}: {reason}")]
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A Prism call failed (cluster not started, actor creation, ...).
    #[error("{action}: {source}")]
    Prism {
        /// What the Trainer was doing.
        action: &'static str,
        /// The runtime's error.
        source: prism::Error,
    },
    /// A file or folder of the run could not be read or written.
    #[error("could not {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The training function returned an error or panicked on a worker.
    #[error("the training function failed on worker {rank}: {message}")]
    WorkerFailed {
        /// The worker's world rank.
        rank: usize,
        /// The error or panic message.
        message: String,
    },
    /// The training function could not start on a worker (for instance, the
    /// worker runs another build of the program); not retried.
    #[error("the training function could not start on worker {rank}: {message}")]
    WorkerStart {
        /// The worker's world rank.
        rank: usize,
        /// Why.
        message: String,
    },
    /// A worker's process died or was killed.
    #[error("worker {rank} died: {cause}")]
    WorkerDied {
        /// The worker's world rank.
        rank: usize,
        /// What the runtime observed.
        cause: prism::Error,
    },
    /// Workers disagreed about the run (e.g. reported a different number
    /// of times: every worker must call `report` equally often).
    #[error("workers disagree: {0}")]
    Inconsistent(String),
    /// The run failed more often than `FailureConfig::max_failures` allows.
    #[error(
        "training failed {failures} time(s) (max_failures = {max_failures}); last cause: {cause}"
    )]
    TrainingFailed {
        /// Failures seen.
        failures: usize,
        /// The limit.
        max_failures: usize,
        /// The last failure.
        cause: Box<TrainError>,
    },
    /// A worker-side call made outside a training function.
    #[error("{0} must be called inside a training function run by the Trainer")]
    NotInWorker(&'static str),
    /// `report` got metrics that are not a JSON object of named values.
    #[error("metrics must serialize to a JSON object (a struct or a map): {0}")]
    Metrics(String),
    /// `get_dataset_shard` named a dataset the Trainer was not given.
    #[error("no dataset named {name:?} was given to the Trainer (it has: {known:?})")]
    UnknownDataset {
        /// The name asked for.
        name: String,
        /// The names given.
        known: Vec<String>,
    },
    /// The workers' collective group failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A dataset operation failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// The training function could not be sent to the workers.
    #[error(transparent)]
    Portable(#[from] PortableFnError),
}

pub(crate) fn io_err(action: &'static str, path: &Path, source: std::io::Error) -> TrainError {
    TrainError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn prism_err(action: &'static str) -> impl FnOnce(prism::Error) -> TrainError {
    move |source| TrainError::Prism { action, source }
}
