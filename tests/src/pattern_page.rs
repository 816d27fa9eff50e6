//! The deterministic pages and parameter blocks that `tests/c/roundtrip.c` also builds.

use vpmu_abi::writer::{init_page, publish_sample, publish_sample_info};
use vpmu_abi::{
    AmdBanks, CounterPair, Identity, IntelBanks, Page, Params, Regs, SampleInfo, VendorLayout,
    XENPMU_CHAIN_COMPLETE, XENPMU_REGS_MODE_64, XENPMU_REGS_MODE_USER,
};

/// Intel fixed counters in the pattern page.
pub const INTEL_FIXED: u32 = 4;
/// Intel GP counters in the pattern page.
pub const INTEL_GP: u32 = 8;
/// AMD core counters in the pattern page.
pub const AMD_COUNTERS: u32 = 6;

/// The value for slot `k`; the C side's `xp_pattern`. Bits in both 32-bit halves.
pub fn pattern(k: u32) -> u64 {
    0x8000_0000_0000_0000
        | (u64::from(k) << 40)
        | (u64::from(k.wrapping_mul(7).wrapping_add(3)) << 16)
        | u64::from(k)
}

/// Which vendor context a pattern page carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// Intel, 4 fixed + 8 GP counters.
    Intel,
    /// AMD, 6 core counters.
    Amd,
}

impl Vendor {
    /// The name the C program uses in its mode argument.
    pub fn c_name(self) -> &'static str {
        match self {
            Vendor::Intel => "intel",
            Vendor::Amd => "amd",
        }
    }
}

/// The registers of the pattern sample.
pub fn pattern_regs() -> Regs {
    Regs {
        rax: pattern(0),
        rbx: pattern(1),
        rcx: pattern(2),
        rdx: pattern(3),
        rsi: pattern(4),
        rdi: pattern(5),
        rbp: pattern(6),
        rsp: pattern(7),
        r8: pattern(8),
        r9: pattern(9),
        r10: pattern(10),
        r11: pattern(11),
        r12: pattern(12),
        r13: pattern(13),
        r14: pattern(14),
        r15: pattern(15),
        rip: pattern(16),
        rflags: pattern(17),
        cs: 0x33,
        ss: 0x2b,
        ds: 0x2b,
        es: 0x2b,
        fs: 0x53,
        gs: 0x63,
        cpl: 3,
        mode: XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_USER,
        ..Regs::default()
    }
}

/// The identity of the pattern sample.
pub fn pattern_identity() -> Identity {
    Identity {
        domain_id: 42,
        vcpu_id: 3,
        pcpu_id: 1,
        _pad0: 0,
    }
}

/// The sample details of the pattern sample (version 1.2).
pub fn pattern_sample_info() -> SampleInfo {
    let mut info = SampleInfo {
        tsc: pattern(60),
        tsc_khz: pattern(61),
        sequence: pattern(62),
        overflowed: pattern(63),
        chain_len: 3,
        chain_end: XENPMU_CHAIN_COMPLETE,
        ..SampleInfo::default()
    };
    for (i, slot) in (0u32..).zip(&mut info.callchain[..3]) {
        *slot = pattern(400 + i);
    }
    info
}

/// The pattern page, built with the hypervisor-side helpers of `vpmu-abi`.
pub fn pattern_page(vendor: Vendor) -> Page {
    let mut page = Page::zeroed();
    match vendor {
        Vendor::Intel => {
            let banks = IntelBanks::new(INTEL_FIXED, INTEL_GP).expect("4 fixed + 8 GP fit");
            init_page(&mut page, &VendorLayout::Intel(banks));
            let mut ctxt = page.vendor.intel_ctxt();
            ctxt.global_ctrl = pattern(100);
            ctxt.global_status = pattern(101);
            ctxt.global_ovf_ctrl = pattern(102);
            ctxt.fixed_ctrl = pattern(103);
            ctxt.ds_area = pattern(104);
            ctxt.pebs_enable = pattern(105);
            page.vendor.set_intel_ctxt(&ctxt);
            for i in 0..INTEL_FIXED {
                banks
                    .set_fixed_counter(&mut page.vendor, i as usize, pattern(200 + i))
                    .expect("in range");
            }
            for i in 0..INTEL_GP {
                let pair = CounterPair {
                    counter: pattern(300 + 2 * i),
                    control: pattern(301 + 2 * i),
                };
                banks
                    .set_pair(&mut page.vendor, i as usize, pair)
                    .expect("in range");
            }
        }
        Vendor::Amd => {
            let banks = AmdBanks::new(AMD_COUNTERS).expect("6 counters fit");
            init_page(&mut page, &VendorLayout::Amd(banks));
            let mut ctxt = page.vendor.amd_ctxt();
            ctxt.global_ctrl = pattern(100);
            ctxt.global_status = pattern(101);
            page.vendor.set_amd_ctxt(&ctxt);
            for i in 0..AMD_COUNTERS {
                banks
                    .set_counter(&mut page.vendor, i as usize, pattern(200 + i))
                    .expect("in range");
                banks
                    .set_ctrl(&mut page.vendor, i as usize, pattern(300 + i))
                    .expect("in range");
            }
        }
    }
    publish_sample_info(&mut page, &pattern_sample_info());
    publish_sample(&mut page, &pattern_identity(), &pattern_regs());
    page.dropped_samples = pattern(50);
    page
}

/// The pattern parameter block.
pub fn pattern_params() -> Params {
    Params::new(pattern(7), 5)
}
