//! Collectives on CUDA device buffers (feature `cuda`).
//!
//! [`CudaCollectives`] opens one GPU and runs all-reduce and broadcast on
//! its memory ([`DeviceMemory`], or a raw device address such as a PyTorch
//! tensor's) over a host [`ProcessGroup`]. Per group it picks one of two
//! paths, at the group's first call, the same on every rank:
//!
//! - **Same GPU** (every rank on this host uses the same GPU, up to 16
//!   ranks): rank 0 maps the others' buffers through CUDA IPC and one
//!   kernel reduces them all and writes every rank's result; two small
//!   host exchanges per call. No byte goes through host memory.
//! - **Host staging** (otherwise): the pieces go through pinned host memory
//!   and the group's transport, with the reduction on the device (see
//!   [`staged`](crate::staged)).
//!
//! Several GPUs of one node served by NCCL are not built yet: such groups
//! take host staging.
//!
//! # Drivers
//!
//! Nothing CUDA is linked at build time. The driver (`libcuda.so.1`) and the
//! run-time compiler NVRTC (`libnvrtc.so.13`, `.12` or `.11.2`) are opened
//! at run time, and only the functions Prism calls are looked up, one by
//! one, so one build works with CUDA 11.x, 12.x and 13.x drivers. Without a
//! driver or a GPU, or with a library that lacks a needed function, every
//! entry point returns [`CollectiveError::CudaUnavailable`] with the reason;
//! nothing panics. `PRISM_CUDA_DRIVER_LIB` and `PRISM_CUDA_NVRTC_LIB` name
//! other libraries to load.
//!
//! # Ordering with other GPU work
//!
//! Calls run on the context's legacy default stream, which orders itself
//! after earlier work of every blocking stream of the context (PyTorch's
//! default stream included), and return once the result is in place.

mod dl;
mod driver;
mod ipc;
mod kernels;
mod nvrtc;

use super::element::{DataType, Element, ReduceOp};
use super::error::{CollectiveError, Result};
use super::group::ProcessGroup;
use super::staged::{self, DeviceBuffer};
use driver::{CuDevicePtr, Device, Event, RawMemory, Stream};
use ipc::{IpcPath, Setup};
use kernels::Kernels;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

/// An element type the CUDA kernels handle: every [`Element`].
pub trait CudaElement: Element {}
impl<T: Element> CudaElement for T {}

/// `len` elements of `T` in device memory, freed when dropped.
///
/// ```
/// # fn main() -> Result<(), prism_collective::CollectiveError> {
/// use prism_collective::cuda::CudaCollectives;
/// let Ok(cuda) = CudaCollectives::new(0) else { return Ok(()) }; // no GPU here
/// let mem = cuda.to_device(&[1.0f32, 2.0, 3.0])?;
/// assert_eq!(mem.to_vec()?, [1.0, 2.0, 3.0]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct DeviceMemory<T> {
    raw: RawMemory,
    len: usize,
    _elements: PhantomData<T>,
}

impl<T: CudaElement> DeviceMemory<T> {
    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the first element.
    pub fn device_ptr(&self) -> u64 {
        self.raw.ptr
    }

    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    fn stream(&self) -> Stream {
        Stream::legacy(&self.raw.device)
    }

