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
//! # Errors
//!
//! [`TorchError`]: a collective failure (which aborts the group on every
//! rank; create a new group to go on), a libtorch error, or a variable whose
//! element kind the collectives cannot carry. Element kinds are checked
//! before any collective, on every rank alike, so such a model fails
//! everywhere without leaving a call half made.

use crate::collective::{CollectiveError, Element, ProcessGroup, ReduceOp, Work};
use crate::data::{Batch, Column, DataError, DataIterator};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use tch::nn::{VarStore, Variables};
use tch::{Device, Kind, TchError, Tensor};

/// The default bucket size: 25 MiB, torch `DistributedDataParallel`'s
/// `bucket_cap_mb`. Large enough that per-call overheads vanish behind the
/// bandwidth, small enough that several buckets overlap on a real model.
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * 1024 * 1024;

/// Buckets whose collectives may be in flight at once; the host memory an
/// all-reduce uses is at most this many buckets.
pub const MAX_BUCKETS_IN_FLIGHT: usize = 4;

/// Everything that can go wrong in this module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TorchError {
    /// A dataset operation failed (a missing column, a string column).
    #[error(transparent)]
    Data(#[from] DataError),
    /// A Trainer call failed (for instance, called outside a training
    /// function).
    #[error(transparent)]
    Train(#[from] crate::TrainError),
    /// A collective failed (see [`CollectiveError`] for which failures leave
    /// the group usable).
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// libtorch refused an operation.
    #[error("libtorch: {0}")]
    Tch(#[from] TchError),
    /// A variable whose element kind the collectives do not carry.
    #[error(
        "variable {name:?} holds {kind:?} elements, which {purpose} cannot carry; \
         use Float, Double, Half or BFloat16{hint}"
    )]
    UnsupportedKind {
        /// The variable's name in the store.
        name: String,
        /// Its element kind.
        kind: Kind,
        /// `"the gradient all-reduce"` or `"the parameter broadcast"`.
        purpose: &'static str,
        /// What else would do, if anything.
        hint: &'static str,
    },
}

/// How [`prepare_model`] synchronizes a model.
///
/// ```
/// use prism_train::torch::DdpOptions;
///
/// let options = DdpOptions::default().bucket_cap_mb(50);
/// assert_eq!(options.bucket_cap_bytes(), 50 * 1024 * 1024);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DdpOptions {
    bucket_cap_bytes: usize,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_bytes: DEFAULT_BUCKET_CAP_BYTES,
        }
    }
}

impl DdpOptions {
    /// Sets the bucket size in MiB (torch's `bucket_cap_mb`).
    pub fn bucket_cap_mb(self, mib: usize) -> Self {
        self.with_bucket_cap_bytes(mib.saturating_mul(1024 * 1024))
    }

    /// Sets the bucket size in bytes. A variable larger than the cap gets a
    /// bucket of its own; 0 gives every variable its own bucket.
    pub fn with_bucket_cap_bytes(mut self, bytes: usize) -> Self {
        self.bucket_cap_bytes = bytes;
        self
    }

    /// The bucket size in bytes.
    pub fn bucket_cap_bytes(&self) -> usize {
        self.bucket_cap_bytes
    }
}

/// A model prepared for data-parallel training: the handle that averages its
/// gradients over the group. Made by [`prepare_model`].
///
/// It reads the variables from the [`VarStore`] at each call, so variables
/// frozen or unfrozen later are followed; variables added later are too, but
/// every rank must add the same ones, and they are not broadcast unless
/// [`broadcast_parameters`](Self::broadcast_parameters) is called.
pub struct DistributedModel {
    variables: Arc<Mutex<Variables>>,
    group: Arc<ProcessGroup>,
    device: Device,
    options: DdpOptions,
    /// The device path for variables on a GPU; `None` on the CPU, or when
    /// the driver could not be used (buckets then go through host memory).
    #[cfg(feature = "cuda")]
    cuda: Option<Mutex<crate::collective::cuda::CudaCollectives>>,
}

impl fmt::Debug for DistributedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedModel")
            .field("group", &self.group)
            .field("device", &self.device)
            .field("options", &self.options)
            .finish()
    }
}

/// Ray Train's `prepare_model`, inside a training function run by the
/// [`Trainer`](crate::Trainer): [`prepare_model_with`] on the run's
/// collective group and the worker's device ([`get_device`]).
///
/// # Errors
///
/// [`TorchError::Train`] outside a training function, else as
/// [`prepare_model_with`].
pub fn prepare_model(
    vs: &mut VarStore,
    options: DdpOptions,
) -> Result<DistributedModel, TorchError> {
    let group = crate::get_process_group()?;
    prepare_model_with(vs, get_device()?, group, options)
}

