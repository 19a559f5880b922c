//! Work that waits here outside the scheduler's queue: an actor whose
//! shape no live node holds, in a cluster that may grow
//! (`infeasible_wait_ms`), waits before it is placed; a driver's program
//! on its way here (an empty shape) holds the work that will follow it.
//! Each counts as the node's demand, which the heartbeats tell the head,
//! so that an autoscaler sees it as it sees waiting lease requests (and
//! does not take a node that fetches a program for idle).

use prism_protocol::resources::ResourceSet;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The shapes waiting for a node, each while its [`Waiting`] lives.
#[derive(Debug, Default)]
pub(crate) struct Awaiting {
    shapes: Arc<parking_lot::Mutex<HashMap<u64, ResourceSet>>>,
    next: AtomicU64,
}

/// One shape's wait; dropping it ends the wait.
#[derive(Debug)]
pub(crate) struct Waiting {
    shapes: Arc<parking_lot::Mutex<HashMap<u64, ResourceSet>>>,
    key: u64,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.shapes.lock().remove(&self.key);
    }
}

impl Awaiting {
    /// Counts `shape` as waiting until the returned guard is dropped.
    pub(crate) fn enter(&self, shape: ResourceSet) -> Waiting {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.shapes.lock().insert(key, shape);
        Waiting {
            shapes: self.shapes.clone(),
            key,
        }
    }

    /// The shapes waiting, with how many of each.
    pub(crate) fn demands(&self) -> Vec<(ResourceSet, u64)> {
        let shapes = self.shapes.lock();
        let mut out: Vec<(ResourceSet, u64)> = Vec::new();
        for shape in shapes.values() {
            match out.iter_mut().find(|(s, _)| s == shape) {
                Some((_, n)) => *n += 1,
                None => out.push((shape.clone(), 1)),
            }
        }
        out
    }

    /// Adds the shapes waiting here to `demands` (a scheduler's).
    pub(crate) fn add_to(&self, demands: &mut Vec<(ResourceSet, u64)>) {
        for (shape, count) in self.demands() {
            match demands.iter_mut().find(|(s, _)| *s == shape) {
                Some((_, n)) => *n += count,
                None => demands.push((shape, count)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: f64) -> ResourceSet {
        use prism_protocol::resources::{Quantity, CPU};
        let mut s = ResourceSet::new();
        s.set(CPU, Quantity::from_f64(CPU, n).expect("a quantity"));
        s
    }

    #[test]
    fn a_wait_counts_while_its_guard_lives() {
        let a = Awaiting::default();
        let one = a.enter(cpus(4.0));
        let two = a.enter(cpus(4.0));
        let other = a.enter(cpus(8.0));
        let mut d = a.demands();
        d.sort_by_key(|(_, n)| *n);
        assert_eq!(d, vec![(cpus(8.0), 1), (cpus(4.0), 2)]);
        drop(two);
        drop(other);
        let mut queued = vec![(cpus(4.0), 3)];
        a.add_to(&mut queued);
        assert_eq!(queued, vec![(cpus(4.0), 4)]);
        drop(one);
        assert!(a.demands().is_empty());
    }
}
