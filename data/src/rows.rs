//! Rows as serde values: items into columns ([`Dataset::from_items`]) and
//! columns back into items ([`Dataset::take`]).
//!
//! [`Dataset::from_items`]: super::Dataset::from_items
//! [`Dataset::take`]: super::Dataset::take

use super::batch::{Batch, Column};
use super::error::{DataError, ItemProblem, Result};
use super::schema::ColumnType;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Number, Value};

/// A column being filled from items; its type may still widen from `i64`
/// to `f64` while items arrive.
enum Builder {
    I64(Vec<i64>),
    F64(Vec<f64>),
    Str(Vec<String>),
    Tensor { values: Vec<f32>, row_len: usize },
}

impl Builder {
    fn data_type(&self) -> ColumnType {
        match self {
            Builder::I64(_) => ColumnType::I64,
            Builder::F64(_) => ColumnType::F64,
            Builder::Str(_) => ColumnType::Str,
            Builder::Tensor { row_len, .. } => ColumnType::Tensor { row_len: *row_len },
        }
    }

    fn finish(self) -> Column {
        match self {
            Builder::I64(v) => Column::I64(v),
            Builder::F64(v) => Column::F64(v),
            Builder::Str(v) => Column::Str(v),
            Builder::Tensor { values, row_len } => Column::Tensor { values, row_len },
        }
    }
}

/// One field's value, classified.
enum Cell {
    I64(i64),
    F64(f64),
    Str(String),
    Tensor(Vec<f32>),
}

impl Cell {
    fn data_type(&self) -> ColumnType {
        match self {
            Cell::I64(_) => ColumnType::I64,
            Cell::F64(_) => ColumnType::F64,
            Cell::Str(_) => ColumnType::Str,
            Cell::Tensor(v) => ColumnType::Tensor { row_len: v.len() },
        }
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "a map",
    }
}

fn number(n: &Number) -> Cell {
    match n.as_i64() {
        Some(i) => Cell::I64(i),
        // u64 above i64::MAX and floats.
        None => Cell::F64(n.as_f64().unwrap_or(f64::NAN)),
    }
}

fn cell(field: &str, value: Value) -> std::result::Result<Cell, ItemProblem> {
    let unsupported = |found| ItemProblem::Unsupported {
        field: field.to_string(),
        found,
    };
    match value {
        Value::Number(n) => Ok(number(&n)),
        Value::String(s) => Ok(Cell::Str(s)),
        Value::Array(items) if !items.is_empty() => {
            let mut out = Vec::with_capacity(items.len());
            for item in &items {
                match item.as_f64() {
                    Some(x) => out.push(x as f32),
                    None => {
                        return Err(unsupported("an array holding something other than numbers"))
                    }
                }
            }
            Ok(Cell::Tensor(out))
        }
        Value::Array(_) => Err(unsupported("an empty array")),
        other => Err(unsupported(kind(&other))),
    }
}

fn new_builder(first: Cell) -> Builder {
    match first {
        Cell::I64(i) => Builder::I64(vec![i]),
        Cell::F64(x) => Builder::F64(vec![x]),
        Cell::Str(s) => Builder::Str(vec![s]),
        Cell::Tensor(v) => Builder::Tensor {
            row_len: v.len(),
            values: v,
        },
    }
}

fn push(builder: &mut Builder, field: &str, cell: Cell) -> std::result::Result<(), ItemProblem> {
    match (&mut *builder, cell) {
        (Builder::I64(v), Cell::I64(i)) => v.push(i),
        (Builder::F64(v), Cell::F64(x)) => v.push(x),
        (Builder::F64(v), Cell::I64(i)) => v.push(i as f64),
        (Builder::I64(v), Cell::F64(x)) => {
            // An integer column meets its first float: widen it.
            let mut widened: Vec<f64> = v.iter().map(|&i| i as f64).collect();
            widened.push(x);
            *builder = Builder::F64(widened);
        }
        (Builder::Str(v), Cell::Str(s)) => v.push(s),
        (Builder::Tensor { values, row_len }, Cell::Tensor(t)) if t.len() == *row_len => {
            values.extend_from_slice(&t)
        }
        (b, c) => {
            return Err(ItemProblem::TypeChanged {
                field: field.to_string(),
                expected: b.data_type(),
                found: c.data_type(),
            })
        }
    }
    Ok(())
}

