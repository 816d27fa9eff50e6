//! The C toy hypervisor (`capi/tests/c/`): compiled with gcc as C11 at `-Wall -Wextra
//! -Werror` against the committed `capi/include/vpmu.h` and `abi/include/xenpmu.h`, linked
//! with the static library this crate builds, and run: two pCPUs on pthreads, three vCPUs,
//! the vendor from CPUID, on the four test shapes, with the checks of the Rust worked example
//! (exact counts by RDPMC and RDMSR, #GP, a migration, a PMI with its sample, a cross-CPU
//! teardown completed on its target, clean hardware after detach) and of the C API's error
//! model. Then again under AddressSanitizer and UndefinedBehaviorSanitizer (leak checking
//! on), skipped with a loud line only if gcc's sanitizer runtimes are not installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The C sources, relative to the crate.
const SOURCES: [&str; 2] = ["tests/c/host.c", "tests/c/toy_hypervisor.c"];
/// What the Rust standard library in the static library needs from the system.
const SYSTEM_LIBS: [&str; 3] = ["-lpthread", "-ldl", "-lm"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `libvpmu_capi.a`, as cargo built it for this test: in this test's own directory
/// (target/<profile>/deps/). Not the copy in target/<profile>/, which only `cargo build`
/// refreshes: a test linking that one could run a stale library.
fn static_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    let library = deps.join("libvpmu_capi.a");
    assert!(
        library.exists(),
        "{} not built: the crate's staticlib target",
        library.display()
    );
    library
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Compiles and links the toy hypervisor into `binary` with the extra `flags`.
fn build(binary: &Path, flags: &[&str]) {
    let dir = crate_dir();
    let mut gcc = Command::new("gcc");
    gcc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g"])
        .args(flags)
        .arg("-I")
        .arg(dir.join("include"))
        .arg("-I")
        .arg(dir.join("../abi/include"))
        .args(SOURCES.iter().map(|s| dir.join(s)))
        .arg(static_library())
        .args(SYSTEM_LIBS)
        .arg("-o")
        .arg(binary);
    let output = run(&mut gcc);
    assert!(
        output.status.success(),
        "gcc failed:\n{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// Runs the toy hypervisor and checks its report: every check passed on every shape.
fn run_and_check(binary: &Path, env: &[(&str, &str)]) {
    let output = run(Command::new(binary).envs(env.iter().copied()));
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(
        output.status.success(),
        "{} failed ({}):\n{stdout}{stderr}",
        binary.display(),
        output.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let shapes = ["intel-v5", "intel-v2", "amd-perfmonv2", "amd-k7"];
    assert_eq!(lines.len(), shapes.len(), "{stdout}");
    for (line, shape) in lines.iter().zip(shapes) {
        let vendor = if shape.starts_with("intel") {
            "Intel"
        } else {
            "AMD"
        };
        let expected = format!(
            "{shape}: {vendor} backend from CPUID; counts 1000, 500, 300, 1200, 1300 after \
             migration; sample at 0xffffffff812343e4, flushed; 3 ring records; teardown request \
             completed on pCPU 1"
        );
        assert_eq!(*line, expected);
    }
    assert!(stderr.is_empty(), "unexpected output on stderr:\n{stderr}");
    print!("{stdout}");
}

#[test]
fn c_toy_hypervisor_runs_the_worked_scenario() {
    let binary = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vpmu_capi_toy_hypervisor");
    build(&binary, &[]);
    run_and_check(&binary, &[]);
}

/// Whether gcc can link a program with both sanitizers (their runtimes are installed).
fn sanitizers_available(dir: &Path) -> Result<(), String> {
    let probe = dir.join("vpmu_capi_sanitizer_probe.c");
    std::fs::write(&probe, "int main(void) { return 0; }\n").map_err(|e| e.to_string())?;
    let output = run(Command::new("gcc")
        .arg("-fsanitize=address,undefined")
        .arg(&probe)
        .arg("-o")
        .arg(dir.join("vpmu_capi_sanitizer_probe")));
    if output.status.success() {
        Ok(())
    } else {
        Err(text(&output.stderr))
    }
}

#[test]
fn c_toy_hypervisor_is_clean_under_asan_and_ubsan() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    if let Err(why) = sanitizers_available(&dir) {
        eprintln!(
            "SKIPPED: gcc cannot link -fsanitize=address,undefined (install libasan and \
             libubsan: scripts/setup.sh does); the C toy hypervisor ran without sanitizers \
             only. gcc said:\n{why}"
        );
        return;
    }
    let binary = dir.join("vpmu_capi_toy_hypervisor_sanitized");
    build(
        &binary,
        &[
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ],
    );
    run_and_check(
        &binary,
        &[
            (
                "ASAN_OPTIONS",
                "detect_leaks=1:abort_on_error=0:exitcode=23",
            ),
            ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"),
        ],
    );
}

/// The header compiles as C++11 too (cbindgen's C++ compatibility: `extern "C"`, enums with
/// their underlying type), warnings as errors.
#[test]
fn header_compiles_as_cpp11() {
    let dir = crate_dir();
    let source = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vpmu_capi_header.cpp");
    std::fs::write(
        &source,
        "#include \"vpmu.h\"\nint main() { return vpmu_testing_shape_count() == 4 ? 0 : 1; }\n",
    )
    .expect("write the probe");
    let output = run(Command::new("g++")
        .args(["-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"])
        .arg("-I")
        .arg(dir.join("include"))
        .arg("-I")
        .arg(dir.join("../abi/include"))
        .arg(&source));
    assert!(
        output.status.success(),
        "g++ failed:\n{}",
        text(&output.stderr)
    );
}
