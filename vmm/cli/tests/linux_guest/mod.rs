//! What the Linux-guest tests share: where the project-built guest is, its kernel command
//! line, and the `VPMU-RESULT key=value ...` lines its programs print.

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
