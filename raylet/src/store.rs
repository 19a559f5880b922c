//! The node's object store side: the shared segment the objects live in,
//! the object table (`prism_object_store::ObjectTable`) under its own lock,
//! so object traffic never waits on scheduling, and spilling: creating an
//! object (spilling others to disk to make room), pinning one for a reader
//! (reading it back from its spill file first), freeing objects and their
//! spill files, and the store's figures. It knows nothing of the node:
//! what it needs (the store's size, the spill settings, who owned what) is
//! passed in.

use crate::spill::SpillConfig;
use parking_lot::{Mutex, MutexGuard};
use prism_object_store::{Creator, ObjectTable, Pin, Placement, Segment, SpillFile, SpillOutcome};
use prism_protocol::error::Error;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{Ownership, StoreStats};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The node's object store: its segment, its table and its spill files.
#[derive(Debug)]
pub(crate) struct StoreSide {
    /// The shared memory the objects live in.
    pub(crate) segment: Segment,
    /// The objects, under the store's own lock.
    table: Mutex<ObjectTable>,
    /// Owners known to have exited, the latest [`GONE_OWNERS_KEPT`]: a
    /// result of theirs sealed after they left is freed at once.
    gone_owners: Mutex<GoneOwners>,
    /// How objects are spilled, and their spill files.
    pub(crate) spill_config: SpillConfig,
    /// Notified whenever a spill or a restore ends, or a client is gone.
    changed: tokio::sync::Notify,
    /// Whether a background spill pass runs.
    background_spill: AtomicBool,
    /// Time spent writing spill files and reading them back.
    spill_write_nanos: AtomicU64,
    restore_read_nanos: AtomicU64,
}

impl StoreSide {
    /// A store of `capacity` bytes over `segment`, spilling as
    /// `spill_config` says.
    pub(crate) fn new(segment: Segment, capacity: u64, spill_config: SpillConfig) -> StoreSide {
        StoreSide {
            segment,
            table: Mutex::new(ObjectTable::new(capacity)),
            gone_owners: Mutex::new(GoneOwners::default()),
            spill_config,
            changed: tokio::sync::Notify::new(),
            background_spill: AtomicBool::new(false),
            spill_write_nanos: AtomicU64::new(0),
            restore_read_nanos: AtomicU64::new(0),
        }
    }

    /// The object table, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ObjectTable> {
        self.table.lock()
    }

    /// Frees the task results whose owner `gone` says is gone (it exited,
    /// or its node died): no one can reach them through it any more.
    pub(crate) fn owner_gone(&self, gone: impl Fn(&str) -> bool) {
        let files = self.table.lock().owners_gone(gone);
        for file in files {
            self.spill_config.remove(file);
        }
        self.changed.notify_waiters();
    }

    /// A process that owned objects exited (here or on another node):
    /// frees what it owned here, and what of its is sealed later.
    pub(crate) fn owner_exited(&self, address: &str) {
        self.gone_owners.lock().add(address);
        self.owner_gone(|owner| owner == address);
    }

    /// Seals an object its creator finished writing; one whose owner has
    /// exited meanwhile is freed at once (no one can reach it any more).
    pub(crate) fn seal(&self, id: ObjectId, creator: Creator) -> Result<(), Error> {
        let orphan = {
            let mut store = self.table.lock();
            store.seal(id, creator)?;
            let gone = self.gone_owners.lock();
            match store.owner_of(id) {
                Some(owner) if gone.contains(owner) => {
                    tracing::debug!(object = %id, %owner, "sealed after its owner exited; freed");
                    Some(store.delete(id))
                }
                _ => None,
            }
        };
        if let Some(file) = orphan.flatten() {
            self.spill_config.remove(file);
        }
        if orphan.is_some() {
            self.changed.notify_waiters();
        }
        Ok(())
    }

    /// A client's connection closed: frees what it left unsealed (as
    /// `creator`) and, for a driver's or worker's process at `address`,
    /// what it owned, and releases the `pins` it held.
    pub(crate) fn client_gone(
        &self,
        creator: Creator,
        address: Option<&str>,
        pins: Vec<(ObjectId, u64)>,
    ) {
        let mut orphaned;
        {
            let mut store = self.table.lock();
            // After every request it sent: nothing it left unsealed can be
            // sealed any more, and what it owned has no owner.
            orphaned = store.creator_gone(creator);
            // A driver or worker exited: the task results it owned go too.
            // (A lessee's connection is not its process: those go with its
            // node.)
            if let Some(address) = address {
                self.gone_owners.lock().add(address);
                orphaned.extend(store.owners_gone(|owner| owner == address));
            }
            for (id, n) in pins {
                for _ in 0..n {
                    store.unpin(id);
                }
            }
        }
        for file in orphaned {
            self.spill_config.remove(file);
        }
        // Creates waiting for this process's copies can go on.
        self.changed.notify_waiters();
    }
}

