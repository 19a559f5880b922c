//! The progress engine: moves a [`Plan`]'s bytes over a [`Mesh`] until done.
//!
//! A plan is, per peer, an ordered list of byte ranges to send and an ordered
//! list of byte ranges to receive (copy in, or combine into what is there). A
//! send may wait on a receive: it goes out only as far as that receive has
//! landed. That one rule gives the ring its pipeline: a chunk reduced from the
//! left neighbour is forwarded to the right neighbour while the next chunk is
//! still arriving.
//!
//! One thread runs the loop: each round it moves at most one chunk per link
//! and direction, sends first (so that a call's headers are out before any
//! header is checked, and a rank that fails on a mismatch has still told its
//! peers what it called), and when nothing moved it sleeps in
//! [`Mesh::wait`]. Every
//! round checks the deadline, so no call outlives its timeout by more than
//! one wait slice (at most 100 ms).

use super::element::{combine_bytes_into, Element, ReduceOp};
use super::error::{CollectiveError, OpSignature, Result};
use super::plan::{decode_header, Plan, RecvAction};
use super::transport::{Interest, Mesh};
use std::time::{Duration, Instant};

/// A call that moves a contiguous range of this many bytes or more (see
/// [`Plan::largest`]) is "bulk" for the transport ([`Mesh::set_bulk`]): its
/// buffers stream from memory rather than sit in cache.
const BULK_FROM: usize = 4 << 20;

/// What one link direction did in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Nothing left to move in this direction.
    Done,
    /// Bytes moved.
    Moved,
    /// The transport could not take or give bytes now.
    WouldBlock,
    /// A send waits on a receive from another link.
    Waiting,
}

/// Runs `plan` to completion. `T` and `op` say how `Reduce` receives
/// combine.
///
/// # Safety
///
/// Every item's pointer range must stay valid, and not be touched by anyone
/// else, until this returns; receive ranges must be writable and must not
/// overlap a send range that is still in flight (the plans in
/// [`super::plan`] guarantee this by construction).
pub(crate) unsafe fn run<T: Element>(
    mesh: &mut dyn Mesh,
    plan: &mut Plan,
    op: ReduceOp,
    chunk_bytes: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let n = plan.sends.len();
    let chunk = (chunk_bytes / 64).max(1) * 64;
    let mut next_send = vec![0usize; n];
    let mut next_recv = vec![0usize; n];
    let mut interest: Vec<Interest> = Vec::with_capacity(n);
    mesh.set_bulk(plan.largest >= BULK_FROM);
    loop {
        let mut progressed = false;
        let mut finished = true;
        interest.clear();
        for peer in 0..n {
            let sent = pump_send(mesh, plan, peer, &mut next_send[peer], chunk)?;
            let received = pump_recv::<T>(mesh, plan, peer, &mut next_recv[peer], chunk, op)?;
            finished &= sent == Step::Done && received == Step::Done;
            progressed |= sent == Step::Moved || received == Step::Moved;
            if sent == Step::WouldBlock || received == Step::WouldBlock {
                interest.push(Interest {
                    peer,
                    read: received == Step::WouldBlock,
                    write: sent == Step::WouldBlock,
                });
            }
        }
        if finished {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CollectiveError::Timeout {
                op: plan.signature.kind,
                timeout,
            });
        }
        if !progressed {
            mesh.wait(&interest, deadline)?;
        }
    }
}

/// Sends at most one chunk of `peer`'s current send item, as far as its
/// dependency allows.
///
/// # Safety
///
/// As for [`run`].
unsafe fn pump_send(
    mesh: &mut dyn Mesh,
    plan: &mut Plan,
    peer: usize,
    next: &mut usize,
    chunk: usize,
) -> Result<Step> {
    while let Some(item) = plan.sends[peer].get(*next) {
        if item.sent == item.len {
            *next += 1;
            continue;
        }
        let allowed = match item.after {
            Some((p, i)) => plan.recvs[p][i].done,
            None => item.len,
        };
        if allowed <= item.sent {
            return Ok(Step::Waiting);
        }
        let end = allowed.min(item.sent + chunk);
        let src = std::slice::from_raw_parts(item.ptr.add(item.sent), end - item.sent);
        let wrote = mesh.link(peer).try_write(src)?;
        if wrote == 0 {
            return Ok(Step::WouldBlock);
        }
        let item = &mut plan.sends[peer][*next];
        item.sent += wrote;
        if item.sent == item.len {
            *next += 1;
        }
        return Ok(Step::Moved);
    }
    Ok(Step::Done)
}

/// Receives at most one chunk of `peer`'s current receive item, copying or
/// combining it into place; checks a header once it is complete.
///
/// # Safety
///
/// As for [`run`].
unsafe fn pump_recv<T: Element>(
    mesh: &mut dyn Mesh,
    plan: &mut Plan,
    peer: usize,
    next: &mut usize,
    chunk: usize,
    op: ReduceOp,
) -> Result<Step> {
    let elem = std::mem::size_of::<T>();
    while let Some(item) = plan.recvs[peer].get_mut(*next) {
        if item.done == item.len {
            *next += 1;
            continue;
        }
        let link = mesh.link(peer);
        let want = (item.len - item.done).min(chunk);
        let got = match item.action {
            RecvAction::Stream => {
                let dst = std::slice::from_raw_parts_mut(item.ptr.add(item.done), want);
                link.try_read_into_streaming(dst)?
            }
            RecvAction::Copy | RecvAction::Header => {
                let dst = std::slice::from_raw_parts_mut(item.ptr.add(item.done), want);
                link.try_read_into(dst)?
            }
            RecvAction::Reduce => {
                let base = item.ptr.add(item.done) as *mut T;
                link.try_read_with(want, elem, &mut |bytes: &[u8]| {
                    let dst = std::slice::from_raw_parts_mut(base, bytes.len() / elem);
                    combine_bytes_into(dst, bytes, op);
                })?
            }
        };
        if got == 0 {
            return Ok(Step::WouldBlock);
        }
        item.done += got;
        if item.done == item.len {
            if item.action == RecvAction::Header {
                let bytes = std::slice::from_raw_parts(item.ptr, item.len);
                check_header(peer, plan.signature, bytes)?;
            }
            *next += 1;
        }
        return Ok(Step::Moved);
    }
    Ok(Step::Done)
}

fn check_header(peer: usize, ours: OpSignature, bytes: &[u8]) -> Result<()> {
    let theirs = decode_header(bytes).ok_or(CollectiveError::Protocol {
        peer,
        detail: "malformed collective header",
    })?;
    if theirs != ours {
        return Err(CollectiveError::CallMismatch { peer, ours, theirs });
    }
    Ok(())
}
