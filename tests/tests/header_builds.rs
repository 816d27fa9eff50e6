//! The generated C header where its consumers build: a Linux kernel module (Kbuild: no C
//! library headers, the kernel's own types and warnings, `-Werror`) against the installed
//! kernel headers, and a C++11 program at `-m32` and `-m64` that runs every helper.
//!
//! Both skip, loudly (`SKIP:` on stderr), only when the toolchain is absent: no kernel build
//! directory or no `make`; no `g++`, or a `g++` that cannot build `-m32` programs at all.
//! `scripts/setup.sh` installs `linux-headers-amd64` and `g++-multilib`, so in CI they run.
//! `XENPMU_KDIR` names a kernel build directory to use instead of the one found.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use vpmu_tests::c_build::{WIDTHS, run, workspace_root};

fn scratch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

fn output_text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The numbers in a name, for ordering versions (`6.1.0-57` after `6.1.0-9`).
fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect()
}

/// A kernel build directory (one with a top-level Makefile): `XENPMU_KDIR`, else the running
/// kernel's, else the newest installed `/usr/src/linux-headers-*` (a CI container's kernel is
/// not the distribution's, so the running kernel usually has none).
fn kernel_build_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("XENPMU_KDIR") {
        return Some(PathBuf::from(dir));
    }
    let usable = |dir: &Path| dir.join("Makefile").is_file();
    let release = Command::new("uname").arg("-r").output().ok()?;
    let running = PathBuf::from("/lib/modules")
        .join(String::from_utf8_lossy(&release.stdout).trim())
        .join("build");
    if usable(&running) {
        return Some(running);
    }
    let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/src")
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            // Debian splits each version into an arch part (the build directory) and -common.
            name.starts_with("linux-headers-") && !name.ends_with("-common") && usable(path)
        })
        .collect();
    installed.sort_by_key(|path| version_key(&path.to_string_lossy()));
    installed.pop()
}

#[test]
fn a_linux_kernel_module_including_the_header_builds_at_werror() {
    let Some(kdir) = kernel_build_dir() else {
        eprintln!(
            "SKIP: no kernel build directory (install linux-headers-amd64, as scripts/setup.sh \
             does, or set XENPMU_KDIR): the header was NOT tested in a kernel build"
        );
        return;
    };
    if Command::new("make").arg("--version").output().is_err() {
        eprintln!("SKIP: no make: the header was NOT tested in a kernel build");
        return;
    }
    // Kbuild writes its objects next to the sources: build a copy.
    let dir = scratch("kmod");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the module directory");
    for file in ["Kbuild", "xenpmu_kmod.c"] {
        std::fs::copy(
            workspace_root().join("tests/kmod").join(file),
            dir.join(file),
        )
        .unwrap_or_else(|e| panic!("copy tests/kmod/{file}: {e}"));
    }
    let include = workspace_root().join("abi/include");
    let start = Instant::now();
    let output = Command::new("make")
        .arg("-C")
        .arg(&kdir)
        .arg(format!("M={}", dir.display()))
        .arg(format!("XENPMU_INCLUDE={}", include.display()))
        .arg("modules")
        .output()
        .expect("run make");
    let elapsed = start.elapsed();
    assert!(
        output.status.success(),
        "the kernel module including xenpmu.h failed to build against {}:\n{}",
        kdir.display(),
        output_text(&output)
    );
    assert!(
        dir.join("xenpmu_kmod.ko").is_file(),
        "make succeeded but left no xenpmu_kmod.ko:\n{}",
        output_text(&output)
    );
    eprintln!(
        "kernel module built against {} in {:.1} s",
        kdir.display(),
        elapsed.as_secs_f64()
    );
}

fn gxx(width: u32, source: &Path, out: &Path, extra: &[&str]) -> std::io::Result<Output> {
    Command::new("g++")
        .args([
            "-std=c++11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
        ])
        .args(extra)
        .arg(format!("-m{width}"))
        .arg(source)
        .arg("-o")
        .arg(out)
        .output()
}

#[test]
fn a_cxx11_program_using_the_helpers_builds_and_runs_at_m32_and_m64() {
    if Command::new("g++").arg("--version").output().is_err() {
        eprintln!("SKIP: no g++: the header was NOT tested as C++11");
        return;
    }
    let source = workspace_root().join("tests/c/cxx11.cpp");
    let include = format!("-I{}", workspace_root().join("abi/include").display());
    for width in WIDTHS {
        let exe = scratch(&format!("cxx11_{width}"));
        let start = Instant::now();
        let output = gxx(width, &source, &exe, &[&include]).expect("run g++");
        if !output.status.success() {
            // Tell a missing multilib from a header that does not build: a program without it.
            let probe = scratch("cxx_probe.cpp");
            std::fs::write(
                &probe,
                "#include <cstdio>\nint main() { return std::puts(\"\") < 0; }\n",
            )
            .expect("write probe");
            let probed = gxx(width, &probe, &scratch(&format!("cxx_probe_{width}")), &[]);
            if !probed.is_ok_and(|o| o.status.success()) {
                eprintln!(
                    "SKIP: g++ cannot build any -m{width} program (install g++-multilib, as \
                     scripts/setup.sh does): the header was NOT tested as C++11 at -m{width}"
                );
                continue;
            }
            panic!(
                "g++ -std=c++11 -m{width} tests/c/cxx11.cpp failed:\n{}",
                output_text(&output)
            );
        }
        let compiled = start.elapsed();
        assert_eq!(run(&exe, &[], b""), b"ok\n", "-m{width}");
        eprintln!(
            "C++11 consumer at -m{width}: compiled in {:.1} s, all checks passed",
            compiled.as_secs_f64()
        );
    }
}
