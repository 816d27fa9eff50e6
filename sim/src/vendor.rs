//! Vendor set-ups: the backend, one software PMU model per pCPU, and the "guest perf driver" —
//! the MSR numbers and values a guest kernel writes to program, read and acknowledge counters,
//! and how it reads and edits the shared page's vendor area. Everything the suites do is written
//! once against [`SimVendor`] and [`Driver`] and run for every vendor shape. The shapes are the
//! test shapes of `vpmu_models::shapes` ([`IntelShape`], [`AmdShape`]), with every event
//! available.

use core::fmt;

use vpmu::PmuBackend;
use vpmu::abi::{CounterPair, Page, PageView, PageViewMut};
use vpmu_amd::AmdPmu;
use vpmu_intel::IntelPmu;
use vpmu_models::SoftwarePmu;
use vpmu_models::amd::{self, AmdPmuModel};
use vpmu_models::intel::{IntelPmuModel, ModelRegisters};
use vpmu_models::shapes::{ALL_EVENTS, AmdShape, IntelShape, VendorShape};

use super::truth::{CounterSetup, SimEvent};

/// Counter values are 48 bits wide on every shape the simulator uses.
pub const COUNTER_MASK: u64 = (1 << 48) - 1;
/// Global index of fixed counter 0 (Intel's GLOBAL_CTRL bit layout, `vpmu::CounterSet`).
pub const FIXED0: u32 = 32;

/// A vendor shape the simulator can build machines of.
pub trait SimVendor: Clone + fmt::Debug {
    /// The core's backend.
    type Backend: PmuBackend + fmt::Debug;
    /// The software PMU model every pCPU gets.
    type Model: SoftwarePmu + fmt::Debug;
    /// The model's raw registers, for "nothing changed" comparisons.
    type Raw: Clone + fmt::Debug + PartialEq;
    /// A label for reports.
    fn name(&self) -> String;
    /// A fresh backend.
    fn backend(&self) -> Self::Backend;
    /// A fresh model in its power-on state.
    fn model(&self) -> Self::Model;
    /// The model's raw registers.
    fn raw(model: &Self::Model) -> Self::Raw;
    /// Whether no counter of the model can count (the core's invariant between contexts:
    /// the controls may stay programmed, but nothing is enabled both locally and globally).
    fn nothing_can_count(model: &Self::Model) -> bool;
    /// The guest perf driver for this shape.
    fn driver(&self) -> Driver;
}

/// Intel architectural PMU v5: 8 GP + 4 fixed counters, full-width counter writes
/// ([`Shape::IntelV5`](crate::Shape::IntelV5), every event available).
pub fn intel_v5() -> IntelShape {
    IntelShape::v5(ALL_EVENTS)
}

/// Intel architectural PMU v2: 4 GP + 3 fixed counters, legacy counter writes only
/// ([`Shape::IntelV2`](crate::Shape::IntelV2), every event available).
pub fn intel_v2() -> IntelShape {
    IntelShape::v2(ALL_EVENTS)
}

/// AMD PerfMonV2 with 6 core counters ([`Shape::AmdPerfMonV2`](crate::Shape::AmdPerfMonV2)).
pub fn amd_v2() -> AmdShape {
    AmdShape::perfmon_v2()
}

/// AMD legacy K7: 4 counters, no global registers ([`Shape::AmdK7`](crate::Shape::AmdK7)).
pub fn amd_legacy() -> AmdShape {
    AmdShape::k7()
}

impl SimVendor for IntelShape {
    type Backend = IntelPmu;
    type Model = IntelPmuModel;
    type Raw = ModelRegisters;

    fn name(&self) -> String {
        self.to_string()
    }

    fn backend(&self) -> IntelPmu {
        VendorShape::backend(self)
    }

    fn model(&self) -> IntelPmuModel {
        VendorShape::model(self)
    }

    fn raw(model: &IntelPmuModel) -> ModelRegisters {
        *model.registers()
    }

    fn nothing_can_count(model: &IntelPmuModel) -> bool {
        let r = model.registers();
        let gp =
            (0..8).all(|i| r.event_selects[i] & (1 << 22) == 0 || r.global_ctrl & (1 << i) == 0);
        let fixed = (0..4)
            .all(|i| (r.fixed_ctrl >> (4 * i)) & 0b11 == 0 || r.global_ctrl & (1 << (32 + i)) == 0);
        gp && fixed
    }

