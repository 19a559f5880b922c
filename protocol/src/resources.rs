//! Resource quantities in exact fixed point, and sets of named resources.
//!
//! A quantity is stored in ten-thousandths, so `0.5 GPU` added twice is
//! exactly one GPU: no float drift when a raylet adds and subtracts leases
//! millions of times.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The CPU resource name.
pub const CPU: &str = "CPU";
/// The GPU resource name; its instances are device ids.
pub const GPU: &str = "GPU";
/// The memory resource name, in bytes.
pub const MEMORY: &str = "memory";

/// A non-negative resource amount with four decimal digits of precision.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Quantity(u64);

/// Why a resource amount was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResourceError {
    /// The amount was negative, zero where a positive one is needed, or not a number.
    #[error("resource {name:?} must be a positive finite number, got {value}")]
    NotPositive {
        /// The resource name.
        name: String,
        /// The amount given.
        value: f64,
    },
    /// The amount is not a whole number where one is required.
    #[error("resource {name:?} above 1 must be a whole number, got {value}")]
    NotWhole {
        /// The resource name.
        name: String,
        /// The amount given.
        value: f64,
    },
}

impl Quantity {
    /// Units per whole resource.
    pub const SCALE: u64 = 10_000;
    /// Nothing.
    pub const ZERO: Quantity = Quantity(0);

    /// A whole number of units.
    pub const fn whole(n: u64) -> Quantity {
        Quantity(n * Self::SCALE)
    }

    /// Converts a user's float, rejecting negatives, NaN and infinity.
    pub fn from_f64(name: &str, value: f64) -> Result<Quantity, ResourceError> {
        if !value.is_finite() || value < 0.0 {
            return Err(ResourceError::NotPositive {
                name: name.to_string(),
                value,
            });
        }
        Ok(Quantity((value * Self::SCALE as f64).round() as u64))
    }

    /// A raw count of ten-thousandths.
    pub const fn from_units(units: u64) -> Quantity {
        Quantity(units)
    }

    /// The raw count of ten-thousandths.
    pub fn units(self) -> u64 {
        self.0
    }

    /// The amount as a float, for display.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / Self::SCALE as f64
    }

    /// Whether this is an exact whole number.
    pub fn is_whole(self) -> bool {
        self.0.is_multiple_of(Self::SCALE)
    }

    /// Whether it is zero.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Subtraction that stops at zero.
    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity(self.0.saturating_sub(other.0))
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;

    fn add(self, other: Quantity) -> Quantity {
        Quantity(self.0 + other.0)
    }
}

impl fmt::Debug for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_whole() {
            write!(f, "{}", self.0 / Self::SCALE)
        } else {
            write!(f, "{}", self.as_f64())
        }
    }
}

/// A set of named resource amounts: a request shape or a node's capacity.
#[derive(Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct ResourceSet(BTreeMap<String, Quantity>);

impl ResourceSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets one amount; zero removes the entry.
    pub fn set(&mut self, name: impl Into<String>, quantity: Quantity) {
        let name = name.into();
        if quantity.is_zero() {
            self.0.remove(&name);
        } else {
            self.0.insert(name, quantity);
        }
    }

    /// The amount of one resource (zero when absent).
    pub fn get(&self, name: &str) -> Quantity {
        self.0.get(name).copied().unwrap_or_default()
    }

    /// Iterates over the non-zero entries.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Quantity)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Whether every entry of `request` fits in `self`.
    pub fn contains(&self, request: &ResourceSet) -> bool {
        request.iter().all(|(k, v)| self.get(k) >= v)
    }

    /// Adds `other` entry by entry.
    pub fn add(&mut self, other: &ResourceSet) {
        for (k, v) in other.iter() {
            let sum = self.get(k) + v;
            self.set(k, sum);
        }
    }

    /// Subtracts `other` entry by entry, stopping at zero.
    pub fn subtract(&mut self, other: &ResourceSet) {
        for (k, v) in other.iter() {
            let rest = self.get(k).saturating_sub(v);
            self.set(k, rest);
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every entry as a plain number, as Ray's resource dictionaries read.
    ///
    /// ```
    /// use prism_protocol::resources::{Quantity, ResourceSet};
    /// let mut set = ResourceSet::new();
    /// set.set("CPU", Quantity::from_f64("CPU", 2.0).unwrap());
    /// set.set("gate", Quantity::from_f64("gate", 0.5).unwrap());
    /// let map = set.to_f64_map();
    /// assert_eq!(map["CPU"], 2.0);
    /// assert_eq!(map["gate"], 0.5);
    /// ```
    pub fn to_f64_map(&self) -> BTreeMap<String, f64> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.as_f64()))
            .collect()
    }
}

impl fmt::Debug for ResourceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ResourceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}: {v}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_add_up_to_exactly_one() {
        let half = Quantity::from_f64(GPU, 0.5).unwrap();
        assert_eq!(half + half, Quantity::whole(1));
        let tenth = Quantity::from_f64(CPU, 0.1).unwrap();
        let mut total = Quantity::ZERO;
        for _ in 0..10 {
            total = total + tenth;
        }
        assert_eq!(total, Quantity::whole(1));
    }

    #[test]
    fn negative_and_nan_amounts_are_rejected() {
        assert!(Quantity::from_f64(CPU, -1.0).is_err());
        assert!(Quantity::from_f64(CPU, f64::NAN).is_err());
    }

    #[test]
    fn contains_checks_every_entry() {
        let mut node = ResourceSet::new();
        node.set(CPU, Quantity::whole(2));
        let mut req = ResourceSet::new();
        req.set(CPU, Quantity::whole(1));
        assert!(node.contains(&req));
        req.set("custom", Quantity::whole(1));
        assert!(!node.contains(&req));
        assert_eq!(req.to_string(), "{CPU: 1, custom: 1}");
    }
}
