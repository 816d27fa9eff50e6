//! Committed corpora of generated binary files (`tests/corpus/...`): read them back, and check
//! them against their generator or rewrite them (`VPMU_BLESS=1`).

use std::path::Path;

/// The committed `.bin` files of `dir`, by name, in name order.
///
/// # Panics
/// If `dir` cannot be read (`VPMU_BLESS=1` writes it).
pub fn committed(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e} (run with VPMU_BLESS=1 to write it)", dir.display()))
        .map(|entry| {
            let path = entry.expect("dir entry").path();
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&path).expect("read a corpus file"))
        })
        .filter(|(name, _)| name.ends_with(".bin"))
        .collect();
    files.sort();
    files
}

/// Asserts that `dir` holds exactly `generated` (names without `.bin`), after rewriting it
/// from them when `VPMU_BLESS` is set; `test` names the test that blesses it.
///
/// # Panics
/// If the committed files differ from the generated ones.
pub fn check_or_bless(dir: &Path, generated: Vec<(String, Vec<u8>)>, test: &str) {
    if std::env::var_os("VPMU_BLESS").is_some() {
        std::fs::create_dir_all(dir).expect("create the corpus directory");
        for (name, _) in committed(dir) {
            std::fs::remove_file(dir.join(name)).expect("remove an old file");
        }
        for (name, bytes) in &generated {
            std::fs::write(dir.join(format!("{name}.bin")), bytes).expect("write");
        }
    }
    let expected: Vec<(String, Vec<u8>)> = generated
        .into_iter()
        .map(|(name, bytes)| (format!("{name}.bin"), bytes))
        .collect();
    assert!(
        committed(dir) == expected,
        "{} differs from the generator: run `VPMU_BLESS=1 cargo test -p vpmu-tests --test \
         {test}` and commit the files",
        dir.display()
    );
}
