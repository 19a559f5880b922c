//! Groups whose home died, at the head (see the parent module's docs):
//! each is taken up when its job still runs, and given back otherwise.

use super::{records, Placement, Placer};
use prism_protocol::ids::{JobId, PlacementGroupId};
use prism_protocol::messages::{DriverRecord, GroupRecord, NodeInfo, DRIVER_RECORD_PREFIX};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

impl Placer {
    /// At the head: looks for groups whose home node is dead (from their
    /// records in the head's table) and places each again from here when
    /// its job still runs, or removes it from the nodes still holding its
    /// bundles when its job is over. Run when a node dies and once when the
    /// head starts (a head started again finds the groups its earlier self
    /// was home to). One look at a time; a death during a look asks for
    /// another, and a look that could not decide about a group is made
    /// again a little later (at most `ADOPT_RETRIES` times).
    pub(crate) fn adopt_orphan_groups(&self) {
        let Some(m) = self.parts.membership.get() else {
            return;
        };
        if !m.is_head() {
            return;
        }
        {
            let mut looking = self.parts.state.adopting.lock();
            if looking.0 {
                looking.1 = true;
                return;
            }
            *looking = (true, false);
        }
        let node = self.clone();
        tokio::spawn(async move {
            // Should a look panic, the next node death may look again.
            struct Reset(Arc<Placement>);
            impl Drop for Reset {
                fn drop(&mut self) {
                    self.0.state.adopting.lock().0 = false;
                }
            }
            let _reset = Reset(node.parts.clone());
            let mut retries = 0;
            loop {
                let undecided = node.adopt_round().await;
                {
                    let mut looking = node.parts.state.adopting.lock();
                    if looking.1 {
                        looking.1 = false;
                        continue;
                    }
                    if !undecided || retries == ADOPT_RETRIES {
                        looking.0 = false;
                        break;
                    }
                }
                retries += 1;
                tokio::time::sleep(ADOPT_RETRY).await;
            }
        });
    }

