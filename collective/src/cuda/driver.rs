//! The CUDA driver API, loaded at run time: only the functions Prism calls,
//! each resolved by name, so one build runs on CUDA 11.x, 12.x and 13.x
//! drivers. Every failure becomes a [`CollectiveError`], never a panic.

use super::dl::{dl_api, Library};
use crate::error::{CollectiveError, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Arc, OnceLock};

pub(crate) type CuResult = c_int;
pub(crate) type CuDevice = c_int;
pub(crate) type CuDevicePtr = u64;
pub(crate) type CuContext = *mut c_void;
pub(crate) type CuStream = *mut c_void;
pub(crate) type CuEvent = *mut c_void;
pub(crate) type CuModule = *mut c_void;
pub(crate) type CuFunction = *mut c_void;

/// `CUipcMemHandle` (and `CUipcEventHandle`, of the same shape): 64 opaque
/// bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IpcHandle(pub(crate) [u8; 64]);

pub(crate) const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub(crate) const CU_EVENT_INTERPROCESS: c_uint = 0x4;
pub(crate) const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
const POINTER_ATTRIBUTE_BUFFER_ID: c_int = 7;
const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const ATTR_COMPUTE_CAPABILITY_MINOR: c_int = 76;

dl_api! {
    /// The driver functions Prism uses (names as exported by libcuda; the
    /// `_v2` ones exist since CUDA 11.0).
    pub(crate) struct Driver {
        init = "cuInit": fn(c_uint) -> CuResult;
        driver_get_version = "cuDriverGetVersion": fn(*mut c_int) -> CuResult;
        get_error_name = "cuGetErrorName": fn(CuResult, *mut *const c_char) -> CuResult;
        device_get_count = "cuDeviceGetCount": fn(*mut c_int) -> CuResult;
        device_get = "cuDeviceGet": fn(*mut CuDevice, c_int) -> CuResult;
        device_get_name = "cuDeviceGetName": fn(*mut c_char, c_int, CuDevice) -> CuResult;
        device_get_attribute = "cuDeviceGetAttribute": fn(*mut c_int, c_int, CuDevice) -> CuResult;
        device_get_pci_bus_id = "cuDeviceGetPCIBusId": fn(*mut c_char, c_int, CuDevice) -> CuResult;
        primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut CuContext, CuDevice) -> CuResult;
        primary_ctx_release = "cuDevicePrimaryCtxRelease_v2": fn(CuDevice) -> CuResult;
        ctx_set_current = "cuCtxSetCurrent": fn(CuContext) -> CuResult;
        ctx_synchronize = "cuCtxSynchronize": fn() -> CuResult;
        stream_create = "cuStreamCreate": fn(*mut CuStream, c_uint) -> CuResult;
        stream_destroy = "cuStreamDestroy_v2": fn(CuStream) -> CuResult;
        stream_synchronize = "cuStreamSynchronize": fn(CuStream) -> CuResult;
        stream_wait_event = "cuStreamWaitEvent": fn(CuStream, CuEvent, c_uint) -> CuResult;
        event_create = "cuEventCreate": fn(*mut CuEvent, c_uint) -> CuResult;
        event_record = "cuEventRecord": fn(CuEvent, CuStream) -> CuResult;
        event_destroy = "cuEventDestroy_v2": fn(CuEvent) -> CuResult;
        mem_alloc = "cuMemAlloc_v2": fn(*mut CuDevicePtr, usize) -> CuResult;
        mem_free = "cuMemFree_v2": fn(CuDevicePtr) -> CuResult;
        mem_alloc_host = "cuMemAllocHost_v2": fn(*mut *mut c_void, usize) -> CuResult;
        mem_free_host = "cuMemFreeHost": fn(*mut c_void) -> CuResult;
        memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(CuDevicePtr, *const c_void, usize, CuStream) -> CuResult;
        memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2": fn(*mut c_void, CuDevicePtr, usize, CuStream) -> CuResult;
        memcpy_dtod_async = "cuMemcpyDtoDAsync_v2": fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult;
        memset_d8_async = "cuMemsetD8Async": fn(CuDevicePtr, u8, usize, CuStream) -> CuResult;
        module_load_data = "cuModuleLoadData": fn(*mut CuModule, *const c_void) -> CuResult;
        module_get_function = "cuModuleGetFunction": fn(*mut CuFunction, CuModule, *const c_char) -> CuResult;
        module_unload = "cuModuleUnload": fn(CuModule) -> CuResult;
        launch_kernel = "cuLaunchKernel": fn(CuFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CuStream, *mut *mut c_void, *mut *mut c_void) -> CuResult;
        mem_get_address_range = "cuMemGetAddressRange_v2": fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult;
        pointer_get_attribute = "cuPointerGetAttribute": fn(*mut c_void, c_int, CuDevicePtr) -> CuResult;
        ipc_get_mem_handle = "cuIpcGetMemHandle": fn(*mut IpcHandle, CuDevicePtr) -> CuResult;
        ipc_open_mem_handle = "cuIpcOpenMemHandle_v2": fn(*mut CuDevicePtr, IpcHandle, c_uint) -> CuResult;
        ipc_close_mem_handle = "cuIpcCloseMemHandle": fn(CuDevicePtr) -> CuResult;
        ipc_get_event_handle = "cuIpcGetEventHandle": fn(*mut IpcHandle, CuEvent) -> CuResult;
        ipc_open_event_handle = "cuIpcOpenEventHandle": fn(*mut CuEvent, IpcHandle) -> CuResult;
    }
}

