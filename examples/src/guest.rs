//! The guest's side: what a guest kernel's perf driver writes to program a counter, for the PMU
//! its CPUID describes. Only the register numbers differ between the vendors; the control bits
//! and the event (0xC0, instructions retired) are the same on both.

use vpmu_vendor_any::vpmu::{PmuCapabilities, Vendor};

/// PERFEVTSELx / PERF_CTLn: count in user mode (USR), in kernel mode (OS), interrupt on
/// overflow (INT), enable (EN).
const USR: u64 = 1 << 16;
const OS: u64 = 1 << 17;
const INT: u64 = 1 << 20;
const EN: u64 = 1 << 22;
/// Instructions retired (Intel's architectural event 0xC0, umask 0; AMD's event 0xC0).
const INSTRUCTIONS_RETIRED: u64 = 0xc0;

/// The guest's perf driver for the PMU the guest's CPUID describes.
#[derive(Clone, Copy, Debug)]
pub struct PerfDriver {
    vendor: Vendor,
    /// Whether the PMU has a global control (Intel v2+, AMD PerfMonV2).
    global_ctrl: bool,
}

impl PerfDriver {
    /// The driver for a guest shown `pmu` (a hypervisor derives the guest's CPUID from it:
    /// `IntelCaps::guest_leaf_0xa`, `AmdCaps::guest_leaves`).
    pub fn new(pmu: &PmuCapabilities) -> Self {
        PerfDriver {
            vendor: pmu.vendor,
            global_ctrl: pmu.global_ctrl,
        }
    }

    /// The control register of general-purpose counter `i`: IA32_PERFEVTSELi, or the K7
    /// PERF_CTLi (every AMD PMU has counters 0–3 there).
    pub fn control_msr(&self, i: u32) -> u32 {
        match self.vendor {
            Vendor::Intel => 0x186 + i,
            Vendor::Amd => 0xc001_0000 + i,
        }
    }

    /// The counter register of general-purpose counter `i`: IA32_PMCi (a write sign-extends
    /// bits 31:0, so `-period` works on every Intel PMU), or the K7 PERF_CTRi.
    pub fn counter_msr(&self, i: u32) -> u32 {
        match self.vendor {
            Vendor::Intel => 0xc1 + i,
            Vendor::Amd => 0xc001_0004 + i,
        }
    }

    /// The global control (IA32_PERF_GLOBAL_CTRL, PerfCntrGlobalCtl), if the PMU has one.
    pub fn global_ctrl_msr(&self) -> Option<u32> {
        match (self.vendor, self.global_ctrl) {
            (_, false) => None,
            (Vendor::Intel, true) => Some(0x38f),
            (Vendor::Amd, true) => Some(0xc000_0301),
        }
    }

    /// The control value counting instructions retired in both rings, interrupting on
    /// overflow when `interrupt`.
    pub fn count_instructions(&self, interrupt: bool) -> u64 {
        EN | OS | USR | INSTRUCTIONS_RETIRED | if interrupt { INT } else { 0 }
    }

    /// The counter value that overflows after `period` more events (48-bit counters).
    pub fn overflow_after(&self, period: u64) -> u64 {
        (1u64 << 48) - period
    }
}
