//! Buckets as one contiguous tensor each, reduced in place where the
//! tensor lives: on the GPU with the `cuda` feature. The CPU twin
//! (`HostFlat`, in the tests) runs the same bucket logic on CPU tensors.

use super::buckets::{gradient_of, plan_buckets, Entry, Flags, Op, Wire};
use super::error::TorchError;
use crate::collective::ProcessGroup;
#[cfg(feature = "cuda")]
use crate::collective::ReduceOp;
use tch::Tensor;

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
