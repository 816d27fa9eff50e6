//! [`Machine`]: the hypervisor with its hardware — the core's [`Vpmu`], one [`PcpuPmu`] per
//! physical CPU over a software PMU model, the vCPU table and the [`SimPlatform`] — and the
//! entry points a hypervisor calls: schedule, guest RDMSR/WRMSR, control operations, and the
//! retirement of one guest instruction on a pCPU (with the PMI it may raise).

use core::fmt;

use vpmu::abi::ops::{OpError, Params};
use vpmu::{
    ExecMode, HwEvent, Interrupted, Msr, MsrAccessStats, MsrOutcome, PcpuPmu, PmiOutcome,
    PmuBackend, SoftwarePmu, VcpuId, VcpuPmu, VcpuTable, Vpmu,
};

use super::platform::SimPlatform;
use super::vendor::SimVendor;
use super::workload::{Instruction, regs};

/// A vendor's per-vCPU context type.
pub type Ctx<V> = <<V as SimVendor>::Backend as PmuBackend>::Context;

/// The vCPU table: `domains[d][v]` is vCPU `v` of domain `d`.
#[derive(Debug)]
pub struct SimVcpus<C> {
    /// Per domain, its vCPUs.
    pub domains: Vec<Vec<VcpuPmu<C>>>,
}

impl<C> SimVcpus<C> {
    /// vCPU `id`.
    pub fn get(&self, id: VcpuId) -> &VcpuPmu<C> {
        &self.domains[id.domain as usize][id.vcpu as usize]
    }

    /// Every vCPU id.
    pub fn ids(&self) -> Vec<VcpuId> {
        self.domains.iter().flatten().map(|v| v.id()).collect()
    }
}

impl<C> VcpuTable<C> for SimVcpus<C> {
    fn get_mut(&mut self, id: VcpuId) -> Option<&mut VcpuPmu<C>> {
        self.domains
            .get_mut(id.domain as usize)?
            .get_mut(id.vcpu as usize)
    }

    fn for_each_in_domain(&mut self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
        if let Some(vcpus) = self.domains.get_mut(domain as usize) {
            vcpus.iter_mut().for_each(visit);
        }
    }
}

/// A PMI the hardware raised, with the ground truth of what was retiring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmiRecord {
    /// The pCPU.
    pub pcpu: u32,
    /// The vCPU running there (for hypervisor code: on whose behalf, if anyone's).
    pub running: Option<VcpuId>,
    /// The instruction retiring at the overflow.
    pub insn: Instruction,
    /// Whether it was hypervisor code.
    pub hypervisor: bool,
    /// The core's verdict; `None` if the physical LVTPC was masked and the machine discarded
    /// the interrupt (as a local APIC discards a masked LVT interrupt).
    pub outcome: Option<PmiOutcome>,
}

/// The simulated machine.
pub struct Machine<V: SimVendor> {
    /// The vendor shape.
    pub vendor: V,
    /// The core.
    pub vpmu: Vpmu<V::Backend>,
    /// Per-pCPU state over the software models.
    pub pcpus: Vec<PcpuPmu<Ctx<V>, V::Model>>,
    /// Every vCPU.
    pub vcpus: SimVcpus<Ctx<V>>,
    /// The platform.
    pub platform: SimPlatform,
    /// Every PMI raised, in order.
    pub pmis: Vec<PmiRecord>,
    /// Instructions retired so far (the register tag `rbx` of each).
    pub retired: u64,
    /// Per pCPU: the last guest state it ran, for PMIs that interrupt the hypervisor.
    pub last_guest: Vec<Option<(VcpuId, vpmu::abi::Regs)>>,
}

impl<V: SimVendor> fmt::Debug for Machine<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Machine")
            .field("vendor", &self.vendor)
            .field("mode", &self.vpmu.mode())
            .field("pcpus", &self.pcpus.len())
            .field("retired", &self.retired)
            .finish_non_exhaustive()
    }
}

