//! The autoscaler's decisions, as plain logic with no I/O
//! ([`Autoscaler::decide`]): from what the head reports (each node's
//! resources, free and in all, and the demand waiting for resources) and
//! what it launched itself, which worker nodes to start, which to stop,
//! and which demand no node type can ever meet. `launch::monitor` carries
//! them out on the head; the tests below feed it observations.
//!
//! - Demand that fits no node type (the head's included) is *infeasible*:
//!   reported at once, never launched for.
//! - Other demand is packed first onto the free resources of live nodes,
//!   then onto the nodes being launched, then onto new nodes of the first
//!   worker type (by name) that holds it, within each type's and the
//!   cluster's `max_workers`. Demand whose items each need a node of their
//!   own (a strict-spread group's bundles) goes first, never two items of
//!   one group on one node. At most `max(5, upscaling_speed × live
//!   workers)` launches are in flight at once.
//! - Each worker type keeps its `min_workers`.
//! - A worker node is *idle* while it holds no lease, has no demand, and
//!   runs nothing the caller reports as keeping it (an actor, an object
//!   stored there); one idle for `idle_timeout` is stopped, unless that
//!   would take its type under `min_workers`.
//! - A launch not seen alive within `launch_timeout` is given up.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Resources by name, in whole and fractional units.
pub(crate) type Shape = BTreeMap<String, f64>;

/// A worker type's limits and what a node of it offers.
#[derive(Debug, Clone)]
pub(crate) struct TypeLimits {
    pub(crate) name: String,
    pub(crate) resources: Shape,
    pub(crate) min_workers: u32,
    pub(crate) max_workers: u32,
}

/// The autoscaler's settings.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// The worker types, in the order they are tried.
    pub(crate) types: Vec<TypeLimits>,
    /// What the head offers (for telling infeasible demand only).
    pub(crate) head: Shape,
    /// The most worker nodes in all.
    pub(crate) max_workers: u32,
    pub(crate) idle_timeout: Duration,
    pub(crate) launch_timeout: Duration,
    pub(crate) upscaling_speed: f64,
}

/// A node as the head reports it.
#[derive(Debug, Clone)]
pub(crate) struct SeenNode {
    pub(crate) host: String,
    pub(crate) is_head: bool,
    pub(crate) total: Shape,
    pub(crate) free: Shape,
    /// Demand queued at this node.
    pub(crate) demand: u64,
    /// Something keeps it that resources do not show (an actor without
    /// resources, an object in its store).
    pub(crate) kept: bool,
}

/// What the head reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct Observation {
    /// The live nodes.
    pub(crate) nodes: Vec<SeenNode>,
    /// The waiting demand: shapes and how many of each.
    pub(crate) demand: Vec<(Shape, u64)>,
    /// Demand whose items each need a node of their own, apart from the
    /// others of the entry (a strict-spread group's bundles): a shape and
    /// how many, one entry per group.
    pub(crate) spread: Vec<(Shape, u64)>,
}

/// What to do now.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Decision {
    /// Worker types and how many nodes of each to start.
    pub(crate) launch: Vec<(String, u32)>,
    /// Worker hosts to stop.
    pub(crate) terminate: Vec<String>,
    /// Demand no node type can meet, with why.
    pub(crate) infeasible: Vec<String>,
}

/// A worker the autoscaler knows: launched by it, or found running.
#[derive(Debug, Clone)]
struct Worker {
    node_type: String,
    /// Set while launching: when it was asked for.
    launching_since: Option<Instant>,
    idle_since: Option<Instant>,
}

/// The autoscaler's state between decisions.
#[derive(Debug)]
pub(crate) struct Autoscaler {
    policy: Policy,
    workers: BTreeMap<String, Worker>,
    /// The last decision's infeasible demand and idle times, for reports.
    report: Vec<String>,
}

fn fits(free: &Shape, shape: &Shape) -> bool {
    shape
        .iter()
        .all(|(k, v)| *v <= 0.0 || free.get(k).copied().unwrap_or(0.0) + 1e-9 >= *v)
}

fn take(free: &mut Shape, shape: &Shape) {
    for (k, v) in shape {
        if let Some(f) = free.get_mut(k) {
            *f -= v;
        }
    }
}

/// A shape as Ray writes it: `{CPU: 2, GPU: 1}`.
pub(crate) fn show(shape: &Shape) -> String {
    let parts: Vec<String> = shape.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", parts.join(", "))
}