/// Ray Train's `get_device`: inside a training function, `Cuda(0)` (the
/// worker's own GPU) when the run uses GPUs and CUDA is available, else the
/// CPU.
pub fn get_device() -> Result<Device, TorchError> {
    match crate::get_context()?.device() {
        crate::Device::Cuda(i) if tch::Cuda::is_available() => Ok(Device::Cuda(i)),
        _ => Ok(Device::Cpu),
    }
}

/// Moves `vs` to `device`, copies rank 0's variables to every rank, and
/// returns the handle that averages gradients (see the [module docs](self)).
///
/// Every rank of `group` must call it with a store holding the same
/// variables. It returns once this rank holds rank 0's values.
pub fn prepare_model_with(
    vs: &mut VarStore,
    device: Device,
    group: Arc<ProcessGroup>,
    options: DdpOptions,
) -> Result<DistributedModel, TorchError> {
    vs.set_device(device);
    #[cfg(feature = "cuda")]
    let cuda = match device {
        Device::Cuda(ordinal) => match crate::collective::cuda::CudaCollectives::new(ordinal) {
            Ok(cuda) => Some(Mutex::new(cuda)),
            Err(e) => {
                tracing::warn!("gradients go through host memory: {e}");
                None
            }
        },
        _ => None,
    };
    let model = DistributedModel {
        variables: vs.variables_.clone(),
        group,
        device,
        options,
        #[cfg(feature = "cuda")]
        cuda,
    };
    model.broadcast_parameters(0)?;
    Ok(model)
}

impl DistributedModel {
    /// Averages every trainable variable's gradient over the ranks, in place:
    /// call it after `backward()` and before the optimizer's `step()`, on
    /// every rank.
    pub fn all_reduce_gradients(&self) -> Result<(), TorchError> {
        let entries = self.entries(Purpose::Gradients)?;
        // Alone, a rank's gradients are already the average.
        if entries.is_empty() || self.group.world_size() == 1 {
            return Ok(());
        }
        let has_grad: Vec<u8> = entries
            .iter()
            .map(|e| u8::from(e.tensor.grad().defined()))
            .collect();
        let flags = Flags::Pending(self.group.all_reduce_async(has_grad, ReduceOp::Max));
        #[cfg(feature = "cuda")]
        if let Some(cuda) = self.device_path(&entries) {
            return flat::run_buckets(
                &mut *cuda.lock().unwrap_or_else(|p| p.into_inner()),
                &self.group,
                Op::AverageGradients,
                &entries,
                self.options.bucket_cap_bytes,
                flags,
            );
        }
        run_buckets(
            &self.group,
            Op::AverageGradients,
            &entries,
            self.options.bucket_cap_bytes,
            flags,
        )
    }

    /// Copies `root`'s variables (all of them, trainable or not) to every
    /// rank, as [`prepare_model`] does with rank 0. Use it after a rank
    /// loaded a checkpoint the others did not.
    pub fn broadcast_parameters(&self, root: usize) -> Result<(), TorchError> {
        let entries = self.entries(Purpose::Broadcast)?;
        let count = entries.len();
        #[cfg(feature = "cuda")]
        if let Some(cuda) = self.device_path(&entries) {
            return flat::run_buckets(
                &mut *cuda.lock().unwrap_or_else(|p| p.into_inner()),
                &self.group,
                Op::Broadcast { root },
                &entries,
                self.options.bucket_cap_bytes,
                Flags::Ready(vec![true; count]),
            );
        }
        run_buckets(
            &self.group,
            Op::Broadcast { root },
            &entries,
            self.options.bucket_cap_bytes,
            Flags::Ready(vec![true; count]),
        )
    }

    /// The device path, when every variable is on this model's GPU (the
    /// same on every rank: the ranks built the same model on their GPU).
    #[cfg(feature = "cuda")]
    fn device_path(
        &self,
        entries: &[Entry],
    ) -> Option<&Mutex<crate::collective::cuda::CudaCollectives>> {
        let cuda = self.cuda.as_ref()?;
        entries
            .iter()
            .all(|e| e.tensor.device() == self.device)
            .then_some(cuda)
    }

    /// The group the gradients are averaged over.
    pub fn group(&self) -> &Arc<ProcessGroup> {
        &self.group
    }

