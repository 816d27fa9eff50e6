//! The C helpers of `xenpmu.h` refuse exactly what the Rust view refuses: one committed corpus
//! of corrupted pages (`tests/corpus/pages/*.bin`, generated here deterministically), read by a
//! C consumer (`tests/c/verdict.c`, gcc at -m32 and -m64) and by `PageView`, must give the same
//! verdict line for line: the `XENPMU_CHECK_*` code and errno of every check, every field every
//! getter returns at indices inside, at and past each bank, the return code of every setter,
//! and the bytes of the page after the setters.
//!
//! The corpus covers each `AbiError` kind (bad magic, major, defined size, wrong vendor, a bank
//! out of bounds in each way, overlapping banks, indices past a bank), the version-dependent
//! parts (sample details before 1.2, the flush refusal report before 1.3), call chains longer
//! than the page allows, and pseudo-random geometry. `VPMU_BLESS=1` rewrites the committed
//! files after a change to the generator.

use std::fmt::Write as _;
use std::path::PathBuf;

use vpmu_abi::{
    AbiError, CounterPair, FlushRefusal, Page, PageView, PageViewMut, XENPMU_CHECK_BAD_MAGIC,
    XENPMU_CHECK_MAJOR_MISMATCH, XENPMU_EINVAL, XENPMU_EPROTONOSUPPORT, XENPMU_REFUSED_WIDTH,
    XENPMU_VENDOR_AMD, XENPMU_VENDOR_INTEL,
};
use vpmu_tests::c_build::{WIDTHS, compile, run, workspace_root};
use vpmu_tests::pattern_page::{Vendor, pattern_page};
use zerocopy::{FromBytes, IntoBytes};

const CORPUS: &str = "tests/corpus/pages";
/// Indices probed in every bank (as `verdict.c`'s `INDICES`).
const INDICES: [u32; 11] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, u32::MAX];

fn base(vendor: Vendor) -> Page {
    let mut page = pattern_page(vendor);
    page.flush_refusal = FlushRefusal {
        msr: 0x309 + 2,
        reason: XENPMU_REFUSED_WIDTH,
        value: 0u64.wrapping_sub(1000),
    };
    page
}

fn intel_geometry(fixed_at: u32, fixed: u32, arch_at: u32, arch: u32) -> Page {
    let mut page = base(Vendor::Intel);
    let mut ctxt = page.vendor.intel_ctxt();
    (ctxt.fixed_counters, ctxt.fixed_count) = (fixed_at, fixed);
    (ctxt.arch_counters, ctxt.arch_count) = (arch_at, arch);
    page.vendor.set_intel_ctxt(&ctxt);
    page
}

fn amd_geometry(counters_at: u32, ctrls_at: u32, count: u32) -> Page {
    let mut page = base(Vendor::Amd);
    let mut ctxt = page.vendor.amd_ctxt();
    (ctxt.counters, ctxt.ctrls, ctxt.counter_count) = (counters_at, ctrls_at, count);
    page.vendor.set_amd_ctxt(&ctxt);
    page
}

fn edited(vendor: Vendor, edit: impl FnOnce(&mut Page)) -> Page {
    let mut page = base(vendor);
    edit(&mut page);
    page
}

/// xorshift64*: the corpus must be the same on every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A page of pseudo-random words with a valid header for `vendor` and geometry words drawn
/// near the valid ranges, so that some pass and some fail each check.
fn random_page(seed: u64, vendor: u32) -> Page {
    let mut state = seed;
    let words: Vec<u64> = (0..512).map(|_| next(&mut state)).collect();
    let mut page = Page::read_from_bytes(words.as_bytes()).expect("one page");
    page.header = base(Vendor::Intel).header;
    page.header.vendor = vendor;
    let mut small = |range: u64| (next(&mut state) % range) as u32;
    let mut ctxt = page.vendor.intel_ctxt();
    ctxt.fixed_counters = 8 * small(140);
    ctxt.arch_counters = 8 * small(140) + small(2) * 4;
    ctxt.fixed_count = small(12);
    ctxt.arch_count = small(70);
    page.vendor.set_intel_ctxt(&ctxt);
    page
}

