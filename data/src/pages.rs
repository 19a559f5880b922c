//! A fixed-size list of numbers read straight from its Parquet pages.
//!
//! Parquet's column reader decodes every repetition and definition level
//! into a buffer of `i16`, every dictionary index into a buffer, and every
//! value into its stored type, before a tensor column can be made of them.
//! For a list whose row length is known up front (Arrow's fixed-size list),
//! none of that has to be kept: [`PageTensor`] walks the pages' run-length
//! encoded levels run by run, only to check that every row is whole and
//! nothing is null, and decodes the values (plain, or dictionary indices)
//! straight into the `f32`s of the tensor. A run of 8-bit indices, the
//! common case of a column of bytes, is one table lookup per value.
//!
//! Anything this reader does not know (an encoding other than plain or
//! dictionary, a null, a row of another length, an index outside the
//! dictionary) is [`Unsupported`]: the caller reads the row group again with
//! Parquet's column reader, which names the problem or reads what this one
//! does not.

use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::{Page, PageReader};

/// This reader cannot take the column chunk; read it the general way.
#[derive(Debug)]
pub(crate) struct Unsupported(pub(crate) String);

type Step<T> = std::result::Result<T, Unsupported>;

fn unsupported<T>(why: impl Into<String>) -> Step<T> {
    Err(Unsupported(why.into()))
}

/// How a stored value becomes an `f32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
}

impl Stored {
    /// The stored type of a column of `physical` values that Arrow reads
    /// as unsigned when `unsigned`.
    pub(crate) fn of(physical: PhysicalType, unsigned: bool) -> Option<Stored> {
        Some(match (physical, unsigned) {
            (PhysicalType::INT32, false) => Stored::I32,
            (PhysicalType::INT32, true) => Stored::U32,
            (PhysicalType::INT64, false) => Stored::I64,
            (PhysicalType::INT64, true) => Stored::U64,
            (PhysicalType::FLOAT, _) => Stored::F32,
            (PhysicalType::DOUBLE, _) => Stored::F64,
            _ => return None,
        })
    }

    fn width(self) -> usize {
        match self {
            Stored::I32 | Stored::U32 | Stored::F32 => 4,
            Stored::I64 | Stored::U64 | Stored::F64 => 8,
        }
    }

    /// Appends the plain-encoded values of `bytes` (whole values only).
    fn extend(self, bytes: &[u8], out: &mut Vec<f32>) {
        macro_rules! each {
            ($n:literal, $f:expr) => {
                out.extend(bytes.chunks_exact($n).map(|c| {
                    let mut b = [0u8; $n];
                    b.copy_from_slice(c);
                    $f(b)
                }))
            };
        }
        match self {
            Stored::I32 => each!(4, |b| i32::from_le_bytes(b) as f32),
            Stored::U32 => each!(4, |b| u32::from_le_bytes(b) as f32),
            Stored::I64 => each!(8, |b| i64::from_le_bytes(b) as f32),
            Stored::U64 => each!(8, |b| u64::from_le_bytes(b) as f32),
            Stored::F32 => each!(4, f32::from_le_bytes),
            Stored::F64 => each!(8, |b| f64::from_le_bytes(b) as f32),
        }
    }
}

/// One run of Parquet's RLE / bit-packed hybrid encoding.
enum Run<'a> {
    /// `count` copies of `value`.
    Repeat { value: u32, count: usize },
    /// `count` values of `width` bits packed from the least significant
    /// bit of `bytes` on.
    Packed { bytes: &'a [u8], count: usize },
}

/// Walks the runs of a hybrid-encoded buffer of `width`-bit values.
struct Hybrid<'a> {
    data: &'a [u8],
    at: usize,
    width: usize,
}

impl<'a> Hybrid<'a> {
    fn new(data: &'a [u8], width: usize) -> Step<Hybrid<'a>> {
        if width > 32 {
            return unsupported(format!("a bit width of {width}"));
        }
        Ok(Hybrid { data, at: 0, width })
    }

    fn varint(&mut self) -> Step<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.data.get(self.at) else {
                return unsupported("a run header past the end of the page");
            };
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        unsupported("a run header longer than ten bytes")
    }