/// The library names tried, in order (`PRISM_CUDA_DRIVER_LIB` first when
/// set).
const DRIVER_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

impl Driver {
    /// Opens `names` in turn, resolves the table and runs `cuInit`.
    pub(crate) fn open(names: &[&str]) -> std::result::Result<Driver, String> {
        let lib = Library::open_first(names)
            .map_err(|e| format!("the NVIDIA driver library could not be loaded ({e})"))?;
        let driver = Driver::load(lib).map_err(|e| {
            format!("{e}: the driver is older than CUDA 11.0 or not NVIDIA's; update the driver")
        })?;
        // SAFETY: resolved from the driver with this signature.
        let code = unsafe { (driver.init)(0) };
        if code != 0 {
            return Err(format!(
                "cuInit failed with {} (no usable GPU, or the kernel module and the library differ in version)",
                driver.error_name(code)
            ));
        }
        Ok(driver)
    }

    /// The driver's name for a result code, such as `CUDA_ERROR_OUT_OF_MEMORY`.
    pub(crate) fn error_name(&self, code: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the driver writes a static string's address or leaves null.
        let ok = unsafe { (self.get_error_name)(code, &mut p) } == 0 && !p.is_null();
        if ok {
            // SAFETY: a static NUL-terminated string owned by the driver.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            format!("CUresult {code}")
        }
    }

    /// `Ok` for `CUDA_SUCCESS`, else the named error.
    pub(crate) fn check(&self, code: CuResult, context: &'static str) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(CollectiveError::Cuda {
                context,
                detail: self.error_name(code),
            })
        }
    }

    /// The driver's CUDA version as (major, minor).
    pub(crate) fn version(&self) -> Result<(i32, i32)> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check(
            unsafe { (self.driver_get_version)(&mut v) },
            "asking the driver version",
        )?;
        Ok((v / 1000, (v % 1000) / 10))
    }
}

static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();

/// The process's driver, loaded on first use; `CudaUnavailable` with the
/// reason when there is none. `PRISM_CUDA_DRIVER_LIB` names the library to
/// load instead of `libcuda.so.1`.
pub(crate) fn driver() -> Result<&'static Driver> {
    DRIVER
        .get_or_init(|| match std::env::var("PRISM_CUDA_DRIVER_LIB") {
            Ok(path) => Driver::open(&[path.as_str()]),
            Err(_) => Driver::open(DRIVER_NAMES),
        })
        .as_ref()
        .map_err(|reason| CollectiveError::CudaUnavailable {
            reason: reason.clone(),
        })
}

/// One GPU's primary context (the one PyTorch and the CUDA runtime use),
/// retained while this lives.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) driver: &'static Driver,
    pub(crate) device: CuDevice,
    pub(crate) ordinal: usize,
    ctx: CuContext,
    pub(crate) name: String,
    pub(crate) pci_bus_id: String,
    pub(crate) multiprocessors: u32,
    pub(crate) compute_capability: (i32, i32),
}

// SAFETY: a CUDA context may be made current on any thread; Device only
// hands it to the driver.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

