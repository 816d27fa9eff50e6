//! Context switch and the lifecycle helpers every entry point shares: save, load, bringing a
//! saved context in line with the policy, pending PMIs, teardown.
//!
//! Nothing is done for a vCPU that never used the PMU, when a vCPU is switched to itself, or in
//! all mode (the profiler's counters run system-wide). Otherwise the previous vCPU's context is
//! saved and the next one's loaded if it has anything enabled.
//!
//! Invariant between contexts: **nothing counts** — the global control is 0 on PMUs that have
//! one (Intel v2+, AMD PerfMonV2), whose controls stay programmed; every control of the saved
//! context is 0 on PMUs without one (AMD before PerfMonV2) — and no overflow status is left.
//! Each pCPU's [`HwRecord`](crate::bank::HwRecord) says what its hardware then holds (the
//! values read at the save, the controls left): a load writes only the values and controls it
//! does not know the hardware holds, clears the controls another context left on counters it
//! does not use, and writes the global control last if it differs. A vCPU switched out and back
//! in with nothing in between costs *k* + 3 accesses for *k* counters on a PMU with a global
//! control. Every hardware write the record does not see makes it forget (`attach_pcpu` records
//! the controls `init_hardware` cleared; a faulting save or load forgets everything; a caller
//! that writes PMU MSRs through `PcpuPmu::hw_mut` calls `PcpuPmu::forget_hardware`). While a
//! context is loaded the record is not consulted: the context's hardware images are what the
//! hardware holds (guest writes go through), and the next save records from them.
//! Contexts are never left on a pCPU after their vCPU leaves it: Xen's lazy cross-CPU residency
//! (removed in 2022, commit defa4e51d2) needed IPIs and raced with migration.

mod charged;

use crate::backend::{Overflow, PmuBackend};
use crate::bank::HwRecord;
use crate::core::{CoreError, Mode, PolicySnapshot, VcpuTable, Vpmu};
use crate::msr::{MsrBus, MsrFault};
use vpmu_abi::Regs;

use crate::platform::{Diagnostic, Interrupted, Platform, VcpuId};
use crate::state::{PcpuPmu, SampleSource, SystemContext, VcpuPmu, VcpuState};
use charged::ChargedBus;

/// A context switch's state, as both of its halves take it.
struct SwitchEnv<'a, B: PmuBackend, P, H> {
    vpmu: &'a Vpmu<B>,
    platform: &'a mut P,
    pcpu: &'a mut PcpuPmu<B::Context, H>,
    word: u64,
}

