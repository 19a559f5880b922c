//! Link settings for the `tch` feature; does nothing without it.
//!
//! torch-sys links libtorch but leaves finding it at run time to the user.
//! This script gives this package's own tests, examples and binaries an
//! rpath to libtorch's folder, so they run without `LD_LIBRARY_PATH`, and
//! with `PRISM_TORCH_CUDA=1` keeps `libtorch_cuda.so` among their needed
//! libraries (the linker's `--as-needed` otherwise drops it, as nothing
//! refers to it by symbol, and `tch::Cuda::is_available()` is then false).
//!
//! libtorch's folder comes from, in order: `PRISM_LIBTORCH_LIB` (written by
//! `scripts/setup-torch.sh` into its env file), `LIBTORCH_LIB` or `LIBTORCH`
//! (plus `/lib`, as torch-sys reads them), or, with `LIBTORCH_USE_PYTORCH`,
//! the Python that torch-sys asks.
//!
//! A binary of another crate that depends on prism-train with `tch` gets no
//! rpath from here (cargo applies link arguments to the package's own
//! targets only); give it the same `-Wl,-rpath` or set `LD_LIBRARY_PATH`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

pub fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_TCH").is_none() {
        return;
    }
    for name in [
        "PRISM_LIBTORCH_LIB",
        "PRISM_TORCH_CUDA",
        "LIBTORCH",
        "LIBTORCH_LIB",
        "LIBTORCH_USE_PYTORCH",
        "VIRTUAL_ENV",
    ] {
        println!("cargo:rerun-if-env-changed={name}");
    }
    let Some(lib_dir) = libtorch_lib_dir() else {
        println!(
            "cargo:warning=prism-train: libtorch's folder is unknown, so test binaries will need \
             LD_LIBRARY_PATH; run scripts/setup-torch.sh and source the env file it writes"
        );
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    if env::var("PRISM_TORCH_CUDA").as_deref() == Ok("1") {
        if !lib_dir.join("libtorch_cuda.so").exists() {
            println!(
                "cargo:warning=prism-train: PRISM_TORCH_CUDA=1 but {} has no libtorch_cuda.so; \
                 install a CUDA build of PyTorch (PRISM_TORCH_CUDA=1 scripts/setup-torch.sh)",
                lib_dir.display()
            );
            return;
        }
        println!("cargo:rustc-link-arg=-L{}", lib_dir.display());
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}

fn libtorch_lib_dir() -> Option<PathBuf> {
    if let Some(dir) = env::var_os("PRISM_LIBTORCH_LIB") {
        return Some(PathBuf::from(dir));
    }
    if let Some(root) = env::var_os("LIBTORCH_LIB").or_else(|| env::var_os("LIBTORCH")) {
        return Some(PathBuf::from(root).join("lib"));
    }
    env::var_os("LIBTORCH_USE_PYTORCH")?;
    // The interpreter torch-sys runs in the same case.
    let python = if env::var_os("VIRTUAL_ENV").is_some() {
        "python"
    } else {
        "python3"
    };
    let output = Command::new(python)
        .args([
            "-c",
            "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8(output.stdout).ok()?;
    let dir = PathBuf::from(dir.trim());
    (output.status.success() && dir.is_dir()).then_some(dir)
}
