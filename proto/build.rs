//! Compiles the kubelet API `.proto` files with protox (pure Rust, so no
//! `protoc` is needed) and generates prost messages and tonic services into
//! `OUT_DIR`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/deviceplugin_v1beta1.proto",
        "proto/podresources_v1.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
