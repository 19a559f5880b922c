//! Why a workspace could not be read.

use std::path::PathBuf;

/// Why the workspace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StructureError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A source file did not parse as Rust.
    #[error("{} does not parse as Rust: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A `layers` block is malformed.
    #[error("{source_file}:{line}: {message}")]
    Layers {
        /// The markdown file.
        source_file: String,
        /// The line in it.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A `layers` block names a crate the workspace does not have.
    #[error("{source_file} declares layers for crate `{crate_name}` at `{src_dir}`, which the workspace does not have; fix the crate line of its `layers` block")]
    UnknownCrate {
        /// The markdown file.
        source_file: String,
        /// The crate named.
        crate_name: String,
        /// Its folder as written.
        src_dir: String,
    },
}
