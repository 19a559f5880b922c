//! The all-to-all steps, run by tasks so that no process holds every row:
//!
//! - `random_shuffle` is a map-reduce, as Ray Data's: a map task per input
//!   block sends each of its rows to one of `m` outputs by a seeded draw
//!   and returns the `m` parts as one object; a reduce task per output
//!   reads its part of every map object in place, concatenates them and
//!   permutes the rows.
//! - `repartition(n)` cuts the rows, in order, into `n` ranges; a task per
//!   output reads its range's slices of the input blocks.
//!
//! The process running the pipeline handles only references and headers.

use super::batch::{check_schemas, Batch};
use super::block::{failure, Block};
use super::error::{DataError, Result};
use super::rng::{self, SplitMix64};
use super::wire::{self, Decoded};
use prism::{ObjectRef, TaskOptions, View};

/// How an all-to-all step regroups rows.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Regroup {
    /// A global shuffle, fixed by its seed.
    Shuffle(u64),
    /// This many blocks of near-equal row counts, rows in order.
    Blocks(usize),
}

impl Regroup {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Regroup::Shuffle(_) => "RandomShuffle",
            Regroup::Blocks(_) => "Repartition",
        }
    }
}

const PARTS_MAGIC: &[u8; 8] = b"PRSMPRT1";

/// Several encoded blocks as one object: the magic, their count `m`, `m + 1`
/// offsets, then the blocks, each on a 64-byte boundary.
fn encode_parts(parts: &[Vec<u8>]) -> Vec<u8> {
    let head = 16 + 8 * (parts.len() + 1);
    let mut offsets = Vec::with_capacity(parts.len() + 1);
    let mut at = head.next_multiple_of(64);
    for p in parts {
        offsets.push(at as u64);
        at = (at + p.len()).next_multiple_of(64);
    }
    offsets.push(at as u64);
    let mut out = Vec::with_capacity(at);
    out.extend_from_slice(PARTS_MAGIC);
    out.extend_from_slice(&(parts.len() as u64).to_le_bytes());
    for o in &offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
    for (p, start) in parts.iter().zip(&offsets) {
        out.resize(*start as usize, 0);
        out.extend_from_slice(p);
    }
    out.resize(at, 0);
    out
}

/// Part `i` of an object made by [`encode_parts`], or the object itself
/// when it is a single block (a failure record passed along).
fn part(bytes: &[u8], i: usize) -> Result<&[u8]> {
    let corrupt = |what: &str| DataError::Corrupt {
        what: format!("a shuffle's map output: {what}"),
    };
    if bytes.get(..8) != Some(&PARTS_MAGIC[..]) {
        return Ok(bytes);
    }
    let u64_at = |at: usize| -> Result<usize> {
        let b = bytes
            .get(at..at + 8)
            .ok_or_else(|| corrupt("truncated header"))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        usize::try_from(u64::from_le_bytes(a)).map_err(|_| corrupt("an offset too large"))
    };
    let m = u64_at(8)?;
    if i >= m {
        return Err(corrupt(&format!("part {i} asked of {m}")));
    }
    let (start, end) = (u64_at(16 + 8 * i)?, u64_at(16 + 8 * (i + 1))?);
    bytes
        .get(start..end)
        .ok_or_else(|| corrupt("a part runs past the end"))
}

fn decode_block(bytes: &[u8], rows: Option<std::ops::Range<usize>>) -> Result<Batch> {
    match wire::decode_rows(bytes, rows)? {
        Decoded::Block(b) => Ok(b),
        other => Err(failure(other, 0)),
    }
}

/// The seed of map task or reduce task `index` (`stream` 0 or 1).
fn task_seed(seed: u64, stream: u64, index: usize) -> u64 {
    rng::epoch_seed(
        seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        index as u64,
    )
}

/// Sends each of the rows `start..start + rows` of a block to one of
/// `outputs` parts, by seeded draws; returns the parts as one object.
#[prism::remote]
fn shuffle_map(block: View<u8>, start: usize, rows: usize, seed: u64, outputs: usize) -> Vec<u8> {
    let run = || -> Result<Vec<u8>> {
        let batch = decode_block(&block, Some(start..start + rows))?;
        let mut to: Vec<Vec<usize>> = vec![Vec::new(); outputs];
        let mut rng = SplitMix64::new(seed);
        for row in 0..batch.num_rows() {
            to[rng.below(outputs as u64) as usize].push(row);
        }
        let parts: Vec<Vec<u8>> = to
            .iter()
            .map(|rows| wire::encode(&batch.gather(rows)))
            .collect();
        Ok(encode_parts(&parts))
    };
    run().unwrap_or_else(|e| wire::encode_failed("RandomShuffle", &e.to_string()))
}