    /// Copies the elements to a new host vector.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::from_f64(0.0); self.len];
        let stream = self.stream();
        let device = &self.raw.device;
        device.bind()?;
        // SAFETY: `out` holds `len` elements; the copy is waited for below.
        device.check(
            unsafe {
                (device.driver.memcpy_dtoh_async)(
                    out.as_mut_ptr() as *mut std::ffi::c_void,
                    self.raw.ptr,
                    self.bytes(),
                    stream.raw,
                )
            },
            "copying device to host",
        )?;
        stream.synchronize()?;
        Ok(out)
    }

    /// Overwrites the elements with `src`, which must have the same length.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(CollectiveError::BufferLength {
                op: super::error::OpKind::Broadcast,
                expected: self.len,
                actual: src.len(),
            });
        }
        let stream = self.stream();
        let device = &self.raw.device;
        device.bind()?;
        // SAFETY: `src` holds `len` elements and outlives the wait below.
        device.check(
            unsafe {
                (device.driver.memcpy_htod_async)(
                    self.raw.ptr,
                    src.as_ptr() as *const std::ffi::c_void,
                    self.bytes(),
                    stream.raw,
                )
            },
            "copying host to device",
        )?;
        stream.synchronize()
    }

    /// Overwrites the elements with another device buffer's, of the same
    /// length, and waits for the copy.
    pub fn copy_from_device(&mut self, src: &DeviceMemory<T>) -> Result<()> {
        if src.len != self.len {
            return Err(CollectiveError::BufferLength {
                op: super::error::OpKind::Broadcast,
                expected: self.len,
                actual: src.len,
            });
        }
        let stream = self.stream();
        let device = &self.raw.device;
        device.bind()?;
        // SAFETY: both hold `bytes` bytes on this device.
        device.check(
            unsafe {
                (device.driver.memcpy_dtod_async)(
                    self.raw.ptr,
                    src.raw.ptr,
                    self.bytes(),
                    stream.raw,
                )
            },
            "copying device to device",
        )?;
        stream.synchronize()
    }
}

/// Which path a group's device collectives take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaPath {
    /// Every rank shares this GPU: device memory through CUDA IPC.
    SameGpu,
    /// Pieces staged through pinned host memory, for the reason given.
    HostStaged {
        /// Why the same-GPU path was not taken.
        reason: String,
    },
}

impl std::fmt::Display for CudaPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaPath::SameGpu => f.write_str("same-gpu ipc"),
            CudaPath::HostStaged { reason } => write!(f, "host-staged ({reason})"),
        }
    }
}

enum GroupPath {
    Ipc(Box<IpcPath>),
    Staged(String),
}

/// A CUDA context's collectives on one device.
///
/// ```
/// # #[cfg(feature = "cuda")]
/// # {
/// use prism_collective::cuda::CudaCollectives;
/// match CudaCollectives::new(0) {
///     Ok(cuda) => println!("collectives on GPU {} ({})", cuda.ordinal(), cuda.device_name()),
///     Err(e) => println!("host buffers only: {e}"),
/// }
/// # }
/// ```
pub struct CudaCollectives {
    device: Arc<Device>,
    /// Host staging: device-to-host copies, and host-to-device copies plus
    /// kernels.
    d2h: Stream,
    h2d: Stream,
    /// Recorded on the caller's (legacy) stream before host staging, so
    /// the staging streams wait for the caller's work on the buffer.
    caller_done: Event,
    /// Recorded on `h2d` after a reduction kernel, so that the download of
    /// the reduced range on `d2h` reads the kernel's result.
    reduced: Event,
    kernels: HashMap<DataType, Kernels>,
    groups: HashMap<u64, GroupPath>,
    pinned: Arc<PinnedPool>,
    scratch: Option<RawMemory>,
}

impl std::fmt::Debug for CudaCollectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCollectives")
            .field("ordinal", &self.device.ordinal)
            .field("name", &self.device.name)
            .finish()
    }
}

impl CudaCollectives {
    /// Opens GPU `ordinal` (numbered as under `CUDA_VISIBLE_DEVICES`).
    /// Fails with [`CollectiveError::CudaUnavailable`] when the driver
    /// cannot be loaded or used or the device does not exist.
    pub fn new(ordinal: usize) -> Result<Self> {
        let device = Device::open(ordinal)?;
        Ok(CudaCollectives {
            d2h: Stream::new(&device)?,
            h2d: Stream::new(&device)?,
            caller_done: Event::new(&device)?,
            reduced: Event::new(&device)?,
            pinned: Arc::new(PinnedPool {
                device: device.clone(),
                free: Mutex::new(Vec::new()),
            }),
            device,
            kernels: HashMap::new(),
            groups: HashMap::new(),
            scratch: None,
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal
    }

    /// The device's name, as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.device.name
    }

    /// The driver's CUDA version, as (major, minor).
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        self.device.driver.version()
    }

