//! The end of the run: every vCPU is switched out, the mode is brought back to self, and
//! each pCPU checks that its hardware is clean before it detaches.

use std::thread;

use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{XENPMU_MODE_SELF, XENPMU_OP_MODE_SET};
use vpmu::{SystemContext, VcpuId};

use vpmu_sim::SimVendor;

use crate::smp::shared::lock;

use super::Runner;

impl<V: SimVendor> Runner<'_, V> {
    /// Every vCPU is switched out, the mode is brought back to self (so that no system-wide
    /// context keeps a pCPU busy), and each pCPU checks its hardware is clean and detaches.
    pub(super) fn finale(mut self) {
        if !self.barrier() {
            return;
        }
        self.note("finale: switch out".into());
        if self.pcpu.current().is_some() {
            self.switch(None);
        }
        if !self.barrier() {
            return;
        }
        if self.here == 0 {
            self.final_mode_set();
        }
        if !self.barrier() {
            return;
        }
        self.drain();
        let system = !matches!(self.pcpu.system(), SystemContext::Absent);
        let clean = V::nothing_can_count(self.pcpu.hw().model());
        if self.pcpu.current().is_some() || system || !clean {
            self.find(
                "something can count on an idle pCPU at the end",
                format!(
                    "current {:?}, system context {system}, hardware clean {clean}: {:?}",
                    self.pcpu.current(),
                    V::raw(self.pcpu.hw().model())
                ),
            );
        }
        if self.platform.physical_masked || self.pcpu.lvtpc_masked() {
            self.find(
                "physical LVTPC left masked at the end",
                format!(
                    "platform masked {}, core masked for {:?}",
                    self.platform.physical_masked,
                    self.pcpu.lvtpc_masked()
                ),
            );
        }
        if !self.barrier() {
            return;
        }
        self.drain();
        let Runner {
            vpmu,
            mut platform,
            pcpu,
            shared,
            here,
            table,
            ..
        } = self;
        let left = lock(&shared.queues[here as usize]).len();
        let hw = vpmu
            .detach_pcpu(&mut platform, pcpu, table)
            .expect("detach");
        if left != 0 || !V::nothing_can_count(hw.model()) {
            shared.finding(
                "something can count on a pCPU at detach",
                format!(
                    "seed {:#x}: pCPU {here}: {left} requests left, hardware {:?}",
                    shared.seed,
                    V::raw(hw.model())
                ),
            );
        }
        shared.coverage.add("requests sent", platform.requests_sent);
        shared.coverage.add("diagnostics", platform.diagnostics);
    }

    fn final_mode_set(&mut self) {
        let caller = VcpuId { domain: 0, vcpu: 0 };
        assert!(self.claim(caller), "every vCPU is free at the end");
        self.switch(Some(caller));
        let mut wait = self.waiting();
        loop {
            if self.aborted() {
                return;
            }
            self.step += 1;
            self.drain();
            match self.op(
                caller,
                XENPMU_OP_MODE_SET,
                &Params::new(XENPMU_MODE_SELF, 0),
            ) {
                Ok(_) => break,
                Err(OpError::Again) => self.check_livelock(&mut wait, "the final mode set"),
                Err(e) => {
                    self.find("final mode set to self refused", format!("{e:?}"));
                    break;
                }
            }
        }
        // The change is complete only when every pCPU caught up.
        while self.vpmu.change_in_progress() && !self.aborted() {
            self.drain();
            thread::yield_now();
        }
        self.switch(None);
    }
}
