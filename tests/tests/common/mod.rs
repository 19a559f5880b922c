//! The harness shared by every integration test binary (the crate's
//! library, `tests/lib.rs`).
#![allow(unused_imports)]

pub use prism_tests::*;
