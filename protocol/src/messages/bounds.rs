//! How large a frame of each kind may be.
//!
//! A frame's header announces its length before any of its body arrives.
//! The reader looks at the first bytes of the body (the frame's kind and
//! the request's or answer's name, see `rpc`), and refuses a frame larger
//! than its kind may ever be before reading the rest: a lease request or
//! a heartbeat of a gigabyte is an attack or a bug, never traffic. Only
//! the messages that carry a user's values (task arguments, results,
//! key-value entries, program chunks) may be as large as
//! [`MAX_FRAME_BYTES`].
//!
//! A request declares its class beside its reply type in the message
//! list (`=> ReturnObject, Payload;`); one that declares none is
//! [`FrameBound::Control`]. Environment variables travel in control
//! messages: a process cannot be started with more than a few MiB of
//! them anyway.

/// The largest frame accepted of any kind, to stop a corrupt length from
/// allocating without bound.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// The size class of a message kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameBound {
    /// A message with a fixed set of ids, counts and short texts.
    Control,
    /// A message carrying a list that grows with the work (task events,
    /// object ids, output lines, a cluster's nodes), or a user's text (an
    /// error's message).
    Batch,
    /// A message carrying a user's values.
    Payload,
}

impl FrameBound {
    /// The largest frame body of this class, in bytes: 4 MiB, 256 MiB,
    /// and [`MAX_FRAME_BYTES`] (1 GiB).
    pub const fn bytes(self) -> usize {
        match self {
            FrameBound::Control => 4 << 20,
            FrameBound::Batch => 256 << 20,
            FrameBound::Payload => MAX_FRAME_BYTES,
        }
    }
}