/// Gathers part `index` of every map object and permutes its rows.
#[prism::remote]
fn shuffle_reduce(maps: Vec<ObjectRef<Vec<u8>>>, index: usize, seed: u64) -> Vec<u8> {
    let run = || -> Result<Vec<u8>> {
        let mut batches = Vec::with_capacity(maps.len());
        for map in &maps {
            let view = prism::get_view(map).map_err(|e| DataError::Stage {
                stage: "RandomShuffle".into(),
                block: index,
                message: e.to_string(),
            })?;
            let batch = decode_block(part(&view, index)?, None)?;
            if batch.num_rows() > 0 {
                batches.push(batch);
            }
        }
        if batches.is_empty() {
            return Ok(wire::encode(&Batch::default()));
        }
        check_schemas(&batches)?;
        let all = Batch::concat(&batches)?;
        drop(batches);
        Ok(wire::encode(
            &all.gather(&rng::permutation(all.num_rows(), seed)),
        ))
    };
    run().unwrap_or_else(|e| wire::encode_failed("RandomShuffle", &e.to_string()))
}

/// Concatenates row ranges of encoded blocks, in order.
#[prism::remote]
fn gather_ranges(ranges: Vec<(ObjectRef<Vec<u8>>, usize, usize)>) -> Vec<u8> {
    let run = || -> Result<Vec<u8>> {
        let mut batches = Vec::with_capacity(ranges.len());
        for (data, start, end) in &ranges {
            let view = prism::get_view(data).map_err(|e| DataError::Stage {
                stage: "Repartition".into(),
                block: 0,
                message: e.to_string(),
            })?;
            batches.push(decode_block(&view, Some(*start..*end))?);
        }
        check_schemas(&batches)?;
        Ok(wire::encode(&Batch::concat(&batches)?))
    };
    run().unwrap_or_else(|e| wire::encode_failed("Repartition", &e.to_string()))
}

fn submit_error(how: Regroup, index: usize, e: prism::Error) -> DataError {
    DataError::Stage {
        stage: how.name().into(),
        block: index,
        message: e.to_string(),
    }
}

/// Starts the tasks that regroup `blocks`; returns the output blocks'
/// objects, in order (their tasks may still be running).
pub(crate) fn start(
    blocks: Vec<Block>,
    how: Regroup,
    task: &TaskOptions,
) -> Result<Vec<ObjectRef<Vec<u8>>>> {
    if blocks.is_empty() {
        return Ok(Vec::new());
    }
    match how {
        Regroup::Shuffle(seed) => {
            let m = blocks.len();
            let mut maps = Vec::with_capacity(m);
            for (i, b) in blocks.into_iter().enumerate() {
                let r = shuffle_map::remote_with(
                    task.clone(),
                    &b.data,
                    b.start,
                    b.rows,
                    task_seed(seed, 0, i),
                    m,
                )
                .map_err(|e| submit_error(how, i, e))?;
                maps.push(r);
            }
            (0..m)
                .map(|j| {
                    shuffle_reduce::remote_with(
                        task.clone(),
                        maps.clone(),
                        j,
                        task_seed(seed, 1, j),
                    )
                    .map_err(|e| submit_error(how, j, e))
                })
                .collect()
        }
        Regroup::Blocks(n) => {
            let total: usize = blocks.iter().map(|b| b.rows).sum();
            let (base, extra) = (total / n, total % n);
            let mut out = Vec::with_capacity(n);
            // Walk the input blocks once, cutting each output's range.
            let (mut b, mut used) = (0, 0);
            for j in 0..n {
                let mut want = base + usize::from(j < extra);
                let mut ranges = Vec::new();
                while want > 0 {
                    let Some(block) = blocks.get(b) else { break };
                    if block.rows == used {
                        (b, used) = (b + 1, 0);
                        continue;
                    }
                    let take = (block.rows - used).min(want);
                    let at = block.start + used;
                    ranges.push((block.data.clone(), at, at + take));
                    (used, want) = (used + take, want - take);
                    if used == block.rows {
                        (b, used) = (b + 1, 0);
                    }
                }
                if ranges.is_empty() {
                    // More outputs than rows: an empty block of the schema.
                    let block = &blocks[0];
                    ranges.push((block.data.clone(), block.start, block.start));
                }
                out.push(
                    gather_ranges::remote_with(task.clone(), ranges)
                        .map_err(|e| submit_error(how, j, e))?,
                );
            }
            Ok(out)
        }
    }
}
