//! Shared-memory links between processes on one host.
//!
//! # Layout
//!
//! The members of a mesh are the group's ranks on this host (all of them,
//! or one host's share in a [`hybrid`](super::hybrid) mesh). The lowest
//! member creates one anonymous shared-memory file (a `memfd`), every
//! member opens it through `/proc/<pid>/fd/<n>` and maps it, and the
//! creator closes it once all have: the memory goes back when the last
//! mapping goes, so a crash leaves nothing behind, and the rings do not
//! count against the size of `/dev/shm` (64 MiB in a Docker container
//! by default, less than a group of eight needs). The mapping holds, each
//! on its own cache lines:
//!
//! 1. a header with the abort flag;
//! 2. one doorbell per member (a futex word and a "sleeping" flag);
//! 3. one single-producer single-consumer byte ring per ordered pair of
//!    members: a `head` written only by the sender, a `tail` written only by
//!    the receiver, then the data. Rings between neighbours on the group's
//!    ring are large (`shm_ring_bytes`), the others small
//!    (`shm_side_ring_bytes`).
//!
//! # Invariants
//!
//! 1. `tail <= head <= tail + capacity`; both only grow.
//! 2. Bytes between `tail` and `head` are written before `head` is published
//!    (Release) and read after it is observed (Acquire); likewise for `tail`
//!    and the free space.
//! 3. Whoever moves `head` or `tail` rings the other side's doorbell; a rank
//!    only sleeps after raising its flag and re-checking its rings, so a
//!    wake-up is never lost.
//!
//! # Copies
//!
//! A sender copies its bytes into the ring once; the receiver reduces
//! straight out of the ring (or copies out, for a gather). There is no socket
//! and no kernel copy.
//!
//! # Liveness
//!
//! The TCP connections made at setup stay open and idle: a peer that exits
//! closes them, which a sleeping rank notices within 10 ms.

use super::{Interest, Link, Mesh};
use crate::config::CollectiveConfig;
use crate::copy::{copy, copy_streaming, libc_copy};
use crate::error::{CollectiveError, Result};
use crate::rendezvous::remaining;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LINE: usize = 64;
const MAGIC: u64 = 0x5052_4953_4d53_484d; // "PRISMSHM"
const RING_CTL: usize = 2 * LINE;

/// The placement of everything in the mapping; every rank computes the same.
struct Layout {
    n: usize,
    /// Offset of the ring from `src` to `dst` at `src * n + dst`.
    ring_offsets: Vec<usize>,
    ring_caps: Vec<usize>,
    total: usize,
}

fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

impl Layout {
    /// The layout for `members` (global ranks, sorted); `ring_next[r]` is
    /// the rank after `r` on the group's ring. Indices inside are positions
    /// in `members`.
    fn new(members: &[usize], ring_next: &[usize], config: &CollectiveConfig) -> Layout {
        let n = members.len();
        let big = round_up(config.shm_ring_bytes.max(LINE), LINE);
        let small = round_up(config.shm_side_ring_bytes.max(LINE), LINE);
        let mut offset = LINE + n * LINE;
        let mut ring_offsets = vec![0; n * n];
        let mut ring_caps = vec![0; n * n];
        for src in 0..n {
            for dst in 0..n {
                if src == dst {
                    continue;
                }
                // Neighbours on the group's ring get the big rings.
                let (a, b) = (members[src], members[dst]);
                let neighbours = ring_next[a] == b || ring_next[b] == a;
                let cap = if neighbours { big } else { small };
                ring_offsets[src * n + dst] = offset;
                ring_caps[src * n + dst] = cap;
                offset += RING_CTL + cap;
            }
        }
        Layout {
            n,
            ring_offsets,
            ring_caps,
            total: offset,
        }
    }
}

