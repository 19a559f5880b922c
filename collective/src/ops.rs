//! The collectives on a connected mesh: validate, build the plan, run it,
//! finish (order the small-message combine, divide a mean).

use super::config::CollectiveConfig;
use super::element::{as_bytes, combine_into, finish_mean, Element, ReduceOp};
use super::engine;
use super::error::{CollectiveError, OpKind, OpSignature, Result};
use super::plan::{self, segment_range, Plan, RecvAction, RingPhases};
use super::transport::Mesh;
use std::ops::Range;
use std::time::{Duration, Instant};

/// What every collective needs to know about its group and call.
pub(crate) struct Call<'a> {
    pub(crate) mesh: &'a mut dyn Mesh,
    pub(crate) config: &'a CollectiveConfig,
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    /// The order in which rings visit the ranks (ranks of a host together).
    pub(crate) ring_order: &'a [usize],
    pub(crate) seq: u32,
    pub(crate) deadline: Instant,
    /// The timeout `deadline` came from, for error messages.
    pub(crate) timeout: Duration,
}

impl Call<'_> {
    fn signature<T: Element>(
        &self,
        kind: OpKind,
        op: Option<ReduceOp>,
        root: usize,
        len: usize,
    ) -> OpSignature {
        OpSignature {
            seq: self.seq,
            kind,
            data_type: T::DATA_TYPE,
            reduce_op: op,
            root: root as u32,
            len: len as u64,
        }
    }

    fn run<T: Element>(&mut self, plan: &mut Plan, op: ReduceOp) -> Result<()> {
        // SAFETY: every plan below points into buffers that the calling
        // function borrows mutably (or owns) for the whole run, and the plan
        // builders never let a receive overwrite bytes still being sent.
        unsafe {
            engine::run::<T>(
                self.mesh,
                plan,
                op,
                self.config.chunk_bytes,
                self.deadline,
                self.timeout,
            )
        }
    }
}

pub(crate) fn all_reduce<T: Element>(
    call: &mut Call<'_>,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<()> {
    let (rank, n) = (call.rank, call.world_size);
    let sig = call.signature::<T>(OpKind::AllReduce, Some(op), 0, buf.len());
    let mut plan = Plan::new(n, sig);
    let bytes = std::mem::size_of_val(buf);
    if bytes <= call.config.small_message_bytes {
        // Direct: gather every input, combine in rank order.
        let mut slots: Vec<T> = Vec::with_capacity(buf.len() * n);
        let mine = buf.as_ptr() as *const u8;
        // SAFETY: `buf` holds `bytes` bytes, `slots` room for n times that.
        unsafe {
            plan::direct_exchange(
                &mut plan,
                rank,
                n,
                mine,
                slots.as_mut_ptr() as *mut u8,
                bytes,
            )
        };
        call.run::<T>(&mut plan, op)?;
        // SAFETY: the exchange filled every peer's slot.
        unsafe { combine_in_rank_order(buf, slots.as_mut_ptr(), rank, n, op) };
    } else {
        let segments: Vec<Range<usize>> = (0..n).map(|k| segment_range(buf.len(), n, k)).collect();
        run_ring(call, &mut plan, buf, &segments, RingPhases::Both, op)?;
    }
    finish_mean(buf, op, n);
    Ok(())
}

/// Replaces `own` (rank `rank`'s values) by the combination of all n ranks'
/// values in rank order, the peers' read from `slots` (slot k at
/// `k * own.len()`). Every rank combines in the same order, so all end with
/// the same bits; this rank's values are read in place, not copied into a
/// slot first.
///
/// # Safety
///
/// `slots` must have room for n slots, and every slot but `rank`'s must hold
/// `own.len()` initialised values; slot 0 may be overwritten.
unsafe fn combine_in_rank_order<T: Element>(
    own: &mut [T],
    slots: *mut T,
    rank: usize,
    n: usize,
    op: ReduceOp,
) {
    let len = own.len();
    let slot = |k: usize| std::slice::from_raw_parts(slots.add(k * len), len);
    if rank == 0 {
        for k in 1..n {
            combine_into(own, slot(k), op);
        }
        return;
    }
    // Rank 0's values come first: accumulate in its slot, then copy back.
    let acc = std::slice::from_raw_parts_mut(slots, len);
    for k in 1..n {
        if k == rank {
            combine_into(acc, own, op);
        } else {
            combine_into(acc, slot(k), op);
        }
    }
    own.copy_from_slice(acc);
}

