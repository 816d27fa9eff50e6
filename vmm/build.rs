//! Builds the guest programs in `guest/` (freestanding C, 64-bit, CPL0) into static ELF
//! executables in `OUT_DIR`, which `src/guest.rs` embeds with `include_bytes!` and the VMM
//! loads by their program headers. Nothing prebuilt is committed.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest programs: each is `<name>.c` + the runtime (`rt.c`, `start.S`).
const PROGRAMS: &[&str] = &["pmu", "bench"];

const CFLAGS: &[&str] = &[
    "-m64",
    "-ffreestanding",
    "-nostdlib",
    "-fno-pic",
    "-static",
    "-mgeneral-regs-only",
    "-mno-red-zone",
    "-O2",
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

fn compile(src: &Path, obj: &Path) {
    run(Command::new("gcc")
        .args(CFLAGS)
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(obj));
}

fn main() {
    let guest = Path::new(&env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("guest");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    for file in ["rt.c", "rt.h", "start.S", "link.ld"] {
        println!("cargo:rerun-if-changed=guest/{file}");
    }
    let start = out.join("start.o");
    let rt = out.join("rt.o");
    compile(&guest.join("start.S"), &start);
    compile(&guest.join("rt.c"), &rt);
    for name in PROGRAMS {
        println!("cargo:rerun-if-changed=guest/{name}.c");
        let obj = out.join(format!("{name}.o"));
        let elf = out.join(format!("{name}.elf"));
        compile(&guest.join(format!("{name}.c")), &obj);
        run(Command::new("ld")
            .args(["-static", "-nostdlib", "-T"])
            .arg(guest.join("link.ld"))
            .arg("-o")
            .arg(&elf)
            .arg(&start)
            .arg(&rt)
            .arg(&obj));
    }
}
