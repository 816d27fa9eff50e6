//! Builds the guest programs (freestanding C, 64-bit, CPL0) into static ELF executables in
//! `OUT_DIR`, which `src/lib.rs` embeds with `include_bytes!` and the machine loads by their
//! program headers. Nothing prebuilt is committed. Sources are grouped per consumer
//! (`selftest/`, `profile/`, `coverage/`) beside the shared runtime (`runtime/`: entry, CPL3
//! switch, console, IDT/LAPIC helpers and the guest's vPMU driver); a path in `PROGRAMS` is
//! relative to this crate.
//!
//! Every constant the guests share with the VMM (ports, the profile protocol, case numbers,
//! the result record) comes from `vpmu-guest-protocol`, written here as `guest_protocol.h` in
//! `OUT_DIR` (on the include path) before anything is compiled.
//!
//! `compat.elf` also holds a 32-bit consumer (`gcc -m32`, `compat32.c` with the ABI header
//! `abi/include/xenpmu.h`), made flat and embedded at 0x200000. If `-m32` code cannot be
//! built here (no gcc-multilib), `compat.elf` is left empty with a `cargo:warning`, and the
//! selftest reports its case as SKIPPED.
//!
//! `ring0.elf` is the ring-0 guest (`ring0/`): the C firmware `ring0/ring0.c` on the runtime,
//! linked with the inner hypervisor `ring0/hv`, a `no_std` Rust staticlib over the vpmu core
//! and both vendor backends (`hw-msr`), built here by a nested `cargo build` outside the
//! workspace (its own lock file and release profile: panic=abort, fat LTO, one codegen unit)
//! with `--target x86_64-unknown-linux-gnu` and `-C target-feature=-sse,-sse2` (KVM's CPL0
//! emulator on this host has no SSE). The build fails if any SSE instruction is left in the
//! image (objdump). If the staticlib cannot be built here (no cargo registry cache offline, a
//! rustc that refuses the flags), `ring0.elf` is left empty with a `cargo:warning` and the
//! ring-0 test reports SKIPPED. `VPMU_RING0_SABOTAGE=1` builds it with the feature
//! `sabotage-local-request` (cross-CPU requests run on the caller's CPU), which must fail.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest programs: each is its sources + the runtime (`rt.c`, `user.S`, `start.S`).
const PROGRAMS: &[(&str, &[&str])] = &[
    (
        "pmu",
        &[
            "selftest/pmu.c",
            "selftest/transport.c",
            "runtime/driver.c",
            "selftest/timed.c",
            "selftest/timed_user.c",
            "selftest/workload.S",
            "selftest/multi.c",
            "selftest/all.c",
            "selftest/all_work.S",
        ],
    ),
    ("bench", &["selftest/bench.c"]),
    // `vpmu profile`: the profiling domain and the workload domains.
    (
        "profiler",
        &[
            "profile/profiler.c",
            "profile/sampler.c",
            "profile/ring.c",
            "runtime/driver.c",
        ],
    ),
    (
        "work",
        &[
            "profile/work.c",
            "profile/work_loops.S",
            "profile/sampler.c",
            "profile/ring.c",
            "runtime/driver.c",
        ],
    ),
    // An example of a user's guest for `vpmu profile --guest` (used by the CLI's tests).
    ("example", &["profile/example.c"]),
    // A hostile workload domain: attacks the interface from inside the rules (CLI tests).
    ("hostile", &["profile/hostile.c", "profile/hostile_ring.c"]),
    // `vpmu coverage`: reads the vPMU's coverage through XENPMU_OP_COVERAGE.
    ("coverage", &["coverage/coverage.c"]),
];

/// Header directories: the runtime's, the consumers' and the ABI's (and `OUT_DIR`, where
/// `guest_protocol.h` is generated).
const INCLUDE_DIRS: &[&str] = &["runtime", "selftest", "profile", "../../abi/include"];