impl<V: SimVendor> Machine<V> {
    /// `pcpus` physical CPUs and domains with `vcpu_counts` vCPUs each (domain 0 privileged),
    /// in `mode`.
    pub fn new(vendor: V, pcpus: u32, vcpu_counts: &[u32], mode: u64) -> Self {
        Self::with_vpmu(
            vendor.clone(),
            Vpmu::new(vendor.backend(), mode),
            pcpus,
            vcpu_counts,
        )
    }

    /// As [`Machine::new`], with a given core (e.g. `Vpmu::unavailable`).
    pub fn with_vpmu(vendor: V, vpmu: Vpmu<V::Backend>, pcpus: u32, vcpu_counts: &[u32]) -> Self {
        let pcpu_pmus = (0..pcpus)
            .map(|_| vpmu.attach_pcpu(vendor.model()).expect("clean model"))
            .collect();
        let domains = (0..vcpu_counts.len() as u32)
            .map(|domain| {
                (0..vcpu_counts[domain as usize])
                    .map(|vcpu| vpmu.new_vcpu(VcpuId { domain, vcpu }))
                    .collect()
            })
            .collect();
        Self {
            platform: SimPlatform::new(pcpus, vcpu_counts, 0),
            vendor,
            vpmu,
            pcpus: pcpu_pmus,
            vcpus: SimVcpus { domains },
            pmis: Vec::new(),
            retired: 0,
            last_guest: vec![None; pcpus as usize],
        }
    }

    /// vCPU `id`'s core state.
    pub fn vcpu(&self, id: VcpuId) -> &VcpuPmu<Ctx<V>> {
        self.vcpus.get(id)
    }

    /// The pCPU `id` runs on, if any.
    pub fn running_on(&self, id: VcpuId) -> Option<u32> {
        (0..self.pcpus.len() as u32).find(|&p| self.pcpus[p as usize].current() == Some(id))
    }

    /// The hardware accesses every model has served.
    pub fn hw_stats(&self) -> Vec<MsrAccessStats> {
        self.pcpus
            .iter()
            .map(|cpu| cpu.hw().access_stats())
            .collect()
    }

    /// Runs `next` on `pcpu` (`None`: idle). A vCPU running elsewhere is descheduled there
    /// first: a vCPU runs on at most one pCPU.
    pub fn schedule(&mut self, pcpu: u32, next: Option<VcpuId>) {
        if let Some(id) = next {
            if let Some(other) = self.running_on(id).filter(|&q| q != pcpu) {
                self.switch(other, None);
            }
        }
        self.switch(pcpu, next);
    }

    /// One `context_switch` call.
    pub fn switch(&mut self, pcpu: u32, next: Option<VcpuId>) {
        self.vpmu
            .context_switch(
                &mut self.platform,
                &mut self.pcpus,
                &mut self.vcpus,
                pcpu,
                next,
            )
            .expect("the backend never makes the model fault");
    }

    /// A guest RDMSR by `vcpu`.
    pub fn rdmsr(&mut self, vcpu: VcpuId, msr: u32) -> MsrOutcome<u64> {
        let target = self.vcpus.get_mut(vcpu).expect("vcpu");
        self.vpmu
            .rdmsr(&mut self.platform, &mut self.pcpus, target, Msr(msr))
            .expect("the backend never makes the model fault")
    }

    /// A guest WRMSR by `vcpu`.
    pub fn wrmsr(&mut self, vcpu: VcpuId, msr: u32, value: u64) -> MsrOutcome<()> {
        let target = self.vcpus.get_mut(vcpu).expect("vcpu");
        self.vpmu
            .wrmsr(&mut self.platform, &mut self.pcpus, target, Msr(msr), value)
            .expect("the backend never makes the model fault")
    }

    /// A control operation by `caller`.
    pub fn op(&mut self, caller: VcpuId, op: u32, params: &Params) -> Result<Params, OpError> {
        self.vpmu.control_op(
            &mut self.platform,
            &mut self.pcpus,
            &mut self.vcpus,
            caller,
            op,
            params,
        )
    }

    /// Destroys vCPU `id`'s vPMU (domain destruction).
    pub fn teardown(&mut self, id: VcpuId) {
        let target = self.vcpus.get_mut(id).expect("vcpu");
        self.vpmu
            .teardown_vcpu(&mut self.platform, &mut self.pcpus, target)
            .expect("the backend never makes the model fault");
    }

