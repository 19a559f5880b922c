//! The table of tunables.
//!
//! Every knob is one entry below: its name, type, default and why. Each can
//! be overridden by the environment variable `PRISM_<NAME>` (upper case),
//! read when `prism::init` runs; a value that does not parse makes `init`
//! fail with [`Error::Config`] naming the variable, the value and the type
//! expected. Builder methods on [`Config`] override both.

use crate::Error;
use prism_protocol::resources::{Quantity, ResourceSet, CPU, GPU, MEMORY};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;

macro_rules! config_table {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr; )*) => {
        /// Runtime configuration; see the module docs for overrides.
        #[derive(Debug, Clone)]
        pub struct Config {
            $( $(#[$doc])* pub $name: $ty, )*
            /// Custom resources this node offers (name to amount).
            pub resources: BTreeMap<String, f64>,
            /// Return `Ok` from a second `init` instead of `AlreadyInitialized`.
            pub ignore_reinit_error: bool,
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $( $name: $default, )* resources: BTreeMap::new(), ignore_reinit_error: false }
            }
        }

        impl Config {
            /// Applies `PRISM_<NAME>` environment overrides.
            pub fn apply_env(mut self) -> Result<Self, Error> {
                $(
                    let key = concat!("PRISM_", stringify!($name)).to_uppercase();
                    if let Ok(value) = std::env::var(&key) {
                        self.$name = ParseValue::parse_value(&value).ok_or_else(|| Error::Config {
                            key: key.clone(),
                            value: value.clone(),
                            expected: <$ty as ParseValue>::EXPECTED.to_string(),
                        })?;
                    }
                )*
                Ok(self)
            }
        }
    };
}

config_table! {
    /// Address of a running cluster to join (a raylet socket path or a
    /// session directory). `None` starts an embedded single-node cluster.
    address: Option<String> = None;
    /// CPUs this node offers; `None` means every core of the machine.
    num_cpus: Option<u32> = None;
    /// GPUs this node offers; `None` counts `/dev/nvidia<N>` devices.
    num_gpus: Option<u32> = None;
    /// Memory this node offers to tasks, in bytes; `None` is the machine's total.
    memory_bytes: Option<u64> = None;
    /// Object store capacity. Ray's default is 30% of memory; we take the
    /// same share, bounded so that tests on small machines stay small.
    object_store_memory_bytes: Option<u64> = None;
    /// Values up to this size travel inside messages; larger ones go to
    /// shared memory once. 100 KiB, as in Ray: below this a copy through a
    /// socket costs less than a store round trip.
    max_direct_call_object_size_bytes: u64 = 100 * 1024;
    /// Namespace for named actors.
    namespace: String = "default".to_string();
    /// Where session directories are made (logs, sockets).
    temp_dir: PathBuf = PathBuf::from("/tmp/prism");
    /// Forward workers' stdout and stderr to the driver's terminal.
    log_to_driver: bool = true;
    /// Threads of the driver's runtime: two serve a 2-core machine, more
    /// only add switching.
    runtime_threads: usize = 2;
    /// How long a submitter keeps an idle leased worker before giving it
    /// back; a short hold makes back-to-back calls skip the lease round trip.
    lease_idle_ms: u64 = 20;
    /// Workers beyond the prestarted pool (started for a burst of tasks)
    /// are stopped after being idle this long; starting one again costs a
    /// few milliseconds, an idle one a few MiB.
    idle_worker_timeout_ms: u64 = 10_000;
    /// How long `init` waits for the raylet and the first workers.
    startup_timeout_ms: u64 = 30_000;
}

impl Config {
    /// Sets the CPU count.
    pub fn num_cpus(mut self, n: u32) -> Self {
        self.num_cpus = Some(n);
        self
    }

    /// Sets the GPU count.
    pub fn num_gpus(mut self, n: u32) -> Self {
        self.num_gpus = Some(n);
        self
    }

    /// Sets the object store capacity in bytes.
    pub fn object_store_memory(mut self, bytes: u64) -> Self {
        self.object_store_memory_bytes = Some(bytes);
        self
    }

    /// Adds a custom resource.
    pub fn resource(mut self, name: impl Into<String>, amount: f64) -> Self {
        self.resources.insert(name.into(), amount);
        self
    }

    /// Sets the namespace for named actors.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Joins the cluster at `address` instead of starting one.
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// Whether worker output is printed by the driver.
    pub fn log_to_driver(mut self, on: bool) -> Self {
        self.log_to_driver = on;
        self
    }

    /// Makes a second `init` succeed quietly.
    pub fn ignore_reinit_error(mut self, on: bool) -> Self {
        self.ignore_reinit_error = on;
        self
    }

    /// The node's total resources, from this config and the machine.
    pub(crate) fn node_resources(&self) -> Result<ResourceSet, Error> {
        let mut set = ResourceSet::new();
        let cpus = self.num_cpus.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        });
        set.set(CPU, Quantity::whole(cpus as u64));
        let gpus = self.num_gpus.unwrap_or_else(count_gpu_devices);
        set.set(GPU, Quantity::whole(gpus as u64));
        set.set(
            MEMORY,
            Quantity::whole(self.memory_bytes.unwrap_or_else(total_memory_bytes)),
        );
        for (name, amount) in &self.resources {
            if matches!(name.as_str(), CPU | GPU | MEMORY) {
                return Err(Error::invalid(
                    format!("resource {name:?}"),
                    "use Config::num_cpus / num_gpus / memory_bytes for the built-in resources",
                ));
            }
            let q = Quantity::from_f64(name, *amount)
                .map_err(|e| Error::invalid(format!("resource {name:?}"), e.to_string()))?;
            set.set(name.clone(), q);
        }
        Ok(set)
    }

    pub(crate) fn store_capacity(&self) -> u64 {
        self.object_store_memory_bytes
            .unwrap_or_else(|| (total_memory_bytes() / 10 * 3).clamp(64 << 20, 8 << 30))
    }
}

fn count_gpu_devices() -> u32 {
    (0..64)
        .take_while(|i| std::path::Path::new(&format!("/dev/nvidia{i}")).exists())
        .count() as u32
}

fn total_memory_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        8 << 30
    }
}

/// How a config value is read from its environment variable.
trait ParseValue: Sized {
    const EXPECTED: &'static str;
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
parse_via_fromstr!(u32 => "an unsigned integer", u64 => "an unsigned integer", usize => "an unsigned integer");

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_that_does_not_parse_names_key_value_and_type() {
        std::env::set_var("PRISM_LEASE_IDLE_MS", "soon");
        let err = Config::default().apply_env().unwrap_err();
        std::env::remove_var("PRISM_LEASE_IDLE_MS");
        assert_eq!(
            err.to_string(),
            "config PRISM_LEASE_IDLE_MS: cannot parse \"soon\" as an unsigned integer"
        );
    }
}
