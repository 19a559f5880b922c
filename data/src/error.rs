//! The one error type of the data module.

use super::schema::ColumnType;
use prism::portable::PortableFnError;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// A `Result` whose error is [`DataError`].
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// Everything that can go wrong building, transforming or reading a
/// [`Dataset`](super::Dataset).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A column was asked for by a name the batch does not have.
    #[error("no column named {column:?}; the columns are {}", Names(available))]
    ColumnNotFound {
        /// The name asked for.
        column: String,
        /// The names there are.
        available: Vec<String>,
    },
    /// A column was read as another type than the one it holds.
    #[error("column {column:?} holds {found}, not {expected}")]
    ColumnType {
        /// The column.
        column: String,
        /// What it holds.
        found: ColumnType,
        /// What was asked for (`f32`, `tensor<f32>`, ...).
        expected: &'static str,
    },
    /// The columns of a batch have different numbers of rows.
    #[error("column {column:?} has {len} rows, but the batch has {expected}; every column of a batch must have one value per row")]
    ColumnLength {
        /// The column that disagrees.
        column: String,
        /// Its number of rows.
        len: usize,
        /// The number of rows of the columns before it.
        expected: usize,
    },
    /// A tensor column's values do not divide into rows of its length.
    #[error("tensor column {column:?} has {values} values, which is not a whole number of rows of {row_len}")]
    TensorShape {
        /// The column.
        column: String,
        /// How many values it holds.
        values: usize,
        /// The length of one row (0 is not allowed).
        row_len: usize,
    },
    /// Two columns of one batch have the same name.
    #[error("column {column:?} appears twice; column names must be unique")]
    DuplicateColumn {
        /// The repeated name.
        column: String,
    },
    /// Batches that must share a schema do not.
    #[error("block {block} has schema ({found}), but the blocks before it have ({expected}); all blocks of a dataset share one schema")]
    SchemaMismatch {
        /// The index of the first batch that differs.
        block: usize,
        /// The schema of the batches before it.
        expected: super::Schema,
        /// Its schema.
        found: super::Schema,
    },
    /// An item given to [`Dataset::from_items`](super::Dataset::from_items)
    /// cannot be a row.
    #[error("item {index}: {reason}")]
    Item {
        /// The item's position in the input.
        index: usize,
        /// What is wrong with it.
        reason: ItemProblem,
    },
    /// A row could not be turned into the type asked for by
    /// [`Dataset::take`](super::Dataset::take).
    #[error("row {index} does not fit the type asked for: {message}")]
    RowDecode {
        /// The row's position in the dataset.
        index: usize,
        /// The decoder's message.
        message: String,
    },
    /// A CSV file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A CSV file is malformed.
    #[error("{}:{line}{}: {reason}", path.display(), column.as_ref().map(|c| format!(" (column {c:?})")).unwrap_or_default())]
    Csv {
        /// The file.
        path: PathBuf,
        /// The 1-based line the problem is on.
        line: u64,
        /// The column, where one is to blame.
        column: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// An argument is out of its range (a batch size of 0, a split into 0
    /// shards, ...).
    #[error("{argument} = {value}: {reason}")]
    InvalidArgument {
        /// The argument's name.
        argument: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        reason: &'static str,
    },
    /// [`Dataset::map_batches`](super::Dataset::map_batches) was called with
    /// no cluster to run on.
    #[error("map_batches runs its function as Prism tasks, and prism is not initialized; call prism::init(prism::Config::default()) first")]
    NotInitialized,
    /// The user's batch function returned `Err`.
    #[error("the batch function failed on batch {batch_index}: {message}")]
    MapFn {
        /// Which batch (0-based, in dataset order).
        batch_index: usize,
        /// The `Display` of the returned error.
        message: String,
    },
    /// A batch function's task could not run or did not finish (it
    /// panicked, its worker died, submission failed).
    #[error("the task for batch {batch_index} failed: {source}")]
    Task {
        /// Which batch (0-based, in dataset order).
        batch_index: usize,
        /// What Prism reported.
        #[source]
        source: prism::Error,
    },
    /// The worker could not turn the batch function back into a function.
    #[error("batch {batch_index}: {source}")]
    NotPortable {
        /// Which batch.
        batch_index: usize,
        /// Why.
        #[source]
        source: PortableFnError,
    },
    /// Bytes that should hold an encoded block do not.
    #[error("a block in the object store is malformed: {what}")]
    Corrupt {
        /// What is wrong.
        what: String,
    },
    /// A Parquet file cannot be read or written: missing, not Parquet, a
    /// corrupt footer, a column type or a null that has no column type here.
    #[error("{}: {reason}", path.display())]
    Parquet {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file's columns differ from the first file's.
    #[error("{} has schema ({found}), but {} has ({expected}); every file of a dataset must have the same columns", path.display(), first.display())]
    FileSchema {
        /// The file that differs.
        path: PathBuf,
        /// The first file, whose schema the others must have.
        first: PathBuf,
        /// The first file's schema.
        expected: super::Schema,
        /// This file's schema.
        found: super::Schema,
    },
    /// A column asked for (a projection) is not in a file.
    #[error("{} has no column {column:?}; its columns are {}", path.display(), Names(available))]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column asked for.
        column: String,
        /// The columns the file has.
        available: Vec<String>,
    },
    /// A stage of a streaming pipeline failed on one block: its function
    /// returned `Err` or panicked, or its task could not run.
    #[error("stage {stage} failed on block {block}: {message}")]
    Stage {
        /// The stage, as the pipeline names it (`ReadParquet->MapBatches`).
        stage: String,
        /// The block's index in the pipeline's input order.
        block: usize,
        /// What went wrong.
        message: String,
    },
    /// A streaming split could not reach its coordinator, or was read out of
    /// turn.
    #[error("streaming split {split}: {message}")]
    Split {
        /// Which split.
        split: usize,
        /// What went wrong.
        message: String,
    },
    /// A sampler's rank is not below its world size.
    #[error("rank {rank} is out of range for a world of {world_size}; ranks run from 0 to world_size - 1")]
    InvalidRank {
        /// The rank given.
        rank: usize,
        /// The world size given.
        world_size: usize,
    },
    /// An environment variable a helper reads is missing or not a number.
    #[error("environment variable {name} is {}; it must be set to a non-negative integer (the Trainer sets RANK and WORLD_SIZE in each worker)", value.as_ref().map(|v| format!("{v:?}")).unwrap_or_else(|| "not set".into()))]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value, if set.
        value: Option<String>,
    },
}