    /// The device the variables were moved to.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The options given to [`prepare_model`].
    pub fn options(&self) -> &DdpOptions {
        &self.options
    }

    /// The variables a call works on, grouped by wire type and then ordered
    /// by name, with their kinds checked.
    fn entries(&self, purpose: Purpose) -> Result<Vec<Entry>, TorchError> {
        let named: Vec<(String, Tensor)> = {
            let variables = self
                .variables
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            variables
                .named_variables
                .iter()
                .map(|(name, t)| (name.clone(), t.shallow_clone()))
                .collect()
        };
        let mut entries = Vec::with_capacity(named.len());
        for (name, tensor) in named {
            if purpose == Purpose::Gradients && !tensor.requires_grad() {
                continue;
            }
            let kind = tensor.f_kind()?;
            let Some(wire) = Wire::of(kind, purpose) else {
                return Err(TorchError::UnsupportedKind {
                    name,
                    kind,
                    purpose: purpose.describe(),
                    hint: match purpose {
                        Purpose::Gradients => "",
                        Purpose::Broadcast => ", or Int, Int64, Uint8 or Bool for buffers",
                    },
                });
            };
            let numel = tensor.numel();
            entries.push(Entry {
                name,
                shape: tensor.size(),
                tensor,
                kind,
                wire,
                numel,
            });
        }
        entries.sort_by(|a, b| (a.wire, &a.name).cmp(&(b.wire, &b.name)));
        Ok(entries)
    }
}

/// Makes a tensor of `shape` from host data.
///
/// ```
/// use prism_train::torch::{tensor_from_slice, tensor_to_vec};
///
/// let t = tensor_from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// assert_eq!(t.size(), [2, 2]);
/// assert_eq!(tensor_to_vec::<f32>(&t)?, [1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), prism_train::torch::TorchError>(())
/// ```
pub fn tensor_from_slice<T: tch::kind::Element>(
    data: &[T],
    shape: &[i64],
) -> Result<Tensor, TorchError> {
    Ok(Tensor::f_from_slice(data)?.f_reshape(shape)?)
}

/// Copies a tensor's elements, in row-major order, to a host vector; the
/// tensor may be on any device and of any layout, but its kind must be `T`'s.
pub fn tensor_to_vec<T: tch::kind::Element>(tensor: &Tensor) -> Result<Vec<T>, TorchError> {
    let numel = tensor.numel();
    let mut out = vec![T::ZERO; numel];
    tensor.f_copy_data(&mut out, numel)?;
    Ok(out)
}

/// A numeric column of a [`Batch`] as a tensor on `device`: `[rows]` for
/// scalar columns (f32, f64, i64 keep their kind), `[rows, row_len]` for
/// tensor columns.
///
/// ```
/// use prism_train::data::{Batch, Column};
/// use prism_train::torch::column_tensor;
///
/// let batch = Batch::new(vec![
///     ("x".to_string(), Column::F64(vec![1.0, 2.0])),
///     ("image".to_string(), Column::tensor(vec![0.0; 8], 4)?),
/// ])?;
/// assert_eq!(column_tensor(&batch, "x", tch::Device::Cpu)?.size(), [2]);
/// assert_eq!(column_tensor(&batch, "image", tch::Device::Cpu)?.size(), [2, 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`TorchError::Data`] for a missing column, or a string or bytes column.
pub fn column_tensor(batch: &Batch, name: &str, device: Device) -> Result<Tensor, TorchError> {
    let tensor = match batch.column(name)? {
        Column::F32(v) => Tensor::f_from_slice(v)?,
        Column::F64(v) => Tensor::f_from_slice(v)?,
        Column::I64(v) => Tensor::f_from_slice(v)?,
        Column::Tensor { values, row_len } => Tensor::f_from_slice(values)?
            .f_reshape([(values.len() / row_len) as i64, *row_len as i64])?,
        other @ (Column::Str(_) | Column::Bytes(_)) => {
            return Err(DataError::ColumnType {
                column: name.to_string(),
                found: other.data_type(),
                expected: "a numeric or tensor column",
            }
            .into())
        }
    };
    Ok(tensor.f_to_device(device)?)
}

/// Every numeric column of `batch` as a tensor (see [`column_tensor`]),
/// by name: one step of Ray's `iter_torch_batches`. String and bytes
/// columns are left out.
pub fn batch_tensors(
    batch: &Batch,
    device: Device,
) -> Result<BTreeMap<String, Tensor>, TorchError> {
    let mut out = BTreeMap::new();
    for (name, column) in batch.columns() {
        if !matches!(column, Column::Str(_) | Column::Bytes(_)) {
            out.insert(name.to_string(), column_tensor(batch, name, device)?);
        }
    }
    Ok(out)
}

