//! Teardown: a vCPU's vPMU stopped for good (`finish`, or its domain destroyed), wherever its
//! context is.
//!
//! The teardown happens in one step on the pCPU that holds the vCPU's context: saving the
//! context there is what stops its counters, so that pCPU does the whole teardown at that
//! moment (`CrossCpuRequest::Teardown`). The vCPU counts until its vPMU is really gone — it is
//! never left running with its counters stopped and its page still registered, waiting for the
//! caller to come back. The caller's `-EAGAIN` (`Completion::Pending`) only says the teardown
//! has not happened yet; its retry answers 0 once it has (`VcpuPmu::teardowns`).

use vpmu_abi::ops::OpError;

use crate::backend::PmuBackend;
use crate::core::{CoreError, Mode, VcpuTable, Vpmu};
use crate::msr::MsrBus;
use crate::platform::{Platform, VcpuId};
use crate::request::{Completion, CrossCpuRequest};
use crate::state::{PcpuPmu, PendingFinish, SystemContext, VcpuPmu, VcpuState};

impl<B: PmuBackend> Vpmu<B> {
    /// Stops `id`'s vPMU for good: saves its context, discards a pending sample, unmaps its
    /// page. For vCPUs of a domain being destroyed, without the guest's help, and for finish.
    /// In all mode the privileged profiler's counters are the system-wide contexts of the
    /// pCPUs it profiles: those are stopped and dropped too, as its own context is reset.
    ///
    /// Call it on any pCPU. A vCPU whose context is loaded on another pCPU (it runs there) is
    /// torn down by that pCPU, at once, as it handles the `Teardown` request sent to it; until
    /// then the vCPU goes on counting as it was. System-wide contexts on other pCPUs are
    /// dropped by them (`DropSystem`). The call returns `Pending` while such work is
    /// outstanding: call it again after those pCPUs handled their requests, until it returns
    /// `Done` (nothing is torn down half: what the call leaves to other pCPUs stays as it was
    /// until they act, and the vCPU's own state is reset in one step).
    pub fn teardown_vcpu<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        id: VcpuId,
    ) -> Result<Completion, CoreError> {
        self.catch_up_with_table(platform, pcpu, vcpus)?;
        let policy = self.policy();
        let here = pcpu.index;
        let privileged = platform.privileged_domain();
        let mut remote = false;
        let mut result = Ok(());
        let found = vcpus.with_vcpu(id, &mut |v| {
            if let VcpuState::Loaded { pcpu: p } = v.state {
                if p != here {
                    platform.send_request(p, CrossCpuRequest::Teardown { vcpu: v.id });
                    remote = true;
                    return;
                }
            }
            if policy.mode == Mode::All && v.id.domain == privileged {
                if Self::profiler_of(platform, here) == Some(v.id)
                    && !matches!(pcpu.system, SystemContext::Absent)
                {
                    if let Err(e) = self.drop_system_context(platform, pcpu) {
                        result = Err(e);
                        return;
                    }
                    self.count_instance(v, false);
                }
                if self.instances(v) > 0 {
                    for p in self
                        .profiled_pcpus(platform, privileged, v.id.vcpu)
                        .filter(|&p| p != here)
                    {
                        platform.send_request(p, CrossCpuRequest::DropSystem { profiler: v.id });
                    }
                    remote = true;
                    return;
                }
            }
            result = self.teardown_local(platform, pcpu, v);
        });
        result?;
        if !found {
            return Ok(Completion::Done);
        }
        Ok(if remote {
            Completion::Pending
        } else {
            Completion::Done
        })
    }

    /// Tears `vcpu` down on `pcpu`, which holds its context if any pCPU does.
    pub(crate) fn teardown_local<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        let privileged = platform.privileged_domain();
        let was_in_use = vcpu.in_use();
        self.save_vcpu(pcpu, vcpu)?;
        if matches!(vcpu.state, VcpuState::Cached { .. }) {
            self.release_cached(platform, vcpu);
        }
        if pcpu.lvtpc_masked_for == Some(vcpu.id) {
            self.unmask_physical_lvtpc(platform, pcpu);
        }
        if let Some(page) = vcpu.page.take() {
            platform.unmap_page(page.slot);
        }
        // The ring goes with the page (FINISH, or the domain destroyed).
        if let Some(ring) = vcpu.ring.take() {
            platform.unmap_ring(ring.slot);
        }
        vcpu.ctx = self.backend.new_context();
        vcpu.state = VcpuState::Allocated;
        vcpu.page_lvtpc_masked = true;
        vcpu.pending_pmi = None;
        vcpu.program = None;
        vcpu.handover = None;
        vcpu.system_instances = (0, 0);
        vcpu.teardowns = vcpu.teardowns.wrapping_add(1);
        self.settle_use(privileged, vcpu, was_in_use, false);
        Ok(())
    }

    /// `XENPMU_OP_FINISH` of `caller`'s sibling (or itself) `target`, whose arguments are
    /// checked. A call that returns `-EAGAIN` is remembered, so that its retry answers 0 once
    /// the teardown it asked for has happened on the pCPU holding the target's context, even
    /// though the target has no page by then.
    pub(crate) fn finish<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        caller: VcpuId,
        target: VcpuId,
    ) -> Result<(), OpError> {
        let mut pending = None;
        vcpus.with_vcpu(caller, &mut |v| pending = v.pending_finish.take());
        let (mut registered, mut teardowns) = (false, 0);
        vcpus.with_vcpu(target, &mut |v| {
            registered = v.page.is_some();
            teardowns = v.teardowns;
        });
        if pending.is_some_and(|p| p.target == target.vcpu && p.teardowns != teardowns) {
            // The retry of a finish whose teardown happened meanwhile.
            return Ok(());
        }
        if !registered {
            return Err(OpError::NoVpmu);
        }
        let done = self
            .teardown_vcpu(platform, pcpu, vcpus, target)
            .map_err(|_| OpError::InvalidContext)?;
        if done == Completion::Pending {
            vcpus.with_vcpu(caller, &mut |v| {
                v.pending_finish = Some(PendingFinish {
                    target: target.vcpu,
                    teardowns,
                });
            });
            return Err(OpError::Again);
        }
        Ok(())
    }
}
