//! Generates the C header with cbindgen into OUT_DIR on every build. The checked-in copy in
//! include/ is rewritten only when RDZV_WRITE_HEADER=1, so a plain build never edits sources
//! and the header test can tell when the two drift apart.

use std::path::PathBuf;

/// The major number of the library's SONAME: bumped with every ABI break (see the README).
const SONAME_MAJOR: u32 = 0;

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=RDZV_WRITE_HEADER");
    // A versioned SONAME (the ABI policy in the README says when it moves), so programs
    // linked against the library record `librdzv.so.0`, not its build path.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdzv.so.{SONAME_MAJOR}");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    // Export the C ABI and nothing else (no Rust or dependency symbols).
    let script = out_dir.join("exports.map");
    std::fs::write(&script, "{\n  global: rdzv_*;\n  local: *;\n};\n")
        .expect("OUT_DIR is writable");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        script.display()
    );
    // Programs linked in the build tree record librdzv.so.0 and look for it at run time. A
    // build script may write only in OUT_DIR, so the link to librdzv.so under that name is made
    // by whoever links such programs, in a directory of its own (scripts/dev-lib.sh, the C++
    // build, the C tests' harness), not here.
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("cbindgen.toml is readable");
    config.after_includes = Some(version_macros());
    // From the sources alone (they are the whole C ABI: parse_deps is off), not through
    // `cargo metadata`, which needs the `rdzv` crate resolvable: it is not, in a package built
    // before `rdzv` is published (`cargo publish --dry-run`).
    let bindings = match cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
    {
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

/// The header's version macros, from the crate's version as Cargo gives it, so the header and the
/// library built with it (`rdzv_version()`) cannot disagree.
fn version_macros() -> String {
    let var = |name: &str| std::env::var(name).expect("set by cargo");
    format!(
        "
/**
 * The version of the library this header belongs to. rdzv_version() says which library a
 * program loaded; with the ABI policy (README.md) a program built against MAJOR.MINOR runs
 * with any library of the same SONAME whose version is at least this.
 */
#define RDZV_VERSION_MAJOR {major}
#define RDZV_VERSION_MINOR {minor}
#define RDZV_VERSION_PATCH {patch}
#define RDZV_VERSION \"{version}\"
",
        major = var("CARGO_PKG_VERSION_MAJOR"),
        minor = var("CARGO_PKG_VERSION_MINOR"),
        patch = var("CARGO_PKG_VERSION_PATCH"),
        version = var("CARGO_PKG_VERSION"),
    )
}
