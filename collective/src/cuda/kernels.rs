//! The reduction and gather kernels: CUDA C compiled once per element type
//! with NVRTC, loaded into the device's context, launched on a stream.

use super::driver::{CuDevicePtr, CuFunction, CuModule, Device, Stream};
use super::nvrtc::nvrtc;
use crate::element::{DataType, ReduceOp};
use crate::error::Result;
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// Most buffers one kernel launch reads from: the largest world the
/// same-GPU path serves.
pub(crate) const MAX_POINTERS: usize = 16;

/// CUDA source of the kernels for one element type: storage type,
/// accumulator type, load and store conversions. Integers accumulate in
/// unsigned types so that overflow wraps as on the host; half types round
/// after every step, as on the host.
pub(crate) fn kernel_source(dt: DataType) -> String {
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
#define MAXP {MAX_POINTERS}
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
__device__ __forceinline__ T finish(T acc, unsigned int n, int mean) {{
    return mean ? store(load(acc) / (A)n) : acc;
}}
/* out[j][i] = the reduction, in order, of in[k][i], for every j < n_out:
   one process reduces every rank's buffer and writes every rank's result. */
struct Ptrs {{ const T* p[MAXP]; }};
struct OutPtrs {{ T* p[MAXP]; }};
extern "C" __global__ void prism_reduce_all(Ptrs in, OutPtrs out, unsigned int n_in,
        unsigned int n_out, unsigned long long len, int op, int mean) {{
    unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += step) {{
        T acc = in.p[0][i];
        for (unsigned int k = 1; k < n_in; ++k) {{
            acc = store(combine(load(acc), load(in.p[k][i]), op));
        }}
        acc = finish(acc, n_in, mean);
        for (unsigned int j = 0; j < n_out; ++j) {{
            out.p[j][i] = acc;
        }}
    }}
}}
/* out[i] = the reduction of in[k * stride + i] for k < n (host staging). */
extern "C" __global__ void prism_reduce_strided(T* out, const T* in, unsigned long long len,
        unsigned long long stride, unsigned int n, int op, int mean) {{
    unsigned long long step = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += step) {{
        T acc = in[i];
        for (unsigned int k = 1; k < n; ++k) {{
            acc = store(combine(load(acc), load(in[k * stride + i]), op));
        }}
        out[i] = finish(acc, n, mean);
    }}
}}
"#
    )
}

/// The operation code the kernels switch on, and whether to divide by `n`.
pub(crate) fn op_code(op: ReduceOp) -> (i32, i32) {
    let code = match op {
        ReduceOp::Sum | ReduceOp::Mean => 0,
        ReduceOp::Product => 1,
        ReduceOp::Min => 2,
        ReduceOp::Max => 3,
    };
    (code, i32::from(op == ReduceOp::Mean))
}

/// The kernel arguments `Ptrs` and `OutPtrs`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Ptrs(pub(crate) [CuDevicePtr; MAX_POINTERS]);

/// One element type's kernels, loaded into a device's context.
#[derive(Debug)]
pub(crate) struct Kernels {
    device: Arc<Device>,
    module: CuModule,
    reduce_all: CuFunction,
    reduce_strided: CuFunction,
}

// SAFETY: module and function handles may be used from any thread.
unsafe impl Send for Kernels {}
unsafe impl Sync for Kernels {}

const THREADS: u32 = 256;

impl Kernels {
    /// Compiles and loads the kernels of `dt` on `device`.
    pub(crate) fn load(device: &Arc<Device>, dt: DataType) -> Result<Kernels> {
        let compiler = nvrtc()?;
        let source = kernel_source(dt);
        // PTX for the device's own architecture when this NVRTC knows it,
        // else for Turing (the oldest that NVRTC 13 still targets), which
        // the driver compiles for any newer GPU.
        let (major, minor) = device.compute_capability;
        let own = (major * 10 + minor).max(0) as u32;
        let ptx = match compiler.compile(&source, own) {
            Ok(ptx) => ptx,
            Err(first) if own != 75 => compiler.compile(&source, 75).map_err(|_| first)?,
            Err(first) => return Err(first),
        };
        device.bind()?;
        let driver = device.driver;
        let mut module = std::ptr::null_mut();
        // SAFETY: NUL-terminated PTX text.
        device.check(
            unsafe { (driver.module_load_data)(&mut module, ptx.as_ptr() as *const c_void) },
            "loading the reduction kernels",
        )?;
        let function = |name: &str| -> Result<CuFunction> {
            let c_name = CString::new(name).unwrap_or_default();
            let mut f = std::ptr::null_mut();
            // SAFETY: a loaded module and a valid name.
            device.check(
                unsafe { (driver.module_get_function)(&mut f, module, c_name.as_ptr()) },
                "finding a reduction kernel",
            )?;
            Ok(f)
        };
        let loaded = (|| {
            Ok::<_, crate::error::CollectiveError>((
                function("prism_reduce_all")?,
                function("prism_reduce_strided")?,
            ))
        })();
        let (reduce_all, reduce_strided) = match loaded {
            Ok(fs) => fs,
            Err(e) => {
                // SAFETY: loaded above, unused.
                unsafe {
                    (driver.module_unload)(module);
                }
                return Err(e);
            }
        };
        Ok(Kernels {
            device: device.clone(),
            module,
            reduce_all,
            reduce_strided,
        })
    }

