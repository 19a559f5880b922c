//! The Tuner: runs one trial per config of a search space, each a Trainer
//! of its own, as many at once as the cluster holds, and gathers their
//! results.

use crate::schedulers::{Decision, Fifo, TrialScheduler};
use crate::space::SearchSpace;
use crate::state::{load_trial, ExperimentState, Finished};
use crate::trial::{Mode, TrialResult};
use crate::TuneError;
use prism_train::{RunConfig, ScalingConfig, Trainer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The scheduler shared by an experiment's trials.
pub type SharedScheduler = Arc<Mutex<dyn TrialScheduler>>;

/// How the search runs (Ray's `TuneConfig`).
///
/// ```
/// use prism_tune::{Asha, Mode, TuneConfig};
///
/// let tune = TuneConfig::new()
///     .metric("val_accuracy")
///     .mode(Mode::Max)
///     .num_samples(8)
///     .max_concurrent_trials(4)
///     .scheduler(Asha::new().max_t(10).grace_period(1))
///     .stop_at("training_iteration", 20.0)
///     .seed(7);
/// assert_eq!(tune.num_samples, 8);
/// ```
#[derive(Debug, Clone)]
pub struct TuneConfig {
    /// The metric trials are compared by (as reported with `report`).
    pub metric: Option<String>,
    /// Whether it is better high or low (given with the metric, as Ray
    /// requires).
    pub mode: Option<Mode>,
    /// How many times the search space (every grid combination) is sampled.
    pub num_samples: usize,
    /// Trials running at once; `None`: as many as the cluster's CPUs hold.
    pub max_concurrent_trials: Option<usize>,
    /// The seed of the sampled parameters.
    pub seed: u64,
    /// Decides after each report whether a trial goes on (default
    /// [`Fifo`]: every trial runs to its end).
    pub scheduler: Option<SharedScheduler>,
    /// A trial ends, complete, once one of these metrics reaches its value.
    pub stop: Vec<(String, f64)>,
    /// Seconds between the driver's progress lines (running, pending and
    /// finished trials, the best result so far); 0 turns them off.
    pub progress_interval_s: f64,
}

impl Default for TuneConfig {
    fn default() -> Self {
        TuneConfig {
            metric: None,
            mode: None,
            num_samples: 1,
            max_concurrent_trials: None,
            seed: 0,
            scheduler: None,
            stop: Vec::new(),
            progress_interval_s: 5.0,
        }
    }
}

impl TuneConfig {
    /// One sample, no metric, concurrency from the cluster, seed 0.
    pub fn new() -> Self {
        TuneConfig::default()
    }

    /// Compares trials by `metric`.
    pub fn metric(mut self, metric: impl Into<String>) -> Self {
        self.metric = Some(metric.into());
        self
    }

    /// Higher or lower is better.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Samples the space `n` times.
    pub fn num_samples(mut self, n: usize) -> Self {
        self.num_samples = n;
        self
    }

    /// Runs at most `n` trials at once.
    pub fn max_concurrent_trials(mut self, n: usize) -> Self {
        self.max_concurrent_trials = Some(n);
        self
    }

    /// Samples from `seed`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Lets `scheduler` stop trials early ([`crate::Asha`]).
    pub fn scheduler(mut self, scheduler: impl TrialScheduler + 'static) -> Self {
        self.scheduler = Some(Arc::new(Mutex::new(scheduler)));
        self
    }

    /// Ends a trial once its `metric` reaches `value` (Ray's
    /// `RunConfig(stop={metric: value})`), for example
    /// `stop_at("training_iteration", 10.0)`.
    pub fn stop_at(mut self, metric: impl Into<String>, value: f64) -> Self {
        self.stop.push((metric.into(), value));
        self
    }

    /// Prints a progress line every `seconds` while trials run (0: never).
    pub fn progress_interval_s(mut self, seconds: f64) -> Self {
        self.progress_interval_s = seconds;
        self
    }
}

/// Every trial's result (Ray's `ResultGrid`), in trial order.
#[derive(Debug, Clone)]
pub struct ResultGrid {
    trials: Vec<TrialResult>,
    metric: Option<String>,
    mode: Option<Mode>,
    path: PathBuf,
}

impl ResultGrid {
    /// The trials, in order.
    pub fn trials(&self) -> &[TrialResult] {
        &self.trials
    }

    /// How many trials ran.
    pub fn len(&self) -> usize {
        self.trials.len()
    }

    /// Whether there were none.
    pub fn is_empty(&self) -> bool {
        self.trials.is_empty()
    }

    /// The trials that failed.
    pub fn errors(&self) -> Vec<&TrialResult> {
        self.trials.iter().filter(|t| t.error.is_some()).collect()
    }

    /// The experiment's folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The best trial by the [`TuneConfig`]'s metric and mode, compared on
    /// each trial's last report.
    pub fn get_best_result(&self) -> Result<&TrialResult, TuneError> {
        let (Some(metric), Some(mode)) = (self.metric.as_deref(), self.mode) else {
            return Err(TuneError::InvalidConfig {
                field: "metric",
                reason: "no metric was set: give TuneConfig::metric and mode, or call get_best_result_by".into(),
            });
        };
        self.get_best_result_by(metric, mode)
    }

    /// The best trial by `metric` and `mode`, compared on each trial's last
    /// report; trials that did not report it are skipped.
    pub fn get_best_result_by(&self, metric: &str, mode: Mode) -> Result<&TrialResult, TuneError> {
        let scored = self
            .trials
            .iter()
            .filter_map(|t| Some((t.last(metric)?, t)))
            .filter(|(v, _)| !v.is_nan());
        let best = match mode {
            Mode::Max => scored.max_by(|a, b| a.0.total_cmp(&b.0)),
            Mode::Min => scored.min_by(|a, b| a.0.total_cmp(&b.0)),
        };
        best.map(|(_, t)| t).ok_or_else(|| {
            let mut reported: Vec<String> = self
                .trials
                .iter()
                .filter_map(|t| t.metrics.as_ref())
                .flat_map(|m| m.keys().cloned())
                .collect();
            reported.sort();
            reported.dedup();
            TuneError::NoResult {
                metric: metric.to_string(),
                reported,
            }
        })
    }
}

type MakeTrainer = dyn Fn(Value) -> Result<Trainer, String> + Send + Sync;

/// A hyperparameter search (Ray's `Tuner`): the training function runs once
/// per config of the search space, each run a [`Trainer`] of its own (so
/// `prism_train::report` and checkpoints work inside it as they do in any
/// Trainer).
///
/// ```no_run
/// use prism_tune::{grid, loguniform, Mode, SearchSpace, TuneConfig, Tuner};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Params { lr: f64, layers: u32 }
///
/// fn train(p: Params) -> Result<(), prism_train::TrainError> {
///     let loss = (p.lr - 0.01).abs() + p.layers as f64 * 0.001;
///     prism_train::report(serde_json::json!({ "loss": loss }), None)
/// }
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     prism::init(prism::Config::default())?;
///     let space = SearchSpace::new()
///         .set("lr", loguniform(1e-4, 1e-1))
///         .set("layers", grid([1, 2]));
///     let results = Tuner::new(train, space)
///         .tune_config(TuneConfig::new().metric("loss").mode(Mode::Min).num_samples(4))
///         .run_config(prism_train::RunConfig::new("lr_search").storage_path("/tmp/tune"))
///         .fit()?;
///     println!("best: {}", results.get_best_result()?.config);
///     Ok(())
/// }
/// ```
pub struct Tuner {
    make_trainer: Arc<MakeTrainer>,
    space: SearchSpace,
    tune: TuneConfig,
    run: RunConfig,
    /// Each trial's workers; `None`: the Trainer's own (`with_trainer`).
    scaling: Option<ScalingConfig>,
    /// An experiment read back by [`Tuner::restore`].
    restored: Option<ExperimentState>,
}

impl std::fmt::Debug for Tuner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tuner")
            .field("space", &self.space)
            .field("tune", &self.tune)
            .field("run", &self.run)
            .field("scaling", &self.scaling)
            .finish()
    }
}

