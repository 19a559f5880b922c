//! Prism's table of tunables, shared by every crate.
//!
//! Each crate declares its part of the table with [`table!`]: one entry per
//! tunable, with its unit in the name, its type, its default and a line on
//! why that default. Every entry can be overridden by an environment
//! variable, the crate's prefix plus the entry's name in upper case
//! (`PRISM_LEASE_IDLE_MS`, `PRISM_COLLECTIVE_CHUNK_BYTES`,
//! `PRISM_TRAIN_PLACEMENT_TIMEOUT_MS`). A value that does not parse is a
//! [`ConfigError`] naming the variable, the value and the type expected, in
//! one format for every crate; it is never silently ignored.
//!
//! ```
//! prism_config::table! {
//!     /// Settings of a demo.
//!     #[derive(Debug, Clone)]
//!     pub struct Demo("PRISM_DEMO_") {
//!         /// Requests in flight. 8: enough to hide one round trip.
//!         window_requests: usize = 8;
//!     }
//! }
//!
//! let mut demo = Demo::default();
//! demo.apply_lookup(&|key| (key == "PRISM_DEMO_WINDOW_REQUESTS").then(|| "3".to_string()))?;
//! assert_eq!(demo.window_requests, 3);
//! assert_eq!(Demo::ENTRIES[0].key(), "PRISM_DEMO_WINDOW_REQUESTS");
//!
//! let err = demo
//!     .apply_lookup(&|key| (key == "PRISM_DEMO_WINDOW_REQUESTS").then(|| "many".to_string()))
//!     .unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "config PRISM_DEMO_WINDOW_REQUESTS: \"many\" is not an unsigned integer"
//! );
//! # Ok::<(), prism_config::ConfigError>(())
//! ```

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod backoff;

pub use backoff::Backoff;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A value that does not parse, or breaks a rule of its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The environment variable.
    pub key: String,
    /// The value it held.
    pub value: String,
    /// What was expected.
    pub expected: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "config {}: {:?} is not {}",
            self.key, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

/// One entry of a table, as documentation and tools see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The table's prefix, such as `PRISM_` or `PRISM_COLLECTIVE_`.
    pub prefix: &'static str,
    /// The field's name, with its unit (`lease_idle_ms`).
    pub name: &'static str,
    /// Its Rust type.
    pub ty: &'static str,
    /// Its default, as written in the table.
    pub default: &'static str,
    /// What it is and why its default.
    pub doc: &'static str,
}

impl Entry {
    /// The environment variable that overrides it.
    pub fn key(&self) -> String {
        format!("{}{}", self.prefix, self.name.to_ascii_uppercase())
    }
}

/// How a value is read from its environment variable.
pub trait ParseValue: Sized {
    /// What the value should look like, for error messages.
    const EXPECTED: &'static str;
    /// The value, or `None` when `s` does not parse.
    fn parse_value(s: &str) -> Option<Self>;
}

macro_rules! parse_via_fromstr {
    ($($ty:ty => $what:literal),*) => {$(
        impl ParseValue for $ty {
            const EXPECTED: &'static str = $what;
            fn parse_value(s: &str) -> Option<Self> { <$ty>::from_str(s.trim()).ok() }
        }
        impl ParseValue for Option<$ty> {
            const EXPECTED: &'static str = $what;
            fn parse_value(s: &str) -> Option<Self> { <$ty>::from_str(s.trim()).ok().map(Some) }
        }
    )*};
}
parse_via_fromstr!(
    u32 => "an unsigned integer",
    u64 => "an unsigned integer",
    usize => "an unsigned integer",
    f64 => "a number"
);

impl ParseValue for bool {
    const EXPECTED: &'static str = "a boolean (true/false/1/0)";
    fn parse_value(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Some(true),
            "0" | "false" | "no" | "off" => Some(false),
            _ => None,
        }
    }
}

impl ParseValue for String {
    const EXPECTED: &'static str = "a string";
    fn parse_value(s: &str) -> Option<Self> {
        Some(s.to_string())
    }
}

impl ParseValue for Option<String> {
    const EXPECTED: &'static str = "a string";
    fn parse_value(s: &str) -> Option<Self> {
        Some(Some(s.to_string()).filter(|s| !s.is_empty()))
    }
}

