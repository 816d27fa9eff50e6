//! What the Linux-guest tests share: where the project-built guest is, its kernel command
//! line, the `VPMU-RESULT key=value ...` lines its programs print, and what its kernel log
//! must not say.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;

/// The directory `vmm/linux-guest/build.sh` builds into (`VPMU_LINUX_GUEST_DIR` overrides).
pub fn artifacts() -> PathBuf {
    std::env::var_os("VPMU_LINUX_GUEST_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/linux-guest"),
        PathBuf::from,
    )
}

/// The project-built kernel and the initramfs `initrd` in [`artifacts`], or why a test cannot
/// boot them (its SKIPPED reason).
pub fn kernel_and_initrd(initrd: &str) -> Result<(PathBuf, PathBuf), String> {
    let dir = artifacts();
    let (kernel, initrd) = (dir.join("vmlinux"), dir.join(initrd));
    if let Some(missing) = [&kernel, &initrd].into_iter().find(|f| !f.is_file()) {
        return Err(format!(
            "{} not found (build it with vmm/linux-guest/build.sh, or set VPMU_LINUX_GUEST_DIR)",
            missing.display()
        ));
    }
    Ok((kernel, initrd))
}

/// Kernel-log messages that would be the project's fault (a driver's or the VMM's): no
/// Linux-guest test's kernel log may hold one. The kernel's own forms: `WARNING: CPU: ...`,
/// `BUG: ...` and `kernel BUG at file:line!`, an oops's `Call Trace`.
pub const FORBIDDEN: &[&str] = &[
    "unchecked MSR access",
    "WARNING:",
    "Oops",
    "BUG:",
    "kernel BUG at",
    "Call Trace",
    "general protection fault",
    "Kernel panic",
    "segfault",
];

/// The last `n` lines of `console` (for a failure's message).
pub fn tail(console: &str, n: usize) -> String {
    let lines: Vec<&str> = console.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The kernel command line the project's guest is booted with (the VMM appends what this
/// host needs).
pub fn cmdline() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../linux-guest/cmdline");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// One `VPMU-RESULT key=value ...` line as a map.
pub fn fields(line: &str) -> HashMap<&str, &str> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

/// The `VPMU-RESULT` lines whose fields include every (key, value) of `want`.
pub fn results<'a>(console: &'a str, want: &[(&str, &str)]) -> Vec<HashMap<&'a str, &'a str>> {
    console
        .lines()
        .filter_map(|l| l.find("VPMU-RESULT ").map(|at| &l[at..]))
        .map(fields)
        .filter(|f| want.iter().all(|(k, v)| f.get(k) == Some(v)))
        .collect()
}

/// Field `key` of a result line as a number; panics naming the line if it has none.
pub fn number<T: FromStr>(f: &HashMap<&str, &str>, key: &str) -> T {
    f.get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {f:?}"))
}
