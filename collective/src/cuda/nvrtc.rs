//! NVRTC, CUDA's run-time compiler, loaded at run time like the driver: it
//! turns the reduction kernels' CUDA C into PTX, which the driver then
//! compiles for the GPU at hand.

use super::dl::{dl_api, Library};
use crate::error::{CollectiveError, Result};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

type NvrtcResult = c_int;
type Program = *mut c_void;

dl_api! {
    /// The NVRTC functions Prism uses (stable since CUDA 7).
    pub(crate) struct Nvrtc {
        version = "nvrtcVersion": fn(*mut c_int, *mut c_int) -> NvrtcResult;
        create_program = "nvrtcCreateProgram": fn(*mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> NvrtcResult;
        compile_program = "nvrtcCompileProgram": fn(Program, c_int, *const *const c_char) -> NvrtcResult;
        get_ptx_size = "nvrtcGetPTXSize": fn(Program, *mut usize) -> NvrtcResult;
        get_ptx = "nvrtcGetPTX": fn(Program, *mut c_char) -> NvrtcResult;
        get_log_size = "nvrtcGetProgramLogSize": fn(Program, *mut usize) -> NvrtcResult;
        get_log = "nvrtcGetProgramLog": fn(Program, *mut c_char) -> NvrtcResult;
        destroy_program = "nvrtcDestroyProgram": fn(*mut Program) -> NvrtcResult;
    }
}

/// Newest first: a newer NVRTC knows newer GPUs.
const NVRTC_NAMES: &[&str] = &[
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
    "libnvrtc.so",
];

static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();

/// The process's NVRTC, loaded on first use. `PRISM_CUDA_NVRTC_LIB` names
/// the library to load instead.
pub(crate) fn nvrtc() -> Result<&'static Nvrtc> {
    NVRTC
        .get_or_init(|| {
            let lib = match std::env::var("PRISM_CUDA_NVRTC_LIB") {
                Ok(path) => Library::open(&path),
                Err(_) => Library::open_first(NVRTC_NAMES),
            }
            .map_err(|e| {
                format!(
                    "the CUDA runtime compiler could not be loaded ({e}); install NVRTC \
                     (pip's nvidia-cuda-nvrtc, or the toolkit's cuda-nvrtc package) and put \
                     its folder on LD_LIBRARY_PATH"
                )
            })?;
            Nvrtc::load(lib)
        })
        .as_ref()
        .map_err(|reason| CollectiveError::CudaUnavailable {
            reason: reason.clone(),
        })
}

impl Nvrtc {
    /// Compiles `source` to PTX for virtual architecture `compute_{arch}`;
    /// the error carries the compiler's log.
    pub(crate) fn compile(&self, source: &str, arch: u32) -> Result<Vec<u8>> {
        let fail = |detail: String| CollectiveError::Cuda {
            context: "compiling the reduction kernels",
            detail,
        };
        let src = CString::new(source).map_err(|_| fail("source contains a NUL".into()))?;
        let name = CString::new("prism_collective.cu").map_err(|_| fail("name".into()))?;
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid C strings, no headers.
        let code = unsafe {
            (self.create_program)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if code != 0 {
            return Err(fail(format!("nvrtcCreateProgram returned {code}")));
        }
        let result = self.compile_program_to_ptx(prog, arch);
        // SAFETY: created above.
        unsafe {
            (self.destroy_program)(&mut prog);
        }
        result.map_err(fail)
    }

    fn compile_program_to_ptx(
        &self,
        prog: Program,
        arch: u32,
    ) -> std::result::Result<Vec<u8>, String> {
        let arch_flag = CString::new(format!("--gpu-architecture=compute_{arch}"))
            .map_err(|_| "arch".to_string())?;
        let options = [arch_flag.as_ptr()];
        // SAFETY: a live program and valid option strings.
        let code =
            unsafe { (self.compile_program)(prog, options.len() as c_int, options.as_ptr()) };
        if code != 0 {
            return Err(format!(
                "nvrtcCompileProgram returned {code} for compute_{arch}: {}",
                self.log(prog)
            ));
        }
        let mut size = 0usize;
        // SAFETY: writes one size.
        if unsafe { (self.get_ptx_size)(prog, &mut size) } != 0 {
            return Err("nvrtcGetPTXSize failed".into());
        }
        let mut ptx = vec![0u8; size.max(1)];
        // SAFETY: `size` bytes, NUL included.
        if unsafe { (self.get_ptx)(prog, ptx.as_mut_ptr() as *mut c_char) } != 0 {
            return Err("nvrtcGetPTX failed".into());
        }
        if ptx.last() != Some(&0) {
            ptx.push(0);
        }
        Ok(ptx)
    }

    fn log(&self, prog: Program) -> String {
        let mut size = 0usize;
        // SAFETY: writes one size.
        if unsafe { (self.get_log_size)(prog, &mut size) } != 0 || size == 0 {
            return String::new();
        }
        let mut log = vec![0u8; size];
        // SAFETY: `size` bytes.
        if unsafe { (self.get_log)(prog, log.as_mut_ptr() as *mut c_char) } != 0 {
            return String::new();
        }
        String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string()
    }

    /// NVRTC's own version, as (major, minor).
    pub(crate) fn version_pair(&self) -> (i32, i32) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        unsafe {
            (self.version)(&mut major, &mut minor);
        }
        (major, minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_without_nvrtc_is_refused_by_name() {
        let lib = Library::open("libc.so.6").expect("glibc");
        let e = Nvrtc::load(lib).expect_err("libc has no NVRTC");
        assert_eq!(e, "libc.so.6 has no function nvrtcVersion");
    }
}
