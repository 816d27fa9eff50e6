//! Guest actions on a bare [`Machine`], for the deterministic suites that drive it step by
//! step (operation matrix, switch traffic, lifecycle): register a page, program counters,
//! retire instructions.

use vpmu::abi::ops::Params;
use vpmu::abi::{PageViewMut, XENPMU_OP_INIT, XENPMU_OP_LVTPC_SET};
use vpmu::{MsrOutcome, VcpuId};

use super::machine::{Machine, PmiRecord};
use super::platform::guest_frame;
use super::truth::{CounterSetup, SimEvent};
use super::vendor::SimVendor;
use super::workload::{Instruction, function_base};

/// A counter counting instructions in both rings from `initial`.
pub fn counting(ctr: u32, initial: u64) -> CounterSetup {
    CounterSetup {
        ctr,
        event: SimEvent::Instructions,
        os: true,
        usr: true,
        period: None,
        initial,
    }
}

/// A counter interrupting every `period` instructions in both rings.
pub fn sampling(ctr: u32, period: u64) -> CounterSetup {
    CounterSetup {
        period: Some(period),
        ..counting(ctr, 0)
    }
}

impl<V: SimVendor> Machine<V> {
    /// `id` registers its page (frame `vcpu` of its domain) and unmasks the page's LVTPC.
    /// Returns the frame.
    pub fn register_page(&mut self, id: VcpuId) -> u64 {
        let gfn = guest_frame(id.domain, u64::from(id.vcpu));
        let init = self.op(id, XENPMU_OP_INIT, &Params::new(gfn, id.vcpu));
        assert!(init.is_ok(), "{id:?} init: {init:?}");
        PageViewMut::new(self.platform.frame_mut(id.domain, gfn))
            .expect("initialised")
            .set_lvtpc_masked(false);
        let unmask = self.op(id, XENPMU_OP_LVTPC_SET, &Params::new(0, 0));
        assert!(unmask.is_ok(), "{id:?} lvtpc_set: {unmask:?}");
        gfn
    }

    /// A WRMSR by `id` that must be handled.
    pub fn write(&mut self, id: VcpuId, (msr, value): (u32, u64)) {
        assert_eq!(
            self.wrmsr(id, msr, value),
            MsrOutcome::Handled(()),
            "{id:?} WRMSR {msr:#x} <- {value:#x}"
        );
    }

    /// An RDMSR by `id` that must be handled.
    pub fn read(&mut self, id: VcpuId, msr: u32) -> u64 {
        match self.rdmsr(id, msr) {
            MsrOutcome::Handled(value) => value,
            other => panic!("{id:?} RDMSR {msr:#x}: {other:?}"),
        }
    }

    /// `id` programs `setups` with its perf driver and enables exactly them globally.
    pub fn program(&mut self, id: VcpuId, setups: &[CounterSetup]) {
        let driver = self.vendor.driver();
        let mut global = 0;
        for setup in setups {
            self.write(id, driver.write_counter(setup.ctr, setup.start_value()));
            self.write(id, driver.control(setup));
            global |= setup.bit();
        }
        if let Some(enable) = driver.global_enable(global) {
            self.write(id, enable);
        }
    }

    /// `pcpu`'s vCPU retires `count` kernel instructions of its domain's function 0; returns
    /// the PMIs raised.
    pub fn run(&mut self, pcpu: u32, count: u64) -> Vec<PmiRecord> {
        let domain = self.pcpus[pcpu as usize]
            .current()
            .expect("a vCPU runs")
            .domain;
        (0..count)
            .filter_map(|k| {
                let insn = Instruction {
                    rip: function_base(domain, 0) + 4 * (k % 0x4000),
                    cpl: 0,
                    branch: false,
                };
                self.retire(pcpu, &insn)
            })
            .collect()
    }
}
