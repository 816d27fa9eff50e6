//! The C ring helpers of `xenpmu.h` read exactly what the Rust reader reads: one committed
//! corpus of ring images (`tests/corpus/rings/*.bin`: a control page, then the data area;
//! generated here deterministically) is walked by a C consumer (`tests/c/ring.c`, gcc at -m32
//! and -m64) and by `vpmu_abi::next_record`, and every line must agree: the info verdict and
//! its errno, every record with every field (the fixed part's and the chain's bytes hashed),
//! the code that ends each walk and its errno, and the tail after it.
//!
//! The corpus holds valid rings (empty, full, wrapped with PADs, positions straddling 2^32 and 2^64,
//! full call chains, lost records, a kind from a later minor) and corrupt ones (each
//! `RingError` of the info check and of the reader, some after valid records), plus
//! pseudo-random rings with a record broken (`c_ring/corpus.rs` generates them).
//! `VPMU_BLESS=1 cargo test -p vpmu-tests --test c_ring` rewrites the committed files after a
//! change to the generator.
//!
//! Then the ordering helpers: `tests/c/ring_ordering.c` runs a producer thread and a consumer
//! thread on one ring at -m32 and -m64, through positions that cross 2^32 boundaries and 2^64;
//! and the code gcc makes of `xenpmu_ring_head_acquire()`/`_tail_release()` is read to show
//! each is one 8-byte access (`lock cmpxchg8b` at -m32, also with a 32-bit kernel's flags).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use vpmu_abi::{RingControl, RingError, RingRecords, XENPMU_RING_EMPTY, check_ring_info};
use vpmu_tests::c_build::{WIDTHS, compile, compile_with, run, workspace_root};
use zerocopy::{FromBytes, IntoBytes};

#[path = "c_ring/corpus.rs"]
mod corpus;

use corpus::corpus;

const CORPUS: &str = "tests/corpus/rings";

fn corpus_dir() -> PathBuf {
    workspace_root().join(CORPUS)
}

#[test]
fn the_committed_ring_corpus_is_what_the_generator_produces() {
    let generated = corpus()
        .iter()
        .map(|(name, image)| (name.clone(), image.bytes()))
        .collect();
    vpmu_tests::blessed::check_or_bless(&corpus_dir(), generated, "c_ring");
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
    })
}

/// What `ring.c` prints for one image file, computed with the Rust reader.
fn rust_walk(name: &str, bytes: &[u8]) -> String {
    let (control, data) = RingControl::read_from_prefix(bytes).expect("a control page");
    let mut out = format!("== {name}\n");
    let verdict = check_ring_info(&control.info);
    let _ = writeln!(
        out,
        "info {} {} {}",
        verdict.map_or_else(|e| e.code(), |()| 0),
        verdict.map_or_else(|e| e.errno(), |()| 0),
        u8::from(verdict.is_ok())
    );
    let info = control.info;
    let Some(data) = data.get(..info.data_size as usize) else {
        out.push_str("walk -\n");
        return out;
    };
    let (tail, head) = (control.consumer.tail, control.producer.head);
    let _ = writeln!(
        out,
        "walk {} {} {tail} {head}",
        info.data_size, info.record_max
    );
    let einval = -vpmu_abi::XENPMU_EINVAL;
    let mut records = RingRecords::new(data, info.record_max, tail, head);
    let mut end: Option<RingError> = None;
    for entry in records.by_ref() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                end = Some(error);
                break;
            }
        };
        let offset = entry.offset;
        match entry.record {
            vpmu_abi::Record::Sample(sample) => {
                let s = sample.fixed;
                let _ = writeln!(
                    out,
                    "sample {offset} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {einval}",
                    s.header.size,
                    s.header.misc,
                    s.sequence,
                    s.tsc,
                    s.identity.domain_id,
                    s.identity.vcpu_id,
                    s.identity.pcpu_id,
                    s.overflowed,
                    s.chain_len,
                    s.chain_end,
                    s.regs.rip,
                    s.regs.rsp,
                    s.regs.mode,
                    fnv(s.as_bytes()),
                    fnv(sample.chain().as_bytes())
                );
            }
            vpmu_abi::Record::Lost(l) => {
                let _ = writeln!(
                    out,
                    "lost {offset} {} {} {} {} {} {einval}",
                    l.header.size, l.header.misc, l.lost, l.sequence, l.tsc
                );
            }
            vpmu_abi::Record::Pad => {
                let _ = writeln!(out, "pad {offset} {}", entry.size);
            }
            vpmu_abi::Record::Unknown { kind, size } => {
                let _ = writeln!(out, "unknown {offset} {kind} {size}");
            }
        }
    }
    let (code, errno) = end.map_or((XENPMU_RING_EMPTY, 0), |e| (e.code() as i32, e.errno()));
    let _ = writeln!(out, "end {code} {errno} {}", records.tail());
    out
}

fn ring_exe(width: u32) -> PathBuf {
    let source = workspace_root().join("tests/c/ring.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ring_{width}"));
    compile(&source, width, &out)
}

