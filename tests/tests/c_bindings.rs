//! The generated C header against the Rust ABI: freshness, layout at -m32 and -m64 as gcc
//! computes it, and pages and parameter blocks exchanged in both directions at both widths.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::OnceLock;

use vpmu_abi::layout::STRUCTS;
use vpmu_abi::{Page, PageView, Params, XENPMU_FLAG_CACHED, XENPMU_FLAG_SAMPLE_USER};
use vpmu_tests::c_build::{WIDTHS, compile, run, workspace_root};
use vpmu_tests::pattern_page::{
    AMD_COUNTERS, INTEL_FIXED, INTEL_GP, Vendor, pattern, pattern_identity, pattern_page,
    pattern_params, pattern_regs,
};
use zerocopy::{FromBytes, IntoBytes};

fn scratch(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

#[test]
fn committed_header_is_what_the_generator_produces() {
    let generated = vpmu_abi_header::generate().expect("generate header");
    let path = workspace_root().join(vpmu_abi_header::HEADER_PATH);
    let committed = std::fs::read_to_string(&path).expect("read committed header");
    assert!(
        committed == generated,
        "{} is stale: run `cargo run -p vpmu-abi-header` and commit the result",
        path.display()
    );
}

/// A C program that prints every struct's size and every field's offset and size, in the same
/// text form as `rust_layout_text`.
fn layout_probe_source() -> String {
    let mut src = String::from("#include <stdio.h>\n#include \"xenpmu.h\"\nint main(void)\n{\n");
    for layout in STRUCTS {
        let c = layout.c_name;
        let _ = writeln!(src, "    printf(\"{c} %u\\n\", (unsigned)sizeof({c}));");
        for field in layout.fields {
            let f = field.name;
            let _ = writeln!(
                src,
                "    printf(\"{c}.{f} %u %u\\n\", (unsigned)offsetof({c}, {f}), (unsigned)sizeof((({c} *)0)->{f}));"
            );
        }
    }
    src.push_str("    return 0;\n}\n");
    src
}

fn rust_layout_text() -> String {
    let mut text = String::new();
    for layout in STRUCTS {
        let _ = writeln!(text, "{} {}", layout.c_name, layout.size);
        for field in layout.fields {
            let _ = writeln!(
                text,
                "{}.{} {} {}",
                layout.c_name, field.name, field.offset, field.size
            );
        }
    }
    text
}

#[test]
fn gcc_lays_out_every_struct_as_rust_does_at_m32_and_m64() {
    let source = scratch("layout_probe.c");
    std::fs::write(&source, layout_probe_source()).expect("write probe");
    let expected = rust_layout_text();
    for width in WIDTHS {
        let exe = compile(&source, width, &scratch(&format!("layout_probe_{width}")));
        let printed = String::from_utf8(run(&exe, &[], b"")).expect("utf-8");
        assert_eq!(
            printed, expected,
            "gcc -m{width} layout differs from Rust's"
        );
    }
}

/// A consumer may include the header from several of its own headers: every part of it,
/// the helpers and assertions after cbindgen's guard included, is guarded.
#[test]
fn the_header_can_be_included_twice() {
    let source = scratch("twice.c");
    std::fs::write(
        &source,
        "#include \"xenpmu.h\"\n#include \"xenpmu.h\"\n\
         /* exits 0: a zeroed page must fail the header check */\n\
         int main(void) { xenpmu_page p = {0}; return xenpmu_page_check(&p) == 0; }\n",
    )
    .expect("write source");
    for width in WIDTHS {
        let exe = compile(&source, width, &scratch(&format!("twice_{width}")));
        run(&exe, &[], b"");
    }
}

/// The round-trip program at `width`, compiled once per test process: tests run in parallel
/// and must not rewrite an executable another test is running.
fn roundtrip_exe(width: u32) -> PathBuf {
    static BUILT: OnceLock<Vec<(u32, PathBuf)>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let source = workspace_root().join("tests/c/roundtrip.c");
        WIDTHS
            .iter()
            .map(|&w| (w, compile(&source, w, &scratch(&format!("roundtrip_{w}")))))
            .collect()
    });
    built
        .iter()
        .find(|(w, _)| *w == width)
        .map(|(_, path)| path.clone())
        .expect("a built width")
}