impl<B: PmuBackend> Vpmu<B> {
    /// `pcpu` (the caller's own pCPU) stops running its current vCPU (if any) and starts
    /// running `next` (`None`: the idle loop or hypervisor work). `next` must be a vCPU of
    /// `vcpus`: else `CoreError::NoSuchVcpu`, with the previous vCPU switched out and the
    /// pCPU running none.
    pub fn context_switch<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        next: Option<VcpuId>,
    ) -> Result<(), CoreError> {
        // One policy snapshot for the whole switch: the one this pCPU has caught up with. It
        // travels packed and is unpacked only where a field of it is needed (a switch to a
        // vCPU that loads nothing needs the epoch alone).
        let mut word = self.policy_word();
        if pcpu.seen.epoch != PolicySnapshot::epoch_of(word) {
            self.catch_up_changed(platform, pcpu, vcpus)?;
            word = self.policy_word();
        }
        let prev = pcpu.current;
        // Field by field, leaving at the first difference, rather than by the derived
        // comparison, which evaluates both tags and both fields before it branches.
        let same = match (prev, next) {
            (Some(p), Some(n)) => p.domain == n.domain && p.vcpu == n.vcpu,
            (None, None) => true,
            _ => false,
        };
        if same {
            return Ok(());
        }
        // Both halves reach the switch's state through one pointer to it, built once: closures
        // that captured its parts one by one kept every part live across both visits (spilled
        // around the first, copied again for the second).
        let env = &mut SwitchEnv {
            vpmu: self,
            platform,
            pcpu,
            word,
        };
        if let Some(prev) = prev {
            let out = &mut *env;
            let saved = vcpus.visit(prev, move |v| {
                out.vpmu.switch_out(out.platform, out.pcpu, v)
            });
            // Only an error is looked into: `?` on the whole answer copied the error's
            // payload out before it knew there was one.
            if let Some(Err(e)) = saved {
                return Err(e);
            }
        }
        env.pcpu.current = next;
        let Some(next) = next else {
            return Ok(());
        };
        let into = &mut *env;
        let switched = vcpus.visit(next, move |v| {
            into.vpmu.switch_in(into.platform, into.word, into.pcpu, v)
        });
        switched.unwrap_or_else(|| {
            // Not a vCPU of the table: the pCPU runs none (the previous one is out).
            env.pcpu.current = None;
            Err(CoreError::NoSuchVcpu(next))
        })
    }

    /// The previous vCPU's half of a switch.
    #[inline]
    fn switch_out<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        vcpu.running_on = None;
        let saved = if vcpu.state == (VcpuState::Loaded { pcpu: pcpu.index }) {
            self.save_loaded(pcpu, vcpu).map(|_| ())
        } else {
            Ok(())
        };
        // A cached sample stops its vCPU's counters, so the physical LVTPC masked for it need
        // not stay masked for whoever runs here next.
        if pcpu.lvtpc_masked_for.is_some_and(|owner| owner == vcpu.id) {
            self.unmask_physical_lvtpc(platform, pcpu);
        }
        saved
    }

    /// `next`'s half of a switch, under the packed policy `word`.
    #[inline]
    fn switch_in<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        word: u64,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        if let VcpuState::Loaded { pcpu: other } = vcpu.state {
            if other != pcpu.index {
                return Err(CoreError::WrongPcpu {
                    here: pcpu.index,
                    loaded_on: other,
                });
            }
        }
        vcpu.running_on = Some(pcpu.index);
        if vcpu.validated != PolicySnapshot::epoch_of(word) {
            self.settle_changed(platform, PolicySnapshot::unpack(word), vcpu);
        }
        if vcpu.state == VcpuState::Saved && PolicySnapshot::switches_contexts_of(word) {
            self.load_switching(platform, pcpu, vcpu)?;
        }
        self.deliver_pending(platform, pcpu, vcpu)?;
        Ok(())
    }

    /// Saves `vcpu`'s context off `pcpu` if it is loaded there, charging the accesses to it;
    /// an overflow with its interrupt enabled that the save found is kept pending.
    pub(crate) fn save_vcpu<H: MsrBus>(
        &self,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<Overflow, CoreError> {
        let here = pcpu.index;
        match vcpu.state {
            VcpuState::Loaded { pcpu: p } if p == here => {}
            VcpuState::Loaded { pcpu: p } => {
                return Err(CoreError::WrongPcpu { here, loaded_on: p });
            }
            _ => return Ok(Overflow::default()),
        }
        self.save_loaded(pcpu, vcpu)
    }

    /// `save_vcpu` for a vCPU the caller found loaded on `pcpu`.
    #[inline]
    fn save_loaded<H: MsrBus>(
        &self,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<Overflow, CoreError> {
        let mut bus = ChargedBus {
            hw: &mut pcpu.hw,
            stats: &mut vcpu.stats.hw_msr,
        };
        let overflow = Self::save_on(&self.backend, &mut vcpu.ctx, &mut bus, &mut pcpu.record)?;
        vcpu.stats.saves += 1;
        vcpu.state = VcpuState::Saved;
        // `interrupt` says that one of `counters` has its interrupt enabled (the trait's
        // contract for `Overflow`): it implies a counter, and is the one test made here.
        debug_assert!(!overflow.interrupt || !overflow.counters.is_empty());
        if overflow.interrupt {
            let merged = vcpu.pending_pmi.map_or(overflow, |p| Overflow {
                counters: p.counters.union(overflow.counters),
                interrupt: true,
            });
            vcpu.pending_pmi = Some(merged);
        }
        Ok(overflow)
    }

    /// Loads `vcpu`'s context onto `pcpu`, where it runs, if it is saved, the mode switches
    /// contexts and it has anything to run.
    #[inline(always)]
    pub(crate) fn load_if_active<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        policy: PolicySnapshot,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        if vcpu.state != VcpuState::Saved || vcpu.running_on != Some(pcpu.index) {
            return Ok(());
        }
        self.load_saved_if_active(platform, policy, pcpu, vcpu)
    }

    #[inline(never)]
    fn load_saved_if_active<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        policy: PolicySnapshot,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        // Only a mode that switches contexts loads one here; the callers settle otherwise.
        if !self.available || !policy.mode.switches_contexts() {
            return Ok(());
        }
        self.settle(platform, policy, vcpu);
        self.load_settled(platform, policy, pcpu, vcpu)
    }

    /// `load_if_active` for a saved vCPU that runs on `pcpu`, already settled with `policy`
    /// (settling never leaves a saved context in another state).
    #[inline]
    fn load_settled<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        policy: PolicySnapshot,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        if !policy.mode.switches_contexts() {
            return Ok(());
        }
        self.load_switching(platform, pcpu, vcpu)
    }

    /// `load_settled` in a mode that switches contexts (the caller checked).
    #[inline]
    fn load_switching<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        if !self.available || !self.backend.is_active(&vcpu.ctx) {
            return Ok(());
        }
        // A vCPU that counts again must get its PMIs, whatever a former sample of its masked.
        if pcpu.lvtpc_masked_for.is_some_and(|owner| owner == vcpu.id) {
            self.unmask_physical_lvtpc(platform, pcpu);
        }
        let mut bus = ChargedBus {
            hw: &mut pcpu.hw,
            stats: &mut vcpu.stats.hw_msr,
        };
        Self::load_on(&self.backend, &vcpu.ctx, &mut bus, &mut pcpu.record)?;
        vcpu.stats.loads += 1;
        vcpu.state = VcpuState::Loaded { pcpu: pcpu.index };
        Ok(())
    }

    /// Brings a vCPU that is not on hardware in line with `policy`: a saved context validated
    /// under an older epoch is restricted to the rules in force; a cached window the mode no
    /// longer has (a sample of the other kind than the mode makes) is released.
    #[inline(always)]
    pub(crate) fn settle<P: Platform>(
        &self,
        platform: &mut P,
        policy: PolicySnapshot,
        vcpu: &mut VcpuPmu<B::Context>,
    ) {
        if vcpu.validated != policy.epoch {
            self.settle_changed(platform, policy, vcpu);
        }
    }

    #[cold]
    #[inline(never)]
    fn settle_changed<P: Platform>(
        &self,
        platform: &mut P,
        policy: PolicySnapshot,
        vcpu: &mut VcpuPmu<B::Context>,
    ) {
        if let VcpuState::Loaded { .. } = vcpu.state {
            // Restricted by its pCPU's catch-up, which owns the hardware.
            return;
        }
        let stale_window = match vcpu.state {
            VcpuState::Cached {
                from: SampleSource::System { .. },
            } => policy.mode != Mode::All,
            VcpuState::Cached {
                from: SampleSource::Own { .. },
            } => !policy.mode.switches_contexts(),
            _ => false,
        };
        if stale_window {
            self.release_cached(platform, vcpu);
        }
        if policy.mode != Mode::All {
            vcpu.program = None;
            vcpu.handover = None;
        }
        let guest = self.guest_policy(policy, platform, vcpu.id.domain);
        if let Some(program) = vcpu.program.as_mut() {
            let _ = self.backend.restrict(program, &guest);
        }
        if let VcpuState::Cached { .. } = vcpu.state {
            // Inside the cached window the context is what the page was published from: the
            // flush tells unedited registers from edited ones by it, and gives the unedited
            // ones the images of the policy then in force. Restricting it now would make an
            // unedited page look edited (DS_AREA has no separate hardware image).
            vcpu.validated = policy.epoch;
            return;
        }
        // Policy changes are rare: a copy tells whether any hardware image changed, which a
        // refusal does not cover (a filtered event is accepted with its enable cleared).
        let before = vcpu.ctx.clone();
        let refused = self.backend.restrict(&mut vcpu.ctx, &guest);
        vcpu.validated = policy.epoch;
        if refused.is_some() || vcpu.ctx != before {
            vcpu.stats.restrictions += 1;
            platform.diagnostic(Diagnostic::RestrictedByPolicy {
                vcpu: vcpu.id,
                register: refused.map_or("event filtered", |r| r.register),
            });
        }
    }

    /// A policy change on the pCPU holding `vcpu`'s context: restricts it in place if the new
    /// policy refuses anything it programmed (save, restrict, load: only then).
    pub(crate) fn restrict_loaded<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        policy: PolicySnapshot,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        let guest = self.guest_policy(policy, platform, vcpu.id.domain);
        // The controls in a loaded context are current (only counter values live on the
        // hardware), so a copy tells whether anything must change.
        let mut probe = vcpu.ctx.clone();
        let refused = self.backend.restrict(&mut probe, &guest);
        if refused.is_none() && probe == vcpu.ctx {
            vcpu.validated = policy.epoch;
            return Ok(());
        }
        self.save_vcpu(pcpu, vcpu)?;
        self.settle(platform, policy, vcpu);
        self.load_if_active(platform, policy, pcpu, vcpu)?;
        if vcpu.state != (VcpuState::Loaded { pcpu: pcpu.index }) {
            self.scrub(pcpu)?;
        }
        // The vCPU keeps running here: an overflow in flight that the save found is its now,
        // not at its next switch-in (which may be far off).
        self.deliver_pending(platform, pcpu, vcpu)
    }

    /// Delivers an overflow kept pending at a save, now that `vcpu` runs on `pcpu`.
    #[inline(always)]
    pub(crate) fn deliver_pending<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        if vcpu.pending_pmi.is_none() || vcpu.running_on != Some(pcpu.index) {
            return Ok(());
        }
        self.deliver_kept_pmi(platform, pcpu, vcpu)
    }

    #[cold]
    #[inline(never)]
    fn deliver_kept_pmi<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        let Some(overflow) = vcpu.pending_pmi.take() else {
            return Ok(());
        };
        if !self.policy().mode.switches_contexts() {
            return Ok(());
        }
        vcpu.stats.pmis_kept_pending += 1;
        if let Some(ring) = vcpu.ring.as_ref() {
            // Ring mode: the save acknowledged the overflow and the load put the wrapped value
            // back; the hypervisor re-arms it now, as at a PMI.
            if vcpu.state == (VcpuState::Loaded { pcpu: pcpu.index }) {
                let (mut bus, _) = pcpu.counted();
                let periods = Some(&ring.periods);
                self.rearm_for_ring(periods, &mut vcpu.ctx, &mut bus, overflow)?;
                vcpu.stats.hw_msr = vcpu.stats.hw_msr + bus.stats();
            }
        }
        // The guest takes the interrupt where it resumes (KVM injects a pending PMI at entry):
        // that is the sample. A platform that cannot tell has the PMI dropped and counted.
        let interrupted = match (platform.resume_regs(vcpu.id), vcpu.page) {
            (Some(regs), _) => Interrupted::Guest {
                vcpu: vcpu.id,
                regs,
            },
            // Through the virtual LVTPC the guest reads its own registers: none are used.
            (None, None) => Interrupted::Guest {
                vcpu: vcpu.id,
                regs: Regs::default(),
            },
            (None, Some(_)) => Interrupted::Hypervisor {
                regs: Regs::default(),
                on_behalf_of: None,
            },
        };
        self.route_own(platform, pcpu, vcpu, overflow, Some(&interrupted))?;
        Ok(())
    }

    /// Ends a cached window without loading the page's context (its counters are stopped; an
    /// all-mode sample's pCPU is told by the flush or the teardown, not here).
    pub(crate) fn release_cached<P: Platform>(
        &self,
        platform: &mut P,
        vcpu: &mut VcpuPmu<B::Context>,
    ) {
        if let Some(page) = vcpu.page {
            platform.with_page(page.slot, vpmu_abi::writer::clear_cached);
        }
        vcpu.sampled = None;
        vcpu.state = VcpuState::Saved;
    }

    pub(crate) fn mask_physical_lvtpc<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        owner: VcpuId,
    ) {
        pcpu.lvtpc_masked_for = Some(owner);
        platform.set_physical_lvtpc_masked(pcpu.index, true);
    }

    pub(crate) fn unmask_physical_lvtpc<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
    ) {
        if pcpu.lvtpc_masked_for.take().is_some() {
            platform.set_physical_lvtpc_masked(pcpu.index, false);
        }
    }

    /// Stops and discards `pcpu`'s system-wide context (leaving nothing counting), and
    /// releases its physical LVTPC if a sample of that context was cached.
    pub(crate) fn drop_system_context<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
    ) -> Result<(), CoreError> {
        if let SystemContext::Loaded { .. } =
            core::mem::replace(&mut pcpu.system, SystemContext::Absent)
        {
            Self::save_on(
                &self.backend,
                &mut pcpu.system_ctx,
                &mut pcpu.hw,
                &mut pcpu.record,
            )?;
        }
        self.unmask_physical_lvtpc(platform, pcpu);
        Ok(())
    }

    /// Clears every control a saved context left programmed on `pcpu` (nothing counts there
    /// anyway, the global control being 0): after a policy change that leaves a context off
    /// the hardware, so that what is on the hardware passes the rules in force. Loading a
    /// reset context, which has nothing in use, does exactly that and starts nothing.
    pub(crate) fn scrub<H: MsrBus>(
        &self,
        pcpu: &mut PcpuPmu<B::Context, H>,
    ) -> Result<(), CoreError> {
        let empty = self.backend.new_context();
        Self::load_on(&self.backend, &empty, &mut pcpu.hw, &mut pcpu.record)?;
        Ok(())
    }

    /// `backend.save` with the pCPU's record; a fault leaves the record knowing nothing.
    pub(crate) fn save_on<H: MsrBus>(
        backend: &B,
        ctx: &mut B::Context,
        hw: &mut H,
        record: &mut HwRecord,
    ) -> Result<Overflow, MsrFault> {
        let result = backend.save(ctx, hw, record);
        if result.is_err() {
            record.forget();
        }
        result
    }

    /// `backend.load` with the pCPU's record; a fault leaves the record knowing nothing.
    pub(crate) fn load_on<H: MsrBus>(
        backend: &B,
        ctx: &B::Context,
        hw: &mut H,
        record: &mut HwRecord,
    ) -> Result<(), MsrFault> {
        let result = backend.load(ctx, hw, record);
        if result.is_err() {
            record.forget();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use crate::core::{Mode, PolicySnapshot};

    /// The switch's one-test mode check agrees with the mode it packs, for every mode and
    /// whatever the other fields hold.
    #[test]
    fn the_packed_mode_check_is_switches_contexts() {
        for mode in [Mode::Off, Mode::SelfProfiling, Mode::Hypervisor, Mode::All] {
            for (features, epoch) in [(0, 0), (0xff, 1), (0x5a, u64::MAX >> 16)] {
                let word = PolicySnapshot {
                    mode,
                    features,
                    epoch,
                }
                .pack();
                assert_eq!(
                    PolicySnapshot::switches_contexts_of(word),
                    mode.switches_contexts(),
                    "{mode:?}"
                );
            }
        }
    }
}
