//! Guest RDMSR/WRMSR intercepts. The backend validates and emulates; the core decides which
//! context an access reaches (the vCPU's own, or in all mode the privileged vCPU's program and
//! the local pCPU's system-wide instance) and whether that context is on this pCPU's hardware.
//! Nothing here can reach another pCPU's hardware: the only bus is the local pCPU's, and what
//! other pCPUs must do is sent to them as a request.

use crate::backend::{GuestPolicy, MsrOutcome, PmuBackend};
use crate::core::{CoreError, Mode, PolicySnapshot, Vpmu, may_count_host};
use crate::msr::{Msr, MsrBus};
use crate::platform::Platform;
use crate::request::CrossCpuRequest;
use crate::state::{FastIntercepts, PcpuPmu, SystemContext, VcpuPmu, VcpuState};

/// One decoded guest WRMSR: the register the backend decoded, the MSR number (requests to
/// other pCPUs carry it), the value.
#[derive(Clone, Copy, Debug)]
struct GuestWrite<R> {
    register: R,
    msr: Msr,
    value: u64,
}

impl<B: PmuBackend> Vpmu<B> {
    /// A guest RDMSR by `vcpu`, which runs on `pcpu` (the caller's own pCPU).
    pub fn rdmsr<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        msr: Msr,
    ) -> Result<MsrOutcome<u64>, CoreError> {
        // The one decode of the access: the backend emulates the register it names.
        let Some(register) = self.backend.classify(msr) else {
            return Ok(MsrOutcome::NotPmu);
        };
        if self.fast_entry(pcpu, vcpu).is_some() {
            vcpu.stats.msr_reads += 1;
            let outcome =
                self.backend
                    .read_register(&mut vcpu.ctx, Some(&mut pcpu.hw), register)?;
            if outcome == MsrOutcome::GeneralProtection {
                vcpu.stats.gp_faults += 1;
            }
            return Ok(outcome);
        }
        self.read_entered(platform, pcpu, vcpu, register)
    }

    /// A guest RDMSR of `register` that takes the full entry.
    #[inline(never)]
    fn read_entered<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        register: B::Register,
    ) -> Result<MsrOutcome<u64>, CoreError> {
        let policy = self.enter(platform, pcpu, vcpu)?;
        vcpu.stats.msr_reads += 1;
        let privileged = platform.privileged_domain();
        let outcome = if !self.has_vpmu(policy, privileged, vcpu.id) {
            MsrOutcome::GeneralProtection
        } else if policy.mode == Mode::All {
            self.system_read(platform, pcpu, vcpu, register)?
        } else {
            let may_count_host = may_count_host(policy.mode, vcpu.id.domain == privileged);
            self.allow_fast_entry(policy, may_count_host, pcpu, vcpu);
            let hw = matches!(vcpu.state, VcpuState::Loaded { pcpu: here } if here == pcpu.index)
                .then_some(&mut pcpu.hw);
            self.backend.read_register(&mut vcpu.ctx, hw, register)?
        };
        if outcome == MsrOutcome::GeneralProtection {
            vcpu.stats.gp_faults += 1;
        }
        Ok(outcome)
    }

    /// A guest RDPMC by `vcpu`, which runs on `pcpu` (the caller's own pCPU), with
    /// ECX = `selector`, executed at privilege level `cpl` with CR4.PCE = `cr4_pce`.
    ///
    /// `Handled(value)`: the caller sets EDX:EAX to the value's high and low halves (the high
    /// halves of RDX and RAX cleared) and moves RIP past the instruction. `GeneralProtection`:
    /// the caller injects #GP(0), as the processor does for RDPMC at CPL > 0 without CR4.PCE,
    /// for a selector that names no counter, or for a counter this vCPU cannot see (no vPMU
    /// in its domain, or a counter the enumeration does not have). Never `NotPmu`.
    pub fn rdpmc<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        selector: u32,
        cpl: u8,
        cr4_pce: bool,
    ) -> Result<MsrOutcome<u64>, CoreError> {
        let counter = self.backend.rdpmc_counter(selector);
        let Some(msr) = counter.filter(|_| cpl == 0 || cr4_pce) else {
            vcpu.stats.gp_faults += 1;
            return Ok(MsrOutcome::GeneralProtection);
        };
        vcpu.stats.rdpmcs += 1;
        Ok(match self.rdmsr(platform, pcpu, vcpu, msr)? {
            // A backend's own counter MSR is always its own; answer as hardware would if not.
            MsrOutcome::NotPmu => MsrOutcome::GeneralProtection,
            outcome => outcome,
        })
    }

    /// A guest WRMSR by `vcpu`, which runs on `pcpu` (the caller's own pCPU).
    pub fn wrmsr<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        msr: Msr,
        value: u64,
    ) -> Result<MsrOutcome<()>, CoreError> {
        let Some(register) = self.backend.classify(msr) else {
            return Ok(MsrOutcome::NotPmu);
        };
        if let Some(word) = self.fast_entry(pcpu, vcpu) {
            vcpu.stats.msr_writes += 1;
            let guest = GuestPolicy {
                features: PolicySnapshot::unpack(word).features,
                filter: platform.event_filter(vcpu.id.domain),
                may_count_host: vcpu.fast.may_count_host,
            };
            let outcome = self.backend.write_register(
                &mut vcpu.ctx,
                Some(&mut pcpu.hw),
                &guest,
                register,
                value,
            )?;
            if outcome == MsrOutcome::GeneralProtection {
                vcpu.stats.gp_faults += 1;
            }
            return Ok(outcome);
        }
        self.write_entered(platform, pcpu, vcpu, register, msr, value)
    }

    /// A guest WRMSR of `register` that takes the full entry (one frame: a first use's
    /// accounting is inlined here too).
    #[inline(never)]
    fn write_entered<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        register: B::Register,
        msr: Msr,
        value: u64,
    ) -> Result<MsrOutcome<()>, CoreError> {
        let write = GuestWrite {
            register,
            msr,
            value,
        };
        if !vcpu.in_use() {
            return self.first_use_write(platform, pcpu, vcpu, write);
        }
        // No write makes a vCPU unused again: nothing to account.
        let privileged = platform.privileged_domain();
        let outcome = self.write_claimed(platform, privileged, pcpu, vcpu, write)?;
        if outcome == MsrOutcome::GeneralProtection {
            vcpu.stats.gp_faults += 1;
        }
        Ok(outcome)
    }

    /// A WRMSR by a vCPU that does not use its vPMU yet: an unprivileged one counts as in use
    /// from before the write (a first use waits for a change checking that none exists, then
    /// sees its policy) and is accounted by what the write made of it.
    #[inline(always)]
    fn first_use_write<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        write: GuestWrite<B::Register>,
    ) -> Result<MsrOutcome<()>, CoreError> {
        let privileged = platform.privileged_domain();
        let claimed = vcpu.id.domain != privileged;
        if claimed {
            self.claim_use();
        }
        let outcome = self.write_claimed(platform, privileged, pcpu, vcpu, write);
        self.settle_use(privileged, vcpu, false, claimed);
        if outcome == Ok(MsrOutcome::GeneralProtection) {
            vcpu.stats.gp_faults += 1;
        }
        outcome
    }

    /// A WRMSR through the full entry; `privileged` is the platform's privileged domain (asked
    /// once per intercept).
    #[inline(always)]
    fn write_claimed<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        privileged: u32,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        write: GuestWrite<B::Register>,
    ) -> Result<MsrOutcome<()>, CoreError> {
        let policy = self.enter(platform, pcpu, vcpu)?;
        vcpu.stats.msr_writes += 1;
        if !self.has_vpmu(policy, privileged, vcpu.id) {
            return Ok(MsrOutcome::GeneralProtection);
        }
        if let VcpuState::Cached { .. } = vcpu.state {
            // Inside the cached window the context is the page's: a WRMSR would be overwritten
            // by the flush (or make it fail), so it is refused rather than silently lost.
            return Ok(MsrOutcome::GeneralProtection);
        }
        if policy.mode == Mode::All {
            return self.system_write(platform, privileged, policy, pcpu, vcpu, write);
        }
        // The guest policy, made once (the filter is the platform's, asked once).
        let guest = self.guest_policy_of(policy, platform, vcpu.id.domain, privileged);
        self.allow_fast_entry(policy, guest.may_count_host, pcpu, vcpu);
        let loaded = matches!(vcpu.state, VcpuState::Loaded { pcpu: here } if here == pcpu.index);
        let hw = loaded.then_some(&mut pcpu.hw);
        let outcome =
            self.backend
                .write_register(&mut vcpu.ctx, hw, &guest, write.register, write.value)?;
        if outcome == MsrOutcome::Handled(()) {
            if matches!(vcpu.state, VcpuState::Allocated) {
                vcpu.state = VcpuState::Saved;
            }
            // First use on this pCPU: a context that now has something enabled goes onto
            // the hardware it runs on. One that has nothing to run (a counter value written
            // before its control) is not even looked at for loading: `enter` settled it with
            // `policy` already, which is all the load would have done before finding it idle.
            if matches!(vcpu.state, VcpuState::Saved) && self.backend.is_active(&vcpu.ctx) {
                self.load_if_active(platform, policy, pcpu, vcpu)?;
            }
        }
        Ok(outcome)
    }

    /// The fast path's condition: a full entry under the policy in force allowed it
    /// (`FastIntercepts`), this pCPU has caught up with that policy, and `vcpu`'s context is
    /// loaded here. Returns the policy word. One atomic load and three compares.
    #[inline(always)]
    fn fast_entry<H>(
        &self,
        pcpu: &PcpuPmu<B::Context, H>,
        vcpu: &VcpuPmu<B::Context>,
    ) -> Option<u64> {
        let word = self.policy_word();
        (vcpu.fast.word == word
            && pcpu.seen.epoch == PolicySnapshot::unpack(word).epoch
            && matches!(vcpu.state, VcpuState::Loaded { pcpu: here } if here == pcpu.index))
        .then_some(word)
    }

    /// After a full entry whose checks passed under `policy` in a mode that switches
    /// contexts: the vCPU's next intercepts under the same policy may take the fast path,
    /// if this pCPU has caught up with it and the context was validated against it (the
    /// entry may leave either to a later call).
    /// `may_count_host` is the vCPU's `GuestPolicy::may_count_host` under `policy`.
    fn allow_fast_entry<H: MsrBus>(
        &self,
        policy: PolicySnapshot,
        may_count_host: bool,
        pcpu: &PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) {
        if policy.mode.switches_contexts()
            && pcpu.seen.epoch == policy.epoch
            && vcpu.validated == policy.epoch
        {
            vcpu.fast = FastIntercepts {
                word: policy.pack(),
                may_count_host,
            };
        }
    }

    /// The common start of an intercept: the pCPU caught up with the policy, the vCPU checked
    /// to run here and brought in line with it. The usual case (nothing changed since both
    /// last looked, the vCPU not loaded elsewhere) is one atomic load and three compares.
    #[inline(always)]
    fn enter<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<PolicySnapshot, CoreError> {
        let policy = self.policy();
        let elsewhere =
            matches!(vcpu.state, VcpuState::Loaded { pcpu: other } if other != pcpu.index);
        if pcpu.seen.epoch == policy.epoch && vcpu.validated == policy.epoch && !elsewhere {
            return Ok(policy);
        }
        self.enter_changed(platform, pcpu, vcpu)
    }

    #[cold]
    #[inline(never)]
    fn enter_changed<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<PolicySnapshot, CoreError> {
        if let VcpuState::Loaded { pcpu: other } = vcpu.state {
            if other != pcpu.index {
                return Err(CoreError::WrongPcpu {
                    here: pcpu.index,
                    loaded_on: other,
                });
            }
        }
        // Catching up needs the vCPU running here; an access by one that is not (a caller
        // emulating for a descheduled vCPU) leaves that to the next call that has it.
        match pcpu.current {
            Some(id) if id == vcpu.id => self.catch_up(platform, pcpu, Some(&mut *vcpu))?,
            None => self.catch_up(platform, pcpu, None)?,
            Some(_) => {}
        }
        let policy = self.policy();
        self.settle(platform, policy, vcpu);
        Ok(policy)
    }

    /// Whether privileged vCPU `vcpu` profiles `pcpu` in all mode. An instance on `pcpu`
    /// names the profiler it was made for (`profiler_of` of the pCPU then): only without one
    /// is the platform asked.
    fn profiles<P: Platform, H>(
        platform: &P,
        pcpu: &PcpuPmu<B::Context, H>,
        vcpu: &VcpuPmu<B::Context>,
    ) -> bool {
        match pcpu.system {
            SystemContext::Loaded { profiler } | SystemContext::Cached { profiler } => {
                profiler == vcpu.id
            }
            SystemContext::Absent => Self::profiler_of(platform, pcpu.index) == Some(vcpu.id),
        }
    }

    fn system_read<P: Platform, H: MsrBus>(
        &self,
        platform: &P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        register: B::Register,
    ) -> Result<MsrOutcome<u64>, CoreError> {
        // The instance of this pCPU if the vCPU profiles it (live values), else its program.
        if Self::profiles(platform, pcpu, vcpu) {
            let ctx = &mut pcpu.system_ctx;
            match pcpu.system {
                SystemContext::Loaded { .. } => {
                    return Ok(self
                        .backend
                        .read_register(ctx, Some(&mut pcpu.hw), register)?);
                }
                SystemContext::Cached { .. } => {
                    return Ok(self.backend.read_register(ctx, None::<&mut H>, register)?);
                }
                SystemContext::Absent => {}
            }
        }
        let program = vcpu
            .program
            .get_or_insert_with(|| self.backend.new_context());
        Ok(self
            .backend
            .read_register(program, None::<&mut H>, register)?)
    }

    fn system_write<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        privileged: u32,
        policy: PolicySnapshot,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        write: GuestWrite<B::Register>,
    ) -> Result<MsrOutcome<()>, CoreError> {
        let guest = self.guest_policy_of(policy, platform, vcpu.id.domain, privileged);
        // The program is validated first: one verdict for every instance.
        let program = vcpu
            .program
            .get_or_insert_with(|| self.backend.new_context());
        let outcome = self.backend.write_register(
            program,
            None::<&mut H>,
            &guest,
            write.register,
            write.value,
        )?;
        if outcome != MsrOutcome::Handled(()) {
            return Ok(outcome);
        }
        if matches!(vcpu.state, VcpuState::Allocated) {
            vcpu.state = VcpuState::Saved;
        }
        let here = pcpu.index;
        if Self::profiles(platform, pcpu, vcpu) {
            self.write_system_instance(pcpu, vcpu, policy, &guest, write.register, write.value)?;
        }
        for other in self.profiled_pcpus(platform, privileged, vcpu.id.vcpu) {
            if other != here {
                let request = CrossCpuRequest::SystemWrite {
                    profiler: vcpu.id,
                    msr: write.msr,
                    value: write.value,
                };
                platform.send_request(other, request);
            }
        }
        Ok(outcome)
    }
}
