//! Compiling the C test programs with gcc at a chosen width.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Word widths the C consumers are built for.
pub const WIDTHS: [u32; 2] = [32, 64];

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Compiles `source` with gcc at `-m{width}` against `abi/include`, into `out`. Panics with the
/// compiler's output (and what to install) if it fails: these tests need gcc and, for -m32,
/// gcc-multilib, which `.ci/run` installs.
pub fn compile(source: &Path, width: u32, out: &Path) -> PathBuf {
    compile_with(source, width, out, &[])
}

/// [`compile`] with extra gcc arguments after the source (libraries, `-pthread`).
pub fn compile_with(source: &Path, width: u32, out: &Path, extra: &[&str]) -> PathBuf {
    let include = workspace_root().join("abi/include");
    let output = Command::new("gcc")
        .args([
            "-std=c11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
        ])
        .arg(format!("-m{width}"))
        .arg("-I")
        .arg(&include)
        .arg(source)
        .args(extra)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run gcc ({e}); install gcc (and gcc-multilib for -m32)")
        });
    assert!(
        output.status.success(),
        "gcc -m{width} {} failed (for -m32, install gcc-multilib):\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    out.to_path_buf()
}

/// Runs `program` with `args`, feeding `stdin`, and returns its stdout; panics with its stderr
/// if it exits non-zero.
pub fn run(program: &Path, args: &[&str], stdin: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let mut input = child.stdin.take().expect("stdin was piped");
    input.write_all(stdin).expect("write to child stdin");
    drop(input);
    let output = child.wait_with_output().expect("wait for child");
    assert!(
        output.status.success(),
        "{} {args:?} failed: {}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}
