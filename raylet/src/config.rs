//! How a raylet is set up: [`RayletConfig`], what [`crate::Raylet::start`]
//! takes and every part of the node reads.
//!
//! It has no defaults of its own: every value comes from the one table of
//! tunables (`prism::Config`, whose `raylet_config` builds it), so that a
//! default is declared once, where `docs/config.md` reads it.

use crate::membership::ClusterLink;
use crate::memory::MemoryMonitorConfig;
use crate::spill::SpillConfig;
use prism_protocol::resources::ResourceSet;
use std::path::PathBuf;

/// How a raylet is set up.
#[derive(Debug, Clone)]
pub struct RayletConfig {
    /// Session directory: `logs/` and `sockets/` are made inside it.
    pub session_dir: PathBuf,
    /// The node's total resources.
    pub resources: ResourceSet,
    /// Object store capacity in bytes.
    pub object_store_bytes: u64,
    /// Workers started for each driver as soon as it registers.
    pub prestart_workers: usize,
    /// The most task workers one job may have at once (actors not counted).
    pub max_workers_per_job: usize,
    /// Idle workers beyond `prestart_workers` are stopped after this long.
    pub idle_worker_timeout: std::time::Duration,
    /// How long a local lease request that fits no live node waits for one
    /// that can hold it to join (0: it fails at once).
    pub infeasible_wait: std::time::Duration,
    /// How often idle workers are looked for.
    pub idle_worker_reap_period: std::time::Duration,
    /// Worker processes that may fail to start in a row before the
    /// requests waiting for one fail.
    pub worker_start_attempts: u32,
    /// Removed placement groups kept readable as `Removed`.
    pub removed_placement_groups_kept: usize,
    /// Ended tasks kept for listings; the oldest are dropped first.
    pub task_events_kept: usize,
    /// Bytes at the start of the store allocated in the background at
    /// start-up, so the first puts do not wait for fresh memory.
    pub object_store_warm_bytes: u64,
    /// Spilling objects to disk when the store fills.
    pub spill: SpillConfig,
    /// Stopping task workers before the node runs out of memory.
    pub memory_monitor: MemoryMonitorConfig,
    /// The cluster to join; `None` for a single-node cluster of its own.
    pub cluster: Option<ClusterLink>,
}
