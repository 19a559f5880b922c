//! The Trainer's configuration, under Ray Train's names.

use prism::PlacementStrategy;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// How many workers, and what each one holds (Ray's `ScalingConfig`).
///
/// ```
/// use prism_train::ScalingConfig;
///
/// let scaling = ScalingConfig::new(4).use_gpu(true).resources_per_worker("CPU", 2.0);
/// assert_eq!(scaling.num_workers, 4);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingConfig {
    /// Worker processes (one actor each).
    pub num_workers: usize,
    /// One GPU per worker (or the `GPU` amount in `resources_per_worker`),
    /// visible to it through `CUDA_VISIBLE_DEVICES`.
    pub use_gpu: bool,
    /// Resources each worker holds; default one CPU, plus one GPU with
    /// `use_gpu`. Entries given here replace those defaults.
    pub resources_per_worker: BTreeMap<String, f64>,
    /// How the workers' bundles are placed (default `Pack`).
    pub placement_strategy: PlacementStrategy,
}

impl ScalingConfig {
    /// `num_workers` CPU workers, packed.
    pub fn new(num_workers: usize) -> Self {
        ScalingConfig {
            num_workers,
            use_gpu: false,
            resources_per_worker: BTreeMap::new(),
            placement_strategy: PlacementStrategy::Pack,
        }
    }

    /// Gives every worker a GPU.
    pub fn use_gpu(mut self, yes: bool) -> Self {
        self.use_gpu = yes;
        self
    }

    /// Sets one resource each worker holds (`"CPU"`, `"GPU"`, `"memory"` or
    /// a custom name).
    pub fn resources_per_worker(mut self, name: impl Into<String>, amount: f64) -> Self {
        self.resources_per_worker.insert(name.into(), amount);
        self
    }

    /// Sets the placement strategy.
    pub fn placement_strategy(mut self, strategy: PlacementStrategy) -> Self {
        self.placement_strategy = strategy;
        self
    }

    /// The resources of one worker, defaults filled in.
    pub(crate) fn worker_resources(&self) -> BTreeMap<String, f64> {
        let mut r = BTreeMap::new();
        r.insert("CPU".to_string(), 1.0);
        if self.use_gpu {
            r.insert("GPU".to_string(), 1.0);
        }
        for (k, v) in &self.resources_per_worker {
            r.insert(k.clone(), *v);
        }
        r
    }
}

/// Which end of `checkpoint_score_attribute` is best.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointScoreOrder {
    /// Higher is better (Ray's default, `"max"`).
    #[default]
    Max,
    /// Lower is better (`"min"`, for a loss).
    Min,
}

/// Which checkpoints to keep (Ray's `CheckpointConfig`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CheckpointConfig {
    /// Keep at most this many (default: all). The latest is always kept as
    /// well, so a failed run can resume from it.
    pub num_to_keep: Option<usize>,
    /// The reported metric that ranks checkpoints (default: recency).
    pub checkpoint_score_attribute: Option<String>,
    /// Whether a higher or a lower score is better.
    pub checkpoint_score_order: CheckpointScoreOrder,
}

impl CheckpointConfig {
    /// Keep every checkpoint, ranked by recency.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep at most `n` checkpoints.
    pub fn num_to_keep(mut self, n: usize) -> Self {
        self.num_to_keep = Some(n);
        self
    }

    /// Rank checkpoints by the reported metric `attribute`, best first.
    pub fn checkpoint_score_attribute(
        mut self,
        attribute: impl Into<String>,
        order: CheckpointScoreOrder,
    ) -> Self {
        self.checkpoint_score_attribute = Some(attribute.into());
        self.checkpoint_score_order = order;
        self
    }
}

/// How many worker-group failures a run survives (Ray's `FailureConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FailureConfig {
    /// Restarts from the latest checkpoint before the run fails (default
    /// 0; `usize::MAX` for no limit).
    pub max_failures: usize,
}

impl FailureConfig {
    /// Survive up to `max_failures` failures.
    pub fn new(max_failures: usize) -> Self {
        FailureConfig { max_failures }
    }
}

/// Where and how a run is kept (Ray's `RunConfig`).
///
/// ```
/// use prism_train::{CheckpointConfig, FailureConfig, RunConfig};
///
/// let run = RunConfig::new("mnist")
///     .storage_path("/tmp/prism_results")
///     .checkpoint_config(CheckpointConfig::new().num_to_keep(2))
///     .failure_config(FailureConfig::new(3));
/// assert_eq!(run.run_dir(), std::path::Path::new("/tmp/prism_results/mnist"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// The run's name: its folder under `storage_path`. A Trainer given the
    /// name of a run that is already there resumes that run.
    pub name: String,
    /// The folder runs are kept in (default `~/prism_results`).
    pub storage_path: PathBuf,
    /// Checkpoint retention.
    pub checkpoint_config: CheckpointConfig,
    /// Failure handling.
    pub failure_config: FailureConfig,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig::new(default_name())
    }
}

impl RunConfig {
    /// A run called `name`, kept under the default storage path.
    pub fn new(name: impl Into<String>) -> Self {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        RunConfig {
            name: name.into(),
            storage_path: home.join("prism_results"),
            checkpoint_config: CheckpointConfig::default(),
            failure_config: FailureConfig::default(),
        }
    }

    /// Keeps runs under `path`.
    pub fn storage_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.storage_path = path.into();
        self
    }

    /// Sets checkpoint retention.
    pub fn checkpoint_config(mut self, config: CheckpointConfig) -> Self {
        self.checkpoint_config = config;
        self
    }

    /// Sets failure handling.
    pub fn failure_config(mut self, config: FailureConfig) -> Self {
        self.failure_config = config;
        self
    }

    /// The run's folder: `storage_path/name`.
    pub fn run_dir(&self) -> PathBuf {
        self.storage_path.join(&self.name)
    }
}

/// `PrismTrainer_<UTC date>_<time>`, unique per second and process.
fn default_name() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = prism_protocol::clock::civil_from_days(days as i64);
    format!(
        "PrismTrainer_{y:04}-{m:02}-{d:02}_{:02}-{:02}-{:02}_{}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        std::process::id()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_resources_fill_in_defaults_and_take_overrides() {
        let r = ScalingConfig::new(2)
            .use_gpu(true)
            .resources_per_worker("GPU", 0.5)
            .worker_resources();
        assert_eq!(r.get("CPU"), Some(&1.0));
        assert_eq!(r.get("GPU"), Some(&0.5));
    }
}

prism_config::table! {
    /// The Trainer's tunables, each settable as `PRISM_TRAIN_<NAME>`; read
    /// by every `fit`.
    ///
    /// ```
    /// let tunables = prism_train::TrainerTunables::default();
    /// assert_eq!(tunables.placement_timeout_ms, 120_000);
    /// ```
    #[derive(Clone, Debug)]
    pub struct TrainerTunables("PRISM_TRAIN_") {
        /// How long a worker group may wait for its resources before the
        /// run fails. 2 minutes: other work may hold them for a while, but
        /// a group that can never be placed should say so.
        placement_timeout_ms: u64 = 120_000;
    }
}

impl TrainerTunables {
    /// The defaults with the `PRISM_TRAIN_*` overrides applied.
    pub fn from_env() -> Result<Self, crate::TrainError> {
        let mut t = TrainerTunables::default();
        t.apply_env_overrides()
            .map_err(|e| crate::TrainError::InvalidConfig {
                field: "environment",
                reason: e.to_string(),
            })?;
        Ok(t)
    }
}
