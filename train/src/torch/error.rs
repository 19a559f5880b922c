//! [`TorchError`]: everything that can go wrong in the `torch` module.

use crate::collective::CollectiveError;
use crate::data::DataError;
use tch::{Kind, TchError};

/// Everything that can go wrong in this module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TorchError {
    /// A dataset operation failed (a missing column, a string column).
    #[error(transparent)]
    Data(#[from] DataError),
    /// A Trainer call failed (for instance, called outside a training
    /// function).
    #[error(transparent)]
    Train(#[from] crate::TrainError),
    /// A collective failed (see [`CollectiveError`] for which failures leave
    /// the group usable).
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// libtorch refused an operation.
    #[error("libtorch: {0}")]
    Tch(#[from] TchError),
    /// An optimizer's saved state that cannot be loaded onto this model.
    #[error("the optimizer state in {}: {message}", path.display())]
    Checkpoint {
        /// The file read.
        path: std::path::PathBuf,
        /// What does not match.
        message: String,
    },
    /// A variable whose element kind the collectives do not carry.
    #[error(
        "variable {name:?} holds {kind:?} elements, which {purpose} cannot carry; \
         use Float, Double, Half or BFloat16{hint}"
    )]
    UnsupportedKind {
        /// The variable's name in the store.
        name: String,
        /// Its element kind.
        kind: Kind,
        /// `"the gradient all-reduce"` or `"the parameter broadcast"`.
        purpose: &'static str,
        /// What else would do, if anything.
        hint: &'static str,
    },
}
