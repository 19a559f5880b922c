//! The same link settings as prism-train's, for this package's examples with
//! the `tch` feature: an rpath to libtorch's folder (see train/build.rs).

#[path = "../train/build.rs"]
mod shared;

fn main() {
    shared::main();
}