impl Tuner {
    /// A search running `train_fn(config)` for each config of `space`; each
    /// config is decoded into `C` first (a config that does not fit `C`
    /// fails its trial, naming the field).
    pub fn new<C, E>(train_fn: fn(C) -> Result<(), E>, space: SearchSpace) -> Self
    where
        C: Serialize + DeserializeOwned + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
    {
        let make_trainer = move |config: Value| -> Result<Trainer, String> {
            let typed: C = serde_json::from_value(config).map_err(|e| {
                format!("the config does not fit the training function's type: {e}")
            })?;
            Ok(Trainer::new(train_fn, typed))
        };
        Tuner {
            make_trainer: Arc::new(make_trainer),
            space,
            tune: TuneConfig::default(),
            run: RunConfig::default(),
            scaling: Some(ScalingConfig::new(1)),
            restored: None,
        }
    }

    /// A search over Trainers: `make_trainer(config)` builds each trial's
    /// Trainer (its training function, datasets and workers), as Ray's
    /// `Tuner(trainer, param_space=...)` tunes a `TorchTrainer`. The Tuner
    /// sets each trial's run folder and stopping; the workers are the
    /// Trainer's unless [`Tuner::scaling_config`] sets them.
    ///
    /// ```no_run
    /// use prism_train::{data::Dataset, ScalingConfig, Trainer};
    /// use prism_tune::{grid, SearchSpace, Tuner};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Params { lr: f64 }
    ///
    /// fn train(p: Params) -> Result<(), prism_train::TrainError> {
    ///     let rows = prism_train::get_dataset_shard("train")?.count()?;
    ///     prism_train::report(serde_json::json!({ "rows": rows, "lr": p.lr }), None)
    /// }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// prism::init(prism::Config::default())?;
    /// let data = Dataset::range(1000);
    /// let results = Tuner::with_trainer(
    ///     move |p: Params| {
    ///         Trainer::new(train, p)
    ///             .dataset("train", data.clone())
    ///             .scaling_config(ScalingConfig::new(2))
    ///     },
    ///     SearchSpace::new().set("lr", grid([0.01, 0.1])),
    /// )
    /// .fit()?;
    /// # let _ = results;
    /// # Ok(()) }
    /// ```
    pub fn with_trainer<C, F>(make_trainer: F, space: SearchSpace) -> Self
    where
        C: DeserializeOwned + 'static,
        F: Fn(C) -> Trainer + Send + Sync + 'static,
    {
        let make = move |config: Value| -> Result<Trainer, String> {
            let typed: C = serde_json::from_value(config).map_err(|e| {
                format!("the config does not fit the training function's type: {e}")
            })?;
            Ok(make_trainer(typed))
        };
        Tuner {
            make_trainer: Arc::new(make),
            space,
            tune: TuneConfig::default(),
            run: RunConfig::default(),
            scaling: None,
            restored: None,
        }
    }

