//! The C helpers that docs/abi.md "Memory ordering" requires, run as a consumer runs them: a
//! reader never sees `dropped_samples` torn while another thread bumps it across carries into
//! the high half, at -m32 (where a plain read is two loads) and -m64.

use vpmu_tests::c_build::{WIDTHS, compile_with, run, workspace_root};

#[test]
fn dropped_samples_read_is_never_torn_at_either_width() {
    let source = workspace_root().join("tests/c/ordering.c");
    for width in WIDTHS {
        let out =
            std::env::temp_dir().join(format!("vpmu-c-ordering-{}-m{width}", std::process::id()));
        let exe = compile_with(&source, width, &out, &["-pthread"]);
        let reads = run(&exe, &[], b"");
        let reads: u64 = String::from_utf8_lossy(&reads)
            .trim()
            .parse()
            .expect("the program prints its read count");
        // The check is each read's value; the count only shows the reader ran beside the writer.
        eprintln!("-m{width}: {reads} reads while the writer crossed 2000000 carries");
        let _ = std::fs::remove_file(&exe);
    }
}
