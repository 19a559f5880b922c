//! Blocks as flat bytes: how a pipeline's blocks travel through the object
//! store.
//!
//! A block task returns one `Vec<u8>`, which Prism stores as its memory
//! image (one copy into shared memory, no serde). The reader maps it in
//! place ([`prism::get_view`]), reads the header without touching the
//! data (which is how a split coordinator learns a block's row count), and
//! copies each column out with one `memcpy`.
//!
//! Layout, all integers little-endian:
//!
//! ```text
//! 0   magic "PRSMBLK1"
//! 8   kind: u32 (0 a block, 1 a failed batch function, 2 a function the
//!     worker could not resolve)
//! 12  number of columns: u32
//! 16  number of rows: u64
//! 24  one 48-byte entry per column: type u32, name length u32, row_len
//!     u64, then (offset, length) of two sections: values and, for strings
//!     and byte strings, their bytes (values then hold rows + 1 u64
//!     offsets)
//! ..  the column names, back to back
//! ..  sections, each starting on a 64-byte boundary
//! ```
//!
//! For kinds 1 and 2 the column count is a count of strings, each a u64
//! length and its bytes, right after the header: the stage and the message
//! (kind 1), or the stage, the sender's and the worker's executable (kind 2).

use super::batch::{Batch, Column};
use super::error::{DataError, Result};
use std::ops::Range;

const MAGIC: &[u8; 8] = b"PRSMBLK1";
const HEADER: usize = 24;
const ENTRY: usize = 48;
const ALIGN: usize = 64;

const KIND_BLOCK: u32 = 0;
const KIND_FAILED: u32 = 1;
const KIND_NOT_PORTABLE: u32 = 2;

const T_F32: u32 = 0;
const T_F64: u32 = 1;
const T_I64: u32 = 2;
const T_STR: u32 = 3;
const T_TENSOR: u32 = 4;
const T_BYTES: u32 = 5;

/// What a block task produced, decoded.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// Rows.
    Block(Batch),
    /// A stage failed: the user's function returned `Err` (its
    /// `Display`), or the input could not be read.
    Failed { stage: String, message: String },
    /// The worker runs another executable than the sender.
    NotPortable {
        stage: String,
        sent: String,
        here: String,
    },
}

/// Plain-old-data element types that are copied as their memory image.
trait Pod: Copy + Default {
    const SIZE: usize;
    fn from_le(bytes: &[u8]) -> Self;
    fn put_le(self, out: &mut Vec<u8>);
}

macro_rules! pod {
    ($($t:ty),*) => {$(
        impl Pod for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_le(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(bytes);
                <$t>::from_le_bytes(a)
            }
            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
pod!(f32, f64, i64, u64);

fn put_slice<T: Pod>(values: &[T], out: &mut Vec<u8>) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: T is a primitive number, which has no padding and whose
        // memory image on a little-endian machine is its wire form.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        out.extend_from_slice(bytes);
    }
    #[cfg(not(target_endian = "little"))]
    for v in values {
        v.put_le(out);
    }
}

fn read_slice<T: Pod>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / T::SIZE;
    #[cfg(target_endian = "little")]
    {
        let mut out: Vec<T> = Vec::with_capacity(n);
        // SAFETY: `out` has room for n elements (n * SIZE bytes), every bit
        // pattern is a valid T, the ranges do not overlap, and all n are
        // written before the length is set.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                out.as_mut_ptr().cast::<u8>(),
                n * T::SIZE,
            );
            out.set_len(n);
        }
        out
    }
    #[cfg(not(target_endian = "little"))]
    bytes.chunks_exact(T::SIZE).map(T::from_le).collect()
}

fn pad_to_align(out: &mut Vec<u8>) {
    let pad = (ALIGN - out.len() % ALIGN) % ALIGN;
    out.resize(out.len() + pad, 0);
}

/// The encoded size of batches, close enough to reserve it up front.
fn encoded_size(parts: &[Batch]) -> usize {
    let Some(first) = parts.first() else {
        return HEADER;
    };
    let mut size = HEADER + ENTRY * first.num_columns() + ALIGN;
    for name in first.column_names() {
        size += name.len() + 2 * ALIGN;
    }
    for part in parts {
        for (_, column) in part.columns() {
            size += match column {
                Column::F32(v) => v.len() * 4,
                Column::F64(v) => v.len() * 8,
                Column::I64(v) => v.len() * 8,
                Column::Str(v) => (v.len() + 1) * 8 + v.iter().map(String::len).sum::<usize>(),
                Column::Bytes(v) => (v.len() + 1) * 8 + v.iter().map(Vec::len).sum::<usize>(),
                Column::Tensor { values, .. } => values.len() * 4,
            };
        }
    }
    size
}

