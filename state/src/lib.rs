//! Prism's state API (Ray's State API and `ray list`): the cluster's
//! nodes, jobs, actors (dead ones with their death cause), tasks (finished
//! and failed ones, with their errors), objects, workers and placement
//! groups.
//!
//! The head's dashboard serves [`router`] over a [`StateApi`]: nodes and
//! jobs come from the head's own tables, the rest from every live node,
//! which the head asks at once over HTTP (each node's agent serves its own
//! rows next to its metrics). Filters (`key=value`, `key!=value`) and the
//! limit apply on the head. [`StateClient`] is the client `prism list`,
//! `prism get` and `prism summary` use.
//!
//! ```
//! use prism_state::{Filter, Kind, Query};
//! let mut query = Query::new(Kind::parse("actors")?);
//! query.filters.push(Filter::parse("state!=DEAD")?);
//! query.limit = 10;
//! assert_eq!(
//!     query.to_path(),
//!     "/api/v0/actors?limit=10&filter_keys=state&filter_predicates=%21%3D&filter_values=DEAD"
//! );
//! # Ok::<(), prism_state::StateError>(())
//! ```
#![warn(missing_docs, missing_debug_implementations)]

mod client;
mod error;
mod fetch;
mod head;
mod http;
mod query;
mod timeline;

pub use client::StateClient;
pub use error::StateError;
pub use head::{Endpoints, Listing, NodeEndpoint, Rows, Sources, StateApi};
pub use http::router;
pub use query::{encode, Filter, Kind, Predicate, Query, DEFAULT_LIMIT, MAX_LIMIT};
pub use timeline::chrome_trace;
