//! The driver side: the Trainer, its worker groups and the run's result.

use super::checkpoint::Checkpoint;
use super::config::{RunConfig, ScalingConfig};
use super::context::{TrainContext, WorkerEvent};
use super::error::{prism_err, TrainError};
use super::storage::RunStorage;
use super::worker::{device_for, Entry, PrismTrainWorker, WorkerSetup};
use crate::data::AnyDataset;
use crate::portable::PortableFn;
use prism::{ActorHandle, ActorOptions, Bundle, ObjectRef, PlacementGroup};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A reported row: the worker's metrics plus the Trainer's own fields.
pub type Metrics = Map<String, Value>;

type ReportHook = Box<dyn FnMut(&Metrics) + Send>;
type StopHook = Box<dyn FnMut(&Metrics) -> bool + Send>;

/// Runs a training function data-parallel on a group of workers (Ray
/// Train's `TorchTrainer`).
///
/// The function is a plain `fn(config) -> Result<(), E>`; every worker runs
/// it with the same `train_loop_config`, and inside it uses
/// [`crate::get_context`], [`crate::report`], [`crate::get_checkpoint`],
/// [`crate::get_dataset_shard`] and [`crate::get_process_group`].
///
/// ```no_run
/// use prism_train::{RunConfig, ScalingConfig, Trainer};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Config {
///     epochs: u32,
/// }
///
/// fn train_loop(config: Config) -> Result<(), prism_train::TrainError> {
///     let ctx = prism_train::get_context()?;
///     for epoch in 0..config.epochs {
///         let loss = 1.0 / f64::from(epoch + 1);
///         prism_train::report(serde_json::json!({ "epoch": epoch, "loss": loss }), None)?;
///     }
///     println!("rank {} done", ctx.world_rank());
///     Ok(())
/// }
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     prism::init(prism::Config::default())?;
///     let result = Trainer::new(train_loop, Config { epochs: 3 })
///         .scaling_config(ScalingConfig::new(2))
///         .run_config(RunConfig::new("doc-example").storage_path("/tmp/prism_results"))
///         .fit();
///     let result = result.into_result()?;
///     println!("last metrics: {:?}", result.metrics);
///     Ok(())
/// }
/// ```
pub struct Trainer {
    entry: PortableFn<Entry>,
    function: Result<Vec<u8>, String>,
    config: Result<Value, String>,
    scaling: ScalingConfig,
    run: RunConfig,
    datasets: BTreeMap<String, AnyDataset>,
    on_report: Option<ReportHook>,
    stop_when: Option<StopHook>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("scaling", &self.scaling)
            .field("run", &self.run)
            .field("datasets", &self.datasets.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// What [`Trainer::fit`] returns (Ray's `Result`).
#[derive(Debug)]
pub struct TrainResult {
    /// The last report's row (rank 0's metrics plus `training_iteration`,
    /// `time_this_iter_s`, `time_total_s`, `timestamp`,
    /// `checkpoint_dir_name`).
    pub metrics: Option<Metrics>,
    /// Every report's row, in order (as in `result.json`).
    pub metrics_history: Vec<Metrics>,
    /// The latest checkpoint.
    pub checkpoint: Option<Checkpoint>,
    /// The best checkpoint by `checkpoint_score_attribute` (the latest
    /// without one).
    pub best_checkpoint: Option<Checkpoint>,
    /// The kept checkpoints with the metrics reported with them, oldest first.
    pub best_checkpoints: Vec<(Checkpoint, Metrics)>,
    /// The run's folder.
    pub path: PathBuf,
    /// Why the run failed, if it did.
    pub error: Option<TrainError>,
    /// Worker-group failures the run recovered from (or died of).
    pub num_failures: usize,
    /// The run was stopped after a report by [`Trainer::stop_when`].
    pub stopped_early: bool,
}

impl TrainResult {
    /// `Err` with the run's error if it failed, else the result.
    pub fn into_result(mut self) -> Result<TrainResult, TrainError> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(self),
        }
    }
}

