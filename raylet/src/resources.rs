//! A node's resource accounting, with GPUs tracked per device.
//!
//! A request for less than one GPU is placed on a single device that has
//! that fraction free; a request for one or more must be whole and takes
//! whole free devices. The devices chosen become the worker's
//! `CUDA_VISIBLE_DEVICES`.

use prism_protocol::error::Error;
use prism_protocol::resources::{Quantity, ResourceSet, GPU};
use std::collections::BTreeMap;

/// What a granted request holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The whole shape.
    pub shape: ResourceSet,
    /// Device ids and the share taken on each.
    pub gpus: Vec<(u32, Quantity)>,
}

impl Allocation {
    /// The device ids, in order.
    pub fn gpu_ids(&self) -> Vec<u32> {
        self.gpus.iter().map(|(id, _)| *id).collect()
    }
}

/// Totals and what is free.
///
/// `available` is signed: a worker that blocks in `get` lends its CPUs back
/// (so the tasks it waits for can run), and takes them back when it wakes
/// even if that oversubscribes the node for a while; new leases wait until
/// the balance is positive again.
#[derive(Debug)]
pub struct NodeResources {
    total: ResourceSet,
    available: BTreeMap<String, i64>,
    /// Per device: its id on the node, and the share of it free here.
    gpu_free: Vec<(u32, Quantity)>,
}

impl NodeResources {
    /// A node with `total`; its GPU count becomes devices `0..n`.
    pub fn new(total: ResourceSet) -> Self {
        let gpus = total.get(GPU).units() / Quantity::SCALE;
        NodeResources {
            available: total
                .iter()
                .map(|(k, v)| (k.to_string(), v.units() as i64))
                .collect(),
            gpu_free: (0..gpus as u32)
                .map(|id| (id, Quantity::whole(1)))
                .collect(),
            total,
        }
    }

    /// The pool of one placement-group bundle: exactly what `allocation`
    /// took from the node, on the same GPU devices.
    pub fn for_bundle(allocation: &Allocation) -> Self {
        NodeResources {
            available: allocation
                .shape
                .iter()
                .map(|(k, v)| (k.to_string(), v.units() as i64))
                .collect(),
            gpu_free: allocation.gpus.clone(),
            total: allocation.shape.clone(),
        }
    }

    /// Everything the node has.
    pub fn total(&self) -> &ResourceSet {
        &self.total
    }

    /// What is free now (an oversubscribed resource shows as zero).
    pub fn available(&self) -> ResourceSet {
        let mut set = ResourceSet::new();
        for (k, v) in &self.available {
            set.set(k.clone(), Quantity::from_units((*v).max(0) as u64));
        }
        set
    }

    fn fits(&self, shape: &ResourceSet) -> bool {
        shape
            .iter()
            .all(|(k, v)| self.available.get(k).copied().unwrap_or(0) >= v.units() as i64)
    }

    fn adjust(&mut self, shape: &ResourceSet, sign: i64) {
        for (k, v) in shape.iter() {
            *self.available.entry(k.to_string()).or_default() += sign * v.units() as i64;
        }
    }

    /// A blocked worker lends back `shape` (its CPUs) until it wakes.
    pub fn lend(&mut self, shape: &ResourceSet) {
        self.adjust(shape, 1);
    }

    /// A woken worker takes back what it lent, even past zero.
    pub fn take_back(&mut self, shape: &ResourceSet) {
        self.adjust(shape, -1);
    }

    /// Rejects shapes this node could never run, naming the shape and the total.
    pub fn check_feasible(&self, shape: &ResourceSet) -> Result<(), Error> {
        let gpu = shape.get(GPU);
        let whole_gpu_ok = gpu.units() < Quantity::SCALE || gpu.is_whole();
        if !whole_gpu_ok {
            return Err(Error::invalid(
                "num_gpus",
                format!("{gpu} GPUs: a request above one GPU must be a whole number"),
            ));
        }
        if !self.total.contains(shape) {
            return Err(Error::Infeasible {
                shape: shape.to_string(),
                total: self.total.to_string(),
            });
        }
        Ok(())
    }

