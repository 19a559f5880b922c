//! Resource requests as the API takes them (floats, by name), shared by
//! task and actor options and placement-group bundles.

use crate::{Error, Result};
use prism_protocol::resources::{Quantity, ResourceSet, CPU, GPU, MEMORY};
use std::collections::BTreeMap;

/// Resource requests shared by tasks and actors.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Resources {
    pub(crate) num_cpus: Option<f64>,
    pub(crate) num_gpus: Option<f64>,
    pub(crate) memory: Option<f64>,
    pub(crate) custom: BTreeMap<String, f64>,
}

/// The resource builder methods shared by [`TaskOptions`](crate::TaskOptions), [`ActorOptions`](crate::ActorOptions)
/// and [`Bundle`](crate::Bundle): `$field` is where the type keeps its
/// [`Resources`], `$who` how its docs name what holds them.
macro_rules! resource_builders {
    ($field:ident, $who:literal) => {
        #[doc = concat!("CPUs ", $who, " (a whole number such as `2`, or a fraction such as `0.5`).")]
        pub fn num_cpus(mut self, n: impl Into<f64>) -> Self {
            self.$field.num_cpus = Some(n.into());
            self
        }

        #[doc = concat!("GPUs ", $who, "; below 1 it shares one device.")]
        pub fn num_gpus(mut self, n: impl Into<f64>) -> Self {
            self.$field.num_gpus = Some(n.into());
            self
        }

        #[doc = concat!("Memory in bytes ", $who, ".")]
        pub fn memory(mut self, bytes: impl Into<f64>) -> Self {
            self.$field.memory = Some(bytes.into());
            self
        }

        #[doc = concat!("A custom resource amount ", $who, ".")]
        pub fn resource(mut self, name: impl Into<String>, amount: impl Into<f64>) -> Self {
            self.$field.custom.insert(name.into(), amount.into());
            self
        }
    };
}
pub(crate) use resource_builders;

impl Resources {
    /// These requests, with those not made here taken from `defaults`.
    pub(crate) fn or(mut self, defaults: Resources) -> Resources {
        self.num_cpus = self.num_cpus.or(defaults.num_cpus);
        self.num_gpus = self.num_gpus.or(defaults.num_gpus);
        self.memory = self.memory.or(defaults.memory);
        for (k, v) in defaults.custom {
            self.custom.entry(k).or_insert(v);
        }
        self
    }

    pub(crate) fn to_set(&self, default_cpus: f64) -> Result<ResourceSet> {
        let mut set = ResourceSet::new();
        let mut put = |name: &str, value: f64, allow_zero: bool| -> Result<()> {
            if !(allow_zero && value == 0.0) {
                positive(&format!("{name} request"), value)?;
            }
            let q =
                Quantity::from_f64(name, value).map_err(|e| Error::invalid(name, e.to_string()))?;
            set.set(name, q);
            Ok(())
        };
        put(CPU, self.num_cpus.unwrap_or(default_cpus), true)?;
        if let Some(g) = self.num_gpus {
            put(GPU, g, true)?;
        }
        if let Some(m) = self.memory {
            put(MEMORY, m, false)?;
        }
        for (k, v) in &self.custom {
            put(k, *v, false)?;
        }
        Ok(set)
    }
}

/// Checks a user-supplied count or size.
pub(crate) fn positive(what: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(Error::invalid(
            what,
            format!("must be a positive number, got {value}"),
        ))
    }
}