/// The corpus: named pages, every one of which some check of the view may refuse.
fn corpus() -> Vec<(String, Page)> {
    let mut pages: Vec<(&str, Page)> = vec![
        ("intel-valid", base(Vendor::Intel)),
        ("amd-valid", base(Vendor::Amd)),
        ("zero", Page::zeroed()),
        (
            "bad-magic",
            edited(Vendor::Intel, |p| p.header.magic = 0x1234_5678),
        ),
        (
            "bad-magic-and-major",
            edited(Vendor::Amd, |p| {
                p.header.magic = 0x5850_4d55;
                p.header.version_major = 2;
            }),
        ),
        (
            "major-0",
            edited(Vendor::Intel, |p| p.header.version_major = 0),
        ),
        (
            "major-2",
            edited(Vendor::Amd, |p| p.header.version_major = 2),
        ),
        (
            "major-and-size",
            edited(Vendor::Intel, |p| {
                p.header.version_major = u16::MAX;
                p.header.defined_size = 3;
            }),
        ),
        (
            "size-0",
            edited(Vendor::Intel, |p| p.header.defined_size = 0),
        ),
        (
            "size-1272",
            edited(Vendor::Amd, |p| p.header.defined_size = 1272),
        ),
        (
            "size-1284",
            edited(Vendor::Intel, |p| p.header.defined_size = 1284),
        ),
        (
            "size-4104",
            edited(Vendor::Amd, |p| p.header.defined_size = 4104),
        ),
        (
            "size-max",
            edited(Vendor::Intel, |p| p.header.defined_size = u32::MAX),
        ),
        (
            "size-1280",
            edited(Vendor::Intel, |p| p.header.defined_size = 1280),
        ),
        (
            "size-4096",
            edited(Vendor::Amd, |p| p.header.defined_size = 4096),
        ),
        (
            "minor-7-size-2048",
            edited(Vendor::Intel, |p| {
                p.header.version_minor = 7;
                p.header.defined_size = 2048;
            }),
        ),
        (
            "minor-2",
            edited(Vendor::Intel, |p| p.header.version_minor = 2),
        ),
        (
            "minor-0-size-1280",
            edited(Vendor::Amd, |p| {
                p.header.version_minor = 0;
                p.header.defined_size = 1280;
            }),
        ),
        (
            "vendor-none",
            edited(Vendor::Intel, |p| p.header.vendor = 0),
        ),
        ("vendor-3", edited(Vendor::Amd, |p| p.header.vendor = 3)),
        (
            "vendor-intel-on-amd-page",
            edited(Vendor::Amd, |p| p.header.vendor = XENPMU_VENDOR_INTEL),
        ),
        (
            "vendor-amd-on-intel-page",
            edited(Vendor::Intel, |p| p.header.vendor = XENPMU_VENDOR_AMD),
        ),
        (
            "chain-65",
            edited(Vendor::Intel, |p| p.sample.chain_len = 65),
        ),
        (
            "chain-max",
            edited(Vendor::Amd, |p| {
                p.sample.chain_len = u32::MAX;
                p.sample.chain_end = 9;
            }),
        ),
        ("intel-fixed-past-end", intel_geometry(1024, 1, 128, 1)),
        ("intel-arch-straddles-end", intel_geometry(64, 1, 1016, 1)),
        ("intel-fixed-in-fixed-part", intel_geometry(8, 1, 128, 1)),
        ("intel-fixed-misaligned", intel_geometry(65, 1, 128, 1)),
        ("intel-arch-misaligned", intel_geometry(64, 1, 84, 1)),
        (
            "intel-fixed-count-max",
            intel_geometry(64, u32::MAX, 128, 1),
        ),
        (
            "intel-fixed-count-overflows-32",
            intel_geometry(64, 0x2000_0001, 128, 1),
        ),
        (
            "intel-arch-count-overflows-32",
            intel_geometry(64, 1, 128, 0x1000_0001),
        ),
        (
            "intel-fixed-offset-max",
            intel_geometry(u32::MAX, 1, 128, 1),
        ),
        (
            "intel-arch-offset-max-empty",
            intel_geometry(64, 1, u32::MAX - 7, 0),
        ),
        ("intel-overlap", intel_geometry(64, 4, 80, 1)),
        ("intel-arch-inside-fixed", intel_geometry(64, 8, 96, 2)),
        ("intel-fixed-inside-arch", intel_geometry(136, 1, 128, 2)),
        ("intel-same-offset", intel_geometry(64, 1, 64, 1)),
        ("intel-touching", intel_geometry(64, 4, 96, 8)),
        ("intel-exact-fill", intel_geometry(64, 0, 64, 60)),
        ("intel-fixed-fills-area", intel_geometry(64, 120, 64, 0)),
        (
            "intel-empty-banks-overlapping",
            intel_geometry(64, 0, 64, 0),
        ),
        ("intel-empty-fixed-at-end", intel_geometry(1024, 0, 64, 1)),
        ("intel-last-word", intel_geometry(1016, 1, 64, 0)),
        ("amd-overlap", amd_geometry(64, 72, 6)),
        ("amd-same-offset", amd_geometry(64, 64, 1)),
        ("amd-same-offset-empty", amd_geometry(64, 64, 0)),
        ("amd-ctrls-past-end", amd_geometry(64, 1016, 2)),
        ("amd-counters-misaligned", amd_geometry(68, 160, 6)),
        ("amd-counters-in-fixed-part", amd_geometry(56, 160, 6)),
        ("amd-count-200", amd_geometry(64, 160, 200)),
        ("amd-count-max", amd_geometry(64, 160, u32::MAX)),
        ("amd-ctrls-below-counters", amd_geometry(160, 64, 6)),
        ("amd-touching", amd_geometry(64, 112, 6)),
    ];
    let mut all: Vec<(String, Page)> = pages
        .drain(..)
        .map(|(name, page)| (name.to_owned(), page))
        .collect();
    for seed in 1..=12u64 {
        let vendor = if seed % 2 == 0 {
            XENPMU_VENDOR_INTEL
        } else {
            XENPMU_VENDOR_AMD
        };
        all.push((format!("random-{seed}"), random_page(seed, vendor)));
    }
    let mut state = 0x5eed;
    let words: Vec<u64> = (0..512).map(|_| next(&mut state)).collect();
    all.push((
        "random-whole".to_owned(),
        Page::read_from_bytes(words.as_bytes()).expect("one page"),
    ));
    all.into_iter()
        .enumerate()
        .map(|(i, (name, page))| (format!("{i:02}-{name}"), page))
        .collect()
}

