//! Inside a training function: ranks, the collective group, `report`,
//! the checkpoint to resume from and the dataset shards.

use super::checkpoint::{copy_tree, Checkpoint};
use super::error::TrainError;
use crate::collective::{CollectiveError, KvStore, ProcessGroup};
use crate::data::DataIterator;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

/// The device a worker should train on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Device {
    /// The host CPU.
    Cpu,
    /// A CUDA device, by its index among the devices this worker sees
    /// (`CUDA_VISIBLE_DEVICES` lists only the worker's own).
    Cuda(usize),
}

/// A worker's place in the run (Ray's `TrainContext`), from
/// [`get_context`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainContext {
    pub(crate) world_rank: usize,
    pub(crate) local_rank: usize,
    pub(crate) node_rank: usize,
    pub(crate) world_size: usize,
    pub(crate) local_world_size: usize,
    pub(crate) experiment_name: String,
    pub(crate) run_dir: PathBuf,
    pub(crate) device: Device,
}

impl TrainContext {
    /// This worker's rank among all workers, `0..world_size`.
    pub fn world_rank(&self) -> usize {
        self.world_rank
    }

    /// Its rank among the workers of its node.
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The rank of its node among the run's nodes.
    pub fn node_rank(&self) -> usize {
        self.node_rank
    }

    /// How many workers the run has.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// How many workers share this node.
    pub fn local_world_size(&self) -> usize {
        self.local_world_size
    }

    /// The run's name.
    pub fn experiment_name(&self) -> &str {
        &self.experiment_name
    }

    /// The run's folder (`storage_path/name`).
    pub fn run_dir(&self) -> &std::path::Path {
        &self.run_dir
    }

    /// The device to train on: `Cuda(0)` with `use_gpu`, else `Cpu`.
    pub fn device(&self) -> Device {
        self.device
    }
}

/// What a worker tells the driver.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum WorkerEvent {
    /// A `report`: its metrics as JSON, and whether a checkpoint was staged.
    Report { metrics: String, checkpoint: bool },
    /// The training function returned `Ok`.
    Finished,
    /// It returned an error or panicked.
    Failed { message: String },
}

/// Everything a worker process knows about its run.
pub(crate) struct WorkerState {
    pub(crate) context: TrainContext,
    pub(crate) group: Arc<ProcessGroup>,
    pub(crate) checkpoint: Option<Checkpoint>,
    pub(crate) datasets: BTreeMap<String, DataIterator>,
    /// The iteration the next report gets.
    pub(crate) next_iteration: Mutex<u64>,
    pub(crate) events: SyncSender<WorkerEvent>,
}

static STATE: Mutex<Option<Arc<WorkerState>>> = Mutex::new(None);

pub(crate) fn install(state: Arc<WorkerState>) {
    *STATE.lock() = Some(state);
}

fn state(what: &'static str) -> Result<Arc<WorkerState>, TrainError> {
    STATE.lock().clone().ok_or(TrainError::NotInWorker(what))
}

/// This worker's context: ranks, world size, device, run folder.
///
/// # Errors
///
/// [`TrainError::NotInWorker`] outside a training function.
pub fn get_context() -> Result<TrainContext, TrainError> {
    Ok(state("get_context")?.context.clone())
}

/// The run's collective group (formed through the cluster's control
/// store): all-reduce gradients, broadcast parameters, barriers.
pub fn get_process_group() -> Result<Arc<ProcessGroup>, TrainError> {
    Ok(state("get_process_group")?.group.clone())
}

/// The checkpoint to resume from: the latest one of the run when the
/// worker group was restarted after a failure, else `None`.
pub fn get_checkpoint() -> Result<Option<Checkpoint>, TrainError> {
    Ok(state("get_checkpoint")?.checkpoint.clone())
}

/// This worker's shard of the dataset given to the Trainer as `name`.
pub fn get_dataset_shard(name: &str) -> Result<DataIterator, TrainError> {
    let s = state("get_dataset_shard")?;
    s.datasets
        .get(name)
        .cloned()
        .ok_or_else(|| TrainError::UnknownDataset {
            name: name.to_string(),
            known: s.datasets.keys().cloned().collect(),
        })
}

/// The folder a report's checkpoint is staged in before the driver
/// commits it.
pub(crate) fn staging_dir(run_dir: &std::path::Path, iteration: u64) -> PathBuf {
    run_dir.join(format!(".staging_checkpoint_{iteration:06}"))
}

/// Reports metrics, and optionally a checkpoint, to the driver (Ray's
/// `train.report`).
///
/// Every worker must call it the same number of times; the driver keeps
/// rank 0's metrics. A checkpoint is copied into the run's folder (files of
/// every rank that passes one are merged into one `checkpoint_NNNNNN`) and
/// becomes visible only once every worker has made this report. The call
/// returns when the driver has taken the report.
///
/// ```
/// #[derive(serde::Serialize)]
/// struct EpochMetrics {
///     epoch: u32,
///     loss: f64,
/// }
///
/// fn end_of_epoch(epoch: u32, loss: f64) -> Result<(), prism_train::TrainError> {
///     prism_train::report(EpochMetrics { epoch, loss }, None)
/// }
///
/// // Only a training function run by the Trainer can report.
/// let err = end_of_epoch(3, 0.25).unwrap_err();
/// assert!(matches!(err, prism_train::TrainError::NotInWorker("report")));
/// ```
///
/// # Errors
///
/// [`TrainError::NotInWorker`] outside a training function,
/// [`TrainError::Metrics`] if `metrics` is not a struct or map, an I/O
/// error if the checkpoint cannot be copied, and an error if the driver is
/// gone.
pub fn report(metrics: impl Serialize, checkpoint: Option<Checkpoint>) -> Result<(), TrainError> {
    let s = state("report")?;
    let value = serde_json::to_value(&metrics).map_err(|e| TrainError::Metrics(e.to_string()))?;
    if !value.is_object() {
        return Err(TrainError::Metrics(format!("got {value}")));
    }
    let mut next = s.next_iteration.lock();
    let iteration = *next + 1;
    if let Some(checkpoint) = &checkpoint {
        copy_tree(
            checkpoint.path(),
            &staging_dir(&s.context.run_dir, iteration),
        )?;
    }
    s.events
        .send(WorkerEvent::Report {
            metrics: value.to_string(),
            checkpoint: checkpoint.is_some(),
        })
        .map_err(|_| TrainError::Inconsistent("the driver stopped taking reports".into()))?;
    *next = iteration;
    Ok(())
}

/// The cluster's key-value table as the collective rendezvous store.
#[derive(Debug)]
pub(crate) struct ClusterKv;

fn kv_error(e: prism::Error) -> CollectiveError {
    CollectiveError::Io {
        peer: None,
        context: "the cluster's key-value table",
        source: Arc::new(std::io::Error::other(e.to_string())),
    }
}

impl KvStore for ClusterKv {
    fn put(&self, key: &str, value: &str) -> crate::collective::Result<()> {
        prism::kv::put(key, value).map(|_| ()).map_err(kv_error)
    }

    fn get(&self, key: &str) -> crate::collective::Result<Option<String>> {
        let value = prism::kv::get(key).map_err(kv_error)?;
        Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }
}
