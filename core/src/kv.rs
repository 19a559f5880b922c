//! The control store's key-value table, shared by every process of the
//! cluster (Ray's `internal_kv`).
//!
//! Small values only: configuration, addresses for a rendezvous, run
//! metadata. Keys are global to the cluster, so prefix them with something
//! of your own (a job or run id).
//!
//! ```no_run
//! fn main() -> prism::Result<()> {
//!     prism::init(prism::Config::default())?;
//!     assert!(prism::kv::put("my-run/leader", b"10.0.0.7:29500")?);
//!     let leader = prism::kv::get("my-run/leader")?.expect("just written");
//!     assert_eq!(leader, b"10.0.0.7:29500");
//!     assert_eq!(prism::kv::keys("my-run/")?, vec!["my-run/leader".to_string()]);
//!     assert!(prism::kv::delete("my-run/leader")?);
//!     Ok(())
//! }
//! ```

use crate::api::raylet_request;
use crate::Result;
use bytes::Bytes;
use prism_protocol::messages::{KvDelete, KvGet, KvKeys, KvPut};

/// Stores `value` under `key`, replacing an earlier value. Returns whether
/// the key is new.
pub fn put(key: &str, value: impl AsRef<[u8]>) -> Result<bool> {
    raylet_request(KvPut {
        key: key.to_string(),
        value: Bytes::copy_from_slice(value.as_ref()),
        overwrite: true,
    })
}

/// Stores `value` under `key` only if the key is absent. Returns whether it
/// was stored (the first writer wins).
pub fn put_if_absent(key: &str, value: impl AsRef<[u8]>) -> Result<bool> {
    raylet_request(KvPut {
        key: key.to_string(),
        value: Bytes::copy_from_slice(value.as_ref()),
        overwrite: false,
    })
}

/// The value under `key`, if any.
pub fn get(key: &str) -> Result<Option<Vec<u8>>> {
    let value = raylet_request(KvGet {
        key: key.to_string(),
    })?;
    Ok(value.map(|b| b.to_vec()))
}

/// Deletes `key`. Returns whether it existed.
pub fn delete(key: &str) -> Result<bool> {
    raylet_request(KvDelete {
        key: key.to_string(),
    })
}

/// The keys that start with `prefix`, sorted.
pub fn keys(prefix: &str) -> Result<Vec<String>> {
    raylet_request(KvKeys {
        prefix: prefix.to_string(),
    })
}
