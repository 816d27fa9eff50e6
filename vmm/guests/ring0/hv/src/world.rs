//! The inner hypervisor's state (one `World` per backend type, made once by CPU 0), the
//! harness's calls into the core on the caller's own pCPU, and the interrupt handlers.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering::SeqCst};

use vpmu::{
    CrossCpuRequest, Msr, MsrBus, MsrOutcome, PcpuPmu, PmuBackend, VcpuId, VcpuPmu, VcpuState,
    VcpuTable, Vpmu,
};
use vpmu_amd::AmdPmu;
use vpmu_guest_protocol::ring0 as proto;
use vpmu_intel::IntelPmu;

use crate::hw::{TracedBus, trace_word, without_interrupts};
use crate::plan::{Plan, plan_of};
use crate::platform::{
    CURRENT, HANDLER_ERRORS, IPIS_TAKEN, InnerPlatform, NONE, PMIS_SPURIOUS, PMIS_TAKEN, QUEUES,
    REQUESTS_DONE, index_word, vcpu_of_index,
};
use crate::{PCPUS, PRIVILEGED, VCPUS, index_of};

// ---------------------------------------------------------------------------------------------
// The inner hypervisor's state: one `World` per backend type, made once by CPU 0.

/// Per-pCPU state, touched only by its own CPU (with interrupts off, or from its own interrupt
/// handlers, which never run while its code is inside such a section) — except by the
/// sabotaged build, which is the point of that build.
pub(crate) struct CpuSlot<T>(pub(crate) UnsafeCell<Option<T>>);

// SAFETY: each slot is used by one CPU at a time (see `CpuSlot`).
unsafe impl<T: Send> Sync for CpuSlot<T> {}

/// The vCPU table: each inner vCPU behind its own spin lock.
pub(crate) struct Table<C> {
    vcpus: [spin::Mutex<VcpuPmu<C>>; VCPUS],
}

impl<C> VcpuTable<C> for Table<C> {
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) -> bool {
        match index_of(id) {
            Some(i) => {
                visit(&mut self.vcpus[i].lock());
                true
            }
            None => false,
        }
    }

    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
        for v in &self.vcpus {
            let mut v = v.lock();
            if v.id().domain == domain {
                visit(&mut v);
            }
        }
    }
}

/// The inner hypervisor's vPMU state for backend `B`.
pub(crate) struct World<B: PmuBackend> {
    pub(crate) vpmu: Vpmu<B>,
    pub(crate) table: Table<B::Context>,
    pub(crate) cpus: [CpuSlot<PcpuPmu<B::Context, TracedBus>>; PCPUS],
    pub(crate) plan: Plan,
}

pub(crate) static INTEL: spin::Once<World<IntelPmu>> = spin::Once::new();
pub(crate) static AMD: spin::Once<World<AmdPmu>> = spin::Once::new();
/// 1: Intel, 2: AMD, once CPU 0 has made the world; 3: no usable PMU.
pub(crate) static VENDOR: AtomicU32 = AtomicU32::new(0);

// ---------------------------------------------------------------------------------------------
// The harness's view of a world: calls into the core on the caller's own pCPU.

