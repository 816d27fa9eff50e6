//! [`Machine`]: the hypervisor with its hardware — the core's [`Vpmu`], one [`PcpuPmu`] per
//! physical CPU over a software PMU model, the vCPU table and the [`SimPlatform`] — and the
//! entry points a hypervisor calls: schedule, guest RDMSR/WRMSR, control operations, and the
//! retirement of one guest instruction on a pCPU (with the PMI it may raise).

use core::cell::{Ref, RefCell};
use core::fmt;

use vpmu::abi::ops::{OpError, Params};
use vpmu::{
    Completion, CrossCpuRequest, Interrupted, Mode, Msr, MsrAccessStats, MsrOutcome, PcpuPmu,
    PmiOutcome, PmuBackend, VcpuId, VcpuPmu, VcpuTable, Vpmu,
};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

use super::platform::SimPlatform;
use super::vendor::SimVendor;
use super::workload::{Instruction, regs};

/// A vendor's per-vCPU context type.
pub type Ctx<V> = <<V as SimVendor>::Backend as PmuBackend>::Context;

/// The vCPU table: `domains[d][v]` is vCPU `v` of domain `d`, each in its own `RefCell` as an
/// SMP hypervisor keeps each behind its own lock: a core that visited one vCPU while holding
/// another would panic here.
#[derive(Debug)]
pub struct SimVcpus<C> {
    /// Per domain, its vCPUs.
    pub domains: Vec<Vec<RefCell<VcpuPmu<C>>>>,
}

impl<C> SimVcpus<C> {
    /// vCPU `id`.
    pub fn get(&self, id: VcpuId) -> Ref<'_, VcpuPmu<C>> {
        self.domains[id.domain as usize][id.vcpu as usize].borrow()
    }

    /// vCPU `id`, for a direct edit by a test.
    pub fn get_mut(&mut self, id: VcpuId) -> &mut VcpuPmu<C> {
        self.domains[id.domain as usize][id.vcpu as usize].get_mut()
    }

    /// Every vCPU id.
    pub fn ids(&self) -> Vec<VcpuId> {
        self.domains
            .iter()
            .flatten()
            .map(|v| v.borrow().id())
            .collect()
    }
}