fn corpus_dir() -> PathBuf {
    workspace_root().join(CORPUS)
}

#[test]
fn the_committed_corpus_is_what_the_generator_produces() {
    let generated = corpus()
        .iter()
        .map(|(name, page)| (name.clone(), page.as_bytes().to_vec()))
        .collect();
    vpmu_tests::blessed::check_or_bless(&corpus_dir(), generated, "c_corpus");
}

/// The errno a C helper returns for a refusal the view reports as `error`.
fn errno(error: &AbiError) -> i32 {
    match error.code() {
        XENPMU_CHECK_BAD_MAGIC | XENPMU_CHECK_MAJOR_MISMATCH => -XENPMU_EPROTONOSUPPORT,
        _ => -XENPMU_EINVAL,
    }
}

fn rc<T>(result: &Result<T, AbiError>) -> i32 {
    result.as_ref().map_or_else(errno, |_| 0)
}

fn verdict(result: &Result<impl Sized, AbiError>) -> u32 {
    result.as_ref().map_or_else(AbiError::code, |_| 0)
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
    })
}

/// What `verdict.c` prints for `page`, computed with the Rust view.
fn rust_verdict(name: &str, page: &Page) -> String {
    let mut out = format!("== {name}\n");
    let view = PageView::new(page);
    let _ = writeln!(out, "page {} {}", verdict(&view), rc(&view));
    match view.as_ref().ok().and_then(PageView::sample_info) {
        None => out.push_str("sample -\n"),
        Some(info) => {
            let chain = info.chain().iter().fold(0u64, |hash, &entry| {
                hash.wrapping_mul(31).wrapping_add(entry)
            });
            let _ = writeln!(
                out,
                "sample {} {} {} {} {} {} {chain}",
                info.tsc,
                info.tsc_khz,
                info.sequence,
                info.overflowed,
                info.chain().len(),
                info.chain_end
            );
        }
    }
    match view.as_ref().ok().and_then(PageView::flush_refusal) {
        None => out.push_str("refusal -\n"),
        Some(r) => {
            let _ = writeln!(out, "refusal {} {} {}", r.msr, r.reason, r.value);
        }
    }

    let intel = view.and_then(|view| view.intel());
    let _ = write!(out, "intel {} {}", verdict(&intel), rc(&intel));
    if let Ok(intel) = &intel {
        let c = intel.ctxt();
        let _ = write!(
            out,
            " {} {} {} {} {} {} {} {} {} {}",
            c.fixed_counters,
            c.arch_counters,
            c.fixed_count,
            c.arch_count,
            c.global_ctrl,
            c.global_status,
            c.global_ovf_ctrl,
            c.fixed_ctrl,
            c.ds_area,
            c.pebs_enable
        );
    }
    out.push('\n');
    for i in INDICES {
        let fixed = intel.and_then(|intel| intel.fixed_counter(i as usize));
        match fixed {
            Ok(value) => writeln!(out, "intel.fixed {i} 0 {value}"),
            Err(e) => writeln!(out, "intel.fixed {i} {}", errno(&e)),
        }
        .expect("write to a string");
        match intel.and_then(|intel| intel.pair(i as usize)) {
            Ok(pair) => writeln!(out, "intel.pair {i} 0 {} {}", pair.counter, pair.control),
            Err(e) => writeln!(out, "intel.pair {i} {}", errno(&e)),
        }
        .expect("write to a string");
    }

    let amd = view.and_then(|view| view.amd());
    let _ = write!(out, "amd {} {}", verdict(&amd), rc(&amd));
    if let Ok(amd) = &amd {
        let c = amd.ctxt();
        let _ = write!(
            out,
            " {} {} {} {} {}",
            c.counters, c.ctrls, c.counter_count, c.global_ctrl, c.global_status
        );
    }
    out.push('\n');
    for i in INDICES {
        match amd.and_then(|amd| amd.counter(i as usize)) {
            Ok(value) => writeln!(out, "amd.counter {i} 0 {value}"),
            Err(e) => writeln!(out, "amd.counter {i} {}", errno(&e)),
        }
        .expect("write to a string");
        match amd.and_then(|amd| amd.ctrl(i as usize)) {
            Ok(value) => writeln!(out, "amd.ctrl {i} 0 {value}"),
            Err(e) => writeln!(out, "amd.ctrl {i} {}", errno(&e)),
        }
        .expect("write to a string");
    }

    // The setters, as `verdict.c`'s `edits`, through PageViewMut.
    let mut copy = page.clone();
    let pair = CounterPair {
        counter: 0x99,
        control: 0xaa,
    };
    let mut codes = Vec::new();
    let intel_edit = |copy: &mut Page,
                      edit: &dyn Fn(
        &mut vpmu_abi::IntelCtxt,
        &vpmu_abi::IntelBanks,
        &mut vpmu_abi::VendorArea,
    ) -> Result<(), AbiError>| {
        let result = PageViewMut::new(copy)
            .and_then(|mut v| v.edit_intel(edit))
            .and_then(|r| r);
        rc(&result)
    };
    codes.push(intel_edit(&mut copy, &|c, _, _| {
        c.global_ctrl = 0x11;
        c.global_status = 0x22;
        c.global_ovf_ctrl = 0x33;
        c.fixed_ctrl = 0x44;
        c.ds_area = 0x55;
        c.pebs_enable = 0x66;
        Ok(())
    }));
    codes.push(intel_edit(&mut copy, &|_, b, a| {
        b.set_fixed_counter(a, 1, 0xbb)
    }));
    codes.push(intel_edit(&mut copy, &|_, b, a| {
        b.set_fixed_counter(a, 4, 0xbc)
    }));
    codes.push(intel_edit(&mut copy, &|_, b, a| b.set_pair(a, 2, pair)));
    codes.push(intel_edit(&mut copy, &|_, b, a| b.set_pair(a, 8, pair)));
    let amd_edit = |copy: &mut Page,
                    edit: &dyn Fn(
        &mut vpmu_abi::AmdCtxt,
        &vpmu_abi::AmdBanks,
        &mut vpmu_abi::VendorArea,
    ) -> Result<(), AbiError>| {
        let result = PageViewMut::new(copy)
            .and_then(|mut v| v.edit_amd(edit))
            .and_then(|r| r);
        rc(&result)
    };
    codes.push(amd_edit(&mut copy, &|c, _, _| {
        c.global_ctrl = 0x77;
        c.global_status = 0x88;
        c._reserved0 = [0; 4];
        Ok(())
    }));
    codes.push(amd_edit(&mut copy, &|_, b, a| b.set_counter(a, 3, 0xcc)));
    codes.push(amd_edit(&mut copy, &|_, b, a| b.set_counter(a, 6, 0xcd)));
    codes.push(amd_edit(&mut copy, &|_, b, a| b.set_ctrl(a, 5, 0xdd)));
    codes.push(amd_edit(&mut copy, &|_, b, a| {
        b.set_ctrl(a, u32::MAX as usize, 0xde)
    }));
    let codes: Vec<String> = codes.iter().map(i32::to_string).collect();
    let _ = writeln!(
        out,
        "edit {} {:016x}",
        codes.join(" "),
        fnv(copy.as_bytes())
    );
    out
}