/// Ray's `iter_torch_batches`: one epoch of a dataset shard as tensors on
/// `device`, batch by batch.
pub fn iter_torch_batches(
    shard: &DataIterator,
    batch_size: usize,
    drop_last: bool,
    device: Device,
) -> Result<impl Iterator<Item = Result<BTreeMap<String, Tensor>, TorchError>>, TorchError> {
    Ok(shard
        .iter_batches(batch_size, drop_last)?
        .map(move |batch| batch_tensors(&batch?, device)))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    Gradients,
    Broadcast,
}

impl Purpose {
    fn describe(self) -> &'static str {
        match self {
            Purpose::Gradients => "the gradient all-reduce",
            Purpose::Broadcast => "the parameter broadcast",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    AverageGradients,
    Broadcast { root: usize },
}

/// The element type a kind travels as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Wire {
    F32,
    F64,
    F16,
    Bf16,
    I32,
    I64,
    U8,
}

impl Wire {
    fn of(kind: Kind, purpose: Purpose) -> Option<Wire> {
        let wire = match kind {
            Kind::Float => Wire::F32,
            Kind::Double => Wire::F64,
            Kind::Half => Wire::F16,
            Kind::BFloat16 => Wire::Bf16,
            // Integer buffers (a step counter) are broadcast, never averaged.
            Kind::Int if purpose == Purpose::Broadcast => Wire::I32,
            Kind::Int64 if purpose == Purpose::Broadcast => Wire::I64,
            // A bool is one byte in libtorch.
            Kind::Uint8 | Kind::Bool if purpose == Purpose::Broadcast => Wire::U8,
            _ => return None,
        };
        Some(wire)
    }

    fn size_bytes(self) -> usize {
        self.data_type().size_bytes()
    }

    fn data_type(self) -> crate::collective::DataType {
        use crate::collective::DataType as D;
        match self {
            Wire::F32 => D::F32,
            Wire::F64 => D::F64,
            Wire::F16 => D::F16,
            Wire::Bf16 => D::BF16,
            Wire::I32 => D::I32,
            Wire::I64 => D::I64,
            Wire::U8 => D::U8,
        }
    }
}

/// One variable of the store.
struct Entry {
    name: String,
    tensor: Tensor,
    shape: Vec<i64>,
    kind: Kind,
    wire: Wire,
    numel: usize,
}

/// Consecutive entries of one wire type, at most the cap in bytes unless a
/// single entry is larger.
#[derive(Clone, Debug)]
struct Bucket {
    entries: Range<usize>,
    wire: Wire,
    numel: usize,
}

fn plan_buckets(entries: &[Entry], cap_bytes: usize) -> Vec<Bucket> {
    let mut buckets: Vec<Bucket> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let fits = buckets.last().is_some_and(|b| {
            b.wire == entry.wire && (b.numel + entry.numel) * entry.wire.size_bytes() <= cap_bytes
        });
        match buckets.last_mut() {
            Some(bucket) if fits => {
                bucket.entries.end = i + 1;
                bucket.numel += entry.numel;
            }
            _ => buckets.push(Bucket {
                entries: i..i + 1,
                wire: entry.wire,
                numel: entry.numel,
            }),
        }
    }
    buckets
}

/// Which entries hold data on some rank: known at once for a broadcast, after
/// a small all-reduce for gradients.
enum Flags {
    Pending(Work<Vec<u8>>),
    Ready(Vec<bool>),
}

impl Flags {
    fn get(&mut self) -> Result<&[bool], TorchError> {
        if let Flags::Pending(_) = self {
            let Flags::Pending(work) = std::mem::replace(self, Flags::Ready(Vec::new())) else {
                unreachable!("checked just above")
            };
            *self = Flags::Ready(work.wait()?.into_iter().map(|f| f != 0).collect());
        }
        match self {
            Flags::Ready(flags) => Ok(flags),
            Flags::Pending(_) => unreachable!("resolved just above"),
        }
    }
}