/// An object file name for `src` unique across the groups (`selftest/pmu.c` -> `selftest_pmu.o`).
fn object_name(src: &str) -> String {
    Path::new(src)
        .with_extension("o")
        .to_string_lossy()
        .replace('/', "_")
}

const CFLAGS: &[&str] = &[
    "-m64",
    "-ffreestanding",
    "-nostdlib",
    "-fno-pic",
    "-static",
    "-mgeneral-regs-only",
    "-mno-red-zone",
    "-O2",
    // Frame pointers in every function, leaves included: the hypervisor walks a sample's call
    // chain through them (ABI 1.2), as perf does without DWARF.
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-fno-stack-protector",
    "-fcf-protection=none",
    "-fno-asynchronous-unwind-tables",
    "-fno-builtin",
    "-Wall",
    "-Werror",
];

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?}: {e} (the guest programs need gcc and binutils)")
    });
    assert!(status.success(), "{cmd:?} failed with {status}");
}

/// Flags of the 32-bit consumer (compatibility mode, CPL0).
const CFLAGS32: &[&str] = &[
    "-m32",
    "-ffreestanding",
    "-nostdlib",
    "-fno-pic",
    "-fno-pie",
    "-static",
    "-mgeneral-regs-only",
    "-O2",
    "-fno-stack-protector",
    "-fcf-protection=none",
    "-fno-asynchronous-unwind-tables",
    "-fno-builtin",
    "-Wall",
    "-Werror",
];

fn compile(src: &Path, obj: &Path) {
    let root = Path::new(&env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).to_path_buf();
    let mut gcc = Command::new("gcc");
    gcc.args(CFLAGS);
    for dir in INCLUDE_DIRS {
        gcc.arg("-I").arg(root.join(dir));
    }
    gcc.arg("-I")
        .arg(env::var("OUT_DIR").expect("cargo sets it"));
    run(gcc.arg("-c").arg(src).arg("-o").arg(obj));
}

/// Runs `cmd`; an error message instead of a panic (for the optional 32-bit part).
fn try_run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr.lines().next().unwrap_or("").to_string();
        Err(format!("{cmd:?} failed with {}: {first}", out.status))
    }
}

/// Builds the 32-bit consumer into a flat image (`compat32.bin`, linked at 0x200000).
fn build_compat32(guest: &Path, abi_include: &Path, out: &Path) -> Result<PathBuf, String> {
    let mut objs = Vec::new();
    for src in ["selftest/start32.S", "selftest/compat32.c"] {
        let obj = out.join(object_name(src).replace(".o", ".32.o"));
        try_run(
            Command::new("gcc")
                .args(CFLAGS32)
                .arg("-I")
                .arg(abi_include)
                .arg("-I")
                .arg(out)
                .arg("-c")
                .arg(guest.join(src))
                .arg("-o")
                .arg(&obj),
        )?;
        objs.push(obj);
    }
    let elf = out.join("compat32.elf");
    try_run(
        Command::new("ld")
            .args(["-m", "elf_i386", "-static", "-nostdlib", "-T"])
            .arg(guest.join("selftest/link32.ld"))
            .arg("-o")
            .arg(&elf)
            .args(&objs),
    )?;
    let bin = out.join("compat32.bin");
    try_run(
        Command::new("objcopy")
            .args(["-O", "binary"])
            .arg(&elf)
            .arg(&bin),
    )?;
    Ok(bin)
}

