//! Where an actor created through this node goes: accepted here, sent on
//! to the node its strategy picks, or (in a cluster that may grow) waiting
//! for a node that can hold it; and a named actor's claim on its name.

use crate::node::Node;
use prism_protocol::error::{Error, Result};
use prism_protocol::ids::JobId;
use prism_protocol::messages::{ActorPlacement, ActorSpec, SchedulingStrategy};
use prism_protocol::rpc::Connection;
use std::sync::Arc;

/// [`Node::accept_actor`], then, for a named actor taken here in a
/// cluster, claims its name in the head's directory; an actor whose name is
/// held by another live actor is given up.
pub(super) async fn accept_named_actor(
    node: &Arc<Node>,
    job: JobId,
    spec: ActorSpec,
    lessee: Option<Connection>,
) -> Result<ActorPlacement> {
    let (name, namespace) = (spec.options.name.clone(), spec.options.namespace.clone());
    let actor_id = spec.actor_id;
    let placed = accept_actor_waiting(node, job, spec, lessee).await?;
    match (placed, name) {
        (ActorPlacement::Accepted, Some(name)) if node.membership.get().is_some() => {
            let claimed = (node.names)
                .claim(&namespace, &name, actor_id, node.as_ref())
                .await;
            if let Err(e) = claimed {
                let _ = node.kill_actor(actor_id, true, false);
                return Err(e);
            }
            Ok(ActorPlacement::Accepted)
        }
        (placed, _) => Ok(placed),
    }
}

/// Accepts an actor here or sends it on. In a cluster that may grow
/// (`infeasible_wait_ms`), an actor of this node's own clients whose shape
/// no live node holds waits, counted as this node's demand (which the
/// head's autoscaler sees), until a node that holds it joins or the wait
/// is over; then it fails as infeasible.
async fn accept_actor_waiting(
    node: &Arc<Node>,
    job: JobId,
    spec: ActorSpec,
    lessee: Option<Connection>,
) -> Result<ActorPlacement> {
    let may_wait = lessee.is_none()
        && spec.options.placement.is_none()
        && node.membership.get().is_some()
        && !node.config.infeasible_wait.is_zero()
        && !matches!(
            spec.options.strategy,
            SchedulingStrategy::NodeAffinity { .. }
        );
    if !may_wait {
        return match node.accept_actor(job, spec.clone(), lessee.clone()) {
            // Pinned to a node this one has not heard of yet: looked for
            // again with a fresh view before it fails.
            Err(Error::AffinityNodeNotAlive { .. }) if node.membership.get().is_some() => {
                if let Some(m) = node.membership.get() {
                    m.fresh_view().await;
                }
                node.accept_actor(job, spec, lessee)
            }
            placed => placed,
        };
    }
    let until = tokio::time::Instant::now() + node.config.infeasible_wait;
    let mut waiting = None;
    // A node that joins changes the view, which wakes this wait.
    let mut view_changes = node.membership.get().map(|m| m.room_changes());
    loop {
        if let Some(changes) = view_changes.as_mut() {
            changes.borrow_and_update();
        }
        match node.accept_actor(job, spec.clone(), None) {
            Err(Error::Infeasible { .. }) if tokio::time::Instant::now() < until => {
                if waiting.is_none() {
                    waiting = Some(node.awaiting.enter(spec.options.resources.clone()));
                    if let Some(m) = node.membership.get() {
                        m.nudge();
                    }
                }
                let changed = async {
                    let watched = match view_changes.as_mut() {
                        Some(changes) => changes.changed().await.is_ok(),
                        None => false,
                    };
                    if !watched {
                        // No view to watch: look again with each quick beat.
                        tokio::time::sleep(crate::membership::QUICK_BEAT).await;
                    }
                };
                let _ = tokio::time::timeout_at(until, changed).await;
            }
            placed => return placed,
        }
    }
}