impl ParseValue for PathBuf {
    const EXPECTED: &'static str = "a path";
    fn parse_value(s: &str) -> Option<Self> {
        Some(PathBuf::from(s))
    }
}

impl ParseValue for Option<PathBuf> {
    const EXPECTED: &'static str = "a path";
    fn parse_value(s: &str) -> Option<Self> {
        Some(Some(PathBuf::from(s)).filter(|p| !p.as_os_str().is_empty()))
    }
}

/// Parses `value` of variable `key` as `T`.
pub fn parse<T: ParseValue>(key: &str, value: &str) -> Result<T, ConfigError> {
    T::parse_value(value).ok_or_else(|| ConfigError {
        key: key.to_string(),
        value: value.to_string(),
        expected: T::EXPECTED.to_string(),
    })
}

/// Declares a crate's part of the table: a struct with one public field per
/// entry, its `Default`, `ENTRIES` (for documentation and tools) and
/// `apply_lookup` / `apply_env` (the `PRISM_...` overrides). Fields after
/// `extra` are part of the struct but set only by code, not by the
/// environment. See the [crate docs](crate) for an example.
#[macro_export]
macro_rules! table {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($prefix:literal) {
            $( $(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr; )*
        }
        $( extra { $( $(#[$emeta:meta])* $efield:ident : $ety:ty = $edefault:expr; )* } )?
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
            $($( $(#[$emeta])* pub $efield: $ety, )*)?
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $( $field: $default, )*
                    $($( $efield: $edefault, )*)?
                }
            }
        }

        impl $name {
            /// Every entry of this part of the table, in order.
            pub const ENTRIES: &'static [$crate::Entry] = &[
                $( $crate::Entry {
                    prefix: $prefix,
                    name: stringify!($field),
                    ty: stringify!($ty),
                    default: stringify!($default),
                    doc: concat!($($doc, "\n"),*),
                }, )*
            ];

            /// Applies the overrides `lookup` gives for this table's
            /// variables (`lookup` maps a variable's name to its value).
            pub fn apply_lookup(
                &mut self,
                lookup: &dyn Fn(&str) -> Option<String>,
            ) -> Result<(), $crate::ConfigError> {
                $(
                    let key = concat!($prefix, stringify!($field)).to_ascii_uppercase();
                    if let Some(value) = lookup(&key) {
                        self.$field = $crate::parse::<$ty>(&key, &value)?;
                    }
                )*
                Ok(())
            }

            /// Applies the `PRISM_...` environment overrides.
            pub fn apply_env_overrides(&mut self) -> Result<(), $crate::ConfigError> {
                self.apply_lookup(&|key| std::env::var(key).ok())
            }
        }
    };
}

#[cfg(test)]
#[allow(unreachable_pub, dead_code)]
mod tests {
    use super::*;

    table! {
        #[derive(Debug)]
        struct Sample("PRISM_SAMPLE_") {
            /// A count.
            count_items: usize = 4;
            /// A switch.
            enabled: bool = true;
            /// A name.
            label: Option<String> = None;
        }
        extra {
            /// Set by code only.
            note: u32 = 7;
        }
    }

    #[test]
    fn entries_name_their_variables_defaults_and_docs() {
        let keys: Vec<String> = Sample::ENTRIES.iter().map(Entry::key).collect();
        assert_eq!(
            keys,
            [
                "PRISM_SAMPLE_COUNT_ITEMS",
                "PRISM_SAMPLE_ENABLED",
                "PRISM_SAMPLE_LABEL"
            ]
        );
        assert_eq!(Sample::ENTRIES[0].default, "4");
        assert_eq!(Sample::ENTRIES[0].doc.trim(), "A count.");
        assert_eq!(Sample::default().note, 7);
    }

    #[test]
    fn overrides_parse_and_bad_values_are_named() {
        let mut s = Sample::default();
        s.apply_lookup(&|k| match k {
            "PRISM_SAMPLE_ENABLED" => Some("off".into()),
            "PRISM_SAMPLE_LABEL" => Some("x".into()),
            _ => None,
        })
        .expect("good values");
        assert!(!s.enabled);
        assert_eq!(s.label.as_deref(), Some("x"));
        let err = s
            .apply_lookup(&|k| (k == "PRISM_SAMPLE_ENABLED").then(|| "maybe".into()))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "config PRISM_SAMPLE_ENABLED: \"maybe\" is not a boolean (true/false/1/0)"
        );
    }
}
