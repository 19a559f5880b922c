//! Prism's training library.
//!
//! Today it holds the communication layer that keeps data-parallel model
//! replicas in step: [`collective`], a group of processes that all-reduce,
//! reduce-scatter, all-gather and broadcast buffers, over TCP between hosts and
//! over shared memory between processes on one host. The `Trainer` (a worker
//! group of actors with checkpoints and failure handling) will build on it.
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
//! - `cuda`: all-reduce and broadcast of CUDA device buffers through cudarc,
//!   with the driver and NVRTC loaded at run time (builds without a CUDA
//!   toolkit; without a driver the calls return
//!   [`collective::CollectiveError::CudaUnavailable`]).

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

pub mod collective;
pub mod data;
pub mod portable;
#[cfg(feature = "tch")]
pub mod torch;
mod trainer;

pub use trainer::{
    get_checkpoint, get_context, get_dataset_shard, get_process_group, report, Checkpoint,
    CheckpointConfig, CheckpointScoreOrder, Device, FailureConfig, Metrics, RunConfig,
    ScalingConfig, TrainContext, TrainError, TrainResult, Trainer,
};