/// Encodes a block.
pub(crate) fn encode(batch: &Batch) -> Vec<u8> {
    encode_many(std::slice::from_ref(batch))
}

/// Encodes the rows of `parts`, one after another, as one block: the
/// concatenation is written straight into the encoding. The parts must
/// share a schema (checked by the caller).
pub(crate) fn encode_many(parts: &[Batch]) -> Vec<u8> {
    let first = parts.first().cloned().unwrap_or_default();
    let num_rows: usize = parts.iter().map(Batch::num_rows).sum();
    let mut out = Vec::with_capacity(encoded_size(parts));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&KIND_BLOCK.to_le_bytes());
    out.extend_from_slice(&(first.num_columns() as u32).to_le_bytes());
    out.extend_from_slice(&(num_rows as u64).to_le_bytes());
    let entries_at = out.len();
    out.resize(entries_at + ENTRY * first.num_columns(), 0);
    for name in first.column_names() {
        out.extend_from_slice(name.as_bytes());
    }
    let mut entries = Vec::with_capacity(first.num_columns());
    for (c, (name, column)) in first.columns().enumerate() {
        let pieces = parts
            .iter()
            .filter_map(|p| p.columns().nth(c).map(|(_, col)| col));
        pad_to_align(&mut out);
        let a_off = out.len();
        let (tag, row_len) = match column {
            Column::F32(_) => (T_F32, 0),
            Column::F64(_) => (T_F64, 0),
            Column::I64(_) => (T_I64, 0),
            Column::Tensor { row_len, .. } => (T_TENSOR, *row_len),
            Column::Str(_) => (T_STR, 0),
            Column::Bytes(_) => (T_BYTES, 0),
        };
        let variable = tag == T_STR || tag == T_BYTES;
        if variable {
            let mut at = 0u64;
            0u64.put_le(&mut out);
            for piece in pieces.clone() {
                for item in var_items(piece) {
                    at += item.len() as u64;
                    at.put_le(&mut out);
                }
            }
        } else {
            for piece in pieces.clone() {
                match piece {
                    Column::F32(v) => put_slice(v, &mut out),
                    Column::F64(v) => put_slice(v, &mut out),
                    Column::I64(v) => put_slice(v, &mut out),
                    Column::Tensor { values, .. } => put_slice(values, &mut out),
                    Column::Str(_) | Column::Bytes(_) => {}
                }
            }
        }
        let a_len = out.len() - a_off;
        let (mut b_off, mut b_len) = (0, 0);
        if variable {
            pad_to_align(&mut out);
            b_off = out.len();
            for piece in pieces {
                for item in var_items(piece) {
                    out.extend_from_slice(item);
                }
            }
            b_len = out.len() - b_off;
        }
        entries.push((tag, name.len(), row_len, a_off, a_len, b_off, b_len));
    }
    for (i, (tag, name_len, row_len, a_off, a_len, b_off, b_len)) in entries.into_iter().enumerate()
    {
        let mut e = Vec::with_capacity(ENTRY);
        e.extend_from_slice(&tag.to_le_bytes());
        e.extend_from_slice(&(name_len as u32).to_le_bytes());
        for v in [row_len, a_off, a_len, b_off, b_len] {
            (v as u64).put_le(&mut e);
        }
        let at = entries_at + i * ENTRY;
        out[at..at + ENTRY].copy_from_slice(&e);
    }
    out
}

/// The rows of a string or bytes column as byte slices (none for other
/// columns).
fn var_items(column: &Column) -> Box<dyn Iterator<Item = &[u8]> + '_> {
    match column {
        Column::Str(v) => Box::new(v.iter().map(String::as_bytes)),
        Column::Bytes(v) => Box::new(v.iter().map(Vec::as_slice)),
        _ => Box::new(std::iter::empty()),
    }
}

