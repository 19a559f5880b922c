//! The same-GPU path: processes that share one GPU hand their buffers to
//! one of them, which reduces them all in one kernel, through CUDA IPC,
//! with no copy through host memory and no staging on the device.
//!
//! # Setup (once per group)
//!
//! Each rank exports a small probe allocation and the ranks all-gather one
//! [`IpcRecord`] each over the group's host transport: host identity, the
//! GPU's PCI bus id and the probe's handle. When every record names the
//! same host and the same GPU, and the world is at most [`MAX_POINTERS`],
//! the leader (rank 0) maps every probe; the ranks agree that it worked.
//! Every rank reaches the same verdict from the same records. Otherwise the
//! group stages through host memory instead.
//!
//! # One call
//!
//! 1. Every rank marks where its buffer is final and all-gathers its call's
//!    signature with its buffer's allocation: a unique id, the offset in it
//!    and its IPC handle (each allocation is exported once and remembered
//!    by its id).
//! 2. The leader maps each peer's allocation the first time it sees it
//!    (mappings are kept, so a training loop that reuses its buffers maps
//!    them once), then launches one kernel: for each element, reduce every
//!    rank's input and write the result into every rank's buffer (for a
//!    broadcast, copy the root's).
//! 3. The leader broadcasts whether it succeeded; the others return.
//!
//! How the ranks' devices and the leader's kernel are ordered depends on
//! `cuda_stream_ordered` (off by default):
//!
//! - **Stream-ordered.** Each rank other than the leader records its
//!   interprocess event on the legacy default stream, where its buffer is
//!   final; the leader's stream waits for those events, runs the kernel and
//!   records the leader's event; after the broadcast, the other ranks'
//!   streams wait for that event. Nobody waits on the host, so a training
//!   loop queues its next kernels while the device reduces, as it does
//!   between PyTorch's own kernels. An event is recorded again only after
//!   every wait on its previous record was queued (a rank records for call
//!   k+1 after it saw the broadcast of call k, and the leader records after
//!   the exchange of call k+1), which is what makes one event per rank
//!   enough.
//! - **Host-waited.** Each rank waits for its context's work before the
//!   exchange, and the leader for its kernel before the broadcast.
//!
//! All device work of a call runs in one process. That is the point: on a
//! GPU that processes share by time slicing (no MPS), work submitted by
//! several processes at once is slow. On an H100, a 4 KiB copy and its
//! wait took 11 us from one process but 275 us each from two processes at
//! once, and 550 us from four. Earlier versions of this path, where every
//! rank copied into device stages and reduced its own segment, spent 330
//! us (world 2) and 1.1 ms (world 4) per call for that reason alone.

use super::driver::{self, CuDevicePtr, Device, Event, IpcHandle, RawMemory, Stream};
use super::kernels::{Kernels, MAX_POINTERS};
use crate::element::{DataType, ReduceOp};
use crate::error::{CollectiveError, OpKind, OpSignature, Result};
use crate::group::ProcessGroup;
use std::collections::HashMap;
use std::sync::Arc;

const HOST_BYTES: usize = 256;
const PCI_BYTES: usize = 32;
/// Size of an encoded [`IpcRecord`].
pub(crate) const RECORD_BYTES: usize = HOST_BYTES + PCI_BYTES + 1 + 64;

/// What one rank tells the others when the same-GPU path is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IpcRecord {
    /// The host identity (boot id and namespaces), as for shared memory.
    pub(crate) host: String,
    /// The GPU's PCI bus id.
    pub(crate) pci_bus_id: String,
    /// Whether this rank could allocate and export its probe.
    pub(crate) exported: bool,
    /// The probe's handle.
    pub(crate) probe: IpcHandle,
}

fn put_text(out: &mut Vec<u8>, text: &str, width: usize) {
    let bytes = text.as_bytes();
    let n = bytes.len().min(width);
    out.extend_from_slice(&bytes[..n]);
    out.resize(out.len() + width - n, 0);
}

