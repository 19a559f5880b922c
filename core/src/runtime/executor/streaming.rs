//! A streaming call's values, sent from the thread running the call: each
//! is stored and sent to the caller as it is made ([`Executor::send_item`]),
//! and the caller's answers are settled before the call answers. The
//! executor is the running call's [`ItemSender`] (see `streams.rs`).

use super::{store_copy, Executor};
use crate::codec;
use crate::runtime::block_on;
use crate::runtime::objects::Objects;
use crate::runtime::refs::Release;
use crate::runtime::streams::{ItemAck, ItemSender};
use crate::{Error, Result};
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{Address, Response, StreamItem};
use std::sync::Arc;

impl Executor {
    /// Stores value `index` of the streaming call `generator` and sends it
    /// to the caller, `owner`; returns once it is sent, with the caller's
    /// answer to wait for ([`settle_items`](Self::settle_items)). Called
    /// from the thread running the call.
    pub(crate) fn send_item(
        self: &Arc<Self>,
        generator: ObjectId,
        index: u64,
        owner: &Address,
        encoded: codec::Encoded,
    ) -> Result<ItemAck> {
        let exec = self.clone();
        let owner = owner.clone();
        block_on(&self.rt, async move {
            // As for a call's result (`finish_call`): references from the
            // arguments are known to their owners before the caller may
            // let go of them.
            exec.objects.register_borrows().await?;
            let id = ObjectId::new();
            let (item, keep_alive) = exec.store_return(id, encoded, &owner).await?;
            let copy = store_copy(id, &item.value);
            let sent = async {
                exec.objects.lend(&item.contained, &owner).await?;
                drop(keep_alive);
                let item = StreamItem {
                    generator,
                    index,
                    id,
                    item,
                };
                exec.objects.send_stream_item(&owner, item).await
            }
            .await;
            match sent {
                Ok(answer) => Ok(ItemAck { answer, copy }),
                // This process is the caller and the stream is closed: it
                // freed the value already.
                Err(e @ Error::TaskCancelled { .. }) => Err(e),
                Err(e) => {
                    // The caller never took it: its copy goes.
                    exec.objects.apply_releases(copy.into_iter().collect());
                    Err(e)
                }
            }
        })
    }

    /// Waits for the caller's answers to sent values of a streaming call,
    /// oldest first; the first failure, once all answered. A value the
    /// caller did not take in loses its copy here, unless the caller
    /// answered that the stream is closed (it freed the value itself).
    pub(crate) fn settle_items(self: &Arc<Self>, acks: Vec<ItemAck>) -> Result<()> {
        if acks.iter().all(|a| a.answer.is_none()) {
            return Ok(());
        }
        let objects = self.objects.clone();
        block_on(&self.rt, async move {
            let mut failed = None;
            for ack in acks {
                let Some(answer) = ack.answer else {
                    continue;
                };
                let answered = answer.await.ok();
                if let Err(e) = item_answered(&objects, ack.copy, answered) {
                    failed.get_or_insert(e);
                }
            }
            failed.map_or(Ok(()), Err)
        })
    }

    /// The first of `acks` already answered, without waiting: `None` when
    /// the oldest is not answered yet, else its outcome (the ack is taken
    /// off the front).
    pub(crate) fn settle_answered(
        &self,
        acks: &mut std::collections::VecDeque<ItemAck>,
    ) -> Option<Result<()>> {
        let front = acks.front_mut()?;
        let answered = match &mut front.answer {
            None => None,
            Some(answer) => match answer.try_recv() {
                Ok(response) => Some(response),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return None,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => None,
            },
        };
        let ack = acks.pop_front()?;
        if ack.answer.is_none() {
            return Some(Ok(()));
        }
        Some(item_answered(&self.objects, ack.copy, answered))
    }
}

/// Records the caller's answer to a sent stream value (`None`: the
/// connection went before it answered). A value the caller did not take
/// in loses its copy, unless the caller answered that the stream is
/// closed: then it freed the value itself.
fn item_answered(
    objects: &Arc<Objects>,
    copy: Option<Release>,
    answered: Option<Response>,
) -> Result<()> {
    let error = match answered {
        Some(Response::Ok) => return Ok(()),
        Some(Response::Error(e @ Error::TaskCancelled { .. })) => return Err(e),
        Some(Response::Error(e)) => e,
        Some(other) => Error::UnexpectedReply {
            request: "StreamItem".into(),
            reply: format!("{other:?}"),
        },
        None => Error::Disconnected {
            peer: "the caller of a streaming call".into(),
        },
    };
    objects.apply_releases(copy.into_iter().collect());
    Err(error)
}

impl ItemSender for Arc<Executor> {
    fn send_item(
        &self,
        generator: ObjectId,
        index: u64,
        owner: &Address,
        encoded: codec::Encoded,
    ) -> Result<ItemAck> {
        Executor::send_item(self, generator, index, owner, encoded)
    }

    fn settle_items(&self, acks: Vec<ItemAck>) -> Result<()> {
        Executor::settle_items(self, acks)
    }

    fn settle_answered(
        &self,
        acks: &mut std::collections::VecDeque<ItemAck>,
    ) -> Option<Result<()>> {
        Executor::settle_answered(self, acks)
    }
}