impl Autoscaler {
    pub(crate) fn new(policy: Policy) -> Autoscaler {
        Autoscaler {
            policy,
            workers: BTreeMap::new(),
            report: Vec::new(),
        }
    }

    /// A launch was made: `hosts` are coming up as `node_type`.
    pub(crate) fn launched(&mut self, node_type: &str, hosts: &[String], now: Instant) {
        for h in hosts {
            self.workers.insert(
                h.clone(),
                Worker {
                    node_type: node_type.to_string(),
                    launching_since: Some(now),
                    idle_since: None,
                },
            );
        }
    }

    /// A worker found running that this autoscaler did not launch (one
    /// `prism up` started, or one an earlier autoscaler launched).
    pub(crate) fn adopt(&mut self, host: &str, node_type: &str) {
        self.workers
            .entry(host.to_string())
            .or_insert_with(|| Worker {
                node_type: node_type.to_string(),
                launching_since: None,
                idle_since: None,
            });
    }

    /// What the head offers (as it reports it).
    pub(crate) fn set_head(&mut self, head: Shape) {
        self.policy.head = head;
    }

    /// The lines `prism status` shows of what the autoscaler does and why.
    pub(crate) fn report(&self) -> &[String] {
        &self.report
    }

    fn count(&self, node_type: &str) -> u32 {
        self.workers
            .values()
            .filter(|w| w.node_type == node_type)
            .count() as u32
    }

