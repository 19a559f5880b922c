//! Parquet files: footers read when a dataset is made (schema, row groups),
//! row groups read by block tasks, and blocks written back.
//!
//! Column types map as follows: `float` to `f32`, `double` to `f64`,
//! every integer type to `i64`, strings to `str`, binary to `bytes`, and a list of numbers
//! whose rows all have one length (Arrow's fixed-size list, or a plain list)
//! to a tensor column of `f32`. Nulls have no representation here and are
//! an error naming the column.

use super::batch::{Batch, Column};
use super::error::{DataError, Result};
use super::pages::{PageTensor, Stored, Unsupported};
use super::schema::{ColumnType, Field, Schema};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, RecordBatch};
use arrow_schema::{DataType, Field as ArrowField};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::column::reader::ColumnReader;
use parquet::file::properties::ReaderProperties;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::RowGroupReader;
use parquet::file::serialized_reader::SerializedRowGroupReader;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One unit of reading: a row group of a file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RowGroup {
    pub(crate) path: PathBuf,
    pub(crate) index: usize,
    pub(crate) rows: usize,
}

/// What a dataset learns from the files' footers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Files {
    pub(crate) row_groups: Vec<RowGroup>,
    pub(crate) schema: Schema,
    /// The columns read, or every column.
    pub(crate) columns: Option<Vec<String>>,
}

