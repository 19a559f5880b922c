//! The pieces every Prism process shares: ids, resource quantities, the
//! error type, the messages processes exchange, and the framed connection
//! that carries them.
#![warn(missing_docs, missing_debug_implementations)]

pub mod clock;
pub mod error;
pub mod exposition;
mod framing;
pub mod guard;
mod handshake;
pub mod ids;
pub mod messages;
pub mod program;
pub mod resources;
pub mod rpc;
pub mod serve;
pub mod tls;
pub mod transfer;

pub use error::{Error, FailureKind, Result};