    /// Continues the experiment in `path` (its folder, `storage_path/name`)
    /// whose driver died: trials that finished are kept as they are, the
    /// others run again, each resuming from its latest checkpoint (as a
    /// Trainer resumes its run folder). Give the same training function;
    /// set the scheduler and concurrency again with
    /// [`Tuner::tune_config`] (its metric and mode must be the saved ones,
    /// and a scheduler starts afresh).
    pub fn restore<C, E>(
        path: impl AsRef<Path>,
        train_fn: fn(C) -> Result<(), E>,
    ) -> Result<Self, TuneError>
    where
        C: Serialize + DeserializeOwned + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
    {
        Tuner::new(train_fn, SearchSpace::new()).restored_from(path.as_ref())
    }

    /// [`Tuner::restore`] for a search made with [`Tuner::with_trainer`].
    pub fn restore_with_trainer<C, F>(
        path: impl AsRef<Path>,
        make_trainer: F,
    ) -> Result<Self, TuneError>
    where
        C: DeserializeOwned + 'static,
        F: Fn(C) -> Trainer + Send + Sync + 'static,
    {
        Tuner::with_trainer(make_trainer, SearchSpace::new()).restored_from(path.as_ref())
    }

    fn restored_from(mut self, path: &Path) -> Result<Self, TuneError> {
        let state = ExperimentState::load(path)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let storage = path.parent().map(Path::to_path_buf).unwrap_or_default();
        self.tune.metric = state.metric.clone();
        self.tune.mode = state.mode;
        self.run = RunConfig::new(name).storage_path(storage);
        self.restored = Some(state);
        Ok(self)
    }