/// Why an item cannot become a row of a dataset.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ItemProblem {
    /// It did not serialize to a record (a struct or a map).
    #[error("it serializes to {found}, not to a struct or a map of named fields")]
    NotARecord {
        /// What it serialized to (`a number`, `an array`, ...).
        found: &'static str,
    },
    /// It could not be serialized at all.
    #[error("it cannot be serialized: {message}")]
    Serialize {
        /// The serializer's message.
        message: String,
    },
    /// Its field names differ from the first item's.
    #[error(
        "its fields are {}, but the first item's are {}; every item needs the same fields",
        Names(found),
        Names(expected)
    )]
    Fields {
        /// The first item's field names, sorted.
        expected: Vec<String>,
        /// Its field names, sorted.
        found: Vec<String>,
    },
    /// A field's value has no column type (a nested map, a null, a
    /// non-numeric array, ...).
    #[error("field {field:?} is {found}; fields must be numbers, strings, or arrays of numbers")]
    Unsupported {
        /// The field.
        field: String,
        /// What it holds.
        found: &'static str,
    },
    /// A field's value is of another type than in the first item.
    #[error("field {field:?} is {found}, but the first item's is {expected}")]
    TypeChanged {
        /// The field.
        field: String,
        /// The column type from the first item.
        expected: ColumnType,
        /// The type of this item's value.
        found: ColumnType,
    },
}

/// Formats a list of names as `["a", "b"]`.
struct Names<'a>(&'a [String]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Checks `value > 0`, else an [`DataError::InvalidArgument`].
pub(crate) fn positive(argument: &'static str, value: usize) -> Result<usize> {
    if value == 0 {
        return Err(DataError::InvalidArgument {
            argument,
            value: value.to_string(),
            reason: "must be at least 1",
        });
    }
    Ok(value)
}