/// Copies bucket after bucket out, starts its collective, and lands the
/// oldest once [`MAX_BUCKETS_IN_FLIGHT`] are on the wire.
fn run_buckets(
    group: &ProcessGroup,
    op: Op,
    entries: &[Entry],
    cap_bytes: usize,
    mut flags: Flags,
) -> Result<(), TorchError> {
    let mut in_flight: VecDeque<Box<dyn Landing>> = VecDeque::new();
    for bucket in plan_buckets(entries, cap_bytes) {
        let pending = match bucket.wire {
            Wire::F32 => start::<f32>(group, op, entries, bucket)?,
            Wire::F64 => start::<f64>(group, op, entries, bucket)?,
            Wire::F16 => start::<half::f16>(group, op, entries, bucket)?,
            Wire::Bf16 => start::<half::bf16>(group, op, entries, bucket)?,
            Wire::I32 => start::<i32>(group, op, entries, bucket)?,
            Wire::I64 => start::<i64>(group, op, entries, bucket)?,
            Wire::U8 => start::<u8>(group, op, entries, bucket)?,
        };
        in_flight.push_back(pending);
        if in_flight.len() > MAX_BUCKETS_IN_FLIGHT {
            if let Some(oldest) = in_flight.pop_front() {
                oldest.land(entries, flags.get()?)?;
            }
        }
    }
    while let Some(oldest) = in_flight.pop_front() {
        oldest.land(entries, flags.get()?)?;
    }
    Ok(())
}

/// A bucket whose collective is in flight.
trait Landing {
    /// Waits for the collective and copies the result into the variables (or
    /// their gradients) of the entries whose flag is set.
    fn land(self: Box<Self>, entries: &[Entry], flags: &[bool]) -> Result<(), TorchError>;
}

struct Pending<T> {
    work: Work<Vec<T>>,
    bucket: Bucket,
    op: Op,
    copy_back: bool,
}

fn start<T: Element + tch::kind::Element>(
    group: &ProcessGroup,
    op: Op,
    entries: &[Entry],
    bucket: Bucket,
) -> Result<Box<dyn Landing>, TorchError> {
    let mut host = vec![<T as tch::kind::Element>::ZERO; bucket.numel];
    let (copy_out, copy_back) = match op {
        Op::AverageGradients => (true, true),
        Op::Broadcast { root } => (group.rank() == root, group.rank() != root),
    };
    if copy_out {
        let _no_grad = tch::no_grad_guard();
        let mut offset = 0;
        for entry in &entries[bucket.entries.clone()] {
            let source = match op {
                Op::Broadcast { .. } => Some(entry.tensor.shallow_clone()),
                Op::AverageGradients => Some(entry.tensor.grad()).filter(Tensor::defined),
            };
            // A missing gradient stays zero in the bucket.
            if let Some(source) = source {
                let mut view = host_view(&mut host, offset, entry)?;
                view.f_copy_(&source)?;
            }
            offset += entry.numel;
        }
    }
    let work = match op {
        Op::AverageGradients => group.all_reduce_async(host, ReduceOp::Mean),
        Op::Broadcast { root } => group.broadcast_async(host, root),
    };
    Ok(Box::new(Pending {
        work,
        bucket,
        op,
        copy_back,
    }))
}

impl<T: Element + tch::kind::Element> Landing for Pending<T> {
    fn land(self: Box<Self>, entries: &[Entry], flags: &[bool]) -> Result<(), TorchError> {
        let mut host = self.work.wait()?;
        if !self.copy_back {
            return Ok(());
        }
        let mut offset = 0;
        for index in self.bucket.entries.clone() {
            let entry = &entries[index];
            let at = offset;
            offset += entry.numel;
            if !flags[index] {
                continue;
            }
            let mut target = match self.op {
                Op::Broadcast { .. } => entry.tensor.shallow_clone(),
                Op::AverageGradients => gradient_of(&entry.tensor)?,
            };
            let _no_grad = tch::no_grad_guard();
            let view = host_view(&mut host, at, entry)?;
            target.f_copy_(&view)?;
        }
        Ok(())
    }
}

/// Buckets as one contiguous tensor each, reduced in place where the
/// tensor lives: on the GPU with the `cuda` feature. The CPU twin
/// (`HostFlat`, in the tests) runs the same bucket logic on CPU tensors.
#[cfg(any(feature = "cuda", test))]
mod flat {
    use super::*;

    /// Reduces or broadcasts one contiguous tensor in place.
    pub(super) trait FlatReducer {
        /// Every rank's `flat` becomes the mean over the ranks.
        fn all_reduce_mean(
            &mut self,
            group: &ProcessGroup,
            flat: &Tensor,
            wire: Wire,
            numel: usize,
        ) -> Result<(), TorchError>;
        /// Every rank's `flat` becomes `root`'s.
        fn broadcast(
            &mut self,
            group: &ProcessGroup,
            flat: &Tensor,
            wire: Wire,
            numel: usize,
            root: usize,
        ) -> Result<(), TorchError>;
    }