    /// `pcpu`, running `vcpu`, retires `insn`: the platform records the interrupted state, the
    /// model counts one instruction (and one branch), and if its PMI line rose the PMI is
    /// taken — unless the physical LVTPC is masked, in which case it is discarded.
    pub fn retire(&mut self, pcpu: u32, insn: &Instruction) -> Option<PmiRecord> {
        let running = self.pcpus[pcpu as usize]
            .current()
            .expect("only a pCPU running a vCPU retires guest instructions");
        let state = regs(running, insn, self.retired);
        self.last_guest[pcpu as usize] = Some((running, state));
        self.platform.interrupted[pcpu as usize] = Interrupted::Guest {
            vcpu: running,
            regs: state,
        };
        self.execute(pcpu, Some(running), insn, false)
    }

    /// `pcpu` retires one instruction of hypervisor code at `rip` (CPL 0, host context), on
    /// behalf of the vCPU it runs, if any: a PMI now interrupts the hypervisor, with that
    /// vCPU's last guest registers as the ones it acts for.
    pub fn retire_hypervisor(&mut self, pcpu: u32, rip: u64) -> Option<PmiRecord> {
        let current = self.pcpus[pcpu as usize].current();
        let on_behalf_of = self.last_guest[pcpu as usize].filter(|(id, _)| Some(*id) == current);
        let insn = Instruction {
            rip,
            cpl: 0,
            branch: false,
        };
        self.platform.interrupted[pcpu as usize] = Interrupted::Hypervisor {
            regs: vpmu::abi::Regs {
                rip,
                rflags: 0x2,
                cs: 0xe008,
                ss: 0xe010,
                rbx: self.retired,
                mode: vpmu::abi::XENPMU_REGS_MODE_64 | vpmu::abi::XENPMU_REGS_MODE_HYPERVISOR,
                ..vpmu::abi::Regs::default()
            },
            on_behalf_of,
        };
        self.execute(pcpu, current, &insn, true)
    }

    fn execute(
        &mut self,
        pcpu: u32,
        running: Option<VcpuId>,
        insn: &Instruction,
        hypervisor: bool,
    ) -> Option<PmiRecord> {
        self.retired += 1;
        let mode = ExecMode {
            cpl: insn.cpl,
            host: hypervisor,
        };
        let hw = self.pcpus[pcpu as usize].hw_mut();
        hw.count(HwEvent::Instructions, 1, mode);
        if insn.branch {
            hw.count(HwEvent::Branches, 1, mode);
        }
        if !hw.take_pmi() {
            return None;
        }
        let outcome = if self.platform.physical_masked[pcpu as usize] {
            None
        } else {
            Some(
                self.vpmu
                    .handle_pmi(&mut self.platform, &mut self.pcpus, &mut self.vcpus, pcpu)
                    .expect("the backend never makes the model fault"),
            )
        };
        let record = PmiRecord {
            pcpu,
            running,
            insn: *insn,
            hypervisor,
            outcome,
        };
        self.pmis.push(record);
        Some(record)
    }

    /// Asserts `generated == delivered + dropped` for every vCPU, and that the statistics agree
    /// with the PMI records routed to it.
    pub fn assert_conservation(&self) {
        for id in self.vcpus.ids() {
            let stats = self.vcpu(id).stats();
            assert_eq!(
                stats.pmis_generated,
                stats.pmis_delivered + stats.pmis_dropped + stats.pmis_in_flight,
                "{id:?}: PMIs generated = delivered + dropped + in flight"
            );
            let (mut delivered, mut dropped) = (0, 0);
            for record in &self.pmis {
                match record.outcome {
                    Some(PmiOutcome::Delivered { to, .. }) if to == id => delivered += 1,
                    Some(PmiOutcome::Dropped { to, .. }) if to == id => dropped += 1,
                    _ => {}
                }
            }
            assert_eq!(
                (stats.pmis_delivered, stats.pmis_dropped),
                (delivered, dropped),
                "{id:?}: statistics agree with the PMIs routed to it"
            );
        }
    }
}
