//! Byte streams between the ranks of a group.
//!
//! A [`Mesh`] holds one ordered, reliable byte stream to and from every other
//! rank ([`Link`]), all driven without blocking by one thread: the
//! [`engine`](super::engine) moves what it can on every link, then calls
//! [`Mesh::wait`] until some link can move again. Three meshes exist:
//! [`tcp::TcpMesh`] (sockets, between hosts), [`shm::ShmMesh`] (rings in
//! one shared mapping, between processes on one host) and
//! [`hybrid::HybridMesh`] (the first for ranks on other hosts, the second
//! for ranks on this one).
//!
//! Streams carry no framing of their own: both ends know from the call what
//! bytes come next, and each collective opens with a header that both ends
//! check (see [`super::plan`]).

use super::error::Result;
use std::time::Instant;

pub(crate) mod hybrid;
pub(crate) mod shm;
pub(crate) mod tcp;
pub(crate) mod tls;

/// One rank's end of the streams to and from one peer.
pub(crate) trait Link {
    /// Writes a prefix of `data` without blocking; returns its length (0 when
    /// the stream is full).
    fn try_write(&mut self, data: &[u8]) -> Result<usize>;
    /// Reads into a prefix of `dst` without blocking; returns its length.
    fn try_read_into(&mut self, dst: &mut [u8]) -> Result<usize>;
    /// As [`Link::try_read_into`], for a destination too large to stay in
    /// cache: a transport that copies may write around the cache (no read
    /// of the destination's lines first, no eviction of what is cached).
    fn try_read_into_streaming(&mut self, dst: &mut [u8]) -> Result<usize> {
        self.try_read_into(dst)
    }
    /// Hands `consume` up to `max` readable bytes, a multiple of `align`
    /// (which divides `max`), and drops them from the stream; returns how
    /// many. Lets a reduction read straight from the transport's memory.
    fn try_read_with(
        &mut self,
        max: usize,
        align: usize,
        consume: &mut dyn FnMut(&[u8]),
    ) -> Result<usize>;
}

/// What the engine is waiting for on one link.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Interest {
    pub(crate) peer: usize,
    pub(crate) read: bool,
    pub(crate) write: bool,
}

/// Every link of one rank, and a way to sleep until one of them can move.
pub(crate) trait Mesh: Send {
    /// The link to `peer` (never this rank).
    fn link(&mut self, peer: usize) -> &mut dyn Link;
    /// Returns when a link in `interest` may be able to move, when `deadline`
    /// passes (the caller checks), or with an error when a peer is known to
    /// be gone or the group was aborted.
    fn wait(&mut self, interest: &[Interest], deadline: Instant) -> Result<()>;
    /// Tells every peer that this rank gave up, so that they fail promptly
    /// rather than at their timeouts.
    fn abort(&mut self);
    /// Whether the coming call moves buffers larger than the caches: a
    /// transport that copies may then pick copies suited to memory rather
    /// than to cache.
    fn set_bulk(&mut self, _bulk: bool) {}
    /// "tcp" or "shm", for logs and benchmarks.
    fn name(&self) -> &'static str;
}