/// `compat.elf`: the 64-bit harness with the flat 32-bit consumer at 0x200000, or an empty
/// file (with a warning) if the 32-bit consumer cannot be built.
fn build_compat(guest: &Path, out: &Path, common: &[PathBuf]) {
    let elf = out.join("compat.elf");
    let abi_include = guest.join("../../abi/include");
    for file in [
        "compat.h",
        "compat32.c",
        "compat64.c",
        "compat_window.S",
        "start32.S",
        "link32.ld",
    ] {
        println!("cargo:rerun-if-changed=selftest/{file}");
    }
    println!("cargo:rerun-if-changed=../../abi/include/xenpmu.h");
    let bin = match build_compat32(guest, &abi_include, out) {
        Ok(bin) => bin,
        Err(e) => {
            println!(
                "cargo:warning=SKIPPED: the 32-bit compat consumer cannot be built (gcc -m32: {e}); \
                 its selftest case will report SKIPPED (install gcc-multilib: scripts/setup.sh)"
            );
            std::fs::write(&elf, []).expect("write an empty compat.elf");
            return;
        }
    };
    let blob = out.join("compat_blob.S");
    std::fs::write(
        &blob,
        format!(
            "    .section .compat32, \"ax\"\n    .incbin \"{}\"\n",
            bin.display()
        ),
    )
    .expect("write compat_blob.S");
    let mut objs = common.to_vec();
    for src in [
        guest.join("selftest/compat64.c"),
        guest.join("selftest/compat_window.S"),
        blob,
    ] {
        let obj = out.join(src.with_extension("o").file_name().expect("a file"));
        compile(&src, &obj);
        objs.push(obj);
    }
    run(Command::new("ld")
        .args(["-static", "-nostdlib", "-T"])
        .arg(guest.join("runtime/link.ld"))
        .arg("--section-start=.compat32=0x200000")
        .arg("-o")
        .arg(&elf)
        .args(&objs));
}

/// The nested build's flags: no SSE (the CPL0 emulator has none; rust-lang/rust#116344 warns
/// that this may become a hard error on this target: `x86_64-unknown-none` is the durable
/// route where it is installed).
const RING0_RUSTFLAGS: &str = "-Ctarget-feature=-sse,-sse2";
const RING0_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds the inner hypervisor's staticlib; its path, or why it cannot be built here.
fn build_ring0_staticlib(guest: &Path, out: &Path) -> Result<PathBuf, String> {
    let manifest = guest.join("ring0/hv/Cargo.toml");
    // OUT_DIR is <target>/[<triple>/]<profile>/build/<pkg>-<hash>/out: share one nested target
    // directory between the profiles (cargo locks it while it builds).
    let target_dir = out
        .ancestors()
        .nth(4)
        .map_or_else(|| out.join("ring0-hv"), |t| t.join("ring0-hv"));
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let sabotage = env::var("VPMU_RING0_SABOTAGE").is_ok_and(|v| v == "1");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--offline", "--target", RING0_TARGET])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    if sabotage {
        cmd.args(["--features", "sabotage-local-request"]);
    }
    // Nothing of the outer build's configuration applies to this one (coverage flags,
    // wrappers, profiles, target directory).
    for (key, _) in env::vars() {
        if key.starts_with("CARGO_PROFILE_")
            || key.starts_with("CARGO_BUILD_")
            || key.starts_with("CARGO_TARGET_")
            || matches!(
                key.as_str(),
                "RUSTFLAGS" | "RUSTC_WRAPPER" | "RUSTC_WORKSPACE_WRAPPER" | "RUSTDOCFLAGS"
            )
        {
            cmd.env_remove(key);
        }
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", RING0_RUSTFLAGS);
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("error"))
            .take(3)
            .collect();
        return Err(format!(
            "cargo build of {} failed ({}): {}",
            manifest.display(),
            output.status,
            errors.join(" | ")
        ));
    }
    Ok(target_dir
        .join(RING0_TARGET)
        .join("release/libvpmu_ring0_hv.a"))
}

/// Fails the build if the image has an SSE instruction (any XMM/YMM/ZMM operand).
fn check_no_sse(elf: &Path) {
    let out = Command::new("objdump")
        .arg("-d")
        .arg(elf)
        .output()
        .unwrap_or_else(|e| panic!("cannot run objdump on {}: {e}", elf.display()));
    assert!(out.status.success(), "objdump -d {} failed", elf.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let sse: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("%xmm") || l.contains("%ymm") || l.contains("%zmm"))
        .collect();
    assert!(
        sse.is_empty(),
        "{}: {} SSE instructions in the ring-0 guest (KVM's CPL0 emulator here has none), e.g.:\n{}",
        elf.display(),
        sse.len(),
        sse.iter().take(10).copied().collect::<Vec<_>>().join("\n")
    );
}