    /// One look over the group records (see [`Placer::adopt_orphan_groups`]).
    /// Returns whether a group was left undecided (its job's state could
    /// not be read).
    async fn adopt_round(&self) -> bool {
        let Some(m) = self.parts.membership.get() else {
            return false;
        };
        // A head that just started has no view of the live nodes until its
        // first heartbeat's answer: without one, every holder would look
        // dead.
        let view_by = std::time::Instant::now() + VIEW_WAIT;
        while m.cluster_resources().is_none() && std::time::Instant::now() < view_by {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut gcs = m.gcs();
        let records = match records::load(&mut gcs).await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "the placement groups' records could not be read");
                return true;
            }
        };
        if records.is_empty() {
            return false;
        }
        let nodes = match m.nodes().await {
            Ok(nodes) => nodes,
            Err(e) => {
                tracing::warn!(error = %e, "the cluster's nodes could not be read");
                return true;
            }
        };
        let here = self.parts.node_id.to_string();
        let mut undecided = false;
        for record in records {
            if record.home == here || !is_dead(&nodes, &record.home) {
                continue;
            }
            match job_runs(&mut gcs, record.job, &nodes).await {
                Ok(true) if !record.nodes.is_empty() => self.adopt_group(record),
                // Never placed: the dead home may have left prepared
                // bundles anywhere, which a new placement of the same group
                // would find in its way. It is removed everywhere; its
                // creator's wait answers that it was removed.
                Ok(true) => {
                    tracing::warn!(group = %record.spec.id, home = %record.home, "a placement group's home died before placing it; the group is removed");
                    self.end_orphan_group(record)
                }
                Ok(false) => self.end_orphan_group(record),
                Err(why) => {
                    undecided = true;
                    tracing::warn!(group = %record.spec.id, %why, "could not tell whether a placement group's job still runs; looking again later")
                }
            }
        }
        undecided
    }

    /// Becomes the home of a group whose home died while its job runs:
    /// takes it up (holding the bundles it already held here, if any),
    /// records it, moves its bundles off dead nodes, and removes it when
    /// its job ends.
    fn adopt_group(&self, record: GroupRecord) {
        let GroupRecord {
            spec,
            job,
            home,
            nodes,
        } = record;
        let id = spec.id;
        if !self.parts.state.adopted.lock().insert(id) {
            return;
        }
        tracing::warn!(group = %id, %home, "a placement group's home node died while its job runs; the head places it again");
        let taken = self.local.move_bundles(job, spec.clone(), nodes.clone());
        if let Err(e) = taken {
            tracing::warn!(group = %id, error = %e, "a placement group whose home died could not be taken up; it is removed");
            self.end_orphan_group(GroupRecord {
                spec,
                job,
                home,
                nodes,
            });
            return;
        }
        // Home only once it is held here: a group in the home list that the
        // scheduler does not hold counts as ended.
        self.parts.state.home.lock().push(id);
        self.record_group(job, &spec, nodes);
        self.start_moving(job, spec);
        let node = self.clone();
        tokio::spawn(async move { node.end_with_job(job, id).await });
    }

    /// Removes an adopted group once its job is over (its driver left, or
    /// its driver's node died), checking every `JOB_CHECK`; returns when
    /// the group is removed otherwise.
    async fn end_with_job(self, job: JobId, id: PlacementGroupId) {
        let Some(m) = self.parts.membership.get() else {
            return;
        };
        loop {
            tokio::time::sleep(JOB_CHECK).await;
            if !self.local.group_is_live(id) {
                return;
            }
            let Ok(nodes) = m.nodes().await else {
                continue;
            };
            if let Ok(false) = job_runs(&mut m.gcs(), job, &nodes).await {
                tracing::info!(group = %id, %job, "the job of an adopted placement group ended; the group is removed");
                self.remove_group(id, true);
                return;
            }
        }
    }

    /// A group whose home died after its job ended (or before placing
    /// it): its bundles on live nodes are given back, and its record goes.
    fn end_orphan_group(&self, record: GroupRecord) {
        let id = record.spec.id;
        let here = self.parts.node_id.to_string();
        let mut holders: BTreeSet<String> = record.nodes.into_iter().collect();
        if holders.is_empty() {
            // Not placed: any live node may hold a prepared bundle of it.
            if let Some(m) = self.parts.membership.get() {
                holders = m.other_nodes().into_iter().collect();
            }
            holders.insert(here.clone());
        }
        tracing::info!(group = %id, home = %record.home, "a placement group's home node died with its job, or before placing it; its bundles are given back");
        for node in holders {
            if node == here {
                self.remove_group(id, false);
            } else if node != record.home {
                self.tell_node_remove(node, id);
            }
        }
        if let Some(records) = self.parts.records.get() {
            records.forget(id);
        }
    }
}

/// How long a look for groups whose home died waits for the head's first
/// view of the live nodes.
const VIEW_WAIT: Duration = Duration::from_secs(10);
/// How often, and how long after, a look that left a group undecided is
/// made again.
const ADOPT_RETRIES: u32 = 60;
const ADOPT_RETRY: Duration = Duration::from_secs(5);

/// How often the head looks whether an adopted group's job still runs.
const JOB_CHECK: Duration = Duration::from_secs(1);

/// Whether `node` is dead: the head lists it dead, or no longer lists it
/// (every live node is registered with the head, and the head keeps its
/// members across its restarts, while it forgets long-dead ones).
fn is_dead(nodes: &[NodeInfo], node: &str) -> bool {
    !nodes.iter().any(|n| n.node_id == node && n.alive)
}

/// Whether job `job`'s driver still runs: its record says it has not
/// left, and its node is alive. `Err` when that cannot be read.
async fn job_runs(
    gcs: &mut prism_gcs::GcsClient,
    job: JobId,
    nodes: &[NodeInfo],
) -> Result<bool, String> {
    let key = format!("{DRIVER_RECORD_PREFIX}{job}");
    let raw = gcs.kv_get(key).await.map_err(|e| e.to_string())?;
    // Written in the background as the driver registered: a missing one is
    // not yet known, not a job without a driver.
    let Some(raw) = raw else {
        return Err(format!("no record of job {job}'s driver"));
    };
    let driver: DriverRecord = serde_json::from_slice(&raw).map_err(|e| e.to_string())?;
    Ok(driver.end_time.is_none() && nodes.iter().any(|n| n.node_id == driver.node_id && n.alive))
}
