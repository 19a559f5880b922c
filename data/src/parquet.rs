//! Parquet files: footers read when a dataset is made (schema, row groups),
//! row groups read by block tasks, and blocks written back.
//!
//! Column types map as follows: `float` to `f32`, `double` to `f64`,
//! every integer type to `i64`, strings to `str`, and a list of numbers
//! whose rows all have one length (Arrow's fixed-size list, or a plain list)
//! to a tensor column of `f32`. Nulls have no representation here and are
//! an error naming the column.

use super::batch::{Batch, Column, ColumnType, Field, Schema};
use super::error::{DataError, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, FixedSizeListArray, RecordBatch};
use arrow_schema::{DataType, Field as ArrowField};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
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
                "column {name:?} is {t}, which has no column type here (numbers, strings, and lists of numbers are read)"
            ),
        )
    };
    Ok(match t {
        DataType::Float32 => ColumnType::F32,
        DataType::Float64 => ColumnType::F64,
        t if t.is_integer() => ColumnType::I64,
        DataType::Utf8 | DataType::LargeUtf8 => ColumnType::Str,
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
pub(crate) fn read(
    group: &RowGroup,
    columns: Option<&[String]>,
    chunk_rows: usize,
) -> Result<Vec<Batch>> {
    let path = &group.path;
    let builder = open(path)?;
    let arrow = builder.schema().clone();
    let builder = match columns {
        None => builder,
        Some(cols) => {
            let roots = cols
                .iter()
                .map(|c| {
                    arrow.index_of(c).map_err(|_| DataError::MissingColumn {
                        path: path.clone(),
                        column: c.clone(),
                        available: arrow.fields().iter().map(|f| f.name().clone()).collect(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
            builder.with_projection(mask)
        }
    };
    let reader = builder
        .with_row_groups(vec![group.index])
        .with_batch_size(chunk_rows.clamp(1, group.rows.max(1)))
        .build()
        .map_err(|e| err(path, e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| err(path, format!("row group {}: {e}", group.index)))?;
        let mut converted = to_batch(path, &batch)?;
        if let Some(cols) = columns {
            converted = reorder(converted, cols)?;
        }
        out.push(converted);
    }
    Ok(out)
}

/// The columns of `batch` in the order asked for.
fn reorder(batch: Batch, order: &[String]) -> Result<Batch> {
    let mut columns: Vec<(String, Column)> = batch.into_columns();
    let mut out = Vec::with_capacity(order.len());
    for name in order {
        if let Some(i) = columns.iter().position(|(n, _)| n == name) {
            out.push(columns.swap_remove(i));
        }
    }
    Batch::new(out)
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
    Ok(match array.data_type() {
        DataType::Float32 => Column::F32(array.as_primitive::<Float32Type>().values().to_vec()),
        DataType::Float64 => Column::F64(array.as_primitive::<Float64Type>().values().to_vec()),
        t if t.is_integer() => Column::I64(integers(path, name, array)?),
        DataType::Utf8 => Column::Str(
            array
                .as_string::<i32>()
                .iter()
                .map(|s| s.unwrap_or_default().to_string())
                .collect(),
        ),
        DataType::LargeUtf8 => Column::Str(
            array
                .as_string::<i64>()
                .iter()
                .map(|s| s.unwrap_or_default().to_string())
                .collect(),
        ),
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