/// `ring0.elf`: the runtime, `ring0/ring0.c` and the inner hypervisor, or an empty file with a
/// warning if the staticlib cannot be built here.
fn build_ring0(guest: &Path, out: &Path, common: &[PathBuf]) {
    for path in [
        "ring0/ring0.c",
        "ring0/hv/Cargo.toml",
        "ring0/hv/Cargo.lock",
        "ring0/hv/src",
        "../../vpmu/src",
        "../../vpmu/Cargo.toml",
        "../../vendor-intel/src",
        "../../vendor-intel/Cargo.toml",
        "../../vendor-amd/src",
        "../../vendor-amd/Cargo.toml",
        "../../abi/src",
        "../../abi/Cargo.toml",
        "../protocol/src",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-env-changed=VPMU_RING0_SABOTAGE");
    let elf = out.join("ring0.elf");
    let lib = match build_ring0_staticlib(guest, out) {
        Ok(lib) => lib,
        Err(e) => {
            println!(
                "cargo:warning=SKIPPED: the ring-0 guest cannot be built here ({e}); \
                 the ring-0 test will report SKIPPED"
            );
            std::fs::write(&elf, []).expect("write an empty ring0.elf");
            return;
        }
    };
    if env::var("VPMU_RING0_SABOTAGE").is_ok_and(|v| v == "1") {
        println!(
            "cargo:warning=VPMU_RING0_SABOTAGE=1: ring0.elf runs cross-CPU requests on the \
             caller's CPU; the ring-0 test must fail"
        );
    }
    let obj = out.join("ring0_ring0.o");
    compile(&guest.join("ring0/ring0.c"), &obj);
    run(Command::new("ld")
        .args(["-static", "-nostdlib", "--gc-sections", "-T"])
        .arg(guest.join("runtime/link.ld"))
        .arg("-o")
        .arg(&elf)
        .args(common)
        .arg(&obj)
        .arg(&lib));
    check_no_sse(&elf);
}

fn main() {
    let guest = Path::new(&env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let mut header = String::new();
    vpmu_guest_protocol::write_c_header(&mut header).expect("formatting into a String");
    std::fs::write(out.join("guest_protocol.h"), header).expect("write guest_protocol.h");
    for file in [
        "runtime/rt.c",
        "runtime/rt.h",
        "runtime/user.S",
        "runtime/pmu.h",
        "runtime/start.S",
        "runtime/link.ld",
        "profile/profile.h",
        "profile/hostile.h",
    ] {
        println!("cargo:rerun-if-changed={file}");
    }
    let start = out.join("start.o");
    let rt = out.join("rt.o");
    let user = out.join("user.o");
    compile(&guest.join("runtime/start.S"), &start);
    compile(&guest.join("runtime/rt.c"), &rt);
    compile(&guest.join("runtime/user.S"), &user);
    for (name, sources) in PROGRAMS {
        let objs: Vec<PathBuf> = sources
            .iter()
            .map(|src| {
                println!("cargo:rerun-if-changed={src}");
                let obj = out.join(object_name(src));
                compile(&guest.join(src), &obj);
                obj
            })
            .collect();
        let elf = out.join(format!("{name}.elf"));
        run(Command::new("ld")
            .args(["-static", "-nostdlib", "-T"])
            .arg(guest.join("runtime/link.ld"))
            .arg("-o")
            .arg(&elf)
            .arg(&start)
            .arg(&rt)
            .arg(&user)
            .args(&objs));
    }
    let driver = out.join("runtime_driver.o");
    build_ring0(&guest, &out, &[start.clone(), rt.clone(), user.clone()]);
    build_compat(&guest, &out, &[start, rt, user, driver]);
}
