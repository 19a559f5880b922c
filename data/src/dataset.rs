//! [`Dataset`]: rows in memory as a list of columnar blocks, and
//! [`Batches`], one pass over them in batches.

use super::batch::{check_schemas, Batch, Column};
use super::error::{positive, Result};
use super::schema::Schema;
use super::{csv, rng, rows};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// A table of rows held in memory as a list of [`Batch`] blocks that share
/// one schema.
///
/// Cloning is cheap (the blocks are shared), and every operation returns a
/// new dataset, leaving this one as it was. Operations run when called, not
/// lazily as in Ray Data: a dataset is its rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dataset {
    blocks: Arc<Vec<Batch>>,
}

impl Serialize for Dataset {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.blocks.as_slice().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Dataset {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let blocks = Vec::<Batch>::deserialize(d)?;
        check_schemas(&blocks).map_err(serde::de::Error::custom)?;
        Ok(Dataset {
            blocks: Arc::new(blocks),
        })
    }
}

impl Dataset {
    /// A dataset of one block per batch, in order.
    ///
    /// # Errors
    ///
    /// [`DataError::SchemaMismatch`](super::DataError::SchemaMismatch) if
    /// the batches' column names or types differ.
    pub fn from_batches(blocks: Vec<Batch>) -> Result<Dataset> {
        check_schemas(&blocks)?;
        Ok(Dataset::from_checked(blocks))
    }

    pub(crate) fn from_checked(blocks: Vec<Batch>) -> Dataset {
        Dataset {
            blocks: Arc::new(blocks),
        }
    }

    /// A dataset of one row per item (Ray's `from_items`).
    ///
    /// Each item serializes (with serde) to a record: a struct or a map.
    /// Each field becomes a column: integers an `i64` column, other numbers
    /// (or integers mixed with them) `f64`, strings `str`, and arrays of
    /// numbers a tensor column of `f32` whose rows all have the first
    /// item's length. Columns follow the first item's field order.
    ///
    /// # Errors
    ///
    /// [`DataError::Item`](super::DataError::Item), naming the item and
    /// what is wrong: not a record, fields that differ from the first
    /// item's, a value of another type than before, or a value with no
    /// column type (null, bool, nested map).
    pub fn from_items<T: Serialize>(items: impl IntoIterator<Item = T>) -> Result<Dataset> {
        Ok(Dataset::from_checked(vec![rows::batch_from_items(items)?]))
    }

    /// A dataset of one block made of the given columns (Ray's
    /// `from_numpy` / `from_arrow`, for host arrays).
    ///
    /// # Errors
    ///
    /// As [`Batch::new`]: lengths that differ, names that repeat.
    pub fn from_columns<N: Into<String>>(
        columns: impl IntoIterator<Item = (N, Column)>,
    ) -> Result<Dataset> {
        let batch = Batch::new(columns.into_iter().map(|(n, c)| (n.into(), c)).collect())?;
        Ok(Dataset::from_checked(vec![batch]))
    }

    /// The rows `0..n` as one `i64` column named `"id"`.
    pub fn range(n: usize) -> Dataset {
        let ids = Column::I64((0..n as i64).collect());
        let batch = Batch::default()
            .with_column("id", ids)
            .expect("a single column always fits an empty batch");
        Dataset::from_checked(vec![batch])
    }

    /// Reads a CSV file: a header row of column names, then one row per
    /// record.
    ///
    /// Each column's type is inferred from all of its fields: `i64` if
    /// every field parses as an integer, else `f64` if every field parses
    /// as a number, else `str` (an empty field makes a column `str`).
    ///
    /// # Errors
    ///
    /// [`DataError::Io`](super::DataError::Io) if the file cannot be
    /// opened or read; [`DataError::Csv`](super::DataError::Csv), with the
    /// file, line and (where known) column, for an empty file, a record
    /// with another number of fields than the header, a field that is not
    /// UTF-8, or a repeated column name.
    pub fn read_csv(path: impl AsRef<Path>) -> Result<Dataset> {
        Ok(Dataset::from_checked(vec![csv::read(path.as_ref())?]))
    }