    /// Takes `shape` if it fits now.
    pub fn try_allocate(&mut self, shape: &ResourceSet) -> Option<Allocation> {
        if !self.fits(shape) {
            return None;
        }
        let gpu = shape.get(GPU);
        let gpus = if gpu.is_zero() {
            Vec::new()
        } else if gpu.units() < Quantity::SCALE {
            let slot = self.gpu_free.iter().position(|(_, free)| *free >= gpu)?;
            vec![(slot, gpu)]
        } else {
            let want = (gpu.units() / Quantity::SCALE) as usize;
            let ids: Vec<usize> = self
                .gpu_free
                .iter()
                .enumerate()
                .filter(|(_, (_, free))| *free == Quantity::whole(1))
                .map(|(slot, _)| slot)
                .take(want)
                .collect();
            if ids.len() < want {
                return None;
            }
            ids.into_iter().map(|i| (i, Quantity::whole(1))).collect()
        };
        let gpus = gpus
            .into_iter()
            .map(|(slot, share)| {
                let (id, free) = &mut self.gpu_free[slot];
                *free = free.saturating_sub(share);
                (*id, share)
            })
            .collect();
        self.adjust(shape, -1);
        Some(Allocation {
            shape: shape.clone(),
            gpus,
        })
    }

    /// Gives an allocation back.
    pub fn release(&mut self, allocation: &Allocation) {
        for (id, share) in &allocation.gpus {
            if let Some((_, free)) = self.gpu_free.iter_mut().find(|(d, _)| d == id) {
                *free = *free + *share;
            }
        }
        self.adjust(&allocation.shape, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_protocol::resources::CPU;

    fn shape(cpu: f64, gpu: f64) -> ResourceSet {
        let mut s = ResourceSet::new();
        s.set(CPU, Quantity::from_f64(CPU, cpu).unwrap());
        s.set(GPU, Quantity::from_f64(GPU, gpu).unwrap());
        s
    }

    #[test]
    fn two_half_gpu_requests_share_one_device() {
        let mut r = NodeResources::new(shape(4.0, 2.0));
        let a = r.try_allocate(&shape(1.0, 0.5)).unwrap();
        let b = r.try_allocate(&shape(1.0, 0.5)).unwrap();
        assert_eq!(a.gpu_ids(), vec![0]);
        assert_eq!(b.gpu_ids(), vec![0]);
        let c = r.try_allocate(&shape(1.0, 1.0)).unwrap();
        assert_eq!(c.gpu_ids(), vec![1]);
        assert!(r.try_allocate(&shape(0.0, 0.5)).is_none());
        r.release(&a);
        r.release(&b);
        r.release(&c);
        assert_eq!(&r.available(), r.total());
    }

    #[test]
    fn a_blocked_worker_lends_its_cpu_and_may_oversubscribe_when_it_wakes() {
        let mut r = NodeResources::new(shape(1.0, 0.0));
        let a = r.try_allocate(&shape(1.0, 0.0)).unwrap();
        r.lend(&shape(1.0, 0.0));
        let b = r
            .try_allocate(&shape(1.0, 0.0))
            .expect("the lent CPU runs another task");
        r.take_back(&shape(1.0, 0.0));
        assert!(
            r.try_allocate(&shape(0.5, 0.0)).is_none(),
            "oversubscribed: nothing fits"
        );
        r.release(&b);
        r.release(&a);
        assert_eq!(&r.available(), r.total());
    }

    #[test]
    fn a_bundle_pool_hands_out_its_own_devices() {
        let mut node = NodeResources::new(shape(4.0, 2.0));
        let _first = node.try_allocate(&shape(1.0, 1.0)).unwrap();
        let bundle = node.try_allocate(&shape(2.0, 1.0)).unwrap();
        assert_eq!(bundle.gpu_ids(), vec![1]);
        let mut pool = NodeResources::for_bundle(&bundle);
        let a = pool.try_allocate(&shape(1.0, 0.5)).unwrap();
        let b = pool.try_allocate(&shape(1.0, 0.5)).unwrap();
        assert_eq!((a.gpu_ids(), b.gpu_ids()), (vec![1], vec![1]));
        assert!(
            pool.try_allocate(&shape(0.0, 0.5)).is_none(),
            "the bundle is used up"
        );
        pool.release(&a);
        pool.release(&b);
        assert_eq!(&pool.available(), pool.total());
    }

    #[test]
    fn a_request_larger_than_the_node_is_infeasible_and_names_both() {
        let r = NodeResources::new(shape(2.0, 0.0));
        let err = r.check_feasible(&shape(3.0, 0.0)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("CPU: 3") && text.contains("CPU: 2"), "{text}");
    }
}