    fn driver(&self) -> Driver {
        let caps = self.caps();
        Driver::Intel {
            gp: caps.gp_counters(),
            fixed: caps.fixed_counters(),
            full_width: caps.full_width_writes(),
        }
    }
}

impl SimVendor for AmdShape {
    type Backend = AmdPmu;
    type Model = AmdPmuModel;
    type Raw = amd::ModelRegisters;

    fn name(&self) -> String {
        self.to_string()
    }

    fn backend(&self) -> AmdPmu {
        VendorShape::backend(self)
    }

    fn model(&self) -> AmdPmuModel {
        VendorShape::model(self)
    }

    fn raw(model: &AmdPmuModel) -> amd::ModelRegisters {
        model.registers()
    }

    fn nothing_can_count(model: &AmdPmuModel) -> bool {
        model.nothing_can_count()
    }

    fn driver(&self) -> Driver {
        let caps = self.caps();
        Driver::Amd {
            counters: caps.gp_counters(),
            ext: caps.has_ext_core(),
            v2: caps.has_perfmon_v2(),
        }
    }
}

/// The guest perf driver: how a guest kernel of this shape programs its PMU. Counters are named
/// by their global index (GP `i` is `i`, Intel fixed `i` is `32 + i`), the bit layout of the
/// overflow status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// Intel architectural PMU.
    Intel {
        /// General-purpose counters.
        gp: u32,
        /// Fixed counters present (bitmap).
        fixed: u32,
        /// Full-width writes through IA32_A_PMCx.
        full_width: bool,
    },
    /// AMD core PMU.
    Amd {
        /// Core counters.
        counters: u32,
        /// The interleaved PerfCtrExtCore MSRs exist.
        ext: bool,
        /// PerfMonV2 global registers exist.
        v2: bool,
    },
}

const INTEL_PMC0: u32 = 0xc1;
const INTEL_A_PMC0: u32 = 0x4c1;
const INTEL_EVTSEL0: u32 = 0x186;
const INTEL_FIXED_CTR0: u32 = 0x309;
const INTEL_FIXED_CTR_CTRL: u32 = 0x38d;
const INTEL_GLOBAL_STATUS: u32 = 0x38e;
const INTEL_GLOBAL_CTRL: u32 = 0x38f;
const INTEL_OVF_CTRL: u32 = 0x390;
const AMD_K7_CTL0: u32 = 0xC001_0000;
const AMD_K7_CTR0: u32 = 0xC001_0004;
const AMD_EXT_CTL0: u32 = 0xC001_0200;
const AMD_GLOBAL_STATUS: u32 = 0xC000_0300;
const AMD_GLOBAL_CTL: u32 = 0xC000_0301;
const AMD_STATUS_CLR: u32 = 0xC000_0302;

/// PERFEVTSELx / PERF_CTLn bits (the same positions on both vendors).
const USR: u64 = 1 << 16;
const OS: u64 = 1 << 17;
const INT: u64 = 1 << 20;
const EN: u64 = 1 << 22;

/// Sign-extends bits 31:0, as a write through Intel's legacy counter alias does.
fn sign_extend_32(value: u64) -> u64 {
    (value as u32 as i32 as i64 as u64) & COUNTER_MASK
}

impl Driver {
    /// Whether this is an Intel shape.
    pub fn is_intel(&self) -> bool {
        matches!(self, Driver::Intel { .. })
    }

    /// The counters a guest can program for instructions or branches.
    pub fn counters(&self) -> Vec<u32> {
        match *self {
            Driver::Intel { gp, fixed, .. } => {
                let mut all: Vec<u32> = (0..gp).collect();
                if fixed & 1 != 0 {
                    all.push(FIXED0);
                }
                all
            }
            Driver::Amd { counters, .. } => (0..counters).collect(),
        }
    }

    /// Whether counter `ctr` can count `event` (fixed counter 0 counts instructions only).
    pub fn supports(&self, ctr: u32, event: SimEvent) -> bool {
        ctr < FIXED0 || event == SimEvent::Instructions
    }

    /// Whether the shape has global control and overflow status registers.
    pub fn has_global(&self) -> bool {
        match self {
            Driver::Intel { .. } => true,
            Driver::Amd { v2, .. } => *v2,
        }
    }

