//! A vCPU harness: the AMD backend with the software model as its hardware.
#![allow(dead_code)]

use vpmu::{
    CountingBus, GuestPolicy, HwRecord, Msr, MsrAccessStats, MsrOutcome, Overflow, PmuBackend,
};
use vpmu_amd::{AmdCaps, AmdContext, AmdPmu, PmuShape};
use vpmu_models::amd::AmdPmuModel;
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

pub const K7_CTL: u32 = 0xC001_0000;
pub const K7_CTR: u32 = 0xC001_0004;
pub const EXT_CTL: u32 = 0xC001_0200;
pub const GLOBAL_STATUS: u32 = 0xC000_0300;
pub const GLOBAL_CTL: u32 = 0xC000_0301;
pub const GLOBAL_STATUS_CLR: u32 = 0xC000_0302;
pub const GLOBAL_STATUS_SET: u32 = 0xC000_0303;

pub const USR: u64 = 1 << 16;
pub const OS: u64 = 1 << 17;
pub const INT: u64 = 1 << 20;
pub const EN: u64 = 1 << 22;
pub const GUEST_ONLY: u64 = 1 << 40;
pub const HOST_ONLY: u64 = 1 << 41;
pub const MASK48: u64 = 0xffff_ffff_ffff;

/// Zen encodings.
pub const INSTRUCTIONS: u64 = 0xc0;
pub const BRANCHES: u64 = 0xc2;
pub const CYCLES: u64 = 0x76;

pub const KERNEL: ExecMode = ExecMode {
    cpl: 0,
    host: false,
};
pub const USER: ExecMode = ExecMode {
    cpl: 3,
    host: false,
};
pub const HOST: ExecMode = ExecMode { cpl: 0, host: true };

pub const SHAPES: [PmuShape; 5] = [
    PmuShape::LegacyK7,
    PmuShape::PerfCtrExtCore,
    PmuShape::PerfMonV2 { counters: 6 },
    PmuShape::PerfMonV2 { counters: 3 },
    PmuShape::PerfMonV2 { counters: 1 },
];

pub fn ext_ctl(i: u32) -> u32 {
    EXT_CTL + 2 * i
}

pub fn ext_ctr(i: u32) -> u32 {
    EXT_CTL + 2 * i + 1
}

pub fn pmu(shape: PmuShape) -> AmdCaps {
    AmdCaps::from_shape(shape).expect("test shapes are valid")
}

/// The control MSR of counter `i` a guest of this shape would use.
pub fn ctl_msr(shape: PmuShape, i: u32) -> u32 {
    match shape {
        PmuShape::LegacyK7 => K7_CTL + i,
        _ => ext_ctl(i),
    }
}

/// The counter MSR of counter `i` a guest of this shape would use.
pub fn ctr_msr(shape: PmuShape, i: u32) -> u32 {
    match shape {
        PmuShape::LegacyK7 => K7_CTR + i,
        _ => ext_ctr(i),
    }
}

/// One vCPU with its context loaded on a model CPU.
pub struct Vcpu {
    pub backend: AmdPmu,
    pub ctx: AmdContext,
    pub hw: AmdPmuModel,
    pub policy: GuestPolicy<'static>,
    pub loaded: bool,
    /// What the model CPU holds between contexts, as the core keeps it for a pCPU.
    pub record: HwRecord,
}

impl Vcpu {
    /// A loaded, freshly reset vCPU on a clean model CPU.
    pub fn new(shape: PmuShape) -> Self {
        Self::with_policy(shape, GuestPolicy::guest_default())
    }

    pub fn with_policy(shape: PmuShape, policy: GuestPolicy<'static>) -> Self {
        let pmu = pmu(shape);
        let backend = AmdPmu::new(pmu).expect("backend");
        let mut hw = AmdPmuModel::new(pmu);
        backend.clean_hardware(&mut hw).expect("clean");
        let mut record = HwRecord::unknown();
        record.controls_cleared();
        let ctx = backend.new_context();
        backend.load(&ctx, &mut hw, &mut record).expect("load");
        Self {
            backend,
            ctx,
            hw,
            policy,
            loaded: true,
            record,
        }
    }

    pub fn write(&mut self, msr: u32, value: u64) -> MsrOutcome<()> {
        let hw = self.loaded.then_some(&mut self.hw);
        self.backend
            .guest_write(&mut self.ctx, hw, &self.policy, Msr(msr), value)
            .expect("the model never faults on what the backend sends")
    }

    pub fn read(&mut self, msr: u32) -> MsrOutcome<u64> {
        let hw = self.loaded.then_some(&mut self.hw);
        self.backend
            .guest_read(&mut self.ctx, hw, Msr(msr))
            .expect("the model never faults on what the backend sends")
    }

    /// A read that must succeed.
    pub fn value(&mut self, msr: u32) -> u64 {
        match self.read(msr) {
            MsrOutcome::Handled(v) => v,
            other => panic!("read of {msr:#x}: {other:?}"),
        }
    }

    /// A write that must succeed.
    pub fn set(&mut self, msr: u32, value: u64) {
        assert_eq!(
            self.write(msr, value),
            MsrOutcome::Handled(()),
            "write {value:#x} to {msr:#x}"
        );
    }

    pub fn run(&mut self, event: HwEvent, n: u64, mode: ExecMode) {
        self.hw.count(event, n, mode);
    }

    pub fn save(&mut self) -> MsrAccessStats {
        assert!(self.loaded);
        let mut bus = CountingBus::new(&mut self.hw);
        self.backend
            .save(&mut self.ctx, &mut bus, &mut self.record)
            .expect("save");
        self.loaded = false;
        bus.stats()
    }

    /// Saves, returning the overflows the save found.
    pub fn save_overflow(&mut self) -> Overflow {
        assert!(self.loaded);
        let overflow = self
            .backend
            .save(&mut self.ctx, &mut self.hw, &mut self.record)
            .expect("save");
        self.loaded = false;
        overflow
    }

    pub fn load(&mut self) -> MsrAccessStats {
        assert!(!self.loaded);
        let mut bus = CountingBus::new(&mut self.hw);
        self.backend
            .load(&self.ctx, &mut bus, &mut self.record)
            .expect("load");
        self.loaded = true;
        bus.stats()
    }

    /// Whether nothing can count on the model, the state `save` must leave: with PerfMonV2
    /// GlobalCtl 0 (the controls may stay programmed), before it every EN clear; and no
    /// status bit left.
    pub fn nothing_can_count(&self) -> bool {
        let regs = self.hw.registers();
        let stopped = if self.backend.caps().has_perfmon_v2() {
            regs.global_ctl == 0
        } else {
            regs.controls.iter().all(|&c| c & EN == 0)
        };
        stopped && regs.global_status == 0
    }
}
