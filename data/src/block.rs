//! [`Block`]: the unit a running pipeline hands from step to step, an
//! encoded batch in the object store, and [`failure`], the error a block
//! task's failure record stands for. A leaf of the pipeline's modules: the
//! executor, the all-to-all steps, the splits and the streams all use
//! these, and this module uses none of them.

use super::batch::Batch;
use super::error::{DataError, Result};
use super::wire::{self, Decoded};
use prism::ObjectRef;
use serde::{Deserialize, Serialize};

/// One block of a running pipeline: an encoded batch in the object store.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Block {
    pub(crate) data: ObjectRef<Vec<u8>>,
    /// The rows of the encoded batch that belong to this block:
    /// `start..start + rows` (a split may hand out part of one).
    pub(crate) start: usize,
    pub(crate) rows: usize,
    pub(crate) bytes: usize,
}

impl Block {
    pub(crate) fn put(batch: &Batch) -> Result<Block> {
        let bytes = wire::encode(batch);
        let len = bytes.len();
        let data = prism::put(bytes).map_err(|e| DataError::Stage {
            stage: "put".into(),
            block: 0,
            message: e.to_string(),
        })?;
        Ok(Block {
            data,
            start: 0,
            rows: batch.num_rows(),
            bytes: len,
        })
    }
}

pub(crate) fn failure(decoded: Decoded, block: usize) -> DataError {
    match decoded {
        Decoded::Failed { stage, message } => DataError::Stage {
            stage,
            block,
            message,
        },
        Decoded::NotPortable { stage, sent, here } => DataError::Stage {
            stage,
            block,
            message: format!(
                "the function cannot run in the worker: it was sent by {sent}, and the worker runs {here}; workers must run the driver's executable"
            ),
        },
        Decoded::Block(_) => DataError::Corrupt {
            what: "a block where a failure was expected".into(),
        },
    }
}
