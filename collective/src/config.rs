//! Every tunable of the collective layer, in one table.
//!
//! Each entry has a unit in its name, a default with the reason for it, and
//! an environment override `PRISM_COLLECTIVE_<NAME>` (upper case). A value
//! that does not parse is an error naming the variable, the value and the
//! expected type; it is never silently ignored.

use super::error::{CollectiveError, Result};
use super::plan::MIN_RING_BLOCK_BYTES;
use std::time::Duration;

/// Which transport carries a group's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory when every rank is on this host (same kernel boot and
    /// namespaces), TCP otherwise.
    Auto,
    /// TCP sockets, even between processes on one host.
    Tcp,
    /// Shared memory; joining fails if the ranks are not all on one host.
    SharedMemory,
}

impl prism_config::ParseValue for TransportChoice {
    const EXPECTED: &'static str = "auto, tcp or shm";
    fn parse_value(s: &str) -> Option<Self> {
        match s.trim() {
            "auto" => Some(TransportChoice::Auto),
            "tcp" => Some(TransportChoice::Tcp),
            "shm" => Some(TransportChoice::SharedMemory),
            _ => None,
        }
    }
}

prism_config::table! {
    /// The tunables. Build with [`CollectiveConfig::default`] or
    /// [`CollectiveConfig::from_env`], then adjust fields; each can be set
    /// as `PRISM_COLLECTIVE_<NAME>`.
    #[derive(Clone, Debug)]
    pub struct CollectiveConfig("PRISM_COLLECTIVE_") {
        /// Bound on every call, rendezvous included. 5 minutes: long enough for a
        /// slow rank to finish a training step before the others give up, short
        /// enough that a dead job is noticed.
        timeout_ms: u64 = 5 * 60 * 1000;
        /// all_reduce, reduce_scatter, all_gather and broadcast of at most this
        /// many bytes (the whole buffer) take the latency-optimal path (one
        /// round: every rank sends each peer what it needs); above it, the
        /// bandwidth-optimal ring or chain. 64 KiB: below it a ring's 2(n-1)
        /// round trips cost more than the extra bytes.
        small_message_bytes: usize = 64 * 1024;
        /// Largest piece the pipeline moves in one step. 256 KiB: big enough to
        /// amortise a system call, small enough to stay in L2 and to let the next
        /// rank start early.
        chunk_bytes: usize = 256 * 1024;
        /// Rings cut each segment into blocks of this many bytes and interleave
        /// the steps block by block, so a block reduced from the left neighbour
        /// is forwarded to the right while it is still in cache, instead of
        /// after the whole segment (when, for large buffers, it has gone back to
        /// memory). 256 KiB, one chunk: at world 2, 16-256 MiB all-reduces ran
        /// 1.2-1.3x faster than with whole segments, and 256 KiB did better
        /// there than 512 KiB, 1 MiB or 2 MiB. 0 moves whole segments, step after
        /// step. Smaller settings than 64 bytes count as 64 (a block list
        /// per call grows with the buffer divided by this).
        ring_block_bytes: usize = 256 * 1024;
        /// Capacity of each shared-memory ring between ring neighbours. 4 MiB:
        /// sixteen chunks in flight, so a sender rarely waits for its reader.
        shm_ring_bytes: usize = 4 * 1024 * 1024;
        /// Capacity of each shared-memory ring between ranks that are not ring
        /// neighbours (used only by the small-message path). 256 KiB.
        shm_side_ring_bytes: usize = 256 * 1024;
        /// How long a rank polls shared memory (yielding its CPU between polls)
        /// before sleeping on a futex, in microseconds. 50 us covers a typical
        /// hand-off between ranks.
        shm_spin_us: u64 = 50;
        /// SO_SNDBUF and SO_RCVBUF for TCP links; 0 leaves the kernel's
        /// auto-tuning. 4 MiB keeps a loopback or LAN pipe full. Much smaller
        /// values (tens of KiB) run into delayed ACKs and stall for 40 ms at a
        /// time.
        tcp_socket_buffer_bytes: usize = 4 * 1024 * 1024;
        /// Piece size for collectives on device memory (see `staged`): each
        /// piece is copied to pinned host memory while the previous one is on
        /// the network. 4 MiB: large enough for full PCIe speed, small enough to
        /// overlap well.
        device_chunk_bytes: usize = 4 * 1024 * 1024;
        /// Whether ranks sharing a GPU exchange device buffers through CUDA IPC
        /// (the same-GPU path); `false` stages them through host memory like
        /// ranks on different GPUs. On by default; off only to compare the two.
        cuda_ipc: bool = true;
        /// Whether same-GPU calls are ordered on the device's legacy default
        /// stream instead of waited for on the host: each rank records a
        /// CUDA interprocess event where its buffer is final, the leader's
        /// stream waits for those events before its kernel, and the other
        /// ranks' streams wait for the leader's event after it. A call then
        /// returns once its work is queued, and the host (a training loop)
        /// runs ahead while the device works, as it does between PyTorch
        /// kernels. Work queued after the call on the legacy stream, or a
        /// synchronous copy, sees the result; work on a non-blocking stream
        /// must wait for the legacy stream first. Off by default until it
        /// has been checked and timed on a GPU (section 1c and 2a of
        /// `bench/gpu/run.sh`); off, each call waits on the host for the
        /// device, which costs a drain of its queue per call.
        cuda_stream_ordered: bool = false;
        /// Which transport carries the group's bytes: `auto` (shared memory
        /// when every rank is on this host, TCP otherwise), `tcp` or `shm`.
        transport: TransportChoice = TransportChoice::Auto;
        /// Overrides this process's host identity (normally the kernel boot id
        /// plus pid, ipc and mount namespaces). Ranks with equal ids talk over
        /// shared memory. Only for making processes on one host act as if on
        /// several (tests, experiments): equal ids on different hosts fail.
        host_id: Option<String> = None;
    }
}

