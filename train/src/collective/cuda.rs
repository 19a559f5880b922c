//! Collectives on CUDA device buffers (feature `cuda`).
//!
//! [`CudaCollectives`] owns a CUDA context, two streams (device-to-host and
//! host-to-device plus kernels) and the reduction kernels, compiled at run
//! time with NVRTC for each element type. It runs the staged algorithms of
//! [`staged`] on a [`CudaSlice`]: pinned host staging, copies
//! on their own streams so they overlap the network, and the reduction on the
//! device.
//!
//! # Without a GPU
//!
//! The driver and NVRTC are loaded when [`CudaCollectives::new`] runs, not
//! at build time. On a machine without them it returns
//! [`CollectiveError::CudaUnavailable`]; nothing panics.
//!
//! # Not done yet
//!
//! Processes sharing one GPU still stage through host memory; exchanging
//! device buffers with CUDA IPC would skip two copies.

use super::element::{DataType, Element, ReduceOp};
use super::error::{CollectiveError, Result};
use super::group::ProcessGroup;
use super::staged::{self, DeviceBuffer};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

/// An element type the CUDA kernels handle.
pub trait CudaElement: Element + DeviceRepr + ValidAsZeroBits {}
impl CudaElement for f32 {}
impl CudaElement for f64 {}
impl CudaElement for half::f16 {}
impl CudaElement for half::bf16 {}
impl CudaElement for i32 {}
impl CudaElement for i64 {}
impl CudaElement for u8 {}

fn cuda_err(context: &'static str) -> impl Fn(result::DriverError) -> CollectiveError {
    move |e| CollectiveError::Cuda {
        context,
        detail: format!("{e:?}"),
    }
}

/// CUDA source of the reduction kernel for one element type: storage type,
/// accumulator type, load and store conversions. Integers accumulate in
/// unsigned types so that overflow wraps as on the host; half types round
/// after every step, as on the host.
fn kernel_source(dt: DataType) -> String {
    let (storage, acc, load, store, integer) = match dt {
        DataType::F32 => ("float", "float", "x", "x", false),
        DataType::F64 => ("double", "double", "x", "x", false),
        DataType::I32 => ("int", "unsigned int", "(unsigned int)x", "(int)x", true),
        DataType::I64 => (
            "long long",
            "unsigned long long",
            "(unsigned long long)x",
            "(long long)x",
            true,
        ),
        DataType::U8 => (
            "unsigned char",
            "unsigned int",
            "(unsigned int)x",
            "(unsigned char)x",
            true,
        ),
        DataType::F16 => (
            "unsigned short",
            "float",
            "f16_load(x)",
            "f16_store(x)",
            false,
        ),
        DataType::BF16 => (
            "unsigned short",
            "float",
            "bf16_load(x)",
            "bf16_store(x)",
            false,
        ),
    };
    // Signed min/max compare in the storage type.
    let (lt, gt) = if integer {
        ("((T)(b) < (T)(a))", "((T)(b) > (T)(a))")
    } else {
        ("((b) < (a))", "((b) > (a))")
    };
    format!(
        r#"
typedef {storage} T;
typedef {acc} A;
__device__ __forceinline__ float f16_load(unsigned short h) {{ float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }}
__device__ __forceinline__ unsigned short f16_store(float f) {{ unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }}
__device__ __forceinline__ float bf16_load(unsigned short h) {{ return __uint_as_float(((unsigned int)h) << 16); }}
__device__ __forceinline__ unsigned short bf16_store(float f) {{
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}}
__device__ __forceinline__ A load(T x) {{ return {load}; }}
__device__ __forceinline__ T store(A x) {{ return {store}; }}
__device__ __forceinline__ A combine(A a, A b, int op) {{
    switch (op) {{
        case 0: return a + b;
        case 1: return a * b;
        case 2: return {lt} ? b : a;
        default: return {gt} ? b : a;
    }}
}}
extern "C" __global__ void prism_reduce_blocks(T* out, const T* in, unsigned long long len,
        unsigned long long stride, unsigned int n, int op, int mean) {{
    unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += step) {{
        T acc = in[i];
        for (unsigned int k = 1; k < n; ++k) {{
            acc = store(combine(load(acc), load(in[k * stride + i]), op));
        }}
        if (mean) {{
            acc = store(load(acc) / (A)n);
        }}
        out[i] = acc;
    }}
}}
"#
    )
}