    fn blocks(&self, len: usize) -> u32 {
        let wanted = len.div_ceil(THREADS as usize).max(1);
        let cap = self.device.multiprocessors as usize * 8;
        wanted.min(cap).max(1) as u32
    }

    fn launch(
        &self,
        f: CuFunction,
        grid: (u32, u32),
        stream: &Stream,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: `args` point at values matching the kernel's parameters,
        // alive for the call (the driver copies them at launch).
        let code = unsafe {
            (self.device.driver.launch_kernel)(
                f,
                grid.0,
                grid.1,
                1,
                THREADS,
                1,
                1,
                0,
                stream.raw,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.device.check(code, "launching a collective kernel")
    }

    /// For every `out` in `outputs`: `out[i]` = the reduction, in order,
    /// of `inputs[k][i]` (a copy when there is one input).
    ///
    /// # Safety
    /// Every pointer addresses `len` elements of this kernel's type on (or
    /// mapped into) the device, alive until the stream has run the kernel;
    /// outputs overlap no input but the one at their own position.
    pub(crate) unsafe fn reduce_all(
        &self,
        stream: &Stream,
        inputs: &[CuDevicePtr],
        outputs: &[CuDevicePtr],
        len: usize,
        op: ReduceOp,
    ) -> Result<()> {
        if len == 0 || outputs.is_empty() {
            return Ok(());
        }
        assert!(
            !inputs.is_empty() && inputs.len() <= MAX_POINTERS && outputs.len() <= MAX_POINTERS
        );
        let mut ins = Ptrs([0; MAX_POINTERS]);
        ins.0[..inputs.len()].copy_from_slice(inputs);
        let mut outs = Ptrs([0; MAX_POINTERS]);
        outs.0[..outputs.len()].copy_from_slice(outputs);
        let (mut n_in, mut n_out) = (inputs.len() as u32, outputs.len() as u32);
        let mut len64 = len as u64;
        let (mut code, mut mean) = op_code(op);
        let mut args = [
            &mut ins as *mut _ as *mut c_void,
            &mut outs as *mut _ as *mut c_void,
            &mut n_in as *mut _ as *mut c_void,
            &mut n_out as *mut _ as *mut c_void,
            &mut len64 as *mut _ as *mut c_void,
            &mut code as *mut _ as *mut c_void,
            &mut mean as *mut _ as *mut c_void,
        ];
        self.launch(self.reduce_all, (self.blocks(len), 1), stream, &mut args)
    }

    /// `out[i]` = the reduction of `staged[k * stride + i]` for `k < n`.
    ///
    /// # Safety
    /// `out` holds `len` elements and `staged` `n * stride`, alive until
    /// the stream has run the kernel.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce_strided(
        &self,
        stream: &Stream,
        out: CuDevicePtr,
        staged: CuDevicePtr,
        len: usize,
        stride: usize,
        n: usize,
        op: ReduceOp,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (mut out, mut staged) = (out, staged);
        let (mut len64, mut stride64, mut n32) = (len as u64, stride as u64, n as u32);
        let (mut code, mut mean) = op_code(op);
        let mut args = [
            &mut out as *mut _ as *mut c_void,
            &mut staged as *mut _ as *mut c_void,
            &mut len64 as *mut _ as *mut c_void,
            &mut stride64 as *mut _ as *mut c_void,
            &mut n32 as *mut _ as *mut c_void,
            &mut code as *mut _ as *mut c_void,
            &mut mean as *mut _ as *mut c_void,
        ];
        self.launch(
            self.reduce_strided,
            (self.blocks(len), 1),
            stream,
            &mut args,
        )
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        let _ = self.device.bind();
        // SAFETY: loaded in `load`; the functions die with it.
        unsafe {
            (self.device.driver.module_unload)(self.module);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_its_kernels() {
        for dt in DataType::ALL {
            let src = kernel_source(dt);
            for name in ["prism_reduce_all", "prism_reduce_strided"] {
                assert!(src.contains(name), "{dt}: {name}");
            }
        }
    }

    #[test]
    fn kernel_arguments_have_the_c_layout() {
        assert_eq!(std::mem::size_of::<Ptrs>(), 8 * MAX_POINTERS);
    }
}