fn get_text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn handle_at(bytes: &[u8]) -> IpcHandle {
    let mut h = [0u8; 64];
    h.copy_from_slice(&bytes[..64]);
    IpcHandle(h)
}

impl IpcRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_BYTES);
        put_text(&mut out, &self.host, HOST_BYTES);
        put_text(&mut out, &self.pci_bus_id, PCI_BYTES);
        out.push(u8::from(self.exported));
        out.extend_from_slice(&self.probe.0);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<IpcRecord> {
        if bytes.len() != RECORD_BYTES {
            return None;
        }
        let (host, rest) = bytes.split_at(HOST_BYTES);
        let (pci, rest) = rest.split_at(PCI_BYTES);
        Some(IpcRecord {
            host: get_text(host),
            pci_bus_id: get_text(pci),
            exported: rest[0] == 1,
            probe: handle_at(&rest[1..]),
        })
    }
}

/// Why a group cannot use the same-GPU path, or `None` when it can. Every
/// rank computes this from the same records, so all agree.
pub(crate) fn refusal(records: &[IpcRecord]) -> Option<String> {
    if records.len() > MAX_POINTERS {
        return Some(format!(
            "{} ranks are more than the {MAX_POINTERS} the same-GPU path serves",
            records.len()
        ));
    }
    let first = records.first()?;
    for (rank, r) in records.iter().enumerate() {
        if !r.exported {
            return Some(format!("rank {rank} could not export CUDA IPC memory"));
        }
        if r.host != first.host {
            return Some(format!("rank {rank} is on another host"));
        }
        if r.pci_bus_id.is_empty() || r.pci_bus_id != first.pci_bus_id {
            return Some(format!(
                "rank {rank} uses GPU {} and rank 0 GPU {}",
                r.pci_bus_id, first.pci_bus_id
            ));
        }
    }
    None
}

/// All-gathers `mine` over `group` and decodes every rank's record.
pub(crate) fn exchange(group: &ProcessGroup, mine: &IpcRecord) -> Result<Vec<IpcRecord>> {
    let n = group.world_size();
    let mut all = vec![0u8; RECORD_BYTES * n];
    group.all_gather(&mine.encode(), &mut all)?;
    all.chunks(RECORD_BYTES)
        .enumerate()
        .map(|(rank, bytes)| {
            IpcRecord::decode(bytes).ok_or_else(|| CollectiveError::Cuda {
                context: "exchanging CUDA IPC handles",
                detail: format!("rank {rank} sent a malformed record"),
            })
        })
        .collect()
}

/// What each rank all-gathers at the start of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CallRecord {
    /// The call, as every rank must make it.
    pub(crate) signature: [u8; 16],
    /// The buffer's allocation id; `u64::MAX` when it could not be
    /// described or exported.
    pub(crate) allocation: u64,
    /// The buffer's offset in its allocation.
    pub(crate) offset: u64,
    /// The allocation's IPC handle.
    pub(crate) handle: IpcHandle,
}

/// Size of an encoded [`CallRecord`].
pub(crate) const CALL_BYTES: usize = 16 + 8 + 8 + 64;
const NO_ALLOCATION: u64 = u64::MAX;

impl CallRecord {
    pub(crate) fn encode(&self) -> [u8; CALL_BYTES] {
        let mut b = [0u8; CALL_BYTES];
        b[..16].copy_from_slice(&self.signature);
        b[16..24].copy_from_slice(&self.allocation.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..].copy_from_slice(&self.handle.0);
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<CallRecord> {
        if b.len() != CALL_BYTES {
            return None;
        }
        let mut signature = [0u8; 16];
        signature.copy_from_slice(&b[..16]);
        Some(CallRecord {
            signature,
            allocation: u64::from_le_bytes(b[16..24].try_into().ok()?),
            offset: u64::from_le_bytes(b[24..32].try_into().ok()?),
            handle: handle_at(&b[32..]),
        })
    }
}

pub(crate) fn encode_signature(s: &OpSignature) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = s.kind.code();
    b[1] = s.data_type.code();
    b[2] = s.reduce_op.map_or(255, ReduceOp::code);
    b[4..8].copy_from_slice(&s.root.to_le_bytes());
    b[8..16].copy_from_slice(&s.len.to_le_bytes());
    b
}

