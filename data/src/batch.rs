//! Columnar batches: named, typed columns with one value per row.

use super::error::{DataError, Result};
use super::schema::{ColumnType, Field, Schema};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The values of one column, stored contiguously.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Column {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 64-bit floats.
    F64(Vec<f64>),
    /// 64-bit signed integers.
    I64(Vec<i64>),
    /// UTF-8 strings.
    Str(Vec<String>),
    /// Byte strings, one per row.
    Bytes(Vec<Vec<u8>>),
    /// `row_len` floats per row, rows one after another (row-major).
    Tensor {
        /// `num_rows * row_len` values.
        values: Vec<f32>,
        /// The number of values in each row; at least 1.
        row_len: usize,
    },
}

/// A tensor column as a host array: `num_rows` rows of `row_len` floats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorColumn<'a> {
    /// All values, row-major.
    pub values: &'a [f32],
    /// The number of values in each row.
    pub row_len: usize,
}

impl<'a> TensorColumn<'a> {
    /// The number of rows.
    pub fn num_rows(&self) -> usize {
        self.values.len() / self.row_len
    }

    /// `[num_rows, row_len]`, the shape of the array.
    pub fn shape(&self) -> [usize; 2] {
        [self.num_rows(), self.row_len]
    }

    /// Row `i`, or `None` past the end.
    pub fn row(&self, i: usize) -> Option<&'a [f32]> {
        self.values.get(i * self.row_len..(i + 1) * self.row_len)
    }
}

impl Column {
    /// A tensor column from `row_len` values per row.
    ///
    /// # Errors
    ///
    /// [`DataError::TensorShape`] if `row_len` is 0 or does not divide
    /// `values.len()` (the column is named `"<tensor>"` here; batches name it).
    pub fn tensor(values: Vec<f32>, row_len: usize) -> Result<Column> {
        let column = Column::Tensor { values, row_len };
        column.check_shape("<tensor>")?;
        Ok(column)
    }

    /// Its type.
    pub fn data_type(&self) -> ColumnType {
        match self {
            Column::F32(_) => ColumnType::F32,
            Column::F64(_) => ColumnType::F64,
            Column::I64(_) => ColumnType::I64,
            Column::Str(_) => ColumnType::Str,
            Column::Bytes(_) => ColumnType::Bytes,
            Column::Tensor { row_len, .. } => ColumnType::Tensor { row_len: *row_len },
        }
    }

    /// The number of rows.
    pub fn len(&self) -> usize {
        match self {
            Column::F32(v) => v.len(),
            Column::F64(v) => v.len(),
            Column::I64(v) => v.len(),
            Column::Str(v) => v.len(),
            Column::Bytes(v) => v.len(),
            Column::Tensor { values, row_len } => values.len() / (*row_len).max(1),
        }
    }

