//! Collectives on memory the network cannot reach directly (CUDA device
//! buffers), staged through host memory in pieces.
//!
//! A [`DeviceBuffer`] is the device side: copies to and from host memory it
//! allocates (pinned, for CUDA) and a reduction that runs on the device.
//! [`all_reduce`] and [`broadcast`] drive it together with a host
//! [`ProcessGroup`]. [`HostBuffer`] implements the trait on plain memory: the
//! CPU twin of the CUDA path, running the very same staging code, so the
//! algorithm is tested on machines without a GPU.
//!
//! # The all-reduce
//!
//! The buffer goes in pieces of `device_chunk_bytes`. For each piece, split
//! into n blocks (block `k` is [`segment_range`]`(piece, n, k)`, padded to the
//! longest):
//!
//! 1. copy the piece to host memory;
//! 2. [`all_to_all`](ProcessGroup::all_to_all): rank `k` receives every
//!    rank's block `k`;
//! 3. upload those n blocks and reduce them **on the device**, in rank order,
//!    into this rank's block of the buffer;
//! 4. copy that block back to the host and
//!    [`all_gather`](ProcessGroup::all_gather) it;
//! 5. upload the gathered piece into the buffer.
//!
//! Each rank sends and receives 2(n-1)/n of the buffer over the network, as
//! in the ring. The copy of piece `i+1` to the host starts before piece `i`
//! goes on the network, and the upload of piece `i` runs while piece `i+1` is
//! being prepared, so device copies overlap network time.

use super::element::{combine_into, finish_mean, Element, ReduceOp};
use super::error::Result;
use super::group::ProcessGroup;
use super::plan::segment_range;
use std::ops::{DerefMut, Range};

/// Device memory that a staged collective can copy and reduce.
///
/// Operations may run asynchronously: `download` until
/// [`wait_downloads`](Self::wait_downloads), `upload` and `reduce_blocks`
/// until [`wait_uploads`](Self::wait_uploads). Implementations order a
/// download after earlier reductions on the same buffer.
pub trait DeviceBuffer<T: Element> {
    /// Host memory the device copies to and from fastest.
    type Host: DerefMut<Target = [T]>;
    /// Elements in the device buffer.
    fn len(&self) -> usize;
    /// Whether the buffer is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Allocates `len` elements of host staging memory.
    fn alloc_host(&mut self, len: usize) -> Result<Self::Host>;
    /// Starts copying device elements `src` to `dst[dst_offset..]`.
    fn download(
        &mut self,
        src: Range<usize>,
        dst: &mut Self::Host,
        dst_offset: usize,
    ) -> Result<()>;
    /// Starts copying `src[src_range]` to device elements from `dst_offset`.
    fn upload(
        &mut self,
        src: &Self::Host,
        src_range: Range<usize>,
        dst_offset: usize,
    ) -> Result<()>;
    /// Starts, on the device: for `i` in `0..dst.len()`, element
    /// `dst.start + i` of the buffer becomes the reduction in rank order of
    /// `staged[k * stride + i]` for `k` in `0..n`, divided by `n` for
    /// [`ReduceOp::Mean`]. A download started after this call reads the
    /// reduced values.
    fn reduce_blocks(
        &mut self,
        staged: &Self::Host,
        n: usize,
        stride: usize,
        dst: Range<usize>,
        op: ReduceOp,
    ) -> Result<()>;
    /// Waits until every started download has landed.
    fn wait_downloads(&mut self) -> Result<()>;
    /// Waits until every started upload and reduction has finished.
    fn wait_uploads(&mut self) -> Result<()>;
}

/// A "device" buffer in ordinary memory: the CPU twin of the CUDA path.
///
/// ```
/// use prism_collective::{staged, GroupOptions, ProcessGroup, ReduceOp};
///
/// # fn main() -> Result<(), prism_collective::CollectiveError> {
/// let group = ProcessGroup::join(GroupOptions::new(0, 1, "127.0.0.1:0"))?;
/// let mut buf = staged::HostBuffer::new(vec![2.0f32; 10]);
/// staged::all_reduce(&group, &mut buf, ReduceOp::Mean)?;
/// assert_eq!(buf.into_inner(), vec![2.0f32; 10]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HostBuffer<T> {
    data: Vec<T>,
}

impl<T: Element> HostBuffer<T> {
    /// Wraps `data`.
    pub fn new(data: Vec<T>) -> Self {
        HostBuffer { data }
    }

    /// The data.
    pub fn into_inner(self) -> Vec<T> {
        self.data
    }
}

impl<T: Element> DeviceBuffer<T> for HostBuffer<T> {
    type Host = Vec<T>;

    fn len(&self) -> usize {
        self.data.len()
    }

    fn alloc_host(&mut self, len: usize) -> Result<Vec<T>> {
        Ok(vec![T::from_f64(0.0); len])
    }

    fn download(&mut self, src: Range<usize>, dst: &mut Vec<T>, dst_offset: usize) -> Result<()> {
        let len = src.len();
        dst[dst_offset..dst_offset + len].copy_from_slice(&self.data[src]);
        Ok(())
    }

