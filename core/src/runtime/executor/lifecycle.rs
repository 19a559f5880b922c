//! The hosted actor's checkpoints and its own exit: saving its state to
//! the node's key-value table when a checkpoint is due, and ending itself
//! (`prism::exit_actor`) once the running method returns, after telling
//! the node.

use super::state::{Checkpoints, EXITING, EXIT_ASKED, RUNNING};
use super::Executor;
use crate::runtime::block_on;
use crate::runtime::registry::{ActorCell, ActorClass};
use crate::{Error, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use prism_protocol::ids::ActorId;
use prism_protocol::messages::{Call, ExitActor, KvPut, Response, TaskSpec};
use prism_protocol::rpc::Connection;
use std::sync::atomic::Ordering;

impl Executor {
    /// The hosted actor's method asks for its state to be saved once it
    /// returns.
    pub(crate) fn request_checkpoint(&self) -> Result<()> {
        let actor = self.actor.lock();
        match actor.as_ref() {
            None => Err(Error::invalid(
                "checkpoint_actor",
                "called outside an actor's method; only an actor can checkpoint itself",
            )),
            Some(a) if a.checkpoints.is_none() => Err(Error::invalid(
                "checkpoint_actor",
                format!(
                    "actor {} was not created with checkpoints: give it \
                     ActorOptions::checkpoint_every or checkpoint_interval",
                    a.class.name
                ),
            )),
            Some(_) => {
                self.checkpoint_asked.store(true, Ordering::SeqCst);
                Ok(())
            }
        }
    }

    /// After a call of a checkpointed actor, on its executor thread: saves
    /// its state to the node's key-value table when one is due. The call's
    /// caller hears back only after that, so a call that answered before a
    /// checkpoint is in it.
    pub(super) fn checkpoint_if_due(
        &self,
        class: &ActorClass,
        cell: &ActorCell,
        policy: &Mutex<Checkpoints>,
    ) {
        let key = {
            let mut p = policy.lock();
            p.calls += 1;
            let asked = self.checkpoint_asked.swap(false, Ordering::SeqCst);
            let by_count = p.every > 0 && p.calls >= p.every;
            let by_time = p.interval.is_some_and(|i| p.last.elapsed() >= i);
            if !(asked || by_count || by_time) {
                return;
            }
            p.calls = 0;
            p.last = std::time::Instant::now();
            p.key.clone()
        };
        let encoded = {
            let state = cell.blocking_read();
            (class.snapshot)(&**state)
        };
        let bytes = match encoded {
            Some(Ok(bytes)) => bytes,
            Some(Err(e)) => return tracing::warn!(error = %e, "checkpoint not taken"),
            None => return,
        };
        let saved = self.raylet_blocking(KvPut {
            key,
            value: Bytes::from(bytes),
            overwrite: true,
        });
        if let Err(e) = saved {
            tracing::warn!(error = %e, "checkpoint not saved");
        }
    }

    /// Sends `request` to the raylet from a thread that runs synchronous
    /// methods, and waits for the answer (at most 10 s).
    fn raylet_blocking<C>(&self, request: C) -> Result<C::Reply>
    where
        C: Call + Send + 'static,
        C::Reply: Send + 'static,
    {
        let raylet = self.raylet.clone();
        block_on(&self.rt, async move {
            let limit = std::time::Duration::from_secs(10);
            match tokio::time::timeout(limit, raylet.request(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(Error::io(
                    format!("{} to the raylet", C::NAME),
                    "no answer within 10 s",
                )),
            }
        })
    }

    /// The hosted actor asked to end once the running method returns.
    pub(crate) fn request_exit(&self) -> Result<()> {
        if self.actor.lock().is_none() {
            return Err(Error::invalid(
                "exit_actor",
                "called outside an actor's method; only an actor can end itself \
                 (to stop one from outside, use prism::kill)",
            ));
        }
        let _ = self
            .exit
            .compare_exchange(RUNNING, EXIT_ASKED, Ordering::SeqCst, Ordering::SeqCst);
        Ok(())
    }

    /// The error a call gets when it was queued behind `exit_actor`.
    pub(super) fn exited_error(
        &self,
        actor_id: ActorId,
        class: &ActorClass,
        spec: &TaskSpec,
    ) -> Option<Response> {
        if self.exit.load(Ordering::SeqCst) == RUNNING {
            return None;
        }
        Some(Response::Error(Error::ActorDied {
            actor_id,
            class: class.name.to_string(),
            reason: format!(
                "it ended itself with prism::exit_actor before {} ran",
                spec.function
            ),
        }))
    }

    /// If the method that just returned called `exit_actor`: tells the
    /// node the actor is gone for good, before its caller hears the answer
    /// (so whoever looks it up next finds it dead, its name free). Blocks;
    /// for the threads that run synchronous methods.
    pub(super) fn announce_exit_blocking(&self) -> bool {
        let Some(actor_id) = self.begin_exit() else {
            return false;
        };
        if let Err(e) = self.raylet_blocking(ExitActor { actor_id }) {
            tracing::warn!(error = %e, "could not tell the node the actor exited");
        }
        true
    }

    /// [`Executor::announce_exit_blocking`] for async methods.
    pub(super) async fn announce_exit(&self) -> bool {
        let Some(actor_id) = self.begin_exit() else {
            return false;
        };
        if let Err(e) = self.raylet.request(ExitActor { actor_id }).await {
            tracing::warn!(error = %e, "could not tell the node the actor exited");
        }
        true
    }

    /// The hosted actor, if it asked to exit and nobody started exiting.
    fn begin_exit(&self) -> Option<ActorId> {
        if self.exit.load(Ordering::SeqCst) != EXIT_ASKED {
            return None;
        }
        self.exit
            .compare_exchange(EXIT_ASKED, EXITING, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        self.actor_id()
    }

    /// After the exiting call's answer was queued on `conn`: gives it a
    /// bounded time to leave, then ends the process.
    pub(super) fn exit_after_answer(&self, conn: &Connection) {
        let conn = conn.clone();
        self.rt.spawn(async move {
            for _ in 0..2000 {
                if conn.unsent_frames() == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            tracing::info!("the actor ended itself with prism::exit_actor");
            std::process::exit(0);
        });
    }
}
