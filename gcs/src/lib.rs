//! The cluster's control store (Ray's GCS), run by the head node.
//!
//! It keeps the node table: every raylet registers here, sends a heartbeat
//! with its free resources and waiting demand every
//! `heartbeat_period`, and is marked DEAD when none arrived for
//! `node_death_timeout` (or when it unregisters on `prism stop`). It also
//! keeps the cluster's key-value table ([`KvTable`]), which the raylets
//! pass their processes' `prism::kv` calls on to. It is the
//! only process that knows the whole cluster, and it is never on a task's
//! path: raylets grant leases from their own state.
//!
//! Given a state file ([`GcsSettings::state`]), it keeps what must outlive
//! its process there (the cluster's id and token, the key-value table, the
//! actor names and the member nodes), and a control store started again on
//! the file resumes the cluster: its nodes' heartbeats are answered as
//! before, and a member that does not send one within the death timeout is
//! marked dead.
//!
//! Nodes, drivers and the `prism` command reach it over gRPC (tonic), with
//! `proto/gcs.proto` as the contract. Every call must carry the cluster
//! token; one without it is refused, logged, and answered with an error
//! that says where to find the token.
//!
//! ```no_run
//! # async fn demo() -> Result<(), prism_gcs::GcsError> {
//! use prism_gcs::{GcsClient, GcsServer, GcsSettings, Token};
//! use std::time::Duration;
//! let token = Token::generate();
//! let (beat, death) = (Duration::from_millis(500), Duration::from_secs(5));
//! let settings = GcsSettings::new(token.clone(), beat, death);
//! let gcs = GcsServer::start("127.0.0.1:0".parse().unwrap(), settings).await?;
//! let mut client = GcsClient::connect(&gcs.address().to_string(), &token).await?;
//! println!("{} nodes", client.get_nodes().await?.len());
//! gcs.shutdown().await;
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations)]

mod auth;
mod client;
mod durable;
mod error;
mod exits;
mod incoming;
mod kv;
pub mod pb;
mod pem;
mod redis;
mod server;
mod table;
mod validate;

pub use auth::Token;
pub use client::{Exits, GcsClient, NameHolder};
pub use durable::StateStore;
pub use error::{check_address, GcsError};
pub use kv::KvTable;
pub use redis::RedisPlace;
pub use server::{GcsServer, GcsSettings, GcsView, NamedActor, SHUTDOWN_GRACE};