    #[cfg(feature = "cuda")]
    impl FlatReducer for crate::collective::cuda::CudaCollectives {
        fn all_reduce_mean(
            &mut self,
            group: &ProcessGroup,
            flat: &Tensor,
            wire: Wire,
            numel: usize,
        ) -> Result<(), TorchError> {
            // SAFETY: `flat` is a contiguous tensor of `numel` elements of
            // the wire type on this GPU, alive until the call returns.
            unsafe {
                self.all_reduce_raw(
                    group,
                    flat.data_ptr() as u64,
                    numel,
                    wire.data_type(),
                    ReduceOp::Mean,
                )
            }?;
            Ok(())
        }

        fn broadcast(
            &mut self,
            group: &ProcessGroup,
            flat: &Tensor,
            wire: Wire,
            numel: usize,
            root: usize,
        ) -> Result<(), TorchError> {
            // SAFETY: as for `all_reduce_mean`.
            unsafe {
                self.broadcast_raw(group, flat.data_ptr() as u64, numel, wire.data_type(), root)
            }?;
            Ok(())
        }
    }

    /// Reduces (or broadcasts) bucket after bucket, each as one tensor on
    /// the variables' device. Every call finishes before the next bucket
    /// starts: the device path is fast enough that overlapping buckets on
    /// the host would only add copies.
    pub(super) fn run_buckets(
        reducer: &mut dyn FlatReducer,
        group: &ProcessGroup,
        op: Op,
        entries: &[Entry],
        cap_bytes: usize,
        mut flags: Flags,
    ) -> Result<(), TorchError> {
        let _no_grad = tch::no_grad_guard();
        for bucket in plan_buckets(entries, cap_bytes) {
            if bucket.numel == 0 {
                continue;
            }
            let members = &entries[bucket.entries.clone()];
            let (copy_out, copy_back) = match op {
                Op::AverageGradients => (true, true),
                Op::Broadcast { root } => (group.rank() == root, group.rank() != root),
            };
            let device = members[0].tensor.device();
            let kind = members[0].kind;
            let flat = if copy_out {
                let mut parts = Vec::with_capacity(members.len());
                for entry in members {
                    let source = match op {
                        Op::Broadcast { .. } => Some(entry.tensor.shallow_clone()),
                        Op::AverageGradients => Some(entry.tensor.grad()).filter(Tensor::defined),
                    };
                    // A missing gradient counts as zero.
                    parts.push(match source {
                        Some(t) => t.f_reshape([-1])?,
                        None => Tensor::f_zeros([entry.numel as i64], (entry.kind, device))?,
                    });
                }
                Tensor::f_cat(&parts, 0)?
            } else {
                Tensor::f_empty([bucket.numel as i64], (kind, device))?
            };
            match op {
                Op::AverageGradients => {
                    reducer.all_reduce_mean(group, &flat, bucket.wire, bucket.numel)?
                }
                Op::Broadcast { root } => {
                    reducer.broadcast(group, &flat, bucket.wire, bucket.numel, root)?
                }
            }
            if !copy_back {
                continue;
            }
            let flags = flags.get()?;
            let mut offset = 0;
            for (index, entry) in bucket.entries.clone().zip(members) {
                let at = offset;
                offset += entry.numel;
                if !flags[index] {
                    continue;
                }
                let mut target = match op {
                    Op::Broadcast { .. } => entry.tensor.shallow_clone(),
                    Op::AverageGradients => gradient_of(&entry.tensor)?,
                };
                let part = flat
                    .f_narrow(0, at as i64, entry.numel as i64)?
                    .f_view(entry.shape.as_slice())?;
                target.f_copy_(&part)?;
            }
        }
        Ok(())
    }
}

/// The variable's gradient, created as zeros if this rank has none (another
/// rank had one).
fn gradient_of(variable: &Tensor) -> Result<Tensor, TorchError> {
    let grad = variable.grad();
    if grad.defined() {
        return Ok(grad);
    }
    // libtorch's way to create a leaf's gradient from Rust: back-propagate a
    // zero through it.
    tch::with_grad(|| variable.f_mul_scalar(0.0)?.f_sum(None)?.f_backward())?;
    Ok(variable.grad())
}

