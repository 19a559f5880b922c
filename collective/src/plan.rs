//! The algorithms, written as [`Plan`]s: which bytes go to and come from
//! which peer, in what order, and which send waits on which receive.
//!
//! # Framing
//!
//! Each collective opens every stream it uses with a 24-byte header: magic,
//! call number, collective, element type, reduction, root and length. Both
//! ends compare it with their own call before any payload is touched, so
//! ranks that disagree get [`CallMismatch`](super::CollectiveError::CallMismatch)
//! instead of mixing up data. The payload follows raw: both ends know its
//! length.
//!
//! # Algorithms
//!
//! - **Ring** (all-reduce, reduce-scatter and all-gather above
//!   `small_message_bytes`): the buffer is cut into n balanced segments. In the
//!   reduce-scatter phase, step `s` sends segment `r-s-1` to the right and
//!   combines segment `r-s-2` from the left into place; after n-1 steps rank
//!   `r` holds the full reduction of segment `r`. The all-gather phase
//!   circulates the finished segments the same way. Each rank sends and
//!   receives 2(n-1)/n of the buffer, the minimum. Segments are cut into
//!   blocks and the steps interleaved block by block (see [`ring`]); every
//!   send of step `s` waits only on the matching block of step `s-1`, so a
//!   reduced block is forwarded while it is still in cache.
//! - **Direct** (all-reduce, reduce-scatter, all-gather and broadcast up to
//!   `small_message_bytes`): one round; every rank sends each peer the part
//!   of its buffer that peer needs, and each combines the n inputs in rank
//!   order. Latency of one hop instead of 2(n-1) or n-1.
//! - **Chain** (broadcast above the threshold): from the root along the
//!   ring order, each rank forwarding bytes as they land.
//!
//! Rings visit ranks in an order that keeps each host's ranks together
//! (computed by the group from the rendezvous table), so `r-s-1` above means
//! "the segment of the rank s+1 places before this one".
//! - **Barrier**: headers only, to and from every peer.
//!
//! Every rank combines in the same order, so all ranks end with bit-identical
//! results.

use super::element::{DataType, ReduceOp};
use super::error::{OpKind, OpSignature};
use std::ops::Range;

pub(crate) const HEADER_BYTES: usize = 24;
const HEADER_MAGIC: u32 = 0x4c43_5250; // "PRCL"

/// Copy receives of this many bytes up go around the cache
/// ([`RecvAction::Stream`]): larger than the caches of most machines, so
/// those lines would be evicted unread anyway. Below it, the caller likely
/// reads its result from cache. The exception is a ring step's blocks,
/// which the next step forwards a block or two later, from cache. (A
/// broadcast chain forwards too, chunk by chunk; plain copies there were
/// no faster, 0.86-1.45 of streaming at 4-256 MiB, worlds 2-4.)
const STREAM_FROM: usize = 8 << 20;

/// Ring blocks smaller than this are made this size: a call's block list
/// grows with its buffer divided by the block.
pub(crate) const MIN_RING_BLOCK_BYTES: usize = 64;

/// How many waves a ring step trails the one before it (see [`ring`]): one,
/// so a block is forwarded right after the next block of the step before it
/// has gone out.
const RING_LAG: usize = 1;

/// How a copy receive of `len` bytes lands: large ones around the cache.
fn copy_action(len: usize) -> RecvAction {
    if len >= STREAM_FROM {
        RecvAction::Stream
    } else {
        RecvAction::Copy
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecvAction {
    /// Copy the bytes into place.
    Copy,
    /// Copy the bytes into place around the cache (see
    /// [`super::transport::Link::try_read_into_streaming`]): for large
    /// receives (see [`STREAM_FROM`]).
    Stream,
    /// Combine the bytes into the values in place.
    Reduce,
    /// A header, checked against this rank's call once complete.
    Header,
}

pub(crate) struct SendItem {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
    pub(crate) sent: usize,
    /// Sent only as far as receive `(peer, index)` has landed.
    pub(crate) after: Option<(usize, usize)>,
}

pub(crate) struct RecvItem {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) done: usize,
    pub(crate) action: RecvAction,
}

/// One rank's part of one collective.
pub(crate) struct Plan {
    pub(crate) sends: Vec<Vec<SendItem>>,
    pub(crate) recvs: Vec<Vec<RecvItem>>,
    pub(crate) signature: OpSignature,
    /// The largest contiguous range the call moves, in bytes (a ring's
    /// segment, however it is cut into blocks).
    pub(crate) largest: usize,
    /// Backing for the header items; boxed so the pointers stay put.
    header_out: Box<[u8; HEADER_BYTES]>,
    headers_in: Box<[[u8; HEADER_BYTES]]>,
}

pub(crate) fn encode_header(sig: &OpSignature) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&sig.seq.to_le_bytes());
    h[8] = sig.kind.code();
    h[9] = sig.data_type.code();
    h[10] = sig.reduce_op.map_or(u8::MAX, ReduceOp::code);
    h[12..16].copy_from_slice(&sig.root.to_le_bytes());
    h[16..24].copy_from_slice(&sig.len.to_le_bytes());
    h
}