impl Device {
    /// Opens GPU `ordinal` (as numbered under `CUDA_VISIBLE_DEVICES`).
    pub(crate) fn open(ordinal: usize) -> Result<Arc<Device>> {
        Device::open_with(driver()?, ordinal)
    }

    /// Opens GPU `ordinal` of `driver`.
    pub(crate) fn open_with(driver: &'static Driver, ordinal: usize) -> Result<Arc<Device>> {
        let unavailable = |reason: String| CollectiveError::CudaUnavailable { reason };
        let mut count = 0;
        // SAFETY: writes one int.
        driver.check(
            unsafe { (driver.device_get_count)(&mut count) },
            "counting devices",
        )?;
        if ordinal >= count.max(0) as usize {
            return Err(unavailable(format!(
                "there is no GPU {ordinal}: the driver sees {count} (check CUDA_VISIBLE_DEVICES)"
            )));
        }
        let mut device = 0;
        // SAFETY: writes one device handle.
        driver.check(
            unsafe { (driver.device_get)(&mut device, ordinal as c_int) },
            "opening the device",
        )?;
        let text = |f: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult| {
            let mut buf = [0 as c_char; 128];
            // SAFETY: the driver writes a NUL-terminated string of at most
            // the given length.
            let code = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int - 1, device) };
            if code != 0 {
                return String::new();
            }
            // SAFETY: NUL-terminated, within the buffer (zeroed beyond).
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        };
        let name = text(driver.device_get_name);
        let pci_bus_id = text(driver.device_get_pci_bus_id);
        let attribute = |attr| {
            let mut v = 0;
            // SAFETY: writes one int.
            let code = unsafe { (driver.device_get_attribute)(&mut v, attr, device) };
            if code == 0 {
                v
            } else {
                0
            }
        };
        let multiprocessors = attribute(ATTR_MULTIPROCESSOR_COUNT).max(1) as u32;
        let compute_capability = (
            attribute(ATTR_COMPUTE_CAPABILITY_MAJOR),
            attribute(ATTR_COMPUTE_CAPABILITY_MINOR),
        );
        let mut ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        let code = unsafe { (driver.primary_ctx_retain)(&mut ctx, device) };
        if code != 0 {
            return Err(unavailable(format!(
                "GPU {ordinal} could not be opened ({})",
                driver.error_name(code)
            )));
        }
        let dev = Device {
            driver,
            device,
            ordinal,
            ctx,
            name,
            pci_bus_id,
            multiprocessors,
            compute_capability,
        };
        dev.bind()?;
        Ok(Arc::new(dev))
    }

    /// Makes the context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: a retained context.
        self.driver.check(
            unsafe { (self.driver.ctx_set_current)(self.ctx) },
            "making the context current",
        )
    }

    /// Waits for all work of the context.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments.
        self.driver.check(
            unsafe { (self.driver.ctx_synchronize)() },
            "synchronising the device",
        )
    }

    /// Checks a driver result.
    pub(crate) fn check(&self, code: CuResult, context: &'static str) -> Result<()> {
        self.driver.check(code, context)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: retained in `open`.
        unsafe {
            (self.driver.primary_ctx_release)(self.device);
        }
    }
}

/// A stream of the device: created non-blocking, or the legacy default
/// stream (`null`), which orders itself with every other blocking stream of
/// the context, PyTorch's default stream included.
#[derive(Debug)]
pub(crate) struct Stream {
    pub(crate) raw: CuStream,
    owned: bool,
    pub(crate) device: Arc<Device>,
}

// SAFETY: streams may be used from any thread.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// A new non-blocking stream.
    pub(crate) fn new(device: &Arc<Device>) -> Result<Stream> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one stream handle.
        device.check(
            unsafe { (device.driver.stream_create)(&mut raw, CU_STREAM_NON_BLOCKING) },
            "creating a stream",
        )?;
        Ok(Stream {
            raw,
            owned: true,
            device: device.clone(),
        })
    }

    /// The legacy default stream.
    pub(crate) fn legacy(device: &Arc<Device>) -> Stream {
        Stream {
            raw: std::ptr::null_mut(),
            owned: false,
            device: device.clone(),
        }
    }

    /// Blocks until the stream's work is done.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: a live stream.
        self.device.check(
            unsafe { (self.device.driver.stream_synchronize)(self.raw) },
            "waiting for a stream",
        )
    }

    /// Makes later work on this stream wait for `event`'s latest record.
    pub(crate) fn wait(&self, event: CuEvent) -> Result<()> {
        // SAFETY: live stream and event.
        self.device.check(
            unsafe { (self.device.driver.stream_wait_event)(self.raw, event, 0) },
            "making a stream wait for an event",
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: created in `new`; the driver waits for pending work.
            unsafe {
                (self.device.driver.stream_destroy)(self.raw);
            }
        }
    }
}

