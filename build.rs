//! Generates the C header with cbindgen into OUT_DIR on every build. The checked-in copy in
//! include/ is rewritten only when RDZV_WRITE_HEADER=1, so a plain build never edits sources
//! and the header test can tell when the two drift apart.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=RDZV_WRITE_HEADER");
    // A SONAME, so programs linked against the library record its name, not its build path.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdzv.so");
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("cbindgen.toml is readable");
    let bindings = match cbindgen::generate_with_config(&crate_dir, config) {
        Ok(b) => b,
        Err(e) => {
            // A syntax error is reported better by rustc itself; do not mask it here.
            println!("cargo:warning=cbindgen could not generate rdzv.h: {e}");
            return;
        }
    };
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("rdzv.h");
    bindings.write_to_file(&out);
    if std::env::var("RDZV_WRITE_HEADER").as_deref() == Ok("1") {
        bindings.write_to_file(crate_dir.join("include/rdzv.h"));
    }
}