pub(crate) fn decode_header(h: &[u8]) -> Option<OpSignature> {
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if h.len() != HEADER_BYTES || u32_at(0) != HEADER_MAGIC {
        return None;
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&h[16..24]);
    Some(OpSignature {
        seq: u32_at(4),
        kind: OpKind::from_code(h[8])?,
        data_type: DataType::from_code(h[9])?,
        reduce_op: match h[10] {
            u8::MAX => None,
            code => Some(ReduceOp::from_code(code)?),
        },
        root: u32_at(12),
        len: u64::from_le_bytes(len),
    })
}

/// Balanced partition of `len` elements into `n` segments: the first
/// `len % n` segments hold one element more. Segment `k` is what rank `k`
/// owns after a reduce-scatter.
pub fn segment_range(len: usize, n: usize, k: usize) -> Range<usize> {
    let base = len / n;
    let extra = len % n;
    let start = k * base + k.min(extra);
    let size = base + usize::from(k < extra);
    start..start + size
}

impl Plan {
    pub(crate) fn new(world_size: usize, signature: OpSignature) -> Plan {
        Plan {
            sends: (0..world_size).map(|_| Vec::new()).collect(),
            recvs: (0..world_size).map(|_| Vec::new()).collect(),
            header_out: Box::new(encode_header(&signature)),
            headers_in: vec![[0u8; HEADER_BYTES]; world_size].into_boxed_slice(),
            signature,
            largest: 0,
        }
    }

    /// Records that the call moves a contiguous range of `len` bytes.
    pub(crate) fn note_extent(&mut self, len: usize) {
        self.largest = self.largest.max(len);
    }

    pub(crate) fn send(
        &mut self,
        peer: usize,
        ptr: *const u8,
        len: usize,
        after: Option<(usize, usize)>,
    ) {
        self.note_extent(len);
        self.sends[peer].push(SendItem {
            ptr,
            len,
            sent: 0,
            after,
        });
    }

    /// Adds a receive and returns its index, for sends to wait on.
    pub(crate) fn recv(
        &mut self,
        peer: usize,
        ptr: *mut u8,
        len: usize,
        action: RecvAction,
    ) -> usize {
        self.note_extent(len);
        self.recvs[peer].push(RecvItem {
            ptr,
            len,
            done: 0,
            action,
        });
        self.recvs[peer].len() - 1
    }

    pub(crate) fn header_to(&mut self, peer: usize) {
        let ptr = self.header_out.as_ptr();
        self.send(peer, ptr, HEADER_BYTES, None);
    }

    pub(crate) fn header_from(&mut self, peer: usize) {
        let ptr = self.headers_in[peer].as_mut_ptr();
        self.recv(peer, ptr, HEADER_BYTES, RecvAction::Header);
    }
}

/// Which phases of the ring to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RingPhases {
    ReduceScatter,
    AllGather,
    Both,
}

