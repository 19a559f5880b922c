//! What can go wrong in a tuning experiment.

use std::path::PathBuf;

/// Errors of `prism-tune`. A trial that fails does not fail the
/// experiment: its error is in its [`TrialResult`](crate::TrialResult).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuneError {
    /// A search-space parameter can never be sampled.
    #[error("search space parameter {name:?} {reason}")]
    InvalidSpace {
        /// The parameter's full (dotted) name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting of the experiment cannot work.
    #[error("invalid {field}: {reason}")]
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A Prism call failed (the cluster is not started, say).
    #[error("{action}: {source}")]
    Prism {
        /// What the Tuner was doing.
        action: &'static str,
        /// The runtime's error.
        source: prism::Error,
    },
    /// A file or folder of the experiment could not be written.
    #[error("could not {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// No trial reported the metric asked for.
    #[error("no trial reported the metric {metric:?}; the trials reported {reported:?}")]
    NoResult {
        /// The metric asked for.
        metric: String,
        /// The metrics the trials did report.
        reported: Vec<String>,
    },
}
