//! Trial schedulers: after each report a scheduler decides whether the
//! trial goes on. [`Fifo`] lets every trial run to its end; [`Asha`] stops
//! the trials that fall behind, as Ray Tune's `ASHAScheduler` does.

use crate::tuner::Mode;
use crate::TuneError;
use prism_train::Metrics;
use std::collections::HashMap;

/// What a trial does after a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// It goes on.
    Continue,
    /// It stops now; its reports and checkpoints so far are kept.
    Stop,
}

/// Decides, report by report, which trials go on. One scheduler serves
/// every trial of an experiment (calls come from the trials' threads, one
/// at a time).
pub trait TrialScheduler: Send + std::fmt::Debug {
    /// Called before the first trial with the experiment's metric and mode;
    /// fails if the scheduler's settings cannot work.
    fn setup(&mut self, metric: Option<&str>, mode: Option<Mode>) -> Result<(), TuneError>;

    /// A trial reported `metrics` (with the Trainer's `training_iteration`).
    fn on_result(&mut self, trial: &str, metrics: &Metrics) -> Decision;
}

/// Every trial runs to its end (Ray's `FIFOScheduler`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fifo;

impl TrialScheduler for Fifo {
    fn setup(&mut self, _: Option<&str>, _: Option<Mode>) -> Result<(), TuneError> {
        Ok(())
    }

    fn on_result(&mut self, _: &str, _: &Metrics) -> Decision {
        Decision::Continue
    }
}

/// Asynchronous successive halving (Ray's `ASHAScheduler`, one bracket).
///
/// Rungs sit at `grace_period`, `grace_period * reduction_factor`, ...
/// below `max_t` (in `time_attr`, by default `training_iteration`). A trial
/// reaching a rung is compared with the trials that reached it before: if
/// it is not in their best `1 / reduction_factor`, it stops. Every trial
/// stops at `max_t`.
///
/// ```
/// use prism_tune::Asha;
///
/// let asha = Asha::new().max_t(10).grace_period(1).reduction_factor(2.0);
/// assert_eq!(asha.rungs(), vec![8, 4, 2, 1]);
/// ```
#[derive(Debug, Clone)]
pub struct Asha {
    time_attr: String,
    metric: Option<String>,
    mode: Option<Mode>,
    max_t: u64,
    grace_period: u64,
    reduction_factor: f64,
    /// Per rung, highest first: each trial's value when it reached it
    /// (negated in `Min` mode, so higher is always better).
    recorded: Vec<(u64, HashMap<String, f64>)>,
}

impl Default for Asha {
    fn default() -> Self {
        Asha {
            time_attr: "training_iteration".into(),
            metric: None,
            mode: None,
            max_t: 100,
            grace_period: 1,
            reduction_factor: 4.0,
            recorded: Vec::new(),
        }
    }
}

impl Asha {
    /// Ray's defaults: `max_t` 100, `grace_period` 1, `reduction_factor` 4,
    /// time in `training_iteration`, metric and mode from the `TuneConfig`.
    pub fn new() -> Self {
        Asha::default()
    }

    /// The most time a trial gets.
    pub fn max_t(mut self, t: u64) -> Self {
        self.max_t = t;
        self
    }

    /// The time every trial gets before it can be stopped.
    pub fn grace_period(mut self, t: u64) -> Self {
        self.grace_period = t;
        self
    }

    /// The share of trials kept at each rung is `1 / factor`.
    pub fn reduction_factor(mut self, factor: f64) -> Self {
        self.reduction_factor = factor;
        self
    }

    /// The reported attribute that counts time.
    pub fn time_attr(mut self, attr: impl Into<String>) -> Self {
        self.time_attr = attr.into();
        self
    }

    /// Compares trials by `metric` (instead of the `TuneConfig`'s).
    pub fn metric(mut self, metric: impl Into<String>) -> Self {
        self.metric = Some(metric.into());
        self
    }

    /// Higher or lower is better (instead of the `TuneConfig`'s mode).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// The rungs' times, highest first.
    pub fn rungs(&self) -> Vec<u64> {
        let mut rungs = Vec::new();
        let mut t = self.grace_period.max(1) as f64;
        while t < self.max_t as f64 && self.reduction_factor > 1.0 {
            rungs.push(t.round() as u64);
            t *= self.reduction_factor;
        }
        rungs.dedup();
        rungs.reverse();
        rungs
    }
}

impl TrialScheduler for Asha {
    fn setup(&mut self, metric: Option<&str>, mode: Option<Mode>) -> Result<(), TuneError> {
        let invalid = |field, reason: String| Err(TuneError::InvalidConfig { field, reason });
        if self.metric.is_none() {
            match metric {
                Some(m) => self.metric = Some(m.to_string()),
                None => {
                    return invalid(
                        "Asha metric",
                        "no metric to compare trials by: set TuneConfig::metric or Asha::metric"
                            .into(),
                    )
                }
            }
        }
        if self.mode.is_none() {
            self.mode = mode;
        }
        if self.mode.is_none() {
            return invalid(
                "Asha mode",
                "no mode: set TuneConfig::mode or Asha::mode (Mode::Max or Mode::Min)".into(),
            );
        }
        if !(self.reduction_factor.is_finite() && self.reduction_factor > 1.0) {
            return invalid(
                "Asha reduction_factor",
                format!("must be above 1, got {}", self.reduction_factor),
            );
        }
        if self.grace_period == 0 || self.grace_period > self.max_t {
            return invalid(
                "Asha grace_period",
                format!(
                    "must be between 1 and max_t ({}), got {}",
                    self.max_t, self.grace_period
                ),
            );
        }
        self.recorded = self
            .rungs()
            .into_iter()
            .map(|t| (t, HashMap::new()))
            .collect();
        Ok(())
    }