#[test]
fn c_and_rust_read_every_corpus_ring_alike_at_both_widths() {
    let files = vpmu_tests::blessed::committed(&corpus_dir());
    assert!(
        files.len() >= 60,
        "the corpus is there ({} rings)",
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
        .map(|((_, bytes), path)| rust_walk(path, bytes))
        .collect();
    // The corpus reaches every refusal of the info check and of the reader, an empty ring, and
    // every record kind.
    let codes: BTreeSet<i32> = expected
        .lines()
        .filter(|l| l.starts_with("info ") || l.starts_with("end "))
        .filter_map(|l| l.split(' ').nth(1)?.parse().ok())
        .collect();
    let all_codes: BTreeSet<i32> = [0, XENPMU_RING_EMPTY]
        .into_iter()
        .chain((16..=21).chain(24..=37))
        .collect();
    assert_eq!(codes, all_codes, "the corpus reaches every verdict");
    for kind in ["sample ", "lost ", "pad ", "unknown "] {
        assert!(
            expected.lines().any(|l| l.starts_with(kind)),
            "the corpus has a {kind}record"
        );
    }
    assert!(
        expected
            .lines()
            .any(|l| l.starts_with("sample ") && l.split(' ').nth(10) == Some("64")),
        "a sample with a full chain is read"
    );
    let args: Vec<&str> = paths.iter().map(String::as_str).collect();
    for width in WIDTHS {
        let printed = String::from_utf8(run(&ring_exe(width), &args, b"")).expect("utf-8");
        for (c, rust) in printed.lines().zip(expected.lines()) {
            assert_eq!(
                c, rust,
                "-m{width}: the C helpers and the Rust reader disagree"
            );
        }
        assert_eq!(
            printed.lines().count(),
            expected.lines().count(),
            "-m{width}: as many lines"
        );
    }
}

#[test]
fn a_consumer_thread_never_sees_a_torn_or_reordered_record_at_either_width() {
    let source = workspace_root().join("tests/c/ring_ordering.c");
    for width in WIDTHS {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ring_ordering_{width}"));
        let exe = compile_with(&source, width, &out, &["-pthread"]);
        let report = String::from_utf8(run(&exe, &[], b"")).expect("utf-8");
        // The checks are the program's, on every record; its report shows the work done.
        eprintln!("-m{width}: {}", report.trim());
        let records: u64 = report
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .expect("the program reports its record count");
        assert!(records >= 100_000, "-m{width}: {records} records consumed");
    }
}

/// The assembly gcc makes of `body` (C using the header) at `-m{width}` with `extra` flags.
fn assembly(width: u32, extra: &[&str], body: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let source = dir.join("ring_positions.c");
    std::fs::write(&source, format!("#include \"xenpmu.h\"\n{body}")).expect("write the source");
    let output = std::process::Command::new("gcc")
        .args([
            "-std=c11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-S",
            "-o",
            "-",
        ])
        .arg(format!("-m{width}"))
        .args(extra)
        .arg("-I")
        .arg(workspace_root().join("abi/include"))
        .arg(&source)
        .output()
        .expect("run gcc");
    assert!(
        output.status.success(),
        "gcc -m{width} -S: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

/// The instructions of `function` in gcc's assembly (labels and directives dropped).
fn instructions<'a>(asm: &'a str, function: &str) -> Vec<&'a str> {
    asm.lines()
        .skip_while(|l| *l != format!("{function}:"))
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with(".size") && !l.trim_start().starts_with(".LFE"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('.') && !l.starts_with('#'))
        .collect()
}

/// docs/abi.md "Memory ordering": a 32-bit owner loads `head` and stores `tail` with one atomic
/// 8-byte access. The two-thread test cannot catch a torn access reliably (it needs the race at
/// the moment a position crosses 2^32), so this reads the code gcc makes of the helpers: at
/// -m32 the only accesses to `head` and the only stores to `tail` are `lock cmpxchg8b`, also
/// with a 32-bit kernel's flags (no x87, no SSE: no libatomic call either); at -m64 one `movq`.
#[test]
fn the_position_helpers_are_one_8_byte_access_at_both_widths() {
    let body = "uint64_t head_of(const xenpmu_ring_control *ctl) { return xenpmu_ring_head_acquire(ctl); }\n\
                void tail_to(xenpmu_ring_control *ctl, uint64_t tail) { xenpmu_ring_tail_release(ctl, tail); }\n";
    let kernel_32: &[&str] = &["-msoft-float", "-mno-sse", "-mno-mmx", "-ffreestanding"];
    for extra in [&[][..], kernel_32] {
        let asm = assembly(32, extra, body);
        let head = instructions(&asm, "head_of");
        let touching_head: Vec<&&str> = head
            .iter()
            .filter(|i| i.contains("320(") || i.contains("324("))
            .collect();
        assert!(
            matches!(touching_head.as_slice(), [only] if only.contains("lock; cmpxchg8b 320(")),
            "-m32 {extra:?}: head read other than by one cmpxchg8b: {head:#?}"
        );
        let tail = instructions(&asm, "tail_to");
        let stores: Vec<&&str> = tail
            .iter()
            .filter(|i| i.ends_with("384(%esi)") || i.contains(", 384(") || i.contains(", 388("))
            .collect();
        assert!(
            matches!(stores.as_slice(), [only] if only.contains("lock; cmpxchg8b 384(")),
            "-m32 {extra:?}: tail written other than by cmpxchg8b: {tail:#?}"
        );
        assert!(
            !asm.contains("call"),
            "-m32 {extra:?}: the helpers call out (libatomic?):\n{asm}"
        );
    }
    let asm = assembly(64, &[], body);
    let head = instructions(&asm, "head_of");
    assert!(
        head.iter().filter(|i| i.contains("320(")).count() == 1
            && head.iter().any(|i| i.starts_with("movq\t320(")),
        "-m64: head read other than by one movq: {head:#?}"
    );
    let tail = instructions(&asm, "tail_to");
    assert!(
        tail.iter().filter(|i| i.contains("384(")).count() == 1
            && tail
                .iter()
                .any(|i| i.starts_with("movq\t") && i.ends_with(", 384(%rdi)")),
        "-m64: tail written other than by one movq: {tail:#?}"
    );
}