fn check_pattern_view(view: &PageView<'_>, vendor: Vendor) {
    assert_eq!(view.identity(), pattern_identity());
    assert_eq!(view.regs(), pattern_regs());
    assert_eq!(view.flags(), XENPMU_FLAG_CACHED | XENPMU_FLAG_SAMPLE_USER);
    assert_eq!(view.dropped_samples(), pattern(50));
    assert!(view.is_cached() && view.sample_is_user() && !view.sample_is_real_mode());
    match vendor {
        Vendor::Intel => {
            let intel = view.intel().expect("intel context");
            assert_eq!(intel.ctxt().global_ctrl, pattern(100));
            assert_eq!(intel.ctxt().pebs_enable, pattern(105));
            for i in 0..INTEL_FIXED {
                assert_eq!(intel.fixed_counter(i as usize), Ok(pattern(200 + i)));
            }
            for i in 0..INTEL_GP {
                let pair = intel.pair(i as usize).expect("pair");
                assert_eq!(
                    (pair.counter, pair.control),
                    (pattern(300 + 2 * i), pattern(301 + 2 * i))
                );
            }
            assert!(intel.pair(INTEL_GP as usize).is_err());
            assert!(view.amd().is_err());
        }
        Vendor::Amd => {
            let amd = view.amd().expect("amd context");
            assert_eq!(amd.ctxt().global_status, pattern(101));
            for i in 0..AMD_COUNTERS {
                assert_eq!(amd.counter(i as usize), Ok(pattern(200 + i)));
                assert_eq!(amd.ctrl(i as usize), Ok(pattern(300 + i)));
            }
            assert!(amd.counter(AMD_COUNTERS as usize).is_err());
            assert!(view.intel().is_err());
        }
    }
}

#[test]
fn pages_written_in_c_read_back_in_rust_at_both_widths() {
    for width in WIDTHS {
        let exe = roundtrip_exe(width);
        for vendor in [Vendor::Intel, Vendor::Amd] {
            let bytes = run(&exe, &[&format!("fill-{}", vendor.c_name())], b"");
            let expected = pattern_page(vendor);
            assert!(
                bytes == expected.as_bytes(),
                "-m{width} {vendor:?}: C page differs from Rust's byte for byte"
            );
            let page = Page::read_from_bytes(&bytes).expect("one page");
            let view = PageView::new(&page).expect("valid header");
            check_pattern_view(&view, vendor);
        }
    }
}

#[test]
fn pages_written_in_rust_read_back_in_c_at_both_widths() {
    for width in WIDTHS {
        let exe = roundtrip_exe(width);
        for vendor in [Vendor::Intel, Vendor::Amd] {
            let page = pattern_page(vendor);
            let out = run(
                &exe,
                &[&format!("check-{}", vendor.c_name())],
                page.as_bytes(),
            );
            assert_eq!(out, b"ok\n", "-m{width} {vendor:?}");
        }
    }
}

#[test]
fn params_cross_in_both_directions_at_both_widths() {
    for width in WIDTHS {
        let exe = roundtrip_exe(width);
        let from_c = run(&exe, &["fill-params"], b"");
        let params = Params::read_from_bytes(&from_c).expect("24 bytes");
        assert_eq!(params, pattern_params(), "-m{width}");
        let out = run(&exe, &["check-params"], pattern_params().as_bytes());
        assert_eq!(out, b"ok\n", "-m{width}");
    }
}

#[test]
fn docs_abi_md_carries_the_current_layout_table() {
    let path = workspace_root().join("docs/abi.md");
    let doc = std::fs::read_to_string(&path).expect("read docs/abi.md");
    let begin = doc
        .find(vpmu_abi_header::DOC_LAYOUT_BEGIN)
        .expect("layout begin marker in docs/abi.md");
    let end = doc
        .find(vpmu_abi_header::DOC_LAYOUT_END)
        .expect("layout end marker in docs/abi.md");
    let block = doc[begin + vpmu_abi_header::DOC_LAYOUT_BEGIN.len()..end].trim();
    assert!(
        block == vpmu_abi_header::doc_layout_block(),
        "docs/abi.md's layout table is stale: paste the output of \
         `cargo run -p vpmu-abi-header --bin abi-layout` between its markers"
    );
}