    fn on_result(&mut self, trial: &str, metrics: &Metrics) -> Decision {
        let Some(t) = metrics.get(&self.time_attr).and_then(|v| v.as_f64()) else {
            return Decision::Continue;
        };
        if t >= self.max_t as f64 {
            return Decision::Stop;
        }
        let metric = self.metric.as_deref().unwrap_or_default();
        let Some(value) = metrics.get(metric).and_then(|v| v.as_f64()) else {
            return Decision::Continue;
        };
        let value = match self.mode {
            Some(Mode::Min) => -value,
            _ => value,
        };
        let keep = 1.0 / self.reduction_factor;
        for (rung, recorded) in &mut self.recorded {
            if t < *rung as f64 || recorded.contains_key(trial) {
                continue;
            }
            let cutoff = percentile(recorded.values().copied(), (1.0 - keep) * 100.0);
            recorded.insert(trial.to_string(), value);
            if cutoff.is_some_and(|c| value < c) {
                return Decision::Stop;
            }
            break;
        }
        Decision::Continue
    }
}

/// The `p`th percentile of `values`, interpolated linearly between the two
/// nearest ranks (numpy's default); `None` for no values. NaNs are skipped.
fn percentile(values: impl Iterator<Item = f64>, p: f64) -> Option<f64> {
    let mut xs: Vec<f64> = values.filter(|x| !x.is_nan()).collect();
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let rank = p / 100.0 * (xs.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    Some(xs[lo] + (xs[hi] - xs[lo]) * (rank - lo as f64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(t: u64, score: f64) -> Metrics {
        match json!({ "training_iteration": t, "score": score }) {
            serde_json::Value::Object(m) => m,
            _ => unreachable!("an object literal"),
        }
    }

    #[test]
    fn rungs_grow_by_the_reduction_factor_below_max_t() {
        assert_eq!(Asha::new().rungs(), vec![64, 16, 4, 1]);
        assert_eq!(
            Asha::new()
                .max_t(9)
                .grace_period(2)
                .reduction_factor(3.0)
                .rungs(),
            vec![6, 2]
        );
    }

    #[test]
    fn a_trial_behind_the_leaders_at_a_rung_stops_and_one_ahead_goes_on() {
        let mut asha = Asha::new().max_t(8).reduction_factor(2.0);
        asha.setup(Some("score"), Some(Mode::Max)).unwrap();
        assert_eq!(
            asha.on_result("a", &report(1, 0.9)),
            Decision::Continue,
            "first at the rung"
        );
        assert_eq!(
            asha.on_result("b", &report(1, 0.5)),
            Decision::Stop,
            "below the median of [0.9]"
        );
        assert_eq!(asha.on_result("c", &report(1, 0.95)), Decision::Continue);
        // Each rung judges a trial once.
        assert_eq!(asha.on_result("a", &report(1, 0.1)), Decision::Continue);
        assert_eq!(asha.on_result("a", &report(2, 0.9)), Decision::Continue);
        assert_eq!(
            asha.on_result("c", &report(2, 0.2)),
            Decision::Stop,
            "behind a at rung 2"
        );
        assert_eq!(
            asha.on_result("a", &report(8, 0.9)),
            Decision::Stop,
            "max_t reached"
        );
    }

    #[test]
    fn in_min_mode_lower_is_better() {
        let mut asha = Asha::new().max_t(8).reduction_factor(2.0);
        asha.setup(Some("loss"), Some(Mode::Min)).unwrap();
        let loss = |t: u64, v: f64| match json!({ "training_iteration": t, "loss": v }) {
            serde_json::Value::Object(m) => m,
            _ => unreachable!("an object literal"),
        };
        assert_eq!(asha.on_result("a", &loss(1, 0.2)), Decision::Continue);
        assert_eq!(
            asha.on_result("b", &loss(1, 0.1)),
            Decision::Continue,
            "a lower loss"
        );
        assert_eq!(asha.on_result("c", &loss(1, 0.5)), Decision::Stop);
    }

    #[test]
    fn settings_that_cannot_work_are_named() {
        let err = Asha::new()
            .setup(None, Some(Mode::Max))
            .unwrap_err()
            .to_string();
        assert!(err.contains("metric"), "{err}");
        let err = Asha::new()
            .reduction_factor(1.0)
            .setup(Some("s"), Some(Mode::Max))
            .unwrap_err();
        assert!(err.to_string().contains("reduction_factor"), "{err}");
        let err = Asha::new()
            .max_t(3)
            .grace_period(5)
            .setup(Some("s"), Some(Mode::Max))
            .unwrap_err();
        assert!(err.to_string().contains("grace_period"), "{err}");
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        assert_eq!(
            percentile([1.0, 2.0, 3.0, 4.0].into_iter(), 50.0),
            Some(2.5)
        );
        assert_eq!(percentile([5.0].into_iter(), 75.0), Some(5.0));
        assert_eq!(percentile(std::iter::empty(), 50.0), None);
    }
}
