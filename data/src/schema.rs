//! The names and types of columns: [`ColumnType`], [`Field`] and
//! [`Schema`]. A leaf of the crate: batches are made of these, and errors
//! name them, so they depend on neither.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The type of a column: what a row holds. Not to be confused with
/// `prism_collective::DataType`, the element types the collectives carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ColumnType {
    /// 32-bit floats.
    F32,
    /// 64-bit floats.
    F64,
    /// 64-bit signed integers.
    I64,
    /// UTF-8 strings.
    Str,
    /// Byte strings of any length (a file's contents, an encoded image).
    Bytes,
    /// A fixed-length vector of 32-bit floats per row (an image's pixels, a
    /// feature vector).
    Tensor {
        /// The number of values in each row.
        row_len: usize,
    },
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColumnType::F32 => f.write_str("f32"),
            ColumnType::F64 => f.write_str("f64"),
            ColumnType::I64 => f.write_str("i64"),
            ColumnType::Str => f.write_str("str"),
            ColumnType::Bytes => f.write_str("bytes"),
            ColumnType::Tensor { row_len } => write!(f, "tensor<f32>[{row_len}]"),
        }
    }
}

/// One column of a schema: its name and type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Field {
    /// The column's name.
    pub name: String,
    /// Its type.
    pub data_type: ColumnType,
}

/// The names and types of a batch's or dataset's columns, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schema {
    /// The columns.
    pub fields: Vec<Field>,
}

impl Schema {
    /// The column names, in order.
    pub fn names(&self) -> Vec<String> {
        self.fields.iter().map(|f| f.name.clone()).collect()
    }

    /// The type of the column `name`, if there is one.
    pub fn data_type(&self, name: &str) -> Option<ColumnType> {
        self.fields
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.data_type)
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, field) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}: {}", field.name, field.data_type)?;
        }
        Ok(())
    }
}
