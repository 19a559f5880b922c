//! Entrypoint resources: what each running job's entrypoint holds of the
//! node jobs run on (its `entrypoint_num_cpus`, `_num_gpus`, `_memory` and
//! `_resources`), and whether a waiting job's request fits what is left.
//! A job whose request does not fit stays PENDING, and its message names
//! the resource it waits for.

use std::collections::{BTreeMap, HashMap};

/// Amounts below this are taken as equal (requests are fractions).
const EPSILON: f64 = 1e-9;

/// One job's request: resource name to amount, nothing of amount 0.
pub(crate) type Request = Vec<(String, f64)>;

/// The resources the entrypoints of running jobs hold.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    holding: HashMap<String, Request>,
}

impl Admission {
    /// Lets job `id` hold `request` if it fits `total` less what the
    /// other entrypoints hold; otherwise says what it waits for. An
    /// unknown total (the node has not registered yet) admits.
    pub(crate) fn admit(
        &mut self,
        id: &str,
        request: Request,
        total: Option<&BTreeMap<String, f64>>,
    ) -> Result<(), String> {
        if let Some(total) = total {
            let held = self.held();
            for (name, amount) in &request {
                let all = total.get(name).copied().unwrap_or(0.0);
                let free = all - held.get(name.as_str()).copied().unwrap_or(0.0);
                if *amount > free + EPSILON {
                    let holders = self.holders_of(name);
                    return Err(format!(
                        "Job is waiting for resources for its entrypoint: it asks for {amount} \
                         {name}, and the node jobs run on has {} of {all} free (the entrypoints \
                         of {} hold the rest); it starts when one of them ends.",
                        free.max(0.0),
                        holders
                    ));
                }
            }
        }
        self.holding.insert(id.to_string(), request);
        Ok(())
    }

    /// Lets job `id` hold `request` whatever is free: a job found running
    /// when the head started again holds what it held before.
    pub(crate) fn hold(&mut self, id: &str, request: Request) {
        self.holding.insert(id.to_string(), request);
    }

    /// Gives back what job `id` held; true when it held anything.
    pub(crate) fn release(&mut self, id: &str) -> bool {
        self.holding
            .remove(id)
            .is_some_and(|request| !request.is_empty())
    }

    fn held(&self) -> BTreeMap<&str, f64> {
        let mut held = BTreeMap::new();
        for request in self.holding.values() {
            for (name, amount) in request {
                *held.entry(name.as_str()).or_insert(0.0) += amount;
            }
        }
        held
    }

    /// The jobs holding some of `name`, named in a message (at most 5).
    fn holders_of(&self, name: &str) -> String {
        let mut ids: Vec<&str> = self
            .holding
            .iter()
            .filter(|(_, r)| r.iter().any(|(n, a)| n == name && *a > 0.0))
            .map(|(id, _)| id.as_str())
            .collect();
        ids.sort_unstable();
        let more = ids.len().saturating_sub(5);
        let mut named = ids.into_iter().take(5).collect::<Vec<_>>().join(", ");
        if named.is_empty() {
            named = "no job".into();
        }
        if more > 0 {
            named.push_str(&format!(" and {more} more"));
        }
        named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(cpus: f64) -> BTreeMap<String, f64> {
        BTreeMap::from([("CPU".to_string(), cpus)])
    }

    #[test]
    fn a_request_waits_until_another_entrypoint_gives_its_share_back() {
        let mut a = Admission::default();
        let two = total(2.0);
        a.admit("a", vec![("CPU".into(), 1.5)], Some(&two)).unwrap();
        let why = a
            .admit("b", vec![("CPU".into(), 1.0)], Some(&two))
            .unwrap_err();
        assert!(why.contains("asks for 1 CPU"), "{why}");
        assert!(why.contains("has 0.5 of 2 free"), "{why}");
        assert!(why.contains("entrypoints of a hold"), "{why}");
        // A smaller one fits beside it.
        a.admit("c", vec![("CPU".into(), 0.5)], Some(&two)).unwrap();
        assert!(a.release("a"));
        a.admit("b", vec![("CPU".into(), 1.0)], Some(&two)).unwrap();
        // A job that asked for nothing holds nothing.
        a.admit("d", Vec::new(), Some(&two)).unwrap();
        assert!(!a.release("d"));
        assert!(!a.release("unknown"));
    }

    #[test]
    fn a_resource_the_node_lacks_waits_and_an_unknown_total_admits() {
        let mut a = Admission::default();
        let why = a
            .admit("g", vec![("GPU".into(), 1.0)], Some(&total(4.0)))
            .unwrap_err();
        assert!(why.contains("has 0 of 0 free"), "{why}");
        assert!(why.contains("no job"), "{why}");
        a.admit("g", vec![("GPU".into(), 1.0)], None).unwrap();
        // Held whatever is free: the total may be exceeded by adoption.
        a.hold("h", vec![("CPU".into(), 8.0)]);
        assert!(a
            .admit("i", vec![("CPU".into(), 1.0)], Some(&total(4.0)))
            .is_err());
    }
}