pub(crate) fn decode_signature(b: &[u8; 16], seq: u32, fallback: OpSignature) -> OpSignature {
    OpSignature {
        seq,
        kind: OpKind::from_code(b[0]).unwrap_or(fallback.kind),
        data_type: DataType::from_code(b[1]).unwrap_or(fallback.data_type),
        reduce_op: ReduceOp::from_code(b[2]),
        root: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        len: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
    }
}

/// A peer allocation mapped into the leader, with the call it last served.
struct Mapped {
    memory: RawMemory,
    last_call: u32,
}

/// Mappings kept per group before the least recently used are closed.
const MAX_MAPPINGS: usize = 512;
/// Exports remembered per process before the table is cleared.
const MAX_EXPORTS: usize = 4096;

/// The interprocess events of a stream-ordered path.
struct Events {
    /// Recorded by this rank: on the leader after a call's kernel, on the
    /// others where their buffer is final.
    own: Event,
    /// Opened from the peers, by rank: on the leader every other rank's
    /// event, on the others the leader's (at 0). `None` where not needed.
    peers: Vec<Option<Event>>,
}

/// Size of one rank's event record: whether it has an event, its handle.
const EVENT_BYTES: usize = 1 + 64;

impl Events {
    /// Exchanges events over `group` (a collective call). `None`, on every
    /// rank alike, unless every rank wants stream order and could create,
    /// export and open what it needs.
    fn link(device: &Arc<Device>, group: &ProcessGroup) -> Result<Option<Events>> {
        let (rank, world) = (group.rank(), group.world_size());
        let own = if group.config().cuda_stream_ordered {
            match Event::interprocess(device).and_then(|e| e.ipc_handle().map(|h| (e, h))) {
                Ok(made) => Some(made),
                Err(e) => {
                    tracing::info!("same-GPU calls wait on the host: {e}");
                    None
                }
            }
        } else {
            None
        };
        let mut mine = [0u8; EVENT_BYTES];
        if let Some((_, handle)) = &own {
            mine[0] = 1;
            mine[1..].copy_from_slice(&handle.0);
        }
        let mut all = vec![0u8; EVENT_BYTES * world];
        group.all_gather(&mine, &mut all)?;
        let mut peers = Vec::with_capacity(world);
        let mut ready = all.chunks(EVENT_BYTES).all(|r| r[0] == 1);
        if ready {
            for (q, record) in all.chunks(EVENT_BYTES).enumerate() {
                let needed = if rank == 0 { q != 0 } else { q == 0 };
                if !needed {
                    peers.push(None);
                    continue;
                }
                match Event::open_ipc(device, handle_at(&record[1..])) {
                    Ok(event) => peers.push(Some(event)),
                    Err(e) => {
                        tracing::info!("same-GPU calls wait on the host: rank {rank} could not open rank {q}'s event: {e}");
                        ready = false;
                        break;
                    }
                }
            }
        }
        let mut agreed = vec![0u8; world];
        group.all_gather(&[u8::from(ready)], &mut agreed)?;
        Ok(match own {
            Some((own, _)) if agreed.iter().all(|&a| a == 1) => Some(Events { own, peers }),
            _ => None,
        })
    }

    /// The event opened from rank `q`.
    fn peer(&self, q: usize) -> Result<&Event> {
        self.peers
            .get(q)
            .and_then(Option::as_ref)
            .ok_or_else(|| CollectiveError::Cuda {
                context: "the same-GPU collective",
                detail: format!("no event was opened from rank {q}"),
            })
    }
}

