//! Tensors from host data and from dataset batches: [`tensor_from_slice`],
//! [`tensor_to_vec`], [`column_tensor`], [`batch_tensors`] and
//! [`iter_torch_batches`] (Ray's `iter_torch_batches`).

use super::error::TorchError;
use crate::data::{Batch, Column, DataError, DataIterator};
use std::collections::BTreeMap;
use tch::{Device, Tensor};

/// Makes a tensor of `shape` from host data.
///
/// ```
/// use prism_train::torch::{tensor_from_slice, tensor_to_vec};
///
/// let t = tensor_from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
/// assert_eq!(t.size(), [2, 2]);
/// assert_eq!(tensor_to_vec::<f32>(&t)?, [1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), prism_train::torch::TorchError>(())
/// ```
pub fn tensor_from_slice<T: tch::kind::Element>(
    data: &[T],
    shape: &[i64],
) -> Result<Tensor, TorchError> {
    Ok(Tensor::f_from_slice(data)?.f_reshape(shape)?)
}

/// Copies a tensor's elements, in row-major order, to a host vector; the
/// tensor may be on any device and of any layout, but its kind must be `T`'s.
pub fn tensor_to_vec<T: tch::kind::Element>(tensor: &Tensor) -> Result<Vec<T>, TorchError> {
    let numel = tensor.numel();
    let mut out = vec![T::ZERO; numel];
    tensor.f_copy_data(&mut out, numel)?;
    Ok(out)
}

/// A numeric column of a [`Batch`] as a tensor on `device`: `[rows]` for
/// scalar columns (f32, f64, i64 keep their kind), `[rows, row_len]` for
/// tensor columns.
///
/// ```
/// use prism_train::data::{Batch, Column};
/// use prism_train::torch::column_tensor;
///
/// let batch = Batch::new(vec![
///     ("x".to_string(), Column::F64(vec![1.0, 2.0])),
///     ("image".to_string(), Column::tensor(vec![0.0; 8], 4)?),
/// ])?;
/// assert_eq!(column_tensor(&batch, "x", tch::Device::Cpu)?.size(), [2]);
/// assert_eq!(column_tensor(&batch, "image", tch::Device::Cpu)?.size(), [2, 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`TorchError::Data`] for a missing column, or a string or bytes column.
pub fn column_tensor(batch: &Batch, name: &str, device: Device) -> Result<Tensor, TorchError> {
    let tensor = match batch.column(name)? {
        Column::F32(v) => Tensor::f_from_slice(v)?,
        Column::F64(v) => Tensor::f_from_slice(v)?,
        Column::I64(v) => Tensor::f_from_slice(v)?,
        Column::Tensor { values, row_len } => Tensor::f_from_slice(values)?
            .f_reshape([(values.len() / row_len) as i64, *row_len as i64])?,
        other @ (Column::Str(_) | Column::Bytes(_)) => {
            return Err(DataError::ColumnType {
                column: name.to_string(),
                found: other.data_type(),
                expected: "a numeric or tensor column",
            }
            .into())
        }
    };
    Ok(tensor.f_to_device(device)?)
}

/// Every numeric column of `batch` as a tensor (see [`column_tensor`]),
/// by name: one step of Ray's `iter_torch_batches`. String and bytes
/// columns are left out.
pub fn batch_tensors(
    batch: &Batch,
    device: Device,
) -> Result<BTreeMap<String, Tensor>, TorchError> {
    let mut out = BTreeMap::new();
    for (name, column) in batch.columns() {
        if !matches!(column, Column::Str(_) | Column::Bytes(_)) {
            out.insert(name.to_string(), column_tensor(batch, name, device)?);
        }
    }
    Ok(out)
}

/// Ray's `iter_torch_batches`: one epoch of a dataset shard as tensors on
/// `device`, batch by batch.
pub fn iter_torch_batches(
    shard: &DataIterator,
    batch_size: usize,
    drop_last: bool,
    device: Device,
) -> Result<impl Iterator<Item = Result<BTreeMap<String, Tensor>, TorchError>>, TorchError> {
    Ok(shard
        .iter_batches(batch_size, drop_last)?
        .map(move |batch| batch_tensors(&batch?, device)))
}
