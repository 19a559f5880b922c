//! Fail points: places where a test can inject a fault (with the
//! `failpoints` feature and the `FAILPOINTS` variable, as the `fail` crate
//! reads it: `name=action;name=action`, for example
//! `FAILPOINTS=spill_write=return` or `lease_grant=1*return`). Without the
//! feature they compile to nothing.
//!
//! | fail point | where | what the fault does |
//! | --- | --- | --- |
//! | `worker_start` | before a worker is forked | the start fails, as a refused fork would |
//! | `lease_grant` | a lease request arrives | it is refused |
//! | `object_seal` | an object is sealed | the seal fails |
//! | `spill_write` | a spill file is written | the write fails; the object stays in memory |
//! | `restore_read` | a spill file is read back | the read fails; the `get` fails |
//! | `actor_restart` | an actor would be restarted | it dies instead |
//! | `chunk_transfer` | a node serves a chunk of an object to another | the stream breaks off, as a network fault would |
//! | `checkpoint_commit` | an actor checkpoint is saved | the save fails; the previous checkpoint stays |

use prism_protocol::error::Error;

/// The error fail point `name` injects now, if it is on.
pub(crate) fn injected(name: &'static str) -> Option<Error> {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| Some(Error::Io {
        context: format!("fail point {name}"),
        message: "injected fault".into(),
    }));
    let _ = name;
    None
}

/// Turns on the fail points named in `FAILPOINTS` (a no-op without the
/// feature). A malformed entry is an error naming it.
pub(crate) fn configure() -> Result<(), Error> {
    #[cfg(feature = "failpoints")]
    if let Ok(spec) = std::env::var("FAILPOINTS") {
        for entry in spec.split(';').filter(|e| !e.trim().is_empty()) {
            let (name, actions) = entry.split_once('=').ok_or_else(|| {
                Error::invalid("FAILPOINTS", format!("{entry:?}: write name=action"))
            })?;
            fail::cfg(name.trim(), actions.trim())
                .map_err(|e| Error::invalid("FAILPOINTS", format!("{entry:?}: {e}")))?;
            tracing::warn!(
                fail_point = name.trim(),
                actions = actions.trim(),
                "fail point on"
            );
        }
    }
    Ok(())
}