    fn upload(&mut self, src: &Vec<T>, src_range: Range<usize>, dst_offset: usize) -> Result<()> {
        let len = src_range.len();
        self.data[dst_offset..dst_offset + len].copy_from_slice(&src[src_range]);
        Ok(())
    }

    fn reduce_blocks(
        &mut self,
        staged: &Vec<T>,
        n: usize,
        stride: usize,
        dst: Range<usize>,
        op: ReduceOp,
    ) -> Result<()> {
        let len = dst.len();
        let out = &mut self.data[dst];
        out.copy_from_slice(&staged[..len]);
        for k in 1..n {
            combine_into(out, &staged[k * stride..k * stride + len], op);
        }
        finish_mean(out, op, n);
        Ok(())
    }

    fn wait_downloads(&mut self) -> Result<()> {
        Ok(())
    }

    fn wait_uploads(&mut self) -> Result<()> {
        Ok(())
    }
}

fn piece_elements<T>(group: &ProcessGroup) -> usize {
    (group.config().device_chunk_bytes / std::mem::size_of::<T>()).max(1)
}

/// Starts copying piece `piece` of the buffer to `host`, block by block,
/// each block at `k * stride`.
fn download_blocks<T: Element, D: DeviceBuffer<T>>(
    dev: &mut D,
    piece: &Range<usize>,
    n: usize,
    stride: usize,
    host: &mut D::Host,
) -> Result<()> {
    for k in 0..n {
        let block = segment_range(piece.len(), n, k);
        let src = piece.start + block.start..piece.start + block.end;
        dev.download(src, host, k * stride)?;
    }
    Ok(())
}

/// All-reduce of a device buffer; every rank passes a buffer of the same
/// length. See the module docs for the steps.
pub fn all_reduce<T: Element, D: DeviceBuffer<T>>(
    group: &ProcessGroup,
    dev: &mut D,
    op: ReduceOp,
) -> Result<()> {
    let n = group.world_size();
    let rank = group.rank();
    if n == 1 || dev.is_empty() {
        return Ok(());
    }
    let piece_len = piece_elements::<T>(group).min(dev.len());
    let pieces: Vec<Range<usize>> = (0..dev.len())
        .step_by(piece_len)
        .map(|s| s..(s + piece_len).min(dev.len()))
        .collect();
    let stride = piece_len.div_ceil(n);
    let mut send = [dev.alloc_host(n * stride)?, dev.alloc_host(n * stride)?];
    let mut recv = dev.alloc_host(n * stride)?;
    let mut own = dev.alloc_host(stride)?;
    let mut gathered = dev.alloc_host(n * stride)?;
    download_blocks(dev, &pieces[0], n, stride, &mut send[0])?;
    for (i, piece) in pieces.iter().enumerate() {
        dev.wait_downloads()?;
        if let Some(next) = pieces.get(i + 1) {
            download_blocks(dev, next, n, stride, &mut send[(i + 1) % 2])?;
        }
        // `recv` and `gathered` are free once the previous piece's uploads
        // are done.
        dev.wait_uploads()?;
        group.all_to_all(&send[i % 2][..], &mut recv[..])?;
        let mine = segment_range(piece.len(), n, rank);
        let dst = piece.start + mine.start..piece.start + mine.end;
        dev.reduce_blocks(&recv, n, stride, dst.clone(), op)?;
        dev.download(dst, &mut own, 0)?;
        dev.wait_downloads()?;
        group.all_gather(&own[..], &mut gathered[..])?;
        for k in 0..n {
            let block = segment_range(piece.len(), n, k);
            if k != rank && !block.is_empty() {
                dev.upload(
                    &gathered,
                    k * stride..k * stride + block.len(),
                    piece.start + block.start,
                )?;
            }
        }
    }
    dev.wait_uploads()
}

/// Broadcast of a device buffer from `root`, piece by piece; the next
/// piece's copy to the host overlaps the current piece's network time.
pub fn broadcast<T: Element, D: DeviceBuffer<T>>(
    group: &ProcessGroup,
    dev: &mut D,
    root: usize,
) -> Result<()> {
    if group.world_size() == 1 || dev.is_empty() {
        // Still validates the root.
        return group.broadcast::<T>(&mut [], root);
    }
    let piece_len = piece_elements::<T>(group).min(dev.len());
    let pieces: Vec<Range<usize>> = (0..dev.len())
        .step_by(piece_len)
        .map(|s| s..(s + piece_len).min(dev.len()))
        .collect();
    let mut host = [dev.alloc_host(piece_len)?, dev.alloc_host(piece_len)?];
    let is_root = group.rank() == root;
    if is_root {
        dev.download(pieces[0].clone(), &mut host[0], 0)?;
    }
    for (i, piece) in pieces.iter().enumerate() {
        let len = piece.len();
        if is_root {
            dev.wait_downloads()?;
            if let Some(next) = pieces.get(i + 1) {
                dev.download(next.clone(), &mut host[(i + 1) % 2], 0)?;
            }
        } else {
            // This slot's upload from two pieces ago must be done.
            dev.wait_uploads()?;
        }
        group.broadcast(&mut host[i % 2][..len], root)?;
        if !is_root {
            dev.upload(&host[i % 2], 0..len, piece.start)?;
        }
    }
    dev.wait_uploads()
}