/// Runs `plan` as a ring over `buf` cut into `segments` (which must
/// partition it), for the given phases.
fn run_ring<T: Element>(
    call: &mut Call<'_>,
    plan: &mut Plan,
    buf: &mut [T],
    segments: &[Range<usize>],
    phases: RingPhases,
    op: ReduceOp,
) -> Result<()> {
    assert_eq!(segments.iter().map(|r| r.len()).sum::<usize>(), buf.len());
    // SAFETY: the segments partition `buf` (their lengths add up to it and
    // callers build them with segment_range or as consecutive blocks).
    unsafe {
        plan::ring(
            plan,
            call.rank,
            call.ring_order,
            buf.as_mut_ptr() as *mut u8,
            std::mem::size_of::<T>(),
            segments,
            phases,
            call.config.ring_block_bytes,
        )
    };
    call.run::<T>(plan, op)
}

pub(crate) fn reduce_scatter<T: Element>(
    call: &mut Call<'_>,
    buf: &mut [T],
    op: ReduceOp,
) -> Result<Range<usize>> {
    let (rank, n) = (call.rank, call.world_size);
    let sig = call.signature::<T>(OpKind::ReduceScatter, Some(op), 0, buf.len());
    let mut plan = Plan::new(n, sig);
    let segments: Vec<Range<usize>> = (0..n).map(|k| segment_range(buf.len(), n, k)).collect();
    let mine = segments[rank].clone();
    let elem = std::mem::size_of::<T>();
    if std::mem::size_of_val(buf) <= call.config.small_message_bytes {
        // Direct: segment k goes straight to rank k; this rank combines the
        // n copies of its own segment in rank order.
        let m = mine.len();
        let mut slots: Vec<T> = Vec::with_capacity(n * m);
        let base = buf.as_ptr() as *const u8;
        let slots_ptr = slots.as_mut_ptr() as *mut u8;
        for peer in (0..n).filter(|p| *p != rank) {
            let theirs = &segments[peer];
            plan.header_to(peer);
            // SAFETY: `theirs` lies in `buf`; slot `peer` holds `m` values.
            unsafe {
                plan.send(
                    peer,
                    base.add(theirs.start * elem),
                    theirs.len() * elem,
                    None,
                );
                plan.header_from(peer);
                plan.recv(
                    peer,
                    slots_ptr.add(peer * m * elem),
                    m * elem,
                    RecvAction::Copy,
                );
            }
        }
        call.run::<T>(&mut plan, op)?;
        // SAFETY: the exchange filled every peer's slot.
        unsafe { combine_in_rank_order(&mut buf[mine.clone()], slots.as_mut_ptr(), rank, n, op) };
    } else {
        run_ring(
            call,
            &mut plan,
            buf,
            &segments,
            RingPhases::ReduceScatter,
            op,
        )?;
    }
    finish_mean(&mut buf[mine.clone()], op, n);
    Ok(mine)
}

pub(crate) fn all_gather<T: Element>(
    call: &mut Call<'_>,
    input: &[T],
    output: &mut [T],
) -> Result<()> {
    let (rank, n) = (call.rank, call.world_size);
    let len = input.len();
    if output.len() != len * n {
        return Err(CollectiveError::BufferLength {
            op: OpKind::AllGather,
            expected: len * n,
            actual: output.len(),
        });
    }
    output[rank * len..(rank + 1) * len].copy_from_slice(input);
    let sig = call.signature::<T>(OpKind::AllGather, None, 0, len);
    let mut plan = Plan::new(n, sig);
    if std::mem::size_of_val(output) <= call.config.small_message_bytes {
        // Direct: this rank's block to every peer, every peer's block into
        // its place, in one round.
        let base = output.as_mut_ptr() as *mut u8;
        let block = std::mem::size_of_val(input);
        // SAFETY: `output` holds n blocks of `block` bytes.
        unsafe { plan::direct_exchange(&mut plan, rank, n, base.add(rank * block), base, block) };
        return call.run::<T>(&mut plan, ReduceOp::Sum);
    }
    let segments: Vec<Range<usize>> = (0..n).map(|k| k * len..(k + 1) * len).collect();
    run_ring(
        call,
        &mut plan,
        output,
        &segments,
        RingPhases::AllGather,
        ReduceOp::Sum,
    )
}

