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
    BundleRef, CreatePlacementGroup, GetPlacementGroup, ListPlacementGroups, PlacementGroupInfo,
    PlacementGroupSpec, PlacementGroupState, RemovePlacementGroup,
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
    /// Its name, for a group made by [`named_placement_group`].
    #[serde(default)]
    name: Option<String>,
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
    let (spec, group) = group_spec(None, bundles, strategy)?;
    raylet_request(CreatePlacementGroup { spec })?;
    Ok(group)
}

/// The request for a new group, and its handle.
fn group_spec(
    name: Option<String>,
    bundles: Vec<Bundle>,
    strategy: PlacementStrategy,
) -> Result<(PlacementGroupSpec, PlacementGroup)> {
    let shapes = bundles
        .iter()
        .map(|b| b.resources.to_set(0.0))
        .collect::<Result<Vec<_>>>()?;
    let spec = PlacementGroupSpec {
        id: PlacementGroupId::new(),
        name: name.clone(),
        bundles: shapes.clone(),
        strategy,
    };
    let group = PlacementGroup {
        id: spec.id,
        name,
        bundles: shapes,
        strategy,
    };
    Ok((spec, group))
}

/// The key-value table key under which the group named `name` is found.
fn name_key(name: &str) -> String {
    format!("{NAME_PREFIX}{name}")
}

/// Where named groups are recorded in the cluster's key-value table.
const NAME_PREFIX: &str = "prism/placement-group-name/";

/// [`placement_group`] with a name, unique in the cluster, by which
/// [`get_placement_group`] finds it from any driver or worker (Ray's
/// `placement_group(..., name=)`), and under which
/// [`list_placement_groups`] lists it. The name is free again once the
/// group is removed.
///
/// ```
/// use prism::{Bundle, PlacementStrategy};
/// # fn main() -> prism::Result<()> {
/// prism::init(prism::Config::default().num_cpus(2))?;
/// let pg = prism::named_placement_group(
///     "trainers",
///     vec![Bundle::new().num_cpus(1.0)],
///     PlacementStrategy::Pack,
/// )?;
/// assert_eq!(prism::get_placement_group("trainers")?.id(), pg.id());
/// assert!(prism::named_placement_group("trainers", vec![Bundle::new().num_cpus(1.0)], PlacementStrategy::Pack).is_err());
/// prism::remove_placement_group(&pg)?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// As [`placement_group`]; `InvalidArgument` for an empty name or one a
/// group that is not removed holds.
pub fn named_placement_group(
    name: &str,
    bundles: Vec<Bundle>,
    strategy: PlacementStrategy,
) -> Result<PlacementGroup> {
    if name.is_empty() {
        return Err(Error::invalid("placement group name", "must not be empty"));
    }
    let (spec, group) = group_spec(Some(name.to_string()), bundles, strategy)?;
    let record =
        rmp_serde::to_vec(&group).map_err(|e| Error::invalid("placement group", e.to_string()))?;
    let key = name_key(name);
    if !crate::kv::put_if_absent(&key, &record)? {
        // Taken, unless by a group removed since.
        if let Some(holder) = find_named(name)? {
            return Err(Error::invalid(
                "placement group name",
                format!(
                    "{name:?} is held by group {}; remove it first, or get it with \
                     prism::get_placement_group",
                    holder.id
                ),
            ));
        }
        crate::kv::put(&key, &record)?;
    }
    if let Err(e) = raylet_request(CreatePlacementGroup { spec }) {
        let _ = crate::kv::delete(&key);
        return Err(e);
    }
    Ok(group)
}

/// The group named `name`, from any driver or worker of the cluster.
///
/// # Errors
///
/// `InvalidArgument` when no group that is not removed has that name.
pub fn get_placement_group(name: &str) -> Result<PlacementGroup> {
    find_named(name)?.ok_or_else(|| {
        Error::invalid(
            "placement group name",
            format!("no placement group named {name:?} (removed, or never made)"),
        )
    })
}

/// Every group of the cluster that is not removed (Ray's
/// `placement_group_table`), with its name (empty for a group made by
/// [`placement_group`]) and state, sorted by name and then id. In a
/// cluster each node lists the groups created there; a node that cannot
/// be reached is left out.
///
/// ```
/// use prism::{Bundle, PlacementStrategy};
/// # fn main() -> prism::Result<()> {
/// prism::init(prism::Config::default().num_cpus(2))?;
/// let pg = prism::placement_group(vec![Bundle::new().num_cpus(1.0)], PlacementStrategy::Pack)?;
/// let listed = prism::list_placement_groups()?;
/// assert!(listed.iter().any(|(name, g, _)| name.is_empty() && g.id() == pg.id()));
/// prism::remove_placement_group(&pg)?;
/// assert!(prism::list_placement_groups()?.iter().all(|(_, g, _)| g.id() != pg.id()));
/// # Ok(()) }
/// ```
pub fn list_placement_groups() -> Result<Vec<(String, PlacementGroup, PlacementGroupState)>> {
    let ids = raylet_request(ListPlacementGroups { everywhere: true })?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let info = match raylet_request(GetPlacementGroup { id, wait_ms: None }) {
            Ok(info) => info,
            // Removed since it was listed.
            Err(Error::PlacementGroupRemoved { .. }) => continue,
            Err(e) => return Err(e),
        };
        if info.state == PlacementGroupState::Removed {
            continue;
        }
        let group = PlacementGroup {
            id,
            name: info.spec.name.clone(),
            bundles: info.spec.bundles,
            strategy: info.spec.strategy,
        };
        out.push((info.spec.name.unwrap_or_default(), group, info.state));
    }
    out.sort_by(|a, b| (&a.0, a.1.id.to_string()).cmp(&(&b.0, b.1.id.to_string())));
    Ok(out)
}

/// The group recorded under `name`, unless it was removed (its record is
/// then dropped).
fn find_named(name: &str) -> Result<Option<PlacementGroup>> {
    let key = name_key(name);
    let Some(record) = crate::kv::get(&key)? else {
        return Ok(None);
    };
    let group: PlacementGroup = rmp_serde::from_slice(&record)
        .map_err(|e| Error::invalid("placement group record", e.to_string()))?;
    match group.state() {
        Ok((PlacementGroupState::Removed, _)) | Err(Error::PlacementGroupRemoved { .. }) => {
            let _ = crate::kv::delete(&key);
            Ok(None)
        }
        Ok(_) => Ok(Some(group)),
        Err(e) => Err(e),
    }
}

/// Removes a group: its resources go back, and the tasks and actors
/// running in it are stopped. Removing it twice is not an error.
pub fn remove_placement_group(group: &PlacementGroup) -> Result<()> {
    raylet_request(RemovePlacementGroup { id: group.id })?;
    if let Some(name) = &group.name {
        // Its name is free again (unless another group took it since).
        let key = name_key(name);
        let ours = crate::kv::get(&key)?
            .and_then(|r| rmp_serde::from_slice::<PlacementGroup>(&r).ok())
            .is_some_and(|g| g.id == group.id);
        if ours {
            crate::kv::delete(&key)?;
        }
    }
    Ok(())
}

impl PlacementGroup {
    /// The group's id.
    pub fn id(&self) -> PlacementGroupId {
        self.id
    }

    /// Its name, for a group made by [`named_placement_group`].
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
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
            PlacementGroupState::Removed => Err(Error::PlacementGroupRemoved { id: self.id }),
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
