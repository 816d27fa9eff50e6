//! The one source of every constant the reference VMM shares with its guest programs: the
//! I/O ports (`port`), the `vpmu profile` configuration and batch layout (`profile`), the
//! conformance suite's case numbers and result records (`selftest`).
//!
//! The guests never see this crate: `vpmu-guests`' `build.rs` writes `guest_protocol.h` from
//! it (`write_c_header`) at every build, so the C side cannot drift. Struct layouts shared
//! with C keep their `_Static_assert`s in C (against the generated `*_SIZE` constants) and
//! their size assertions in Rust.
//!
//! Dependency-free and `no_std`.
#![no_std]
#![deny(missing_docs)]

use core::fmt::{self, Write};

/// One constant as the C header sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Constant {
    /// The C macro's name (`PORT_CONSOLE`).
    pub c_name: &'static str,
    /// Its value.
    pub value: u64,
    /// What it is (the Rust doc comment), for the header's comment.
    pub doc: &'static str,
}

/// Declares Rust constants and, beside them, the table the C header is generated from: a
/// constant cannot be added to one without the other.
macro_rules! constants {
    ($(#[$table_doc:meta])* $table:ident, $prefix:literal: $(
        $(#[doc = $doc:literal])+ $name:ident: $ty:ty = $value:expr;
    )*) => {
        $( $(#[doc = $doc])+ pub const $name: $ty = $value; )*
        $(#[$table_doc])*
        pub const $table: &[$crate::Constant] = &[$(
            $crate::Constant {
                c_name: concat!($prefix, stringify!($name)),
                value: $name as u64,
                doc: concat!($($doc),+),
            },
        )*];
    };
}

/// The I/O ports through which a guest talks to the VMM (CPL0 only on this host's KVM; the
/// MMIO port window `mmio` reaches them from anywhere). The machine (`vpmu-machine`) serves
/// `CONSOLE` to `YIELD` and `START`; consumers serve the others through
/// `vpmu_machine::GuestPorts`.
pub mod port {
    constants! {
        /// Every port, for the C header (`PORT_*`).
        ALL, "PORT_":
        /// Console: one byte per `outb`.
        CONSOLE: u16 = 0xE9;
        /// Exit status: `outl` ends the run with that status.
        EXIT: u16 = 0x10;
        /// The xenpmu ABI's reference transport (docs/abi.md "Transport"): a 32-bit `inl` at
        /// CPL0 with RAX = 40 (`XENPMU_HYPERCALL_NR`), RDI = op, RSI = the parameter block's
        /// GPA (EAX, EDI, ESI outside 64-bit mode); EAX = the result. Guests find it through
        /// CPUID (the transport leaf's EBX), never by this number.
        HYPERCALL: u16 = 0x11;
        /// VMM control (benchmark): `outl` 1 = answer PMU MSRs with the null handler, 0 = the
        /// vpmu.
        CONTROL: u16 = 0x12;
        /// Migration (SMP cases): `inl` waits for every vCPU, moves each to the next pCPU, and
        /// returns the new pCPU index.
        MIGRATE: u16 = 0x13;
        /// Slices: `inl` returns how many times this vCPU has been scheduled in (on a shared
        /// pCPU, one per time slice; 1 on its own thread).
        SLICES: u16 = 0x14;
        /// PMI context: `inl` returns the interrupted context the VMM recorded for the last
        /// PMI it delivered to this vCPU: RIP bits 0..29 | CPL << 30; `u32::MAX` before any.
        PMI_CONTEXT: u16 = 0x15;
        /// Sample batch (`vpmu profile`): `outl` with the guest-physical address of a
        /// `struct sample_batch`.
        BATCH: u16 = 0x16;
        /// Yield: `outl` gives the pCPU up until the vCPU's next turn (on a shared pCPU the
        /// slice ends; on its own thread nothing happens).
        YIELD: u16 = 0x17;
        /// Conformance result (`vpmu selftest`): `outl` with the guest-physical address of a
        /// `struct guest_result` record.
        RESULT: u16 = 0x18;
        /// Ring-0 trace (`vpmu-ring0`): `outl` of one trace word (`ring0::TRACE_*`): which
        /// inner pCPU's bus the next MSR access is made through, and which inner operation
        /// runs on which inner pCPU for which inner vCPU.
        TRACE: u16 = 0x19;
        /// Start (`vpmu profile --profiler linux`): `outl` of a non-zero value by domain 0
        /// releases the workload domains a mixed machine holds until then
        /// (`Machine::linux_with_images` holds them while the Linux domain boots;
        /// `port::BATCH` from domain 0 releases them too), `outl` of 0 holds them again (the
        /// sampling is over: Linux shuts down alone). Ignored everywhere else.
        START: u16 = 0x1A;
    }
}

/// The MMIO port window: a 4-byte write of `value` at `PORTS_BASE + 4 * port` (port below
/// `PORTS_SIZE / 4`) is handled as `outl(port, value)` by the writing vCPU, for guests whose
/// port I/O does not reach the VMM (CPL3 code on a host that emulates CPL0: a Linux
/// user-space recorder maps the page through `/dev/mem`). Any other width or offset is
/// refused (an ELF guest's run ends with an error; a Linux guest's write is ignored with a
/// line on the VMM's stderr); reads return 0. The page is outside guest RAM (RAM ends at
/// 3 GiB at most) and below the IOAPIC.
pub mod mmio {
    constants! {
        /// The window's constants, for the C header (`MMIO_*`).
        ALL, "MMIO_":
        /// The guest-physical address of the port window (one 4 KiB page).
        PORTS_BASE: u64 = 0xD000_0000;
        /// Bytes of the port window: 4 per port, ports 0 to 1023.
        PORTS_SIZE: u64 = 0x1000;
    }

    /// The port a 4-byte write at `gpa` stands for, if `gpa` is a port's slot in the window.
    pub const fn port_at(gpa: u64) -> Option<u16> {
        match gpa.checked_sub(PORTS_BASE) {
            Some(offset) if offset < PORTS_SIZE && offset % 4 == 0 => Some((offset / 4) as u16),
            _ => None,
        }
    }

    /// Whether `gpa` is inside the window.
    pub const fn contains(gpa: u64) -> bool {
        gpa >= PORTS_BASE && gpa - PORTS_BASE < PORTS_SIZE
    }
}

/// The PMU VIRQ: the vector of the interrupt that signals a sample published in a registered
/// page (docs/abi.md "Transport"). Guests take it from CPUID (the transport leaf's ECX); the
/// constant is what the VMM reports there, and what the conformance case checks it against.
pub mod virq {
    constants! {
        /// The VIRQ's constants, for the C header.
        ALL, "":
        /// The PMU VIRQ's vector (fixed delivery, edge-triggered, to the page's vCPU).
        VIRQ_VECTOR: u8 = 0x41;
    }
}

/// The protocol of `vpmu profile` with its guests: a configuration the VMM writes at the
/// symbol `profile_config` before the run, and batches of samples the guests ship through
/// `port::BATCH`.
pub mod profile {
    constants! {
        /// The profile protocol's constants, for the C header.
        ALL, "":
        /// `struct profile_config`'s magic once the VMM wrote it ("PROF").
        PROFILE_CONFIG_MAGIC: u32 = 0x464f_5250;
        /// `struct sample_batch`'s magic ("BTCH").
        SAMPLE_BATCH_MAGIC: u32 = 0x4843_5442;
        /// Samples per batch at most: the guest's `struct sample_batch` holds this many.
        BATCH_CAPACITY: usize = 128;
        /// Role: the profiling domain (domain 0).
        ROLE_PROFILER: u32 = 1;
        /// Role: a workload domain.
        ROLE_WORKLOAD: u32 = 2;
        /// Bytes of `struct profile_config`.
        PROFILE_CONFIG_SIZE: usize = 48;
        /// Bytes of `struct sample_batch`'s header (before its samples).
        BATCH_HEADER_SIZE: usize = 48;
        /// Bytes of `struct batch_sample` before its `xenpmu_regs`.
        BATCH_SAMPLE_IDENTITY_SIZE: usize = 16;
        /// Bytes of `struct batch_sample`'s sample details after its `xenpmu_regs` and before
        /// its call chain: the page's `sample` fields `tsc`, `tsc_khz`, `sequence`,
        /// `overflowed`, `chain_len` and `chain_end` (ABI 1.2), as read.
        BATCH_SAMPLE_DETAILS_SIZE: usize = 40;
        /// Entries of `struct batch_sample`'s call chain: the ABI's `XENPMU_CALLCHAIN_MAX`.
        /// Only the first `chain_len` are copied; the rest are stale and not read.
        BATCH_CHAIN_MAX: usize = 64;
        /// Bytes of one `struct batch_sample`: identity, registers, details and chain.
        BATCH_SAMPLE_SIZE: usize = 736;
        /// `profile_config.delivery`: samples through the xenpmu page (a VIRQ and a guest
        /// handler per sample).
        DELIVERY_PAGE: u32 = 0;
        /// `profile_config.delivery`: samples through a sample ring (ABI 1.4), the page if the
        /// hypervisor answers `XENPMU_OP_RING_INIT` with `-EOPNOTSUPP`.
        DELIVERY_RING: u32 = 1;
        /// `struct ring_batch`'s magic ("RNGB"): a shipment that names the unread bytes of a
        /// sample ring, which the VMM copies out of guest memory.
        RING_BATCH_MAGIC: u32 = 0x4247_4e52;
        /// Bytes of `struct ring_batch`.
        RING_BATCH_SIZE: usize = 128;
        /// Data pages of each vCPU's sample ring (64 KiB: ~250 records of a short chain).
        RING_DATA_PAGES: u32 = 16;
    }
}

/// The conformance suite (`vpmu selftest`): case numbers (the guest's entry argument) and the
/// result records a guest reports each check with.
pub mod selftest {
    constants! {
        /// The suite's case numbering, for the C header.
        CASES, "":
        /// First SMP case number (`selftest/multi.c`, precise source, two vCPUs).
        SMP_BASE: u64 = 100;
        /// First timed-source case number (`selftest/timed.c`).
        TIMED_BASE: u64 = 200;
        /// First multi-domain case number (`selftest/multi.c`, domains on one pCPU).
        DOMAIN_BASE: u64 = 300;
        /// First all-mode case number (`selftest/all.c`, timed source).
        ALL_BASE: u64 = 400;
        /// The machine's watchdog test: the guest spins at CPL0 without exits.
        WATCHDOG_CASE: u64 = 999;
        /// The exit status of a guest asked for a case number it does not have.
        NO_CASE_STATUS: u32 = 0xffff;
        /// The exit status of a guest that hit a fatal exception.
        FATAL_STATUS: u32 = 0xdead;
    }

    constants! {
        /// The result record's constants, for the C header.
        RECORD, "":
        /// `struct guest_result`'s magic ("RSLT").
        RESULT_MAGIC: u32 = 0x544c_5352;
        /// Record kind: a case begins; the message is its name.
        RESULT_BEGIN: u32 = 1;
        /// Record kind: a check passed.
        RESULT_PASS: u32 = 2;
        /// Record kind: a check failed.
        RESULT_FAIL: u32 = 3;
        /// Record kind: a check does not apply to this PMU shape.
        RESULT_SKIP: u32 = 4;
        /// Record kind: the case's checks are done; `check` = how many this vCPU reported.
        RESULT_DONE: u32 = 5;
        /// Bytes of a record's message, its terminating NUL included.
        RESULT_MESSAGE_SIZE: usize = 112;
        /// Bytes of `struct guest_result`.
        RESULT_RECORD_SIZE: usize = 128;
    }

    /// The kind of a result record.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kind {
        /// `RESULT_BEGIN`.
        Begin,
        /// `RESULT_PASS`.
        Pass,
        /// `RESULT_FAIL`.
        Fail,
        /// `RESULT_SKIP`.
        Skip,
        /// `RESULT_DONE`.
        Done,
    }

    impl Kind {
        /// The kind of a record's `kind` field, if it is one.
        pub const fn from_raw(raw: u32) -> Option<Kind> {
            match raw {
                RESULT_BEGIN => Some(Kind::Begin),
                RESULT_PASS => Some(Kind::Pass),
                RESULT_FAIL => Some(Kind::Fail),
                RESULT_SKIP => Some(Kind::Skip),
                RESULT_DONE => Some(Kind::Done),
                _ => None,
            }
        }

        /// The record's `kind` field for this kind.
        pub const fn raw(self) -> u32 {
            match self {
                Kind::Begin => RESULT_BEGIN,
                Kind::Pass => RESULT_PASS,
                Kind::Fail => RESULT_FAIL,
                Kind::Skip => RESULT_SKIP,
                Kind::Done => RESULT_DONE,
            }
        }
    }
}

/// The ring-0 guest (`vmm/guests/ring0`, run by `vpmu-ring0`): an inner hypervisor built from
/// the vpmu crates runs at guest CPL0 on two vCPUs (= two inner pCPUs) and reports, through
/// `port::TRACE`, what it does on which inner pCPU. A trace word is
/// `kind << 28 | op << 20 | pcpu << 16 | vcpu` (vcpu: the inner vCPU's table index).
pub mod ring0 {
    constants! {
        /// The ring-0 guest's constants, for the C header.
        ALL, "RING0_":
        /// The ring-0 guest's one case number (entry argument).
        CASE: u64 = 500;
        /// The IPI vector between the two inner pCPUs (x2APIC ICR, fixed delivery).
        IPI_VECTOR: u32 = 0x42;
        /// Trace kind: the next MSR access is made through inner pCPU `pcpu`'s bus.
        TRACE_OWNER: u32 = 1;
        /// Trace kind: inner operation `op` begins on inner pCPU `pcpu` for inner vCPU `vcpu`.
        TRACE_BEGIN: u32 = 2;
        /// Trace kind: the operation begun last on this vCPU ends.
        TRACE_END: u32 = 3;
        /// Trace kind: an IPI was sent to inner pCPU `pcpu`.
        TRACE_IPI_SENT: u32 = 4;
        /// Trace kind: inner pCPU `pcpu` took the request IPI.
        TRACE_IPI_TAKEN: u32 = 5;
        /// Operation: `Vpmu::attach_pcpu`.
        OP_ATTACH: u32 = 1;
        /// Operation: `Vpmu::context_switch` to `vcpu` (0xffff: to none).
        OP_SWITCH: u32 = 2;
        /// Operation: `Vpmu::wrmsr` of `vcpu` (a guest-style intercept).
        OP_WRMSR: u32 = 3;
        /// Operation: `Vpmu::rdmsr` of `vcpu`.
        OP_RDMSR: u32 = 4;
        /// Operation: a `Vpmu::wrmsr` that must #GP without touching the hardware.
        OP_GP: u32 = 5;
        /// Operation: `Vpmu::handle_pmi` (the PMI handler).
        OP_PMI: u32 = 6;
        /// Operation: `Vpmu::complete_request` for `vcpu` (the request's target vCPU, 0xffff
        /// for a catch-up).
        OP_REQUEST: u32 = 7;
        /// Operation: `Vpmu::teardown_vcpu` of `vcpu`, until `Done` (a cross-CPU operation).
        OP_TEARDOWN: u32 = 8;
        /// Operation: a MODE_SET control operation, until it completes (cross-CPU).
        OP_MODE_SET: u32 = 9;
        /// Operation: the harness reads its own pCPU's hardware directly (idle checks).
        OP_HARNESS: u32 = 10;
        /// Operation: `Vpmu::detach_pcpu`.
        OP_DETACH: u32 = 11;
    }

    /// A trace word.
    pub const fn trace(kind: u32, op: u32, pcpu: u32, vcpu: u32) -> u32 {
        kind << 28 | (op & 0xff) << 20 | (pcpu & 0xf) << 16 | (vcpu & 0xffff)
    }
}

/// Every constant table, in header order.
pub const TABLES: &[&[Constant]] = &[
    port::ALL,
    mmio::ALL,
    virq::ALL,
    profile::ALL,
    selftest::CASES,
    selftest::RECORD,
    ring0::ALL,
];

/// The C declaration of the result record (C11, freestanding, `-m32` and `-m64` alike).
const RESULT_STRUCT: &str = "\
#ifndef __ASSEMBLER__
/* A conformance result, reported with outl(PORT_RESULT, its address): the VMM copies it out
 * of guest memory and counts the suite's results from these records (the console's PASS/FAIL
 * lines are for people). `check` numbers a vCPU's checks 1, 2, ...; a RESULT_DONE record
 * carries how many it reported. `message` is NUL-terminated. */
struct guest_result {
    unsigned int magic;   /* RESULT_MAGIC */
    unsigned int kind;    /* RESULT_BEGIN .. RESULT_DONE */
    unsigned int case_id; /* the case number the guest was entered with */
    unsigned int check;
    char message[RESULT_MESSAGE_SIZE];
};
_Static_assert(sizeof(struct guest_result) == RESULT_RECORD_SIZE, \"guest_result layout\");
#endif
";

/// Writes the guests' C header (`guest_protocol.h`): a `#define` for every constant of
/// `TABLES` (plain hexadecimal literals, usable from assembly too) and the result record's
/// struct (hidden from the assembler).
pub fn write_c_header(out: &mut impl Write) -> fmt::Result {
    out.write_str(
        "/* Generated by vpmu-guest-protocol (vmm/protocol) at build time: do not edit. The one\n \
         * source of the constants the VMM shares with its guests. */\n\
         #ifndef GUEST_PROTOCOL_H\n#define GUEST_PROTOCOL_H\n",
    )?;
    for table in TABLES {
        out.write_char('\n')?;
        for c in *table {
            write!(out, "/* ")?;
            // The first sentence of the doc, on one line.
            let doc = c.doc.trim();
            let first = doc.split(". ").next().unwrap_or(doc).trim_end_matches('.');
            for (i, word) in first.split_whitespace().enumerate() {
                if i > 0 {
                    out.write_char(' ')?;
                }
                out.write_str(word)?;
            }
            writeln!(out, " */\n#define {} {:#x}", c.c_name, c.value)?;
        }
    }
    out.write_char('\n')?;
    out.write_str(RESULT_STRUCT)?;
    out.write_str("\n#endif\n")
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::String;

    use super::*;

    fn header() -> String {
        let mut s = String::new();
        write_c_header(&mut s).expect("writes");
        s
    }

    #[test]
    fn the_header_defines_every_constant() {
        let h = header();
        let mut n = 0;
        for c in TABLES.iter().flat_map(|t| t.iter()) {
            let line = std::format!("#define {} {:#x}\n", c.c_name, c.value);
            assert!(h.contains(&line), "missing {line}in\n{h}");
            n += 1;
        }
        assert_eq!(n, 64);
        // Spot checks of names and values the guests use.
        for line in [
            "#define PORT_CONSOLE 0xe9",
            "#define PORT_RESULT 0x18",
            "#define BATCH_CAPACITY 0x80",
            "#define ALL_BASE 0x190",
            "#define RESULT_MESSAGE_SIZE 0x70",
            "#define PORT_TRACE 0x19",
            "#define RING0_CASE 0x1f4",
            "#define VIRQ_VECTOR 0x41",
            "#define PORT_START 0x1a",
            "#define MMIO_PORTS_BASE 0xd0000000",
            "#define MMIO_PORTS_SIZE 0x1000",
        ] {
            assert!(h.contains(line), "{line}");
        }
        assert!(h.contains("struct guest_result {"));
        // One definition per name.
        let defines: std::vec::Vec<_> = h.lines().filter(|l| l.starts_with("#define ")).collect();
        let mut names: std::vec::Vec<_> = defines
            .iter()
            .filter_map(|l| l.split_whitespace().nth(1))
            .collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a name is defined twice");
    }

    #[test]
    fn ports_are_distinct_and_kinds_round_trip() {
        let mut ports: std::vec::Vec<u64> = port::ALL.iter().map(|c| c.value).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), port::ALL.len());
        for raw in 0..8 {
            if let Some(k) = selftest::Kind::from_raw(raw) {
                assert_eq!(k.raw(), raw);
            }
        }
        assert_eq!(selftest::Kind::from_raw(0), None);
        assert_eq!(
            selftest::RESULT_RECORD_SIZE,
            16 + selftest::RESULT_MESSAGE_SIZE
        );
    }

    #[test]
    fn the_window_maps_aligned_slots_to_ports() {
        use mmio::{PORTS_BASE, PORTS_SIZE, contains, port_at};
        assert_eq!(port_at(PORTS_BASE), Some(0));
        assert_eq!(port_at(PORTS_BASE + 4 * 0x16), Some(port::BATCH));
        assert_eq!(port_at(PORTS_BASE + PORTS_SIZE - 4), Some(1023));
        assert_eq!(port_at(PORTS_BASE + 2), None, "unaligned");
        assert_eq!(port_at(PORTS_BASE + PORTS_SIZE), None, "past the page");
        assert_eq!(port_at(PORTS_BASE - 4), None, "below the page");
        assert_eq!(port_at(0), None);
        assert!(contains(PORTS_BASE + 2) && contains(PORTS_BASE + PORTS_SIZE - 1));
        assert!(!contains(PORTS_BASE + PORTS_SIZE) && !contains(PORTS_BASE - 1));
        // Every project port has a slot.
        assert!(port::ALL.iter().all(|c| c.value < PORTS_SIZE / 4));
    }

    #[test]
    fn no_comment_is_closed_early() {
        let h = header();
        for line in h
            .lines()
            .filter(|l| l.starts_with("/* ") && l.ends_with(" */"))
        {
            assert!(!line[3..line.len() - 3].contains("*/"), "{line}");
        }
    }
}
