//! Turning a raw profile into a coverage report with LLVM's own tools.
//!
//! `llvm-profdata` merges the raw profile into an indexed one and `llvm-cov` maps it onto the
//! instrumented binary's coverage mapping. Both must understand raw profile version 10, which
//! LLVM 19 and newer do; Debian's unversioned `llvm-profdata` may be much older (LLVM 14 on
//! Debian 12, which refuses the file), so the versioned names are tried first and every
//! candidate's `--version` is checked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The oldest LLVM whose tools read raw profile version 10.
const MIN_LLVM_MAJOR: u32 = 19;
/// Versioned tool suffixes to try, newest first: a newer LLVM reads older raw versions.
const VERSIONED: [u32; 4] = [22, 21, 20, 19];

/// A compatible pair of LLVM tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    /// Path of `llvm-profdata` (merges `.profraw` into `.profdata`).
    pub profdata: PathBuf,
    /// Path of the `llvm-cov` of the same LLVM release.
    pub cov: PathBuf,
    /// Their LLVM major version.
    pub major: u32,
}

/// Covered and total counts of one kind of coverage item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    /// Items executed at least once.
    pub covered: u64,
    /// All items.
    pub total: u64,
}

/// Coverage totals over the selected source files, as `llvm-cov export` computes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Code regions.
    pub regions: Count,
    /// Functions (each generic function counts once, however many instantiations it has).
    pub functions: Count,
    /// Source lines.
    pub lines: Count,
}

/// The result of [`report`].
#[derive(Debug, Clone)]
pub struct Report {
    /// `llvm-cov report`'s per-file table for the selected sources, followed by whatever the
    /// tools printed on stderr although they succeeded (for example functions whose profile
    /// does not match the binary), so that it is not lost.
    pub summary_text: String,
    /// The lcov export of the selected sources (`out_dir/coverage.lcov`).
    pub lcov_path: PathBuf,
    /// `llvm-cov show -format=html`'s index page (line by line, per source file).
    pub html_index: PathBuf,
    /// Demangled names (with their file and line) of the selected sources' functions that no
    /// instantiation executed, sorted.
    pub uncovered_functions: Vec<String>,
    /// Region, function and line totals of the selected sources.
    pub totals: Totals,
}

/// Why the LLVM tools could not be found or did not produce a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlvmError {
    /// No usable `llvm-profdata`/`llvm-cov` pair: every candidate and why it was unusable.
    #[error(
        "no llvm-profdata/llvm-cov pair that reads raw profile version 10 (LLVM \
         {MIN_LLVM_MAJOR} or newer) was found ({}). Install one: `apt-get install llvm-22` \
         (or `apt-get install llvm-19` on Debian 12), which provides llvm-profdata-N and \
         llvm-cov-N",
        .tried.join("; ")
    )]
    NoTools {
        /// Each candidate and why it was unusable.
        tried: Vec<String>,
    },
    /// A tool could not be started.
    #[error("cannot run {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// What spawning it said.
        #[source]
        source: std::io::Error,
    },
    /// A tool failed.
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its standard error.
        stderr: String,
    },
    /// `--version` reported no LLVM version.
    #[error(
        "`{} --version` does not report an LLVM version (an LLVM older than {MIN_LLVM_MAJOR}?)",
        .0.display()
    )]
    NoVersion(PathBuf),
    /// `llvm-cov export` printed something that is not JSON.
    #[error("llvm-cov export printed invalid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    /// `llvm-cov export`'s JSON lacks its data object.
    #[error("llvm-cov export's JSON has no data[0]")]
    NoData,
    /// None of the binary's sources is one of the selected ones.
    #[error("no source file of {}'s coverage mapping matches {filter:?}", binary.display())]
    NoSources {
        /// The binary.
        binary: PathBuf,
        /// The selection.
        filter: Vec<String>,
    },
    /// The output directory could not be made.
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// What creating it said.
        #[source]
        source: std::io::Error,
    },
    /// An output could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What writing it said.
        #[source]
        source: std::io::Error,
    },
}