/// A shared mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all cross-thread and
// cross-process access goes through atomics or through ring regions owned by
// one side at a time (see the module invariants).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(file: &std::fs::File, len: usize, path: &Path) -> Result<Mapping> {
        // SAFETY: mapping a file we opened read-write, of at least `len` bytes.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(CollectiveError::shm(path, std::io::Error::last_os_error()));
        }
        Ok(Mapping {
            ptr: ptr as *mut u8,
            len,
        })
    }

    /// Faults in, writable, the pages holding `[offset, offset + len)` in
    /// this process, without touching their contents (other ranks may be
    /// using them). A fresh mapping is sparse: every first touch of a page
    /// by each process is a page fault, and a ring's first lap would pay one
    /// per 4 KiB. (A 64 KiB all-gather at world 2 took 32-65 us while its
    /// 4 MiB rings were still on their first lap, 4-10 us after.) Kernels
    /// before 5.14 do not know the advice; the pages then fault in on first
    /// use, as before. Any other refusal is returned: the pages cannot all
    /// be had (past the end of the file, or beyond the memory the host or
    /// container allows), and touching them later would kill the process.
    fn populate(&self, offset: usize, len: usize) -> std::io::Result<()> {
        const PAGE: usize = 4096;
        let start = offset / PAGE * PAGE;
        let end = round_up(offset + len, PAGE).min(round_up(self.len, PAGE));
        if start >= end {
            return Ok(());
        }
        // SAFETY: a page-aligned range inside the mapping; the advice
        // changes page tables only, never the memory's contents.
        let rc = unsafe {
            libc::madvise(
                self.ptr.add(start) as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EINVAL) {
            tracing::debug!(%error, "shared-memory rings not populated ahead; they fault in on first use");
            return Ok(());
        }
        Err(error)
    }

    fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset + 8 <= self.len && offset.is_multiple_of(8));
        // SAFETY: in bounds, aligned, and only ever accessed atomically.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU64) }
    }

    fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset + 4 <= self.len && offset.is_multiple_of(4));
        // SAFETY: as for `atomic_u64`.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU32) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

/// One direction of one pair.
struct Ring {
    map: Arc<Mapping>,
    ctl: usize,
    cap: usize,
}

impl Ring {
    fn head(&self) -> &AtomicU64 {
        self.map.atomic_u64(self.ctl)
    }
    fn tail(&self) -> &AtomicU64 {
        self.map.atomic_u64(self.ctl + LINE)
    }
    fn data(&self) -> *mut u8 {
        // SAFETY: in bounds by the layout.
        unsafe { self.map.ptr.add(self.ctl + RING_CTL) }
    }
    fn readable(&self) -> usize {
        (self.head().load(Ordering::Acquire) - self.tail().load(Ordering::Relaxed)) as usize
    }
    fn writable(&self) -> usize {
        self.cap
            - (self.head().load(Ordering::Relaxed) - self.tail().load(Ordering::Acquire)) as usize
    }
}

struct Doorbell {
    map: Arc<Mapping>,
    offset: usize,
}

impl Doorbell {
    fn seq(&self) -> &AtomicU32 {
        self.map.atomic_u32(self.offset)
    }
    fn sleeping(&self) -> &AtomicU32 {
        self.map.atomic_u32(self.offset + 4)
    }
    fn ring(&self) {
        self.seq().fetch_add(1, Ordering::SeqCst);
        if self.sleeping().load(Ordering::SeqCst) != 0 {
            // SAFETY: FUTEX_WAKE on an aligned u32 in a shared mapping.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.seq().as_ptr(),
                    libc::FUTEX_WAKE,
                    1,
                    0usize,
                    0usize,
                    0u32,
                );
            }
        }
    }
    fn sleep(&self, seen: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on an aligned u32 in a shared mapping, with a
        // valid relative timeout. Early or spurious returns are fine.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.seq().as_ptr(),
                libc::FUTEX_WAIT,
                seen,
                &ts as *const libc::timespec,
                0usize,
                0u32,
            );
        }
    }
}

pub(crate) struct ShmLink {
    out: Ring,
    inbound: Ring,
    peer_bell: Doorbell,
    /// Copy with [`copy`] (buffers larger than the caches) rather than the
    /// C library's `memcpy` (faster within cache); see [`crate::copy`].
    bulk: bool,
}

impl ShmLink {
    /// The copy for this call: within cache the C library's; for buffers
    /// larger than the caches [`copy`], whose speed does not depend on the
    /// offsets, or [`copy_streaming`] for large receives.
    fn copier(&self, streaming: bool) -> unsafe fn(*mut u8, *const u8, usize) {
        match (self.bulk, streaming) {
            (true, true) => copy_streaming,
            (true, false) => copy,
            (false, _) => libc_copy,
        }
    }