/// Adds the ring over `segments` of the buffer at `base` (element size
/// `elem`) to `plan`. Segment `k` ends up reduced at rank `k`. The ring
/// visits ranks in `order` (a permutation of the ranks, so that ranks on one
/// host are neighbours).
///
/// Each segment is cut into blocks of about `block_bytes`, at least
/// [`MIN_RING_BLOCK_BYTES`] (0: one block per segment), and the steps are
/// interleaved block by block: block `j` of step `i` goes out in wave
/// `i * RING_LAG + j`, every stream in wave order. So a block reduced from
/// the left is forwarded to the right a few blocks later, while it is still
/// in cache, rather than after the whole segment. Every rank numbers the
/// waves the same way, so each receive list is in its left neighbour's send
/// order.
///
/// # Safety
///
/// `base` must point to a buffer covering every segment.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn ring(
    plan: &mut Plan,
    rank: usize,
    order: &[usize],
    base: *mut u8,
    elem: usize,
    segments: &[Range<usize>],
    phases: RingPhases,
    block_bytes: usize,
) {
    let n = order.len();
    let pos = position(order, rank);
    let right = order[(pos + 1) % n];
    let left = order[(pos + n - 1) % n];
    plan.header_to(right);
    plan.header_from(left);
    // Positions, not ranks, move around the ring; the segment a position
    // carries is the one its rank owns. Step i sends segment `send` (the
    // one received at step i-1) and receives segment `recv`.
    let seg = |k: usize| segments[order[k % n]].clone();
    let mut steps: Vec<(Range<usize>, Range<usize>, RecvAction)> = Vec::new();
    if phases != RingPhases::AllGather {
        for s in 0..n - 1 {
            let send = seg(pos + 2 * n - s - 1);
            steps.push((send, seg(pos + 2 * n - s - 2), RecvAction::Reduce));
        }
    }
    if phases != RingPhases::ReduceScatter {
        for s in 0..n - 1 {
            steps.push((
                seg(pos + 2 * n - s),
                seg(pos + 2 * n - s - 1),
                RecvAction::Copy,
            ));
        }
    }
    // The last all-gather step's copies are not forwarded: a large one goes
    // around the cache (the caller is unlikely to read it all back soon).
    if let Some(last) = steps.last_mut() {
        if last.2 == RecvAction::Copy && last.1.len() * elem >= STREAM_FROM {
            last.2 = RecvAction::Stream;
        }
    }
    plan.note_extent(segments.iter().map(|r| r.len() * elem).max().unwrap_or(0));
    // Elements per block: at least one, however large the element.
    let per_block = match block_bytes {
        0 => usize::MAX,
        b => (b.max(MIN_RING_BLOCK_BYTES) / elem).max(1),
    };
    let blocks = |r: &Range<usize>| r.len().div_ceil(per_block).max(1);
    let block = |r: &Range<usize>, j: usize| {
        let start = r.start + j * per_block;
        let end = start.saturating_add(per_block).min(r.end);
        (base.add(start * elem), (end - start) * elem)
    };
    let waves = steps
        .iter()
        .enumerate()
        .map(|(i, (send, recv, _))| i * RING_LAG + blocks(send).max(blocks(recv)))
        .max()
        .unwrap_or(0);
    // recv_index[i][j]: where block j of step i's receive sits in the list.
    let mut recv_index: Vec<Vec<usize>> = steps.iter().map(|_| Vec::new()).collect();
    for wave in 0..waves {
        for (i, (send, recv, action)) in steps.iter().enumerate() {
            let Some(j) = wave.checked_sub(i * RING_LAG) else {
                break;
            };
            if j < blocks(send) {
                let after = i.checked_sub(1).map(|p| (left, recv_index[p][j]));
                let (p, len) = block(send, j);
                plan.send(right, p, len, after);
            }
            if j < blocks(recv) {
                let (p, len) = block(recv, j);
                recv_index[i].push(plan.recv(left, p, len, *action));
            }
        }
    }
}

/// Where `rank` sits in `order`.
fn position(order: &[usize], rank: usize) -> usize {
    match order.iter().position(|r| *r == rank) {
        Some(p) => p,
        None => unreachable!("the ring order is a permutation of the ranks"),
    }
}

/// Every rank sends `mine` to every other and receives each peer's buffer
/// into `slots + peer * bytes`.
///
/// # Safety
///
/// `mine` must hold `bytes` bytes and `slots` n times that.
pub(crate) unsafe fn direct_exchange(
    plan: &mut Plan,
    rank: usize,
    n: usize,
    mine: *const u8,
    slots: *mut u8,
    bytes: usize,
) {
    for peer in (0..n).filter(|p| *p != rank) {
        plan.header_to(peer);
        plan.send(peer, mine, bytes, None);
        plan.header_from(peer);
        plan.recv(peer, slots.add(peer * bytes), bytes, copy_action(bytes));
    }
}

