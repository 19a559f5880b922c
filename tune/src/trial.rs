//! What a trial is judged by: the [`Mode`] that says whether a metric is
//! better high or low, and the [`TrialResult`] a finished trial leaves. A
//! leaf of the crate: the tuner, its schedulers and its saved state all
//! use these, and this module uses none of them.

use prism_train::{Checkpoint, Metrics};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

/// Whether a metric is better high or low.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Higher is better (accuracy).
    Max,
    /// Lower is better (loss).
    Min,
}

/// What one trial did.
#[derive(Debug, Clone)]
pub struct TrialResult {
    /// `trial_00000`, ...: its folder's name in the experiment folder.
    pub name: String,
    /// The config it ran with.
    pub config: Value,
    /// Its last report (with the Trainer's `training_iteration`, ...).
    pub metrics: Option<Metrics>,
    /// Every report, in order.
    pub metrics_history: Vec<Metrics>,
    /// Its latest checkpoint.
    pub checkpoint: Option<Checkpoint>,
    /// Its folder (`params.json`, `result.json`, `progress.csv`,
    /// checkpoints).
    pub path: PathBuf,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// A scheduler stopped it early
    /// ([`Decision::Stop`](crate::Decision::Stop)); a trial that reached a
    /// stop condition or its `max_t` is complete, not stopped.
    pub stopped_early: bool,
}

impl TrialResult {
    /// The metric's value in the trial's last report.
    pub fn last(&self, metric: &str) -> Option<f64> {
        self.metrics.as_ref()?.get(metric)?.as_f64()
    }

    /// The trial's report with the best value of `metric` in `mode` (Ray's
    /// `best_result` of a trial); `None` if it never reported it.
    pub fn best(&self, metric: &str, mode: Mode) -> Option<&Metrics> {
        let scored = self
            .metrics_history
            .iter()
            .filter_map(|m| Some((m.get(metric)?.as_f64()?, m)))
            .filter(|(v, _)| !v.is_nan());
        let best = match mode {
            Mode::Max => scored.max_by(|a, b| a.0.total_cmp(&b.0)),
            Mode::Min => scored.min_by(|a, b| a.0.total_cmp(&b.0)),
        };
        best.map(|(_, m)| m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trials_best_report_is_found_by_metric_and_mode() {
        let report = |v: f64| match serde_json::json!({ "loss": v }) {
            Value::Object(m) => m,
            _ => unreachable!("an object literal"),
        };
        let trial = TrialResult {
            name: "trial_00000".into(),
            config: Value::Null,
            metrics: Some(report(0.5)),
            metrics_history: vec![report(0.9), report(0.2), report(f64::NAN), report(0.5)],
            checkpoint: None,
            path: PathBuf::new(),
            error: None,
            stopped_early: false,
        };
        let lowest = trial
            .best("loss", Mode::Min)
            .and_then(|m| m["loss"].as_f64());
        assert_eq!(lowest, Some(0.2));
        let highest = trial
            .best("loss", Mode::Max)
            .and_then(|m| m["loss"].as_f64());
        assert_eq!(highest, Some(0.9));
        assert!(trial.best("accuracy", Mode::Max).is_none());
        assert_eq!(trial.last("loss"), Some(0.5));
    }
}