    fn copy_out(&self, dst: *mut u8, len: usize, tail: u64, streaming: bool) {
        let cap = self.inbound.cap;
        let pos = (tail % cap as u64) as usize;
        let first = len.min(cap - pos);
        // SAFETY: the bytes [tail, tail+len) are readable (invariant 2) and
        // lie in the ring's data area split at the wrap point.
        unsafe {
            let src = self.inbound.data();
            let copy = self.copier(streaming);
            copy(dst, src.add(pos), first);
            copy(dst.add(first), src, len - first);
        }
    }

    fn read_into(&mut self, dst: &mut [u8], streaming: bool) -> usize {
        let n = self.inbound.readable().min(dst.len());
        if n == 0 {
            return 0;
        }
        let tail = self.inbound.tail().load(Ordering::Relaxed);
        self.copy_out(dst.as_mut_ptr(), n, tail, streaming);
        self.release(tail, n);
        n
    }

    fn release(&self, tail: u64, n: usize) {
        self.inbound
            .tail()
            .store(tail + n as u64, Ordering::Release);
        self.peer_bell.ring();
    }
}

impl Link for ShmLink {
    fn try_write(&mut self, data: &[u8]) -> Result<usize> {
        let ring = &self.out;
        let head = ring.head().load(Ordering::Relaxed);
        let n = ring.writable().min(data.len());
        if n == 0 {
            return Ok(0);
        }
        let pos = (head % ring.cap as u64) as usize;
        let first = n.min(ring.cap - pos);
        // SAFETY: [head, head+n) is free space (invariant 1) owned by the
        // sender until `head` is published.
        unsafe {
            let copy = self.copier(false);
            copy(ring.data().add(pos), data.as_ptr(), first);
            copy(ring.data(), data.as_ptr().add(first), n - first);
        }
        ring.head().store(head + n as u64, Ordering::Release);
        self.peer_bell.ring();
        Ok(n)
    }

    fn try_read_into(&mut self, dst: &mut [u8]) -> Result<usize> {
        Ok(self.read_into(dst, false))
    }

    fn try_read_into_streaming(&mut self, dst: &mut [u8]) -> Result<usize> {
        Ok(self.read_into(dst, true))
    }

    fn try_read_with(
        &mut self,
        max: usize,
        align: usize,
        consume: &mut dyn FnMut(&[u8]),
    ) -> Result<usize> {
        let avail = self.inbound.readable().min(max);
        if avail < align {
            return Ok(0);
        }
        let tail = self.inbound.tail().load(Ordering::Relaxed);
        let cap = self.inbound.cap;
        let pos = (tail % cap as u64) as usize;
        let contiguous = avail.min(cap - pos);
        let usable = contiguous - contiguous % align;
        if usable > 0 {
            // SAFETY: readable bytes, contiguous in the data area.
            let bytes = unsafe { std::slice::from_raw_parts(self.inbound.data().add(pos), usable) };
            consume(bytes);
            self.release(tail, usable);
            return Ok(usable);
        }
        // One element straddles the wrap point.
        let mut bounce = [0u8; 8];
        self.copy_out(bounce.as_mut_ptr(), align, tail, false);
        consume(&bounce[..align]);
        self.release(tail, align);
        Ok(align)
    }
}

