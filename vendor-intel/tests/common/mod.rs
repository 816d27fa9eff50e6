//! A machine for the integration tests: the backend driving the software model as its
//! hardware, with vCPUs whose contexts are loaded and saved on it.
#![allow(dead_code)]

use vpmu::{GuestPolicy, HwRecord, Msr, MsrAccessStats, MsrOutcome, Overflow, PmuBackend};
use vpmu_intel::{IntelContext, IntelPmu, PERF_CAP_FW_WRITES};
use vpmu_models::intel::{IntelPmuModel, SyntheticCpuid};
use vpmu_models::shapes::{ALL_EVENTS, IntelShape};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

pub const KERNEL: ExecMode = ExecMode {
    cpl: 0,
    host: false,
};
pub const USER: ExecMode = ExecMode {
    cpl: 3,
    host: false,
};

pub const PMC0: u32 = 0xc1;
pub const A_PMC0: u32 = 0x4c1;
pub const EVTSEL0: u32 = 0x186;
pub const FIXED_CTR0: u32 = 0x309;
pub const PERF_CAPABILITIES: u32 = 0x345;
pub const FIXED_CTR_CTRL: u32 = 0x38d;
pub const GLOBAL_STATUS: u32 = 0x38e;
pub const GLOBAL_CTRL: u32 = 0x38f;
pub const GLOBAL_OVF_CTRL: u32 = 0x390;
pub const GLOBAL_STATUS_SET: u32 = 0x391;
pub const PEBS_ENABLE: u32 = 0x3f1;
pub const DS_AREA: u32 = 0x600;

/// EN | OS | USR.
pub const ENABLE_ALL_RINGS: u64 = (1 << 22) | (1 << 17) | (1 << 16);
pub const EVTSEL_INT: u64 = 1 << 20;
pub const INSTRUCTIONS: u64 = 0x00c0;
pub const BRANCHES: u64 = 0x00c4;
pub const CORE_CYCLES: u64 = 0x003c;

/// A PERF_CAPABILITIES a real CPU could report: LBR format 5, PEBS format 4, PEBS baseline,
/// FW_WRITE. Only bit 13 may reach a guest.
pub const RICH_PERF_CAPABILITIES: u64 = 0x5 | (0x4 << 8) | (1 << 14) | PERF_CAP_FW_WRITES;

/// The `intel-v2` test shape: v2, 4 GP, 3 fixed, no PDCM.
pub fn v2_shape() -> SyntheticCpuid {
    IntelShape::v2(ALL_EVENTS).cpuid
}

/// The `intel-v5` test shape with the debug store: v5, 8 GP, 4 fixed, PDCM and DS.
pub fn v5_shape() -> SyntheticCpuid {
    SyntheticCpuid {
        debug_store: true,
        ..IntelShape::v5(ALL_EVENTS).cpuid
    }
}

pub struct Machine {
    pub pmu: IntelPmu,
    pub hw: IntelPmuModel,
    /// What the model CPU holds between contexts, as the core keeps it for a pCPU.
    pub record: HwRecord,
}

pub struct Vcpu {
    pub ctx: IntelContext,
    pub loaded: bool,
}

impl Machine {
    /// The backend and a model of the same CPU, the model brought to the clean state.
    pub fn new(shape: SyntheticCpuid, perf_capabilities: Option<u64>) -> Self {
        let pmu = IntelPmu::from_cpuid(shape, perf_capabilities).expect("supported PMU");
        let mut hw = IntelPmuModel::new(*pmu.caps());
        pmu.clean_hardware(&mut hw).expect("model accepts cleaning");
        let mut record = HwRecord::unknown();
        record.controls_cleared();
        Machine { pmu, hw, record }
    }

    pub fn v2() -> Self {
        Self::new(v2_shape(), None)
    }

    pub fn v5() -> Self {
        Self::new(v5_shape(), Some(RICH_PERF_CAPABILITIES))
    }

    pub fn vcpu(&self) -> Vcpu {
        Vcpu {
            ctx: self.pmu.new_context(),
            loaded: false,
        }
    }

    pub fn wrmsr_with(
        &mut self,
        vcpu: &mut Vcpu,
        policy: &GuestPolicy<'_>,
        msr: u32,
        value: u64,
    ) -> MsrOutcome<()> {
        let hw = vcpu.loaded.then_some(&mut self.hw);
        self.pmu
            .guest_write(&mut vcpu.ctx, hw, policy, Msr(msr), value)
            .expect("the backend never makes the hardware fault")
    }

    pub fn wrmsr(&mut self, vcpu: &mut Vcpu, msr: u32, value: u64) -> MsrOutcome<()> {
        self.wrmsr_with(vcpu, &GuestPolicy::guest_default(), msr, value)
    }

    /// A WRMSR the test expects to succeed.
    pub fn set(&mut self, vcpu: &mut Vcpu, msr: u32, value: u64) {
        assert_eq!(
            self.wrmsr(vcpu, msr, value),
            MsrOutcome::Handled(()),
            "wrmsr {msr:#x} <- {value:#x}"
        );
    }

    pub fn rdmsr(&mut self, vcpu: &mut Vcpu, msr: u32) -> MsrOutcome<u64> {
        let hw = vcpu.loaded.then_some(&mut self.hw);
        self.pmu
            .guest_read(&mut vcpu.ctx, hw, Msr(msr))
            .expect("the backend never makes the hardware fault")
    }

    /// An RDMSR the test expects to succeed.
    pub fn get(&mut self, vcpu: &mut Vcpu, msr: u32) -> u64 {
        match self.rdmsr(vcpu, msr) {
            MsrOutcome::Handled(value) => value,
            other => panic!("rdmsr {msr:#x}: {other:?}"),
        }
    }

    pub fn load(&mut self, vcpu: &mut Vcpu) {
        assert!(!vcpu.loaded);
        self.pmu
            .load(&vcpu.ctx, &mut self.hw, &mut self.record)
            .expect("load");
        vcpu.loaded = true;
    }

    /// Saves `vcpu`; returns the overflows the save found.
    pub fn save(&mut self, vcpu: &mut Vcpu) -> Overflow {
        assert!(vcpu.loaded);
        let overflow = self
            .pmu
            .save(&mut vcpu.ctx, &mut self.hw, &mut self.record)
            .expect("save");
        vcpu.loaded = false;
        overflow
    }

    pub fn run(&mut self, event: HwEvent, n: u64, mode: ExecMode) {
        self.hw.count(event, n, mode);
    }

    pub fn stats(&self) -> MsrAccessStats {
        self.hw.access_stats()
    }

    /// Asserts the invariant between contexts: nothing can count (GLOBAL_CTRL 0; the
    /// controls may stay programmed) and no overflow is left.
    pub fn assert_nothing_counts(&self) {
        let r = self.hw.registers();
        assert_eq!(r.global_ctrl, 0, "GLOBAL_CTRL at rest");
        assert_eq!(r.global_status, 0, "GLOBAL_STATUS at rest");
    }
}