/// Calls the user's function in a worker: the type-specific half of
/// [`Entry`].
fn run_entry<C, E>(function: Vec<u8>, config: Vec<u8>) -> Result<(), String>
where
    C: DeserializeOwned + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
{
    let token: PortableFn<fn(C) -> Result<(), E>> = serde_json::from_slice(&function)
        .map_err(|e| format!("decoding the training function: {e}"))?;
    // SAFETY: the token was made by PortableFn::new in Trainer::new.
    let f = unsafe { token.resolve() }.map_err(|e| e.to_string())?;
    let config: C =
        serde_json::from_slice(&config).map_err(|e| format!("decoding train_loop_config: {e}"))?;
    f(config).map_err(|e| e.into().to_string())
}

impl Trainer {
    /// A trainer running `train_loop_per_worker(train_loop_config)` on every
    /// worker. Defaults: 1 worker, `RunConfig::default()`.
    pub fn new<C, E>(train_loop_per_worker: fn(C) -> Result<(), E>, train_loop_config: C) -> Self
    where
        C: Serialize + DeserializeOwned + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
    {
        let entry: Entry = run_entry::<C, E>;
        Trainer {
            entry: PortableFn::new(entry),
            function: serde_json::to_vec(&PortableFn::new(train_loop_per_worker))
                .map_err(|e| e.to_string()),
            config: serde_json::to_value(&train_loop_config).map_err(|e| e.to_string()),
            scaling: ScalingConfig::new(1),
            run: RunConfig::default(),
            datasets: BTreeMap::new(),
            on_report: None,
            stop_when: None,
        }
    }

    /// Sets the workers and their resources.
    pub fn scaling_config(mut self, scaling: ScalingConfig) -> Self {
        self.scaling = scaling;
        self
    }

    /// The workers and resources it will run with.
    pub fn scaling(&self) -> &ScalingConfig {
        &self.scaling
    }

    /// Sets the run's name, storage, checkpoints and failure handling.
    pub fn run_config(mut self, run: RunConfig) -> Self {
        self.run = run;
        self
    }

    /// Gives the workers a dataset: each gets an equal shard, read with
    /// [`crate::get_dataset_shard`]`(name)`. A [`Dataset`](crate::data::Dataset) in memory is
    /// split once; a [`LazyDataset`](crate::data::LazyDataset) streams to
    /// the workers through
    /// [`streaming_split`](crate::data::LazyDataset::streaming_split), its
    /// pipeline running on the cluster while they train, once per epoch.
    pub fn dataset(mut self, name: impl Into<String>, dataset: impl Into<AnyDataset>) -> Self {
        self.datasets.insert(name.into(), dataset.into());
        self
    }

    /// Calls `hook` on the driver with each report's row as it arrives (for
    /// progress display).
    pub fn on_report(mut self, hook: impl FnMut(&Metrics) + Send + 'static) -> Self {
        self.on_report = Some(Box::new(hook));
        self
    }

    /// Stops the run after a report for which `stop` returns true (called
    /// on the driver with each report's row, after [`Trainer::on_report`]'s
    /// hook): the workers are stopped, and the result, with the reports and
    /// checkpoints made so far, says [`TrainResult::stopped_early`]. This is
    /// how a tuning scheduler ends a trial early.
    pub fn stop_when(mut self, stop: impl FnMut(&Metrics) -> bool + Send + 'static) -> Self {
        self.stop_when = Some(Box::new(stop));
        self
    }