    /// The number of rows.
    pub fn count(&self) -> usize {
        self.blocks.iter().map(Batch::num_rows).sum()
    }

    /// The number of blocks (the unit of parallelism of
    /// [`Dataset::map_batches`] is the batch, not the block; see
    /// [`Dataset::repartition`]).
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The blocks, in order.
    pub fn blocks(&self) -> &[Batch] {
        &self.blocks
    }

    /// The names and types of the columns (empty for a dataset with no
    /// blocks).
    pub fn schema(&self) -> Schema {
        self.blocks.first().map(Batch::schema).unwrap_or_default()
    }

    /// The column names, in order.
    pub fn columns(&self) -> Vec<String> {
        self.blocks
            .first()
            .map(|b| b.column_names().to_vec())
            .unwrap_or_default()
    }

    /// Up to `n` rows from the start, as one batch (Ray's `take_batch`).
    pub fn take_batch(&self, n: usize) -> Batch {
        let rows = self.rows(0..n.min(self.count()));
        Batch::concat(&rows).expect("blocks of a dataset share a schema")
    }

    /// Up to `n` rows from the start, each turned into a `T` (Ray's
    /// `take`); the reverse of [`Dataset::from_items`].
    ///
    /// # Errors
    ///
    /// [`DataError::RowDecode`](super::DataError::RowDecode) naming the
    /// first row that does not deserialize into `T`.
    pub fn take<T: DeserializeOwned>(&self, n: usize) -> Result<Vec<T>> {
        rows::rows_of(&self.take_batch(n), 0)
    }

    /// Every row, each turned into a `T`. Errors as [`Dataset::take`].
    pub fn take_all<T: DeserializeOwned>(&self) -> Result<Vec<T>> {
        self.take(usize::MAX)
    }

    /// The rows in `rows` as slices of the blocks they lie in; one empty
    /// block (keeping the schema) if there are none.
    pub(crate) fn rows(&self, rows: Range<usize>) -> Vec<Batch> {
        let mut out = Vec::new();
        let mut start = 0;
        for block in self.blocks.iter() {
            let end = start + block.num_rows();
            let (lo, hi) = (start.max(rows.start), end.min(rows.end));
            if lo < hi {
                if lo == start && hi == end {
                    out.push(block.clone());
                } else {
                    out.push(block.slice(lo - start..hi - start));
                }
            }
            start = end;
        }
        if out.is_empty() {
            out.extend(self.blocks.first().map(Batch::empty_like));
        }
        out
    }

    /// All rows in one batch.
    pub(crate) fn concat_all(&self) -> Batch {
        Batch::concat(&self.blocks).expect("blocks of a dataset share a schema")
    }

    /// The rows in a random order, the same for the same `seed`. Blocks
    /// keep their sizes.
    pub fn random_shuffle(&self, seed: u64) -> Dataset {
        let all = self.concat_all();
        let shuffled = all.gather(&rng::permutation(all.num_rows(), seed));
        let mut blocks = Vec::with_capacity(self.blocks.len());
        let mut start = 0;
        for block in self.blocks.iter() {
            blocks.push(shuffled.slice(start..start + block.num_rows()));
            start += block.num_rows();
        }
        Dataset::from_checked(blocks)
    }

