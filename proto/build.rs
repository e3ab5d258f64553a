//! Compiles the kubelet API `.proto` files with protox (pure Rust, so no
//! `protoc` is needed) and generates prost messages into `OUT_DIR`, with
//! the tonic clients and servers when the `grpc` feature is on.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/deviceplugin_v1beta1.proto",
        "proto/podresources_v1.proto",
        "proto/dra_v1.proto",
        "proto/pluginregistration_v1.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .compile_fds(fds)?;
    Ok(())
}
