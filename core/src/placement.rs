//! Placement groups: reserve bundles of resources together, then place
//! tasks and actors into them (Ray's `placement_group`).
//!
//! A group is created all at once or waits until the cluster can hold every
//! bundle; [`PlacementGroup::wait`] and [`PlacementGroup::ready`] say when.
//! Tasks and actors are placed with
//! [`TaskOptions::placement_group`](crate::TaskOptions::placement_group) and
//! [`ActorOptions::placement_group`](crate::ActorOptions::placement_group):
//! they then draw on their bundle's reservation instead of the node's free
//! resources. Removing a group stops what runs in it; a group also goes
//! when its driver exits.
//!
//! ```no_run
//! use prism::{Bundle, PlacementStrategy};
//! use std::time::Duration;
//!
//! #[prism::remote]
//! fn where_am_i() -> u32 {
//!     std::process::id()
//! }
//!
//! fn main() -> prism::Result<()> {
//!     prism::init(prism::Config::default().num_cpus(4))?;
//!     let bundles = vec![Bundle::new().num_cpus(1.0), Bundle::new().num_cpus(1.0)];
//!     let pg = prism::placement_group(bundles, PlacementStrategy::Pack)?;
//!     assert!(pg.wait(Duration::from_secs(10))?, "reserved");
//!     let opts = prism::TaskOptions::new().placement_group(&pg, Some(1));
//!     println!("ran in pid {}", prism::get(&where_am_i::remote_with(opts)?)?);
//!     prism::remove_placement_group(&pg)?;
//!     Ok(())
//! }
//! ```

use crate::api::raylet_request;
use crate::resources::Resources;
use crate::{Error, Result};
use prism_protocol::ids::PlacementGroupId;
pub use prism_protocol::messages::PlacementStrategy;
use prism_protocol::messages::{
    BundleRef, CreatePlacementGroup, GetPlacementGroup, PlacementGroupInfo, PlacementGroupSpec,
    PlacementGroupState, RemovePlacementGroup,
};
use prism_protocol::resources::ResourceSet;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One bundle of a placement group: resources reserved together on one
/// node. Start from [`Bundle::new`] (an empty bundle is refused).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bundle {
    resources: Resources,
}

impl Bundle {
    /// An empty bundle; add at least one resource.
    pub fn new() -> Self {
        Self::default()
    }

    crate::resources::resource_builders!(resources, "in this bundle");
}

/// A handle to a placement group. Cheap to clone; it can be passed to tasks
/// and actors (they may place work in it too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementGroup {
    id: PlacementGroupId,
    bundles: Vec<ResourceSet>,
    strategy: PlacementStrategy,
}

/// Reserves `bundles` with `strategy`. Returns at once; the group may still
/// be waiting for resources (see [`PlacementGroup::wait`]).
///
/// # Errors
///
/// `InvalidArgument` for no bundles, an empty bundle or a non-positive
/// amount; `Infeasible` when the cluster could never hold the group (one
/// node cannot meet `STRICT_SPREAD` with several bundles; in a cluster,
/// every live node's totals are checked). In a multi-node cluster the
/// bundles are placed over the nodes by `strategy` and reserved on all of
/// them at once, or the group waits.
pub fn placement_group(
    bundles: Vec<Bundle>,
    strategy: PlacementStrategy,
) -> Result<PlacementGroup> {
    let shapes = bundles
        .iter()
        .map(|b| b.resources.to_set(0.0))
        .collect::<Result<Vec<_>>>()?;
    let spec = PlacementGroupSpec {
        id: PlacementGroupId::new(),
        name: None,
        bundles: shapes.clone(),
        strategy,
    };
    let id = spec.id;
    raylet_request(CreatePlacementGroup { spec })?;
    Ok(PlacementGroup {
        id,
        bundles: shapes,
        strategy,
    })
}

/// Removes a group: its resources go back, and the tasks and actors
/// running in it are stopped. Removing it twice is not an error.
pub fn remove_placement_group(group: &PlacementGroup) -> Result<()> {
    raylet_request(RemovePlacementGroup { id: group.id })
}

impl PlacementGroup {
    /// The group's id.
    pub fn id(&self) -> PlacementGroupId {
        self.id
    }

    /// The bundles, in index order.
    pub fn bundle_specs(&self) -> &[ResourceSet] {
        &self.bundles
    }

    /// How many bundles the group has.
    pub fn bundle_count(&self) -> usize {
        self.bundles.len()
    }

    /// The strategy it was created with.
    pub fn strategy(&self) -> PlacementStrategy {
        self.strategy
    }

    /// Waits up to `timeout` for every bundle to be reserved: `true` once
    /// created, `false` if still pending after `timeout`.
    ///
    /// # Errors
    ///
    /// `PlacementGroupRemoved` if the group was removed.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        // The raylet answers at the deadline if the group is still pending.
        let wait_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX - 1);
        self.created(raylet_request(GetPlacementGroup {
            id: self.id,
            wait_ms: Some(wait_ms.min(u64::MAX - 1)),
        })?)
    }

    /// Blocks until the group is created.
    ///
    /// # Errors
    ///
    /// `PlacementGroupRemoved` if it was removed first.
    pub fn ready(&self) -> Result<()> {
        let info = raylet_request(GetPlacementGroup {
            id: self.id,
            wait_ms: Some(u64::MAX),
        })?;
        self.created(info).map(|_| ())
    }

    /// The group's state now, and the GPU devices of each bundle.
    pub fn state(&self) -> Result<(PlacementGroupState, Vec<Vec<u32>>)> {
        let info = raylet_request(GetPlacementGroup {
            id: self.id,
            wait_ms: None,
        })?;
        Ok((info.state, info.bundle_gpus))
    }

    /// The node id of each bundle, in index order, once the group is
    /// created in a multi-node cluster (Ray's `bundles_to_node_id`); empty
    /// on a single node, where every bundle is on the one node, and while
    /// the group is pending.
    pub fn bundle_nodes(&self) -> Result<Vec<String>> {
        let info = raylet_request(GetPlacementGroup {
            id: self.id,
            wait_ms: None,
        })?;
        Ok(info.bundle_nodes)
    }

    fn created(&self, info: PlacementGroupInfo) -> Result<bool> {
        match info.state {
            PlacementGroupState::Created => Ok(true),
            PlacementGroupState::Pending => Ok(false),
            PlacementGroupState::Removed => Err(Error::PlacementGroupRemoved {
                id: self.id.to_string(),
            }),
        }
    }

    /// The wire form of "bundle `index` of this group" (`None`: any).
    pub(crate) fn bundle_ref(&self, index: Option<usize>) -> Result<BundleRef> {
        if let Some(i) = index {
            if i >= self.bundles.len() {
                return Err(Error::invalid(
                    "placement_group_bundle_index",
                    format!("{i}: the group has {} bundles", self.bundles.len()),
                ));
            }
        }
        Ok(BundleRef {
            group: self.id,
            index: index.map(|i| i as u32),
        })
    }
}
