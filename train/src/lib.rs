//! Prism's training library: Ray Train for Rust.
//!
//! - [`Trainer`] runs a training function data-parallel on a group of
//!   worker actors placed together, with [`report`]ed metrics kept in the
//!   run's folder, checkpoints committed whole, and recovery from failed or
//!   killed workers (Ray Train's `TorchTrainer`; see [`Trainer`] for an
//!   example and docs/train.md for how it is built).
//! - [`data`]: datasets for training input, sharded per worker, and a
//!   distributed sampler.
//! - `torch` (feature `tch`): `prepare_model` for tch models, averaging
//!   gradients over the workers in buckets.
//! - [`collective`]: the process group the workers communicate through:
//!   all-reduce, reduce-scatter, all-gather and broadcast over TCP between
//!   hosts and shared memory between processes on one host.
//!
//! # A first group
//!
//! Every process of a group calls the same collectives in the same order.
//! With one process the group is complete at once, so this runs as it is:
//!
//! ```
//! use prism_train::collective::{GroupOptions, ProcessGroup, ReduceOp};
//!
//! # fn main() -> Result<(), prism_train::collective::CollectiveError> {
//! let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
//! let mut grads = vec![1.0f32, 2.0, 3.0];
//! group.all_reduce(&mut grads, ReduceOp::Mean)?;
//! assert_eq!(grads, [1.0, 2.0, 3.0]);
//! # Ok(())
//! # }
//! ```
//!
//! With more processes, give each its rank and the same rendezvous address
//! (`MASTER_ADDR`/`MASTER_PORT`, as torch.distributed's `env://` does), or call
//! [`collective::ProcessGroup::from_env`].
//!
//! # Feature flags
//!
//! - `tch`: the `torch` module (needs libtorch: `scripts/setup-torch.sh`
//!   installs PyTorch 2.11.0 from PyPI and writes the environment to build
//!   with).
//! - `cuda`: all-reduce and broadcast of CUDA device buffers, directly
//!   through CUDA IPC between processes sharing a GPU, with the driver and
//!   NVRTC opened at run time (builds without a CUDA toolkit, runs on CUDA
//!   11 to 13 drivers; without a driver the calls return
//!   [`collective::CollectiveError::CudaUnavailable`]).

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

pub use prism::portable;
pub use prism_collective as collective;
pub use prism_data as data;
#[cfg(feature = "tch")]
pub mod torch;
mod trainer;

pub use trainer::{
    get_checkpoint, get_context, get_dataset_shard, get_process_group, report, Checkpoint,
    CheckpointConfig, CheckpointScoreOrder, Device, FailureConfig, Metrics, RunConfig,
    ScalingConfig, TrainContext, TrainError, TrainResult, Trainer, TrainerTunables,
};