/// Finds an `llvm-profdata` that reads raw profile version 10 and the `llvm-cov` of the same
/// release. The error lists every candidate and why it was unusable, and how to install one.
pub fn find_tools() -> Result<Tools, LlvmError> {
    let mut tried = Vec::new();
    let candidates = VERSIONED
        .iter()
        .map(|v| (format!("llvm-profdata-{v}"), format!("llvm-cov-{v}")))
        .chain([("llvm-profdata".to_string(), "llvm-cov".to_string())]);
    for (profdata_name, cov_name) in candidates {
        let Some(profdata) = find_in_path(&profdata_name) else {
            tried.push(format!("{profdata_name}: not installed"));
            continue;
        };
        let major = match llvm_major(&profdata) {
            Ok(m) if m >= MIN_LLVM_MAJOR => m,
            Ok(m) => {
                tried.push(format!(
                    "{profdata_name}: LLVM {m}, too old (raw profile version 10 needs LLVM \
                     {MIN_LLVM_MAJOR} or newer)"
                ));
                continue;
            }
            Err(e) => {
                tried.push(format!("{profdata_name}: {e}"));
                continue;
            }
        };
        let Some(cov) = find_in_path(&cov_name) else {
            tried.push(format!(
                "{profdata_name} is LLVM {major} but {cov_name} is not installed"
            ));
            continue;
        };
        match llvm_major(&cov) {
            Ok(m) if m == major => {
                return Ok(Tools {
                    profdata,
                    cov,
                    major,
                });
            }
            Ok(m) => tried.push(format!(
                "{profdata_name} is LLVM {major} but {cov_name} is LLVM {m}"
            )),
            Err(e) => tried.push(format!("{cov_name}: {e}")),
        }
    }
    Err(LlvmError::NoTools { tried })
}