/// Owners remembered as exited.
const GONE_OWNERS_KEPT: usize = 4096;

/// The latest owners that exited, oldest forgotten first.
#[derive(Debug, Default)]
struct GoneOwners {
    set: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

impl GoneOwners {
    fn add(&mut self, address: &str) {
        if self.set.insert(address.to_string()) {
            self.order.push_back(address.to_string());
        }
        while self.order.len() > GONE_OWNERS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    fn contains(&self, address: &str) -> bool {
        !self.set.is_empty() && self.set.contains(address)
    }
}

/// The most rounds of spilling (or waiting for other spills) one create or
/// restore makes before it reports the store full.
const SPILL_ROUNDS: usize = 64;

/// How long a create or restore that found nothing to spill waits for
/// spills and restores under way before it looks again.
const SPILL_WAIT: Duration = Duration::from_millis(200);

impl StoreSide {
    /// Reserves room for a new object, spilling others to disk as needed
    /// when the store is full. `ObjectStoreFull` only when nothing can be
    /// spilled (every other object is pinned by a reader or being written)
    /// or spilling is off. A copy of `id` already there that is in use
    /// (read, spilled or restored, or held by another creator that is
    /// still connected) is waited for, then replaced.
    pub(crate) async fn create_object(
        self: &Arc<Self>,
        id: ObjectId,
        size: u64,
        creator: Creator,
        owner: Option<&Ownership>,
    ) -> Result<Placement, Error> {
        let mut last = None;
        for _ in 0..SPILL_ROUNDS {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.try_create(id, size, creator, owner) {
                Ok(p) => return Ok(p),
                Err(e @ Error::ObjectStoreFull { .. }) => last = Some(e),
                // A copy left by an earlier attempt of the task that makes
                // `id` is in use (read, spilled, restored, or held by a
                // process whose exit is not seen yet): replaced once that
                // ends.
                Err(e) if self.table.lock().busy(id, creator) => {
                    last = Some(e);
                    let _ = tokio::time::timeout(SPILL_WAIT, changed).await;
                    continue;
                }
                Err(e) => return Err(e),
            }
            if !self.spill_config.enabled || !self.make_room(size).await {
                break;
            }
        }
        Err(last.unwrap_or(Error::ObjectNotFound { object_id: id }))
    }

    /// Pins an object for a reader, reading it back from its spill file
    /// first if it was spilled.
    pub(crate) async fn pin_object(self: &Arc<Self>, id: ObjectId) -> Result<Placement, Error> {
        for _ in 0..SPILL_ROUNDS {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let pinned = self.table.lock().pin(id)?;
            match pinned {
                Pin::Pinned(p) => return Ok(p),
                Pin::Restoring => {
                    let _ = tokio::time::timeout(SPILL_WAIT, changed).await;
                    continue;
                }
                Pin::OnDisk => {}
            }
            self.restore(id).await?;
        }
        Err(Error::RestoreFailed {
            object_id: id,
            attempts: SPILL_ROUNDS as u32,
        })
    }

