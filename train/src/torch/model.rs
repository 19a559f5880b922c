//! The model wrapper: [`DdpOptions`], [`DistributedModel`] and the
//! [`prepare_model`] family, which move a [`VarStore`] to its device, copy
//! rank 0's variables to every rank, and average gradients over the group.

use super::buckets::{run_buckets, Entry, Flags, Op, Purpose, Wire};
use super::error::TorchError;
#[cfg(any(feature = "cuda", test))]
use super::flat;
use crate::collective::{ProcessGroup, ReduceOp};
use std::fmt;
use std::sync::{Arc, Mutex};
use tch::nn::{VarStore, Variables};
use tch::{Device, Tensor};

/// The default bucket size: 25 MiB, torch `DistributedDataParallel`'s
/// `bucket_cap_mb`. Large enough that per-call overheads vanish behind the
/// bandwidth, small enough that several buckets overlap on a real model.
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * 1024 * 1024;

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
/// returns the handle that averages gradients (see the [module docs](super)).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::tensors::tensor_to_vec;
    use tch::Kind;

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
}