/// An item's fields in the order it serialized them (serde_json's `Map`
/// would sort them).
struct Record(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Record {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Record;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Record, A::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    fields.push(entry);
                }
                Ok(Record(fields))
            }
        }
        d.deserialize_map(Fields)
    }
}

fn record(item: impl Serialize) -> std::result::Result<Vec<(String, Value)>, ItemProblem> {
    let text = serde_json::to_string(&item).map_err(|e| ItemProblem::Serialize {
        message: e.to_string(),
    })?;
    match serde_json::from_str::<Record>(&text) {
        Ok(Record(fields)) => Ok(fields),
        Err(_) => {
            let found = serde_json::from_str::<Value>(&text).map_or("something else", |v| kind(&v));
            Err(ItemProblem::NotARecord { found })
        }
    }
}

/// Columns from serializable items; the columns follow the first item's
/// field order.
pub(crate) fn batch_from_items<T: Serialize>(items: impl IntoIterator<Item = T>) -> Result<Batch> {
    let mut names: Vec<String> = Vec::new();
    let mut sorted_names: Vec<String> = Vec::new();
    let mut builders: Vec<Builder> = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let fail = |reason| DataError::Item { index, reason };
        let fields = record(item).map_err(fail)?;
        if index == 0 {
            for (field, value) in fields {
                builders.push(new_builder(cell(&field, value).map_err(fail)?));
                names.push(field);
            }
            sorted_names = names.clone();
            sorted_names.sort();
            continue;
        }
        let mut map: std::collections::HashMap<String, Value> = fields.into_iter().collect();
        let mut found: Vec<String> = map.keys().cloned().collect();
        found.sort();
        if found != sorted_names {
            return Err(fail(ItemProblem::Fields {
                expected: sorted_names,
                found,
            }));
        }
        for (name, builder) in names.iter().zip(&mut builders) {
            let value = map.remove(name).unwrap_or(Value::Null);
            let c = cell(name, value).map_err(fail)?;
            push(builder, name, c).map_err(fail)?;
        }
    }
    let mut batch = Batch::default();
    for (name, builder) in names.into_iter().zip(builders) {
        batch.push_unique(name, builder.finish())?;
    }
    Ok(batch)
}

fn json_f64(x: f64) -> Value {
    Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// Row `row` of `batch` as a map of its fields.
fn row_value(batch: &Batch, row: usize) -> Value {
    let mut map = Map::new();
    for (name, column) in batch.columns() {
        let value = match column {
            Column::F32(v) => json_f64(v[row] as f64),
            Column::F64(v) => json_f64(v[row]),
            Column::I64(v) => Value::from(v[row]),
            Column::Str(v) => Value::String(v[row].clone()),
            // As serde sees a `Vec<u8>`: a sequence of numbers.
            Column::Bytes(v) => Value::Array(v[row].iter().map(|&b| Value::from(b)).collect()),
            Column::Tensor { values, row_len } => Value::Array(
                values[row * row_len..(row + 1) * row_len]
                    .iter()
                    .map(|&x| json_f64(x as f64))
                    .collect(),
            ),
        };
        map.insert(name.to_string(), value);
    }
    Value::Object(map)
}

/// The rows of `batch` as `T`s; `first_index` is the dataset position of
/// its first row, for errors.
pub(crate) fn rows_of<T: DeserializeOwned>(batch: &Batch, first_index: usize) -> Result<Vec<T>> {
    (0..batch.num_rows())
        .map(|row| {
            serde_json::from_value(row_value(batch, row)).map_err(|e| DataError::RowDecode {
                index: first_index + row,
                message: e.to_string(),
            })
        })
        .collect()
}