    /// Reads a spilled object back into memory, spilling others to make
    /// room if needed.
    async fn restore(self: &Arc<Self>, id: ObjectId) -> Result<(), Error> {
        let begun = self.table.lock().begin_restore(id);
        let (at, file) = match begun {
            Ok(Some(begun)) => begun,
            Ok(None) => return Ok(()), // in memory, or someone restores it
            Err(e @ Error::ObjectStoreFull { .. }) => {
                if self.make_room(e_size(&e)).await {
                    return Ok(());
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let store = self.clone();
        let read = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let read = store.spill_config.read(&store.segment, file, at);
            let took = started.elapsed().as_nanos() as u64;
            store.restore_read_nanos.fetch_add(took, Ordering::Relaxed);
            read
        })
        .await
        .unwrap_or_else(|e| Err(Error::io("restore a spilled object", e)));
        if let Err(e) = &read {
            tracing::warn!(object = %id, error = %e, "could not restore a spilled object");
        }
        let remove_file = self.table.lock().restore_done(file, read.is_ok());
        if remove_file {
            self.spill_config.remove(file);
        }
        let read = match read {
            // No copy is left anywhere: the object is lost.
            Err(_) if !self.spill_config.exists(file) => {
                let cause = format!(
                    "it was spilled to disk and its spill file {} is gone",
                    self.spill_config.path(file).display()
                );
                Err(self.table.lock().lost(file, cause))
            }
            other => other,
        };
        self.changed.notify_waiters();
        read
    }

    /// Spills enough least recently used objects to free `size` bytes, or
    /// waits a little for spills under way. False if nothing was spilled
    /// and nothing is under way: no room can be made.
    async fn make_room(self: &Arc<Self>, size: u64) -> bool {
        let changed = self.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if self.spill(ObjectTable::footprint(size)).await > 0 {
            return true;
        }
        // Spills or restores by others may still free room.
        tokio::time::timeout(SPILL_WAIT, changed).await.is_ok()
    }

    /// Spills objects to free at least `need` bytes; returns the bytes
    /// freed.
    async fn spill(self: &Arc<Self>, need: u64) -> u64 {
        let picked = self.table.lock().pick_spills(need);
        if picked.is_empty() {
            return 0;
        }
        let store = self.clone();
        let written = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let written = picked
                .into_iter()
                .map(|(file, at)| (file, at, store.spill_config.write(&store.segment, file, at)))
                .collect::<Vec<_>>();
            store
                .spill_write_nanos
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            written
        })
        .await
        .unwrap_or_default();
        let mut freed = 0;
        let mut discard = Vec::new();
        {
            let mut store = self.table.lock();
            for (file, at, result) in written {
                if let Err(e) = &result {
                    tracing::warn!(object = %file.id, error = %e, "could not spill an object");
                }
                match store.spill_done(file, result.is_ok()) {
                    SpillOutcome::Spilled => freed += ObjectTable::footprint(at.size),
                    SpillOutcome::Discard => discard.push(file),
                }
            }
        }
        for file in discard {
            self.spill_config.remove(file);
        }
        self.changed.notify_waiters();
        freed
    }

    /// Reserves room for a new object now (no spilling), and starts a
    /// background spill pass if that took the store past the spilling
    /// threshold: one lock for both.
    pub(crate) fn try_create(
        self: &Arc<Self>,
        id: ObjectId,
        size: u64,
        creator: Creator,
        owner: Option<&Ownership>,
    ) -> Result<Placement, Error> {
        let spill = &self.spill_config;
        let (placement, past, orphans) = {
            let mut store = self.table.lock();
            let placement = store.create(id, size, creator)?;
            // (A copy pulled from another node, with no owner given, is
            // freed with its object.)
            match owner {
                Some(Ownership::Creator) => store.owned_by_creator(id),
                Some(Ownership::Caller(address)) => store.owned_by(id, address),
                None => {}
            }
            let orphans = store.take_orphan_files();
            (
                placement,
                spill.enabled && store.above(spill.threshold, 0),
                orphans,
            )
        };
        for file in orphans {
            spill.remove(file);
        }
        if past {
            self.spill_in_background();
        }
        Ok(placement)
    }

    /// Starts a spill pass in the background, bringing the store back
    /// under the spilling threshold (one pass at a time).
    fn spill_in_background(self: &Arc<Self>) {
        if self.background_spill.swap(true, Ordering::SeqCst) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let need = store.table.lock().excess_over(store.spill_config.threshold);
            store.spill(need).await;
            store.background_spill.store(false, Ordering::SeqCst);
        });
    }

    /// The store's figures, with the time its spill I/O took and the
    /// bytes `transfers` pulled from and served to other nodes.
    pub(crate) fn stats(&self, transfers: (u64, u64)) -> StoreStats {
        let mut stats = self.table.lock().stats();
        stats.spill_write_nanos = self.spill_write_nanos.load(Ordering::Relaxed);
        stats.restore_read_nanos = self.restore_read_nanos.load(Ordering::Relaxed);
        (stats.pulled_bytes_total, stats.served_bytes_total) = transfers;
        stats
    }

    /// Deletes objects, and the spill files of those on disk.
    pub(crate) fn delete_objects(&self, ids: Vec<ObjectId>) {
        let on_disk: Vec<SpillFile> = {
            let mut store = self.table.lock();
            ids.into_iter().filter_map(|id| store.delete(id)).collect()
        };
        for file in on_disk {
            self.spill_config.remove(file);
        }
    }
}

fn e_size(e: &Error) -> u64 {
    match e {
        Error::ObjectStoreFull { requested, .. } => *requested,
        _ => 0,
    }
}
