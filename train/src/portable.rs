//! Functions that travel between the processes of one job.
//!
//! Prism's workers run the driver's own executable, so a plain `fn` item has
//! the same place in every process of a job, up to where the loader put the
//! program. A [`PortableFn`] records a function as its distance from an
//! anchor function of this crate, together with the identity of the
//! executable file, and turns back into the same function in a worker. This
//! is how [`crate::Trainer`] sends the training loop and
//! [`crate::data::Dataset::map_batches`] sends a batch function: as plain
//! `fn` items, the way a Ray user passes a Python function.
//!
//! Closures that capture nothing coerce to `fn` pointers and work too; a
//! closure that captures state does not coerce, and the compiler says so.
//! Pass such state as data instead (the Trainer's `train_loop_config`).
//!
//! ```
//! use prism_train::portable::PortableFn;
//!
//! fn double(x: u32) -> u32 {
//!     x * 2
//! }
//!
//! let token = PortableFn::new(double as fn(u32) -> u32);
//! // The token is plain data: it serializes, and in another process of the
//! // same executable it resolves to `double`.
//! let f: fn(u32) -> u32 = token.resolve()?;
//! assert_eq!(f(21), 42);
//! # Ok::<(), prism_train::portable::PortableFnError>(())
//! ```

use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::OnceLock;

/// Why a [`PortableFn`] could not be turned back into a function.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortableFnError {
    /// The token was made by another executable (or another build of it).
    #[error(
        "this function was sent by another program ({sent}) than the one running here \
         ({here}); workers must run the driver's own executable, so rebuild and restart \
         the job rather than mixing builds"
    )]
    OtherExecutable {
        /// The identity of the sender's executable.
        sent: String,
        /// The identity of this process's executable.
        here: String,
    },
}

/// A function pointer of type `F` (a `fn(..) -> ..` type), as data that
/// can cross to another process of the same executable.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct PortableFn<F> {
    offset: i64,
    exe: String,
    #[serde(skip)]
    _f: PhantomData<fn() -> F>,
}

impl<F> Clone for PortableFn<F> {
    fn clone(&self) -> Self {
        PortableFn {
            offset: self.offset,
            exe: self.exe.clone(),
            _f: PhantomData,
        }
    }
}

impl<F> std::fmt::Debug for PortableFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortableFn")
            .field("type", &std::any::type_name::<F>())
            .field("offset", &self.offset)
            .field("exe", &self.exe)
            .finish()
    }
}

/// The function every offset is measured from.
#[inline(never)]
fn anchor() -> u64 {
    0x5052_4953_4d00_0001
}

fn anchor_addr() -> i64 {
    let f: fn() -> u64 = anchor;
    f as usize as i64
}

/// Identity of this process's executable file: device, inode, size and
/// modification time, so that a rebuilt binary is told apart.
fn exe_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata("/proc/self/exe") {
            Ok(m) => format!(
                "{}:{}:{}:{}.{}",
                m.dev(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec()
            ),
            Err(_) => String::from("unknown executable"),
        }
    })
}

impl<F: Copy + 'static> PortableFn<F> {
    /// Records `f`, which must be a function pointer type (`fn(A) -> R`).
    ///
    /// # Panics
    ///
    /// If `F` is not the size of a function pointer (a closure type or a
    /// reference was given instead of a `fn` pointer): a programming error
    /// that the first call shows.
    pub fn new(f: F) -> Self {
        assert_eq!(
            std::mem::size_of::<F>(),
            std::mem::size_of::<fn()>(),
            "PortableFn::new takes a fn pointer (write `my_fn as fn(..) -> ..`), not {}",
            std::any::type_name::<F>()
        );
        // SAFETY: F is pointer-sized and, by this type's contract, a fn
        // pointer; reading its bits as an address is what `as usize` does.
        let addr: usize = unsafe { std::mem::transmute_copy(&f) };
        PortableFn {
            offset: addr as i64 - anchor_addr(),
            exe: exe_identity().to_string(),
            _f: PhantomData,
        }
    }

    /// The function this token names, in this process.
    ///
    /// # Errors
    ///
    /// [`PortableFnError::OtherExecutable`] if the token came from a process
    /// running another executable file.
    pub fn resolve(&self) -> Result<F, PortableFnError> {
        if self.exe != exe_identity() {
            return Err(PortableFnError::OtherExecutable {
                sent: self.exe.clone(),
                here: exe_identity().to_string(),
            });
        }
        let addr = (anchor_addr() + self.offset) as usize;
        // SAFETY: the same executable file is mapped here, and the loader
        // moves all of its code by one offset, so `addr` is the address of
        // the function that `new` recorded, which had type F.
        Ok(unsafe { std::mem::transmute_copy(&addr) })
    }
}