    /// Whether it has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check_shape(&self, name: &str) -> Result<()> {
        if let Column::Tensor { values, row_len } = self {
            if *row_len == 0 || values.len() % row_len != 0 {
                return Err(DataError::TensorShape {
                    column: name.to_string(),
                    values: values.len(),
                    row_len: *row_len,
                });
            }
        }
        Ok(())
    }

    /// An empty column of the same type.
    pub(crate) fn empty_like(&self) -> Column {
        match self {
            Column::F32(_) => Column::F32(Vec::new()),
            Column::F64(_) => Column::F64(Vec::new()),
            Column::I64(_) => Column::I64(Vec::new()),
            Column::Str(_) => Column::Str(Vec::new()),
            Column::Bytes(_) => Column::Bytes(Vec::new()),
            Column::Tensor { row_len, .. } => Column::Tensor {
                values: Vec::new(),
                row_len: *row_len,
            },
        }
    }

    /// The rows in `rows`, as a new column.
    pub(crate) fn slice(&self, rows: Range<usize>) -> Column {
        match self {
            Column::F32(v) => Column::F32(v[rows].to_vec()),
            Column::F64(v) => Column::F64(v[rows].to_vec()),
            Column::I64(v) => Column::I64(v[rows].to_vec()),
            Column::Str(v) => Column::Str(v[rows].to_vec()),
            Column::Bytes(v) => Column::Bytes(v[rows].to_vec()),
            Column::Tensor { values, row_len } => Column::Tensor {
                values: values[rows.start * row_len..rows.end * row_len].to_vec(),
                row_len: *row_len,
            },
        }
    }

    /// The rows at `indices`, in that order.
    pub(crate) fn gather(&self, indices: &[usize]) -> Column {
        match self {
            Column::F32(v) => Column::F32(indices.iter().map(|&i| v[i]).collect()),
            Column::F64(v) => Column::F64(indices.iter().map(|&i| v[i]).collect()),
            Column::I64(v) => Column::I64(indices.iter().map(|&i| v[i]).collect()),
            Column::Str(v) => Column::Str(indices.iter().map(|&i| v[i].clone()).collect()),
            Column::Bytes(v) => Column::Bytes(indices.iter().map(|&i| v[i].clone()).collect()),
            Column::Tensor { values, row_len } => {
                let mut out = Vec::with_capacity(indices.len() * row_len);
                for &i in indices {
                    out.extend_from_slice(&values[i * row_len..(i + 1) * row_len]);
                }
                Column::Tensor {
                    values: out,
                    row_len: *row_len,
                }
            }
        }
    }

    /// Appends the rows in `rows` of `other`, which has the same type.
    pub(crate) fn extend_from(&mut self, other: &Column, rows: Range<usize>) {
        match (self, other) {
            (Column::F32(a), Column::F32(b)) => a.extend_from_slice(&b[rows]),
            (Column::F64(a), Column::F64(b)) => a.extend_from_slice(&b[rows]),
            (Column::I64(a), Column::I64(b)) => a.extend_from_slice(&b[rows]),
            (Column::Str(a), Column::Str(b)) => a.extend_from_slice(&b[rows]),
            (Column::Bytes(a), Column::Bytes(b)) => a.extend_from_slice(&b[rows]),
            (Column::Tensor { values: a, row_len }, Column::Tensor { values: b, .. }) => {
                a.extend_from_slice(&b[rows.start * *row_len..rows.end * *row_len])
            }
            (a, b) => unreachable!(
                "extend_from on columns of one schema: {} vs {}",
                a.data_type(),
                b.data_type()
            ),
        }
    }
}

/// Rows of data as named, typed columns of equal length: the unit that
/// datasets are stored in, that batch functions take and return, and that
/// training loops read.
///
/// ```
/// use prism_data::{Batch, Column};
///
/// let batch = Batch::new(vec![
///     ("x".to_string(), Column::tensor(vec![0.0, 1.0, 2.0, 3.0], 2)?),
///     ("label".to_string(), Column::I64(vec![0, 1])),
/// ])?;
/// assert_eq!(batch.num_rows(), 2);
/// assert_eq!(batch.tensor("x")?.row(1), Some(&[2.0f32, 3.0][..]));
/// assert!(batch.f32("label").is_err()); // it holds i64
/// # Ok::<(), prism_data::DataError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "BatchWire")]
pub struct Batch {
    names: Vec<String>,
    columns: Vec<Column>,
    num_rows: usize,
}

/// A batch as it arrives from another process, checked before use.
#[derive(Deserialize)]
struct BatchWire {
    names: Vec<String>,
    columns: Vec<Column>,
    num_rows: usize,
}

impl TryFrom<BatchWire> for Batch {
    type Error = DataError;

    fn try_from(wire: BatchWire) -> Result<Batch> {
        if wire.names.len() != wire.columns.len() {
            return Err(DataError::ColumnLength {
                column: "<names>".into(),
                len: wire.names.len(),
                expected: wire.columns.len(),
            });
        }
        let batch = Batch::new(wire.names.into_iter().zip(wire.columns).collect())?;
        if batch.num_columns() > 0 && batch.num_rows != wire.num_rows {
            return Err(DataError::ColumnLength {
                column: "<rows>".into(),
                len: wire.num_rows,
                expected: batch.num_rows,
            });
        }
        Ok(batch)
    }
}

