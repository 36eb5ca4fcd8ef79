//! The checked-in C header must match what cbindgen generates from the code now.

#[test]
fn checked_in_header_matches_generated() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/rdzv.h"));
    let checked_in = include_str!("../include/rdzv.h");
    assert!(
        generated == checked_in,
        "include/rdzv.h is stale: regenerate with `RDZV_WRITE_HEADER=1 cargo build` and commit it"
    );
}
