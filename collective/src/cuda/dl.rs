//! Loading a shared library and exactly the functions Prism calls from it.
//!
//! [`dl_api!`] declares a table of function pointers; loading resolves each
//! one by name with `dlsym` and fails with the first one missing, naming it.
//! Nothing else in the library is touched, so a function that one CUDA
//! release removed (NVRTC 13 dropped `nvrtcGetNVVM`, for instance) cannot
//! break the functions that are still there.

use std::ffi::{c_void, CStr, CString};

/// An open library handle; closed when dropped.
#[derive(Debug)]
pub(crate) struct Library {
    handle: *mut c_void,
    /// The name it was opened by, for messages.
    pub(crate) name: String,
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

impl Library {
    /// Opens the first of `names` that loads, or says why none did.
    pub(crate) fn open_first(names: &[&str]) -> Result<Library, String> {
        let mut errors = Vec::new();
        for name in names {
            match Library::open(name) {
                Ok(lib) => return Ok(lib),
                Err(e) => errors.push(e),
            }
        }
        Err(errors.join("; "))
    }

    /// Opens one library by name or path.
    pub(crate) fn open(name: &str) -> Result<Library, String> {
        let c_name = CString::new(name).map_err(|_| format!("{name:?} contains a NUL byte"))?;
        // SAFETY: a valid C string; RTLD_LOCAL keeps its symbols out of the
        // global namespace.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(last_error().unwrap_or_else(|| format!("{name} could not be opened")));
        }
        Ok(Library {
            handle,
            name: name.to_string(),
        })
    }

    /// The address of `symbol`, or an error naming it and the library.
    pub(crate) fn symbol(&self, symbol: &str) -> Result<*mut c_void, String> {
        let c_symbol = CString::new(symbol).map_err(|_| format!("{symbol:?} contains a NUL"))?;
        // SAFETY: a live handle and a valid C string.
        let p = unsafe { libc::dlsym(self.handle, c_symbol.as_ptr()) };
        if p.is_null() {
            return Err(format!("{} has no function {symbol}", self.name));
        }
        Ok(p)
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: opened by dlopen; the function tables that point into it
        // are owned next to it and dropped with it.
        unsafe {
            libc::dlclose(self.handle);
        }
    }
}

fn last_error() -> Option<String> {
    // SAFETY: dlerror returns null or a thread-local C string.
    let p = unsafe { libc::dlerror() };
    (!p.is_null()).then(|| {
        // SAFETY: non-null, NUL-terminated per dlerror's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    })
}

/// Declares `struct $name { lib, fn pointers... }` with
/// `fn load(lib: Library) -> Result<$name, String>` resolving each listed
/// function by its symbol name.
macro_rules! dl_api {
    (
        $(#[$meta:meta])*
        pub(crate) struct $name:ident {
            $( $field:ident = $symbol:literal : fn($($arg:ty),* $(,)?) -> $ret:ty; )*
        }
    ) => {
        $(#[$meta])*
        pub(crate) struct $name {
            /// The library the functions live in; kept open while they are.
            pub(crate) lib: $crate::cuda::dl::Library,
            $( pub(crate) $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl $name {
            /// Every symbol of the table, in order.
            #[allow(dead_code)]
            pub(crate) const SYMBOLS: &'static [&'static str] = &[$($symbol),*];

            /// Resolves every function of the table in `lib`.
            pub(crate) fn load(lib: $crate::cuda::dl::Library) -> Result<$name, String> {
                $(
                    let $field = {
                        let p = lib.symbol($symbol)?;
                        // SAFETY: the symbol is the C function of this
                        // name, whose signature is the one declared here
                        // (from the vendor's headers).
                        unsafe {
                            std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p)
                        }
                    };
                )*
                Ok($name { lib, $( $field, )* })
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name)).field("lib", &self.lib.name).finish()
            }
        }
    };
}
pub(crate) use dl_api;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_naming_every_candidate() {
        let e = Library::open_first(&["libprism-no-such-a.so", "libprism-no-such-b.so"])
            .expect_err("neither exists");
        assert!(e.contains("libprism-no-such-a.so"), "{e}");
        assert!(e.contains("libprism-no-such-b.so"), "{e}");
    }

    #[test]
    fn symbols_resolve_one_by_one() {
        let lib = Library::open("libc.so.6").expect("glibc is loaded in every process");
        assert!(lib.symbol("strlen").is_ok());
        let e = lib.symbol("cuInit").expect_err("libc has no CUDA");
        assert_eq!(e, "libc.so.6 has no function cuInit");
    }
}
