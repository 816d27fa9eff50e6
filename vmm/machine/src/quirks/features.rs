//! The CPUID features whose instructions a guest kernel may execute at CPL0, with a probe
//! instruction each and its Linux feature bit (`super`: which of them this host's
//! CPL0 emulator cannot execute).

/// A CPUID feature whose instruction a guest kernel may execute at CPL0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    /// Linux's name for it.
    pub name: &'static str,
    /// CPUID leaf, subleaf, register (0 EAX .. 3 EDX) and bit.
    pub leaf: u32,
    /// See `leaf`.
    pub subleaf: u32,
    /// See `leaf`.
    pub register: u8,
    /// See `leaf`.
    pub bit: u8,
    /// Linux 6.1's feature-bit number (`arch/x86/include/asm/cpufeatures.h`): `clearcpuid=`
    /// of it keeps the kernel off the feature.
    pub linux_bit: u16,
    /// The instruction probed (and the CR4 bits it needs), as text.
    pub instruction: &'static str,
    /// Where Linux 6.1 executes it (why it matters).
    pub used_by: &'static str,
    /// Machine code of the probe (RSI points at 64 zeroed, 64-byte-aligned bytes).
    pub(super) probe: &'static [u8],
    /// CR4 bits the instruction needs.
    pub(super) cr4: u64,
}

const ECX: u8 = 2;
const EBX: u8 = 1;
const EDX: u8 = 3;
const CR4_FSGSBASE: u64 = 1 << 16;
const CR4_OSXSAVE: u64 = 1 << 18;
const CR4_PKE: u64 = 1 << 22;
const CR4_OSFXSR: u64 = 1 << 9;

/// The features probed: every CPUID feature an emulated Linux CPL0 was seen, or predicted,
/// to execute through alternatives or feature checks.
pub const FEATURES: &[Feature] = &[
    Feature {
        name: "xsave",
        leaf: 1,
        subleaf: 0,
        register: ECX,
        bit: 26,
        linux_bit: 154,
        instruction: "xrstor (CR4.OSXSAVE)",
        used_by: "fpu__init_system_xstate",
        probe: &[0x31, 0xc0, 0x31, 0xd2, 0x0f, 0xae, 0x2e], // xor eax,eax; xor edx,edx; xrstor (rsi)
        cr4: CR4_OSXSAVE | CR4_OSFXSR,
    },
    Feature {
        name: "popcnt",
        leaf: 1,
        subleaf: 0,
        register: ECX,
        bit: 23,
        linux_bit: 151,
        instruction: "popcnt",
        used_by: "hweight64 (alternatives)",
        probe: &[0xf3, 0x48, 0x0f, 0xb8, 0xc0],
        cr4: 0,
    },
    Feature {
        name: "cx16",
        leaf: 1,
        subleaf: 0,
        register: ECX,
        bit: 13,
        linux_bit: 141,
        instruction: "cmpxchg16b",
        used_by: "SLUB's cmpxchg_double",
        probe: &[0x48, 0x0f, 0xc7, 0x0e],
        cr4: 0,
    },
    Feature {
        name: "movbe",
        leaf: 1,
        subleaf: 0,
        register: ECX,
        bit: 22,
        linux_bit: 150,
        instruction: "movbe",
        used_by: "compiler-independent byte swaps (checked)",
        probe: &[0x0f, 0x38, 0xf0, 0x06],
        cr4: 0,
    },
    Feature {
        name: "rdrand",
        leaf: 1,
        subleaf: 0,
        register: ECX,
        bit: 30,
        linux_bit: 158,
        instruction: "rdrand",
        used_by: "random pool seeding",
        probe: &[0x0f, 0xc7, 0xf0],
        cr4: 0,
    },
    Feature {
        name: "fsgsbase",
        leaf: 7,
        subleaf: 0,
        register: EBX,
        bit: 0,
        linux_bit: 288,
        instruction: "rdfsbase (CR4.FSGSBASE)",
        used_by: "context switch of FS/GS bases",
        probe: &[0xf3, 0x48, 0x0f, 0xae, 0xc0],
        cr4: CR4_FSGSBASE,
    },
    Feature {
        name: "bmi1",
        leaf: 7,
        subleaf: 0,
        register: EBX,
        bit: 3,
        linux_bit: 291,
        instruction: "andn",
        used_by: "alternatives of bit helpers",
        probe: &[0xc4, 0xe2, 0x78, 0xf2, 0xc0],
        cr4: 0,
    },
    Feature {
        name: "bmi2",
        leaf: 7,
        subleaf: 0,
        register: EBX,
        bit: 8,
        linux_bit: 296,
        instruction: "bzhi",
        used_by: "alternatives of bit helpers",
        probe: &[0xc4, 0xe2, 0x78, 0xf5, 0xc0],
        cr4: 0,
    },
    Feature {
        name: "invpcid",
        leaf: 7,
        subleaf: 0,
        register: EBX,
        bit: 10,
        linux_bit: 298,
        instruction: "invpcid (type 2)",
        used_by: "TLB flushes",
        // mov eax, 2; invpcid rax, (rsi)
        probe: &[0xb8, 0x02, 0, 0, 0, 0x66, 0x0f, 0x38, 0x82, 0x06],
        cr4: 0,
    },
    Feature {
        name: "rdseed",
        leaf: 7,
        subleaf: 0,
        register: EBX,
        bit: 18,
        linux_bit: 306,
        instruction: "rdseed",
        used_by: "random pool seeding",
        probe: &[0x0f, 0xc7, 0xf8],
        cr4: 0,
    },
    Feature {
        name: "smap",
        leaf: 7,
        subleaf: 0,
        register: EBX,
        bit: 20,
        linux_bit: 308,
        instruction: "stac; clac",
        used_by: "every user-memory access",
        probe: &[0x0f, 0x01, 0xcb, 0x0f, 0x01, 0xca],
        cr4: 0,
    },
    Feature {
        name: "clflushopt",
        leaf: 7,
        subleaf: 0,
        register: EBX,
        bit: 23,
        linux_bit: 311,
        instruction: "clflushopt",
        used_by: "cache flushes",
        probe: &[0x66, 0x0f, 0xae, 0x3e],
        cr4: 0,
    },
    Feature {
        name: "clwb",
        leaf: 7,
        subleaf: 0,
        register: EBX,
        bit: 24,
        linux_bit: 312,
        instruction: "clwb",
        used_by: "cache write-backs",
        probe: &[0x66, 0x0f, 0xae, 0x36],
        cr4: 0,
    },
    Feature {
        name: "pku",
        leaf: 7,
        subleaf: 0,
        register: ECX,
        bit: 3,
        linux_bit: 515,
        instruction: "rdpkru (CR4.PKE)",
        used_by: "protection-key switches",
        probe: &[0x31, 0xc9, 0x0f, 0x01, 0xee],
        cr4: CR4_PKE,
    },
    Feature {
        name: "rdpid",
        leaf: 7,
        subleaf: 0,
        register: ECX,
        bit: 22,
        linux_bit: 534,
        instruction: "rdpid",
        used_by: "per-CPU number lookups",
        probe: &[0xf3, 0x0f, 0xc7, 0xf8],
        cr4: 0,
    },
    Feature {
        name: "serialize",
        leaf: 7,
        subleaf: 0,
        register: EDX,
        bit: 14,
        linux_bit: 590,
        instruction: "serialize",
        used_by: "sync_core",
        probe: &[0x0f, 0x01, 0xe8],
        cr4: 0,
    },
];
