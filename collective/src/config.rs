//! Every tunable of the collective layer, in one table.
//!
//! Each entry has a unit in its name, a default with the reason for it, and
//! an environment override `PRISM_COLLECTIVE_<NAME>` (upper case). A value
//! that does not parse is an error naming the variable, the value and the
//! expected type; it is never silently ignored.

use super::error::{CollectiveError, Result};
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

/// The tunables. Build with [`CollectiveConfig::default`] or
/// [`CollectiveConfig::from_env`], then adjust fields.
#[derive(Clone, Debug)]
pub struct CollectiveConfig {
    /// Bound on every call, rendezvous included. 5 minutes: long enough for a
    /// slow rank to finish a training step before the others give up, short
    /// enough that a dead job is noticed.
    pub timeout_ms: u64,
    /// all_reduce, reduce_scatter, all_gather and broadcast of at most this
    /// many bytes (the whole buffer) take the latency-optimal path (one
    /// round: every rank sends each peer what it needs); above it, the
    /// bandwidth-optimal ring or chain. 64 KiB: below it a ring's 2(n-1)
    /// round trips cost more than the extra bytes.
    pub small_message_bytes: usize,
    /// Largest piece the pipeline moves in one step. 256 KiB: big enough to
    /// amortise a system call, small enough to stay in L2 and to let the next
    /// rank start early.
    pub chunk_bytes: usize,
    /// Capacity of each shared-memory ring between ring neighbours. 4 MiB:
    /// sixteen chunks in flight, so a sender rarely waits for its reader.
    pub shm_ring_bytes: usize,
    /// Capacity of each shared-memory ring between ranks that are not ring
    /// neighbours (used only by the small-message path). 256 KiB.
    pub shm_side_ring_bytes: usize,
    /// How long a rank polls shared memory (yielding its CPU between polls)
    /// before sleeping on a futex, in microseconds. 50 us covers a typical
    /// hand-off between ranks.
    pub shm_spin_us: u64,
    /// SO_SNDBUF and SO_RCVBUF for TCP links; 0 leaves the kernel's
    /// auto-tuning. 4 MiB keeps a loopback or LAN pipe full. Much smaller
    /// values (tens of KiB) run into delayed ACKs and stall for 40 ms at a
    /// time.
    pub tcp_socket_buffer_bytes: usize,
    /// Piece size for collectives on device memory (see `staged`): each
    /// piece is copied to pinned host memory while the previous one is on
    /// the network. 4 MiB: large enough for full PCIe speed, small enough to
    /// overlap well.
    pub device_chunk_bytes: usize,
    /// Whether ranks sharing a GPU exchange device buffers through CUDA IPC
    /// (the same-GPU path); `false` stages them through host memory like
    /// ranks on different GPUs. On by default; off only to compare the two.
    pub cuda_ipc: bool,
    /// Which transport to use.
    pub transport: TransportChoice,
    /// Overrides this process's host identity (normally the kernel boot id
    /// plus pid, ipc and mount namespaces). Ranks with equal ids talk over
    /// shared memory. Only for making processes on one host act as if on
    /// several (tests, experiments): equal ids on different hosts fail.
    pub host_id: Option<String>,
}

impl Default for CollectiveConfig {
    fn default() -> Self {
        CollectiveConfig {
            timeout_ms: 5 * 60 * 1000,
            small_message_bytes: 64 * 1024,
            chunk_bytes: 256 * 1024,
            shm_ring_bytes: 4 * 1024 * 1024,
            shm_side_ring_bytes: 256 * 1024,
            shm_spin_us: 50,
            tcp_socket_buffer_bytes: 4 * 1024 * 1024,
            device_chunk_bytes: 4 * 1024 * 1024,
            cuda_ipc: true,
            transport: TransportChoice::Auto,
            host_id: None,
        }
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
        number(&lookup, "PRISM_COLLECTIVE_TIMEOUT_MS", &mut c.timeout_ms)?;
        number(
            &lookup,
            "PRISM_COLLECTIVE_SMALL_MESSAGE_BYTES",
            &mut c.small_message_bytes,
        )?;
        number(&lookup, "PRISM_COLLECTIVE_CHUNK_BYTES", &mut c.chunk_bytes)?;
        number(
            &lookup,
            "PRISM_COLLECTIVE_SHM_RING_BYTES",
            &mut c.shm_ring_bytes,
        )?;
        number(
            &lookup,
            "PRISM_COLLECTIVE_SHM_SIDE_RING_BYTES",
            &mut c.shm_side_ring_bytes,
        )?;
        number(&lookup, "PRISM_COLLECTIVE_SHM_SPIN_US", &mut c.shm_spin_us)?;
        number(
            &lookup,
            "PRISM_COLLECTIVE_TCP_SOCKET_BUFFER_BYTES",
            &mut c.tcp_socket_buffer_bytes,
        )?;
        number(
            &lookup,
            "PRISM_COLLECTIVE_DEVICE_CHUNK_BYTES",
            &mut c.device_chunk_bytes,
        )?;
        if let Some(value) = lookup("PRISM_COLLECTIVE_CUDA_IPC") {
            c.cuda_ipc = match value.trim() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => {
                    return Err(CollectiveError::InvalidConfig {
                        key: "PRISM_COLLECTIVE_CUDA_IPC".into(),
                        value,
                        expected: "1, 0, true or false",
                    })
                }
            };
        }
        if let Some(value) = lookup("PRISM_COLLECTIVE_TRANSPORT") {
            c.transport = match value.as_str() {
                "auto" => TransportChoice::Auto,
                "tcp" => TransportChoice::Tcp,
                "shm" => TransportChoice::SharedMemory,
                _ => {
                    return Err(CollectiveError::InvalidConfig {
                        key: "PRISM_COLLECTIVE_TRANSPORT".into(),
                        value,
                        expected: "one of auto, tcp, shm",
                    })
                }
            };
        }
        if let Some(value) = lookup("PRISM_COLLECTIVE_HOST_ID") {
            c.host_id = Some(value);
        }
        if let Some(id) = &c.host_id {
            if id.is_empty() || id.len() > 256 || !id.chars().all(|ch| ch.is_ascii_graphic()) {
                return Err(CollectiveError::InvalidConfig {
                    key: "PRISM_COLLECTIVE_HOST_ID".into(),
                    value: id.clone(),
                    expected: "1 to 256 printable characters without spaces",
                });
            }
        }
        if c.chunk_bytes < 4096 {
            return Err(CollectiveError::InvalidConfig {
                key: "PRISM_COLLECTIVE_CHUNK_BYTES".into(),
                value: c.chunk_bytes.to_string(),
                expected: "a byte count of at least 4096",
            });
        }
        Ok(c)
    }
}

fn number<T: std::str::FromStr>(
    lookup: &impl Fn(&str) -> Option<String>,
    key: &str,
    slot: &mut T,
) -> Result<()> {
    if let Some(value) = lookup(key) {
        *slot = value
            .trim()
            .parse()
            .map_err(|_| CollectiveError::InvalidConfig {
                key: key.to_string(),
                value,
                expected: "a non-negative integer",
            })?;
    }
    Ok(())
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
            "PRISM_COLLECTIVE_CHUNK_BYTES=\"lots\" does not parse as a non-negative integer; unset it or give a non-negative integer"
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
