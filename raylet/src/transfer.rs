//! Objects between nodes: a raylet pulls a copy of an object held by
//! another node's store into its own, and serves the objects of its store
//! to the raylets that pull them.
//!
//! A pull reserves the object's room in the local store, then reads its
//! bytes in chunks over a few bulk streams to the holder's raylet at once
//! (`prism_protocol::transfer`), straight from the socket into the shared
//! segment: a transfer holds no buffer of its own, so the memory it uses
//! is the object's room and nothing more. Once every chunk is in, the
//! copy is sealed and read like a local object. Concurrent pulls of one
//! object wait for the same transfer.
//!
//! The holder remembers which nodes pulled a copy; when the object is
//! deleted (its owner freed it), so are the copies.
//!
//! [`Transfers`] is a component of the node: built with the node's store,
//! its id and its place in the cluster (the membership, set once the node
//! joins), and nothing else of the node. What it decides (one transfer
//! per object, the chunks, when to try again, who holds copies) is the
//! plain logic of `transfer/pulls.rs`, unit-tested alone.

pub(crate) mod pulls;
pub(crate) mod state;

pub(crate) use state::Transfers;

use crate::reply::ReplyTo;
use prism_object_store::{Creator, Placement};
use prism_protocol::error::Error;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{DeleteObjects, Ownership, Response};
use prism_protocol::rpc::{self, Endpoint};
use prism_protocol::tls::Stream;
use prism_protocol::transfer::{self, ChunkRequest};
use pulls::{after_failure, AfterFailure, ChunkPlan, Joined};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Idle bulk streams kept open per holder.
const IDLE_STREAMS_KEPT: usize = 8;
/// The longest a stream may take to open, or to bring one chunk: a holder
/// cut off from the network sends no reset, and its pull must not hang.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(30);

impl Transfers {
    /// Copies object `id` (`size` bytes) from node `holder`'s store into
    /// this one and answers `reply` once it is sealed here. The copy is
    /// freed when `owner` exits, as the object is.
    pub(crate) fn pull_object(
        self: &Arc<Self>,
        id: ObjectId,
        holder: String,
        size: u64,
        owner: String,
        reply: ReplyTo,
    ) {
        if holder == self.node_id.to_string() || self.store.lock().has(id) {
            return reply.send(Response::Ok);
        }
        if self.book.lock().join(id, reply) == Joined::Waits {
            return;
        }
        let node = self.clone();
        tokio::spawn(async move {
            let pulled = node.pull(id, &holder, size, owner).await;
            if let Err(e) = &pulled {
                tracing::warn!(object = %id, %holder, error = %e, "could not pull an object");
            }
            let waiting = node.book.lock().finish(id);
            for reply in waiting {
                reply.send(Response::from_result(pulled.clone()));
            }
        });
    }