/// Broadcast of `bytes` at `buf` from `root`: directly to every rank when
/// `direct`, else along the ring `order` starting at the root.
///
/// # Safety
///
/// `buf` must hold `bytes` bytes.
pub(crate) unsafe fn broadcast(
    plan: &mut Plan,
    rank: usize,
    order: &[usize],
    root: usize,
    buf: *mut u8,
    bytes: usize,
    direct: bool,
) {
    let n = order.len();
    if direct {
        if rank == root {
            for peer in (0..n).filter(|p| *p != rank) {
                plan.header_to(peer);
                plan.send(peer, buf, bytes, None);
            }
        } else {
            plan.header_from(root);
            plan.recv(root, buf, bytes, copy_action(bytes));
        }
        return;
    }
    let (pos, root_pos) = (position(order, rank), position(order, root));
    let distance = (pos + n - root_pos) % n;
    let right = order[(pos + 1) % n];
    let left = order[(pos + n - 1) % n];
    let mut landed = None;
    if distance > 0 {
        plan.header_from(left);
        landed = Some(plan.recv(left, buf, bytes, copy_action(bytes)));
    }
    if distance < n - 1 {
        plan.header_to(right);
        plan.send(right, buf, bytes, landed.map(|i| (left, i)));
    }
}

/// Every rank sends block `peer` of `input` to `peer` and receives `peer`'s
/// block for this rank into block `peer` of `output`; blocks are `bytes`
/// long. The caller copies its own block.
///
/// # Safety
///
/// `input` and `output` must hold n blocks each.
pub(crate) unsafe fn all_to_all(
    plan: &mut Plan,
    rank: usize,
    n: usize,
    input: *const u8,
    output: *mut u8,
    bytes: usize,
) {
    for peer in (0..n).filter(|p| *p != rank) {
        plan.header_to(peer);
        plan.send(peer, input.add(peer * bytes), bytes, None);
        plan.header_from(peer);
        plan.recv(peer, output.add(peer * bytes), bytes, copy_action(bytes));
    }
}

