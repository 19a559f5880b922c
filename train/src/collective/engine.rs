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
use super::error::{CollectiveError, OpKind, OpSignature, Result};
use super::plan::{decode_header, Plan, RecvAction};
use super::transport::{Interest, Mesh};
use std::time::{Duration, Instant};

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
    let elem = std::mem::size_of::<T>();
    let chunk = (chunk_bytes / 64).max(1) * 64;
    let mut next_send = vec![0usize; n];
    let mut next_recv = vec![0usize; n];
    let mut interest: Vec<Interest> = Vec::with_capacity(n);
    let kind: OpKind = plan.signature.kind;
    loop {
        let mut progressed = false;
        let mut finished = true;
        interest.clear();
        for peer in 0..n {
            let mut want_read = false;
            let mut want_write = false;
            // Send: as far as the dependency allows, one chunk per round.
            while let Some(item) = plan.sends[peer].get(next_send[peer]) {
                if item.sent == item.len {
                    next_send[peer] += 1;
                    continue;
                }
                finished = false;
                let allowed = match item.after {
                    Some((p, i)) => plan.recvs[p][i].done,
                    None => item.len,
                };
                if allowed <= item.sent {
                    break; // Waiting on a receive, which has its own interest.
                }
                let end = allowed.min(item.sent + chunk);
                let src = std::slice::from_raw_parts(item.ptr.add(item.sent), end - item.sent);
                let wrote = mesh.link(peer).try_write(src)?;
                if wrote == 0 {
                    want_write = true;
                    break;
                }
                progressed = true;
                let item = &mut plan.sends[peer][next_send[peer]];
                item.sent += wrote;
                if item.sent == item.len {
                    next_send[peer] += 1;
                }
                break;
            }
            // Receive: at most one chunk per round.
            while let Some(item) = plan.recvs[peer].get_mut(next_recv[peer]) {
                if item.done == item.len {
                    next_recv[peer] += 1;
                    continue;
                }
                finished = false;
                let link = mesh.link(peer);
                let want = (item.len - item.done).min(chunk);
                let got = match item.action {
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
                    want_read = true;
                    break;
                }
                item.done += got;
                progressed = true;
                if item.done == item.len {
                    if item.action == RecvAction::Header {
                        let bytes = std::slice::from_raw_parts(item.ptr, item.len);
                        check_header(peer, plan.signature, bytes)?;
                    }
                    next_recv[peer] += 1;
                }
                break;
            }
            if want_read || want_write {
                interest.push(Interest {
                    peer,
                    read: want_read,
                    write: want_write,
                });
            }
        }
        if finished {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(CollectiveError::Timeout { op: kind, timeout });
        }
        if !progressed {
            mesh.wait(&interest, deadline)?;
        }
    }
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