    async fn pull(
        self: &Arc<Self>,
        id: ObjectId,
        holder: &str,
        size: u64,
        owner: String,
    ) -> Result<(), Error> {
        let lost = |cause: String| Error::ObjectLost {
            object_id: id,
            cause,
        };
        let membership = self.membership.get().ok_or_else(|| {
            lost(format!(
                "it is held by node {holder}, and this node is not part of a cluster"
            ))
        })?;
        let address_of_holder = || {
            membership
                .raylet_of(holder)
                .and_then(|raylet| Endpoint::parse(&raylet).tcp)
                .ok_or_else(|| {
                    lost(format!(
                        "node {holder}, whose store held it, is not alive in the cluster"
                    ))
                })
        };
        let mut address = address_of_holder()?;
        let at = self
            .store
            .create_object(id, size, Creator::NODE, Some(&Ownership::Caller(owner)))
            .await?;
        let mut attempt = 1;
        let copied = loop {
            let Err(e) = self.copy_chunks(id, &address, at).await else {
                break Ok(());
            };
            match after_failure(attempt, &e) {
                AfterFailure::GiveUp => break Err(e),
                AfterFailure::Again(next) => {
                    tracing::warn!(object = %id, %holder, attempt, error = %e, "a pull broke off; trying again");
                    attempt = next;
                    match address_of_holder() {
                        Ok(a) => address = a,
                        Err(gone) => break Err(gone),
                    }
                }
            }
        };
        match copied {
            Ok(()) => {
                self.store.seal(id, Creator::NODE)?;
                self.pulled_bytes.fetch_add(size, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.store.lock().delete(id);
                Err(match e {
                    e @ Error::ObjectLost { .. } => e,
                    other => lost(format!(
                        "its copy could not be read from node {holder} ({address}), \
                         {attempt} attempt(s): {other}"
                    )),
                })
            }
        }
    }

    /// Reads every chunk of object `id` from the raylet at `address` into
    /// its room `at`, over up to [`pulls::STREAMS_PER_PULL`] streams at
    /// once.
    async fn copy_chunks(
        self: &Arc<Self>,
        id: ObjectId,
        address: &str,
        at: Placement,
    ) -> Result<(), Error> {
        let plan = ChunkPlan::of(at.size);
        let chunks = plan.chunks;
        let next = Arc::new(AtomicU64::new(0));
        let mut streams = tokio::task::JoinSet::new();
        for _ in 0..plan.streams {
            let (node, next, address) = (self.clone(), next.clone(), address.to_string());
            streams.spawn(async move {
                let timed_out = || {
                    Error::io(
                        format!("pull from {address}"),
                        format!("no progress in {} s", CHUNK_TIMEOUT.as_secs()),
                    )
                };
                let mut stream = tokio::time::timeout(CHUNK_TIMEOUT, node.bulk_stream(&address))
                    .await
                    .map_err(|_| timed_out())??;
                loop {
                    let chunk = next.fetch_add(1, Ordering::Relaxed);
                    let Some((offset, len)) = plan.range(chunk) else {
                        break;
                    };
                    let read = node.read_chunk(&mut stream, id, at, offset, len);
                    tokio::time::timeout(CHUNK_TIMEOUT, read)
                        .await
                        .map_err(|_| timed_out())??;
                }
                node.keep_stream(address, stream);
                Ok::<(), Error>(())
            });
        }
        let mut outcome = Ok(());
        while let Some(done) = streams.join_next().await {
            let done = done.unwrap_or_else(|e| Err(Error::io("pull an object", e.to_string())));
            if let Err(e) = done {
                if outcome.is_ok() {
                    outcome = Err(e);
                    // The others stop at their next chunk.
                    next.store(chunks, Ordering::Relaxed);
                }
            }
        }
        outcome
    }

    /// Asks for one range and reads it into the object's room.
    async fn read_chunk(
        &self,
        stream: &mut Stream,
        id: ObjectId,
        at: Placement,
        offset: u64,
        len: u64,
    ) -> Result<(), Error> {
        let io = |e: std::io::Error| Error::io("read an object's chunk from its holder", e);
        ChunkRequest {
            id,
            offset,
            len,
            puller: if offset == 0 {
                self.node_id.to_string()
            } else {
                String::new()
            },
        }
        .write(stream)
        .await
        .map_err(io)?;
        match transfer::verdict(stream).await {
            Ok(()) => {}
            Err(Ok(why)) => {
                return Err(Error::ObjectLost {
                    object_id: id,
                    cause: format!("its holder could not serve it: {why}"),
                })
            }
            Err(Err(e)) => return Err(io(e)),
        }
        let dst = {
            let ptr = self.store.segment.ptr(at.offset + offset, len)?;
            self.store.segment.prefault(at.offset + offset, len);
            // SAFETY: the range lies in the segment (checked by `ptr`) and
            // belongs to an object created here and not sealed yet, which
            // no other process reads or writes; each chunk is written by
            // one stream only.
            unsafe { std::slice::from_raw_parts_mut(ptr, len as usize) }
        };
        stream.read_exact(dst).await.map_err(io)?;
        Ok(())
    }

    /// An idle bulk stream to `address`, or a new one.
    async fn bulk_stream(&self, address: &str) -> Result<Stream, Error> {
        let idle = self
            .idle
            .lock()
            .get_mut(address)
            .and_then(|streams| streams.pop());
        match idle {
            Some(stream) => Ok(stream),
            None => rpc::connect_bulk(address).await,
        }
    }

    fn keep_stream(&self, address: String, stream: Stream) {
        let mut idle = self.idle.lock();
        let streams = idle.entry(address).or_default();
        if streams.len() < IDLE_STREAMS_KEPT {
            streams.push(stream);
        }
    }

    /// Serves another node's bulk stream: each requested range of a sealed
    /// object, written from the segment to the socket while the object is
    /// pinned.
    pub(crate) fn serve_bulk(self: &Arc<Self>, mut stream: Stream) {
        let node = self.clone();
        tokio::spawn(async move {
            loop {
                let request = match ChunkRequest::read(&mut stream).await {
                    Ok(Some(request)) => request,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, "a bulk stream ended");
                        return;
                    }
                };
                if let Err(e) = node.serve_chunk(&mut stream, &request).await {
                    tracing::debug!(object = %request.id, error = %e, "a bulk stream ended");
                    return;
                }
            }
        });
    }

    async fn serve_chunk(
        self: &Arc<Self>,
        stream: &mut Stream,
        request: &ChunkRequest,
    ) -> std::io::Result<()> {
        let id = request.id;
        if let Some(e) = crate::faults::injected("chunk_transfer") {
            // As a broken connection: the stream ends mid-request.
            return Err(std::io::Error::other(e.to_string()));
        }
        let at = match self.store.pin_object(id).await {
            Ok(at) => at,
            Err(e) => return transfer::refuse(stream, &e.to_string()).await,
        };
        let in_range = request
            .offset
            .checked_add(request.len)
            .is_some_and(|end| end <= at.size);
        let range = match in_range {
            true => self
                .store
                .segment
                .ptr(at.offset + request.offset, request.len)
                // SAFETY: in the segment (checked by `ptr`), inside a
                // sealed object that stays pinned until the write ends.
                .map(|ptr| unsafe { std::slice::from_raw_parts(ptr, request.len as usize) }),
            false => Err(Error::invalid(
                "range",
                format!(
                    "{}+{} lies outside object {id} of {} bytes",
                    request.offset, request.len, at.size
                ),
            )),
        };
        let written = match range {
            Ok(bytes) => match transfer::accept(stream).await {
                Ok(()) => match stream.write_all(bytes).await {
                    // Over TLS the last bytes wait in its buffer until
                    // flushed; on plain TCP this does nothing.
                    Ok(()) => stream.flush().await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
            Err(e) => transfer::refuse(stream, &e.to_string()).await,
        };
        self.store.lock().unpin(id);
        if written.is_ok() && !request.puller.is_empty() {
            self.book.lock().copied(id, request.puller.clone());
        }
        if written.is_ok() {
            self.served_bytes.fetch_add(request.len, Ordering::Relaxed);
        }
        written
    }

    /// Deletes objects held by node `holder` (this one, or another whose
    /// raylet is told), and the copies other nodes pulled of those held
    /// here.
    pub(crate) fn free_objects(self: &Arc<Self>, ids: Vec<ObjectId>, holder: Option<String>) {
        let here = self.node_id.to_string();
        match holder.filter(|h| *h != here) {
            Some(other) => self.tell_node(other, ids),
            None => {
                let copies = self.take_copies(&ids);
                self.store.delete_objects(ids);
                for (node, ids) in copies {
                    self.tell_node(node, ids);
                }
            }
        }
    }

    /// Sends `DeleteObjects` for `ids` to node `node`'s raylet.
    fn tell_node(self: &Arc<Self>, node: String, ids: Vec<ObjectId>) {
        let Some(membership) = self.membership.get() else {
            return;
        };
        let asking = membership.raylet_conn(&node);
        tokio::spawn(async move {
            match asking.await {
                Ok(conn) => {
                    let _ = conn.notify(DeleteObjects { ids, node: None });
                }
                Err(e) => {
                    tracing::debug!(%node, error = %e, "could not tell a node to free objects")
                }
            }
        });
    }
}