/// A CPU tensor with `entry`'s shape over `host[offset..offset + numel]`.
fn host_view<T: tch::kind::Element>(
    host: &mut [T],
    offset: usize,
    entry: &Entry,
) -> Result<Tensor, TorchError> {
    let slice = &mut host[offset..offset + entry.numel];
    let mut strides = vec![1i64; entry.shape.len()];
    for d in (0..entry.shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * entry.shape[d + 1].max(1);
    }
    // SAFETY: the slice holds exactly `numel` elements of `T`, whose size is
    // the kind's element size (checked by `Wire::of`); every caller drops the
    // view right after one copy, while `host` is still borrowed.
    let view = unsafe {
        Tensor::f_from_blob(
            slice.as_mut_ptr() as *const u8,
            &entry.shape,
            &strides,
            entry.kind,
            Device::Cpu,
        )
    }?;
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU twin of the device path: the same flat buckets, reduced by
    /// the host group on the tensor's memory.
    struct HostFlat;

    /// The elements of a contiguous CPU tensor.
    ///
    /// # Safety
    /// `flat` holds `numel` elements of `T`, alive and otherwise untouched
    /// while the slice is used.
    unsafe fn typed<'a, T>(flat: &Tensor, numel: usize) -> &'a mut [T] {
        std::slice::from_raw_parts_mut(flat.data_ptr() as *mut T, numel)
    }

    impl flat::FlatReducer for HostFlat {
        fn all_reduce_mean(
            &mut self,
            group: &ProcessGroup,
            flat: &Tensor,
            wire: Wire,
            numel: usize,
        ) -> Result<(), TorchError> {
            // SAFETY: run_buckets hands over a contiguous CPU tensor of
            // `numel` elements of the wire type.
            match wire {
                Wire::F32 => {
                    group.all_reduce(unsafe { typed::<f32>(flat, numel) }, ReduceOp::Mean)?
                }
                Wire::F64 => {
                    group.all_reduce(unsafe { typed::<f64>(flat, numel) }, ReduceOp::Mean)?
                }
                other => panic!("the twin carries f32 and f64, not {other:?}"),
            }
            Ok(())
        }

        fn broadcast(
            &mut self,
            group: &ProcessGroup,
            flat: &Tensor,
            wire: Wire,
            numel: usize,
            root: usize,
        ) -> Result<(), TorchError> {
            // SAFETY: as for `all_reduce_mean`.
            match wire {
                Wire::F32 => group.broadcast(unsafe { typed::<f32>(flat, numel) }, root)?,
                Wire::F64 => group.broadcast(unsafe { typed::<f64>(flat, numel) }, root)?,
                other => panic!("the twin carries f32 and f64, not {other:?}"),
            }
            Ok(())
        }
    }

    /// One rank of the flat-bucket check: gradients (rank + 1) * [1, 2, 3]
    /// for `a`, [1, 1] for `c` on rank 0 only, `d` (f64) 10 * rank; then a
    /// broadcast of every variable from rank 1.
    fn flat_rank(
        rank: usize,
        rdv: crate::collective::TcpRendezvous,
    ) -> Result<Vec<Vec<f64>>, TorchError> {
        use crate::collective::GroupOptions;
        let group = Arc::new(ProcessGroup::join_with(
            GroupOptions::new(rank, 2, rdv.master()),
            &rdv,
        )?);
        let vs = VarStore::new(Device::Cpu);
        let root = vs.root();
        let a = root.var("a", &[3], tch::nn::Init::Const(rank as f64 + 1.0));
        let c = root.var("c", &[2], tch::nn::Init::Const(0.0));
        let mut d = root.var("d", &[2], tch::nn::Init::Const(rank as f64));
        // An f64 variable, so that buckets of two wire types are exercised.
        tch::no_grad(|| d.set_data(&d.to_kind(Kind::Double)));
        assert_eq!(d.kind(), Kind::Double);
        let weights = Tensor::from_slice(&[1.0f32, 2.0, 3.0]) * (rank as f64 + 1.0);
        let mut loss = (&a * weights).sum(Kind::Float) + (&d * 10.0).sum(Kind::Double);
        if rank == 0 {
            loss += c.sum(Kind::Float);
        }
        loss.backward();
        let model = DistributedModel {
            variables: vs.variables_.clone(),
            group: group.clone(),
            device: Device::Cpu,
            options: DdpOptions::default(),
            #[cfg(feature = "cuda")]
            cuda: None,
        };
        let entries = model.entries(Purpose::Gradients)?;
        let has_grad: Vec<u8> = entries
            .iter()
            .map(|e| u8::from(e.tensor.grad().defined()))
            .collect();
        let flags = Flags::Pending(group.all_reduce_async(has_grad, ReduceOp::Max));
        // A 12-byte cap: several buckets, and `d` (f64) in one of its own.
        flat::run_buckets(
            &mut HostFlat,
            &group,
            Op::AverageGradients,
            &entries,
            12,
            flags,
        )?;
        let grads = [&a, &c, &d].map(|v| tensor_to_vec::<f64>(&v.grad().to_kind(Kind::Double)));
        let entries = model.entries(Purpose::Broadcast)?;
        let count = entries.len();
        flat::run_buckets(
            &mut HostFlat,
            &group,
            Op::Broadcast { root: 1 },
            &entries,
            12,
            Flags::Ready(vec![true; count]),
        )?;
        let mut out = Vec::new();
        for g in grads {
            out.push(g?);
        }
        out.push(tensor_to_vec::<f64>(&a.to_kind(Kind::Double))?);
        out.push(tensor_to_vec::<f64>(&d)?);
        Ok(out)
    }

    #[test]
    fn flat_buckets_average_gradients_and_broadcast_like_the_host_path() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let rdv =
            crate::collective::TcpRendezvous::on_listener(listener).expect("a bound listener");
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let rdv = rdv.clone();
                std::thread::spawn(move || flat_rank(rank, rdv))
            })
            .collect();
        for rank in ranks {
            let got = rank
                .join()
                .expect("no panic")
                .expect("the rank's calls work");
            assert_eq!(
                got[0],
                [1.5, 3.0, 4.5],
                "a's gradient: the mean of 1x and 2x"
            );
            assert_eq!(
                got[1],
                [0.5, 0.5],
                "c's gradient: rank 0's [1, 1] and a zero"
            );
            assert_eq!(got[2], [10.0, 10.0], "d's gradient (f64)");
            assert_eq!(got[3], [2.0, 2.0, 2.0], "a after the broadcast from rank 1");
            assert_eq!(got[4], [1.0, 1.0], "d after the broadcast from rank 1");
        }
    }

    fn entry(name: &str, kind: Kind, numel: i64) -> Entry {
        Entry {
            name: name.to_string(),
            tensor: Tensor::zeros([numel], (kind, Device::Cpu)),
            shape: vec![numel],
            kind,
            wire: Wire::of(kind, Purpose::Broadcast).expect("a supported kind"),
            numel: numel as usize,
        }
    }

    #[test]
    fn buckets_hold_one_wire_type_and_at_most_the_cap_unless_one_variable_is_larger() {
        let entries = [
            entry("a", Kind::Float, 100),
            entry("b", Kind::Float, 100),
            entry("c", Kind::Float, 300),
            entry("d", Kind::Float, 10),
            entry("e", Kind::Double, 10),
        ];
        let buckets = plan_buckets(&entries, 800);
        let ranges: Vec<Range<usize>> = buckets.iter().map(|b| b.entries.clone()).collect();
        assert_eq!(ranges, [0..2, 2..3, 3..4, 4..5]);
        assert_eq!(
            buckets[1].numel, 300,
            "a variable over the cap is a bucket of its own"
        );
        assert_eq!(plan_buckets(&entries, 0).len(), entries.len());
        assert_eq!(
            plan_buckets(&entries, usize::MAX).len(),
            2,
            "one per wire type"
        );
    }

    #[test]
    fn host_views_copy_non_contiguous_tensors_in_row_major_order() {
        let source = Tensor::arange(6, (Kind::Float, Device::Cpu))
            .reshape([2, 3])
            .transpose(0, 1); // 3x2, not contiguous
        let mut e = entry("t", Kind::Float, 6);
        e.shape = vec![3, 2];
        let mut host = vec![0f32; 8];
        host_view(&mut host, 1, &e).expect("a view").copy_(&source);
        assert_eq!(host, [0.0, 0.0, 3.0, 1.0, 4.0, 2.0, 5.0, 0.0]);
    }

    #[test]
    fn integer_variables_are_broadcast_but_never_averaged() {
        assert_eq!(Wire::of(Kind::Int64, Purpose::Broadcast), Some(Wire::I64));
        assert_eq!(Wire::of(Kind::Int64, Purpose::Gradients), None);
        assert_eq!(Wire::of(Kind::ComplexFloat, Purpose::Broadcast), None);
    }
}