    /// The run-time compiler's (NVRTC's) version, as (major, minor).
    pub fn compiler_version(&self) -> Result<(i32, i32)> {
        Ok(nvrtc::nvrtc()?.version_pair())
    }

    /// Allocates `len` zeroed elements on the device.
    pub fn alloc_zeroed<T: CudaElement>(&self, len: usize) -> Result<DeviceMemory<T>> {
        let bytes = len * std::mem::size_of::<T>();
        let raw = RawMemory::alloc(&self.device, bytes)?;
        let stream = Stream::legacy(&self.device);
        // SAFETY: `bytes` of fresh device memory.
        self.device.check(
            unsafe { (self.device.driver.memset_d8_async)(raw.ptr, 0, bytes, stream.raw) },
            "zeroing device memory",
        )?;
        stream.synchronize()?;
        Ok(DeviceMemory {
            raw,
            len,
            _elements: PhantomData,
        })
    }

    /// Copies `data` into new device memory.
    pub fn to_device<T: CudaElement>(&self, data: &[T]) -> Result<DeviceMemory<T>> {
        let raw = RawMemory::alloc(&self.device, std::mem::size_of_val(data))?;
        let mut mem = DeviceMemory {
            raw,
            len: data.len(),
            _elements: PhantomData,
        };
        mem.copy_from_host(data)?;
        Ok(mem)
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.device.synchronize()
    }

    fn kernels(&mut self, dt: DataType) -> Result<&Kernels> {
        if !self.kernels.contains_key(&dt) {
            let k = Kernels::load(&self.device, dt)?;
            self.kernels.insert(dt, k);
        }
        Ok(&self.kernels[&dt])
    }

    /// The path `group`'s calls take, set up on first use: a collective
    /// call the first time, every rank of the group must make it.
    fn ensure_path(&mut self, group: &ProcessGroup) -> Result<&mut GroupPath> {
        if !self.groups.contains_key(&group.id()) {
            let path = if group.world_size() == 1 {
                GroupPath::Staged("a group of one needs no exchange".to_string())
            } else if !group.config().cuda_ipc {
                GroupPath::Staged("PRISM_COLLECTIVE_CUDA_IPC is off".to_string())
            } else {
                match IpcPath::establish(&self.device, group)? {
                    Setup::Ready(path) => GroupPath::Ipc(path),
                    Setup::Refused(why) => {
                        tracing::info!("cuda collectives stage through host memory: {why}");
                        GroupPath::Staged(why)
                    }
                }
            };
            self.groups.insert(group.id(), path);
        }
        Ok(self
            .groups
            .get_mut(&group.id())
            .unwrap_or_else(|| unreachable!("inserted above")))
    }

    /// The path `group` takes; sets it up if this is the group's first
    /// device call (every rank must then call too).
    pub fn path(&mut self, group: &ProcessGroup) -> Result<CudaPath> {
        Ok(match self.ensure_path(group)? {
            GroupPath::Ipc(_) => CudaPath::SameGpu,
            GroupPath::Staged(reason) => CudaPath::HostStaged {
                reason: reason.clone(),
            },
        })
    }

    /// All-reduces `buf` over `group`, in place.
    pub fn all_reduce<T: CudaElement>(
        &mut self,
        group: &ProcessGroup,
        buf: &mut DeviceMemory<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_device(&buf.raw)?;
        // SAFETY: `buf` is `len` elements of T on this device (checked).
        unsafe { self.all_reduce_raw(group, buf.raw.ptr, buf.len, T::DATA_TYPE, op) }
    }

