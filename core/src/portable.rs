//! Functions that travel between the processes of one job.
//!
//! Prism's workers run the driver's own executable, so a plain `fn` item has
//! the same place in every process of a job, up to where the loader put the
//! program. A [`PortableFn`] records a function as its distance from an
//! anchor function of this crate, together with the identity of the
//! program (its build id, the same for the copies other nodes run), and
//! turns back into the same function in a worker. This
//! is how prism-train's `Trainer` sends the training loop and its datasets'
//! `map_batches` sends a batch function: as plain `fn` items, the way a Ray
//! user passes a Python function.
//!
//! Closures that capture nothing coerce to `fn` pointers and work too; a
//! closure that captures state does not coerce, and the compiler says so.
//! Pass such state as data instead (the Trainer's `train_loop_config`).
//!
//! ```
//! use prism::portable::PortableFn;
//!
//! fn double(x: u32) -> u32 {
//!     x * 2
//! }
//!
//! let token = PortableFn::new(double as fn(u32) -> u32);
//! // The token is plain data: it serializes, and in another process of the
//! // same executable it resolves to `double`.
//! let text = serde_json::to_string(&token)?;
//! let token: PortableFn<fn(u32) -> u32> = serde_json::from_str(&text)?;
//! // SAFETY: the token was made by PortableFn::new in this program.
//! let f = unsafe { token.resolve() }?;
//! assert_eq!(f(21), 42);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use serde::{Deserialize, Serialize};
use std::marker::PhantomData;

/// Why a [`PortableFn`] could not be turned back into a function.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortableFnError {
    /// The token names a function of another type than the one asked for.
    #[error("this token holds a {sent}, not a {asked}")]
    OtherType {
        /// The type it was made from.
        sent: String,
        /// The type asked for.
        asked: String,
    },
    /// This process cannot tell which executable it runs (no readable
    /// `/proc/self/exe`), so it cannot check the token.
    #[error("{0}")]
    UnknownExecutable(String),
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

mod sealed {
    pub trait Sealed {}
}

/// Function pointer types: the only types a [`PortableFn`] holds (plain
/// `fn` pointers of up to four arguments).
pub trait FnPtr: Copy + 'static + sealed::Sealed {
    /// The pointer as an address.
    fn addr(self) -> usize;
    /// # Safety
    ///
    /// `addr` must be the address of a function of this exact type.
    unsafe fn from_addr(addr: usize) -> Self;
}

macro_rules! fn_ptr {
    ($($arg:ident),*) => {
        impl<R: 'static, $($arg: 'static),*> sealed::Sealed for fn($($arg),*) -> R {}
        impl<R: 'static, $($arg: 'static),*> FnPtr for fn($($arg),*) -> R {
            fn addr(self) -> usize {
                self as usize
            }
            unsafe fn from_addr(addr: usize) -> Self {
                // SAFETY: by this function's contract, `addr` is a function
                // of this type; fn pointers and usize have the same size.
                unsafe { std::mem::transmute::<usize, Self>(addr) }
            }
        }
    };
}
fn_ptr!();
fn_ptr!(A);
fn_ptr!(A, B);
fn_ptr!(A, B, C);
fn_ptr!(A, B, C, D);

/// A function pointer of type `F` (a `fn(..) -> ..` type), as data that
/// can cross to another process of the same executable.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct PortableFn<F> {
    offset: i64,
    exe: String,
    /// `std::any::type_name::<F>()`, checked when resolved.
    ty: String,
    #[serde(skip)]
    _f: PhantomData<fn() -> F>,
}

impl<F> Clone for PortableFn<F> {
    fn clone(&self) -> Self {
        PortableFn {
            offset: self.offset,
            exe: self.exe.clone(),
            ty: self.ty.clone(),
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

/// Identity of this process's program by content (its build id, see
/// [`prism_protocol::program`]): a rebuilt binary is told apart, and a copy
/// of the same binary on another node is the same program.
fn exe_identity() -> Result<&'static str, PortableFnError> {
    prism_protocol::program::Program::this()
        .map(|p| p.id.as_str())
        .map_err(PortableFnError::UnknownExecutable)
}

impl<F: FnPtr> PortableFn<F> {
    /// Records `f`.
    pub fn new(f: F) -> Self {
        PortableFn {
            offset: f.addr() as i64 - anchor_addr(),
            // An empty identity never matches: resolve reports why.
            exe: exe_identity().unwrap_or_default().to_string(),
            ty: std::any::type_name::<F>().to_string(),
            _f: PhantomData,
        }
    }

    /// The function this token names, in this process.
    ///
    /// # Safety
    ///
    /// The token must have been made by [`PortableFn::new`] (then sent as
    /// data): a token forged or edited by hand can name any address. The
    /// executable and the type are checked; the offset cannot be.
    ///
    /// # Errors
    ///
    /// [`PortableFnError::OtherExecutable`] if the token came from a process
    /// running another executable file, [`PortableFnError::OtherType`] if it
    /// holds a function of another type, and
    /// [`PortableFnError::UnknownExecutable`] if this process cannot tell.
    pub unsafe fn resolve(&self) -> Result<F, PortableFnError> {
        let here = exe_identity()?;
        if self.exe != here {
            return Err(PortableFnError::OtherExecutable {
                sent: self.exe.clone(),
                here: here.to_string(),
            });
        }
        let asked = std::any::type_name::<F>();
        if self.ty != asked {
            return Err(PortableFnError::OtherType {
                sent: self.ty.clone(),
                asked: asked.to_string(),
            });
        }
        let addr = (anchor_addr() + self.offset) as usize;
        // SAFETY: the same executable file is mapped here, and the loader
        // moves all of its code by one offset, so `addr` is the function
        // that `new` recorded, of type F (checked by name above).
        Ok(unsafe { F::from_addr(addr) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn double(x: u32) -> u32 {
        x * 2
    }

    #[test]
    fn a_token_read_as_another_function_type_is_refused() {
        let token = PortableFn::new(double as fn(u32) -> u32);
        let text = serde_json::to_string(&token).unwrap();
        let wrong: PortableFn<fn(u64) -> u64> = serde_json::from_str(&text).unwrap();
        // SAFETY: made by PortableFn::new above.
        let err = unsafe { wrong.resolve() }.unwrap_err();
        assert!(matches!(err, PortableFnError::OtherType { .. }), "{err}");
        let mut other_build: serde_json::Value = serde_json::from_str(&text).unwrap();
        other_build["exe"] = "build-id:00".into();
        let other: PortableFn<fn(u32) -> u32> = serde_json::from_value(other_build).unwrap();
        // SAFETY: only the executable identity was changed; it is checked first.
        let err = unsafe { other.resolve() }.unwrap_err();
        assert!(
            matches!(err, PortableFnError::OtherExecutable { .. }),
            "{err}"
        );
        // SAFETY: made by PortableFn::new above.
        assert_eq!(unsafe { token.resolve() }.unwrap()(4), 8);
    }
}
