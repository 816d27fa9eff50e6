//! `gen-abi-header [--check]`: writes abi/include/xenpmu.h, or with `--check` exits non-zero
//! when the committed header differs from what the ABI sources generate.

use std::process::ExitCode;

use vpmu_abi_header::{HEADER_PATH, generate, workspace_root};

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("usage: gen-abi-header [--check]  (unknown argument {other:?})");
            return ExitCode::from(2);
        }
    };
    let text = match generate() {
        Ok(text) => text,
        Err(e) => {
            eprintln!("gen-abi-header: {e}");
            return ExitCode::FAILURE;
        }
    };
    let path = workspace_root().join(HEADER_PATH);
    if check {
        return match std::fs::read_to_string(&path) {
            Ok(committed) if committed == text => ExitCode::SUCCESS,
            Ok(_) => {
                eprintln!(
                    "{HEADER_PATH} is stale: run `cargo run -p vpmu-abi-header` and commit it"
                );
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("cannot read {}: {e}", path.display());
                ExitCode::FAILURE
            }
        };
    }
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {HEADER_PATH}");
    ExitCode::SUCCESS
}