    /// Broadcasts `root`'s `buf` to every rank of `group`.
    pub fn broadcast<T: CudaElement>(
        &mut self,
        group: &ProcessGroup,
        buf: &mut DeviceMemory<T>,
        root: usize,
    ) -> Result<()> {
        self.check_device(&buf.raw)?;
        // SAFETY: as for `all_reduce`.
        unsafe { self.broadcast_raw(group, buf.raw.ptr, buf.len, T::DATA_TYPE, root) }
    }

    fn check_device(&self, raw: &RawMemory) -> Result<()> {
        if raw.device.ordinal != self.device.ordinal {
            return Err(CollectiveError::Cuda {
                context: "checking the buffer's device",
                detail: format!(
                    "the buffer is on GPU {} but these collectives on GPU {}",
                    raw.device.ordinal, self.device.ordinal
                ),
            });
        }
        Ok(())
    }

    /// All-reduces `len` elements of type `dt` at device address `ptr`, in
    /// place: the entry point for memory Prism did not allocate, such as a
    /// contiguous PyTorch tensor's.
    ///
    /// # Safety
    /// `ptr` must address `len` elements of `dt` in this device's primary
    /// context, valid for the whole call.
    pub unsafe fn all_reduce_raw(
        &mut self,
        group: &ProcessGroup,
        ptr: u64,
        len: usize,
        dt: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        if group.world_size() == 1 {
            // The mean of one rank is its own value; this validates `op`.
            return group.all_reduce::<u8>(&mut [], op);
        }
        self.run_raw(group, ptr, len, dt, Some(op), 0)
    }

    /// Broadcasts `len` elements of `dt` at `ptr` from `root`.
    ///
    /// # Safety
    /// As for [`all_reduce_raw`](Self::all_reduce_raw).
    pub unsafe fn broadcast_raw(
        &mut self,
        group: &ProcessGroup,
        ptr: u64,
        len: usize,
        dt: DataType,
        root: usize,
    ) -> Result<()> {
        if group.world_size() == 1 || root >= group.world_size() {
            // Validates the root.
            return group.broadcast::<u8>(&mut [], root);
        }
        self.run_raw(group, ptr, len, dt, None, root)
    }

    /// An all-reduce with `op`, or a broadcast from `root` when `op` is
    /// `None`: on the group's same-GPU path when it has one and every
    /// rank's buffer can be shared, else staged through host memory.
    ///
    /// # Safety
    /// As for [`all_reduce_raw`](Self::all_reduce_raw).
    unsafe fn run_raw(
        &mut self,
        group: &ProcessGroup,
        ptr: u64,
        len: usize,
        dt: DataType,
        op: Option<ReduceOp>,
        root: usize,
    ) -> Result<()> {
        self.kernels(dt)?;
        self.ensure_path(group)?;
        let kernels = &self.kernels[&dt];
        if let Some(GroupPath::Ipc(path)) = self.groups.get_mut(&group.id()) {
            if path.run(group, kernels, ptr, len, dt, op, root)? {
                return Ok(());
            }
        }
        let mut staging = self.staging(ptr, len, dt)?;
        match op {
            Some(op) => dispatch_staged!(dt, staging, |buf| staged::all_reduce(group, buf, op)),
            None => dispatch_staged!(dt, staging, |buf| staged::broadcast(group, buf, root)),
        }
    }

    /// The host-staging view of `len` elements at `ptr`, its streams
    /// ordered after the caller's earlier work.
    fn staging(&mut self, ptr: CuDevicePtr, len: usize, dt: DataType) -> Result<Staging<'_>> {
        self.caller_done.record(&Stream::legacy(&self.device))?;
        self.d2h.wait(self.caller_done.raw)?;
        self.h2d.wait(self.caller_done.raw)?;
        Ok(Staging {
            ptr,
            len,
            elem: dt.size_bytes(),
            device: &self.device,
            d2h: &self.d2h,
            h2d: &self.h2d,
            reduced: &self.reduced,
            kernels: &self.kernels[&dt],
            pinned: &self.pinned,
            scratch: &mut self.scratch,
        })
    }
}

