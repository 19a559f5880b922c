//! Compiles `proto/gcs.proto` with protox (a protobuf compiler in Rust, so
//! no `protoc` has to be installed) and generates tonic's client and server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["proto/gcs.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto/gcs.proto");
    Ok(())
}
