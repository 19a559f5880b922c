//! How values become bytes and back.
//!
//! Two encodings, told apart by the first byte:
//!
//! - `FORMAT_SERDE`: MessagePack through serde, for any `Serialize` type.
//! - `FORMAT_RAW`: flat numeric and byte buffers (`Vec<u8>`, `Vec<f32>`,
//!   `bytes::Bytes`, ...) written as their memory image after a 64-byte
//!   header, so a 100 MB buffer is one `memcpy` and can be read in place
//!   from shared memory through a [`View`](crate::View). Which types take
//!   this path is decided by `TypeId` at run time, so no user type needs a
//!   special trait.
//!
//! While a value is encoded, every [`ObjectRef`](crate::ObjectRef) inside it
//! is recorded, so the owner can keep those objects alive as long as the
//! containing one.

use crate::Error;
use bytes::Bytes;
use prism_protocol::messages::ObjectRefInfo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::any::{Any, TypeId};
use std::cell::RefCell;

/// A serde-encoded value.
pub(crate) const FORMAT_SERDE: u8 = 1;
/// A raw buffer after a [`RAW_HEADER_BYTES`] header.
pub(crate) const FORMAT_RAW: u8 = 2;
/// Header size of a raw buffer: keeps the payload 64-byte aligned when the
/// object itself is.
pub(crate) const RAW_HEADER_BYTES: usize = 64;

/// A value ready to store or send.
#[doc(hidden)]
#[derive(Debug)]
pub struct Encoded {
    /// The encoding, or for a flat buffer returned by value only its
    /// header, with the buffer itself in `payload`.
    pub(crate) bytes: Vec<u8>,
    /// A flat buffer that follows `bytes` without having been copied next
    /// to it: a task's `Vec` result goes into shared memory with one copy.
    pub(crate) payload: Option<Payload>,
    pub(crate) contained: Vec<ObjectRefInfo>,
    /// The handles of `contained`, kept until the receiver of the value has
    /// been registered (the value's own handles may drop right after
    /// encoding, as a task's return value does).
    pub(crate) keep_alive: Vec<KeepAlive>,
    /// A call's further results, in order, when it returns several
    /// (`num_returns`); empty otherwise.
    pub(crate) more: Vec<Encoded>,
}

/// A flat buffer's memory, owned.
pub(crate) struct Payload(Box<dyn AsRef<[u8]> + Send + Sync>);

impl Payload {
    pub(crate) fn as_slice(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.as_slice().len())
    }
}

/// A vector of numbers as its memory image.
struct RawVec<E>(Vec<E>);

impl<E: Copy> AsRef<[u8]> for RawVec<E> {
    fn as_ref(&self) -> &[u8] {
        as_bytes(&self.0)
    }
}

impl Encoded {
    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len() + self.payload.as_ref().map_or(0, |p| p.as_slice().len())
    }

    /// Its bytes, in order, for writing back to back.
    pub(crate) fn parts(&self) -> Vec<&[u8]> {
        let mut parts = vec![&self.bytes[..]];
        parts.extend(self.payload.as_ref().map(Payload::as_slice));
        parts
    }

    /// Its bytes in one buffer (a copy only when there is a payload).
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        let mut bytes = self.bytes;
        if let Some(p) = &self.payload {
            bytes.extend_from_slice(p.as_slice());
        }
        bytes
    }
}

/// One argument of a remote call, as the caller hands it over.
#[derive(Debug)]
pub enum Arg {
    /// A value, encoded.
    #[doc(hidden)]
    Value(Encoded),
    /// A reference; the executor receives the object's value.
    #[doc(hidden)]
    Ref(ObjectRefInfo),
}

/// A type-erased reference handle.
pub(crate) type KeepAlive = std::sync::Arc<dyn Any + Send + Sync>;

thread_local! {
    static COLLECTED_REFS: RefCell<Option<Vec<(ObjectRefInfo, KeepAlive)>>> = const { RefCell::new(None) };
}

/// Called by `ObjectRef::serialize`: records the reference (and a handle
/// keeping it alive) if a value is being encoded on this thread.
pub(crate) fn note_serialized_ref(info: &ObjectRefInfo, handle: KeepAlive) {
    COLLECTED_REFS.with(|c| {
        if let Some(list) = c.borrow_mut().as_mut() {
            list.push((info.clone(), handle));
        }
    });
}

/// Runs `f` and returns what it produced plus every reference serialized
/// meanwhile on this thread.
pub(crate) fn collecting_refs<R>(f: impl FnOnce() -> R) -> (R, Vec<(ObjectRefInfo, KeepAlive)>) {
    let outer = COLLECTED_REFS.with(|c| c.borrow_mut().replace(Vec::new()));
    let result = f();
    let collected = COLLECTED_REFS.with(|c| {
        let mut slot = c.borrow_mut();
        let mine = slot.take().unwrap_or_default();
        if let Some(mut outer) = outer {
            outer.extend(mine.iter().cloned());
            *slot = Some(outer);
        }
        mine
    });
    (result, collected)
}