    /// The global enables after RESET, as the guest finds them.
    pub fn global_reset(&self) -> u64 {
        match *self {
            Driver::Intel { gp, .. } => (1u64 << gp) - 1,
            Driver::Amd {
                v2: true, counters, ..
            } => (1u64 << counters) - 1,
            Driver::Amd { .. } => u64::MAX,
        }
    }

    fn amd_ctl(ext: bool, index: u32) -> u32 {
        if ext {
            AMD_EXT_CTL0 + 2 * index
        } else {
            AMD_K7_CTL0 + index
        }
    }

    fn amd_ctr(ext: bool, index: u32) -> u32 {
        if ext {
            AMD_EXT_CTL0 + 2 * index + 1
        } else {
            AMD_K7_CTR0 + index
        }
    }

    /// The event select an event filter sees for `event` on a general-purpose counter.
    pub fn event_select(&self, event: SimEvent) -> u16 {
        match (self, event) {
            (_, SimEvent::Instructions) => 0xc0,
            (Driver::Intel { .. }, SimEvent::Branches) => 0xc4,
            (Driver::Amd { .. }, SimEvent::Branches) => 0xc2,
        }
    }

    /// The control value the guest writes for `setup` (and reads back, and finds in the page).
    pub fn control_value(&self, setup: &CounterSetup) -> u64 {
        let int = setup.period.is_some();
        if setup.ctr >= FIXED0 {
            // FIXED_CTR_CTRL nibble of fixed counter 0: OS 1, USR 2, PMI 8.
            return u64::from(setup.os) | (u64::from(setup.usr) << 1) | (u64::from(int) << 3);
        }
        let rings = (u64::from(setup.usr) * USR) | (u64::from(setup.os) * OS);
        let int = if int { INT } else { 0 };
        u64::from(self.event_select(setup.event)) | rings | int | EN
    }

    /// The WRMSR that programs `setup`'s control.
    pub fn control(&self, setup: &CounterSetup) -> (u32, u64) {
        (self.control_msr(setup.ctr), self.control_value(setup))
    }

    /// The WRMSR that disables counter `ctr`.
    pub fn disable(&self, ctr: u32) -> (u32, u64) {
        (self.control_msr(ctr), 0)
    }

    /// The control MSR of `ctr`.
    pub fn control_msr(&self, ctr: u32) -> u32 {
        match *self {
            Driver::Intel { .. } if ctr >= FIXED0 => INTEL_FIXED_CTR_CTRL,
            Driver::Intel { .. } => INTEL_EVTSEL0 + ctr,
            Driver::Amd { ext, .. } => Self::amd_ctl(ext, ctr),
        }
    }

    /// The WRMSR that sets counter `ctr` to `value` (masked as the driver masks it).
    pub fn write_counter(&self, ctr: u32, value: u64) -> (u32, u64) {
        match *self {
            Driver::Intel { .. } if ctr >= FIXED0 => {
                (INTEL_FIXED_CTR0 + ctr - FIXED0, value & COUNTER_MASK)
            }
            Driver::Intel {
                full_width: true, ..
            } => (INTEL_A_PMC0 + ctr, value & COUNTER_MASK),
            Driver::Intel { .. } => (INTEL_PMC0 + ctr, value & 0xffff_ffff),
            Driver::Amd { ext, .. } => (Self::amd_ctr(ext, ctr), value & COUNTER_MASK),
        }
    }

    /// What counter `ctr` holds after [`Driver::write_counter`] of `value`.
    pub fn stored(&self, ctr: u32, value: u64) -> u64 {
        match *self {
            Driver::Intel {
                full_width: false, ..
            } if ctr < FIXED0 => sign_extend_32(value),
            _ => value & COUNTER_MASK,
        }
    }

    /// The MSR the guest reads counter `ctr` through.
    pub fn read_counter(&self, ctr: u32) -> u32 {
        match *self {
            Driver::Intel { .. } if ctr >= FIXED0 => INTEL_FIXED_CTR0 + ctr - FIXED0,
            Driver::Intel { .. } => INTEL_PMC0 + ctr,
            Driver::Amd { ext, .. } => Self::amd_ctr(ext, ctr),
        }
    }