impl Batch {
    /// A batch of the given columns, in that order.
    ///
    /// # Errors
    ///
    /// [`DataError::ColumnLength`] if the columns differ in length,
    /// [`DataError::DuplicateColumn`] if a name repeats,
    /// [`DataError::TensorShape`] for a malformed tensor column.
    pub fn new(columns: Vec<(String, Column)>) -> Result<Batch> {
        let mut batch = Batch::default();
        for (name, column) in columns {
            batch.push_unique(name, column)?;
        }
        Ok(batch)
    }

    /// This batch with `column` added at the end, or put in place of the
    /// column of the same name.
    ///
    /// # Errors
    ///
    /// As [`Batch::new`]; a batch with no columns takes any length.
    pub fn with_column(mut self, name: impl Into<String>, column: Column) -> Result<Batch> {
        let name = name.into();
        column.check_shape(&name)?;
        let replaces = self.names.iter().position(|n| *n == name);
        let others = self.columns.len() - usize::from(replaces.is_some());
        if others > 0 && column.len() != self.num_rows {
            return Err(DataError::ColumnLength {
                column: name,
                len: column.len(),
                expected: self.num_rows,
            });
        }
        self.num_rows = column.len();
        match replaces {
            Some(i) => self.columns[i] = column,
            None => {
                self.names.push(name);
                self.columns.push(column);
            }
        }
        Ok(self)
    }

    pub(crate) fn push_unique(&mut self, name: String, column: Column) -> Result<()> {
        if self.names.contains(&name) {
            return Err(DataError::DuplicateColumn { column: name });
        }
        *self = std::mem::take(self).with_column(name, column)?;
        Ok(())
    }

    /// The number of rows.
    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// The number of columns.
    pub fn num_columns(&self) -> usize {
        self.columns.len()
    }

    /// The column names, in order.
    pub fn column_names(&self) -> &[String] {
        &self.names
    }

    /// The names and types of the columns.
    pub fn schema(&self) -> Schema {
        Schema {
            fields: self
                .names
                .iter()
                .zip(&self.columns)
                .map(|(name, c)| Field {
                    name: name.clone(),
                    data_type: c.data_type(),
                })
                .collect(),
        }
    }

    /// The column `name`.
    ///
    /// # Errors
    ///
    /// [`DataError::ColumnNotFound`], listing the columns there are.
    pub fn column(&self, name: &str) -> Result<&Column> {
        match self.names.iter().position(|n| n == name) {
            Some(i) => Ok(&self.columns[i]),
            None => Err(DataError::ColumnNotFound {
                column: name.to_string(),
                available: self.names.clone(),
            }),
        }
    }

    /// The columns as `(name, column)` pairs, in order.
    pub fn columns(&self) -> impl Iterator<Item = (&str, &Column)> {
        self.names.iter().map(String::as_str).zip(&self.columns)
    }

    /// Takes the batch apart into its `(name, column)` pairs.
    pub fn into_columns(self) -> Vec<(String, Column)> {
        self.names.into_iter().zip(self.columns).collect()
    }

    fn wrong_type(&self, name: &str, column: &Column, expected: &'static str) -> DataError {
        DataError::ColumnType {
            column: name.to_string(),
            found: column.data_type(),
            expected,
        }
    }

    /// The `f32` column `name` as a host array.
    ///
    /// # Errors
    ///
    /// [`DataError::ColumnNotFound`], or [`DataError::ColumnType`] naming
    /// the column, the type it holds and `f32`.
    pub fn f32(&self, name: &str) -> Result<&[f32]> {
        match self.column(name)? {
            Column::F32(v) => Ok(v),
            other => Err(self.wrong_type(name, other, "f32")),
        }
    }

    /// The `f64` column `name` as a host array. Errors as [`Batch::f32`].
    pub fn f64(&self, name: &str) -> Result<&[f64]> {
        match self.column(name)? {
            Column::F64(v) => Ok(v),
            other => Err(self.wrong_type(name, other, "f64")),
        }
    }

    /// The `i64` column `name` as a host array. Errors as [`Batch::f32`].
    pub fn i64(&self, name: &str) -> Result<&[i64]> {
        match self.column(name)? {
            Column::I64(v) => Ok(v),
            other => Err(self.wrong_type(name, other, "i64")),
        }
    }

    /// The string column `name`. Errors as [`Batch::f32`].
    pub fn str(&self, name: &str) -> Result<&[String]> {
        match self.column(name)? {
            Column::Str(v) => Ok(v),
            other => Err(self.wrong_type(name, other, "str")),
        }
    }