fn verdict_exe(width: u32) -> PathBuf {
    let source = workspace_root().join("tests/c/verdict.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("verdict_{width}"));
    compile(&source, width, &out)
}

#[test]
fn c_and_rust_give_every_corpus_page_the_same_verdict_at_both_widths() {
    let files = vpmu_tests::blessed::committed(&corpus_dir());
    assert!(
        files.len() >= 50,
        "the corpus is there ({} pages)",
        files.len()
    );
    let dir = corpus_dir();
    let paths: Vec<String> = files
        .iter()
        .map(|(name, _)| dir.join(name).to_string_lossy().into_owned())
        .collect();
    let expected: String = files
        .iter()
        .zip(&paths)
        .map(|((_, bytes), path)| {
            let page = Page::read_from_bytes(bytes).expect("a corpus file is one page");
            rust_verdict(path, &page)
        })
        .collect();
    // Every kind of refusal a check of the view makes occurs (NotAPage is Rust's byte-slice
    // check, IndexOutOfRange an accessor's, both outside the verdicts).
    let codes: std::collections::BTreeSet<u32> = expected
        .lines()
        .filter(|l| l.starts_with("page ") || l.starts_with("intel ") || l.starts_with("amd "))
        .filter_map(|l| l.split(' ').nth(1)?.parse().ok())
        .collect();
    assert_eq!(
        codes,
        (0..=7).filter(|&c| c != 1).collect(),
        "the corpus reaches every verdict"
    );
    let args: Vec<&str> = paths.iter().map(String::as_str).collect();
    for width in WIDTHS {
        let printed = String::from_utf8(run(&verdict_exe(width), &args, b"")).expect("utf-8");
        for (c, rust) in printed.lines().zip(expected.lines()) {
            assert_eq!(
                c, rust,
                "-m{width}: the C helpers and the Rust view disagree"
            );
        }
        assert_eq!(
            printed.lines().count(),
            expected.lines().count(),
            "-m{width}: as many lines"
        );
    }
}