/// An event of this process.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) raw: CuEvent,
    device: Arc<Device>,
}

// SAFETY: events may be used from any thread.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// A new event without timing.
    pub(crate) fn new(device: &Arc<Device>) -> Result<Event> {
        Event::create(device, CU_EVENT_DISABLE_TIMING, "creating an event")
    }

    /// A new event that other processes can open
    /// ([`ipc_handle`](Self::ipc_handle), [`open_ipc`](Self::open_ipc)) to
    /// make their streams wait for its records.
    pub(crate) fn interprocess(device: &Arc<Device>) -> Result<Event> {
        Event::create(
            device,
            CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS,
            "creating an interprocess event",
        )
    }

    fn create(device: &Arc<Device>, flags: c_uint, context: &'static str) -> Result<Event> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one event handle.
        device.check(
            unsafe { (device.driver.event_create)(&mut raw, flags) },
            context,
        )?;
        Ok(Event {
            raw,
            device: device.clone(),
        })
    }

    /// The handle another process opens this event with (an event made
    /// by [`interprocess`](Self::interprocess)).
    pub(crate) fn ipc_handle(&self) -> Result<IpcHandle> {
        let mut h = IpcHandle([0; 64]);
        // SAFETY: writes 64 bytes; a live event.
        self.device.check(
            unsafe { (self.device.driver.ipc_get_event_handle)(&mut h, self.raw) },
            "exporting an event",
        )?;
        Ok(h)
    }

    /// Opens a peer's interprocess event.
    pub(crate) fn open_ipc(device: &Arc<Device>, handle: IpcHandle) -> Result<Event> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one event handle; the handle came from a peer.
        device.check(
            unsafe { (device.driver.ipc_open_event_handle)(&mut raw, handle) },
            "opening a peer's event",
        )?;
        Ok(Event {
            raw,
            device: device.clone(),
        })
    }

    /// Records the event at the current end of `stream`.
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: live event and stream.
        self.device.check(
            unsafe { (self.device.driver.event_record)(self.raw, stream.raw) },
            "recording an event",
        )
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created or opened by this struct.
        unsafe {
            (self.device.driver.event_destroy)(self.raw);
        }
    }
}

/// The allocation that holds device address `ptr`: an id unique for the
/// process's lifetime (a freed and reallocated range gets a new one), its
/// base address and its size.
pub(crate) fn allocation_of(
    device: &Device,
    ptr: CuDevicePtr,
) -> Result<(u64, CuDevicePtr, usize)> {
    let mut id = 0u64;
    // SAFETY: the attribute is one unsigned 64-bit integer.
    device.check(
        unsafe {
            (device.driver.pointer_get_attribute)(
                &mut id as *mut u64 as *mut c_void,
                POINTER_ATTRIBUTE_BUFFER_ID,
                ptr,
            )
        },
        "identifying a buffer's allocation (is it device memory of this GPU?)",
    )?;
    let (mut base, mut size) = (0, 0);
    // SAFETY: writes an address and a size.
    device.check(
        unsafe { (device.driver.mem_get_address_range)(&mut base, &mut size, ptr) },
        "finding a buffer's allocation",
    )?;
    Ok((id, base, size))
}

/// Exports the allocation whose base address is `base`.
pub(crate) fn export(device: &Device, base: CuDevicePtr) -> Result<IpcHandle> {
    let mut h = IpcHandle([0; 64]);
    // SAFETY: writes 64 bytes; `base` is an allocation's base.
    device.check(
        unsafe { (device.driver.ipc_get_mem_handle)(&mut h, base) },
        "exporting device memory",
    )?;
    Ok(h)
}

/// Raw device memory: allocated here, or a peer's opened through IPC.
#[derive(Debug)]
pub(crate) struct RawMemory {
    pub(crate) ptr: CuDevicePtr,
    pub(crate) bytes: usize,
    ipc_opened: bool,
    pub(crate) device: Arc<Device>,
}

