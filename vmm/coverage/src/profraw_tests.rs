//! Tests of the raw-profile parser (`profraw.rs`): synthetic profiles built to the format,
//! every malformation refused, a real minicov profile, robustness properties.
use super::*;

/// A real profile: `covdemo`, a 40-line program whose own crate and minicov =0.3.8
/// (default-features = false) were built with `-C instrument-coverage` (rustc 1.95.0,
/// `RUSTC_WRAPPER` adding the flag for those two crate names only), ran with 1 argument
/// and wrote `minicov::capture_coverage`'s output. `llvm-profdata-22 merge` accepts it.
const FIXTURE: &[u8] = include_bytes!("../tests-data/minicov-v10.profraw");

/// Lays out a version-10 profile exactly as LLVM's runtime does, placing the counters
/// before the data in the (imaginary) program's memory like the real linker layout.
struct Synth {
    functions: Vec<(Vec<u8>, u64, Vec<u64>)>,
    extra_names: Vec<Vec<u8>>,
    compress: bool,
    /// MC/DC bitmap bytes per function (none when shorter than `functions`).
    bitmaps: Vec<u32>,
}

impl Synth {
    fn new(functions: &[(&str, u64, &[u64])]) -> Synth {
        Synth {
            functions: functions
                .iter()
                .map(|(n, h, c)| (n.as_bytes().to_vec(), *h, c.to_vec()))
                .collect(),
            extra_names: Vec::new(),
            compress: false,
            bitmaps: Vec::new(),
        }
    }

    fn names_section(&self) -> Vec<u8> {
        let joined = self
            .functions
            .iter()
            .map(|f| f.0.clone())
            .chain(self.extra_names.iter().cloned())
            .collect::<Vec<_>>()
            .join(&NAME_SEPARATOR);
        let mut out = Vec::new();
        uleb(&mut out, joined.len() as u64);
        if self.compress {
            let z = miniz_oxide::deflate::compress_to_vec_zlib(&joined, 6);
            uleb(&mut out, z.len() as u64);
            out.extend_from_slice(&z);
        } else {
            uleb(&mut out, 0);
            out.extend_from_slice(&joined);
        }
        out
    }