fn encode_messages(kind: u32, messages: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(messages.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    for m in messages {
        (m.len() as u64).put_le(&mut out);
        out.extend_from_slice(m.as_bytes());
    }
    out
}

/// Encodes a stage's failure.
pub(crate) fn encode_failed(stage: &str, message: &str) -> Vec<u8> {
    encode_messages(KIND_FAILED, &[stage, message])
}

/// Encodes a function that the worker could not resolve.
pub(crate) fn encode_not_portable(stage: &str, sent: &str, here: &str) -> Vec<u8> {
    encode_messages(KIND_NOT_PORTABLE, &[stage, sent, here])
}

fn malformed(what: &str) -> DataError {
    DataError::Corrupt {
        what: what.to_string(),
    }
}

/// A bounds-checked reader over an encoded block.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn range(&self, at: usize, len: usize) -> Result<&'a [u8]> {
        at.checked_add(len)
            .and_then(|end| self.bytes.get(at..end))
            .ok_or_else(|| malformed("a section runs past the end of the block"))
    }

    fn u32(&self, at: usize) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.range(at, 4)?.try_into().unwrap_or_default(),
        ))
    }

    fn u64(&self, at: usize) -> Result<usize> {
        let v = <u64 as Pod>::from_le(self.range(at, 8)?);
        usize::try_from(v).map_err(|_| malformed("a length does not fit this machine"))
    }

    fn str(&self, at: usize, len: usize) -> Result<&'a str> {
        std::str::from_utf8(self.range(at, len)?).map_err(|_| malformed("a string is not UTF-8"))
    }
}

fn check_magic(bytes: &[u8]) -> Result<Reader<'_>> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err(malformed("not a Prism block (bad magic)"));
    }
    Ok(Reader { bytes })
}

/// The number of rows of an encoded block, or `None` for a failure
/// record; reads the header only.
pub(crate) fn rows(bytes: &[u8]) -> Result<Option<usize>> {
    let r = check_magic(bytes)?;
    Ok(match r.u32(8)? {
        KIND_BLOCK => Some(r.u64(16)?),
        _ => None,
    })
}

/// Decodes an encoded block, failure or not.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded> {
    decode_rows(bytes, None)
}

