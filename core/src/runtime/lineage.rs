//! Lineage: how each owned object in a store was made, kept so that the
//! object can be made again when the node holding it dies (Ray's lineage
//! reconstruction).
//!
//! A task's lineage is kept when its arguments are values or objects this
//! process owns (its *dependencies*). Making the object again runs the
//! task again, so its dependencies must be reachable then too:
//!
//! - a dependency still referenced is fetched by the task as usual; if its
//!   copy was lost too, the task's worker tells this process, which makes
//!   it again the same way;
//! - a dependency whose references are all gone has had its value freed,
//!   but its own lineage is kept (`freed`) as long as a kept lineage
//!   depends on it (`uses`), so it can be made again first.
//!
//! A lineage is dropped when its object is freed and nothing depends on
//! it; dropping it may release the lineages it depended on, in turn. The
//! table is plain data: [`Objects`](super::objects::Objects) holds it
//! under a lock and runs what it decides.

use super::submission::SchedulingKey;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::TaskSpec;
use std::collections::HashMap;

/// Runs a task again from its lineage (the task submitter does), holding
/// `held` (the objects it takes by reference) until it answers.
pub(crate) trait Resubmit: Send + Sync {
    /// Submits `lineage`'s task again.
    fn resubmit(self: std::sync::Arc<Self>, lineage: Lineage, held: Vec<ObjectId>);
}

/// How a stored object was made: its task, with its arguments.
#[derive(Debug, Clone)]
pub(crate) struct Lineage {
    pub(crate) key: SchedulingKey,
    pub(crate) spec: TaskSpec,
    pub(crate) max_retries: i64,
    /// The owned objects the task took by reference.
    pub(crate) deps: Vec<ObjectId>,
}

#[derive(Debug)]
struct Kept {
    lineage: Lineage,
    /// The object's references are gone and its value freed; the lineage
    /// stays only for the lineages that depend on it.
    freed: bool,
}

/// Every kept lineage of this process, by object.
#[derive(Debug, Default)]
pub(crate) struct LineageTable {
    /// Boxed: a record is several hundred bytes, and a table keeps up to
    /// twice as many slots as records (a million queued tasks, a million
    /// records).
    kept: HashMap<ObjectId, Box<Kept>>,
    /// How many kept lineages depend on each object.
    uses: HashMap<ObjectId, u32>,
}

impl LineageTable {
    /// Keeps how a task's results are being made (again, for a retry or a
    /// rebuild: the previous records are replaced). A task that returns
    /// several results has a record under each; run again, it replaces
    /// only those still kept (a result freed meanwhile stays forgotten).
    pub(crate) fn record(&mut self, lineage: Lineage) {
        if lineage.spec.more_returns.is_empty() {
            return self.replace(lineage.spec.return_id, lineage);
        }
        let ids: Vec<ObjectId> = lineage.spec.returns().collect();
        let first_run = !ids.iter().any(|id| self.kept.contains_key(id));
        for id in ids {
            if first_run || self.kept.contains_key(&id) {
                self.replace(id, lineage.clone());
            }
        }
    }

    /// Keeps `lineage` as the record of `id`; a record it replaces keeps
    /// its `freed` mark.
    fn replace(&mut self, id: ObjectId, lineage: Lineage) {
        // Count the new record's users first, so that dropping the old
        // one never frees what both depend on.
        for d in &lineage.deps {
            *self.uses.entry(*d).or_default() += 1;
        }
        let freed = self.kept.get(&id).is_some_and(|k| k.freed);
        self.drop_record(id);
        self.kept.insert(id, Box::new(Kept { lineage, freed }));
    }

    /// The lineage of `id`, if kept.
    pub(crate) fn get(&self, id: ObjectId) -> Option<Lineage> {
        self.kept.get(&id).map(|k| k.lineage.clone())
    }

    /// Whether `id`'s value was freed while its lineage is kept for others.
    #[cfg(test)]
    pub(crate) fn is_freed(&self, id: ObjectId) -> bool {
        self.kept.get(&id).is_some_and(|k| k.freed)
    }

    /// `id` is live again (being made again for a lineage that needs it).
    pub(crate) fn revive(&mut self, id: ObjectId) {
        if let Some(k) = self.kept.get_mut(&id) {
            k.freed = false;
        }
    }

