//! Reading CSV files into a batch ([`Dataset::read_csv`]).
//!
//! [`Dataset::read_csv`]: super::Dataset::read_csv

use super::batch::{Batch, Column};
use super::error::{DataError, Result};
use std::path::Path;

/// The type one column's text is read as: the narrowest that every one of
/// its fields parses as.
fn infer(fields: Vec<String>) -> Column {
    if fields.is_empty() {
        return Column::Str(fields);
    }
    if let Some(ints) = fields
        .iter()
        .map(|f| f.trim().parse::<i64>().ok())
        .collect::<Option<Vec<i64>>>()
    {
        return Column::I64(ints);
    }
    if let Some(floats) = fields
        .iter()
        .map(|f| f.trim().parse::<f64>().ok())
        .collect::<Option<Vec<f64>>>()
    {
        return Column::F64(floats);
    }
    Column::Str(fields)
}

/// Reads `path`: a header row of column names, then one record per line.
pub(crate) fn read(path: &Path) -> Result<Batch> {
    let file = std::fs::File::open(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(std::io::BufReader::new(file));
    let headers = reader
        .headers()
        .map_err(|e| csv_error(path, &[], e))?
        .clone();
    if headers.is_empty() {
        return Err(DataError::Csv {
            path: path.to_path_buf(),
            line: 1,
            column: None,
            reason: "the file is empty; it must start with a header row naming the columns".into(),
        });
    }
    let names: Vec<String> = headers.iter().map(str::to_string).collect();
    let mut fields: Vec<Vec<String>> = vec![Vec::new(); names.len()];
    for record in reader.records() {
        let record = record.map_err(|e| csv_error(path, &names, e))?;
        for (column, field) in fields.iter_mut().zip(record.iter()) {
            column.push(field.to_string());
        }
    }
    let mut batch = Batch::default();
    for (name, column) in names.into_iter().zip(fields) {
        batch
            .push_unique(name.clone(), infer(column))
            .map_err(|_| DataError::Csv {
                path: path.to_path_buf(),
                line: 1,
                column: Some(name),
                reason: "this column name appears twice in the header".into(),
            })?;
    }
    Ok(batch)
}

/// A csv crate error, with the file, line and (where known) column.
fn csv_error(path: &Path, names: &[String], e: csv::Error) -> DataError {
    let line = e.position().map_or(0, |p| p.line());
    let (column, reason) = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => (
            None,
            format!("this record has {len} fields, but the header has {expected_len}"),
        ),
        csv::ErrorKind::Utf8 { err, .. } => (
            names.get(err.field()).cloned(),
            format!(
                "the field is not valid UTF-8 (after its first {} bytes)",
                err.valid_up_to()
            ),
        ),
        csv::ErrorKind::Io(io) => (None, format!("read failed: {io}")),
        _ => (None, e.to_string()),
    };
    DataError::Csv {
        path: path.to_path_buf(),
        line,
        column,
        reason,
    }
}
