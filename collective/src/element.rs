//! Element types and reduction operators.
//!
//! A collective moves plain numbers. [`Element`] is implemented for exactly
//! the types the wire format knows (`f32`, `f64`, `f16`, `bf16`, `i32`, `i64`,
//! `u8`); it is sealed, so every element is plain old data with no padding and
//! any byte pattern of its size is a valid value.
//!
//! # Arithmetic
//!
//! Integer sums and products wrap on overflow (as NCCL and gloo do), and an
//! integer mean is the wrapped sum divided by the world size, rounded toward
//! zero. `f16` and `bf16` are combined in `f32` and rounded back after every
//! step, so a sum of n values carries about n roundings of the half type.

use half::{bf16, f16};
use std::fmt;

/// The element type of a buffer, as carried in every message header so that
/// two ranks calling with different types get an error, not garbage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// IEEE half precision, [`half::f16`].
    F16,
    /// bfloat16, [`half::bf16`].
    BF16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
}

impl DataType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 => 4,
            DataType::F64 | DataType::I64 => 8,
            DataType::F16 | DataType::BF16 => 2,
            DataType::U8 => 1,
        }
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// Every element type, in code order.
    pub(crate) const ALL: [DataType; 7] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::BF16,
        DataType::I32,
        DataType::I64,
        DataType::U8,
    ];

    pub(crate) fn from_code(code: u8) -> Option<DataType> {
        Self::ALL.get(code as usize).copied()
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::U8 => "u8",
        };
        f.write_str(name)
    }
}

/// How [`all_reduce`](crate::ProcessGroup::all_reduce) and
/// [`reduce_scatter`](crate::ProcessGroup::reduce_scatter) combine
/// the ranks' values, element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum of all ranks' values.
    Sum,
    /// Sum divided by the world size (what data-parallel gradients want).
    Mean,
    /// Smallest value.
    Min,
    /// Largest value.
    Max,
    /// Product of all ranks' values.
    Product,
}

impl ReduceOp {
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<ReduceOp> {
        const ALL: [ReduceOp; 5] = [
            ReduceOp::Sum,
            ReduceOp::Mean,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Product,
        ];
        ALL.get(code as usize).copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Product => "product",
        };
        f.write_str(name)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A number a collective can carry: `f32`, `f64`, `f16`, `bf16`, `i32`, `i64`
/// or `u8`. Sealed: the transports rely on every implementor being plain old
/// data.
pub trait Element: sealed::Sealed + Copy + PartialEq + Send + Sync + fmt::Debug + 'static {
    /// The wire tag of this type.
    const DATA_TYPE: DataType;

    /// `a + b` (wrapping for integers).
    fn add(a: Self, b: Self) -> Self;
    /// `a * b` (wrapping for integers).
    fn mul(a: Self, b: Self) -> Self;
    /// The smaller of `a` and `b`.
    fn min(a: Self, b: Self) -> Self;
    /// The larger of `a` and `b`.
    fn max(a: Self, b: Self) -> Self;
    /// `self / n`, used by [`ReduceOp::Mean`].
    fn div_count(self, n: usize) -> Self;
    /// The value as `f64` (exact for every type except large `i64`).
    fn to_f64(self) -> f64;
    /// The nearest value to `v`; integers wrap like an `as` cast from `i128`.
    fn from_f64(v: f64) -> Self;
}

macro_rules! float_element {
    ($t:ty, $dt:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATA_TYPE: DataType = $dt;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a * b
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                if b < a {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                if b > a {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn div_count(self, n: usize) -> Self {
                self / n as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

macro_rules! int_element {
    ($t:ty, $dt:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATA_TYPE: DataType = $dt;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn div_count(self, n: usize) -> Self {
                self / n as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                (v as i128) as $t
            }
        }
    };
}

macro_rules! half_element {
    ($t:ty, $dt:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATA_TYPE: DataType = $dt;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() + b.to_f32())
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                <$t>::from_f32(a.to_f32() * b.to_f32())
            }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self {
                if b.to_f32() < a.to_f32() {
                    b
                } else {
                    a
                }
            }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self {
                if b.to_f32() > a.to_f32() {
                    b
                } else {
                    a
                }
            }
            fn div_count(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}

float_element!(f32, DataType::F32);
float_element!(f64, DataType::F64);
int_element!(i32, DataType::I32);
int_element!(i64, DataType::I64);
int_element!(u8, DataType::U8);
half_element!(f16, DataType::F16);
half_element!(bf16, DataType::BF16);

/// `dst[i] = dst[i] op src[i]` for every `i`. `Mean` combines as `Sum`; the
/// division happens once, after the last step.
#[inline]
pub(crate) fn combine_into<T: Element>(dst: &mut [T], src: &[T], op: ReduceOp) {
    debug_assert_eq!(dst.len(), src.len());
    // One loop per operator so that each body is a straight line the compiler
    // can vectorise.
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = T::add(*d, *s);
            }
        }
        ReduceOp::Product => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = T::mul(*d, *s);
            }
        }
        ReduceOp::Min => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = T::min(*d, *s);
            }
        }
        ReduceOp::Max => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = T::max(*d, *s);
            }
        }
    }
}

