//! How large a frame of each kind may be.
//!
//! A frame's header announces its length before any of its body arrives.
//! The reader looks at the first bytes of the body (the frame's kind and
//! the request's or answer's name, see `rpc`), and refuses a frame larger
//! than its kind may ever be before reading the rest: a lease request or
//! a heartbeat of a gigabyte is an attack or a bug, never traffic. Only
//! the messages that carry a user's values (task arguments, results,
//! key-value entries, program chunks) may be as large as
//! [`crate::rpc::MAX_FRAME_BYTES`].
//!
//! A request declares its class beside its reply type in the message
//! list (`=> ReturnObject, Payload;`); one that declares none is
//! [`FrameBound::Control`]. Environment variables travel in control
//! messages: a process cannot be started with more than a few MiB of
//! them anyway.

use super::Response;

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
    /// and [`crate::rpc::MAX_FRAME_BYTES`] (1 GiB).
    pub const fn bytes(self) -> usize {
        match self {
            FrameBound::Control => 4 << 20,
            FrameBound::Batch => 256 << 20,
            FrameBound::Payload => crate::rpc::MAX_FRAME_BYTES,
        }
    }
}

/// Declares each answer's size class once: the methods below follow, and
/// an answer added to [`Response`] without one does not compile.
macro_rules! response_bounds {
    ($($variant:ident => $bound:ident,)*) => {
        impl Response {
            /// The size class of the answer named `variant` on the wire,
            /// or `None` for a name no answer has.
            pub fn frame_bound_of(variant: &str) -> Option<FrameBound> {
                match variant {
                    $(stringify!($variant) => Some(FrameBound::$bound),)*
                    _ => None,
                }
            }

            /// The size class of this answer.
            pub fn frame_bound(&self) -> FrameBound {
                match self {
                    $(Response::$variant { .. } => FrameBound::$bound,)*
                }
            }

            /// The answer's name on the wire (its variant).
            pub fn wire_name(&self) -> &'static str {
                match self {
                    $(Response::$variant { .. } => stringify!($variant),)*
                }
            }
        }
    };
}

response_bounds! {
    Ok => Control,
    Error => Batch,
    Registered => Control,
    Lease => Control,
    ActorPlaced => Control,
    ObjectLocation => Control,
    StoreStats => Control,
    Actor => Control,
    ClusterResources => Control,
    Nodes => Batch,
    Object => Payload,
    PlacementGroup => Control,
    KvValue => Payload,
    KvChanged => Control,
    KvKeys => Batch,
    WorkerExit => Control,
    OwnedActor => Control,
    PlacementGroupIds => Batch,
    Chunk => Payload,
}