    fn build(&self) -> Vec<u8> {
        let num_data = self.functions.len() as u64;
        let num_counters: u64 = self.functions.iter().map(|f| f.2.len() as u64).sum();
        let names = self.names_section();
        // Memory layout: counters, then data (as in the real ELF), so the delta is negative.
        let counters_delta = (num_counters * 8).wrapping_neg();
        // The bitmaps follow the data in memory, 16 bytes further on.
        let bitmap_delta = 64 * num_data + 16;
        let num_bitmap_bytes: u64 = self.bitmaps.iter().map(|&b| u64::from(b)).sum();
        let bitmap_padding = num_bitmap_bytes.next_multiple_of(8) - num_bitmap_bytes;
        let header = [
            MAGIC,
            VERSION,
            0,
            num_data,
            0,
            num_counters,
            0,
            num_bitmap_bytes,
            bitmap_padding,
            names.len() as u64,
            counters_delta,
            bitmap_delta,
            0x5555_0000,
            0,
            0,
            VALUE_KIND_LAST,
        ];
        let mut out: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        let (mut first, mut first_bitmap) = (0u64, 0u64);
        for (i, (name, hash, counters)) in self.functions.iter().enumerate() {
            let own = 64 * i as u64;
            let counter_ptr = counters_delta.wrapping_add(first * 8).wrapping_sub(own);
            let bitmap_bytes = self.bitmaps.get(i).copied().unwrap_or(0);
            let bitmap_ptr = if bitmap_bytes == 0 {
                0
            } else {
                (bitmap_delta + first_bitmap).wrapping_sub(own)
            };
            let words = [
                name_hash(name),
                *hash,
                counter_ptr,
                bitmap_ptr,
                0x1000 + own,
                0,
            ];
            for w in words {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(&(counters.len() as u32).to_le_bytes());
            out.extend_from_slice(&[0; 6 + 2]);
            out.extend_from_slice(&bitmap_bytes.to_le_bytes());
            first += counters.len() as u64;
            first_bitmap += u64::from(bitmap_bytes);
        }
        for (_, _, counters) in &self.functions {
            for c in counters {
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
        let bitmap_len = usize::try_from(num_bitmap_bytes + bitmap_padding).unwrap();
        out.extend(std::iter::repeat_n(0xa5, bitmap_len));
        out.extend_from_slice(&names);
        out.resize(out.len().next_multiple_of(8), 0);
        out
    }
}

fn uleb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn sample() -> Synth {
    Synth::new(&[
        ("_RNvCs1_4demo4main", 0x11, &[1, 7, 0]),
        ("_RNvCs1_4demo6unused", 0x22, &[0, 0]),
        ("_RNvCs1_4demo3hot", 0x33, &[1000]),
    ])
}

fn parse_err(bytes: &[u8]) -> String {
    RawProfile::parse(bytes)
        .expect_err("the profile should be rejected")
        .to_string()
}

#[test]
fn synthetic_profile_parses_with_each_functions_counters() {
    for compress in [false, true] {
        let mut synth = sample();
        synth.compress = compress;
        synth.extra_names.push(b"discarded_function".to_vec());
        let p = RawProfile::parse(&synth.build()).unwrap();
        let f = p.functions();
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].name, "_RNvCs1_4demo4main");
        assert_eq!(
            (f[0].hash, f[0].counters.as_slice()),
            (0x11, &[1, 7, 0][..])
        );
        assert_eq!((f[1].hash, f[1].counters.as_slice()), (0x22, &[0, 0][..]));
        assert_eq!(f[2].name, "_RNvCs1_4demo3hot");
        assert_eq!(f[2].counters, [1000]);
        assert_eq!(p.num_functions(), 3);
        assert_eq!(p.num_counters(), 6);
        assert_eq!(p.num_names(), 4);
        assert_eq!(p.total_count(), 1008);
        assert_eq!(p.covered_functions(), 2);
        assert_eq!(p.names_compressed(), compress);
        assert!(p.summary().contains("3 functions (2 executed), 6 counters"));
    }
}

#[test]
fn bitmap_ranges_are_checked() {
    let mut synth = sample();
    synth.bitmaps = vec![3, 0, 2];
    let b = synth.build();
    let p = RawProfile::parse(&b).unwrap();
    assert_eq!(p.functions()[2].counters, [1000]);
    assert!(p.summary().contains("5 bitmap bytes"));
    // Record 2's NumBitmapBytes (at offset 60 of the record): 3 overruns the 5 bytes.
    let mut b = b;
    b[HEADER_SIZE + 2 * 64 + 60] = 3;
    let e = parse_err(&b);
    assert!(e.contains("data record 2") && e.contains("bitmap"), "{e}");
}

#[test]
fn wrong_magic_is_rejected() {
    let mut b = sample().build();
    put_u64(&mut b, 0, 0x1234);
    assert!(parse_err(&b).contains("not an LLVM raw profile"));
    put_u64(&mut b, 0, MAGIC.swap_bytes());
    assert!(parse_err(&b).contains("big-endian"));
}

#[test]
fn wrong_version_is_rejected_naming_it() {
    let mut b = sample().build();
    put_u64(&mut b, 8, 11);
    let e = parse_err(&b);
    assert!(e.contains("version 11"), "{e}");
    put_u64(&mut b, 8, VERSION | 1 << 60);
    assert!(parse_err(&b).contains("variant flags"));
}

#[test]
fn wrong_value_kind_last_or_padding_is_rejected() {
    let mut b = sample().build();
    put_u64(&mut b, 15 * 8, 1);
    assert!(parse_err(&b).contains("ValueKindLast"));
    let mut b = sample().build();
    put_u64(&mut b, 4 * 8, 8);
    assert!(parse_err(&b).contains("PaddingBytesBeforeCounters"));
    let mut b = sample().build();
    put_u64(&mut b, 4 * 8, 4);
    assert!(parse_err(&b).contains("not 8-aligned"));
}

#[test]
fn truncated_profile_is_rejected() {
    let b = sample().build();
    assert!(parse_err(&b[..100]).contains("truncated"));
    assert!(parse_err(&b[..b.len() - 8]).contains("truncated"));
    assert!(parse_err(&[]).contains("truncated"));
}

#[test]
fn trailing_byte_is_rejected() {
    let mut b = sample().build();
    b.push(0);
    let e = parse_err(&b);
    assert!(e.contains("1 trailing bytes"), "{e}");
}

#[test]
fn huge_header_counts_are_a_size_error_not_a_panic() {
    for word in [2, 3, 5, 7, 9] {
        let mut b = sample().build();
        put_u64(&mut b, word * 8, !7);
        assert!(RawProfile::parse(&b).is_err());
    }
}

#[test]
fn counter_range_outside_is_rejected() {
    let mut b = sample().build();
    // Record 2's NumCounters (its counters end the section): one more overruns it.
    b[HEADER_SIZE + 2 * 64 + 48] = 2;
    let e = parse_err(&b);
    assert!(e.contains("data record 2") && e.contains("outside"), "{e}");
    // A CounterPtr before the counters section.
    let mut b = sample().build();
    let at = HEADER_SIZE + 16;
    let ptr = read_u64(&b, at).unwrap().wrapping_sub(8);
    put_u64(&mut b, at, ptr);
    assert!(parse_err(&b).contains("outside"));
    // A misaligned CounterPtr.
    let mut b = sample().build();
    let ptr = read_u64(&b, at).unwrap().wrapping_add(4);
    put_u64(&mut b, at, ptr);
    assert!(parse_err(&b).contains("misaligned"));
}

#[test]
fn overlapping_counter_ranges_are_rejected() {
    let mut b = sample().build();
    // Point record 1 at record 0's counters: 64 bytes further from its own address.
    let at = HEADER_SIZE + 64 + 16;
    let ptr = read_u64(&b, at).unwrap().wrapping_sub(3 * 8);
    put_u64(&mut b, at, ptr);
    let e = parse_err(&b);
    assert!(e.contains("share counters"), "{e}");
}

#[test]
fn name_ref_without_name_is_rejected() {
    let mut b = sample().build();
    put_u64(&mut b, HEADER_SIZE + 64, 0xdead_beef);
    let e = parse_err(&b);
    assert!(e.contains("data record 1") && e.contains("no name"), "{e}");
}

#[test]
fn corrupt_names_are_rejected() {
    let synth = sample();
    let mut b = synth.build();
    let names_at = HEADER_SIZE + 3 * 64 + 6 * 8;
    b[names_at] = 0xff; // claims more bytes than the section holds
    assert!(parse_err(&b).contains("names"));
    let mut compressed = sample();
    compressed.compress = true;
    let mut b = compressed.build();
    b[names_at + 4] ^= 0xff; // inside the zlib stream
    assert!(parse_err(&b).contains("name"));
}

#[test]
fn name_hash_is_llvm_md5_low_half() {
    // Taken from the fixture: `covdemo::main`'s NameRef.
    assert_eq!(
        name_hash(b"_RNvCs9595tYLkWsW_7covdemo4main"),
        0x24d4_6f37_2760_1426
    );
}

#[test]
fn real_minicov_profile_parses() {
    let p = RawProfile::parse(FIXTURE).unwrap();
    assert_eq!(p.num_functions(), 8);
    assert_eq!(p.num_counters(), 22);
    assert_eq!(p.num_names(), 18);
    assert!(p.names_compressed());
    assert_eq!(p.total_count(), 59);
    assert_eq!(p.covered_functions(), 6);
    let find = |suffix: &str| {
        p.functions()
            .iter()
            .find(|f| f.name.ends_with(suffix))
            .unwrap_or_else(|| panic!("no function {suffix}"))
    };
    // classify() ran for i in 0..11 (argv had 2 entries): entry count 11, then its branches.
    let classify = find("7covdemo8classify");
    assert_eq!(classify.counters, [11, 4, 4]);
    assert_eq!(classify.hash, 0x1b8e_e52f_4ec9_8471);
    assert_eq!(find("7covdemo4main").counters, [1, 12, 4, 4, 0]);
    assert!(
        find("7covdemo12never_called")
            .counters
            .iter()
            .all(|&c| c == 0)
    );
    assert_eq!(
        p.functions()
            .iter()
            .map(|f| f.counters.len())
            .sum::<usize>(),
        22
    );
}

#[test]
fn check_against_elf_rejects_non_elf_and_missing_sections() {
    let p = RawProfile::parse(FIXTURE).unwrap();
    assert!(p.check_against_elf(b"not an elf").is_err());
    // This test binary is not instrumented: it has none of the sections.
    if let Ok(exe) = std::env::current_exe().and_then(std::fs::read) {
        let e = p.check_against_elf(&exe).unwrap_err();
        assert!(matches!(e, ProfrawError::ElfMismatch(_)), "{e:?}");
        assert!(e.to_string().contains("no __llvm_prf_data section"), "{e}");
    }
}

/// Checks the fixture against the ELF it came from, when the scratch build is around
/// (`/tmp/covscratch/target/release/covdemo`); the ELF is too large to keep in the repo.
#[test]
fn check_against_elf_matches_scratch_binary_if_present() {
    let Ok(elf) = std::fs::read("/tmp/covscratch/target/release/covdemo") else {
        eprintln!("SKIPPED: /tmp/covscratch/target/release/covdemo is not present");
        return;
    };
    let Ok(profile) = std::fs::read("/tmp/covscratch/demo.profraw") else {
        eprintln!("SKIPPED: /tmp/covscratch/demo.profraw is not present");
        return;
    };
    let p = RawProfile::parse(&profile).unwrap();
    p.check_against_elf(&elf).unwrap();
    // A misaligned copy must work too.
    let mut shifted = vec![0u8];
    shifted.extend_from_slice(&elf);
    p.check_against_elf(&shifted[1..]).unwrap();
    // And a profile of different size must not.
    let other = RawProfile::parse(&sample().build()).unwrap();
    assert!(other.check_against_elf(&elf).is_err());
}

proptest::proptest! {
    /// The profile comes from a hypervisor through a guest's buffer: any bytes parse or
    /// fail cleanly, never panic.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..2048),
    ) {
        let _ = RawProfile::parse(&bytes);
    }

    /// The real profile with one byte changed, or cut short, parses or fails cleanly.
    #[test]
    fn damaged_real_profile_never_panics(
        at in 0usize..FIXTURE.len(),
        byte in proptest::arbitrary::any::<u8>(),
        cut in 0usize..FIXTURE.len(),
    ) {
        let mut bytes = FIXTURE.to_vec();
        bytes[at] = byte;
        if let Ok(p) = RawProfile::parse(&bytes) {
            let _ = (p.summary(), p.total_count(), p.covered_functions());
        }
        let _ = RawProfile::parse(&FIXTURE[..cut]);
    }
}
