//! Trial schedulers: after each report a scheduler decides whether the
//! trial goes on. [`Fifo`] lets every trial run to its end; [`Asha`] stops
//! the trials that fall behind, as Ray Tune's `ASHAScheduler` does.

use crate::trial::Mode;
use crate::TuneError;
use prism_train::Metrics;
use std::collections::HashMap;

/// What a trial does after a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// It goes on.
    Continue,
    /// It stops now, early; its reports and checkpoints so far are kept.
    Stop,
    /// It has had its budget (ASHA's `max_t`): it ends now, complete.
    Finish,
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

/// The builder methods every comparing scheduler has: which reported
/// attribute counts time, and the metric and mode when they differ from
/// the `TuneConfig`'s.
macro_rules! comparison_builders {
    () => {
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
    };
}

/// Asynchronous successive halving (Ray's `ASHAScheduler`, one bracket).
///
/// Rungs sit at `grace_period`, `grace_period * reduction_factor`, ...
/// below `max_t` (in `time_attr`, by default `training_iteration`). A trial
/// reaching a rung is compared with the trials that reached it before: if
/// it is not in their best `1 / reduction_factor`, it stops. Every trial
/// ends at `max_t` ([`Decision::Finish`]: complete, not stopped early).
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

    comparison_builders!();

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
        adopt(
            "Asha metric and mode",
            (&mut self.metric, &mut self.mode),
            (metric, mode),
        )?;
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
            return Decision::Finish;
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

/// The median stopping rule (Ray's `MedianStoppingRule`): after
/// `grace_period` (in `time_attr`, by default `training_iteration`), a
/// trial stops when its best result so far is worse than the median of the
/// other trials' running averages at the same time, once at least
/// `min_samples_required` other trials have results to compare.
///
/// ```
/// use prism_tune::MedianStopping;
///
/// let rule = MedianStopping::new().grace_period(2.0).min_samples_required(3);
/// # let _ = rule;
/// ```
#[derive(Debug, Clone)]
pub struct MedianStopping {
    time_attr: String,
    metric: Option<String>,
    mode: Option<Mode>,
    grace_period: f64,
    min_samples_required: usize,
    /// Per trial, its (time, value) reports (negated in `Min` mode).
    results: HashMap<String, Vec<(f64, f64)>>,
}

impl Default for MedianStopping {
    fn default() -> Self {
        MedianStopping {
            time_attr: "training_iteration".into(),
            metric: None,
            mode: None,
            grace_period: 1.0,
            min_samples_required: 3,
            results: HashMap::new(),
        }
    }
}

impl MedianStopping {
    /// Grace period 1 iteration, 3 other trials needed; metric and mode
    /// from the `TuneConfig`.
    pub fn new() -> Self {
        MedianStopping::default()
    }

    /// The time every trial gets before it can be stopped.
    pub fn grace_period(mut self, t: f64) -> Self {
        self.grace_period = t;
        self
    }

    /// Other trials needed before a median is trusted.
    pub fn min_samples_required(mut self, n: usize) -> Self {
        self.min_samples_required = n;
        self
    }

    comparison_builders!();
}

/// Takes the experiment's metric and mode where the scheduler has none.
fn adopt(
    who: &'static str,
    own: (&mut Option<String>, &mut Option<Mode>),
    given: (Option<&str>, Option<Mode>),
) -> Result<(), TuneError> {
    if own.0.is_none() {
        *own.0 = given.0.map(str::to_string);
    }
    if own.1.is_none() {
        *own.1 = given.1;
    }
    if own.0.is_none() || own.1.is_none() {
        return Err(TuneError::InvalidConfig {
            field: who,
            reason: "needs a metric and a mode to compare trials: set TuneConfig::metric and mode"
                .into(),
        });
    }
    Ok(())
}

impl TrialScheduler for MedianStopping {
    fn setup(&mut self, metric: Option<&str>, mode: Option<Mode>) -> Result<(), TuneError> {
        adopt(
            "MedianStopping metric and mode",
            (&mut self.metric, &mut self.mode),
            (metric, mode),
        )?;
        self.results.clear();
        Ok(())
    }

    fn on_result(&mut self, trial: &str, metrics: &Metrics) -> Decision {
        let metric = self.metric.as_deref().unwrap_or_default();
        let (Some(t), Some(value)) = (
            metrics.get(&self.time_attr).and_then(|v| v.as_f64()),
            metrics.get(metric).and_then(|v| v.as_f64()),
        ) else {
            return Decision::Continue;
        };
        let value = match self.mode {
            Some(Mode::Min) => -value,
            _ => value,
        };
        let mine = self.results.entry(trial.to_string()).or_default();
        mine.push((t, value));
        let best = mine
            .iter()
            .map(|(_, v)| *v)
            .fold(f64::NEG_INFINITY, f64::max);
        if t < self.grace_period {
            return Decision::Continue;
        }
        let means: Vec<f64> = self
            .results
            .iter()
            .filter(|(name, _)| name.as_str() != trial)
            .filter_map(|(_, reports)| {
                let upto: Vec<f64> = reports
                    .iter()
                    .filter(|(u, _)| *u <= t)
                    .map(|(_, v)| *v)
                    .collect();
                (!upto.is_empty()).then(|| upto.iter().sum::<f64>() / upto.len() as f64)
            })
            .collect();
        if means.len() < self.min_samples_required.max(1) {
            return Decision::Continue;
        }
        match percentile(means.into_iter(), 50.0) {
            Some(median) if best < median => Decision::Stop,
            _ => Decision::Continue,
        }
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
            Decision::Finish,
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
    fn the_median_rule_stops_a_trial_whose_best_is_below_the_others_median() {
        let mut rule = MedianStopping::new()
            .grace_period(2.0)
            .min_samples_required(2);
        rule.setup(Some("score"), Some(Mode::Max)).unwrap();
        for (trial, values) in [("a", [0.5, 0.7, 0.9]), ("b", [0.4, 0.6, 0.8])] {
            for (i, v) in values.iter().enumerate() {
                assert_eq!(
                    rule.on_result(trial, &report(i as u64 + 1, *v)),
                    Decision::Continue
                );
            }
        }
        assert_eq!(
            rule.on_result("c", &report(1, 0.1)),
            Decision::Continue,
            "in its grace period"
        );
        // At t = 2 the others' running means are 0.6 and 0.5: median 0.55.
        assert_eq!(rule.on_result("c", &report(2, 0.2)), Decision::Stop);
        assert_eq!(rule.on_result("d", &report(1, 0.3)), Decision::Continue);
        assert_eq!(
            rule.on_result("d", &report(2, 0.6)),
            Decision::Continue,
            "best 0.6 is above"
        );
        let mut alone = MedianStopping::new().grace_period(1.0);
        alone.setup(Some("score"), Some(Mode::Max)).unwrap();
        assert_eq!(
            alone.on_result("a", &report(5, -9.0)),
            Decision::Continue,
            "nobody to compare"
        );
        let err = MedianStopping::new()
            .setup(Some("score"), None)
            .unwrap_err();
        assert!(err.to_string().contains("mode"), "{err}");
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