/// Pinned (page-locked) host memory, so device copies run asynchronously at
/// full speed. Not write-combined: the network path reads it with the CPU.
#[derive(Debug)]
pub struct PinnedHost<T> {
    ptr: *mut T,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: owned allocation, like a Box<[T]>.
unsafe impl<T: Send> Send for PinnedHost<T> {}

impl<T: CudaElement> PinnedHost<T> {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(cuda_err("binding the context"))?;
        let bytes = len.max(1) * std::mem::size_of::<T>();
        // SAFETY: a fresh allocation of `bytes`, zeroed before use; T is
        // valid as zero bits.
        let ptr = unsafe {
            let p = result::malloc_host(bytes, 0)
                .map_err(cuda_err("allocating pinned host memory"))? as *mut T;
            std::ptr::write_bytes(p as *mut u8, 0, bytes);
            p
        };
        Ok(PinnedHost {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }
}

impl<T> Deref for PinnedHost<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised elements owned by self.
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
        // A staged call that failed half-way may leave copies in flight into
        // or out of this memory: let the device finish before freeing it.
        let _ = self.ctx.synchronize();
        // SAFETY: allocated by malloc_host in `new`; nothing is in flight
        // after the synchronisation above.
        unsafe {
            let _ = result::free_host(self.ptr as *mut std::ffi::c_void);
        }
    }
}

/// CUDA context, streams and kernels for collectives on one device.
///
/// ```
/// # #[cfg(feature = "cuda")]
/// # {
/// use prism_train::collective::cuda::CudaCollectives;
/// match CudaCollectives::new(0) {
///     Ok(cuda) => println!("collectives on GPU {}", cuda.ordinal()),
///     Err(e) => println!("host buffers only: {e}"),
/// }
/// # }
/// ```
pub struct CudaCollectives {
    ctx: Arc<CudaContext>,
    d2h: Arc<CudaStream>,
    h2d: Arc<CudaStream>,
    kernels: HashMap<DataType, CudaFunction>,
}

impl std::fmt::Debug for CudaCollectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCollectives")
            .field("ordinal", &self.ctx.ordinal())
            .finish()
    }
}

impl CudaCollectives {
    /// Opens GPU `ordinal`. Fails with [`CollectiveError::CudaUnavailable`]
    /// when the driver or NVRTC cannot be loaded or the device does not
    /// exist.
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: these only try to open the libraries.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CollectiveError::CudaUnavailable {
                reason: "the NVIDIA driver library (libcuda.so) was not found".to_string(),
            });
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CollectiveError::CudaUnavailable {
                reason: "the CUDA runtime compiler (libnvrtc.so) was not found; install the cuda-nvrtc package".to_string(),
            });
        }
        // cudarc panics when a symbol is missing from an old driver; turn
        // that into the same error.
        let opened = std::panic::catch_unwind(|| -> std::result::Result<_, result::DriverError> {
            let ctx = CudaContext::new(ordinal)?;
            let d2h = ctx.new_stream()?;
            let h2d = ctx.new_stream()?;
            Ok((ctx, d2h, h2d))
        });
        let (ctx, d2h, h2d) = match opened {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                return Err(CollectiveError::CudaUnavailable {
                    reason: format!("device {ordinal} could not be opened ({e:?})"),
                })
            }
            Err(_) => {
                return Err(CollectiveError::CudaUnavailable {
                    reason:
                        "the driver library lacks a required function; update the NVIDIA driver"
                            .to_string(),
                })
            }
        };
        Ok(CudaCollectives {
            ctx,
            d2h,
            h2d,
            kernels: HashMap::new(),
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The context, to allocate buffers on.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn kernel(&mut self, dt: DataType) -> Result<CudaFunction> {
        if let Some(f) = self.kernels.get(&dt) {
            return Ok(f.clone());
        }
        let ptx =
            cudarc::nvrtc::compile_ptx(kernel_source(dt)).map_err(|e| CollectiveError::Cuda {
                context: "compiling the reduction kernel",
                detail: format!("{e:?}"),
            })?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(cuda_err("loading the reduction kernel"))?;
        let f = module
            .load_function("prism_reduce_blocks")
            .map_err(cuda_err("loading the reduction kernel"))?;
        self.kernels.insert(dt, f.clone());
        Ok(f)
    }

    /// `buf` seen through [`DeviceBuffer`], with this device's streams and
    /// the reduction kernel of its element type.
    fn device_buffer<'a, T: CudaElement>(
        &mut self,
        buf: &'a mut CudaSlice<T>,
    ) -> Result<CudaBuffer<'a, T>> {
        Ok(CudaBuffer {
            kernel: self.kernel(T::DATA_TYPE)?,
            buf,
            ctx: self.ctx.clone(),
            d2h: self.d2h.clone(),
            h2d: self.h2d.clone(),
            scratch: None,
        })
    }

    /// All-reduces `buf` over `group`; see [`staged::all_reduce`].
    pub fn all_reduce<T: CudaElement>(
        &mut self,
        group: &ProcessGroup,
        buf: &mut CudaSlice<T>,
        op: ReduceOp,
    ) -> Result<()> {
        staged::all_reduce(group, &mut self.device_buffer(buf)?, op)
    }

    /// Broadcasts `buf` from `root` over `group`; see [`staged::broadcast`].
    pub fn broadcast<T: CudaElement>(
        &mut self,
        group: &ProcessGroup,
        buf: &mut CudaSlice<T>,
        root: usize,
    ) -> Result<()> {
        staged::broadcast(group, &mut self.device_buffer(buf)?, root)
    }
}