    fn take(&mut self, n: usize) -> Step<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return unsupported("a run past the end of the page");
        };
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    /// The next run, or `None` at the end of the buffer.
    fn next_run(&mut self) -> Step<Option<Run<'a>>> {
        if self.at >= self.data.len() {
            return Ok(None);
        }
        let header = self.varint()?;
        let count = usize::try_from(header >> 1).unwrap_or(usize::MAX);
        if header & 1 == 0 {
            let raw = self.take(self.width.div_ceil(8))?;
            let mut le = [0u8; 4];
            le[..raw.len()].copy_from_slice(raw);
            let value = u32::from_le_bytes(le);
            Ok(Some(Run::Repeat { value, count }))
        } else {
            let count = count.saturating_mul(8);
            let bytes = self.take(count.saturating_mul(self.width) / 8)?;
            Ok(Some(Run::Packed { bytes, count }))
        }
    }
}

/// Value `i` of a bit-packed run of `width`-bit values.
fn unpack(bytes: &[u8], width: usize, i: usize) -> u32 {
    let bit = i * width;
    let start = bit / 8;
    let mut le = [0u8; 8];
    let end = (start + 8).min(bytes.len());
    le[..end - start].copy_from_slice(&bytes[start..end]);
    let word = u64::from_le_bytes(le) >> (bit % 8);
    (word & ((1u64 << width) - 1)) as u32
}

fn bit_width(max: i16) -> usize {
    (16 - max.leading_zeros()) as usize
}

/// The values of the data page now being read.
enum Values {
    None,
    Plain {
        buf: bytes::Bytes,
        at: usize,
    },
    Dict {
        buf: bytes::Bytes,
        at: usize,
        width: usize,
        run: Pending,
    },
}

/// What is left of the run being read from a dictionary page's indices.
#[derive(Clone, Copy)]
enum Pending {
    None,
    Repeat {
        value: u32,
        left: usize,
    },
    /// `left` values from value `next` of the packed run at
    /// `start..start + len` of the page.
    Packed {
        start: usize,
        len: usize,
        next: usize,
        left: usize,
    },
}

/// A fixed-size list column chunk read from its pages into `f32` rows.
pub(crate) struct PageTensor {
    pages: Box<dyn PageReader>,
    stored: Stored,
    row_len: usize,
    max_def: i16,
    /// The dictionary, converted; 256 entries at least, so that an 8-bit
    /// index needs no bounds check (`dict_len` says how many are real).
    dict: Vec<f32>,
    dict_len: usize,
    values: Values,
    /// Values left in the current data page.
    left: usize,
    /// Where the levels read so far stand in a row (0: at a row's start).
    in_row: usize,
}

impl PageTensor {
    /// A reader of the leaf column whose pages `pages` yields: values of
    /// type `stored`, rows of `row_len` values, definition levels up to
    /// `max_def` and repetition levels up to 1.
    pub(crate) fn new(
        pages: Box<dyn PageReader>,
        stored: Stored,
        row_len: usize,
        max_def: i16,
    ) -> PageTensor {
        PageTensor {
            pages,
            stored,
            row_len,
            max_def,
            dict: Vec::new(),
            dict_len: 0,
            values: Values::None,
            left: 0,
            in_row: 0,
        }
    }

    /// The next `rows` rows' values, row after row.
    pub(crate) fn read(&mut self, rows: usize) -> Step<Vec<f32>> {
        let want = rows * self.row_len;
        let mut out = Vec::with_capacity(want);
        while out.len() < want {
            if self.left == 0 {
                self.next_page()?;
                continue;
            }
            let n = self.left.min(want - out.len());
            self.decode(n, &mut out)?;
            self.left -= n;
        }
        Ok(out)
    }