    /// Splits the rows, in order, into `n` shards: one per training worker.
    ///
    /// With `equal = true` every shard has `count() / n` rows and the last
    /// `count() % n` rows are dropped, so that data-parallel workers run
    /// the same number of steps (Ray's `split(n, equal=True)`). With
    /// `equal = false` no row is dropped: the first `count() % n` shards
    /// have one row more than the others. Shuffle first
    /// ([`Dataset::random_shuffle`]) for shards that are random samples.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`](super::DataError::InvalidArgument)
    /// for `n = 0`.
    pub fn split(&self, n: usize, equal: bool) -> Result<Vec<Dataset>> {
        positive("n", n)?;
        let count = self.count();
        let (base, extra) = (count / n, if equal { 0 } else { count % n });
        let mut start = 0;
        Ok((0..n)
            .map(|i| {
                let len = base + usize::from(i < extra);
                let shard = Dataset::from_checked(self.rows(start..start + len));
                start += len;
                shard
            })
            .collect())
    }

    /// The same rows in `num_blocks` blocks of nearly equal size (the
    /// first `count() % num_blocks` have one row more).
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`](super::DataError::InvalidArgument)
    /// for `num_blocks = 0`.
    pub fn repartition(&self, num_blocks: usize) -> Result<Dataset> {
        positive("num_blocks", num_blocks)?;
        let all = self.concat_all();
        let (base, extra) = (all.num_rows() / num_blocks, all.num_rows() % num_blocks);
        let mut start = 0;
        let blocks = (0..num_blocks)
            .map(|i| {
                let len = base + usize::from(i < extra);
                let block = all.slice(start..start + len);
                start += len;
                block
            })
            .collect();
        Ok(Dataset::from_checked(blocks))
    }

    /// The rows in order, in batches of `batch_size` rows; a batch may
    /// take rows from several blocks. The last batch has fewer rows when
    /// `batch_size` does not divide `count()`, unless `drop_last` drops it.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`](super::DataError::InvalidArgument)
    /// for `batch_size = 0`.
    pub fn iter_batches(&self, batch_size: usize, drop_last: bool) -> Result<Batches> {
        Batches::new(Arc::clone(&self.blocks), batch_size, drop_last)
    }
}

/// An iterator of batches of rows, in order: what
/// [`Dataset::iter_batches`] and
/// [`DataIterator::iter_batches`](super::DataIterator::iter_batches) return.
///
/// It owns its rows (shared with the dataset), so it borrows nothing.
#[derive(Clone, Debug)]
pub struct Batches {
    blocks: Arc<Vec<Batch>>,
    /// The block the next row comes from, and the row within it.
    block: usize,
    offset: usize,
    batch_size: usize,
    /// Rows still to be yielded, all batches together.
    rows_left: usize,
}

impl Batches {
    pub(crate) fn new(
        blocks: Arc<Vec<Batch>>,
        batch_size: usize,
        drop_last: bool,
    ) -> Result<Batches> {
        positive("batch_size", batch_size)?;
        let total: usize = blocks.iter().map(Batch::num_rows).sum();
        let rows_left = if drop_last {
            total - total % batch_size
        } else {
            total
        };
        Ok(Batches {
            blocks,
            block: 0,
            offset: 0,
            batch_size,
            rows_left,
        })
    }
}

impl Iterator for Batches {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let want = self.batch_size.min(self.rows_left);
        if want == 0 {
            return None;
        }
        self.rows_left -= want;
        let mut out: Option<Batch> = None;
        let mut have = 0;
        while have < want {
            let block = &self.blocks[self.block];
            let n = (want - have).min(block.num_rows() - self.offset);
            if n == 0 {
                self.block += 1;
                self.offset = 0;
                continue;
            }
            let rows = self.offset..self.offset + n;
            match &mut out {
                // The whole batch from one block: a slice, or the block itself.
                None if n == want && n == block.num_rows() => out = Some(block.clone()),
                None if n == want => out = Some(block.slice(rows)),
                None => {
                    let mut batch = block.empty_like();
                    batch.extend_from(block, rows);
                    out = Some(batch);
                }
                Some(batch) => batch.extend_from(block, rows),
            }
            have += n;
            self.offset += n;
        }
        out
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rows_left.div_ceil(self.batch_size);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batches {}

impl std::iter::FusedIterator for Batches {}