/// Headers to and from every peer.
pub(crate) fn barrier(plan: &mut Plan, rank: usize, n: usize) {
    for peer in (0..n).filter(|p| *p != rank) {
        plan.header_to(peer);
        plan.header_from(peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_buffer_in_order_even_when_shorter_than_the_world() {
        for len in [0usize, 1, 3, 7, 8, 9, 100] {
            for n in 1..=8 {
                let mut next = 0;
                for k in 0..n {
                    let r = segment_range(len, n, k);
                    assert_eq!(r.start, next, "len {len} n {n} k {k}");
                    assert!(r.len() <= len / n + 1);
                    next = r.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn headers_round_trip_and_reject_garbage() {
        let sig = OpSignature {
            seq: 7,
            kind: OpKind::Broadcast,
            data_type: DataType::BF16,
            reduce_op: None,
            root: 3,
            len: 1 << 40,
        };
        assert_eq!(decode_header(&encode_header(&sig)), Some(sig));
        assert_eq!(decode_header(&[0u8; HEADER_BYTES]), None);
    }

    #[test]
    fn each_ring_send_waits_on_the_receive_of_the_same_segment() {
        let n = 4;
        let segments: Vec<_> = (0..n).map(|k| segment_range(10, n, k)).collect();
        let sig = OpSignature {
            seq: 1,
            kind: OpKind::AllReduce,
            data_type: DataType::F32,
            reduce_op: Some(ReduceOp::Sum),
            root: 0,
            len: 10,
        };
        let mut buf = vec![0f32; 10];
        let mut plan = Plan::new(n, sig);
        // Ranks 0 and 2 on one host, 1 and 3 on another: the ring visits
        // 0, 2, 1, 3, so rank 1 sends to 3 and receives from 2.
        let order = [0, 2, 1, 3];
        // SAFETY: the buffer covers every segment.
        unsafe {
            ring(
                &mut plan,
                1,
                &order,
                buf.as_mut_ptr() as *mut u8,
                4,
                &segments,
                RingPhases::Both,
                0,
            )
        };
        assert!(plan.sends[0].is_empty() && plan.sends[2].is_empty());
        assert!(plan.recvs[3].is_empty());
        for send in &plan.sends[3] {
            if let Some((peer, i)) = send.after {
                assert_eq!(peer, 2);
                let recv = &plan.recvs[peer][i];
                assert_eq!((recv.ptr as *const u8, recv.len), (send.ptr, send.len));
            }
        }
        assert_eq!(plan.sends[3].len(), 1 + 2 * (n - 1));
        // The last reduce-scatter receive is rank 1's own segment.
        let own = segments[1].clone();
        let last_reduce = &plan.recvs[2][n - 1];
        assert_eq!(
            last_reduce.ptr as usize - buf.as_ptr() as usize,
            own.start * 4
        );
    }

    /// Builds every rank's plan for one ring call, with offsets relative to
    /// each rank's own buffer.
    fn ring_plans(
        n: usize,
        len: usize,
        block_bytes: usize,
        phases: RingPhases,
        bufs: &mut [Vec<i32>],
    ) -> Vec<Plan> {
        let segments: Vec<_> = (0..n).map(|k| segment_range(len, n, k)).collect();
        let sig = OpSignature {
            seq: 1,
            kind: OpKind::AllReduce,
            data_type: DataType::I32,
            reduce_op: Some(ReduceOp::Sum),
            root: 0,
            len: len as u64,
        };
        // A ring order that is not the identity (k * 3 + 1 is a permutation
        // when 3 does not divide n).
        let order: Vec<usize> = match n % 3 {
            0 => (0..n).rev().collect(),
            _ => (0..n).map(|k| (k * 3 + 1) % n).collect(),
        };
        (0..n)
            .map(|rank| {
                let mut plan = Plan::new(n, sig);
                // SAFETY: each buffer covers every segment.
                unsafe {
                    ring(
                        &mut plan,
                        rank,
                        &order,
                        bufs[rank].as_mut_ptr() as *mut u8,
                        4,
                        &segments,
                        phases,
                        block_bytes,
                    )
                };
                plan
            })
            .collect()
    }

    #[test]
    fn blocked_rings_send_in_the_order_their_neighbours_receive_and_wait_on_the_same_bytes() {
        for n in [2usize, 3, 4, 5] {
            for len in [0usize, 1, n - 1, 1000, 1001, 4099] {
                for block_bytes in [0usize, 1, 4, 7, 64, 100, 1 << 20] {
                    for phases in [
                        RingPhases::Both,
                        RingPhases::ReduceScatter,
                        RingPhases::AllGather,
                    ] {
                        let mut bufs: Vec<Vec<i32>> =
                            (0..n).map(|_| vec![0i32; len.max(1)]).collect();
                        let plans = ring_plans(n, len, block_bytes, phases, &mut bufs);
                        let what = format!("n {n} len {len} block {block_bytes} {phases:?}");
                        let offset =
                            |rank: usize, p: *const u8| p as usize - bufs[rank].as_ptr() as usize;
                        for (rank, plan) in plans.iter().enumerate() {
                            for (right, sends) in plan.sends.iter().enumerate() {
                                if sends.is_empty() {
                                    continue;
                                }
                                // The stream to the right, item by item, is
                                // what the right neighbour expects from us:
                                // same bytes of the same segments.
                                let theirs = &plans[right].recvs[rank];
                                assert_eq!(
                                    sends.len(),
                                    theirs.len(),
                                    "{what}: rank {rank} to {right}"
                                );
                                for (k, (s, r)) in sends.iter().zip(theirs).enumerate().skip(1) {
                                    assert_eq!(s.len, r.len, "{what}: item {k}");
                                    assert_eq!(
                                        offset(rank, s.ptr),
                                        offset(right, r.ptr),
                                        "{what}: item {k}"
                                    );
                                    assert!(
                                        block_bytes == 0
                                            || s.len <= block_bytes.max(MIN_RING_BLOCK_BYTES),
                                        "{what}: item {k} too long"
                                    );
                                    // A send waits on a receive of exactly its bytes,
                                    // listed before it in wave order.
                                    if let Some((left, i)) = s.after {
                                        let dep = &plan.recvs[left][i];
                                        assert_eq!(
                                            (dep.ptr as *const u8, dep.len),
                                            (s.ptr, s.len),
                                            "{what}: item {k}"
                                        );
                                    }
                                }
                            }
                            // Each step's receives tile one whole segment:
                            // every byte of a segment is received equally
                            // often, and n-1 segments per phase.
                            let mut seen = vec![0usize; len * 4];
                            for r in plan
                                .recvs
                                .iter()
                                .flatten()
                                .filter(|r| r.action != RecvAction::Header)
                            {
                                let o = offset(rank, r.ptr);
                                for b in &mut seen[o..o + r.len] {
                                    *b += 1;
                                }
                            }
                            let steps = match phases {
                                RingPhases::Both => 2,
                                _ => 1,
                            };
                            let mut received = 0;
                            for k in 0..n {
                                let bytes = segment_range(len, n, k);
                                let counts = &seen[bytes.start * 4..bytes.end * 4];
                                if let Some(c) = counts.first() {
                                    assert!(
                                        counts.iter().all(|x| x == c),
                                        "{what}: segment {k} in part"
                                    );
                                    assert!(*c <= steps, "{what}: segment {k} {c} times");
                                    received += c;
                                }
                            }
                            if len >= n {
                                assert_eq!(received, steps * (n - 1), "{what}: rank {rank}");
                            }
                        }
                    }
                }
            }
        }
    }
}