    /// `id`'s references are all gone and its value freed: its lineage
    /// stays while others depend on it, and goes otherwise.
    pub(crate) fn freed(&mut self, id: ObjectId) {
        if self.uses.get(&id).is_some_and(|n| *n > 0) {
            if let Some(k) = self.kept.get_mut(&id) {
                k.freed = true;
            }
        } else {
            self.drop_record(id);
        }
    }

    /// `id` will never need making again (its value is not in a store, or
    /// its task failed): its lineage goes now.
    pub(crate) fn forget(&mut self, id: ObjectId) {
        self.drop_record(id);
    }

    /// How many lineages are kept (for tests and stats).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kept.len()
    }

    /// Removes `id`'s record, then every freed record that no kept lineage
    /// depends on any more.
    fn drop_record(&mut self, id: ObjectId) {
        let mut gone = vec![id];
        while let Some(id) = gone.pop() {
            let Some(k) = self.kept.remove(&id) else {
                continue;
            };
            for d in k.lineage.deps {
                let Some(n) = self.uses.get_mut(&d) else {
                    continue;
                };
                *n -= 1;
                if *n == 0 {
                    self.uses.remove(&d);
                    if self.kept.get(&d).is_some_and(|k| k.freed) {
                        gone.push(d);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prism_protocol::resources::ResourceSet;

    fn made(id: ObjectId, deps: &[ObjectId]) -> Lineage {
        Lineage {
            key: SchedulingKey {
                shape: ResourceSet::new(),
                bundle: None,
                strategy: Default::default(),
                env_vars: Default::default(),
            },
            spec: TaskSpec::new("f".into(), Vec::new(), id, Vec::new(), String::new()),
            max_retries: 3,
            deps: deps.to_vec(),
        }
    }

    #[test]
    fn a_freed_dependency_is_kept_until_the_last_lineage_needing_it_goes() {
        let mut t = LineageTable::default();
        let (a, b, c) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        t.record(made(a, &[]));
        t.record(made(b, &[a]));
        t.record(made(c, &[b]));
        // a and b are freed: c's lineage needs b's, which needs a's.
        t.freed(a);
        t.freed(b);
        assert!(t.is_freed(a) && t.is_freed(b));
        assert_eq!(t.len(), 3);
        // A retry of c records it again without counting b twice, and
        // without losing b's lineage meanwhile.
        t.record(made(c, &[b]));
        assert_eq!(t.len(), 3);
        // c goes: b's and then a's lineage go with it.
        t.freed(c);
        assert_eq!(t.len(), 0);
        assert!(t.uses.is_empty());
    }

    #[test]
    fn a_task_with_several_results_keeps_a_record_under_each_and_a_rerun_only_the_kept_ones() {
        let mut t = LineageTable::default();
        let (a, x, y) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        t.record(made(a, &[]));
        let mut pair = made(x, &[a]);
        pair.spec.more_returns = vec![y];
        t.record(pair.clone());
        assert!(t.get(x).is_some() && t.get(y).is_some());
        assert_eq!(t.uses[&a], 2, "each record counts its dependency");
        // y is freed and nothing depends on it: its record goes, x's stays.
        t.freed(y);
        assert!(t.get(y).is_none() && t.get(x).is_some());
        // Run again to make x: only x's record is replaced.
        t.record(pair);
        assert!(t.get(y).is_none() && t.get(x).is_some());
        assert_eq!(t.uses[&a], 1);
        t.freed(x);
        t.freed(a);
        assert_eq!(t.len(), 0);
        assert!(t.uses.is_empty());
    }

    #[test]
    fn a_live_dependency_keeps_its_lineage_and_a_revived_one_is_freed_again() {
        let mut t = LineageTable::default();
        let (a, b) = (ObjectId::new(), ObjectId::new());
        t.record(made(a, &[]));
        t.record(made(b, &[a]));
        t.freed(b);
        assert_eq!(t.len(), 1, "nothing needs b; a is still referenced");
        t.record(made(b, &[a]));
        t.freed(a);
        t.revive(a);
        assert!(!t.is_freed(a));
        t.freed(a);
        t.forget(b);
        assert_eq!(t.len(), 0);
    }
}