    /// The bytes column `name`: one byte string per row. Errors as
    /// [`Batch::f32`].
    pub fn bytes(&self, name: &str) -> Result<&[Vec<u8>]> {
        match self.column(name)? {
            Column::Bytes(v) => Ok(v),
            other => Err(self.wrong_type(name, other, "bytes")),
        }
    }

    /// The tensor column `name` as a `[num_rows, row_len]` host array.
    /// Errors as [`Batch::f32`].
    pub fn tensor(&self, name: &str) -> Result<TensorColumn<'_>> {
        match self.column(name)? {
            Column::Tensor { values, row_len } => Ok(TensorColumn {
                values,
                row_len: *row_len,
            }),
            other => Err(self.wrong_type(name, other, "tensor<f32>")),
        }
    }

    /// The numeric column `name` converted to `f32` (a tensor column gives
    /// its values row-major), for feeding a model whatever the input type.
    ///
    /// # Errors
    ///
    /// [`DataError::ColumnNotFound`], or [`DataError::ColumnType`] for a
    /// string column.
    pub fn to_f32_vec(&self, name: &str) -> Result<Vec<f32>> {
        match self.column(name)? {
            Column::F32(v) => Ok(v.clone()),
            Column::F64(v) => Ok(v.iter().map(|&x| x as f32).collect()),
            Column::I64(v) => Ok(v.iter().map(|&x| x as f32).collect()),
            Column::Tensor { values, .. } => Ok(values.clone()),
            other @ (Column::Str(_) | Column::Bytes(_)) => {
                Err(self.wrong_type(name, other, "a numeric type"))
            }
        }
    }

    /// The rows in `rows`, as a new batch.
    ///
    /// # Panics
    ///
    /// If `rows` reaches past the last row.
    pub fn slice(&self, rows: Range<usize>) -> Batch {
        assert!(
            rows.start <= rows.end && rows.end <= self.num_rows,
            "slice {rows:?} of a batch of {} rows",
            self.num_rows
        );
        Batch {
            names: self.names.clone(),
            columns: self.columns.iter().map(|c| c.slice(rows.clone())).collect(),
            num_rows: rows.len(),
        }
    }

    /// The rows at `indices`, in that order.
    pub(crate) fn gather(&self, indices: &[usize]) -> Batch {
        Batch {
            names: self.names.clone(),
            columns: self.columns.iter().map(|c| c.gather(indices)).collect(),
            num_rows: indices.len(),
        }
    }

    /// An empty batch with this batch's schema.
    pub(crate) fn empty_like(&self) -> Batch {
        Batch {
            names: self.names.clone(),
            columns: self.columns.iter().map(Column::empty_like).collect(),
            num_rows: 0,
        }
    }

    /// Appends the rows in `rows` of `other`, which has this batch's schema.
    pub(crate) fn extend_from(&mut self, other: &Batch, rows: Range<usize>) {
        debug_assert_eq!(self.names, other.names);
        for (mine, theirs) in self.columns.iter_mut().zip(&other.columns) {
            mine.extend_from(theirs, rows.clone());
        }
        self.num_rows += rows.len();
    }

    /// The rows of all `batches`, one after another.
    ///
    /// # Errors
    ///
    /// [`DataError::SchemaMismatch`] if the batches' schemas differ.
    pub fn concat(batches: &[Batch]) -> Result<Batch> {
        let Some(first) = batches.first() else {
            return Ok(Batch::default());
        };
        check_schemas(batches)?;
        let mut out = first.empty_like();
        for b in batches {
            out.extend_from(b, 0..b.num_rows);
        }
        Ok(out)
    }
}

/// Checks that every batch has the first one's schema.
pub(crate) fn check_schemas(batches: &[Batch]) -> Result<()> {
    let Some(first) = batches.first() else {
        return Ok(());
    };
    let expected = first.schema();
    for (block, b) in batches.iter().enumerate().skip(1) {
        let found = b.schema();
        if found != expected {
            return Err(DataError::SchemaMismatch {
                block,
                expected,
                found,
            });
        }
    }
    Ok(())
}