    /// Runs training to the end, restarting the worker group from the
    /// latest checkpoint after a failure, up to `max_failures` times.
    /// Never panics on a failed run: the error is in
    /// [`TrainResult::error`], next to what the run achieved.
    pub fn fit(mut self) -> TrainResult {
        let mut run = Run {
            result: TrainResult {
                metrics: None,
                metrics_history: Vec::new(),
                checkpoint: None,
                best_checkpoint: None,
                best_checkpoints: Vec::new(),
                path: self.run.run_dir(),
                error: None,
                num_failures: 0,
                stopped_early: false,
            },
            iteration: 0,
            written: 0,
            started: Instant::now(),
            last_report: Instant::now(),
        };
        if let Err(e) = self.fit_inner(&mut run) {
            run.result.error = Some(e);
        }
        run.result
    }

    fn fit_inner(&mut self, run: &mut Run) -> Result<(), TrainError> {
        let config = self
            .config
            .clone()
            .map_err(|reason| TrainError::InvalidConfig {
                field: "train_loop_config",
                reason: format!("does not serialize to JSON: {reason}"),
            })?;
        self.function
            .as_ref()
            .map_err(|reason| TrainError::InvalidConfig {
                field: "train_loop_per_worker",
                reason: reason.clone(),
            })?;
        if self.scaling.num_workers == 0 {
            return Err(TrainError::InvalidConfig {
                field: "ScalingConfig::num_workers",
                reason: "0: give at least one worker".into(),
            });
        }
        if !prism::is_initialized() {
            return Err(TrainError::Prism {
                action: "start the Trainer (call prism::init first)",
                source: prism::Error::NotInitialized,
            });
        }
        let (mut storage, previous) = RunStorage::open(
            &run.result.path,
            self.run.checkpoint_config.clone(),
            &config,
        )?;
        // A run folder that already holds a run is resumed: its rows stand,
        // and the workers start from its latest checkpoint.
        run.written = previous
            .iter()
            .filter_map(|r| r.get("training_iteration").and_then(Value::as_u64))
            .max()
            .unwrap_or(0);
        if !previous.is_empty() {
            eprintln!(
                "prism-train: resuming the run in {} ({} reports so far, latest checkpoint: {})",
                run.result.path.display(),
                previous.len(),
                storage
                    .kept
                    .last()
                    .map(|k| k.checkpoint.path().display().to_string())
                    .unwrap_or_else(|| "none".into()),
            );
        }
        run.result.metrics = previous.last().cloned();
        run.result.metrics_history = previous;
        let max_failures = self.run.failure_config.max_failures;
        for attempt in 0usize.. {
            storage.clean_uncommitted()?;
            let latest = storage
                .kept
                .last()
                .map(|k| (k.iteration, k.checkpoint.clone()));
            run.iteration = latest.as_ref().map(|(i, _)| *i).unwrap_or(0);
            let outcome = self.run_group(attempt, latest.map(|(_, c)| c), &mut storage, run);
            run.result.checkpoint = storage.kept.last().map(|k| k.checkpoint.clone());
            run.result.best_checkpoint = storage.best().map(|k| k.checkpoint.clone());
            run.result.best_checkpoints = storage
                .kept
                .iter()
                .map(|k| (k.checkpoint.clone(), k.metrics.clone()))
                .collect();
            let Err(cause) = outcome else {
                return Ok(());
            };
            if !retriable(&cause) {
                return Err(cause);
            }
            run.result.num_failures += 1;
            if run.result.num_failures > max_failures {
                return Err(TrainError::TrainingFailed {
                    failures: run.result.num_failures,
                    max_failures,
                    cause: Box::new(cause),
                });
            }
            eprintln!(
                "prism-train: worker group failed ({cause}); restarting from {} (failure {} of at most {max_failures})",
                storage
                    .kept
                    .last()
                    .map(|k| k.checkpoint.path().display().to_string())
                    .unwrap_or_else(|| "the beginning".into()),
                run.result.num_failures,
            );
        }
        Ok(())
    }

