//! Zero-copy views of buffers in the shared-memory store.

use crate::codec::{self, Element};
use crate::runtime::store::PinGuard;
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::ops::Deref;

enum Storage<E> {
    /// Points into the node's shared segment; the guard keeps it pinned.
    Shared {
        ptr: *const E,
        len: usize,
        _pin: PinGuard,
    },
    /// A copy (small objects travel inline, not through the store).
    Owned(Vec<E>),
}

/// A read-only view of a numeric or byte buffer object.
///
/// When the object lives in the node's shared-memory store, the view points
/// straight into it: no copy is made, and the object stays pinned (it
/// cannot be freed) until the view is dropped. Small objects, which travel
/// inline, are held as a private copy. Either way a `View<E>` derefs to
/// `&[E]`.
///
/// Get one with [`get_view`](crate::get_view), or declare a remote
/// function parameter as `View<E>` and pass an `&ObjectRef<Vec<E>>`:
///
/// ```no_run
/// #[prism::remote]
/// fn sum(values: prism::View<f32>) -> f64 {
///     values.iter().map(|v| *v as f64).sum()
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let big = prism::put(vec![1.0f32; 10_000_000])?;
///     assert_eq!(prism::get(&sum::remote(&big)?)?, 10_000_000.0);
///     let view = prism::get_view(&big)?; // in place, no copy
///     assert!(view.is_zero_copy());
///     Ok(())
/// }
/// ```
pub struct View<E: Element> {
    storage: Storage<E>,
}

// The shared range is immutable (sealed) and pinned while the view lives.
unsafe impl<E: Element> Send for View<E> {}
unsafe impl<E: Element> Sync for View<E> {}

impl<E: Element> View<E> {
    pub(crate) fn shared(ptr: *const u8, len_bytes: usize, pin: PinGuard) -> Self {
        View {
            storage: Storage::Shared {
                ptr: ptr as *const E,
                len: len_bytes / std::mem::size_of::<E>(),
                _pin: pin,
            },
        }
    }

    pub(crate) fn owned(v: Vec<E>) -> Self {
        View {
            storage: Storage::Owned(v),
        }
    }

    /// Whether the view reads shared memory in place (rather than a copy).
    pub fn is_zero_copy(&self) -> bool {
        matches!(self.storage, Storage::Shared { .. })
    }

    /// Copies the elements into a new vector.
    pub fn to_vec(&self) -> Vec<E> {
        self.deref().to_vec()
    }

    /// Builds a view over an encoded raw buffer that is not in the store.
    pub(crate) fn from_inline(bytes: &[u8]) -> crate::Result<Self> {
        match codec::raw_payload(bytes) {
            Some((tag, payload)) if tag == E::TAG => Ok(View::owned(codec::copy_elements(payload))),
            _ => Err(crate::Error::Serialization {
                type_name: std::any::type_name::<Self>().to_string(),
                message: "the object is not a flat buffer of this element type".into(),
            }),
        }
    }
}

impl<E: Element> Deref for View<E> {
    type Target = [E];

    fn deref(&self) -> &[E] {
        match &self.storage {
            // Aligned (objects start on 64-byte boundaries, the payload 64
            // bytes in), in bounds and pinned.
            Storage::Shared { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Storage::Owned(v) => v,
        }
    }
}

impl<E: Element + fmt::Debug> fmt::Debug for View<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View")
            .field("len", &self.len())
            .field("zero_copy", &self.is_zero_copy())
            .finish()
    }
}

/// A view deserialized from inside another value owns its elements.
impl<'de, E: Element + Deserialize<'de>> Deserialize<'de> for View<E> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(View::owned(Vec::<E>::deserialize(deserializer)?))
    }
}