/// An element type that can be viewed in place in shared memory.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The tag stored in the raw header.
    const TAG: u8;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! elements {
    ($($ty:ty = $tag:literal),*) => {
        $(
            impl sealed::Sealed for $ty {}
            impl Element for $ty { const TAG: u8 = $tag; }
        )*
        /// The raw image of `value` if it is a flat buffer type.
        fn raw_image<T: 'static>(value: &T) -> Option<(u8, &[u8])> {
            let any = value as &dyn Any;
            $(
                if let Some(v) = any.downcast_ref::<Vec<$ty>>() {
                    return Some(($tag, as_bytes(v.as_slice())));
                }
            )*
            if let Some(b) = any.downcast_ref::<Bytes>() {
                return Some((<u8 as Element>::TAG, b.as_ref()));
            }
            None
        }

        /// A flat buffer taken by value: its tag and its memory, not copied;
        /// any other value back.
        fn owned_raw_image<T: 'static>(value: T) -> Result<(u8, Payload), T> {
            let mut slot = Some(value);
            let any = &mut slot as &mut dyn Any;
            $(
                if let Some(v) = any.downcast_mut::<Option<Vec<$ty>>>().and_then(Option::take) {
                    return Ok(($tag, Payload(Box::new(RawVec(v)))));
                }
            )*
            if let Some(b) = any.downcast_mut::<Option<Bytes>>().and_then(Option::take) {
                return Ok((<u8 as Element>::TAG, Payload(Box::new(b))));
            }
            match slot {
                Some(value) => Err(value),
                None => unreachable!("taken only when returned"),
            }
        }

        /// Rebuilds a flat buffer type from its raw image, if `T` is one.
        fn from_raw_image<T: 'static>(tag: u8, payload: &[u8]) -> Option<Result<T, Error>> {
            let id = TypeId::of::<T>();
            $(
                if id == TypeId::of::<Vec<$ty>>() {
                    return Some(check_tag::<$ty>(tag).map(|()| {
                        let v: Vec<$ty> = copy_elements(payload);
                        downcast_owned::<T>(Box::new(v))
                    }));
                }
            )*
            if id == TypeId::of::<Bytes>() {
                return Some(check_tag::<u8>(tag).map(|()| downcast_owned::<T>(Box::new(Bytes::copy_from_slice(payload)))));
            }
            None
        }
    };
}

elements!(
    u8 = 1,
    i8 = 2,
    u16 = 3,
    i16 = 4,
    u32 = 5,
    i32 = 6,
    u64 = 7,
    i64 = 8,
    f32 = 9,
    f64 = 10
);

fn check_tag<E: Element>(tag: u8) -> Result<(), Error> {
    if tag == E::TAG {
        Ok(())
    } else {
        Err(Error::Serialization {
            type_name: std::any::type_name::<Vec<E>>().to_string(),
            message: format!("the stored buffer has element tag {tag}, not {}", E::TAG),
        })
    }
}

fn downcast_owned<T: 'static>(b: Box<dyn Any>) -> T {
    match b.downcast::<T>() {
        Ok(v) => *v,
        // The TypeId was compared just before.
        Err(_) => unreachable!("type ids matched"),
    }
}

pub(crate) fn as_bytes<E: Copy>(v: &[E]) -> &[u8] {
    // Primitive numbers have no padding and any bit pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Copies a payload into a properly aligned vector (payloads in messages
/// may be unaligned).
pub(crate) fn copy_elements<E: Copy>(payload: &[u8]) -> Vec<E> {
    let n = payload.len() / std::mem::size_of::<E>();
    let mut v: Vec<E> = Vec::with_capacity(n);
    if payload.len() >= HUGE_COPY_BYTES {
        advise_huge_pages(v.as_mut_ptr() as *mut u8, payload.len());
    }
    // The destination has room for n elements; every bit pattern is valid
    // for the primitive element types used here.
    unsafe {
        std::ptr::copy_nonoverlapping(
            payload.as_ptr(),
            v.as_mut_ptr() as *mut u8,
            n * std::mem::size_of::<E>(),
        );
        v.set_len(n);
    }
    v
}

/// Copies at least this large ask for transparent huge pages first.
const HUGE_COPY_BYTES: usize = 4 << 20;

/// A large fresh allocation takes one page fault per 4 KiB as the copy
/// first touches it, which bounds a large `get` at about 2 GB/s; advising
/// huge pages for the (page-aligned part of the) range cuts the faults 512
/// times where the kernel allows it (`madvise` mode), and is ignored where
/// it does not.
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    let start = (ptr as usize).next_multiple_of(4096);
    let end = (ptr as usize + len) & !4095;
    if end > start {
        // SAFETY: advice on memory we own; it does not change its contents.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// The header of a raw buffer of `payload_len` bytes.
pub(crate) fn raw_header(tag: u8, payload_len: usize) -> [u8; RAW_HEADER_BYTES] {
    let mut h = [0u8; RAW_HEADER_BYTES];
    h[0] = FORMAT_RAW;
    h[1] = tag;
    h[8..16].copy_from_slice(&(payload_len as u64).to_le_bytes());
    h
}

/// If `value` is a flat buffer, its tag and memory image (for writing
/// straight into shared memory without an intermediate copy).
pub(crate) fn raw_parts<T: 'static>(value: &T) -> Option<(u8, &[u8])> {
    raw_image(value)
}

/// Encodes a value taken by value: a flat buffer keeps its own memory as
/// the payload (see [`Encoded::payload`]) instead of being copied after its
/// header.
pub(crate) fn encode_owned<T: Serialize + 'static>(value: T) -> Result<Encoded, Error> {
    match owned_raw_image(value) {
        Ok((tag, payload)) => Ok(Encoded {
            bytes: raw_header(tag, payload.as_slice().len()).to_vec(),
            payload: Some(payload),
            contained: Vec::new(),
            keep_alive: Vec::new(),
            more: Vec::new(),
        }),
        Err(value) => encode(&value),
    }
}

