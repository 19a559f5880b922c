//! The one error type of the collective module.
//!
//! # Which errors leave the group usable
//!
//! Errors found before any byte is sent ([`CollectiveError::BufferLength`],
//! [`CollectiveError::InvalidRoot`]) leave the group as it was: fix the call
//! and try again. Every error that happens while bytes are moving (a timeout,
//! a peer that disconnected, a mismatched call) leaves the streams between
//! ranks in an unknown state, so the group aborts: every rank gets an error
//! promptly, and later calls return [`CollectiveError::GroupBroken`]. Recover
//! by creating a new group, as a restarted training run does.

use super::element::{DataType, ReduceOp};
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Which collective a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`all_reduce`](crate::ProcessGroup::all_reduce).
    AllReduce,
    /// [`reduce_scatter`](crate::ProcessGroup::reduce_scatter).
    ReduceScatter,
    /// [`all_gather`](crate::ProcessGroup::all_gather).
    AllGather,
    /// [`broadcast`](crate::ProcessGroup::broadcast).
    Broadcast,
    /// [`barrier`](crate::ProcessGroup::barrier).
    Barrier,
    /// [`all_to_all`](crate::ProcessGroup::all_to_all).
    AllToAll,
}

impl OpKind {
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<OpKind> {
        const ALL: [OpKind; 6] = [
            OpKind::AllReduce,
            OpKind::ReduceScatter,
            OpKind::AllGather,
            OpKind::Broadcast,
            OpKind::Barrier,
            OpKind::AllToAll,
        ];
        ALL.get(code as usize).copied()
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast => "broadcast",
            OpKind::Barrier => "barrier",
            OpKind::AllToAll => "all_to_all",
        })
    }
}

/// What one rank called: carried in the header of every collective so that
/// ranks that disagree fail at once instead of reading garbage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSignature {
    /// The call's position in this group's sequence of collectives (from 1).
    pub seq: u32,
    /// The collective.
    pub kind: OpKind,
    /// The element type.
    pub data_type: DataType,
    /// The reduction, for all_reduce and reduce_scatter.
    pub reduce_op: Option<ReduceOp>,
    /// The root rank, for broadcast.
    pub root: u32,
    /// Elements in the buffer the call was given.
    pub len: u64,
}

impl fmt::Display for OpSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call #{} {}<{}>", self.seq, self.kind, self.data_type)?;
        if let Some(op) = self.reduce_op {
            write!(f, " op={op}")?;
        }
        if self.kind == OpKind::Broadcast {
            write!(f, " root={}", self.root)?;
        }
        write!(f, " len={}", self.len)
    }
}