    /// Decides from `seen` at `now`.
    pub(crate) fn decide(&mut self, seen: &Observation, now: Instant) -> Decision {
        let mut d = Decision::default();
        let mut report = Vec::new();
        let alive: BTreeMap<&str, &SeenNode> =
            seen.nodes.iter().map(|n| (n.host.as_str(), n)).collect();

        // Launches that came up, and those given up.
        let mut given_up = Vec::new();
        for (host, w) in self.workers.iter_mut() {
            if let Some(since) = w.launching_since {
                if alive.contains_key(host.as_str()) {
                    w.launching_since = None;
                } else if now.duration_since(since) > self.policy.launch_timeout {
                    given_up.push(host.clone());
                }
            } else if !alive.contains_key(host.as_str()) {
                // A worker that died or was stopped by hand.
                given_up.push(host.clone());
            }
        }
        for host in given_up {
            if self
                .workers
                .get(&host)
                .is_some_and(|w| w.launching_since.is_some())
            {
                report.push(format!(
                    "{host}: not up within {} s of its launch; given up",
                    self.policy.launch_timeout.as_secs()
                ));
                d.terminate.push(host.clone());
            }
            self.workers.remove(&host);
        }

        // Infeasible demand, then packing onto what runs and what comes.
        let mut bins: Vec<Shape> = seen.nodes.iter().map(|n| n.free.clone()).collect();
        for w in self
            .workers
            .values()
            .filter(|w| w.launching_since.is_some())
        {
            if let Some(t) = self.policy.types.iter().find(|t| t.name == w.node_type) {
                bins.push(t.resources.clone());
            }
        }
        // What is left over, with the strict-spread entry it belongs to.
        let mut unmet: Vec<(Shape, Option<usize>)> = Vec::new();
        let mut feasible_waits = false;
        let mut demand: Vec<(Shape, u64, Option<usize>)> = (seen.spread.iter().enumerate())
            .map(|(i, (shape, n))| (shape.clone(), *n, Some(i)))
            .collect();
        let mut plain: Vec<(Shape, u64, Option<usize>)> = (seen.demand.iter())
            .map(|(shape, n)| (shape.clone(), *n, None))
            .collect();
        // Largest first, as first-fit decreasing packs; strict-spread
        // demand, the most constrained, before the rest.
        plain.sort_by(|a, b| {
            let size = |s: &Shape| s.values().sum::<f64>();
            size(&b.0).total_cmp(&size(&a.0))
        });
        demand.extend(plain);
        for (shape, count, entry) in &demand {
            let feasible = fits(&self.policy.head, shape)
                || self.policy.types.iter().any(|t| fits(&t.resources, shape));
            if !feasible {
                let offers: Vec<String> =
                    std::iter::once(format!("head {}", show(&self.policy.head)))
                        .chain(
                            self.policy
                                .types
                                .iter()
                                .map(|t| format!("{} {}", t.name, show(&t.resources))),
                        )
                        .collect();
                d.infeasible.push(format!(
                    "{count} waiting for {}: no node type has it ({})",
                    show(shape),
                    offers.join("; ")
                ));
                continue;
            }
            feasible_waits |= *count > 0;
            if entry.is_some() {
                // Each on a node of its own: one item per bin at most.
                let mut placed = 0;
                for b in bins.iter_mut() {
                    if placed < *count && fits(b, shape) {
                        take(b, shape);
                        placed += 1;
                    }
                }
                for _ in placed..*count {
                    unmet.push((shape.clone(), *entry));
                }
                continue;
            }
            for _ in 0..*count {
                match bins.iter_mut().find(|b| fits(b, shape)) {
                    Some(b) => take(b, shape),
                    None => unmet.push((shape.clone(), None)),
                }
            }
        }

        // New nodes for what is left, and for min_workers.
        let live_workers = self
            .workers
            .values()
            .filter(|w| w.launching_since.is_none())
            .count();
        let in_flight = self
            .workers
            .values()
            .filter(|w| w.launching_since.is_some())
            .count();
        let allowed = ((self.policy.upscaling_speed * live_workers as f64) as usize).max(5);
        let mut budget = allowed.saturating_sub(in_flight);
        let mut total = self.workers.len() as u32;
        let mut launch: BTreeMap<String, u32> = BTreeMap::new();
        for t in &self.policy.types {
            let have = self.count(&t.name);
            let need = t.min_workers.saturating_sub(have);
            for _ in 0..need {
                if budget == 0 || total >= self.policy.max_workers {
                    break;
                }
                *launch.entry(t.name.clone()).or_default() += 1;
                budget -= 1;
                total += 1;
            }
        }
        // New nodes: what each has left, and the strict-spread entries it
        // holds an item of.
        let mut new_bins: Vec<(Shape, BTreeSet<usize>)> = Vec::new();
        let mut blocked = BTreeSet::new();
        for (shape, entry) in unmet {
            let apart = |held: &BTreeSet<usize>| entry.is_none_or(|e| !held.contains(&e));
            if let Some((b, held)) =
                (new_bins.iter_mut()).find(|(b, held)| fits(b, &shape) && apart(held))
            {
                take(b, &shape);
                held.extend(entry);
                continue;
            }
            let choice = self.policy.types.iter().find(|t| {
                fits(&t.resources, &shape)
                    && self.count(&t.name) + launch.get(&t.name).copied().unwrap_or(0)
                        < t.max_workers
            });
            match choice {
                Some(t) if budget > 0 && total < self.policy.max_workers => {
                    let mut b = t.resources.clone();
                    take(&mut b, &shape);
                    new_bins.push((b, entry.into_iter().collect()));
                    *launch.entry(t.name.clone()).or_default() += 1;
                    budget -= 1;
                    total += 1;
                }
                _ => {
                    blocked.insert(show(&shape));
                }
            }
        }
        for shape in blocked {
            report.push(format!(
                "demand {shape} waits: the cluster is at its max_workers ({}), its node \
                 types' max_workers, or {allowed} launches in flight",
                self.policy.max_workers
            ));
        }
        d.launch = launch.into_iter().collect();

        // Idle workers.
        let mut per_type: BTreeMap<String, u32> = BTreeMap::new();
        for w in self.workers.values() {
            *per_type.entry(w.node_type.clone()).or_default() += 1;
        }
        let nothing_waits = !feasible_waits;
        for (host, w) in self.workers.iter_mut() {
            let Some(node) = alive.get(host.as_str()) else {
                continue;
            };
            let idle = node.demand == 0
                && !node.kept
                && nothing_waits
                && node
                    .total
                    .iter()
                    .all(|(k, v)| node.free.get(k).copied().unwrap_or(0.0) + 1e-9 >= *v);
            if !idle {
                w.idle_since = None;
                continue;
            }
            let since = *w.idle_since.get_or_insert(now);
            let idle_for = now.duration_since(since);
            let min = self
                .policy
                .types
                .iter()
                .find(|t| t.name == w.node_type)
                .map_or(0, |t| t.min_workers);
            let of_type = per_type.get(&w.node_type).copied().unwrap_or(0);
            if idle_for >= self.policy.idle_timeout && of_type > min {
                d.terminate.push(host.clone());
                per_type.insert(w.node_type.clone(), of_type - 1);
                report.push(format!(
                    "{host}: idle for {:.1} s; stopping it",
                    idle_for.as_secs_f64()
                ));
            } else if of_type > min {
                report.push(format!(
                    "{host}: idle for {} s of {} s",
                    idle_for.as_secs(),
                    self.policy.idle_timeout.as_secs()
                ));
            }
        }
        for host in &d.terminate {
            self.workers.remove(host);
        }
        for (t, n) in &d.launch {
            report.push(format!("launching {n} {t} node(s)"));
        }
        for (host, w) in &self.workers {
            if w.launching_since.is_some() {
                report.push(format!("{host}: {} node starting", w.node_type));
            }
        }
        report.extend(d.infeasible.iter().map(|i| format!("infeasible: {i}")));
        self.report = report;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(pairs: &[(&str, f64)]) -> Shape {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn policy(min: u32, max: u32) -> Policy {
        Policy {
            types: vec![TypeLimits {
                name: "worker".into(),
                resources: shape(&[("CPU", 1.0)]),
                min_workers: min,
                max_workers: max,
            }],
            head: shape(&[("CPU", 1.0)]),
            max_workers: max,
            idle_timeout: Duration::from_secs(10),
            launch_timeout: Duration::from_secs(60),
            upscaling_speed: 1.0,
        }
    }

    fn node(host: &str, total: f64, free: f64, head: bool) -> SeenNode {
        SeenNode {
            host: host.into(),
            is_head: head,
            total: shape(&[("CPU", total)]),
            free: shape(&[("CPU", free)]),
            demand: 0,
            kept: false,
        }
    }

    #[test]
    fn demand_beyond_the_head_launches_workers_up_to_max() {
        let mut a = Autoscaler::new(policy(0, 2));
        let t0 = Instant::now();
        let busy = Observation {
            nodes: vec![node("h", 1.0, 0.0, true)],
            demand: vec![(shape(&[("CPU", 1.0)]), 5)],
            spread: vec![],
        };
        let d = a.decide(&busy, t0);
        assert_eq!(d.launch, vec![("worker".to_string(), 2)], "two, the most");
        a.launched("worker", &["w1".into(), "w2".into()], t0);
        // While they start, nothing more is launched.
        let d = a.decide(&busy, t0 + Duration::from_secs(1));
        assert!(d.launch.is_empty(), "{d:?}");
        assert!(
            a.report()
                .iter()
                .any(|l| l.contains("w1: worker node starting")),
            "{:?}",
            a.report()
        );
    }

    #[test]
    fn a_strict_spread_group_gets_a_node_for_each_bundle_no_room_holds() {
        // Workers of 4 CPUs: plain demand of three 1-CPU bundles fits one.
        let mut p = policy(0, 5);
        p.types[0].resources = shape(&[("CPU", 4.0)]);
        let one = shape(&[("CPU", 1.0)]);
        let mut a = Autoscaler::new(p.clone());
        let plain = Observation {
            nodes: vec![node("h", 1.0, 0.0, true)],
            demand: vec![(one.clone(), 3)],
            spread: vec![],
        };
        let d = a.decide(&plain, Instant::now());
        assert_eq!(d.launch, vec![("worker".to_string(), 1)]);
        // Strict-spread: three nodes of their own, not one.
        let mut a = Autoscaler::new(p.clone());
        let spread = Observation {
            nodes: vec![node("h", 1.0, 0.0, true)],
            demand: vec![],
            spread: vec![(one.clone(), 3)],
        };
        let d = a.decide(&spread, Instant::now());
        assert_eq!(d.launch, vec![("worker".to_string(), 3)]);
        // A live node with room holds one of them, and two groups may
        // share nodes: two groups of two need two new nodes.
        let mut a = Autoscaler::new(p);
        let two_groups = Observation {
            nodes: vec![node("h", 1.0, 1.0, true)],
            demand: vec![],
            spread: vec![(one.clone(), 3), (one, 2)],
        };
        let d = a.decide(&two_groups, Instant::now());
        assert_eq!(d.launch, vec![("worker".to_string(), 2)], "{d:?}");
    }

    #[test]
    fn demand_the_free_resources_hold_launches_nothing() {
        let mut a = Autoscaler::new(policy(0, 2));
        let seen = Observation {
            nodes: vec![node("h", 2.0, 2.0, true)],
            demand: vec![(shape(&[("CPU", 1.0)]), 2)],
            spread: vec![],
        };
        assert!(a.decide(&seen, Instant::now()).launch.is_empty());
    }

    #[test]
    fn infeasible_demand_is_reported_and_never_launched_for() {
        let mut a = Autoscaler::new(policy(0, 2));
        let seen = Observation {
            nodes: vec![node("h", 1.0, 1.0, true)],
            demand: vec![(shape(&[("GPU", 1.0)]), 3)],
            spread: vec![],
        };
        let d = a.decide(&seen, Instant::now());
        assert!(d.launch.is_empty());
        assert_eq!(d.infeasible.len(), 1);
        assert!(
            d.infeasible[0].contains("3 waiting for {GPU: 1}"),
            "{:?}",
            d.infeasible
        );
        assert!(
            d.infeasible[0].contains("worker {CPU: 1}"),
            "{:?}",
            d.infeasible
        );
    }

    #[test]
    fn min_workers_are_kept_and_launches_are_bounded() {
        let mut p = policy(7, 10);
        p.types[0].min_workers = 7;
        let mut a = Autoscaler::new(p);
        let t0 = Instant::now();
        let seen = Observation {
            nodes: vec![node("h", 1.0, 1.0, true)],
            demand: vec![],
            spread: vec![],
        };
        let d = a.decide(&seen, t0);
        assert_eq!(
            d.launch,
            vec![("worker".to_string(), 5)],
            "five at once at most"
        );
        let hosts: Vec<String> = (0..5).map(|i| format!("w{i}")).collect();
        a.launched("worker", &hosts, t0);
        let mut up = seen.clone();
        up.nodes
            .extend(hosts.iter().map(|h| node(h, 1.0, 1.0, false)));
        let d = a.decide(&up, t0 + Duration::from_secs(1));
        assert_eq!(d.launch, vec![("worker".to_string(), 2)], "then the rest");
        assert!(
            d.terminate.is_empty(),
            "min_workers are not stopped when idle"
        );
    }

    #[test]
    fn an_idle_worker_stops_after_the_timeout_a_busy_one_does_not() {
        let mut a = Autoscaler::new(policy(0, 2));
        let t0 = Instant::now();
        a.adopt("w1", "worker");
        a.adopt("w2", "worker");
        let at = |w1_free: f64| Observation {
            nodes: vec![
                node("h", 1.0, 1.0, true),
                node("w1", 1.0, w1_free, false),
                node("w2", 1.0, 1.0, false),
            ],
            demand: vec![],
            spread: vec![],
        };
        assert!(a.decide(&at(0.0), t0).terminate.is_empty());
        let d = a.decide(&at(0.0), t0 + Duration::from_secs(5));
        assert!(d.terminate.is_empty(), "not yet: {d:?}");
        assert!(
            a.report()
                .iter()
                .any(|l| l.contains("w2: idle for 5 s of 10 s")),
            "{:?}",
            a.report()
        );
        let d = a.decide(&at(0.0), t0 + Duration::from_secs(11));
        assert_eq!(d.terminate, vec!["w2".to_string()], "w1 holds a lease");
        // w1 frees up: its idle time starts then.
        let d = a.decide(&at(1.0), t0 + Duration::from_secs(12));
        assert!(d.terminate.is_empty());
        let d = a.decide(&at(1.0), t0 + Duration::from_secs(23));
        assert_eq!(d.terminate, vec!["w1".to_string()]);
    }

    #[test]
    fn a_worker_kept_by_an_actor_or_an_object_is_not_idle() {
        let mut a = Autoscaler::new(policy(0, 2));
        let t0 = Instant::now();
        a.adopt("w1", "worker");
        let mut w1 = node("w1", 1.0, 1.0, false);
        w1.kept = true;
        let seen = Observation {
            nodes: vec![node("h", 1.0, 1.0, true), w1],
            demand: vec![],
            spread: vec![],
        };
        a.decide(&seen, t0);
        assert!(a
            .decide(&seen, t0 + Duration::from_secs(60))
            .terminate
            .is_empty());
    }

    #[test]
    fn a_launch_not_up_in_time_is_given_up() {
        let mut a = Autoscaler::new(policy(0, 1));
        let t0 = Instant::now();
        a.launched("worker", &["w1".into()], t0);
        let seen = Observation {
            nodes: vec![node("h", 1.0, 1.0, true)],
            demand: vec![],
            spread: vec![],
        };
        assert!(a
            .decide(&seen, t0 + Duration::from_secs(30))
            .terminate
            .is_empty());
        let d = a.decide(&seen, t0 + Duration::from_secs(61));
        assert_eq!(d.terminate, vec!["w1".to_string()]);
        assert!(
            a.report().iter().any(|l| l.contains("given up")),
            "{:?}",
            a.report()
        );
    }
}
