//! Domain reboots: every vCPU of a domain is torn down while none of them runs.

use std::sync::atomic::Ordering;

use vpmu::{Completion, VcpuId};

use vpmu_sim::SimVendor;

use crate::smp::shared::{FREE, REBOOTING};

use super::Runner;

impl<V: SimVendor> Runner<'_, V> {
    /// A domain is destroyed and rebuilt: none of its vCPUs may run meanwhile, so tearing
    /// each down must need no other pCPU (nothing is left loaded where a vCPU does not run).
    pub(super) fn reboot_random(&mut self) {
        let domain = 1 + self.rng.below(self.shared.vcpu_counts.len() as u64 - 1) as u32;
        let ids: Vec<VcpuId> = (0..self.shared.vcpu_counts[domain as usize])
            .map(|vcpu| VcpuId { domain, vcpu })
            .collect();
        let mark = REBOOTING + self.here;
        let mut claimed = Vec::new();
        for &id in &ids {
            let claim = self.shared.claims[self.shared.flat(id)].compare_exchange(
                FREE,
                mark,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            if claim.is_err() {
                break;
            }
            claimed.push(id);
        }
        if claimed.len() == ids.len() {
            self.note(format!("reboot domain {domain}"));
            for &id in &ids {
                self.in_hypervisor(self.pcpu.current());
                let result =
                    self.vpmu
                        .teardown_vcpu(&mut self.platform, &mut self.pcpu, self.table, id);
                if self.core_ok("teardown_vcpu", result) != Completion::Done {
                    self.find(
                        "teardown of a vCPU that runs nowhere needed another pCPU",
                        format!("{id:?}: its context was left loaded somewhere"),
                    );
                    let mut wait = self.waiting();
                    loop {
                        self.drain();
                        self.in_hypervisor(self.pcpu.current());
                        let result = self.vpmu.teardown_vcpu(
                            &mut self.platform,
                            &mut self.pcpu,
                            self.table,
                            id,
                        );
                        if self.core_ok("teardown_vcpu", result) == Completion::Done
                            || self.aborted()
                        {
                            break;
                        }
                        self.check_livelock(&mut wait, "a teardown");
                    }
                }
            }
            self.shared.coverage.hit("domains rebooted");
        }
        for id in claimed {
            self.shared.claims[self.shared.flat(id)].store(FREE, Ordering::SeqCst);
        }
    }
}
