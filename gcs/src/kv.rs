//! The key-value table (Ray's internal KV): small values that drivers and
//! workers share by name. The head's control store holds the cluster's;
//! an embedded single-node cluster's raylet holds its own.

use bytes::Bytes;
use std::collections::HashMap;

/// Keys to values; see the module docs.
#[derive(Debug, Default)]
pub struct KvTable {
    entries: HashMap<String, Bytes>,
}

impl KvTable {
    /// Stores `value` unless the key exists and `overwrite` is false.
    /// True if the key was new.
    pub fn put(&mut self, key: String, value: Bytes, overwrite: bool) -> bool {
        let fresh = !self.entries.contains_key(&key);
        if fresh || overwrite {
            self.entries.insert(key, value);
        }
        fresh
    }

    /// The value of `key`, if any.
    pub fn get(&self, key: &str) -> Option<Bytes> {
        self.entries.get(key).cloned()
    }

    /// True if the key existed.
    pub fn delete(&mut self, key: &str) -> bool {
        self.entries.remove(key).is_some()
    }

    /// The keys starting with `prefix`, sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .entries
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        keys.sort();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_keeps_the_first_value_unless_told_to_overwrite() {
        let mut kv = KvTable::default();
        assert!(kv.put("a/1".into(), Bytes::from_static(b"x"), false));
        assert!(!kv.put("a/1".into(), Bytes::from_static(b"y"), false));
        assert_eq!(kv.get("a/1").as_deref(), Some(&b"x"[..]));
        assert!(!kv.put("a/1".into(), Bytes::from_static(b"z"), true));
        assert_eq!(kv.get("a/1").as_deref(), Some(&b"z"[..]));
        kv.put("b".into(), Bytes::new(), false);
        kv.put("a/0".into(), Bytes::new(), false);
        assert_eq!(kv.keys("a/"), vec!["a/0".to_string(), "a/1".to_string()]);
        assert!(kv.delete("a/1") && !kv.delete("a/1"));
    }
}