/// The same-GPU path of one group.
pub(crate) struct IpcPath {
    device: Arc<Device>,
    stream: Stream,
    rank: usize,
    world: usize,
    /// This rank's exported allocations, by allocation id.
    exported: HashMap<u64, IpcHandle>,
    /// Leader only: peers' allocations mapped here, by (rank, allocation id).
    mapped: HashMap<(usize, u64), Mapped>,
    /// Calls made, for mismatch messages and mapping ages.
    calls: u32,
    /// Present when calls are ordered on the device, not waited for.
    events: Option<Events>,
}

impl Drop for IpcPath {
    fn drop(&mut self) {
        // Queued kernels may still use the leader's mappings.
        let _ = self.stream.synchronize();
    }
}

/// What setting up the path gave.
pub(crate) enum Setup {
    /// The leader mapped every rank's probe.
    Ready(Box<IpcPath>),
    /// The group must stage through host memory, for this reason.
    Refused(String),
}

impl IpcPath {
    /// Sets up the path for `group`: a collective call, every rank of the
    /// group must make it.
    pub(crate) fn establish(device: &Arc<Device>, group: &ProcessGroup) -> Result<Setup> {
        let host = group
            .config()
            .host_id
            .clone()
            .unwrap_or_else(crate::rendezvous::local_host_id);
        let probe = RawMemory::alloc(device, 4096).and_then(|m| m.ipc_handle().map(|h| (m, h)));
        let mine = IpcRecord {
            host,
            pci_bus_id: device.pci_bus_id.clone(),
            exported: probe.is_ok(),
            probe: probe.as_ref().map_or(IpcHandle([0; 64]), |(_, h)| *h),
        };
        let records = exchange(group, &mine)?;
        if let Some(why) = refusal(&records) {
            return Ok(Setup::Refused(why));
        }
        let rank = group.rank();
        let mut failure = None;
        if rank == 0 {
            for (q, record) in records.iter().enumerate().skip(1) {
                if let Err(e) = RawMemory::open_ipc(device, record.probe, 4096) {
                    failure = Some(format!("rank 0 could not map rank {q}'s memory: {e}"));
                    break;
                }
            }
        }
        let mut ok = [u8::from(failure.is_none())];
        group.broadcast(&mut ok, 0)?;
        drop(probe);
        if ok[0] == 0 {
            return Ok(Setup::Refused(failure.unwrap_or_else(|| {
                "rank 0 could not map the other ranks' memory".to_string()
            })));
        }
        let events = Events::link(device, group)?;
        Ok(Setup::Ready(Box::new(IpcPath {
            device: device.clone(),
            stream: Stream::legacy(device),
            rank,
            world: records.len(),
            exported: HashMap::new(),
            mapped: HashMap::new(),
            calls: 0,
            events,
        })))
    }

    /// The allocation id, offset and handle of `bytes` at `ptr`.
    fn describe(&mut self, ptr: CuDevicePtr, bytes: usize) -> Result<(u64, u64, IpcHandle)> {
        let (id, base, size) = driver::allocation_of(&self.device, ptr)?;
        let offset = ptr - base;
        if offset as usize + bytes > size {
            return Err(CollectiveError::Cuda {
                context: "checking a device buffer",
                detail: format!(
                    "{bytes} bytes at offset {offset} run past the end of their {size}-byte allocation"
                ),
            });
        }
        if let Some(h) = self.exported.get(&id) {
            return Ok((id, offset, *h));
        }
        if self.exported.len() >= MAX_EXPORTS {
            self.exported.clear();
        }
        let h = driver::export(&self.device, base)?;
        self.exported.insert(id, h);
        Ok((id, offset, h))
    }

    /// The leader's address for rank `q`'s buffer.
    fn peer_address(&mut self, q: usize, record: &CallRecord) -> Result<CuDevicePtr> {
        let calls = self.calls;
        if !self.mapped.contains_key(&(q, record.allocation)) {
            if self.mapped.len() >= MAX_MAPPINGS {
                // Close the least recently used half; a training loop's
                // buffers are all recent. Queued kernels may use them.
                self.stream.synchronize()?;
                let mut ages: Vec<u32> = self.mapped.values().map(|m| m.last_call).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                self.mapped.retain(|_, m| m.last_call > cut);
            }
            // The size is not needed to map; the peer checked its range.
            let memory = RawMemory::open_ipc(&self.device, record.handle, 0)?;
            self.mapped.insert(
                (q, record.allocation),
                Mapped {
                    memory,
                    last_call: calls,
                },
            );
        }
        let m = self
            .mapped
            .get_mut(&(q, record.allocation))
            .unwrap_or_else(|| unreachable!("inserted above"));
        m.last_call = calls;
        Ok(m.memory.ptr + record.offset)
    }