/// A new anonymous shared-memory file, and the path through which other
/// processes of this host (and pid namespace) open it while it is open
/// here.
fn memfd(name: &str) -> Result<(std::fs::File, PathBuf)> {
    let c_name = std::ffi::CString::new(name).unwrap_or_default();
    // SAFETY: a valid C string; the flags ask for nothing but close-on-exec.
    let fd = unsafe { libc::memfd_create(c_name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        let path = PathBuf::from(format!("memfd:{name}"));
        return Err(CollectiveError::shm(&path, std::io::Error::last_os_error()));
    }
    // SAFETY: memfd_create just returned this descriptor; nothing else owns it.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let path = PathBuf::from(format!("/proc/{}/fd/{fd}", std::process::id()));
    Ok((file, path))
}

/// Every link of one rank over one shared mapping.
pub(crate) struct ShmMesh {
    rank: usize,
    map: Arc<Mapping>,
    links: Vec<Option<ShmLink>>,
    my_bell: Doorbell,
    /// Idle TCP connections kept to notice a peer's exit.
    control: Vec<Option<TcpStream>>,
    spin: Duration,
}

// SAFETY: see `Mapping`; a mesh is used by one thread at a time.
unsafe impl Send for ShmMesh {}

fn send_blocking(stream: &TcpStream, peer: usize, bytes: &[u8], deadline: Instant) -> Result<()> {
    stream
        .set_write_timeout(Some(remaining(deadline).max(Duration::from_millis(1))))
        .and_then(|_| (&*stream).write_all(bytes))
        .map_err(|e| CollectiveError::io(Some(peer), "setting up shared memory", e))
}

fn recv_blocking(
    stream: &TcpStream,
    peer: usize,
    bytes: &mut [u8],
    deadline: Instant,
) -> Result<()> {
    stream
        .set_read_timeout(Some(remaining(deadline).max(Duration::from_millis(1))))
        .and_then(|_| (&*stream).read_exact(bytes))
        .map_err(|e| CollectiveError::io(Some(peer), "setting up shared memory", e))
}

impl ShmMesh {
    /// Creates (the lowest member) or opens (the others) the mapping shared
    /// by `members`, the ranks on this host (sorted, this rank among them),
    /// coordinating over the already connected TCP `control` streams
    /// (indexed by rank; `Some` for every other member).
    pub(crate) fn new(
        rank: usize,
        nonce: u64,
        members: &[usize],
        ring_next: &[usize],
        control: Vec<Option<TcpStream>>,
        config: &CollectiveConfig,
        deadline: Instant,
    ) -> Result<ShmMesh> {
        let world = control.len();
        let layout = Layout::new(members, ring_next, config);
        let mut local = vec![None; world];
        for (i, m) in members.iter().enumerate() {
            local[*m] = Some(i);
        }
        let leader = members[0];
        let (map, path) = if rank == leader {
            // The group's nonce names it in `/proc/<pid>/maps`.
            let (file, path) = memfd(&format!("prism-collective-{nonce:016x}"))?;
            file.set_len(layout.total as u64)
                .map_err(|e| CollectiveError::shm(&path, e))?;
            let map = Mapping::map(&file, layout.total, &path)?;
            map.atomic_u64(0).store(MAGIC, Ordering::Release);
            let name = path.to_string_lossy().into_owned();
            let mut msg = (name.len() as u32).to_le_bytes().to_vec();
            msg.extend_from_slice(name.as_bytes());
            for (peer, s) in control.iter().enumerate() {
                if let Some(s) = s {
                    send_blocking(s, peer, &msg, deadline)?;
                }
            }
            for (peer, s) in control.iter().enumerate() {
                if let Some(s) = s {
                    let mut ack = [0u8; 1];
                    recv_blocking(s, peer, &mut ack, deadline)?;
                }
            }
            // Every member has mapped it: the file may close.
            drop(file);
            (map, path)
        } else {
            let Some(master) = control[leader].as_ref() else {
                unreachable!("every member has a link to the leader")
            };
            let mut len = [0u8; 4];
            recv_blocking(master, leader, &mut len, deadline)?;
            let len = u32::from_le_bytes(len) as usize;
            if len > 4096 {
                return Err(CollectiveError::Protocol {
                    peer: leader,
                    detail: "shared-memory path too long",
                });
            }
            let mut name = vec![0u8; len];
            recv_blocking(master, leader, &mut name, deadline)?;
            let path = PathBuf::from(String::from_utf8_lossy(&name).into_owned());
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| CollectiveError::shm(&path, e))?;
            let size = file
                .metadata()
                .map_err(|e| CollectiveError::shm(&path, e))?
                .len();
            if size < layout.total as u64 {
                return Err(CollectiveError::Protocol {
                    peer: leader,
                    detail: "shared-memory file smaller than this rank's configuration expects; give every rank the same PRISM_COLLECTIVE_SHM_* settings",
                });
            }
            let map = Mapping::map(&file, layout.total, &path)?;
            if map.atomic_u64(0).load(Ordering::Acquire) != MAGIC {
                return Err(CollectiveError::Protocol {
                    peer: leader,
                    detail: "shared-memory file not initialised",
                });
            }
            send_blocking(master, leader, &[1], deadline)?;
            (map, path)
        };
        let map = Arc::new(map);
        let index = |r: usize| match local[r] {
            Some(i) => i,
            None => unreachable!("only members get doorbells and rings"),
        };
        let bell = |r: usize| Doorbell {
            map: map.clone(),
            offset: LINE + index(r) * LINE,
        };
        let ring = |src: usize, dst: usize| {
            let at = index(src) * layout.n + index(dst);
            Ring {
                map: map.clone(),
                ctl: layout.ring_offsets[at],
                cap: layout.ring_caps[at],
            }
        };
        let links: Vec<Option<ShmLink>> = (0..world)
            .map(|peer| {
                (peer != rank && local[peer].is_some()).then(|| ShmLink {
                    out: ring(rank, peer),
                    inbound: ring(peer, rank),
                    peer_bell: bell(peer),
                    bulk: false,
                })
            })
            .collect();
        for link in links.iter().flatten() {
            for ring in [&link.out, &link.inbound] {
                map.populate(ring.ctl, RING_CTL + ring.cap).map_err(|e| {
                    let mine: usize = (links.iter().flatten())
                        .map(|l| 2 * RING_CTL + l.out.cap + l.inbound.cap)
                        .sum();
                    let detail = format!(
                        "this rank's rings ({} KiB) do not fit in the memory this host or \
                         container allows ({e}); lower PRISM_COLLECTIVE_SHM_RING_BYTES",
                        mine.div_ceil(1024)
                    );
                    CollectiveError::shm(&path, std::io::Error::new(e.kind(), detail))
                })?;
            }
        }
        for s in control.iter().flatten() {
            let _ = s.set_nonblocking(true);
        }
        let spin = Duration::from_micros(config.shm_spin_us);
        Ok(ShmMesh {
            rank,
            my_bell: bell(rank),
            map,
            links,
            control,
            spin,
        })
    }

    fn link_ready(&self, i: &Interest) -> bool {
        self.links[i.peer].as_ref().is_some_and(|l| {
            (i.read && l.inbound.readable() > 0) || (i.write && l.out.writable() > 0)
        })
    }

    pub(crate) fn ready(&self, interest: &[Interest]) -> bool {
        interest.iter().any(|i| self.link_ready(i))
    }

    fn aborted_by(&self) -> Option<usize> {
        match self.map.atomic_u32(8).load(Ordering::SeqCst) {
            0 => None,
            r => Some(r as usize - 1),
        }
    }

    /// Whether `peer`'s control connection has closed (it exited).
    fn departed(&self, peer: usize) -> bool {
        let Some(s) = self.control[peer].as_ref() else {
            return false;
        };
        let mut b = [0u8; 1];
        // SAFETY: peeking one byte into a local buffer.
        let r = unsafe {
            libc::recv(
                s.as_raw_fd(),
                b.as_mut_ptr() as *mut libc::c_void,
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if r == 0 {
            return true;
        }
        r < 0
            && !matches!(
                std::io::Error::last_os_error().kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            )
    }

    /// Fails if the group was aborted, or if a peer this rank is waiting on
    /// has exited without leaving the bytes it needs. A peer that finished
    /// its part and exited is not an error: its bytes stay in the mapping.
    pub(crate) fn check_group(&self, interest: &[Interest]) -> Result<()> {
        if let Some(by) = self.aborted_by() {
            return Err(CollectiveError::GroupAborted { by });
        }
        for i in interest {
            // Departure first, readiness second: bytes written before the
            // exit are visible by the time the exit is.
            if self.departed(i.peer) && !self.link_ready(i) {
                return Err(CollectiveError::PeerDisconnected { peer: i.peer });
            }
        }
        Ok(())
    }
}

impl Mesh for ShmMesh {
    fn link(&mut self, peer: usize) -> &mut dyn Link {
        match self.links[peer].as_mut() {
            Some(link) => link,
            None => unreachable!("plans never address their own rank"),
        }
    }

    fn wait(&mut self, interest: &[Interest], deadline: Instant) -> Result<()> {
        // Poll for up to `spin`, giving the CPU away between polls: when the
        // peer we wait for shares our CPU (more ranks than cores, or other
        // load) it runs at once; when it does not, a yield returns at once
        // and this is a spin. Either way it beats a futex round trip, which
        // costs both sides a system call and a wake-up.
        let until = Instant::now() + self.spin;
        for polls in 0u32.. {
            if self.ready(interest) {
                return Ok(());
            }
            std::thread::yield_now();
            if polls >= 8 && polls % 8 == 0 && Instant::now() >= until {
                break;
            }
        }
        // Sleep in slices of at most 10 ms, checking between them that the
        // group is alive; the caller checks the deadline.
        if self.ready(interest) {
            return Ok(());
        }
        self.check_group(interest)?;
        let slice = remaining(deadline).min(Duration::from_millis(10));
        if slice.is_zero() {
            return Ok(());
        }
        let seen = self.my_bell.seq().load(Ordering::SeqCst);
        self.my_bell.sleeping().store(1, Ordering::SeqCst);
        if !self.ready(interest) && self.aborted_by().is_none() {
            self.my_bell.sleep(seen, slice);
        }
        self.my_bell.sleeping().store(0, Ordering::SeqCst);
        if self.ready(interest) {
            return Ok(());
        }
        self.check_group(interest)
    }

    fn set_bulk(&mut self, bulk: bool) {
        for link in self.links.iter_mut().flatten() {
            link.bulk = bulk;
        }
    }

    fn abort(&mut self) {
        let _ = self.map.atomic_u32(8).compare_exchange(
            0,
            self.rank as u32 + 1,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        for link in self.links.iter().flatten() {
            link.peer_bell.ring();
        }
        for s in self.control.iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn name(&self) -> &'static str {
        "shm"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which 4 KiB pages of the mapping are in memory.
    fn resident(map: &Mapping) -> Vec<bool> {
        let pages = map.len.div_ceil(4096);
        let mut v = vec![0u8; pages];
        // SAFETY: the whole mapping, one status byte per page.
        let rc = unsafe { libc::mincore(map.ptr as *mut libc::c_void, map.len, v.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        v.into_iter().map(|b| b & 1 == 1).collect()
    }

    #[test]
    fn populating_a_range_brings_in_its_pages_and_keeps_their_bytes() {
        let (file, path) = memfd("prism-collective-test").expect("a memfd");
        let len = 64 * 4096;
        file.set_len(len as u64).expect("set_len");
        let map = Mapping::map(&file, len, &path).expect("mmap");
        // SAFETY: in bounds; no one else maps this file.
        unsafe { map.ptr.add(3 * 4096 + 5).write(42) };
        assert_eq!(
            resident(&map).iter().filter(|r| **r).count(),
            1,
            "a fresh file is sparse"
        );
        // From inside page 2 to inside page 9: pages 2 to 9.
        map.populate(2 * 4096 + 100, 7 * 4096).expect("populate");
        let now = resident(&map);
        for (page, r) in now.iter().enumerate() {
            assert_eq!(*r, (2..=9).contains(&page), "page {page}");
        }
        // SAFETY: as above.
        assert_eq!(unsafe { map.ptr.add(3 * 4096 + 5).read() }, 42);
        // Pages past the end of the file cannot be had: touching them would
        // raise SIGBUS, and populating them is an error instead.
        file.set_len(16 * 4096).expect("shrink");
        let err = map
            .populate(20 * 4096, 4096)
            .expect_err("past the end of the file");
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
    }

    #[test]
    fn rings_do_not_overlap_and_neighbours_get_the_big_ones() {
        let config = CollectiveConfig {
            shm_ring_bytes: 1000,
            shm_side_ring_bytes: 100,
            ..CollectiveConfig::default()
        };
        let layout = Layout::new(&[0, 1, 2, 3], &[1, 2, 3, 0], &config);
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for src in 0..4 {
            for dst in 0..4 {
                if src != dst {
                    let i = src * 4 + dst;
                    spans.push((
                        layout.ring_offsets[i],
                        layout.ring_offsets[i] + RING_CTL + layout.ring_caps[i],
                    ));
                    assert_eq!(layout.ring_offsets[i] % LINE, 0);
                }
            }
        }
        spans.sort();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
        assert!(spans.last().is_some_and(|s| s.1 <= layout.total));
        assert_eq!(layout.ring_caps[1], 1024, "0 -> 1 are neighbours");
        assert_eq!(layout.ring_caps[2], 128, "0 -> 2 are not");
    }
}
