//! Gradient all-reduce and parameter broadcast in buckets through host
//! memory: the variables a call works on ([`Entry`], with the [`Wire`]
//! type each travels as), the bucket plan, and the pipeline that keeps up
//! to [`MAX_BUCKETS_IN_FLIGHT`] buckets' collectives in flight.

use super::error::TorchError;
use crate::collective::{Element, ProcessGroup, ReduceOp, Work};
use std::collections::VecDeque;
use std::ops::Range;
use tch::{Device, Kind, Tensor};

/// Buckets whose collectives may be in flight at once; the host memory an
/// all-reduce uses is at most this many buckets.
pub const MAX_BUCKETS_IN_FLIGHT: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Purpose {
    Gradients,
    Broadcast,
}

impl Purpose {
    pub(super) fn describe(self) -> &'static str {
        match self {
            Purpose::Gradients => "the gradient all-reduce",
            Purpose::Broadcast => "the parameter broadcast",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    AverageGradients,
    Broadcast { root: usize },
}

/// The element type a kind travels as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Wire {
    F32,
    F64,
    F16,
    Bf16,
    I32,
    I64,
    U8,
}

impl Wire {
    pub(super) fn of(kind: Kind, purpose: Purpose) -> Option<Wire> {
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

    pub(super) fn data_type(self) -> crate::collective::DataType {
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
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) tensor: Tensor,
    pub(super) shape: Vec<i64>,
    pub(super) kind: Kind,
    pub(super) wire: Wire,
    pub(super) numel: usize,
}

/// Consecutive entries of one wire type, at most the cap in bytes unless a
/// single entry is larger.
#[derive(Clone, Debug)]
pub(super) struct Bucket {
    pub(super) entries: Range<usize>,
    pub(super) wire: Wire,
    pub(super) numel: usize,
}

pub(super) fn plan_buckets(entries: &[Entry], cap_bytes: usize) -> Vec<Bucket> {
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
pub(super) enum Flags {
    Pending(Work<Vec<u8>>),
    Ready(Vec<bool>),
}

impl Flags {
    pub(super) fn get(&mut self) -> Result<&[bool], TorchError> {
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
pub(super) fn run_buckets(
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

/// The variable's gradient, created as zeros if this rank has none (another
/// rank had one).
pub(super) fn gradient_of(variable: &Tensor) -> Result<Tensor, TorchError> {
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
