//! Actor names in a cluster ([`Names`]): a named actor taken here claims
//! its name in the head's directory (replacing a holder that is dead), and
//! a name this node does not hold is looked up there and asked of the node
//! holding it. A component of the node, built with its id and its place in
//! the cluster; it reads the node's own actors through [`LocalActors`].

use crate::membership::Membership;
use prism_gcs::NameHolder;
use prism_protocol::error::{ActorDeath, Error};
use prism_protocol::ids::{ActorId, NodeId};
use prism_protocol::messages::{ActorInfo, ActorState, GetActor, GetNamedActor};
use std::sync::{Arc, OnceLock};

/// The actors of this node, as the names component reads them.
pub(crate) trait LocalActors: Send + Sync {
    /// An actor this node holds, in its current state.
    fn actor_info(&self, actor: ActorId) -> Option<ActorInfo>;
}

/// The node's part in the cluster's directory of actor names.
#[derive(Debug)]
pub(crate) struct Names {
    node_id: NodeId,
    membership: Arc<OnceLock<Membership>>,
}

impl Names {
    /// The names of node `node_id`, in the cluster `membership` holds
    /// once the node joins one.
    pub(crate) fn new(node_id: NodeId, membership: Arc<OnceLock<Membership>>) -> Self {
        Names {
            node_id,
            membership,
        }
    }

    /// Claims `name` in `namespace` for actor `actor_id` of this node in
    /// the head's directory. A holder whose node is dead, or that its node
    /// no longer holds alive, is replaced; a live one makes this
    /// `ActorNameTaken`.
    pub(crate) async fn claim(
        &self,
        namespace: &str,
        name: &str,
        actor_id: ActorId,
        local: &dyn LocalActors,
    ) -> Result<(), Error> {
        let m = self.membership.get().ok_or(Error::NotRegistered)?;
        let mut gcs = m.gcs();
        let (actor, here) = (actor_id.to_string(), self.node_id.to_string());
        let mut replace: Option<String> = None;
        for _ in 0..3 {
            let reply = gcs
                .register_actor_name(namespace, name, &actor, &here, replace.as_deref())
                .await
                .map_err(Error::from)?;
            if reply.registered {
                return Ok(());
            }
            let holder = ActorId::parse(&reply.holder_actor_id);
            let alive = match holder {
                Some(holder) => self.alive_on(&reply.holder_node_id, holder, local).await,
                None => false,
            };
            if alive {
                break;
            }
            replace = Some(reply.holder_actor_id);
        }
        Err(Error::ActorNameTaken {
            name: name.to_string(),
            namespace: namespace.to_string(),
        })
    }

    /// Whether node `node`'s raylet holds `actor` and it is not dead (an
    /// unreachable node counts as holding it).
    async fn alive_on(&self, node: &str, actor: ActorId, local: &dyn LocalActors) -> bool {
        let alive = |info: &ActorInfo| !matches!(info.state, ActorState::Dead(_));
        if node == self.node_id.to_string() {
            let now = local.actor_info(actor);
            return now.as_ref().is_some_and(alive);
        }
        let Some(m) = self.membership.get() else {
            return false;
        };
        let conn = match m.raylet_conn(node).await {
            Ok(conn) => conn,
            Err(_) => return true,
        };
        match conn
            .request(GetActor {
                actor_id: actor,
                wait: false,
                node_id: None,
            })
            .await
        {
            Ok(info) => alive(&info),
            Err(Error::Disconnected { .. }) => true,
            Err(_) => false,
        }
    }

    /// A named actor held by another node, found through the head's
    /// directory: `None` when no live actor holds the name.
    pub(crate) async fn find(&self, request: GetNamedActor) -> Result<Option<ActorInfo>, Error> {
        let m = self.membership.get().ok_or(Error::NotRegistered)?;
        let holder = m
            .gcs()
            .lookup_actor_name(&request.namespace, &request.name)
            .await
            .map_err(Error::from)?;
        let node = match holder {
            NameHolder::Alive { node_id, .. } if node_id != self.node_id.to_string() => node_id,
            NameHolder::NodeDied {
                actor_id,
                node_id,
                died_at_ms,
                cause,
            } => {
                let Some(actor_id) = ActorId::parse(&actor_id) else {
                    return Ok(None);
                };
                return Err(Error::NamedActorDied {
                    name: request.name,
                    namespace: request.namespace,
                    death: Box::new(ActorDeath {
                        actor_id,
                        node: node_id,
                        died_at_ms,
                        cause: format!(
                            "its node died ({cause}); an actor with restarts left is created \
                             again on another node by its owner (by the head, for a detached \
                             actor), and found by its name once it is"
                        ),
                    }),
                });
            }
            _ => return Ok(None),
        };
        match m.raylet_conn(&node).await?.request(request).await {
            Ok(info) => Ok(Some(info)),
            // The holder died there: that node says when and why.
            Err(e @ Error::NamedActorDied { .. }) => Err(e),
            Err(_) => Ok(None),
        }
    }
}
