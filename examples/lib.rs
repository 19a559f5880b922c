//! Runnable Prism programs; see the `[[example]]` entries of this package:
//! `cargo run --release --example quickstart`, `pi`, `pipeline`.