/// One device buffer seen through [`DeviceBuffer`].
struct CudaBuffer<'a, T> {
    buf: &'a mut CudaSlice<T>,
    ctx: Arc<CudaContext>,
    d2h: Arc<CudaStream>,
    h2d: Arc<CudaStream>,
    kernel: CudaFunction,
    scratch: Option<CudaSlice<T>>,
}

impl<T: CudaElement> DeviceBuffer<T> for CudaBuffer<'_, T> {
    type Host = PinnedHost<T>;

    fn len(&self) -> usize {
        self.buf.len()
    }

    fn alloc_host(&mut self, len: usize) -> Result<PinnedHost<T>> {
        PinnedHost::new(&self.ctx, len)
    }

    fn download(
        &mut self,
        src: Range<usize>,
        dst: &mut PinnedHost<T>,
        dst_offset: usize,
    ) -> Result<()> {
        let len = src.len();
        if len == 0 {
            return Ok(());
        }
        let view = self.buf.slice(src);
        // `device_ptr` makes the copy stream wait for earlier kernels that
        // wrote this memory.
        let (ptr, _record) = view.device_ptr(&self.d2h);
        // SAFETY: the host range is pinned memory that stays alive and
        // untouched until `wait_downloads`.
        unsafe {
            result::memcpy_dtoh_async(
                &mut dst[dst_offset..dst_offset + len],
                ptr,
                self.d2h.cu_stream(),
            )
        }
        .map_err(cuda_err("copying device to host"))
    }

    fn upload(
        &mut self,
        src: &PinnedHost<T>,
        src_range: Range<usize>,
        dst_offset: usize,
    ) -> Result<()> {
        let len = src_range.len();
        if len == 0 {
            return Ok(());
        }
        let mut view = self.buf.slice_mut(dst_offset..dst_offset + len);
        let (ptr, _record) = view.device_ptr_mut(&self.h2d);
        // SAFETY: as for `download`, until `wait_uploads`.
        unsafe { result::memcpy_htod_async(ptr, &src[src_range], self.h2d.cu_stream()) }
            .map_err(cuda_err("copying host to device"))
    }

    fn reduce_blocks(
        &mut self,
        staged: &PinnedHost<T>,
        n: usize,
        stride: usize,
        dst: Range<usize>,
        op: ReduceOp,
    ) -> Result<()> {
        let len = dst.len();
        if len == 0 {
            return Ok(());
        }
        if !matches!(&self.scratch, Some(s) if s.len() >= n * stride) {
            // SAFETY: every element read by the kernel is uploaded first.
            let s = unsafe { self.h2d.alloc::<T>(n * stride) }
                .map_err(cuda_err("allocating device scratch"))?;
            self.scratch = Some(s);
        }
        let Some(scratch) = self.scratch.as_mut() else {
            unreachable!("allocated above")
        };
        {
            let (ptr, _record) = scratch.device_ptr_mut(&self.h2d);
            // SAFETY: pinned source alive until `wait_uploads`.
            unsafe { result::memcpy_htod_async(ptr, &staged[..n * stride], self.h2d.cu_stream()) }
                .map_err(cuda_err("copying blocks to the device"))?;
        }
        let code: i32 = match op {
            ReduceOp::Sum | ReduceOp::Mean => 0,
            ReduceOp::Product => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
        };
        let mean = i32::from(op == ReduceOp::Mean);
        let (len64, stride64, n32) = (len as u64, stride as u64, n as u32);
        let mut out = self.buf.slice_mut(dst);
        let scratch = &*scratch;
        let mut launch = self.h2d.launch_builder(&self.kernel);
        launch
            .arg(&mut out)
            .arg(scratch)
            .arg(&len64)
            .arg(&stride64)
            .arg(&n32)
            .arg(&code)
            .arg(&mean);
        let cfg = LaunchConfig::for_num_elems(len.min(1 << 24) as u32);
        // SAFETY: the argument list matches the kernel's signature, and the
        // kernel stays within `len` elements of `out` and `n * stride` of
        // the scratch.
        unsafe { launch.launch(cfg) }.map_err(cuda_err("launching the reduction kernel"))?;
        Ok(())
    }

    fn wait_downloads(&mut self) -> Result<()> {
        self.d2h
            .synchronize()
            .map_err(cuda_err("waiting for device-to-host copies"))
    }

    fn wait_uploads(&mut self) -> Result<()> {
        self.h2d
            .synchronize()
            .map_err(cuda_err("waiting for host-to-device copies"))
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

    #[test]
    fn every_type_has_a_kernel_source() {
        for dt in [
            DataType::F32,
            DataType::F64,
            DataType::F16,
            DataType::BF16,
            DataType::I32,
            DataType::I64,
            DataType::U8,
        ] {
            let src = kernel_source(dt);
            assert!(src.contains("prism_reduce_blocks"), "{dt}");
        }
    }
}
