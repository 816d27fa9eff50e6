//! `cargo run -p vpmu-capi --example gen_header [-- --check]`: writes capi/include/vpmu.h, or
//! with `--check` exits non-zero when it differs from what the sources generate (the `header`
//! test makes the same check under `cargo test`).

use std::process::ExitCode;

#[path = "../tests/support/header.rs"]
mod header;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("usage: gen_header [--check]  (unknown argument {other:?})");
            return ExitCode::from(2);
        }
    };
    let text = match header::generate() {
        Ok(text) => text,
        Err(e) => {
            eprintln!("gen_header: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = header::crate_dir().join(header::HEADER_PATH);
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current == text {
        return ExitCode::SUCCESS;
    }
    if check {
        eprintln!(
            "capi/{} is stale: run `cargo run -p vpmu-capi --example gen_header` and commit it",
            header::HEADER_PATH
        );
        return ExitCode::FAILURE;
    }
    match std::fs::write(&path, text) {
        Ok(()) => {
            println!("wrote capi/{}", header::HEADER_PATH);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gen_header: cannot write {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}