fn err(path: &Path, reason: impl ToString) -> DataError {
    DataError::Parquet {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn open(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>> {
    let file = File::open(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| err(path, format!("not a readable Parquet file ({e})")))
}

/// The column type an Arrow type is read as.
fn column_type(path: &Path, name: &str, t: &DataType) -> Result<ColumnType> {
    let unsupported = || {
        err(
            path,
            format!(
                "column {name:?} is {t}, which has no column type here (numbers, strings, binary, and lists of numbers are read)"
            ),
        )
    };
    Ok(match t {
        DataType::Float32 => ColumnType::F32,
        DataType::Float64 => ColumnType::F64,
        t if t.is_integer() => ColumnType::I64,
        DataType::Utf8 | DataType::LargeUtf8 => ColumnType::Str,
        DataType::Binary | DataType::LargeBinary => ColumnType::Bytes,
        DataType::FixedSizeList(item, len) if is_number(item.data_type()) => ColumnType::Tensor {
            row_len: usize::try_from(*len).map_err(|_| unsupported())?,
        },
        // A plain list: its length is known only from the data; 0 stands
        // for "to be read" and is replaced with the first row's length.
        DataType::List(item) | DataType::LargeList(item) if is_number(item.data_type()) => {
            ColumnType::Tensor { row_len: 0 }
        }
        _ => return Err(unsupported()),
    })
}

fn is_number(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

/// Reads every file's footer: the row groups to read, and the one schema
/// they share (of the chosen `columns`, in that order, or of all columns).
pub(crate) fn scan(paths: &[PathBuf], columns: Option<&[String]>) -> Result<Files> {
    let mut row_groups = Vec::new();
    let mut first: Option<(PathBuf, Schema)> = None;
    for path in paths {
        let builder = open(path)?;
        let arrow = builder.schema().clone();
        let available: Vec<String> = arrow.fields().iter().map(|f| f.name().clone()).collect();
        let chosen: Vec<usize> = match columns {
            None => (0..arrow.fields().len()).collect(),
            Some(cols) => {
                cols.iter()
                    .map(|c| {
                        available.iter().position(|a| a == c).ok_or_else(|| {
                            DataError::MissingColumn {
                                path: path.clone(),
                                column: c.clone(),
                                available: available.clone(),
                            }
                        })
                    })
                    .collect::<Result<_>>()?
            }
        };
        let mut fields = Vec::with_capacity(chosen.len());
        for &i in &chosen {
            let f = arrow.field(i);
            fields.push(Field {
                name: f.name().clone(),
                data_type: column_type(path, f.name(), f.data_type())?,
            });
        }
        let schema = Schema { fields };
        match &first {
            None => first = Some((path.clone(), schema)),
            Some((first_path, expected)) if !same_schema(expected, &schema) => {
                return Err(DataError::FileSchema {
                    path: path.clone(),
                    first: first_path.clone(),
                    expected: expected.clone(),
                    found: schema,
                })
            }
            Some(_) => {}
        }
        for (index, rg) in builder.metadata().row_groups().iter().enumerate() {
            let rows =
                usize::try_from(rg.num_rows()).map_err(|_| err(path, "negative row count"))?;
            if rows > 0 {
                row_groups.push(RowGroup {
                    path: path.clone(),
                    index,
                    rows,
                });
            }
        }
    }
    let schema = first.map(|(_, s)| s).unwrap_or_default();
    Ok(Files {
        row_groups,
        schema,
        columns: columns.map(<[String]>::to_vec),
    })
}

/// Schemas are the same if names and types agree, a plain list's unknown
/// length agreeing with any length.
fn same_schema(a: &Schema, b: &Schema) -> bool {
    a.fields.len() == b.fields.len()
        && a.fields.iter().zip(&b.fields).all(|(x, y)| {
            x.name == y.name
                && match (x.data_type, y.data_type) {
                    (ColumnType::Tensor { row_len: p }, ColumnType::Tensor { row_len: q }) => {
                        p == q || p == 0 || q == 0
                    }
                    (p, q) => p == q,
                }
        })
}

/// Reads one row group, in batches of up to `chunk_rows` rows (decoded
/// straight into batches that size, so a batch function that wants them
/// needs no copy).
///
/// Tensor columns whose values are plain numbers are decoded by Parquet's
/// column reader straight into `f32` rows ([`TensorReader`]); the other
/// columns go through Arrow's reader.
pub(crate) fn read(
    group: &RowGroup,
    columns: Option<&[String]>,
    chunk_rows: usize,
) -> Result<Vec<Batch>> {
    match read_group(group, columns, chunk_rows, true)? {
        Ok(batches) => Ok(batches),
        // Something the page reader does not take: Parquet's column reader
        // reads the row group again, and names any problem.
        Err(Unsupported(why)) => read_group(group, columns, chunk_rows, false)?
            .map_err(|Unsupported(again)| err(&group.path, format!("{why}; {again}"))),
    }
}

/// Reads `group` in chunks of `chunk_rows` rows; with `pages`, its
/// fixed-size lists straight from their pages.
fn read_group(
    group: &RowGroup,
    columns: Option<&[String]>,
    chunk_rows: usize,
    pages: bool,
) -> Result<std::result::Result<Vec<Batch>, Unsupported>> {
    let path = &group.path;
    let builder = open(path)?;
    let arrow = builder.schema().clone();
    let available = || arrow.fields().iter().map(|f| f.name().clone()).collect();
    let order: Vec<usize> = match columns {
        None => (0..arrow.fields().len()).collect(),
        Some(cols) => cols
            .iter()
            .map(|c| {
                arrow.index_of(c).map_err(|_| DataError::MissingColumn {
                    path: path.clone(),
                    column: c.clone(),
                    available: available(),
                })
            })
            .collect::<Result<_>>()?,
    };
    let chunk_rows = chunk_rows.clamp(1, group.rows.max(1));
    // Column readers for the tensor columns, from the footer already read.
    let file = Arc::new(File::open(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?);
    let metadata = builder.metadata().clone();
    let row_group = SerializedRowGroupReader::new(
        file,
        metadata.row_group(group.index),
        metadata.page_index_for_row_group(group.index),
        Arc::new(ReaderProperties::builder().build()),
    )
    .map_err(|e| err(path, format!("row group {}: {e}", group.index)))?;
    let mut tensors = Vec::new();
    let mut rest = Vec::new();
    for &root in &order {
        let schema = builder.parquet_schema();
        match TensorReader::open(path, &row_group, schema, &arrow, root, pages)? {
            Some(reader) => tensors.push(reader),
            None => rest.push(root),
        }
    }
    let mut arrow_batches = if rest.is_empty() {
        None
    } else {
        let mask = ProjectionMask::roots(builder.parquet_schema(), rest.iter().copied());
        Some(
            builder
                .with_projection(mask)
                .with_row_groups(vec![group.index])
                .with_batch_size(chunk_rows)
                .build()
                .map_err(|e| err(path, e))?,
        )
    };
    let mut out = Vec::with_capacity(group.rows.div_ceil(chunk_rows));
    let mut done = 0;
    while done < group.rows {
        let rows = chunk_rows.min(group.rows - done);
        let mut named: Vec<(String, Column)> = Vec::with_capacity(order.len());
        if let Some(reader) = arrow_batches.as_mut() {
            let batch = reader
                .next()
                .ok_or_else(|| err(path, format!("row group {} ended early", group.index)))?
                .map_err(|e| err(path, format!("row group {}: {e}", group.index)))?;
            if batch.num_rows() != rows {
                return Err(err(
                    path,
                    format!(
                        "row group {}: read {} rows where {rows} were expected",
                        group.index,
                        batch.num_rows()
                    ),
                ));
            }
            named.extend(to_batch(path, &batch)?.into_columns());
        }
        for t in &mut tensors {
            match t.read(path, group.index, rows)? {
                Ok(column) => named.push((t.name.clone(), column)),
                Err(why) => return Ok(Err(why)),
            }
        }
        let mut ordered = Vec::with_capacity(order.len());
        for &root in &order {
            let name = arrow.field(root).name();
            if let Some(i) = named.iter().position(|(n, _)| n == name) {
                ordered.push(named.swap_remove(i));
            }
        }
        out.push(Batch::new(ordered)?);
        done += rows;
    }
    Ok(Ok(out))
}

/// A list column of plain numbers (INT32, INT64, FLOAT or DOUBLE values),
/// read by Parquet's column reader: values and levels are decoded in bulk
/// and converted to `f32` rows in one pass, with no Arrow list arrays in
/// between.
struct TensorReader {
    name: String,
    /// The values' Arrow type (how a stored integer is to be read).
    item: DataType,
    /// Known up front for a fixed-size list; taken from the first row of a
    /// plain list.
    row_len: Option<usize>,
    reader: Source,
    def: Vec<i16>,
    rep: Vec<i16>,
    /// Rows read so far.
    done: usize,
}

/// Where a [`TensorReader`]'s values come from.
enum Source {
    /// Parquet's column reader, levels and values decoded into buffers.
    Levels(Box<ColumnReader>),
    /// The pages themselves (a fixed-size list only).
    Pages(PageTensor),
}

impl TensorReader {
    /// The reader of root column `root`, or `None` when it is not a list of
    /// plain numbers (Arrow's reader takes it then). With `pages`, a
    /// fixed-size list is read straight from its pages.
    fn open(
        path: &Path,
        row_group: &dyn RowGroupReader,
        parquet_schema: &parquet::schema::types::SchemaDescriptor,
        arrow: &arrow_schema::Schema,
        root: usize,
        pages: bool,
    ) -> Result<Option<TensorReader>> {
        let field = arrow.field(root);
        let (item, row_len) = match field.data_type() {
            DataType::FixedSizeList(item, len) => {
                (item.data_type().clone(), usize::try_from(*len).ok())
            }
            DataType::List(item) | DataType::LargeList(item) => (item.data_type().clone(), None),
            _ => return Ok(None),
        };
        if !is_number(&item) || row_len == Some(0) {
            return Ok(None);
        }
        let leaves: Vec<usize> = (0..parquet_schema.num_columns())
            .filter(|&leaf| parquet_schema.get_column_root_idx(leaf) == root)
            .collect();
        let [leaf] = leaves[..] else {
            return Ok(None);
        };
        let descr = parquet_schema.column(leaf);
        let plain = matches!(
            descr.physical_type(),
            PhysicalType::INT32 | PhysicalType::INT64 | PhysicalType::FLOAT | PhysicalType::DOUBLE
        );
        if !plain || descr.max_rep_level() != 1 {
            return Ok(None);
        }
        let unsigned = matches!(item, DataType::UInt32 | DataType::UInt64);
        let stored = Stored::of(descr.physical_type(), unsigned);
        let fail =
            |e: parquet::errors::ParquetError| err(path, format!("column {:?}: {e}", field.name()));
        let reader = match (pages, row_len, stored) {
            (true, Some(row_len), Some(stored)) => Source::Pages(PageTensor::new(
                row_group.get_column_page_reader(leaf).map_err(fail)?,
                stored,
                row_len,
                descr.max_def_level(),
            )),
            _ => Source::Levels(Box::new(row_group.get_column_reader(leaf).map_err(fail)?)),
        };
        Ok(Some(TensorReader {
            name: field.name().clone(),
            item,
            row_len,
            reader,
            def: Vec::new(),
            rep: Vec::new(),
            done: 0,
        }))
    }

    /// The next `rows` rows as a tensor column; `Unsupported` when its
    /// pages hold something the page reader does not take.
    fn read(
        &mut self,
        path: &Path,
        row_group: usize,
        rows: usize,
    ) -> Result<std::result::Result<Column, Unsupported>> {
        let name = self.name.clone();
        let fail = |reason: String| {
            err(
                path,
                format!("row group {row_group}, column {name:?}: {reason}"),
            )
        };
        let reader = match &mut self.reader {
            Source::Pages(pages) => {
                let Some(row_len) = self.row_len else {
                    return Ok(Err(Unsupported("a list of unknown length".into())));
                };
                return Ok(match pages.read(rows) {
                    Ok(values) => {
                        self.done += rows;
                        Ok(tensor(path, &name, values, row_len)?)
                    }
                    Err(why) => Err(why),
                });
            }
            Source::Levels(reader) => reader,
        };
        self.def.clear();
        self.rep.clear();
        let (def, rep) = (Some(&mut self.def), Some(&mut self.rep));
        // Room for every value at once (the reader grows its buffer page
        // by page otherwise).
        let expected = self.row_len.map_or(0, |n| n * rows);
        macro_rules! read_as {
            ($r:expr, $t:ty, $convert:expr) => {{
                let mut values: Vec<$t> = Vec::with_capacity(expected);
                let (records, count, levels) = $r
                    .read_records(rows, def, rep, &mut values)
                    .map_err(|e| fail(e.to_string()))?;
                (
                    records,
                    count,
                    levels,
                    values.iter().map($convert).collect::<Vec<f32>>(),
                )
            }};
        }
        let (records, count, levels, values) = match (&mut **reader, &self.item) {
            (ColumnReader::Int32ColumnReader(r), DataType::UInt32) => {
                read_as!(r, i32, |v: &i32| *v as u32 as f32)
            }
            (ColumnReader::Int32ColumnReader(r), _) => read_as!(r, i32, |v: &i32| *v as f32),
            (ColumnReader::Int64ColumnReader(r), DataType::UInt64) => {
                read_as!(r, i64, |v: &i64| *v as u64 as f32)
            }
            (ColumnReader::Int64ColumnReader(r), _) => read_as!(r, i64, |v: &i64| *v as f32),
            (ColumnReader::FloatColumnReader(r), _) => read_as!(r, f32, |v: &f32| *v),
            (ColumnReader::DoubleColumnReader(r), _) => read_as!(r, f64, |v: &f64| *v as f32),
            _ => return Err(fail("its physical type changed while reading".into())),
        };
        if records != rows {
            return Err(fail(format!(
                "read {records} rows where {rows} were expected"
            )));
        }
        // A value comes only with a level at the full definition level, so
        // as many values as levels means no null or empty list anywhere.
        if count != levels {
            return Err(fail(
                "it holds null or empty lists, or null values; nulls have no representation in a dataset (fill or drop them when writing the file)".into(),
            ));
        }
        let row_len = *self.row_len.get_or_insert_with(|| {
            self.rep
                .iter()
                .skip(1)
                .position(|&r| r == 0)
                .map_or(levels, |p| p + 1)
        });
        // Each row's levels: a 0 (a new row) and then only 1s.
        let even = row_len > 0
            && levels == records * row_len
            && self
                .rep
                .chunks_exact(row_len)
                .all(|r| r[0] == 0 && !r[1..].contains(&0));
        if !even {
            let (row, len) = first_other_length(&self.rep, row_len);
            return Err(fail(format!(
                "row {} of the row group has {len} values where the column's rows have {row_len}; a list column is read as a tensor, whose rows all have one length (ragged lists cannot be read)",
                self.done + row
            )));
        }
        self.done += records;
        tensor(path, &name, values, row_len).map(Ok)
    }
}

fn to_batch(path: &Path, batch: &RecordBatch) -> Result<Batch> {
    let schema = batch.schema();
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, array) in schema.fields().iter().zip(batch.columns()) {
        columns.push((field.name().clone(), to_column(path, field.name(), array)?));
    }
    Batch::new(columns)
}

fn no_nulls(path: &Path, name: &str, array: &dyn Array) -> Result<()> {
    if array.null_count() > 0 {
        return Err(err(
            path,
            format!(
                "column {name:?} has {} null values; nulls have no representation in a dataset (fill or drop them when writing the file)",
                array.null_count()
            ),
        ));
    }
    Ok(())
}

/// Integers of any width as i64.
fn integers(path: &Path, name: &str, array: &ArrayRef) -> Result<Vec<i64>> {
    macro_rules! widen {
        ($t:ty) => {
            array
                .as_primitive::<$t>()
                .values()
                .iter()
                .map(|v| *v as i64)
                .collect()
        };
    }
    Ok(match array.data_type() {
        DataType::Int8 => widen!(Int8Type),
        DataType::Int16 => widen!(Int16Type),
        DataType::Int32 => widen!(Int32Type),
        DataType::Int64 => array.as_primitive::<Int64Type>().values().to_vec(),
        DataType::UInt8 => widen!(UInt8Type),
        DataType::UInt16 => widen!(UInt16Type),
        DataType::UInt32 => widen!(UInt32Type),
        DataType::UInt64 => array
            .as_primitive::<UInt64Type>()
            .values()
            .iter()
            .map(|v| i64::try_from(*v))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| err(path, format!("column {name:?} holds a u64 above i64::MAX")))?,
        t => return Err(err(path, format!("column {name:?} is {t}, not an integer"))),
    })
}

/// Numbers of any type as f32 (the values of a tensor column).
fn floats(path: &Path, name: &str, array: &ArrayRef) -> Result<Vec<f32>> {
    no_nulls(path, name, array)?;
    macro_rules! convert {
        ($t:ty) => {
            array
                .as_primitive::<$t>()
                .values()
                .iter()
                .map(|v| *v as f32)
                .collect()
        };
    }
    Ok(match array.data_type() {
        DataType::Float32 => array.as_primitive::<Float32Type>().values().to_vec(),
        DataType::Float64 => convert!(Float64Type),
        DataType::UInt8 => convert!(UInt8Type),
        DataType::Int8 => convert!(Int8Type),
        DataType::Int16 => convert!(Int16Type),
        DataType::UInt16 => convert!(UInt16Type),
        DataType::Int32 => convert!(Int32Type),
        DataType::UInt32 => convert!(UInt32Type),
        DataType::Int64 => convert!(Int64Type),
        DataType::UInt64 => convert!(UInt64Type),
        t => return Err(err(path, format!("column {name:?} holds {t}, not numbers"))),
    })
}

fn to_column(path: &Path, name: &str, array: &ArrayRef) -> Result<Column> {
    no_nulls(path, name, array)?;
    // The items of a string or binary array, owned (nulls were refused).
    macro_rules! owned_items {
        ($as:ident::<$o:ty>, $own:ident) => {
            array
                .$as::<$o>()
                .iter()
                .map(|v| v.unwrap_or_default().$own())
                .collect()
        };
    }
    Ok(match array.data_type() {
        DataType::Float32 => Column::F32(array.as_primitive::<Float32Type>().values().to_vec()),
        DataType::Float64 => Column::F64(array.as_primitive::<Float64Type>().values().to_vec()),
        t if t.is_integer() => Column::I64(integers(path, name, array)?),
        DataType::Utf8 => Column::Str(owned_items!(as_string::<i32>, to_string)),
        DataType::LargeUtf8 => Column::Str(owned_items!(as_string::<i64>, to_string)),
        DataType::Binary => Column::Bytes(owned_items!(as_binary::<i32>, to_vec)),
        DataType::LargeBinary => Column::Bytes(owned_items!(as_binary::<i64>, to_vec)),
        DataType::FixedSizeList(_, len) => {
            let list = array.as_fixed_size_list();
            let row_len = *len as usize;
            let start = list.value_offset_at(0);
            let values = list.values().slice(start, list.len() * row_len);
            tensor(path, name, floats(path, name, &values)?, row_len)?
        }
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            let offsets: Vec<usize> = list.offsets().iter().map(|o| *o as usize).collect();
            ragged(path, name, list.values(), &offsets)?
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            let offsets: Vec<usize> = list.offsets().iter().map(|o| *o as usize).collect();
            ragged(path, name, list.values(), &offsets)?
        }
        t => {
            return Err(err(
                path,
                format!("column {name:?} is {t}, which has no column type here"),
            ))
        }
    })
}

fn tensor(path: &Path, name: &str, values: Vec<f32>, row_len: usize) -> Result<Column> {
    if row_len == 0 {
        return Err(err(path, format!("column {name:?} has rows of length 0")));
    }
    Column::tensor(values, row_len)
}

/// A plain list column whose rows must all have one length.
fn ragged(path: &Path, name: &str, values: &ArrayRef, offsets: &[usize]) -> Result<Column> {
    let (Some(&start), Some(&end)) = (offsets.first(), offsets.last()) else {
        return Err(err(path, format!("column {name:?} has no offsets")));
    };
    let row_len = offsets.get(1).map(|o| o - start).unwrap_or(1);
    if let Some(w) = offsets.windows(2).position(|w| w[1] - w[0] != row_len) {
        return Err(err(
            path,
            format!(
                "column {name:?}: row {w} has {} values, but row 0 has {row_len}; a list column is read as a tensor, whose rows all have one length",
                offsets[w + 1] - offsets[w]
            ),
        ));
    }
    let values = values.slice(start, end - start);
    tensor(path, name, floats(path, name, &values)?, row_len)
}

/// The first row (by its repetition levels) whose length is not
/// `row_len`, and its length.
fn first_other_length(rep: &[i16], row_len: usize) -> (usize, usize) {
    let starts: Vec<usize> = rep
        .iter()
        .enumerate()
        .filter(|(_, &r)| r == 0)
        .map(|(i, _)| i)
        .chain(std::iter::once(rep.len()))
        .collect();
    starts
        .windows(2)
        .enumerate()
        .find(|(_, w)| w[1] - w[0] != row_len)
        .map_or((0, 0), |(row, w)| (row, w[1] - w[0]))
}

/// Writes one batch as a Parquet file (snappy-compressed), tensor columns
/// as fixed-size lists of `float`.
pub(crate) fn write(path: &Path, batch: &Batch) -> Result<()> {
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (name, column) in batch.columns() {
        let (t, array): (DataType, ArrayRef) = match column {
            Column::F32(v) => (
                DataType::Float32,
                Arc::new(arrow_array::Float32Array::from(v.clone())),
            ),
            Column::F64(v) => (
                DataType::Float64,
                Arc::new(arrow_array::Float64Array::from(v.clone())),
            ),
            Column::I64(v) => (
                DataType::Int64,
                Arc::new(arrow_array::Int64Array::from(v.clone())),
            ),
            Column::Str(v) => (
                DataType::Utf8,
                Arc::new(arrow_array::StringArray::from(v.clone())),
            ),
            Column::Bytes(v) => (
                DataType::Binary,
                Arc::new(arrow_array::BinaryArray::from_iter_values(v)),
            ),
            Column::Tensor { values, row_len } => {
                let item = Arc::new(ArrowField::new("item", DataType::Float32, false));
                let len = i32::try_from(*row_len).map_err(|_| {
                    err(path, format!("column {name:?}: rows too long for Parquet"))
                })?;
                let list = FixedSizeListArray::try_new(
                    item.clone(),
                    len,
                    Arc::new(arrow_array::Float32Array::from(values.clone())),
                    None,
                )
                .map_err(|e| err(path, e))?;
                (DataType::FixedSizeList(item, len), Arc::new(list))
            }
        };
        fields.push(ArrowField::new(name, t, false));
        arrays.push(array);
    }
    let schema = Arc::new(arrow_schema::Schema::new(fields));
    let record = if arrays.is_empty() {
        RecordBatch::new_empty(schema.clone())
    } else {
        RecordBatch::try_new(schema.clone(), arrays).map_err(|e| err(path, e))?
    };
    let file = File::create(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let mut writer = ArrowWriter::try_new(file, schema, Some(props)).map_err(|e| err(path, e))?;
    writer.write(&record).map_err(|e| err(path, e))?;
    writer.close().map_err(|e| err(path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{ListBuilder, UInt32Builder};
    use arrow_array::{Int64Array, ListArray, UInt8Array};
    use arrow_schema::Schema as ArrowSchema;

    /// A file under the temp dir, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str) -> TempFile {
            TempFile(std::env::temp_dir().join(format!(
                "prism-parquet-unit-{}-{name}.parquet",
                std::process::id()
            )))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Writes `columns` as one file of row groups of `group_rows` rows, with
    /// the writer's defaults (dictionary encoding on, as pyarrow's).
    fn write_arrow(file: &TempFile, columns: Vec<(&str, ArrayRef)>, group_rows: usize) {
        let fields: Vec<ArrowField> = columns
            .iter()
            .map(|(n, a)| ArrowField::new(*n, a.data_type().clone(), true))
            .collect();
        let schema = Arc::new(ArrowSchema::new(fields));
        let batch =
            RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect())
                .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group_rows))
            .build();
        let mut writer =
            ArrowWriter::try_new(File::create(&file.0).unwrap(), schema, Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    /// Writes one fixed-size list column `v` of `rows` rows of `len` values
    /// with writer properties `props`.
    fn write_list(file: &TempFile, values: ArrayRef, len: usize, props: WriterProperties) {
        let item = Arc::new(ArrowField::new("item", values.data_type().clone(), false));
        let list = FixedSizeListArray::try_new(item, len as i32, values, None).unwrap();
        let schema = Arc::new(ArrowSchema::new(vec![ArrowField::new(
            "v",
            list.data_type().clone(),
            false,
        )]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(list)]).unwrap();
        let mut writer =
            ArrowWriter::try_new(File::create(&file.0).unwrap(), schema, Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    /// Reads every row group of `file` in chunks of `chunk` rows both ways,
    /// requiring the page reader to take it, and returns its values.
    fn pages_and_levels_agree(file: &TempFile, chunk: usize) -> Vec<f32> {
        let files = scan(std::slice::from_ref(&file.0), None).unwrap();
        let mut all = Vec::new();
        for group in &files.row_groups {
            let pages = read_group(group, None, chunk, true)
                .unwrap()
                .unwrap_or_else(|why| panic!("the page reader refused it: {}", why.0));
            let levels = read_group(group, None, chunk, false).unwrap().unwrap();
            assert_eq!(pages, levels, "row group {}", group.index);
            for batch in pages {
                all.extend_from_slice(batch.tensor("v").unwrap().values);
            }
        }
        all
    }

    #[test]
    fn fixed_size_lists_are_read_from_their_pages_in_every_encoding() {
        use arrow_array::{Float64Array, Int32Array, UInt32Array};
        use parquet::basic::Encoding;
        use parquet::file::properties::WriterVersion;
        let (rows, len) = (300, 5);
        let file = TempFile::new("pages");
        let small = |b: parquet::file::properties::WriterPropertiesBuilder| {
            b.set_data_page_row_count_limit(7)
                .set_write_batch_size(7)
                .set_max_row_group_row_count(Some(110))
                .build()
        };
        let bytes = pixels(rows, len);
        let want_bytes: Vec<f32> = bytes.iter().map(|&b| f32::from(b)).collect();
        let u8s: ArrayRef = Arc::new(UInt8Array::from(bytes));
        // 8-bit dictionary indices, in many pages, V1 and V2 pages.
        for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
            let props = small(WriterProperties::builder().set_writer_version(version));
            write_list(&file, u8s.clone(), len, props);
            for chunk in [1, 4, 110] {
                assert_eq!(pages_and_levels_agree(&file, chunk), want_bytes);
            }
        }
        // Plain pages, no dictionary.
        let plain = WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_encoding(Encoding::PLAIN);
        write_list(&file, u8s, len, small(plain));
        assert_eq!(pages_and_levels_agree(&file, 3), want_bytes);
        // Indices of 11 bits (1,500 distinct values), and a dictionary that
        // overflows into plain pages within one column chunk.
        let wide: Vec<i32> = (0..(rows * len) as i32)
            .map(|i| i * 37 % 1500 - 700)
            .collect();
        let want: Vec<f32> = wide.iter().map(|&v| v as f32).collect();
        let ints: ArrayRef = Arc::new(Int32Array::from(wide));
        write_list(&file, ints.clone(), len, small(WriterProperties::builder()));
        assert_eq!(pages_and_levels_agree(&file, 9), want);
        let overflow = WriterProperties::builder().set_dictionary_page_size_limit(256);
        write_list(&file, ints, len, small(overflow));
        assert_eq!(pages_and_levels_agree(&file, 9), want);
        // Unsigned 32-bit values past i32::MAX, and doubles.
        let big: Vec<u32> = (0..(rows * len) as u32).map(|i| u32::MAX - i).collect();
        let want: Vec<f32> = big.iter().map(|&v| v as f32).collect();
        let props = small(WriterProperties::builder());
        write_list(&file, Arc::new(UInt32Array::from(big)), len, props);
        assert_eq!(pages_and_levels_agree(&file, 50), want);
        let doubles: Vec<f64> = (0..rows * len).map(|i| i as f64 / 3.0).collect();
        let want: Vec<f32> = doubles.iter().map(|&v| v as f32).collect();
        let props = small(WriterProperties::builder());
        write_list(&file, Arc::new(Float64Array::from(doubles)), len, props);
        assert_eq!(pages_and_levels_agree(&file, 50), want);
    }

    #[test]
    fn a_null_in_a_fixed_size_list_is_left_to_the_column_reader_which_names_it() {
        let file = TempFile::new("pages-null");
        let item = Arc::new(ArrowField::new("item", DataType::Int64, true));
        let values = Arc::new(Int64Array::from(vec![Some(1), Some(2), None, Some(4)]));
        let list = FixedSizeListArray::try_new(item, 2, values, None).unwrap();
        write_arrow(&file, vec![("v", Arc::new(list))], 10);
        let files = scan(std::slice::from_ref(&file.0), None).unwrap();
        let why = read_group(&files.row_groups[0], None, 10, true)
            .unwrap()
            .expect_err("a null is not for the page reader");
        assert!(why.0.contains("null"), "{}", why.0);
        let e = read_all(&file, None, 10).unwrap_err().to_string();
        assert!(e.contains("nulls") && e.contains("\"v\""), "{e}");
    }

    fn read_all(file: &TempFile, columns: Option<&[String]>, chunk: usize) -> Result<Batch> {
        let files = scan(std::slice::from_ref(&file.0), columns)?;
        let mut parts = Vec::new();
        for group in &files.row_groups {
            parts.extend(read(group, columns, chunk)?);
        }
        Batch::concat(&parts)
    }

    fn pixels(rows: usize, len: usize) -> Vec<u8> {
        (0..rows * len).map(|i| (i * 7 % 256) as u8).collect()
    }

    #[test]
    fn fixed_size_lists_of_u8_read_as_tensors_in_any_chunking_and_order() {
        let file = TempFile::new("fixed");
        let (rows, len) = (50, 6);
        let item = Arc::new(ArrowField::new("item", DataType::UInt8, true));
        let values = Arc::new(UInt8Array::from(pixels(rows, len)));
        let image = FixedSizeListArray::try_new(item, len as i32, values, None).unwrap();
        let label = Int64Array::from_iter_values(0..rows as i64);
        write_arrow(
            &file,
            vec![("image", Arc::new(image)), ("label", Arc::new(label))],
            20,
        );
        let want: Vec<f32> = pixels(rows, len).into_iter().map(f32::from).collect();
        for chunk in [1, 7, 20, 1000] {
            let all = read_all(&file, None, chunk).unwrap();
            assert_eq!(all.column_names(), ["image", "label"]);
            assert_eq!(
                all.tensor("image").unwrap().values,
                &want[..],
                "chunk {chunk}"
            );
            assert_eq!(all.i64("label").unwrap()[49], 49);
        }
        let order = ["label".to_string(), "image".to_string()];
        let flipped = read_all(&file, Some(&order), 8).unwrap();
        assert_eq!(flipped.column_names(), order);
        assert_eq!(flipped.tensor("image").unwrap().row(3), Some(&want[18..24]));
    }

    #[test]
    fn plain_lists_read_as_tensors_when_every_row_has_one_length() {
        let file = TempFile::new("plain");
        let mut b = ListBuilder::new(UInt32Builder::new());
        for r in 0..30u32 {
            b.values().append_slice(&[r, u32::MAX, 3]);
            b.append(true);
        }
        write_arrow(&file, vec![("v", Arc::new(b.finish()))], 30);
        let all = read_all(&file, None, 4).unwrap();
        let t = all.tensor("v").unwrap();
        assert_eq!(t.shape(), [30, 3]);
        assert_eq!(t.row(29), Some(&[29.0, u32::MAX as f32, 3.0][..]));
    }

    #[test]
    fn ragged_and_null_lists_are_errors_naming_the_file_column_and_row() {
        let ragged = TempFile::new("ragged");
        let list = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![Some(3), Some(4)]),
            Some(vec![Some(5)]),
        ]);
        write_arrow(&ragged, vec![("v", Arc::new(list))], 10);
        let e = read_all(&ragged, None, 10).unwrap_err().to_string();
        assert!(
            e.contains("ragged") && e.contains("\"v\"") && e.contains("row 2"),
            "{e}"
        );

        let nulls = TempFile::new("nulls");
        let list = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            Some(vec![Some(3), None]),
        ]);
        write_arrow(&nulls, vec![("v", Arc::new(list))], 10);
        let e = read_all(&nulls, None, 10).unwrap_err().to_string();
        assert!(e.contains("nulls") && e.contains("\"v\""), "{e}");

        let empty = TempFile::new("null-list");
        let list =
            ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1)]), None]);
        write_arrow(&empty, vec![("v", Arc::new(list))], 10);
        let e = read_all(&empty, None, 10).unwrap_err().to_string();
        assert!(e.contains("null"), "{e}");
    }
}