/// Encodes any value.
pub(crate) fn encode<T: Serialize + 'static>(value: &T) -> Result<Encoded, Error> {
    if let Some((tag, payload)) = raw_image(value) {
        let mut bytes = Vec::with_capacity(RAW_HEADER_BYTES + payload.len());
        bytes.extend_from_slice(&raw_header(tag, payload.len()));
        bytes.extend_from_slice(payload);
        return Ok(Encoded {
            bytes,
            payload: None,
            contained: Vec::new(),
            keep_alive: Vec::new(),
            more: Vec::new(),
        });
    }
    let (result, contained) = collecting_refs(|| {
        let mut bytes = vec![FORMAT_SERDE];
        rmp_serde::encode::write(&mut bytes, value).map(|()| bytes)
    });
    let bytes = result.map_err(|e| Error::Serialization {
        type_name: std::any::type_name::<T>().to_string(),
        message: e.to_string(),
    })?;
    let (contained, keep_alive) = contained.into_iter().unzip();
    Ok(Encoded {
        bytes,
        payload: None,
        contained,
        keep_alive,
        more: Vec::new(),
    })
}

/// Splits a raw buffer into its tag and payload.
pub(crate) fn raw_payload(bytes: &[u8]) -> Option<(u8, &[u8])> {
    if bytes.len() < RAW_HEADER_BYTES || bytes[0] != FORMAT_RAW {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
    let payload = bytes.get(RAW_HEADER_BYTES..RAW_HEADER_BYTES + len)?;
    Some((bytes[1], payload))
}

/// Decodes a value of type `T`.
pub(crate) fn decode<T: DeserializeOwned + 'static>(bytes: &[u8]) -> Result<T, Error> {
    let err = |message: String| Error::Serialization {
        type_name: std::any::type_name::<T>().to_string(),
        message,
    };
    match bytes.first() {
        Some(&FORMAT_RAW) => {
            let (tag, payload) =
                raw_payload(bytes).ok_or_else(|| err("truncated raw buffer".into()))?;
            match from_raw_image::<T>(tag, payload) {
                Some(result) => result,
                None => Err(err(
                    "the object holds a flat buffer; get it as the Vec or Bytes type it was put as"
                        .into(),
                )),
            }
        }
        Some(&FORMAT_SERDE) => rmp_serde::from_slice(&bytes[1..]).map_err(|e| err(e.to_string())),
        _ => Err(err("unknown encoding".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_buffers_take_the_raw_path_and_round_trip() {
        let v: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let enc = encode(&v).unwrap();
        assert_eq!(enc.bytes[0], FORMAT_RAW);
        assert_eq!(enc.bytes.len(), RAW_HEADER_BYTES + 4000);
        let back: Vec<f32> = decode(&enc.bytes).unwrap();
        assert_eq!(back, v);
        let b = Bytes::from_static(b"hello");
        let back: Bytes = decode(&encode(&b).unwrap().bytes).unwrap();
        assert_eq!(back, b);
    }

    #[test]
    fn other_values_take_serde_and_a_wrong_type_is_a_clear_error() {
        let v = (1i64, "two".to_string(), vec![3u16, 4]);
        let enc = encode(&v).unwrap();
        assert_eq!(enc.bytes[0], FORMAT_SERDE);
        let back: (i64, String, Vec<u16>) = decode(&enc.bytes).unwrap();
        assert_eq!(back, v);
        let err = decode::<Vec<f64>>(&encode(&vec![1.0f32]).unwrap().bytes).unwrap_err();
        assert!(err.to_string().contains("element tag"), "{err}");
    }
}