/// Looks `name` up in `PATH` as the shell would, without running anything.
fn find_in_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Runs `tool --version` and extracts the LLVM major version.
fn llvm_major(tool: &Path) -> Result<u32, LlvmError> {
    let out = Command::new(tool)
        .arg("--version")
        .output()
        .map_err(|source| LlvmError::Spawn {
            command: tool.display().to_string(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    // LLVM 14's llvm-profdata has no --version at all (it fails): that is also "too old".
    parse_llvm_major(&text).ok_or_else(|| LlvmError::NoVersion(tool.to_path_buf()))
}

/// Finds the major version in `--version` output such as "Debian LLVM version 22.1.8".
fn parse_llvm_major(text: &str) -> Option<u32> {
    let rest = &text[text.find("LLVM version ")? + "LLVM version ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Runs a tool, returning its stdout, or an error with its stderr when it fails.
fn run(cmd: &mut Command) -> Result<(Vec<u8>, String), LlvmError> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| LlvmError::Spawn {
        command: shown.clone(),
        source,
    })?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if !out.status.success() {
        return Err(LlvmError::Failed {
            command: shown,
            status: out.status,
            stderr,
        });
    }
    Ok((out.stdout, stderr))
}

/// Merges `profraw` into `out_dir/<stem>.profdata` with `llvm-profdata merge -sparse`.
pub fn merge(tools: &Tools, profraw: &Path, out_dir: &Path) -> Result<PathBuf, LlvmError> {
    std::fs::create_dir_all(out_dir).map_err(|source| LlvmError::CreateDir {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let stem = profraw
        .file_stem()
        .map_or_else(|| "coverage".into(), |s| s.to_string_lossy().into_owned());
    let profdata = out_dir.join(format!("{stem}.profdata"));
    run(Command::new(&tools.profdata)
        .args(["merge", "-sparse", "-o"])
        .arg(&profdata)
        .arg(profraw))?;
    Ok(profdata)
}

/// Produces the coverage report of `binary` (the instrumented ELF the profile came from),
/// restricted to the source files whose path contains one of `sources_filter` (for example
/// `"/vpmu/src/"`): merges the profile into `out_dir`, writes `out_dir/coverage.lcov` and an
/// HTML report in `out_dir/html/`, and
/// collects `llvm-cov report`'s table, the totals and the functions never executed.
pub fn report(
    tools: &Tools,
    profraw: &Path,
    binary: &Path,
    out_dir: &Path,
    sources_filter: &[&str],
) -> Result<Report, LlvmError> {
    let profdata = merge(tools, profraw, out_dir)?;
    let cov = |sub: &str| {
        let mut c = Command::new(&tools.cov);
        c.arg(sub).arg("--instr-profile").arg(&profdata).arg(binary);
        c
    };
    let mut warnings = Vec::new();

    // Every source file of the coverage mapping, to pick those of the filter: llvm-cov
    // restricts its output to the files named after the binary.
    let (listing, stderr) = run(cov("export").args(["-format=text", "-summary-only"]))?;
    warnings.push(stderr);
    let listing: Value = serde_json::from_slice(&listing).map_err(LlvmError::InvalidJson)?;
    let sources: Vec<String> = export_data(&listing)?
        .get("files")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.get("filename")?.as_str())
        .filter(|name| sources_filter.iter().any(|s| name.contains(s)))
        .map(str::to_string)
        .collect();
    if sources.is_empty() {
        return Err(LlvmError::NoSources {
            binary: binary.to_path_buf(),
            filter: sources_filter.iter().map(|s| s.to_string()).collect(),
        });
    }

    let (table, stderr) = run(cov("report").args(&sources))?;
    warnings.push(stderr);
    let (lcov, stderr) = run(cov("export").arg("-format=lcov").args(&sources))?;
    warnings.push(stderr);
    let lcov_path = out_dir.join("coverage.lcov");
    std::fs::write(&lcov_path, lcov).map_err(|source| LlvmError::Write {
        path: lcov_path.clone(),
        source,
    })?;
    let html_dir = out_dir.join("html");
    let (_, stderr) = run(cov("show")
        .arg("-format=html")
        .arg(format!("-output-dir={}", html_dir.display()))
        .args(&sources))?;
    warnings.push(stderr);
    let (full, stderr) = run(cov("export").arg("-format=text").args(&sources))?;
    warnings.push(stderr);
    let full: Value = serde_json::from_slice(&full).map_err(LlvmError::InvalidJson)?;
    let data = export_data(&full)?;

    let mut summary_text = String::from_utf8_lossy(&table).into_owned();
    warnings.retain(|w| !w.is_empty());
    if !warnings.is_empty() {
        summary_text.push_str("\nllvm-cov warnings:\n");
        summary_text.push_str(&warnings.join("\n"));
        summary_text.push('\n');
    }
    Ok(Report {
        summary_text,
        lcov_path,
        html_index: html_dir.join("index.html"),
        uncovered_functions: uncovered_functions(data, &sources),
        totals: totals(data),
    })
}

/// The single export object of `llvm-cov export -format=text` output.
fn export_data(export: &Value) -> Result<&Value, LlvmError> {
    export
        .get("data")
        .and_then(|d| d.get(0))
        .ok_or(LlvmError::NoData)
}

/// Totals from an export object; absent fields count as zero.
fn totals(data: &Value) -> Totals {
    let count = |kind: &str| {
        let field = |name: &str| {
            data.pointer(&format!("/totals/{kind}/{name}"))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        Count {
            covered: field("covered"),
            total: field("count"),
        }
    };
    Totals {
        regions: count("regions"),
        functions: count("functions"),
        lines: count("lines"),
    }
}

/// Functions of `sources` that never ran. The export lists each instantiation of a generic
/// function separately (including never-used placeholder ones), so records are grouped by
/// where the function starts (file, line, column) and a function is uncovered only when no
/// record of its group ran.
fn uncovered_functions(data: &Value, sources: &[String]) -> Vec<String> {
    // (file, line, column) -> (executed, demangled name of the first record).
    let mut by_start: BTreeMap<(String, u64, u64), (bool, String)> = BTreeMap::new();
    for f in data
        .get("functions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(file) = f.pointer("/filenames/0").and_then(Value::as_str) else {
            continue;
        };
        if !sources.iter().any(|s| s == file) {
            continue;
        }
        let line = f
            .pointer("/regions/0/0")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let column = f
            .pointer("/regions/0/1")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let executed = f.get("count").and_then(Value::as_u64).unwrap_or(0) > 0;
        let name = demangle(f.get("name").and_then(Value::as_str).unwrap_or("?"));
        let entry = by_start
            .entry((file.to_string(), line, column))
            .or_insert((false, name));
        entry.0 |= executed;
    }
    by_start
        .into_iter()
        .filter(|(_, (executed, _))| !executed)
        .map(|((file, line, _), (_, name))| format!("{name} ({file}:{line})"))
        .collect()
}

/// Demangles a function's PGO name. A local function's PGO name may carry a "file:" or
/// "file;" prefix; Rust symbol names contain neither character, so the part after the last
/// one is the symbol. Names that are not Rust symbols (C functions) are returned as they are.
fn demangle(pgo_name: &str) -> String {
    let symbol = pgo_name.rsplit([':', ';']).next().unwrap_or(pgo_name);
    match rustc_demangle::try_demangle(symbol) {
        // `{:#}` leaves out the crate disambiguator hashes, which only add noise here.
        Ok(d) => format!("{d:#}"),
        Err(_) => pgo_name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests-data/minicov-v10.profraw"
    );

    fn scratch_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("vpmu-llvm-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn find_tools_finds_llvm_19_or_newer_or_says_how_to_install() {
        match find_tools() {
            Ok(tools) => {
                assert!(tools.major >= MIN_LLVM_MAJOR, "{tools:?}");
                assert!(tools.profdata.is_file() && tools.cov.is_file(), "{tools:?}");
            }
            Err(e) => {
                eprintln!("SKIPPED (no LLVM tools): {e}");
                assert!(matches!(e, LlvmError::NoTools { .. }), "{e:?}");
                let e = e.to_string();
                assert!(e.contains("apt-get install llvm-22"), "{e}");
                assert!(e.contains("llvm-profdata-22"), "{e}");
            }
        }
    }

    #[test]
    fn llvm_version_is_parsed() {
        assert_eq!(
            parse_llvm_major("Debian LLVM version 22.1.8\n  Optimized build.\n"),
            Some(22)
        );
        assert_eq!(
            parse_llvm_major("LLVM (http://llvm.org/):\n  LLVM version 19.1.7\n"),
            Some(19)
        );
        assert_eq!(parse_llvm_major("llvm-profdata: Unknown command!"), None);
        assert_eq!(parse_llvm_major("LLVM version x"), None);
    }

    #[test]
    fn rust_names_are_demangled_and_others_kept() {
        assert_eq!(
            demangle("_RNvCs9595tYLkWsW_7covdemo8classify"),
            "covdemo::classify"
        );
        assert_eq!(
            demangle("src/lib.rs;_RNvCs9595tYLkWsW_7covdemo8classify"),
            "covdemo::classify"
        );
        assert_eq!(demangle("minicov_dealloc"), "minicov_dealloc");
    }

    #[test]
    fn uncovered_functions_group_instantiations() {
        let data = serde_json::json!({
            "functions": [
                // Two instantiations of one generic function: one ran, so it is covered.
                {"name": "_RNvCs9595tYLkWsW_7covdemo8classify", "count": 0,
                 "filenames": ["/w/vpmu/src/a.rs"], "regions": [[10, 1, 12, 2, 0, 0, 0, 0]]},
                {"name": "_RNvCs9595tYLkWsW_7covdemo8classify", "count": 3,
                 "filenames": ["/w/vpmu/src/a.rs"], "regions": [[10, 1, 12, 2, 3, 0, 0, 0]]},
                {"name": "_RNvCs9595tYLkWsW_7covdemo12never_called", "count": 0,
                 "filenames": ["/w/vpmu/src/a.rs"], "regions": [[21, 1, 21, 31, 0, 0, 0, 0]]},
                // Not a selected source.
                {"name": "minicov_dealloc", "count": 0,
                 "filenames": ["/r/minicov/src/lib.rs"], "regions": [[1, 1, 2, 2, 0, 0, 0, 0]]},
                // Malformed records are skipped, not fatal.
                {"name": 5},
            ],
            "totals": {"regions": {"count": 9, "covered": 4}, "lines": {"count": 7, "covered": 5}},
        });
        let sources = ["/w/vpmu/src/a.rs".to_string()];
        assert_eq!(
            uncovered_functions(&data, &sources),
            ["covdemo::never_called (/w/vpmu/src/a.rs:21)"]
        );
        let t = totals(&data);
        assert_eq!(
            (t.regions, t.functions, t.lines),
            (
                Count {
                    covered: 4,
                    total: 9
                },
                Count::default(),
                Count {
                    covered: 5,
                    total: 7
                }
            )
        );
    }

    #[test]
    fn profdata_merge_accepts_the_minicov_fixture() {
        let tools = match find_tools() {
            Ok(t) => t,
            Err(e) => {
                eprintln!("SKIPPED: llvm-profdata merge of the fixture not tested: {e}");
                return;
            }
        };
        let dir = scratch_dir("merge");
        let profdata = merge(&tools, Path::new(FIXTURE), &dir).unwrap();
        assert!(std::fs::metadata(&profdata).unwrap().len() > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The full report on the scratch program the fixture came from, when it is around
    /// (`/tmp/covscratch`, see the fixture's note in profraw.rs); the ELF is too large to keep.
    #[test]
    fn report_on_scratch_binary_if_present() {
        let binary = Path::new("/tmp/covscratch/target/release/covdemo");
        let (Ok(tools), true) = (find_tools(), binary.is_file()) else {
            eprintln!("SKIPPED: no LLVM tools or no /tmp/covscratch build");
            return;
        };
        let dir = scratch_dir("report");
        let r = report(
            &tools,
            Path::new(FIXTURE),
            binary,
            &dir,
            &["/covdemo/", "/demo/src/"],
        )
        .unwrap();
        assert!(r.summary_text.contains("main.rs"), "{}", r.summary_text);
        let lcov = std::fs::read_to_string(&r.lcov_path).unwrap();
        assert_eq!(lcov.matches("SF:").count(), 1, "{lcov}");
        assert!(
            lcov.contains("SF:/tmp/covscratch/demo/src/main.rs"),
            "{lcov}"
        );
        assert_eq!(
            r.uncovered_functions
                .iter()
                .map(|f| f.split(' ').next().unwrap())
                .collect::<Vec<_>>(),
            ["covdemo::never_called", "covdemo::main::{closure#0}"]
        );
        assert_eq!(
            r.totals.functions,
            Count {
                covered: 3,
                total: 5
            }
        );
        assert!(r.totals.regions.covered > 0 && r.totals.lines.covered > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
