//! Data-parallel training of tch (libtorch) models over a [`ProcessGroup`].
//!
//! [`prepare_model`] is Ray Train's `prepare_model` (torch's
//! `DistributedDataParallel`) for a [`VarStore`]: it moves the variables to
//! the worker's device, gives every rank rank 0's values, and returns a
//! [`DistributedModel`] whose
//! [`all_reduce_gradients`](DistributedModel::all_reduce_gradients) averages
//! the gradients over the ranks after each `backward()`. The optimizer step
//! then moves every replica the same way, so they stay equal.
//!
//! # A training step
//!
//! Every rank runs the same code on its own shard of the data. With one
//! process the group is complete at once, so this runs as it is:
//!
//! ```
//! use prism_train::collective::{GroupOptions, ProcessGroup};
//! use prism_train::torch::{prepare_model_with, DdpOptions};
//! use std::sync::Arc;
//! use tch::nn::{self, Module, OptimizerConfig};
//! use tch::{Device, Kind, Tensor};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let group = Arc::new(ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?);
//! let mut vs = nn::VarStore::new(Device::Cpu);
//! let model = nn::linear(vs.root() / "fc", 4, 1, Default::default());
//! let ddp = prepare_model_with(&mut vs, Device::Cpu, group, DdpOptions::default())?;
//! let mut optimizer = nn::Sgd::default().build(&vs, 0.1)?;
//!
//! let x = Tensor::randn([8, 4], (Kind::Float, Device::Cpu));
//! let y = Tensor::zeros([8, 1], (Kind::Float, Device::Cpu));
//! optimizer.zero_grad();
//! let loss = model.forward(&x).mse_loss(&y, tch::Reduction::Mean);
//! loss.backward();
//! ddp.all_reduce_gradients()?; // every rank now holds the mean gradient
//! optimizer.step();
//! # Ok(())
//! # }
//! ```
//!
//! # Which variables, in which order
//!
//! Every rank must build the same model: the same variable names, shapes and
//! element kinds (a mismatch fails with
//! [`CollectiveError::CallMismatch`]). The variables are read from the store
//! at each call, ordered by name, so the order does not depend on how each
//! rank's hash maps iterate.
//!
//! - [`prepare_model`] and [`DistributedModel::broadcast_parameters`] copy
//!   every variable of the store, trainable or not (running statistics too).
//! - [`DistributedModel::all_reduce_gradients`] averages the gradients of the
//!   variables that require a gradient at the time of the call.
//!
//! # Variables without a gradient
//!
//! A variable that got no gradient on any rank in this step (unused, or
//! frozen) is left without one on every rank, as torch's optimizers then skip
//! it. A variable with a gradient on some ranks only counts as zero on the
//! others, which then receive the average too (their gradient is created), so
//! every replica takes the same step, as `DistributedDataParallel` with
//! `find_unused_parameters` does. Telling the two apart costs one small
//! all-reduce per call (a byte per variable), queued before the buckets.
//!
//! # Buckets and overlap
//!
//! Gradients are copied, in name order, into host buckets of at most
//! [`DdpOptions::bucket_cap_bytes`] (25 MiB by default, as torch's
//! `bucket_cap_mb`), one element kind per bucket; a larger variable gets a
//! bucket of its own. A bucket's all-reduce starts
//! ([`ProcessGroup::all_reduce_async`]) as soon as it is filled, so copying
//! the next bucket overlaps its reduction, and each result is copied back
//! while the later buckets are still on the wire. At most
//! [`MAX_BUCKETS_IN_FLIGHT`] buckets are held at once, which bounds the host
//! memory used. The mean is [`ReduceOp::Mean`]: the sum over the ranks
//! divided by the world size.
//!
//! # Devices
//!
//! Variables on any device work. With the `cuda` feature, variables on a
//! CUDA device stay there: each bucket is one contiguous tensor on the
//! device (the gradients concatenated), reduced by
//! [`CudaCollectives`](crate::collective::cuda::CudaCollectives) (through
//! CUDA IPC when the ranks share the GPU, no host copy), and copied back
//! into the gradients on the device. Without the feature, or if the driver
//! cannot be used (a warning says why), each variable is copied into a host
//! bucket and back. A CUDA build of libtorch needs `PRISM_TORCH_CUDA=1` at
//! build time (see `scripts/setup-torch.sh`).
//!
//! # Checkpoints that resume a run exactly
//!
//! tch's optimizers keep their state (Adam's running averages) inside
//! libtorch, out of reach: a checkpoint of the model alone resumes with that
//! state at zero, and the first steps after a restart are too large.
//! [`Adam`] is torch's Adam with its state in tensors of its own:
//! [`Adam::save`] it into the checkpoint folder beside the model and
//! [`Adam::load`] it when resuming (the training examples do).
//!
//! # Errors
//!
//! [`TorchError`]: a collective failure (which aborts the group on every
//! rank; create a new group to go on), a libtorch error, or a variable whose
//! element kind the collectives cannot carry. Element kinds are checked
//! before any collective, on every rank alike, so such a model fails
//! everywhere without leaving a call half made.

mod adam;
mod buckets;
mod error;
#[cfg(any(feature = "cuda", test))]
mod flat;
mod model;
mod tensors;

pub use adam::{Adam, AdamConfig, OPTIMIZER_FILE};
pub use buckets::MAX_BUCKETS_IN_FLIGHT;
pub use error::TorchError;
pub use model::{
    get_device, prepare_model, prepare_model_with, DdpOptions, DistributedModel,
    DEFAULT_BUCKET_CAP_BYTES,
};
pub use tensors::{
    batch_tensors, column_tensor, iter_torch_batches, tensor_from_slice, tensor_to_vec,
};

// The items the module docs link to.
#[cfg(doc)]
use crate::collective::{CollectiveError, ProcessGroup, ReduceOp};
#[cfg(doc)]
use tch::nn::VarStore;