    /// The WRMSR enabling exactly `mask` globally, if the shape has a global control.
    pub fn global_enable(&self, mask: u64) -> Option<(u32, u64)> {
        match self {
            Driver::Intel { .. } => Some((INTEL_GLOBAL_CTRL, mask)),
            Driver::Amd { v2: true, .. } => Some((AMD_GLOBAL_CTL, mask)),
            Driver::Amd { .. } => None,
        }
    }

    /// The overflow status MSR, if any.
    pub fn status_msr(&self) -> Option<u32> {
        match self {
            Driver::Intel { .. } => Some(INTEL_GLOBAL_STATUS),
            Driver::Amd { v2: true, .. } => Some(AMD_GLOBAL_STATUS),
            Driver::Amd { .. } => None,
        }
    }

    /// The WRMSR acknowledging the overflows `bits`, if the shape has a status register.
    pub fn ack(&self, bits: u64) -> Option<(u32, u64)> {
        match self {
            Driver::Intel { .. } => Some((INTEL_OVF_CTRL, bits)),
            Driver::Amd { v2: true, .. } => Some((AMD_STATUS_CLR, bits)),
            Driver::Amd { .. } => None,
        }
    }

    /// Counter `ctr` as the page's vendor area shows it.
    pub fn page_counter(&self, view: &PageView<'_>, ctr: u32) -> u64 {
        let index = (ctr % FIXED0) as usize;
        match self {
            Driver::Intel { .. } => {
                let intel = view.intel().expect("intel context");
                if ctr >= FIXED0 {
                    intel.fixed_counter(index).expect("fixed bank")
                } else {
                    intel.pair(index).expect("gp bank").counter
                }
            }
            Driver::Amd { .. } => view
                .amd()
                .expect("amd context")
                .counter(index)
                .expect("bank"),
        }
    }

    /// Counter `ctr`'s control as the page shows it (the FIXED_CTR_CTRL nibble for fixed 0).
    pub fn page_control(&self, view: &PageView<'_>, ctr: u32) -> u64 {
        let index = (ctr % FIXED0) as usize;
        match self {
            Driver::Intel { .. } => {
                let intel = view.intel().expect("intel context");
                if ctr >= FIXED0 {
                    (intel.ctxt().fixed_ctrl >> (4 * index)) & 0xf
                } else {
                    intel.pair(index).expect("gp bank").control
                }
            }
            Driver::Amd { .. } => view.amd().expect("amd context").ctrl(index).expect("bank"),
        }
    }

    /// The overflow status the page shows (0 without global registers).
    pub fn page_status(&self, view: &PageView<'_>) -> u64 {
        match self {
            Driver::Intel { .. } => view.intel().expect("intel context").ctxt().global_status,
            Driver::Amd { .. } => view.amd().expect("amd context").ctxt().global_status,
        }
    }

    /// The guest's PMI handler edits of the cached context: re-arm counters `rearm` (global
    /// index, value) and acknowledge `ack` (Intel: through `global_ovf_ctrl` when
    /// `ack_via_ovf_ctrl`, else by clearing `global_status`; AMD PerfMonV2: by clearing it).
    pub fn edit_page(&self, page: &mut Page, rearm: &[(u32, u64)], ack: u64, ack_via_ovf: bool) {
        let mut view = PageViewMut::new(page).expect("valid header");
        match self {
            Driver::Intel { .. } => view
                .edit_intel(|ctxt, banks, area| {
                    for &(ctr, value) in rearm {
                        let index = (ctr % FIXED0) as usize;
                        if ctr >= FIXED0 {
                            banks.set_fixed_counter(area, index, value).expect("fixed");
                        } else {
                            let control = banks.pair(area, index).expect("gp").control;
                            let pair = CounterPair {
                                counter: value,
                                control,
                            };
                            banks.set_pair(area, index, pair).expect("gp");
                        }
                    }
                    if ack_via_ovf {
                        ctxt.global_ovf_ctrl |= ack;
                    } else {
                        ctxt.global_status &= !ack;
                    }
                })
                .expect("intel context"),
            Driver::Amd { .. } => view
                .edit_amd(|ctxt, banks, area| {
                    for &(ctr, value) in rearm {
                        banks.set_counter(area, ctr as usize, value).expect("bank");
                    }
                    ctxt.global_status &= !ack;
                })
                .expect("amd context"),
        }
    }
}