/// Everything that can go wrong in a collective group.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A rank outside `0..world_size`.
    #[error("rank {rank} is out of range for world size {world_size}; ranks run from 0 to world_size - 1")]
    InvalidRank {
        /// The rank given.
        rank: usize,
        /// The world size given.
        world_size: usize,
    },
    /// A world size of zero or too large.
    #[error("world size {world_size} is not supported; give between 1 and {max}")]
    InvalidWorldSize {
        /// The world size given.
        world_size: usize,
        /// The largest supported world size.
        max: usize,
    },
    /// A group name the rendezvous cannot carry.
    #[error("group name {name:?} is not usable; use 1 to 128 printable characters without tabs or spaces")]
    InvalidGroupName {
        /// The name given.
        name: String,
    },
    /// A `PRISM_COLLECTIVE_*` or rendezvous variable that does not parse.
    #[error("config {key}: {value:?} is not {expected}")]
    InvalidConfig {
        /// The environment variable.
        key: String,
        /// Its value.
        value: String,
        /// What was expected.
        expected: String,
    },
    /// A variable `env://` rendezvous needs is not set.
    #[error("environment variable {name} is not set; env:// rendezvous needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE")]
    MissingEnv {
        /// The variable.
        name: &'static str,
    },
    /// A buffer of the wrong length for the call.
    #[error("{op}: buffer holds {actual} elements but the call needs {expected}")]
    BufferLength {
        /// The collective.
        op: OpKind,
        /// Elements needed.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// A broadcast root outside the group.
    #[error("broadcast root {root} is out of range for world size {world_size}")]
    InvalidRoot {
        /// The root given.
        root: usize,
        /// The group's world size.
        world_size: usize,
    },
    /// The master address does not resolve.
    #[error("rendezvous address {address:?} does not resolve to a socket address; give host:port, for instance 127.0.0.1:29500")]
    BadAddress {
        /// The address given.
        address: String,
    },
    /// Not every rank joined within the timeout.
    #[error("rendezvous at {master} timed out after {timeout:?} with {joined} of {world_size} ranks joined; check that every rank was started with the same MASTER_ADDR/MASTER_PORT and can reach it")]
    RendezvousTimeout {
        /// The master address.
        master: String,
        /// Ranks that had joined (as far as this rank knows).
        joined: usize,
        /// Ranks expected.
        world_size: usize,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// A rank joined with settings that disagree with the master's.
    #[error("rendezvous at {master}: rank {rank} joined with {field} {theirs:?} but the master has {ours:?}; start every rank with the same group name and world size")]
    RendezvousMismatch {
        /// The master address.
        master: String,
        /// The joining rank.
        rank: usize,
        /// The field that differs.
        field: &'static str,
        /// The master's value.
        ours: String,
        /// The joining rank's value.
        theirs: String,
    },
    /// Two processes claimed the same rank.
    #[error(
        "rendezvous at {master}: rank {rank} joined twice; give every process a distinct RANK"
    )]
    DuplicateRank {
        /// The master address.
        master: String,
        /// The rank claimed twice.
        rank: usize,
    },
    /// A peer spoke something other than this protocol.
    #[error("rank {peer} sent an unexpected message ({detail}); is another program or another group using this port?")]
    Protocol {
        /// The peer rank, or the world size when not yet known.
        peer: usize,
        /// What was wrong.
        detail: &'static str,
    },
    /// A TLS link to a rank on another host could not be made: its
    /// handshake failed, or the peer spoke plain TCP to a group in TLS.
    #[error("TLS with {} failed: {detail}", match peer { Some(p) => format!("rank {p}"), None => "a connecting rank".to_string() })]
    Tls {
        /// The peer rank, when known.
        peer: Option<usize>,
        /// What failed, and what to check.
        detail: String,
    },
    /// TLS configuration given to [`GroupTls::from_pem`](crate::GroupTls::from_pem)
    /// could not be used.
    #[error("GroupTls: {what} cannot be used: {detail}")]
    TlsConfig {
        /// Which input: the certificate, the private key or the CA.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// A socket operation failed.
    #[error("{context} (peer {peer:?}): {source}")]
    Io {
        /// The peer rank, when one is involved.
        peer: Option<usize>,
        /// What was being done.
        context: &'static str,
        /// The OS error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The connection to a peer closed in the middle of a collective.
    #[error("rank {peer} closed its connection during a collective; it probably exited or failed, see its log")]
    PeerDisconnected {
        /// The peer rank.
        peer: usize,
    },
    /// A peer process on this host is gone.
    #[error("rank {peer} (pid {pid}) exited during a collective; see its log")]
    PeerDied {
        /// The peer rank.
        peer: usize,
        /// Its process id.
        pid: u32,
    },
    /// A call did not finish within the group's timeout.
    #[error("{op} did not complete within {timeout:?}; a peer may be stuck, dead or in a different collective (raise PRISM_COLLECTIVE_TIMEOUT_MS if the step is only slow)")]
    Timeout {
        /// The collective.
        op: OpKind,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// Two ranks called different collectives at the same point.
    #[error("rank {peer} made {theirs} while this rank made {ours}; every rank must call the same collectives in the same order")]
    CallMismatch {
        /// The peer rank.
        peer: usize,
        /// This rank's call.
        ours: OpSignature,
        /// The peer's call.
        theirs: OpSignature,
    },
    /// Another rank hit an error and aborted the group.
    #[error("rank {by} aborted the group after an error; see that rank's error, then create a new group")]
    GroupAborted {
        /// The rank that aborted.
        by: usize,
    },
    /// The group failed earlier and cannot be used again.
    #[error("the group is unusable after an earlier failure ({first}); create a new group")]
    GroupBroken {
        /// The failure that broke the group.
        first: Arc<CollectiveError>,
    },
    /// Shared memory could not be set up.
    #[error("shared memory at {path}: {source}; set PRISM_COLLECTIVE_TRANSPORT=tcp to avoid it")]
    SharedMemory {
        /// The backing file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The requested transport cannot connect these ranks.
    #[error("transport {transport} cannot connect this group: {reason}; set PRISM_COLLECTIVE_TRANSPORT=auto")]
    TransportUnavailable {
        /// The transport asked for.
        transport: &'static str,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// The group's background thread is gone (it panicked).
    #[error("the group's background thread stopped; create a new group")]
    WorkerGone,
    /// The CUDA driver or NVRTC could not be loaded or used.
    #[error("cuda is not available: {reason}; install an NVIDIA driver or use host buffers")]
    CudaUnavailable {
        /// Why.
        reason: String,
    },
    /// A CUDA call failed.
    #[error("cuda {context} failed: {detail}")]
    Cuda {
        /// The step.
        context: &'static str,
        /// The driver's message.
        detail: String,
    },
}

impl CollectiveError {
    /// Whether the error happened while bytes were in flight, so the group
    /// must abort (see the module docs).
    pub(crate) fn breaks_group(&self) -> bool {
        !matches!(
            self,
            CollectiveError::BufferLength { .. }
                | CollectiveError::InvalidRoot { .. }
                | CollectiveError::GroupBroken { .. }
                | CollectiveError::CudaUnavailable { .. }
        )
    }

    pub(crate) fn io(peer: Option<usize>, context: &'static str, source: io::Error) -> Self {
        CollectiveError::Io {
            peer,
            context,
            source: Arc::new(source),
        }
    }

    pub(crate) fn shm(path: &std::path::Path, source: io::Error) -> Self {
        CollectiveError::SharedMemory {
            path: path.to_path_buf(),
            source: Arc::new(source),
        }
    }
}

/// Shorthand for results of this module.
pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_errors_leave_the_group_usable_and_stream_errors_break_it() {
        let arg = CollectiveError::BufferLength {
            op: OpKind::AllGather,
            expected: 8,
            actual: 4,
        };
        assert!(!arg.breaks_group());
        assert!(CollectiveError::PeerDisconnected { peer: 1 }.breaks_group());
        assert!(CollectiveError::Timeout {
            op: OpKind::Barrier,
            timeout: Duration::from_secs(1)
        }
        .breaks_group());
    }

    #[test]
    fn a_mismatch_names_both_calls() {
        let ours = OpSignature {
            seq: 3,
            kind: OpKind::AllReduce,
            data_type: DataType::F32,
            reduce_op: Some(ReduceOp::Sum),
            root: 0,
            len: 10,
        };
        let theirs = OpSignature {
            kind: OpKind::Broadcast,
            reduce_op: None,
            ..ours
        };
        let msg = CollectiveError::CallMismatch {
            peer: 2,
            ours,
            theirs,
        }
        .to_string();
        assert_eq!(msg, "rank 2 made call #3 broadcast<f32> root=0 len=10 while this rank made call #3 all_reduce<f32> op=sum len=10; every rank must call the same collectives in the same order");
    }
}
