//! Collective communication between the processes of a training job
//! (`prism-collective`, re-exported as `prism_train::collective`).
//!
//! This crate needs no Prism cluster: any processes that can reach each
//! other (by TCP, or on one host) form a group, as torch.distributed's
//! gloo does. The Trainer uses it for its workers.
//!
//! A [`ProcessGroup`] is `world_size` processes, each with a rank, that call
//! the same collectives in the same order:
//!
//! | call | effect |
//! |---|---|
//! | [`all_reduce`](ProcessGroup::all_reduce) | every rank ends with the element-wise sum (mean, min, max, product) of all ranks' buffers |
//! | [`reduce_scatter`](ProcessGroup::reduce_scatter) | rank `r` ends with the reduction of its segment, [`segment_range`]`(len, n, r)` |
//! | [`all_gather`](ProcessGroup::all_gather) | every rank ends with all ranks' buffers, concatenated in rank order |
//! | [`all_to_all`](ProcessGroup::all_to_all) | block `j` of rank `i`'s input becomes block `i` of rank `j`'s output |
//! | [`broadcast`](ProcessGroup::broadcast) | every rank ends with the root's buffer |
//! | [`barrier`](ProcessGroup::barrier) | nobody leaves before everybody arrived |
//!
//! Each has a non-blocking twin (`*_async`) that takes an owned buffer and
//! returns a [`Work`] to wait on, so communication can overlap computation.
//! Element types: `f32`, `f64`, `f16`, `bf16`, `i32`, `i64`, `u8`
//! ([`Element`]).
//!
//! # Forming a group
//!
//! Ranks meet through a [`Rendezvous`]. [`TcpRendezvous`] is torch's
//! `env://`: rank 0 listens at `MASTER_ADDR:MASTER_PORT`
//! ([`ProcessGroup::from_env`] reads those with `RANK` and `WORLD_SIZE`).
//! Forming groups through the cluster's control store is
//! [`KvRendezvous`] over a [`KvStore`] (two methods, `put` and `get`), given
//! to [`ProcessGroup::join_with`].
//!
//! # Algorithms and transports
//!
//! Large all-reduces run a chunked, pipelined ring (reduce-scatter then
//! all-gather, each rank moving 2(n-1)/n of the buffer); small ones a
//! one-round direct exchange. Between hosts bytes go over TCP; when every
//! rank is on one host they go through shared-memory rings, with no socket
//! in the way. See the `plan` and `transport` sources, and
//! `docs/collective.md` for measurements.
//!
//! # Device buffers
//!
//! [`staged`] runs all-reduce and broadcast on memory the network cannot
//! reach directly, piece by piece through host memory, with the reduction on
//! the device; [`staged::HostBuffer`] is its CPU twin. The `cuda` module
//! (feature `cuda`) runs collectives on CUDA memory: ranks sharing a GPU go
//! through CUDA IPC with no host copy, others through [`staged`].
//!
//! # Failures and timeouts
//!
//! Every call is bounded by the group's timeout. A rank that fails mid-call
//! aborts the group on every rank; see [`CollectiveError`].

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

mod config;
mod copy;
#[cfg(feature = "cuda")]
pub mod cuda;
mod element;
mod engine;
mod error;
mod group;
mod ops;
mod plan;
mod rendezvous;
pub mod staged;
mod transport;

pub use config::{CollectiveConfig, TransportChoice};
pub use element::{DataType, Element, ReduceOp};
pub use error::{CollectiveError, OpKind, OpSignature, Result};
pub use group::{GroupOptions, ProcessGroup, Work, MAX_WORLD_SIZE};
pub use plan::segment_range;
pub use rendezvous::{KvRendezvous, KvStore, PeerRecord, Rendezvous, TcpRendezvous};
pub use transport::tls::GroupTls;
