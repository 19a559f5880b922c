//! The Trainer: data-parallel training on a group of worker actors, with
//! checkpoints and failure recovery (Ray Train's `TorchTrainer`).
//!
//! A run is a [`Trainer`] given a training function, its config, a
//! [`ScalingConfig`] (how many workers, GPUs or not), a [`RunConfig`]
//! (where the run is kept, which checkpoints to keep, how many failures to
//! survive) and named datasets. [`Trainer::fit`]:
//!
//! 1. reserves one bundle per worker in a placement group and starts one
//!    worker actor in each;
//! 2. gives every worker its ranks and joins them into a collective group
//!    through the cluster's key-value table (no address to choose);
//! 3. runs the function on every worker; each `report` reaches the driver,
//!    which appends rank 0's metrics to `result.json` and `progress.csv`
//!    and commits the checkpoint (copied to a staging folder, then renamed
//!    to `checkpoint_NNNNNN` once every worker made that report);
//! 4. if a worker fails or dies, tears the group down and starts a new one
//!    that resumes from the latest committed checkpoint, up to
//!    `max_failures` times.
//!
//! Making a Trainer again with the same storage path and name resumes the
//! run in that folder (after its driver died, say) from its latest
//! checkpoint.
//!
//! Run folder layout (`storage_path/name/`): `params.json` (the config),
//! `result.json` (one JSON object per report), `progress.csv`, and the kept
//! `checkpoint_NNNNNN/` folders.

mod checkpoint;
mod config;
mod context;
mod error;
mod fit;
mod storage;
mod worker;

pub use checkpoint::Checkpoint;
pub use config::{
    CheckpointConfig, CheckpointScoreOrder, FailureConfig, RunConfig, ScalingConfig,
    TrainerTunables,
};
pub use context::{
    get_checkpoint, get_context, get_dataset_shard, get_process_group, report, Device, TrainContext,
};
pub use error::TrainError;
pub use fit::{Metrics, TrainResult, Trainer};