/// Runs `$body` with `$staging` typed as the `DeviceBuffer` of `$dt`'s
/// element type.
macro_rules! dispatch_staged {
    ($dt:expr, $staging:ident, |$buf:ident| $body:expr) => {
        match $dt {
            DataType::F32 => {
                let $buf = &mut Typed::<f32>::new(&mut $staging);
                $body
            }
            DataType::F64 => {
                let $buf = &mut Typed::<f64>::new(&mut $staging);
                $body
            }
            DataType::F16 => {
                let $buf = &mut Typed::<half::f16>::new(&mut $staging);
                $body
            }
            DataType::BF16 => {
                let $buf = &mut Typed::<half::bf16>::new(&mut $staging);
                $body
            }
            DataType::I32 => {
                let $buf = &mut Typed::<i32>::new(&mut $staging);
                $body
            }
            DataType::I64 => {
                let $buf = &mut Typed::<i64>::new(&mut $staging);
                $body
            }
            DataType::U8 => {
                let $buf = &mut Typed::<u8>::new(&mut $staging);
                $body
            }
        }
    };
}
use dispatch_staged;

/// Pinned host blocks kept for reuse: allocating page-locked memory costs
/// far more than a small collective.
#[derive(Debug)]
struct PinnedPool {
    device: Arc<Device>,
    free: Mutex<Vec<(usize, usize)>>,
}

impl PinnedPool {
    /// A block of at least `bytes`, zeroed when fresh.
    fn take(&self, bytes: usize) -> Result<(usize, usize)> {
        let mut free = self.free.lock();
        if let Some(i) = free
            .iter()
            .enumerate()
            .filter(|(_, &(_, size))| size >= bytes)
            .min_by_key(|(_, &(_, size))| size)
            .map(|(i, _)| i)
        {
            return Ok(free.swap_remove(i));
        }
        drop(free);
        let size = bytes.max(4096);
        self.device.bind()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer to `size` fresh bytes.
        self.device.check(
            unsafe { (self.device.driver.mem_alloc_host)(&mut p, size) },
            "allocating pinned host memory",
        )?;
        // SAFETY: `size` bytes just allocated.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, size) };
        Ok((p as usize, size))
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        // Copies into or out of these blocks may still be in flight after a
        // call failed half-way.
        let _ = self.device.synchronize();
        for (p, _) in self.free.get_mut().drain(..) {
            // SAFETY: allocated by mem_alloc_host in `take`.
            unsafe {
                (self.device.driver.mem_free_host)(p as *mut std::ffi::c_void);
            }
        }
    }
}

/// Pinned host memory for `len` elements, back to the pool when dropped.
#[derive(Debug)]
pub struct PinnedHost<T> {
    ptr: *mut T,
    len: usize,
    size: usize,
    pool: Arc<PinnedPool>,
}

// SAFETY: owned memory, like a Box<[T]>.
unsafe impl<T: Send> Send for PinnedHost<T> {}

impl<T> Deref for PinnedHost<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised elements (zeroed when fresh; T is a
        // plain number type) owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T> DerefMut for PinnedHost<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T> Drop for PinnedHost<T> {
    fn drop(&mut self) {
        self.pool.free.lock().push((self.ptr as usize, self.size));
    }
}

/// A raw device range seen by the host-staging algorithms.
struct Staging<'a> {
    ptr: CuDevicePtr,
    len: usize,
    elem: usize,
    device: &'a Arc<Device>,
    d2h: &'a Stream,
    h2d: &'a Stream,
    reduced: &'a Event,
    kernels: &'a Kernels,
    pinned: &'a Arc<PinnedPool>,
    scratch: &'a mut Option<RawMemory>,
}

/// [`Staging`] with its element type.
struct Typed<'s, 'a, T> {
    s: &'s mut Staging<'a>,
    _t: PhantomData<T>,
}

impl<'s, 'a, T> Typed<'s, 'a, T> {
    fn new(s: &'s mut Staging<'a>) -> Self {
        Typed { s, _t: PhantomData }
    }
}