// SAFETY: device addresses are plain numbers usable from any thread.
unsafe impl Send for RawMemory {}
unsafe impl Sync for RawMemory {}

impl RawMemory {
    /// Allocates `bytes` (at least one) on the device.
    pub(crate) fn alloc(device: &Arc<Device>, bytes: usize) -> Result<RawMemory> {
        device.bind()?;
        let mut ptr = 0;
        // SAFETY: writes one address.
        device.check(
            unsafe { (device.driver.mem_alloc)(&mut ptr, bytes.max(1)) },
            "allocating device memory",
        )?;
        Ok(RawMemory {
            ptr,
            bytes,
            ipc_opened: false,
            device: device.clone(),
        })
    }

    /// Maps a peer's exported allocation of `bytes`.
    pub(crate) fn open_ipc(
        device: &Arc<Device>,
        handle: IpcHandle,
        bytes: usize,
    ) -> Result<RawMemory> {
        device.bind()?;
        let mut ptr = 0;
        // SAFETY: writes one address; the handle came from a peer.
        device.check(
            unsafe {
                (device.driver.ipc_open_mem_handle)(
                    &mut ptr,
                    handle,
                    CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
                )
            },
            "opening a peer's device memory",
        )?;
        Ok(RawMemory {
            ptr,
            bytes,
            ipc_opened: true,
            device: device.clone(),
        })
    }

    /// The handle another process maps this allocation with.
    pub(crate) fn ipc_handle(&self) -> Result<IpcHandle> {
        export(&self.device, self.ptr)
    }
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        let _ = self.device.bind();
        // SAFETY: allocated or opened by this struct; callers synchronise
        // before dropping memory that work may still touch.
        unsafe {
            if self.ipc_opened {
                (self.device.driver.ipc_close_mem_handle)(self.ptr);
            } else {
                (self.device.driver.mem_free)(self.ptr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_that_lacks_a_driver_function_is_refused_by_name_without_a_panic() {
        // glibc stands in for a driver build that lacks functions: loading
        // stops at the first missing one and says which.
        let e = Driver::open(&["libc.so.6"]).expect_err("libc is no driver");
        assert!(e.contains("has no function cuInit"), "{e}");
        assert!(e.contains("update the driver"), "{e}");
    }

    /// Builds a stand-in driver library exporting every function of the
    /// table but `missing`, each returning success and writing nothing.
    fn fake_driver(missing: Option<&str>) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "prism-fake-cuda-{}-{}",
            std::process::id(),
            missing.unwrap_or("none")
        ));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let mut c = String::new();
        for symbol in Driver::SYMBOLS {
            if Some(*symbol) != missing {
                c.push_str(&format!("int {symbol}(void) {{ return 0; }}\n"));
            }
        }
        let src = dir.join("fake.c");
        let lib = dir.join("libfakecuda.so");
        std::fs::write(&src, c).expect("writing the C file");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&src)
            .status()
            .expect("a C compiler (cc) builds the stand-in driver");
        assert!(status.success(), "cc failed");
        lib
    }

    #[test]
    fn a_driver_missing_one_function_is_refused_naming_it() {
        for missing in ["cuIpcOpenMemHandle_v2", "cuLaunchKernel"] {
            let lib = fake_driver(Some(missing));
            let e = Driver::open(&[lib.to_str().expect("utf-8 path")])
                .expect_err("a function is missing");
            assert!(e.contains(&format!("has no function {missing}")), "{e}");
        }
    }

    #[test]
    fn a_driver_with_every_function_but_no_gpu_is_unavailable_not_a_panic() {
        let lib = fake_driver(None);
        let driver =
            Driver::open(&[lib.to_str().expect("utf-8 path")]).expect("every function is there");
        let driver: &'static Driver = Box::leak(Box::new(driver));
        match Device::open_with(driver, 0) {
            Err(CollectiveError::CudaUnavailable { reason }) => {
                assert!(reason.contains("there is no GPU 0"), "{reason}")
            }
            other => panic!("expected CudaUnavailable, got {other:?}"),
        }
        assert_eq!(driver.error_name(700), "CUresult 700");
    }

    #[test]
    fn no_library_at_all_is_an_error() {
        let e = Driver::open(&["libprism-no-such-cuda.so"]).expect_err("absent");
        assert!(e.contains("could not be loaded"), "{e}");
    }
}
