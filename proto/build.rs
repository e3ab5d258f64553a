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
    // DRA health's package is `v1`, as PodResources' is: prost writes one
    // file per package, so it goes to a directory of its own.
    let health = "proto/dra_health_v1.proto";
    println!("cargo:rerun-if-changed={health}");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("dra_health");
    std::fs::create_dir_all(&out)?;
    tonic_prost_build::configure()
        .build_client(grpc)
        .build_server(grpc)
        .out_dir(out)
        .compile_fds(protox::compile([health], ["proto"])?)?;
    Ok(())
}