/// Decodes rows `rows` of an encoded block (all rows for `None`), copying
/// only those out.
pub(crate) fn decode_rows(bytes: &[u8], rows: Option<Range<usize>>) -> Result<Decoded> {
    let r = check_magic(bytes)?;
    let kind = r.u32(8)?;
    let count = r.u32(12)? as usize;
    if kind != KIND_BLOCK {
        let mut at = HEADER;
        let mut messages = Vec::with_capacity(count);
        for _ in 0..count {
            let len = r.u64(at)?;
            messages.push(r.str(at + 8, len)?.to_string());
            at += 8 + len;
        }
        let mut it = messages.into_iter();
        return match (kind, it.next(), it.next(), it.next()) {
            (KIND_FAILED, Some(stage), Some(message), None) => {
                Ok(Decoded::Failed { stage, message })
            }
            (KIND_NOT_PORTABLE, Some(stage), Some(sent), Some(here)) => {
                Ok(Decoded::NotPortable { stage, sent, here })
            }
            _ => Err(malformed("unknown record kind")),
        };
    }
    let num_rows = r.u64(16)?;
    let rows = rows.unwrap_or(0..num_rows);
    if rows.start > rows.end || rows.end > num_rows {
        return Err(malformed("rows asked for are past the block's end"));
    }
    let mut name_at = HEADER
        .checked_add(
            count
                .checked_mul(ENTRY)
                .ok_or_else(|| malformed("too many columns"))?,
        )
        .ok_or_else(|| malformed("too many columns"))?;
    let mut columns = Vec::with_capacity(count);
    for i in 0..count {
        let e = HEADER + i * ENTRY;
        let (tag, name_len, row_len) = (r.u32(e)?, r.u32(e + 4)? as usize, r.u64(e + 8)?);
        let values = r.range(r.u64(e + 16)?, r.u64(e + 24)?)?;
        let name = r.str(name_at, name_len)?.to_string();
        name_at += name_len;
        // The bytes of rows `rows` when each row takes `width` bytes.
        let part = |width: usize| -> Result<&[u8]> {
            let (a, b) = (rows.start * width, rows.end * width);
            if values.len() != num_rows * width {
                return Err(malformed("a column's length disagrees with the row count"));
            }
            Ok(&values[a..b])
        };
        let column = match tag {
            T_F32 => Column::F32(read_slice(part(4)?)),
            T_F64 => Column::F64(read_slice(part(8)?)),
            T_I64 => Column::I64(read_slice(part(8)?)),
            T_TENSOR => {
                let width = row_len
                    .checked_mul(4)
                    .ok_or_else(|| malformed("a tensor row is too long"))?;
                Column::tensor(read_slice(part(width)?), row_len)?
            }
            T_STR | T_BYTES => {
                let data = r.range(r.u64(e + 32)?, r.u64(e + 40)?)?;
                let all: &[u8] = values;
                if all.len() != (num_rows + 1) * 8 {
                    return Err(malformed(
                        "a string column's offsets disagree with the row count",
                    ));
                }
                let offsets: Vec<u64> = read_slice(&all[rows.start * 8..(rows.end + 1) * 8]);
                let items = offsets.windows(2).map(|w| {
                    data.get(w[0] as usize..w[1] as usize)
                        .ok_or_else(|| malformed("a string offset is out of range"))
                });
                if tag == T_BYTES {
                    Column::Bytes(
                        items
                            .map(|b| b.map(<[u8]>::to_vec))
                            .collect::<Result<_>>()?,
                    )
                } else {
                    Column::Str(
                        items
                            .map(|b| {
                                std::str::from_utf8(b?)
                                    .map(str::to_string)
                                    .map_err(|_| malformed("a string is not UTF-8"))
                            })
                            .collect::<Result<_>>()?,
                    )
                }
            }
            _ => return Err(malformed("unknown column type")),
        };
        columns.push((name, column));
    }
    let batch = Batch::new(columns)?;
    if count > 0 && batch.num_rows() != rows.len() {
        return Err(malformed("the row count disagrees with the columns"));
    }
    Ok(Decoded::Block(batch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Batch {
        Batch::new(vec![
            ("x".into(), Column::F32(vec![1.5, -2.0, 3.25])),
            ("y".into(), Column::F64(vec![0.1, 0.2, 0.3])),
            ("id".into(), Column::I64(vec![7, 8, 9])),
            (
                "name".into(),
                Column::Str(vec!["a".into(), "".into(), "héllo".into()]),
            ),
            (
                "raw".into(),
                Column::Bytes(vec![vec![0, 255, 7], vec![], vec![1]]),
            ),
            (
                "img".into(),
                Column::tensor((0..6).map(|v| v as f32).collect(), 2).unwrap(),
            ),
        ])
        .unwrap()
    }

    #[test]
    fn a_block_round_trips_and_its_rows_are_read_from_the_header() {
        let bytes = encode(&sample());
        assert_eq!(rows(&bytes).unwrap(), Some(3));
        match decode(&bytes).unwrap() {
            Decoded::Block(b) => assert_eq!(b, sample()),
            other => panic!("{other:?}"),
        }
        let empty = encode(&Batch::default());
        assert!(matches!(decode(&empty).unwrap(), Decoded::Block(b) if b.num_columns() == 0));
    }

    #[test]
    fn several_batches_encode_as_one_and_any_row_range_decodes_alone() {
        let all = sample();
        let parts = [all.slice(0..1), all.slice(1..3)];
        let bytes = encode_many(&parts);
        assert_eq!(rows(&bytes).unwrap(), Some(3));
        assert!(matches!(decode(&bytes).unwrap(), Decoded::Block(b) if b == all));
        for (a, b) in [(0, 0), (0, 1), (1, 3), (2, 3), (0, 3)] {
            match decode_rows(&bytes, Some(a..b)).unwrap() {
                Decoded::Block(got) => assert_eq!(got, all.slice(a..b), "{a}..{b}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(decode_rows(&bytes, Some(2..4)).is_err());
    }

    #[test]
    fn failures_round_trip_and_garbage_is_an_error_not_a_panic() {
        assert!(matches!(
            decode(&encode_failed("Map(f)", "boom")).unwrap(),
            Decoded::Failed { stage, message } if stage == "Map(f)" && message == "boom"
        ));
        assert!(matches!(
            decode(&encode_not_portable("s", "a", "b")).unwrap(),
            Decoded::NotPortable { stage, sent, here } if stage == "s" && sent == "a" && here == "b"
        ));
        assert_eq!(rows(&encode_failed("s", "x")).unwrap(), None);
        let bytes = encode(&sample());
        for cut in [0, 10, 30, 100, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[24] = 99; // an unknown column type
        assert!(decode(&bad).is_err());
    }
}
