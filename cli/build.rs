//! Generates the gRPC code of torchft's `LighthouseService` (server and client: followers
//! forward to the leader with the client) from the vendored `proto/torchft.proto`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/torchft.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/torchft.proto"], &["proto"])?;
    Ok(())
}
