//! Compiles `onnx.proto` (ONNX's own, unchanged) with protox, the pure-Rust path that
//! `ringflow.proto` takes: building needs no system `protoc` and no Python.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=onnx.proto");
    let descriptors = protox::compile(["onnx.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