impl CollectiveConfig {
    /// The defaults with every `PRISM_COLLECTIVE_*` override applied.
    ///
    /// ```
    /// let config = prism_collective::CollectiveConfig::from_env()?;
    /// assert!(config.timeout_ms > 0);
    /// # Ok::<(), prism_collective::CollectiveError>(())
    /// ```
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|key| std::env::var(key).ok())
    }

    /// The call's timeout as a `Duration`.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = CollectiveConfig::default();
        c.apply_lookup(&lookup)
            .map_err(|e| CollectiveError::InvalidConfig {
                key: e.key,
                value: e.value,
                expected: e.expected,
            })?;
        if let Some(id) = &c.host_id {
            if id.is_empty() || id.len() > 256 || !id.chars().all(|ch| ch.is_ascii_graphic()) {
                return Err(CollectiveError::InvalidConfig {
                    key: "PRISM_COLLECTIVE_HOST_ID".into(),
                    value: id.clone(),
                    expected: "1 to 256 printable characters without spaces".into(),
                });
            }
        }
        if c.ring_block_bytes != 0 && c.ring_block_bytes < MIN_RING_BLOCK_BYTES {
            return Err(CollectiveError::InvalidConfig {
                key: "PRISM_COLLECTIVE_RING_BLOCK_BYTES".into(),
                value: c.ring_block_bytes.to_string(),
                expected: format!(
                    "0 (whole segments) or a byte count of at least {MIN_RING_BLOCK_BYTES}"
                ),
            });
        }
        if c.chunk_bytes < 4096 {
            return Err(CollectiveError::InvalidConfig {
                key: "PRISM_COLLECTIVE_CHUNK_BYTES".into(),
                value: c.chunk_bytes.to_string(),
                expected: "a byte count of at least 4096".into(),
            });
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply_and_bad_values_name_the_variable() {
        let c = CollectiveConfig::from_lookup(|k| {
            (k == "PRISM_COLLECTIVE_TIMEOUT_MS").then(|| "1500".to_string())
        })
        .expect("a valid override parses");
        assert_eq!(c.timeout(), Duration::from_millis(1500));

        let err = CollectiveConfig::from_lookup(|k| {
            (k == "PRISM_COLLECTIVE_CHUNK_BYTES").then(|| "lots".to_string())
        })
        .expect_err("a word is not a byte count");
        assert_eq!(
            err.to_string(),
            "config PRISM_COLLECTIVE_CHUNK_BYTES: \"lots\" is not an unsigned integer"
        );
    }

    #[test]
    fn ring_blocks_are_whole_segments_or_at_least_64_bytes() {
        let with = |v: &str| {
            CollectiveConfig::from_lookup(|k| {
                (k == "PRISM_COLLECTIVE_RING_BLOCK_BYTES").then(|| v.to_string())
            })
        };
        assert_eq!(with("0").expect("0: whole segments").ring_block_bytes, 0);
        assert_eq!(with("64").expect("the smallest block").ring_block_bytes, 64);
        let err = with("8").expect_err("too small a block");
        assert!(
            err.to_string()
                .contains("PRISM_COLLECTIVE_RING_BLOCK_BYTES")
                && err.to_string().contains("at least 64"),
            "{err}"
        );
    }

    #[test]
    fn transport_names_parse() {
        let c = CollectiveConfig::from_lookup(|k| {
            (k == "PRISM_COLLECTIVE_TRANSPORT").then(|| "tcp".to_string())
        })
        .expect("tcp is a transport");
        assert_eq!(c.transport, TransportChoice::Tcp);
        assert!(CollectiveConfig::from_lookup(|k| {
            (k == "PRISM_COLLECTIVE_TRANSPORT").then(|| "carrier-pigeon".to_string())
        })
        .is_err());
    }

    #[test]
    fn the_cuda_ipc_switch_takes_booleans_only() {
        let off = CollectiveConfig::from_lookup(|k| {
            (k == "PRISM_COLLECTIVE_CUDA_IPC").then(|| "0".to_string())
        })
        .expect("0 is a switch value");
        assert!(!off.cuda_ipc);
        assert!(CollectiveConfig::default().cuda_ipc);
        let err = CollectiveConfig::from_lookup(|k| {
            (k == "PRISM_COLLECTIVE_CUDA_IPC").then(|| "maybe".to_string())
        })
        .expect_err("not a switch value");
        assert!(
            err.to_string().contains("PRISM_COLLECTIVE_CUDA_IPC"),
            "{err}"
        );
    }
}
