//! Distinct id newtypes for every kind of entity in a cluster.
//!
//! Ids are 128-bit. Those minted at high rates (objects, tasks) take a random
//! per-process prefix in the upper 64 bits and a counter in the lower 64, so
//! minting one is an atomic increment, never a system call, and ids from
//! different processes never collide.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

fn process_prefix() -> u64 {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    *PREFIX.get_or_init(|| {
        let random = uuid::Uuid::new_v4().as_u128();
        (random >> 64) as u64 ^ random as u64
    })
}

static COUNTER: AtomicU64 = AtomicU64::new(1);

fn next_unique() -> u128 {
    ((process_prefix() as u128) << 64) | COUNTER.fetch_add(1, Ordering::Relaxed) as u128
}

macro_rules! define_id {
    ($(#[$doc:meta])* $name:ident, $tag:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub struct $name(pub u128);

        impl $name {
            /// Mints a new id, unique across processes.
            pub fn new() -> Self {
                $name(next_unique())
            }

            /// Reads the id back from its displayed form.
            pub fn parse(text: &str) -> Option<Self> {
                let hex = text.strip_prefix(concat!($tag, "-"))?;
                u128::from_str_radix(hex, 16).ok().map($name)
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($tag, "-{:032x}"), self.0)
            }
        }
    };
}

define_id!(
    /// A node: one raylet and its object store.
    NodeId,
    "node"
);
define_id!(
    /// A worker process (or a driver's core worker).
    WorkerId,
    "worker"
);
define_id!(
    /// An immutable object, put by a program or returned by a task.
    ObjectId,
    "object"
);
define_id!(
    /// One invocation of a remote function or actor method.
    TaskId,
    "task"
);
define_id!(
    /// A stateful actor.
    ActorId,
    "actor"
);
define_id!(
    /// A driver program and everything it started.
    JobId,
    "job"
);
define_id!(
    /// A worker lease granted by a raylet.
    LeaseId,
    "lease"
);
define_id!(
    /// A placement group: bundles of resources reserved together.
    PlacementGroupId,
    "pg"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_are_distinct_and_display_with_their_kind() {
        let a = ObjectId::new();
        let b = ObjectId::new();
        assert_ne!(a, b);
        assert!(a.to_string().starts_with("object-"));
        assert_eq!(a.to_string().len(), "object-".len() + 32);
    }
}
