//! The messages and services generated from `proto/gcs.proto`.
#![allow(missing_docs, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/prism.gcs.rs"));