    /// Sets the metric, mode, samples, concurrency and seed.
    pub fn tune_config(mut self, tune: TuneConfig) -> Self {
        if let Some(state) = &self.restored {
            // A restored experiment keeps its trials and how they compare.
            let mut tune = tune;
            tune.metric = state.metric.clone();
            tune.mode = state.mode;
            self.tune = tune;
        } else {
            self.tune = tune;
        }
        self
    }

    /// Sets the experiment's name and folder (trials are kept in
    /// `storage_path/name/trial_NNNNN`), and each trial's checkpoint and
    /// failure handling. A restored experiment keeps its folder.
    pub fn run_config(mut self, run: RunConfig) -> Self {
        let (name, storage) = (self.run.name.clone(), self.run.storage_path.clone());
        self.run = run;
        if self.restored.is_some() {
            self.run.name = name;
            self.run.storage_path = storage;
        }
        self
    }

    /// Sets each trial's workers and resources (default: one worker, one
    /// CPU).
    pub fn scaling_config(mut self, scaling: ScalingConfig) -> Self {
        self.scaling = Some(scaling);
        self
    }

    /// Runs every trial and returns their results. Fails only when the
    /// experiment cannot run at all (a bad space, no cluster, an unwritable
    /// folder); a failed trial is reported in its result.
    pub fn fit(self) -> Result<ResultGrid, TuneError> {
        self.check_metric_and_mode()?;
        let (configs, finished) = match &self.restored {
            Some(state) => (state.configs.clone(), state.finished.clone()),
            None => (
                self.space.configs(self.tune.num_samples, self.tune.seed)?,
                Default::default(),
            ),
        };
        let scaling = self.trial_scaling(configs.first());
        self.check_trial_fits(&scaling)?;
        let scheduler: SharedScheduler = match &self.tune.scheduler {
            Some(s) => s.clone(),
            None => Arc::new(Mutex::new(Fifo)),
        };
        scheduler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .setup(self.tune.metric.as_deref(), self.tune.mode)?;
        let dir = self.run.run_dir();
        std::fs::create_dir_all(&dir).map_err(|source| TuneError::Io {
            action: "create the experiment folder",
            path: dir.clone(),
            source,
        })?;
        let state = Mutex::new(ExperimentState {
            configs: configs.clone(),
            metric: self.tune.metric.clone(),
            mode: self.tune.mode,
            finished: finished.clone(),
        });
        state.lock().unwrap_or_else(|e| e.into_inner()).save(&dir)?;
        let total = configs.len();
        let mut kept = vec![None; total];
        for (&index, how) in &finished {
            if let Some(config) = configs.get(index) {
                let name = trial_name(index);
                kept[index] = Some(load_trial(dir.join(&name), name, config.clone(), how));
            }
        }
        let to_run: VecDeque<(usize, Value)> = configs
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !finished.contains_key(i))
            .collect();
        let concurrency = self.concurrency(&scaling)?.clamp(1, to_run.len().max(1));
        let done = Mutex::new(finished.len());
        let progress = Arc::new(Mutex::new(Progress {
            total,
            done: finished.len(),
            ..Progress::default()
        }));
        let all_done = AtomicBool::new(false);
        let queue = Mutex::new(to_run);
        let results: Mutex<Vec<Option<TrialResult>>> = Mutex::new(kept);
        std::thread::scope(|scope| {
            if self.tune.progress_interval_s > 0.0 {
                let every = Duration::from_secs_f64(self.tune.progress_interval_s);
                let (progress, all_done, metric) = (&progress, &all_done, &self.tune.metric);
                scope.spawn(move || {
                    let started = Instant::now();
                    let mut next = started + every;
                    while !all_done.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                        if Instant::now() >= next {
                            next += every;
                            let p = progress.lock().unwrap_or_else(|e| e.into_inner());
                            println!("{}", p.line(started.elapsed(), metric.as_deref()));
                        }
                    }
                });
            }
            let workers: Vec<_> = (0..concurrency)
                .map(|_| {
                    scope.spawn(|| loop {
                        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
                        let Some((index, config)) = next else {
                            return;
                        };
                        progress.lock().unwrap_or_else(|e| e.into_inner()).running += 1;
                        let trial = self.run_trial(index, config, &dir, &scheduler, &progress);
                        {
                            let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
                            p.running -= 1;
                            p.done += 1;
                            p.stopped += usize::from(trial.stopped_early);
                            p.errors += usize::from(trial.error.is_some());
                        }
                        let finished = {
                            let mut n = done.lock().unwrap_or_else(|e| e.into_inner());
                            *n += 1;
                            *n
                        };
                        self.print_progress(&trial, finished, total);
                        {
                            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                            state.finished.insert(
                                index,
                                Finished {
                                    error: trial.error.clone(),
                                    stopped_early: trial.stopped_early,
                                },
                            );
                            if let Err(e) = state.save(&dir) {
                                eprintln!(
                                    "prism-tune: {e}; a restore would run {} again",
                                    trial.name
                                );
                            }
                        }
                        results.lock().unwrap_or_else(|e| e.into_inner())[index] = Some(trial);
                    })
                })
                .collect();
            for worker in workers {
                let _ = worker.join();
            }
            all_done.store(true, Ordering::Relaxed);
        });
        let trials: Vec<TrialResult> = results
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .into_iter()
            .flatten()
            .collect();
        let grid = ResultGrid {
            trials,
            metric: self.tune.metric.clone(),
            mode: self.tune.mode,
            path: dir,
        };
        write_table(&grid)?;
        Ok(grid)
    }

    /// A metric needs a mode and a mode a metric (as in Ray).
    fn check_metric_and_mode(&self) -> Result<(), TuneError> {
        match (&self.tune.metric, self.tune.mode) {
            (Some(m), None) => Err(TuneError::InvalidConfig {
                field: "mode",
                reason: format!("the metric {m:?} is set without a mode: add .mode(Mode::Max) or .mode(Mode::Min)"),
            }),
            (None, Some(_)) => Err(TuneError::InvalidConfig {
                field: "metric",
                reason: "a mode is set without a metric: add .metric(\"name\")".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Fails before any trial starts if one trial needs more of a resource
    /// than the whole cluster has.
    fn check_trial_fits(&self, scaling: &ScalingConfig) -> Result<(), TuneError> {
        let (total, _) = prism::cluster_resources().map_err(|source| TuneError::Prism {
            action: "read the cluster's resources (is prism::init done?)",
            source,
        })?;
        let workers = scaling.num_workers.max(1) as f64;
        let mut per_worker = scaling.resources_per_worker.clone();
        per_worker.entry("CPU".into()).or_insert(1.0);
        if scaling.use_gpu {
            per_worker.entry("GPU".into()).or_insert(1.0);
        }
        for (name, amount) in per_worker {
            let need = amount * workers;
            let have = total.get(&name).as_f64();
            if need > have + 1e-9 {
                return Err(TuneError::InvalidConfig {
                    field: "scaling_config",
                    reason: format!(
                        "one trial needs {need} {name} ({workers} workers of {amount}) but the cluster has {have} in all: ask for less, or add nodes"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Each trial's workers: as set on the Tuner, or those of the Trainer
    /// built for `sample` (one worker if it cannot be built).
    fn trial_scaling(&self, sample: Option<&Value>) -> ScalingConfig {
        if let Some(s) = &self.scaling {
            return s.clone();
        }
        sample
            .and_then(|config| (self.make_trainer)(config.clone()).ok())
            .map(|t| t.scaling().clone())
            .unwrap_or_else(|| ScalingConfig::new(1))
    }

    /// Trials at once: as set, or as many as the cluster's CPUs hold.
    fn concurrency(&self, scaling: &ScalingConfig) -> Result<usize, TuneError> {
        if let Some(n) = self.tune.max_concurrent_trials {
            if n == 0 {
                return Err(TuneError::InvalidConfig {
                    field: "max_concurrent_trials",
                    reason: "must be at least 1".into(),
                });
            }
            return Ok(n);
        }
        let (total, _) = prism::cluster_resources().map_err(|source| TuneError::Prism {
            action: "read the cluster's resources (is prism::init done?)",
            source,
        })?;
        let cpus = total.get("CPU").as_f64();
        let per_worker = scaling
            .resources_per_worker
            .get("CPU")
            .copied()
            .unwrap_or(1.0);
        let per_trial = per_worker * scaling.num_workers.max(1) as f64;
        Ok(if per_trial > 0.0 {
            (cpus / per_trial).floor().max(1.0) as usize
        } else {
            1
        })
    }

    fn run_trial(
        &self,
        index: usize,
        config: Value,
        dir: &Path,
        scheduler: &SharedScheduler,
        progress: &Arc<Mutex<Progress>>,
    ) -> TrialResult {
        let name = trial_name(index);
        let mut run = self.run.clone();
        run.name = name.clone();
        run.storage_path = dir.to_path_buf();
        let path = run.run_dir();
        let failed = |error: String| TrialResult {
            name: name.clone(),
            config: config.clone(),
            metrics: None,
            metrics_history: Vec::new(),
            checkpoint: None,
            path: path.clone(),
            error: Some(error),
            stopped_early: false,
        };
        let trainer = match (self.make_trainer)(config.clone()) {
            Ok(t) => t,
            Err(e) => return failed(e),
        };
        let (scheduler, stops, trial) = (scheduler.clone(), self.tune.stop.clone(), name.clone());
        let early = Arc::new(AtomicBool::new(false));
        let stopped_by_scheduler = early.clone();
        let (progress, metric, mode) = (progress.clone(), self.tune.metric.clone(), self.tune.mode);
        let trainer = match &self.scaling {
            Some(scaling) => trainer.scaling_config(scaling.clone()),
            None => trainer,
        };
        let result = trainer
            .run_config(run)
            .stop_when(move |metrics| {
                if let (Some(metric), Some(mode)) = (&metric, mode) {
                    if let Some(v) = metrics.get(metric).and_then(Value::as_f64) {
                        progress
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .offer(v, mode, &trial);
                    }
                }
                let reached = stops.iter().any(|(metric, value)| {
                    metrics
                        .get(metric)
                        .and_then(Value::as_f64)
                        .is_some_and(|x| x >= *value)
                });
                let decision = scheduler
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .on_result(&trial, metrics);
                stopped_by_scheduler.store(decision == Decision::Stop, Ordering::Relaxed);
                reached || decision != Decision::Continue
            })
            .fit();
        TrialResult {
            name: name.clone(),
            config,
            metrics: result.metrics,
            metrics_history: result.metrics_history,
            checkpoint: result.checkpoint,
            path: result.path,
            error: result.error.map(|e| e.to_string()),
            stopped_early: result.stopped_early && early.load(Ordering::Relaxed),
        }
    }

    fn print_progress(&self, trial: &TrialResult, finished: usize, total: usize) {
        let outcome = match (&trial.error, &self.tune.metric) {
            (Some(e), _) => format!("ERROR: {e}"),
            (None, Some(m)) => match trial.last(m) {
                Some(v) => format!("{m}={v}"),
                None => format!("{m} not reported"),
            },
            (None, None) => "TERMINATED".to_string(),
        };
        let outcome = if trial.stopped_early {
            format!("{outcome} (stopped early)")
        } else {
            outcome
        };
        println!(
            "[tune] {} ({finished}/{total} done) {} {outcome}",
            trial.name, trial.config
        );
    }
}

/// What the progress lines show.
#[derive(Debug, Default)]
struct Progress {
    total: usize,
    running: usize,
    done: usize,
    stopped: usize,
    errors: usize,
    /// The best value of the metric reported so far, and by which trial.
    best: Option<(f64, String)>,
}

impl Progress {
    fn offer(&mut self, value: f64, mode: Mode, trial: &str) {
        let better = match &self.best {
            None => !value.is_nan(),
            Some((b, _)) => match mode {
                Mode::Max => value > *b,
                Mode::Min => value < *b,
            },
        };
        if better {
            self.best = Some((value, trial.to_string()));
        }
    }

    fn line(&self, elapsed: Duration, metric: Option<&str>) -> String {
        let pending = self.total.saturating_sub(self.done + self.running);
        let mut line = format!(
            "[tune] {:.1} s: {} running, {pending} pending, {} done ({} stopped early, {} failed)",
            elapsed.as_secs_f64(),
            self.running,
            self.done,
            self.stopped,
            self.errors
        );
        if let (Some(metric), Some((value, trial))) = (metric, &self.best) {
            line.push_str(&format!("; best {metric} {value} ({trial})"));
        }
        line
    }
}

/// A trial's name: its folder in the experiment folder.
fn trial_name(index: usize) -> String {
    format!("trial_{index:05}")
}

/// Writes `results.csv` in the experiment folder: one row per trial with
/// its config and last metrics, as Ray's `ResultGrid.get_dataframe()`.
fn write_table(grid: &ResultGrid) -> Result<(), TuneError> {
    let path = grid.path.join("results.csv");
    let io = |source| TuneError::Io {
        action: "write the results table",
        path: path.clone(),
        source,
    };
    let mut metric_names: Vec<String> = grid
        .trials
        .iter()
        .filter_map(|t| t.metrics.as_ref())
        .flat_map(|m| m.keys().cloned())
        .collect();
    metric_names.sort();
    metric_names.dedup();
    let mut out = String::from("trial,config,error");
    for m in &metric_names {
        out.push(',');
        out.push_str(&csv_field(m));
    }
    out.push('\n');
    for t in &grid.trials {
        out.push_str(&csv_field(&t.name));
        out.push(',');
        out.push_str(&csv_field(&t.config.to_string()));
        out.push(',');
        out.push_str(&csv_field(t.error.as_deref().unwrap_or("")));
        for m in &metric_names {
            out.push(',');
            let v = t.metrics.as_ref().and_then(|x| x.get(m));
            let text = match v {
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => String::new(),
            };
            out.push_str(&csv_field(&text));
        }
        out.push('\n');
    }
    let mut file = std::fs::File::create(&path).map_err(io)?;
    file.write_all(out.as_bytes()).map_err(io)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_count_trials_and_keep_the_best_by_mode() {
        let mut p = Progress {
            total: 8,
            running: 2,
            done: 3,
            stopped: 1,
            errors: 1,
            best: None,
        };
        p.offer(0.5, Mode::Max, "trial_00001");
        p.offer(f64::NAN, Mode::Max, "trial_00002");
        p.offer(0.7, Mode::Max, "trial_00003");
        p.offer(0.6, Mode::Max, "trial_00004");
        let line = p.line(Duration::from_millis(12_300), Some("acc"));
        assert_eq!(
            line,
            "[tune] 12.3 s: 2 running, 3 pending, 3 done (1 stopped early, 1 failed); best acc 0.7 (trial_00003)"
        );
        let mut low = Progress::default();
        low.offer(0.3, Mode::Min, "a");
        low.offer(0.2, Mode::Min, "b");
        assert_eq!(low.best, Some((0.2, "b".to_string())));
    }
}