impl<B: PmuBackend> World<B>
where
    B::Context: Send,
{
    /// This CPU's per-pCPU state.
    ///
    /// # Safety
    ///
    /// Only on CPU `cpu` (or in the sabotaged build's deliberate misuse), with interrupts off
    /// or from that CPU's interrupt handler, and not while another reference from this
    /// function is alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn pcpu(&self, cpu: u32) -> Option<&mut PcpuPmu<B::Context, TracedBus>> {
        // SAFETY: the caller's contract: nobody else uses this slot now.
        unsafe { (*self.cpus[cpu as usize].0.get()).as_mut() }
    }

    /// Runs `f` with this CPU's state, interrupts off, between BEGIN and END trace words.
    fn on_cpu<R>(
        &self,
        cpu: u32,
        op: u32,
        vcpu: u32,
        f: impl FnOnce(&mut PcpuPmu<B::Context, TracedBus>, &mut InnerPlatform) -> R,
    ) -> Option<R> {
        without_interrupts(|| {
            trace_word(proto::TRACE_BEGIN, op, cpu, vcpu);
            // SAFETY: on CPU `cpu`, interrupts off, no other reference alive.
            let r = unsafe { self.pcpu(cpu) }.map(|p| f(p, &mut InnerPlatform));
            trace_word(proto::TRACE_END, op, cpu, vcpu);
            r
        })
    }

    pub(crate) fn switch(&self, cpu: u32, next: Option<VcpuId>) -> bool {
        let r = self.on_cpu(cpu, proto::OP_SWITCH, index_word(next), |p, plat| {
            let r = self.vpmu.context_switch(plat, p, &self.table, next);
            CURRENT[cpu as usize].store(index_word(next), SeqCst);
            r
        });
        matches!(r, Some(Ok(())))
    }

    pub(crate) fn wr(
        &self,
        cpu: u32,
        vcpu: VcpuId,
        msr: u32,
        value: u64,
    ) -> Option<MsrOutcome<()>> {
        self.wr_op(cpu, proto::OP_WRMSR, vcpu, msr, value)
    }

    pub(crate) fn wr_op(
        &self,
        cpu: u32,
        op: u32,
        vcpu: VcpuId,
        msr: u32,
        value: u64,
    ) -> Option<MsrOutcome<()>> {
        let i = index_of(vcpu)?;
        self.on_cpu(cpu, op, i as u32, |p, plat| {
            let mut v = self.table.vcpus[i].lock();
            self.vpmu.wrmsr(plat, p, &mut v, Msr(msr), value).ok()
        })
        .flatten()
    }

    pub(crate) fn rd(&self, cpu: u32, vcpu: VcpuId, msr: u32) -> Option<u64> {
        let i = index_of(vcpu)?;
        self.on_cpu(cpu, proto::OP_RDMSR, i as u32, |p, plat| {
            let mut v = self.table.vcpus[i].lock();
            match self.vpmu.rdmsr(plat, p, &mut v, Msr(msr)) {
                Ok(MsrOutcome::Handled(value)) => Some(value),
                _ => None,
            }
        })
        .flatten()
    }

    /// Reads this CPU's own hardware directly (idle checks; no core call).
    pub(crate) fn raw(&self, cpu: u32, msr: u32) -> u64 {
        self.on_cpu(cpu, proto::OP_HARNESS, NONE, |p, _| {
            p.hw_mut().read(Msr(msr)).unwrap_or(u64::MAX)
        })
        .unwrap_or(u64::MAX)
    }

    pub(crate) fn accesses(&self, cpu: u32) -> u64 {
        without_interrupts(|| {
            // SAFETY: on CPU `cpu`, interrupts off, no other reference alive.
            unsafe { self.pcpu(cpu) }.map_or(0, |p| p.hw().accesses)
        })
    }

    pub(crate) fn stats(&self, vcpu: VcpuId) -> vpmu::VcpuStats {
        let i = index_of(vcpu).unwrap_or(0);
        without_interrupts(|| *self.table.vcpus[i].lock().stats())
    }

    pub(crate) fn state(&self, vcpu: VcpuId) -> VcpuState {
        let i = index_of(vcpu).unwrap_or(0);
        without_interrupts(|| self.table.vcpus[i].lock().state())
    }

    /// Completes the requests queued for `target` here, with `target`'s state: what the IPI
    /// handler does on the target, done on the wrong CPU (the sabotaged build only).
    pub(crate) fn run_sent_here(&self, target: u32) {
        while let Some(r) = without_interrupts(|| QUEUES[target as usize].lock().pop()) {
            let vcpu = match r {
                CrossCpuRequest::Teardown { vcpu } => index_word(Some(vcpu)),
                _ => NONE,
            };
            // The sabotage: `target`'s per-pCPU state, driven from this CPU.
            let done = self.on_cpu(target, proto::OP_REQUEST, vcpu, |p, plat| {
                self.vpmu.complete_request(plat, p, &self.table, r)
            });
            if !matches!(done, Some(Ok(()))) {
                HANDLER_ERRORS[target as usize].fetch_add(1, SeqCst);
            }
            REQUESTS_DONE[target as usize].fetch_add(1, SeqCst);
        }
    }
}

/// What the interrupt handlers need of a world, whatever its backend.
pub(crate) trait Handlers: Sync {
    fn on_ipi(&self, cpu: u32);
    fn on_pmi(&self, cpu: u32);
}

impl<B: PmuBackend + Sync> Handlers for World<B>
where
    B::Context: Send,
{
    fn on_ipi(&self, cpu: u32) {
        IPIS_TAKEN[cpu as usize].fetch_add(1, SeqCst);
        trace_word(proto::TRACE_IPI_TAKEN, 0, cpu, 0);
        while let Some(r) = QUEUES[cpu as usize].lock().pop() {
            let vcpu = match r {
                CrossCpuRequest::Teardown { vcpu } => index_word(Some(vcpu)),
                _ => NONE,
            };
            let done = self.on_cpu(cpu, proto::OP_REQUEST, vcpu, |p, plat| {
                self.vpmu.complete_request(plat, p, &self.table, r)
            });
            if !matches!(done, Some(Ok(()))) {
                HANDLER_ERRORS[cpu as usize].fetch_add(1, SeqCst);
            }
            REQUESTS_DONE[cpu as usize].fetch_add(1, SeqCst);
        }
    }

    fn on_pmi(&self, cpu: u32) {
        PMIS_TAKEN[cpu as usize].fetch_add(1, SeqCst);
        let current = CURRENT[cpu as usize].load(SeqCst);
        let outcome = self.on_cpu(cpu, proto::OP_PMI, current, |p, plat| {
            self.vpmu.handle_pmi(plat, p, &self.table)
        });
        match outcome {
            Some(Ok(vpmu::PmiOutcome::Spurious)) => {
                PMIS_SPURIOUS[cpu as usize].fetch_add(1, SeqCst);
            }
            Some(Ok(_)) => {}
            _ => {
                HANDLER_ERRORS[cpu as usize].fetch_add(1, SeqCst);
            }
        }
    }
}

pub(crate) fn handlers() -> Option<&'static dyn Handlers> {
    match VENDOR.load(SeqCst) {
        1 => INTEL.get().map(|w| w as &dyn Handlers),
        2 => AMD.get().map(|w| w as &dyn Handlers),
        _ => None,
    }
}

pub(crate) fn make<B: PmuBackend>(backend: B) -> World<B> {
    let plan = plan_of(backend.capabilities());
    let vpmu = Vpmu::new(backend, vpmu::Mode::SelfProfiling, PCPUS as u32);
    let table = Table {
        vcpus: core::array::from_fn(|i| {
            let id = vcpu_of_index(i as u32).unwrap_or(PRIVILEGED);
            // Domains 0 and 1: far below the reserved ids `new_vcpu` refuses.
            spin::Mutex::new(vpmu.new_vcpu(id).expect("an ordinary domain id"))
        }),
    };
    World {
        vpmu,
        table,
        cpus: [const { CpuSlot(UnsafeCell::new(None)) }; PCPUS],
        plan,
    }
}