impl<C> VcpuTable<C> for SimVcpus<C> {
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) -> bool {
        let Some(cell) = self
            .domains
            .get(id.domain as usize)
            .and_then(|d| d.get(id.vcpu as usize))
        else {
            return false;
        };
        visit(
            &mut cell
                .try_borrow_mut()
                .expect("the core never nests vCPU visits"),
        );
        true
    }

    #[inline]
    fn visit<R, F>(&self, id: VcpuId, visit: F) -> Option<R>
    where
        F: FnOnce(&mut VcpuPmu<C>) -> R,
    {
        let cell = self
            .domains
            .get(id.domain as usize)?
            .get(id.vcpu as usize)?;
        Some(visit(
            &mut cell
                .try_borrow_mut()
                .expect("the core never nests vCPU visits"),
        ))
    }

    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
        if let Some(vcpus) = self.domains.get(domain as usize) {
            for cell in vcpus {
                visit(
                    &mut cell
                        .try_borrow_mut()
                        .expect("the core never nests vCPU visits"),
                );
            }
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
    /// Whether requests stay queued until a test completes them (`complete_requests`), to
    /// look at the window before a target pCPU acts.
    pub hold_requests: bool,
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
            Vpmu::new(
                vendor.backend(),
                Mode::from_abi(mode).expect("a valid mode"),
                pcpus,
            ),
            pcpus,
            vcpu_counts,
        )
    }

    /// As [`Machine::new`], with a given core (e.g. `Vpmu::unavailable`).
    pub fn with_vpmu(vendor: V, vpmu: Vpmu<V::Backend>, pcpus: u32, vcpu_counts: &[u32]) -> Self {
        let pcpu_pmus = (0..pcpus)
            .map(|index| {
                vpmu.attach_pcpu(index, vendor.model())
                    .expect("clean model")
            })
            .collect();
        let domains = (0..vcpu_counts.len() as u32)
            .map(|domain| {
                (0..vcpu_counts[domain as usize])
                    .map(|vcpu| {
                        RefCell::new(
                            vpmu.new_vcpu(VcpuId { domain, vcpu })
                                .expect("domain ids below the reserved range"),
                        )
                    })
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
            hold_requests: false,
        }
    }

    /// vCPU `id`'s core state.
    pub fn vcpu(&self, id: VcpuId) -> Ref<'_, VcpuPmu<Ctx<V>>> {
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

    /// One `context_switch` call on `pcpu`.
    pub fn switch(&mut self, pcpu: u32, next: Option<VcpuId>) {
        self.complete_requests(pcpu);
        self.platform.calling_pcpu = Some(pcpu);
        self.vpmu
            .context_switch(
                &mut self.platform,
                &mut self.pcpus[pcpu as usize],
                &self.vcpus,
                next,
            )
            .expect("the backend never makes the model fault");
        self.platform.calling_pcpu = None;
        self.deliver_requests();
    }

    /// The pCPU a call on behalf of `vcpu` is made on: where it runs, else pCPU 0 (a vCPU
    /// that runs nowhere has nothing loaded anywhere).
    pub fn pcpu_of(&self, vcpu: VcpuId) -> u32 {
        self.running_on(vcpu).unwrap_or(0)
    }

    /// `pcpu` completes the requests other pCPUs sent it, in order (a threaded VMM drains
    /// its queue before the next guest entry; a ring-0 hypervisor takes the IPI).
    pub fn complete_requests(&mut self, pcpu: u32) {
        while let Some(request) = self.platform.requests[pcpu as usize].pop_front() {
            self.complete_request(pcpu, request);
        }
    }

    /// `pcpu` completes one request.
    pub fn complete_request(&mut self, pcpu: u32, request: CrossCpuRequest) {
        self.platform.calling_pcpu = Some(pcpu);
        self.vpmu
            .complete_request(
                &mut self.platform,
                &mut self.pcpus[pcpu as usize],
                &self.vcpus,
                request,
            )
            .expect("the backend never makes the model fault");
        self.platform.calling_pcpu = None;
    }

    /// Every pCPU takes the requests sent to it (the IPI reaches the target before it retires
    /// another instruction), until no request is outstanding. Tests that look at the window
    /// between a request and its completion set `hold_requests`.
    pub fn deliver_requests(&mut self) {
        if self.hold_requests {
            return;
        }
        while let Some(pcpu) =
            (0..self.pcpus.len() as u32).find(|&p| !self.platform.requests[p as usize].is_empty())
        {
            self.complete_requests(pcpu);
        }
    }

    /// A guest RDMSR by `vcpu` (on the pCPU it runs on).
    pub fn rdmsr(&mut self, vcpu: VcpuId, msr: u32) -> MsrOutcome<u64> {
        self.intercept(vcpu, |vpmu, platform, pcpu, v| {
            vpmu.rdmsr(platform, pcpu, v, Msr(msr))
        })
    }

    /// A guest RDPMC by `vcpu` (on the pCPU it runs on) with ECX = `selector`, at `cpl` with
    /// CR4.PCE = `pce`.
    pub fn rdpmc(&mut self, vcpu: VcpuId, selector: u32, cpl: u8, pce: bool) -> MsrOutcome<u64> {
        self.intercept(vcpu, |vpmu, platform, pcpu, v| {
            vpmu.rdpmc(platform, pcpu, v, selector, cpl, pce)
        })
    }

    /// A guest WRMSR by `vcpu` (on the pCPU it runs on).
    pub fn wrmsr(&mut self, vcpu: VcpuId, msr: u32, value: u64) -> MsrOutcome<()> {
        self.intercept(vcpu, |vpmu, platform, pcpu, v| {
            vpmu.wrmsr(platform, pcpu, v, Msr(msr), value)
        })
    }

    /// An intercept by `vcpu` on the pCPU it runs on, between the request deliveries a
    /// hypervisor makes around guest entries.
    fn intercept<R>(
        &mut self,
        vcpu: VcpuId,
        call: impl FnOnce(
            &Vpmu<V::Backend>,
            &mut SimPlatform,
            &mut PcpuPmu<Ctx<V>, V::Model>,
            &mut VcpuPmu<Ctx<V>>,
        ) -> Result<R, vpmu::CoreError>,
    ) -> R {
        let pcpu = self.pcpu_of(vcpu);
        self.complete_requests(pcpu);
        self.platform.calling_pcpu = Some(pcpu);
        let cell = &self.vcpus.domains[vcpu.domain as usize][vcpu.vcpu as usize];
        let outcome = call(
            &self.vpmu,
            &mut self.platform,
            &mut self.pcpus[pcpu as usize],
            &mut cell.borrow_mut(),
        )
        .expect("the backend never makes the model fault");
        self.platform.calling_pcpu = None;
        self.deliver_requests();
        outcome
    }

    /// A control operation by `caller`, restarted while it answers `-EAGAIN` after the other
    /// pCPUs took their requests (as a hypervisor restarts the hypercall). With
    /// `hold_requests` set, the first answer is returned as it is.
    pub fn op(&mut self, caller: VcpuId, op: u32, params: &Params) -> Result<Params, OpError> {
        for _ in 0..=self.pcpus.len() * 4 + 4 {
            let result = self.op_once(caller, op, params);
            if result != Err(OpError::Again) || self.hold_requests {
                return result;
            }
        }
        panic!("{caller:?}: operation {op} still -EAGAIN after every pCPU took its requests");
    }

    /// One control operation call by `caller`, on the pCPU it runs on.
    pub fn op_once(&mut self, caller: VcpuId, op: u32, params: &Params) -> Result<Params, OpError> {
        let pcpu = self.pcpu_of(caller);
        self.complete_requests(pcpu);
        self.platform.calling_pcpu = Some(pcpu);
        let result = self.vpmu.control_op(
            &mut self.platform,
            &mut self.pcpus[pcpu as usize],
            &self.vcpus,
            caller,
            op,
            params,
        );
        self.platform.calling_pcpu = None;
        self.deliver_requests();
        result
    }

    /// Destroys vCPU `id`'s vPMU (domain destruction), on pCPU 0, waiting for the pCPUs it
    /// needs.
    pub fn teardown(&mut self, id: VcpuId) {
        for _ in 0..=self.pcpus.len() * 4 + 4 {
            self.complete_requests(0);
            self.platform.calling_pcpu = Some(0);
            let done = self
                .vpmu
                .teardown_vcpu(&mut self.platform, &mut self.pcpus[0], &self.vcpus, id)
                .expect("the backend never makes the model fault");
            self.platform.calling_pcpu = None;
            self.deliver_requests();
            if done == Completion::Done {
                return;
            }
        }
        panic!("{id:?}: teardown still pending after every pCPU took its requests");
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
        self.platform.resume_regs.insert(running, state);
        self.platform.interrupted[pcpu as usize] = Interrupted::Guest {
            vcpu: running,
            regs: state,
        };
        self.execute(pcpu, Some(running), insn, false, 1)
    }

    /// As [`Machine::retire`], but `insn` stands for `count` instructions retired at once:
    /// the model counts them all before the PMI an overflow among them raises is taken, so
    /// the counter has counted past its wrap by then (a skid of up to `count - 1` events).
    pub fn retire_burst(&mut self, pcpu: u32, insn: &Instruction, count: u64) -> Option<PmiRecord> {
        let running = self.pcpus[pcpu as usize]
            .current()
            .expect("only a pCPU running a vCPU retires guest instructions");
        let state = regs(running, insn, self.retired);
        self.last_guest[pcpu as usize] = Some((running, state));
        self.platform.resume_regs.insert(running, state);
        self.platform.interrupted[pcpu as usize] = Interrupted::Guest {
            vcpu: running,
            regs: state,
        };
        self.execute(pcpu, Some(running), insn, false, count)
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
        self.execute(pcpu, current, &insn, true, 1)
    }

    fn execute(
        &mut self,
        pcpu: u32,
        running: Option<VcpuId>,
        insn: &Instruction,
        hypervisor: bool,
        count: u64,
    ) -> Option<PmiRecord> {
        self.retired += 1;
        let mode = ExecMode {
            cpl: insn.cpl,
            host: hypervisor,
        };
        self.complete_requests(pcpu);
        let hw = self.pcpus[pcpu as usize].hw_mut();
        hw.count(HwEvent::Instructions, count, mode);
        if insn.branch {
            hw.count(HwEvent::Branches, count, mode);
        }
        if !hw.take_pmi() {
            return None;
        }
        let outcome = if self.platform.physical_masked[pcpu as usize] {
            None
        } else {
            self.platform.calling_pcpu = Some(pcpu);
            let outcome = self
                .vpmu
                .handle_pmi(
                    &mut self.platform,
                    &mut self.pcpus[pcpu as usize],
                    &self.vcpus,
                )
                .expect("the backend never makes the model fault");
            self.platform.calling_pcpu = None;
            Some(outcome)
        };
        self.deliver_requests();
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
            let stats = *self.vcpu(id).stats();
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
            if stats.pmis_kept_pending == 0 {
                assert_eq!(
                    (stats.pmis_delivered, stats.pmis_dropped),
                    (delivered, dropped),
                    "{id:?}: statistics agree with the PMIs routed to it"
                );
            } else {
                // Overflows kept pending across a switch-out are routed at the switch-in,
                // not by a PMI record: each one once, delivered or dropped.
                assert_eq!(
                    stats.pmis_delivered + stats.pmis_dropped,
                    delivered + dropped + stats.pmis_kept_pending,
                    "{id:?}: statistics agree with the PMIs routed to it and those kept pending"
                );
            }
        }
    }
}