    /// Starts one worker group and drives it until the function ends or the
    /// group fails. The group is torn down either way.
    fn run_group(
        &mut self,
        attempt: usize,
        checkpoint: Option<Checkpoint>,
        storage: &mut RunStorage,
        run: &mut Run,
    ) -> Result<(), TrainError> {
        let n = self.scaling.num_workers;
        let resources = self.scaling.worker_resources();
        let mut group = WorkerGroup::start(&self.scaling, &resources)?;
        let places = group.places()?;
        group.pids = places.iter().map(|p| p.pid).collect();
        // World ranks follow nodes, so local ranks are contiguous.
        let mut nodes: Vec<&str> = Vec::new();
        for p in &places {
            if !nodes.contains(&p.node.as_str()) {
                nodes.push(&p.node);
            }
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| nodes.iter().position(|x| *x == places[i].node));
        let mut shards: BTreeMap<String, Vec<crate::data::DataIterator>> = BTreeMap::new();
        for (name, ds) in &self.datasets {
            shards.insert(name.clone(), ds.streaming_split(n, true)?);
        }
        let group_name = format!(
            "train-{}-{}-{attempt}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let mut workers = Vec::with_capacity(n);
        let mut setups = Vec::with_capacity(n);
        for (world_rank, &i) in order.iter().enumerate() {
            let node = &places[i].node;
            let same_node: Vec<usize> = order
                .iter()
                .copied()
                .filter(|&j| places[j].node == *node)
                .collect();
            let context = TrainContext {
                world_rank,
                local_rank: same_node.iter().position(|&j| j == i).unwrap_or(0),
                node_rank: nodes.iter().position(|x| x == node).unwrap_or(0),
                world_size: n,
                local_world_size: same_node.len(),
                experiment_name: self.run.name.clone(),
                run_dir: run.result.path.clone(),
                device: device_for(self.scaling.use_gpu),
            };
            let setup = WorkerSetup {
                context,
                group_name: group_name.clone(),
                checkpoint: checkpoint.clone(),
                start_iteration: run.iteration,
                datasets: shards
                    .iter()
                    .map(|(k, v)| (k.clone(), v[world_rank].clone()))
                    .collect(),
            };
            let actor = &group.actors[i];
            setups.push(
                actor
                    .setup(setup)
                    .map_err(prism_err("send setup to a worker"))?,
            );
            workers.push(actor.clone());
        }
        group.collect(setups, no_early_exit)?;
        // Everyone joined: the rendezvous records are no longer needed.
        let prefix = format!("prism/collective/{group_name}/");
        for key in prism::kv::keys(&prefix).unwrap_or_default() {
            let _ = prism::kv::delete(&key);
        }
        let function = self.function.clone().unwrap_or_default();
        let config =
            serde_json::to_vec(self.config.as_ref().unwrap_or(&Value::Null)).unwrap_or_default();
        let starts = workers
            .iter()
            .map(|w| w.start(self.entry.clone(), function.clone(), config.clone()))
            .collect::<prism::Result<Vec<_>>>()
            .map_err(prism_err("start the training function"))?;
        // A function that cannot start (another build of the program, a
        // thread that cannot be made) would fail again: not retried.
        group.collect(starts, no_early_exit).map_err(|e| match e {
            TrainError::WorkerFailed { rank, message } => TrainError::WorkerStart { rank, message },
            other => other,
        })?;
        run.last_report = Instant::now();
        loop {
            let refs = workers
                .iter()
                .map(|w| w.next_event())
                .collect::<prism::Result<Vec<_>>>()
                .map_err(prism_err("ask a worker for its next report"))?;
            // The first failure ends the round: the other workers may be
            // blocked in a collective with the failed one.
            let events = group.collect(refs, |rank, event| match event {
                WorkerEvent::Failed { message } => Some(TrainError::WorkerFailed {
                    rank,
                    message: message.clone(),
                }),
                _ => None,
            })?;
            let finished = events
                .iter()
                .filter(|e| matches!(e, WorkerEvent::Finished))
                .count();
            if finished == n {
                return Ok(());
            }
            if finished > 0 {
                return Err(TrainError::Inconsistent(format!(
                    "{finished} of {n} workers returned while the others reported; every worker must call report() the same number of times"
                )));
            }
            self.take_reports(&events, storage, run)?;
            if run.result.stopped_early {
                // Dropping the group stops the workers.
                return Ok(());
            }
        }
    }

    /// One round of reports, one per worker: commit the checkpoint, append
    /// rank 0's row.
    fn take_reports(
        &mut self,
        events: &[WorkerEvent],
        storage: &mut RunStorage,
        run: &mut Run,
    ) -> Result<(), TrainError> {
        run.iteration += 1;
        let iteration = run.iteration;
        let mut metrics = match &events[0] {
            WorkerEvent::Report { metrics, .. } => match serde_json::from_str::<Value>(metrics) {
                Ok(Value::Object(m)) => m,
                _ => return Err(TrainError::Metrics(metrics.clone())),
            },
            _ => Map::new(),
        };
        let any_checkpoint = events.iter().any(|e| {
            matches!(
                e,
                WorkerEvent::Report {
                    checkpoint: true,
                    ..
                }
            )
        });
        let now = Instant::now();
        let this_iter = now.duration_since(run.last_report).as_secs_f64();
        run.last_report = now;
        let user_metrics = metrics.clone();
        metrics.insert("training_iteration".into(), iteration.into());
        metrics.insert("time_this_iter_s".into(), this_iter.into());
        metrics.insert(
            "time_total_s".into(),
            run.started.elapsed().as_secs_f64().into(),
        );
        metrics.insert(
            "timestamp".into(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
                .into(),
        );
        let checkpoint_name = if any_checkpoint {
            let c = storage.commit_checkpoint(iteration, &user_metrics)?;
            c.path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        } else {
            None
        };
        metrics.insert(
            "checkpoint_dir_name".into(),
            checkpoint_name.map(Value::String).unwrap_or(Value::Null),
        );
        if iteration <= run.written {
            // A restarted group replays reports made after its checkpoint:
            // the row written the first time stands.
            return Ok(());
        }
        storage.append(&metrics)?;
        run.written = iteration;
        if let Some(hook) = &mut self.on_report {
            hook(&metrics);
        }
        if let Some(stop) = &mut self.stop_when {
            run.result.stopped_early = stop(&metrics);
        }
        run.result.metrics_history.push(metrics.clone());
        run.result.metrics = Some(metrics);
        Ok(())
    }
}

/// Bookkeeping of one `fit`.
struct Run {
    result: TrainResult,
    /// The iteration of the last report taken.
    iteration: u64,
    /// The last iteration written to result.json.
    written: u64,
    started: Instant,
    last_report: Instant,
}

fn no_early_exit<T>(_: usize, _: &T) -> Option<TrainError> {
    None
}

/// Failures a new worker group may get past.
fn retriable(e: &TrainError) -> bool {
    match e {
        TrainError::WorkerDied { .. } | TrainError::WorkerFailed { .. } => true,
        TrainError::Prism { source, .. } => {
            matches!(
                source,
                prism::Error::ActorDied { .. } | prism::Error::WorkerDied { .. }
            )
        }
        _ => false,
    }
}

/// The placement group and worker actors of one attempt; dropping it kills
/// the actors and removes the group.
struct WorkerGroup {
    pg: PlacementGroup,
    actors: Vec<ActorHandle<PrismTrainWorker>>,
    /// The workers' processes, once located.
    pids: Vec<u32>,
}

impl WorkerGroup {
    fn start(
        scaling: &ScalingConfig,
        resources: &BTreeMap<String, f64>,
    ) -> Result<WorkerGroup, TrainError> {
        let mut bundle = Bundle::new();
        let mut options = ActorOptions::new().num_cpus(0.0);
        for (name, amount) in resources {
            (bundle, options) = match name.as_str() {
                "CPU" => (bundle.num_cpus(*amount), options.num_cpus(*amount)),
                "GPU" => (bundle.num_gpus(*amount), options.num_gpus(*amount)),
                _ => (
                    bundle.resource(name.clone(), *amount),
                    options.resource(name.clone(), *amount),
                ),
            };
        }
        let pg = prism::placement_group(
            vec![bundle; scaling.num_workers],
            scaling.placement_strategy,
        )
        .map_err(prism_err("reserve resources for the workers"))?;
        let mut group = WorkerGroup {
            pg,
            actors: Vec::new(),
            pids: Vec::new(),
        };
        let placement_timeout =
            Duration::from_millis(super::config::TrainerTunables::from_env()?.placement_timeout_ms);
        let ready = group
            .pg
            .wait(placement_timeout)
            .map_err(prism_err("reserve resources for the workers"))?;
        if !ready {
            return Err(TrainError::InvalidConfig {
                field: "ScalingConfig",
                reason: format!(
                    "{} workers with {resources:?} each could not be placed within {placement_timeout:?}: other work holds the resources (PRISM_TRAIN_PLACEMENT_TIMEOUT_MS)",
                    scaling.num_workers
                ),
            });
        }
        for i in 0..scaling.num_workers {
            let opts = options.clone().placement_group(&group.pg, Some(i));
            let actor = PrismTrainWorker::remote_with(opts).map_err(prism_err("start a worker"))?;
            group.actors.push(actor);
        }
        Ok(group)
    }

    fn places(&self) -> Result<Vec<super::worker::WorkerPlace>, TrainError> {
        let refs = self
            .actors
            .iter()
            .map(|a| a.place())
            .collect::<prism::Result<Vec<_>>>()
            .map_err(prism_err("locate the workers"))?;
        self.collect(refs, no_early_exit)
    }

    /// Waits for one result per worker (`refs[i]` is worker `i`'s); the
    /// first worker to die, to fail its call, or whose result `early` turns
    /// into an error, fails the round at once (the others may be blocked in
    /// a collective with it).
    fn collect<T: DeserializeOwned + Send + 'static>(
        &self,
        refs: Vec<ObjectRef<T>>,
        early: impl Fn(usize, &T) -> Option<TrainError>,
    ) -> Result<Vec<T>, TrainError> {
        let mut out: Vec<Option<T>> = (0..refs.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..refs.len()).collect();
        while !pending.is_empty() {
            let waiting: Vec<ObjectRef<T>> = pending.iter().map(|&i| refs[i].clone()).collect();
            let ready =
                prism::wait(&waiting, 1, None).map_err(prism_err("wait for the workers"))?;
            let ready_ids: Vec<_> = ready.0.iter().map(|r| r.id()).collect();
            let mut still = Vec::new();
            for i in pending {
                if !ready_ids.contains(&refs[i].id()) {
                    still.push(i);
                    continue;
                }
                let rank = i;
                match prism::get(&refs[i]) {
                    Ok(v) => {
                        if let Some(e) = early(rank, &v) {
                            return Err(e);
                        }
                        out[i] = Some(v);
                    }
                    Err(e @ (prism::Error::ActorDied { .. } | prism::Error::WorkerDied { .. })) => {
                        return Err(TrainError::WorkerDied { rank, cause: e })
                    }
                    Err(e) => {
                        return Err(TrainError::WorkerFailed {
                            rank,
                            message: e.to_string(),
                        })
                    }
                }
            }
            pending = still;
        }
        Ok(out.into_iter().flatten().collect())
    }
}

impl Drop for WorkerGroup {
    fn drop(&mut self) {
        for actor in &self.actors {
            let _ = prism::kill(actor);
        }
        let _ = prism::remove_placement_group(&self.pg);
        // Wait (a little) for the processes to be gone, so that a worker
        // still copying a checkpoint cannot write into the run folder
        // after the next attempt has cleaned it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.pids.iter().any(|&pid| process_alive(pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Whether `pid` is a running process (not gone, not a zombie).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            stat.rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        })
        .unwrap_or(false)
}