impl<T: CudaElement> DeviceBuffer<T> for Typed<'_, '_, T> {
    type Host = PinnedHost<T>;

    fn len(&self) -> usize {
        self.s.len
    }

    fn alloc_host(&mut self, len: usize) -> Result<PinnedHost<T>> {
        let bytes = len * std::mem::size_of::<T>();
        let (p, size) = self.s.pinned.take(bytes)?;
        Ok(PinnedHost {
            ptr: p as *mut T,
            len,
            size,
            pool: self.s.pinned.clone(),
        })
    }

    fn download(
        &mut self,
        src: Range<usize>,
        dst: &mut PinnedHost<T>,
        dst_offset: usize,
    ) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let e = self.s.elem;
        let host = dst[dst_offset..dst_offset + src.len()].as_mut_ptr();
        // SAFETY: the host range is pinned memory alive and untouched until
        // `wait_downloads`; the device range is within the buffer.
        self.s.device.check(
            unsafe {
                (self.s.device.driver.memcpy_dtoh_async)(
                    host as *mut std::ffi::c_void,
                    self.s.ptr + (src.start * e) as u64,
                    src.len() * e,
                    self.s.d2h.raw,
                )
            },
            "copying device to host",
        )
    }

    fn upload(
        &mut self,
        src: &PinnedHost<T>,
        src_range: Range<usize>,
        dst_offset: usize,
    ) -> Result<()> {
        if src_range.is_empty() {
            return Ok(());
        }
        let e = self.s.elem;
        let bytes = src_range.len() * e;
        let host = src[src_range].as_ptr();
        // SAFETY: as for `download`, until `wait_uploads`.
        self.s.device.check(
            unsafe {
                (self.s.device.driver.memcpy_htod_async)(
                    self.s.ptr + (dst_offset * e) as u64,
                    host as *const std::ffi::c_void,
                    bytes,
                    self.s.h2d.raw,
                )
            },
            "copying host to device",
        )
    }

    fn reduce_blocks(
        &mut self,
        staged: &PinnedHost<T>,
        n: usize,
        stride: usize,
        dst: Range<usize>,
        op: ReduceOp,
    ) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let e = self.s.elem;
        let bytes = n * stride * e;
        if !matches!(&*self.s.scratch, Some(s) if s.bytes >= bytes) {
            // The previous scratch may still be read by a kernel.
            self.s.h2d.synchronize()?;
            *self.s.scratch = Some(RawMemory::alloc(self.s.device, bytes)?);
        }
        let Some(scratch) = self.s.scratch.as_ref() else {
            unreachable!("allocated above")
        };
        // SAFETY: pinned source alive until `wait_uploads`; scratch holds
        // `bytes`; the kernel stays within `dst` and `n * stride`.
        unsafe {
            self.s.device.check(
                (self.s.device.driver.memcpy_htod_async)(
                    scratch.ptr,
                    staged.as_ptr() as *const std::ffi::c_void,
                    bytes,
                    self.s.h2d.raw,
                ),
                "copying blocks to the device",
            )?;
            self.s.kernels.reduce_strided(
                self.s.h2d,
                self.s.ptr + (dst.start * e) as u64,
                scratch.ptr,
                dst.len(),
                stride,
                n,
                op,
            )?;
        }
        // The reduced range is read next by a download on the other stream.
        self.s.reduced.record(self.s.h2d)?;
        self.s.d2h.wait(self.s.reduced.raw)
    }

    fn wait_downloads(&mut self) -> Result<()> {
        self.s.d2h.synchronize()
    }

    fn wait_uploads(&mut self) -> Result<()> {
        self.s.h2d.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_opening_a_device_is_an_error_not_a_panic() {
        match CudaCollectives::new(0) {
            Ok(cuda) => assert_eq!(cuda.ordinal(), 0),
            Err(e) => assert!(
                matches!(e, CollectiveError::CudaUnavailable { .. }),
                "{e:?}"
            ),
        }
    }
}
