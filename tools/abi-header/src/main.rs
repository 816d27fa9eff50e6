//! `gen-abi-header [--check]`: writes abi/include/xenpmu.h and the layout table in
//! docs/abi.md, or with `--check` exits non-zero when either differs from what the ABI sources
//! generate.

use std::path::Path;
use std::process::ExitCode;

use vpmu_abi_header::{
    DOC_LAYOUT_BEGIN, DOC_LAYOUT_END, HEADER_PATH, doc_layout_block, generate, workspace_root,
};

const DOC_PATH: &str = "docs/abi.md";

/// `doc` with the text between the layout markers replaced by the current table.
fn with_current_layout(doc: &str) -> Result<String, String> {
    let begin = doc
        .find(DOC_LAYOUT_BEGIN)
        .ok_or_else(|| format!("{DOC_PATH} lacks the marker {DOC_LAYOUT_BEGIN}"))?;
    let end = doc
        .find(DOC_LAYOUT_END)
        .filter(|&end| end > begin)
        .ok_or_else(|| {
            format!("{DOC_PATH} lacks the marker {DOC_LAYOUT_END} after the begin marker")
        })?;
    let head = &doc[..begin + DOC_LAYOUT_BEGIN.len()];
    Ok(format!("{head}\n{}\n{}", doc_layout_block(), &doc[end..]))
}

/// Compares or writes one generated file; returns whether it was (or now is) up to date.
fn sync(path: &Path, name: &str, text: &str, check: bool) -> Result<bool, String> {
    let current = std::fs::read_to_string(path).unwrap_or_default();
    if current == text {
        return Ok(true);
    }
    if check {
        eprintln!("{name} is stale: run `cargo run -p vpmu-abi-header` and commit it");
        return Ok(false);
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {name}");
    Ok(true)
}

fn run(check: bool) -> Result<bool, String> {
    let root = workspace_root();
    let header = generate().map_err(|e| e.to_string())?;
    let header_ok = sync(&root.join(HEADER_PATH), HEADER_PATH, &header, check)?;
    let doc_path = root.join(DOC_PATH);
    let doc = std::fs::read_to_string(&doc_path)
        .map_err(|e| format!("cannot read {}: {e}", doc_path.display()))?;
    let doc_ok = sync(&doc_path, DOC_PATH, &with_current_layout(&doc)?, check)?;
    Ok(header_ok && doc_ok)
}

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("usage: gen-abi-header [--check]  (unknown argument {other:?})");
            return ExitCode::from(2);
        }
    };
    match run(check) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("gen-abi-header: {e}");
            ExitCode::FAILURE
        }
    }
}
