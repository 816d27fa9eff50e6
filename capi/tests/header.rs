//! The committed `capi/include/vpmu.h` is what the sources generate (cbindgen), so that a C
//! caller never compiles against declarations the library does not define.

#[path = "support/header.rs"]
mod header;

#[test]
fn committed_header_is_current() {
    let generated = header::generate().expect("cbindgen parses the crate");
    let path = header::crate_dir().join(header::HEADER_PATH);
    let committed = std::fs::read_to_string(&path).expect("capi/include/vpmu.h exists");
    assert!(
        committed == generated,
        "capi/{} is stale: run `cargo run -p vpmu-capi --example gen_header` and commit it",
        header::HEADER_PATH
    );
}