    /// Runs one call: an all-reduce with `op`, or a broadcast from `root`
    /// when `op` is `None`. `Ok(false)` when some rank's buffer cannot be
    /// shared (memory that CUDA IPC cannot export, such as virtual-memory
    /// mappings): every rank then learns it from the same exchange, and the
    /// caller stages this call through host memory instead.
    ///
    /// # Safety
    /// `ptr` addresses `len` elements of `dt` on this path's device.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn run(
        &mut self,
        group: &ProcessGroup,
        kernels: &Kernels,
        ptr: CuDevicePtr,
        len: usize,
        dt: DataType,
        op: Option<ReduceOp>,
        root: usize,
    ) -> Result<bool> {
        self.calls = self.calls.wrapping_add(1);
        let ours = OpSignature {
            seq: self.calls,
            kind: if op.is_some() {
                OpKind::AllReduce
            } else {
                OpKind::Broadcast
            },
            data_type: dt,
            reduce_op: op,
            root: root as u32,
            len: len as u64,
        };
        // The buffer is final where the caller's work so far ends: marked
        // there on the stream, or waited for.
        self.device.bind()?;
        let marked = match &self.events {
            Some(events) if self.rank != 0 => events.own.record(&self.stream),
            Some(_) => Ok(()),
            None => self.device.synchronize(),
        };
        let described = marked.and_then(|()| self.describe(ptr, len * dt.size_bytes()));
        let mine = match &described {
            Ok((allocation, offset, handle)) => CallRecord {
                signature: encode_signature(&ours),
                allocation: *allocation,
                offset: *offset,
                handle: *handle,
            },
            Err(_) => CallRecord {
                signature: encode_signature(&ours),
                allocation: NO_ALLOCATION,
                offset: 0,
                handle: IpcHandle([0; 64]),
            },
        };
        let mut all = vec![0u8; CALL_BYTES * self.world];
        group.all_gather(&mine.encode(), &mut all)?;
        let records: Vec<CallRecord> = all
            .chunks(CALL_BYTES)
            .map(|b| CallRecord::decode(b).unwrap_or_else(|| mine.clone()))
            .collect();
        for (peer, theirs) in records.iter().enumerate() {
            if theirs.signature != mine.signature {
                return Err(CollectiveError::CallMismatch {
                    peer,
                    ours,
                    theirs: decode_signature(&theirs.signature, ours.seq, ours),
                });
            }
        }
        if let Err(e) = described {
            tracing::warn!("this buffer cannot be shared with CUDA IPC ({e}); staging the call through host memory");
        }
        if records.iter().any(|r| r.allocation == NO_ALLOCATION) {
            return Ok(false);
        }
        let status = if self.rank == 0 {
            self.lead(kernels, ptr, len, op, root, &records)
        } else {
            Ok(())
        };
        let mut ok = [u8::from(status.is_ok())];
        group.broadcast(&mut ok, 0)?;
        status?;
        if ok[0] == 0 {
            return Err(CollectiveError::Cuda {
                context: "the same-GPU collective",
                detail: "rank 0, which runs it for every rank, failed; see its error".into(),
            });
        }
        if let Some(events) = &self.events {
            if self.rank != 0 {
                // Later work on this rank's stream sees the result.
                self.stream.wait(events.peer(0)?.raw)?;
            }
        }
        Ok(true)
    }

    /// The leader's part: map, launch, then mark or wait for the kernel.
    unsafe fn lead(
        &mut self,
        kernels: &Kernels,
        ptr: CuDevicePtr,
        len: usize,
        op: Option<ReduceOp>,
        root: usize,
        records: &[CallRecord],
    ) -> Result<()> {
        let mut buffers = Vec::with_capacity(self.world);
        for (q, record) in records.iter().enumerate() {
            buffers.push(if q == 0 {
                ptr
            } else {
                self.peer_address(q, record)?
            });
        }
        self.device.bind()?;
        if let Some(events) = &self.events {
            for q in 1..self.world {
                self.stream.wait(events.peer(q)?.raw)?;
            }
        }
        match op {
            Some(op) => kernels.reduce_all(&self.stream, &buffers, &buffers, len, op)?,
            None => {
                let outputs: Vec<CuDevicePtr> = (0..self.world)
                    .filter(|&q| q != root)
                    .map(|q| buffers[q])
                    .collect();
                kernels.reduce_all(&self.stream, &[buffers[root]], &outputs, len, ReduceOp::Sum)?
            }
        }
        match &self.events {
            Some(events) => events.own.record(&self.stream),
            None => self.stream.synchronize(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(host: &str, pci: &str, seed: u8) -> IpcRecord {
        IpcRecord {
            host: host.to_string(),
            pci_bus_id: pci.to_string(),
            exported: true,
            probe: IpcHandle([seed; 64]),
        }
    }

    #[test]
    fn records_round_trip_through_bytes() {
        let r = record("boot:1:2:3", "0000:19:00.0", 7);
        let bytes = r.encode();
        assert_eq!(bytes.len(), RECORD_BYTES);
        assert_eq!(IpcRecord::decode(&bytes), Some(r));
        assert_eq!(IpcRecord::decode(&bytes[1..]), None);
        let call = CallRecord {
            signature: [3; 16],
            allocation: 42,
            offset: 4096,
            handle: IpcHandle([9; 64]),
        };
        assert_eq!(CallRecord::decode(&call.encode()), Some(call));
    }

    #[test]
    fn records_are_exchanged_over_a_real_group() {
        use crate::{GroupOptions, TcpRendezvous};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let rdv = TcpRendezvous::on_listener(listener).expect("a bound listener");
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                let rdv = rdv.clone();
                std::thread::spawn(move || {
                    let group =
                        ProcessGroup::join_with(GroupOptions::new(rank, 3, rdv.master()), &rdv)?;
                    exchange(&group, &record("host", "0000:19:00.0", rank as u8 + 1))
                })
            })
            .collect();
        let expected: Vec<IpcRecord> = (0..3)
            .map(|rank| record("host", "0000:19:00.0", rank as u8 + 1))
            .collect();
        for rank in ranks {
            let got = rank.join().expect("no panic").expect("the exchange works");
            assert_eq!(got, expected);
            assert_eq!(refusal(&got), None);
        }
    }

    #[test]
    fn signatures_round_trip() {
        let s = OpSignature {
            seq: 5,
            kind: OpKind::Broadcast,
            data_type: DataType::BF16,
            reduce_op: None,
            root: 3,
            len: 1 << 40,
        };
        assert_eq!(decode_signature(&encode_signature(&s), 5, s), s);
    }

    #[test]
    fn only_one_host_and_one_gpu_take_the_same_gpu_path() {
        let a = record("h", "0000:19:00.0", 1);
        assert_eq!(refusal(&[a.clone(), a.clone()]), None);
        let other_gpu = record("h", "0000:3b:00.0", 1);
        assert!(refusal(&[a.clone(), other_gpu])
            .expect("refused")
            .contains("rank 1 uses GPU"));
        let other_host = record("h2", "0000:19:00.0", 1);
        assert!(refusal(&[a.clone(), other_host])
            .expect("refused")
            .contains("another host"));
        let mut failed = a.clone();
        failed.exported = false;
        assert!(refusal(&[failed, a.clone()])
            .expect("refused")
            .contains("rank 0 could not export"));
        let many = vec![a; MAX_POINTERS + 1];
        assert!(refusal(&many).expect("refused").contains("more than"));
    }
}