pub(crate) fn broadcast<T: Element>(call: &mut Call<'_>, buf: &mut [T], root: usize) -> Result<()> {
    let (rank, n) = (call.rank, call.world_size);
    let sig = call.signature::<T>(OpKind::Broadcast, None, root, buf.len());
    let mut plan = Plan::new(n, sig);
    let bytes = as_bytes(buf).len();
    let direct = bytes <= call.config.small_message_bytes;
    // SAFETY: `buf` holds `bytes` bytes.
    unsafe {
        plan::broadcast(
            &mut plan,
            rank,
            call.ring_order,
            root,
            buf.as_mut_ptr() as *mut u8,
            bytes,
            direct,
        )
    };
    call.run::<T>(&mut plan, ReduceOp::Sum)
}

pub(crate) fn all_to_all<T: Element>(
    call: &mut Call<'_>,
    input: &[T],
    output: &mut [T],
) -> Result<()> {
    let (rank, n) = (call.rank, call.world_size);
    let block = input.len() / n;
    output[rank * block..(rank + 1) * block]
        .copy_from_slice(&input[rank * block..(rank + 1) * block]);
    let sig = call.signature::<T>(OpKind::AllToAll, None, 0, input.len());
    let mut plan = Plan::new(n, sig);
    let bytes = block * std::mem::size_of::<T>();
    // SAFETY: both buffers hold n blocks (checked by the caller).
    unsafe {
        plan::all_to_all(
            &mut plan,
            rank,
            n,
            input.as_ptr() as *const u8,
            output.as_mut_ptr() as *mut u8,
            bytes,
        )
    };
    call.run::<T>(&mut plan, ReduceOp::Sum)
}

pub(crate) fn barrier(call: &mut Call<'_>) -> Result<()> {
    let sig = call.signature::<u8>(OpKind::Barrier, None, 0, 0);
    let mut plan = Plan::new(call.world_size, sig);
    plan::barrier(&mut plan, call.rank, call.world_size);
    call.run::<u8>(&mut plan, ReduceOp::Sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_combines_in_rank_order_to_the_same_bits() {
        // Values whose f32 sum depends on the order of the additions.
        let input = |rank: usize, i: usize| -> f32 {
            [1.0e8, 1.0, -1.0e8, 0.5, 3.0e7][(rank + i) % 5] * (1.0 + i as f32 * 1e-3)
        };
        for n in 1..=5 {
            for op in [ReduceOp::Sum, ReduceOp::Product, ReduceOp::Max] {
                let len = 7;
                let expected: Vec<f32> = (0..len)
                    .map(|i| {
                        let mut acc = vec![input(0, i)];
                        for r in 1..n {
                            combine_into(&mut acc, &[input(r, i)], op);
                        }
                        acc[0]
                    })
                    .collect();
                for rank in 0..n {
                    let mut own: Vec<f32> = (0..len).map(|i| input(rank, i)).collect();
                    // The other ranks' values in their slots; this rank's
                    // slot holds garbage the combine must not read.
                    let mut slots: Vec<f32> = (0..n * len)
                        .map(|j| match j / len {
                            k if k == rank => f32::NAN,
                            k => input(k, j % len),
                        })
                        .collect();
                    // SAFETY: n slots of `len` values, every peer's filled.
                    unsafe { combine_in_rank_order(&mut own, slots.as_mut_ptr(), rank, n, op) };
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&own), bits(&expected), "n {n} rank {rank} {op:?}");
                }
            }
        }
    }
}
