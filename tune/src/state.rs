//! What an experiment keeps on disk to be resumed: `tuner.json` in the
//! experiment folder holds every trial's config and which trials finished,
//! rewritten (atomically) as each one does. The trials' own folders hold
//! their reports and checkpoints.

use crate::trial::{Mode, TrialResult};
use crate::TuneError;
use prism_train::{Checkpoint, Metrics};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FILE: &str = "tuner.json";

/// How a trial ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Finished {
    pub(crate) error: Option<String>,
    pub(crate) stopped_early: bool,
}

/// The experiment's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ExperimentState {
    pub(crate) configs: Vec<Value>,
    pub(crate) metric: Option<String>,
    pub(crate) mode: Option<Mode>,
    /// By trial index.
    pub(crate) finished: BTreeMap<usize, Finished>,
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TuneError {
    let path = path.to_path_buf();
    move |source| TuneError::Io {
        action,
        path,
        source,
    }
}

impl ExperimentState {
    /// Writes `dir/tuner.json` (through a temporary file and a rename, so
    /// a driver that dies mid-write leaves the previous record).
    pub(crate) fn save(&self, dir: &Path) -> Result<(), TuneError> {
        let path = dir.join(FILE);
        let tmp = dir.join(format!("{FILE}.tmp"));
        let text = serde_json::to_vec_pretty(self).map_err(|e| TuneError::InvalidConfig {
            field: "experiment state",
            reason: format!("cannot be written as JSON: {e}"),
        })?;
        std::fs::write(&tmp, text).map_err(io("write the experiment state", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("write the experiment state", &path))
    }

    /// Reads `dir/tuner.json`.
    pub(crate) fn load(dir: &Path) -> Result<ExperimentState, TuneError> {
        let path = dir.join(FILE);
        let text = std::fs::read(&path).map_err(io(
            "read the experiment state (is this a folder a Tuner wrote?)",
            &path,
        ))?;
        serde_json::from_slice(&text).map_err(|e| TuneError::InvalidConfig {
            field: "experiment state",
            reason: format!("{} does not parse: {e}", path.display()),
        })
    }
}

/// A finished trial's result, read back from its folder: the reports in
/// `result.json`, the latest `checkpoint_NNNNNN`.
pub(crate) fn load_trial(
    path: PathBuf,
    name: String,
    config: Value,
    how: &Finished,
) -> TrialResult {
    let history: Vec<Metrics> = std::fs::read_to_string(path.join("result.json"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        })
        .collect();
    let checkpoint = std::fs::read_dir(&path)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("checkpoint_"))
        })
        .max()
        .map(Checkpoint::from_directory);
    TrialResult {
        name,
        config,
        metrics: history.last().cloned(),
        metrics_history: history,
        checkpoint,
        path,
        error: how.error.clone(),
        stopped_early: how.stopped_early,
    }
}