    /// Loads the next data page (taking any dictionary page on the way).
    fn next_page(&mut self) -> Step<()> {
        let page = match self.pages.get_next_page() {
            Ok(Some(page)) => page,
            Ok(None) => return unsupported("the column chunk ended early"),
            Err(e) => return unsupported(e.to_string()),
        };
        match page {
            Page::DictionaryPage {
                buf,
                num_values,
                encoding,
                ..
            } => {
                if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                    return unsupported(format!("a dictionary encoded as {encoding}"));
                }
                let n = num_values as usize;
                if buf.len() < n * self.stored.width() {
                    return unsupported("a dictionary page shorter than its values");
                }
                self.dict.clear();
                self.stored
                    .extend(&buf[..n * self.stored.width()], &mut self.dict);
                self.dict_len = n;
                if self.dict.len() < 256 {
                    self.dict.resize(256, 0.0);
                }
                Ok(())
            }
            Page::DataPage {
                buf,
                num_values,
                encoding,
                def_level_encoding,
                rep_level_encoding,
                ..
            } => {
                if rep_level_encoding != Encoding::RLE
                    || (self.max_def > 0 && def_level_encoding != Encoding::RLE)
                {
                    return unsupported("levels not in the RLE encoding");
                }
                let n = num_values as usize;
                let mut at = 0;
                let prefixed = |at: &mut usize| -> Step<std::ops::Range<usize>> {
                    let Some(len) = buf.get(*at..*at + 4) else {
                        return unsupported("a level block past the end of the page");
                    };
                    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                    let range = *at + 4..*at + 4 + len;
                    if range.end > buf.len() {
                        return unsupported("a level block past the end of the page");
                    }
                    *at = range.end;
                    Ok(range)
                };
                let rep = prefixed(&mut at)?;
                let def = if self.max_def > 0 {
                    prefixed(&mut at)?
                } else {
                    at..at
                };
                self.check_levels(&buf[rep], &buf[def], n)?;
                self.start_values(buf, at, encoding, n)
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                num_nulls,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                if num_nulls != 0 {
                    return unsupported("nulls");
                }
                let n = num_values as usize;
                let rep_end = rep_levels_byte_len as usize;
                let def_end = rep_end + def_levels_byte_len as usize;
                if def_end > buf.len() {
                    return unsupported("level blocks past the end of the page");
                }
                self.check_levels(&buf[..rep_end], &buf[rep_end..def_end], n)?;
                self.start_values(buf, def_end, encoding, n)
            }
        }
    }

    /// Checks a page's `n` levels: every definition level at the maximum
    /// (nothing null or empty), and repetition levels that make whole rows
    /// of `row_len` values (a 0 to start each row, then 1s).
    fn check_levels(&mut self, rep: &[u8], def: &[u8], n: usize) -> Step<()> {
        if self.max_def > 0 {
            let mut runs = Hybrid::new(def, bit_width(self.max_def))?;
            let full = self.max_def as u32;
            let mut seen = 0;
            while seen < n {
                let Some(run) = runs.next_run()? else {
                    return unsupported("fewer definition levels than values");
                };
                let take = match run {
                    Run::Repeat { value, count } => {
                        if value != full {
                            return unsupported("nulls");
                        }
                        count.min(n - seen)
                    }
                    Run::Packed { bytes, count } => {
                        let take = count.min(n - seen);
                        if (0..take).any(|i| unpack(bytes, runs.width, i) != full) {
                            return unsupported("nulls");
                        }
                        take
                    }
                };
                seen += take;
            }
        }
        let mut runs = Hybrid::new(rep, 1)?;
        let mut seen = 0;
        while seen < n {
            let Some(run) = runs.next_run()? else {
                return unsupported("fewer repetition levels than values");
            };
            match run {
                Run::Repeat { value, count } => {
                    let take = count.min(n - seen);
                    for _ in 0..take.min(2) {
                        self.step_row(value)?;
                    }
                    if take > 2 {
                        // The rest of a run of 1s moves along one row; a run
                        // of 0s makes rows of one value.
                        let rest = take - 2;
                        if value == 1 {
                            if self.in_row == 0 || self.in_row + rest > self.row_len {
                                return unsupported("a row of another length");
                            }
                            self.in_row = (self.in_row + rest) % self.row_len;
                        } else if self.row_len != 1 {
                            return unsupported("a row of another length");
                        }
                    }
                    seen += take;
                }
                Run::Packed { bytes, count } => {
                    let take = count.min(n - seen);
                    for i in 0..take {
                        self.step_row(unpack(bytes, 1, i))?;
                    }
                    seen += take;
                }
            }
        }
        Ok(())
    }

    /// One repetition level.
    fn step_row(&mut self, level: u32) -> Step<()> {
        if level > 1 {
            return unsupported(format!("a repetition level of {level}"));
        }
        let starts = level == 0;
        if starts != (self.in_row == 0) {
            return unsupported("a row of another length");
        }
        self.in_row = (self.in_row + 1) % self.row_len;
        Ok(())
    }

    fn start_values(
        &mut self,
        buf: bytes::Bytes,
        at: usize,
        encoding: Encoding,
        n: usize,
    ) -> Step<()> {
        self.values = match encoding {
            Encoding::PLAIN => {
                if buf.len() - at < n * self.stored.width() {
                    return unsupported("a page shorter than its values");
                }
                Values::Plain { buf, at }
            }
            Encoding::PLAIN_DICTIONARY | Encoding::RLE_DICTIONARY => {
                if self.dict_len == 0 {
                    return unsupported("dictionary indices with no dictionary");
                }
                let Some(&width) = buf.get(at) else {
                    return unsupported("a page with no bit width");
                };
                if width > 32 {
                    return unsupported(format!("a bit width of {width}"));
                }
                Values::Dict {
                    buf,
                    at: at + 1,
                    width: width as usize,
                    run: Pending::None,
                }
            }
            other => return unsupported(format!("values encoded as {other}")),
        };
        self.left = n;
        Ok(())
    }

    /// Decodes the current page's next `n` values into `out`.
    fn decode(&mut self, n: usize, out: &mut Vec<f32>) -> Step<()> {
        let width = self.stored.width();
        let (dict, dict_len) = (&self.dict, self.dict_len);
        match &mut self.values {
            Values::None => unsupported("values before any data page"),
            Values::Plain { buf, at } => {
                self.stored.extend(&buf[*at..*at + n * width], out);
                *at += n * width;
                Ok(())
            }
            Values::Dict {
                buf,
                at,
                width,
                run,
            } => {
                let mut need = n;
                while need > 0 {
                    if let Pending::None = run {
                        let mut runs = Hybrid::new(&buf[..], *width)?;
                        runs.at = *at;
                        *run = match runs.next_run()? {
                            None => return unsupported("fewer indices than values"),
                            Some(Run::Repeat { value, count }) => {
                                Pending::Repeat { value, left: count }
                            }
                            Some(Run::Packed { bytes, count }) => {
                                let start = runs.at - bytes.len();
                                Pending::Packed {
                                    start,
                                    len: bytes.len(),
                                    next: 0,
                                    left: count,
                                }
                            }
                        };
                        *at = runs.at;
                    }
                    let took = match run {
                        Pending::None => 0,
                        Pending::Repeat { value, left } => {
                            let take = need.min(*left);
                            let Some(&v) = dict[..dict_len].get(*value as usize) else {
                                return unsupported("an index outside the dictionary");
                            };
                            out.extend(std::iter::repeat_n(v, take));
                            *left -= take;
                            take
                        }
                        Pending::Packed {
                            start,
                            len,
                            next,
                            left,
                        } => {
                            let take = need.min(*left);
                            let bytes = &buf[*start..*start + *len];
                            if *width == 8 {
                                let idx = &bytes[*next..*next + take];
                                if idx.iter().copied().max().unwrap_or(0) as usize >= dict_len {
                                    return unsupported("an index outside the dictionary");
                                }
                                let table: &[f32; 256] = dict[..256]
                                    .try_into()
                                    .map_err(|_| Unsupported("a short table".into()))?;
                                out.extend(idx.iter().map(|&i| table[i as usize]));
                            } else {
                                for i in *next..*next + take {
                                    let index = unpack(bytes, *width, i) as usize;
                                    let Some(&v) = dict[..dict_len].get(index) else {
                                        return unsupported("an index outside the dictionary");
                                    };
                                    out.push(v);
                                }
                            }
                            *next += take;
                            *left -= take;
                            take
                        }
                    };
                    need -= took;
                    if matches!(
                        run,
                        Pending::Repeat { left: 0, .. } | Pending::Packed { left: 0, .. }
                    ) {
                        *run = Pending::None;
                    }
                }
                Ok(())
            }
        }
    }
}