/// Divides every element by `n` when `op` is `Mean`; the last step of a mean.
pub(crate) fn finish_mean<T: Element>(buf: &mut [T], op: ReduceOp, n: usize) {
    if op == ReduceOp::Mean && n > 1 {
        for v in buf.iter_mut() {
            *v = v.div_count(n);
        }
    }
}

/// Combines `src` (the raw bytes of whole `T` values, at any alignment) into
/// `dst`. Bytes straight out of a socket staging area or a shared-memory ring
/// are usually aligned; when they are not, they go through a small bounce
/// buffer.
pub(crate) fn combine_bytes_into<T: Element>(dst: &mut [T], src: &[u8], op: ReduceOp) {
    let size = std::mem::size_of::<T>();
    debug_assert_eq!(src.len(), std::mem::size_of_val(dst));
    if (src.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
        // SAFETY: T is plain old data (sealed trait), the pointer is aligned,
        // and `src` holds exactly `dst.len()` values.
        let typed = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const T, dst.len()) };
        combine_into(dst, typed, op);
        return;
    }
    const BOUNCE: usize = 512;
    let mut bounce = [0u64; BOUNCE];
    let per = BOUNCE * 8 / size;
    for (d, s) in dst.chunks_mut(per).zip(src.chunks(per * size)) {
        let bytes = s.len();
        // SAFETY: `bounce` is 4 KiB of u64 (aligned for every element type),
        // `bytes <= 4 KiB`, and the regions do not overlap.
        let typed = unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), bounce.as_mut_ptr() as *mut u8, bytes);
            std::slice::from_raw_parts(bounce.as_ptr() as *const T, d.len())
        };
        combine_into(d, typed, op);
    }
}

/// The bytes of a slice of elements.
pub(crate) fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: T is plain old data without padding; u8 has no alignment needs.
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_combines_element_by_element() {
        let mut d = vec![1.0f32, 5.0, -2.0];
        combine_into(&mut d, &[2.0, 1.0, -3.0], ReduceOp::Sum);
        assert_eq!(d, [3.0, 6.0, -5.0]);
        combine_into(&mut d, &[2.0, 1.0, 1.0], ReduceOp::Product);
        assert_eq!(d, [6.0, 6.0, -5.0]);
        combine_into(&mut d, &[7.0, 1.0, 0.0], ReduceOp::Min);
        assert_eq!(d, [6.0, 1.0, -5.0]);
        combine_into(&mut d, &[7.0, 1.0, 0.0], ReduceOp::Max);
        assert_eq!(d, [7.0, 1.0, 0.0]);
    }

    #[test]
    fn integer_sums_wrap_instead_of_panicking() {
        let mut d = vec![250u8];
        combine_into(&mut d, &[10], ReduceOp::Sum);
        assert_eq!(d, [4]);
        assert_eq!(u8::from_f64(260.0), 4);
    }

    #[test]
    fn half_types_round_through_f32() {
        let mut d = vec![f16::from_f32(1.5), f16::from_f32(2.0)];
        combine_into(
            &mut d,
            &[f16::from_f32(0.25), f16::from_f32(3.0)],
            ReduceOp::Sum,
        );
        assert_eq!(d[0].to_f32(), 1.75);
        let mut b = vec![bf16::from_f32(3.0)];
        combine_into(&mut b, &[bf16::from_f32(2.0)], ReduceOp::Max);
        assert_eq!(b[0].to_f32(), 3.0);
    }

    #[test]
    fn misaligned_bytes_combine_through_the_bounce_buffer() {
        let src: Vec<f64> = (0..1000).map(|i| i as f64).collect();
        let mut raw = vec![0u8; 8 * 1000 + 1];
        raw[1..].copy_from_slice(as_bytes(&src));
        let mut dst = vec![1.0f64; 1000];
        combine_bytes_into(&mut dst, &raw[1..], ReduceOp::Sum);
        assert!(dst.iter().enumerate().all(|(i, v)| *v == i as f64 + 1.0));
    }

    #[test]
    fn codes_round_trip() {
        for code in 0..7 {
            assert_eq!(DataType::from_code(code).map(DataType::code), Some(code));
        }
        assert_eq!(DataType::from_code(7), None);
        for code in 0..5 {
            assert_eq!(ReduceOp::from_code(code).map(ReduceOp::code), Some(code));
        }
    }
}
