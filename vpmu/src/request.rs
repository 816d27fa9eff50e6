//! Cross-CPU work as explicit requests, and policy changes that every pCPU applies itself.
//!
//! Code on pCPU *a* never touches pCPU *b*'s hardware. What must happen on *b* is handed to
//! the platform as a [`CrossCpuRequest`] (`Platform::send_request`), which delivers it to *b*
//! (an IPI in a ring-0 hypervisor; a per-pCPU queue drained before the next guest entry and a
//! kick in a threaded VMM), where the integrator calls [`Vpmu::complete_request`]. Requests are
//! idempotent: delivering one twice, or one that is no longer needed, does nothing.
//!
//! A policy change (mode, features, a domain's event filter) commits a new epoch at once and
//! asks every other pCPU to catch up with it (`CatchUp`). Every entry point also catches its
//! pCPU up before doing anything else, so a pCPU never acts under a policy it has not applied;
//! the request only makes it happen before that pCPU's next guest entry. The change is complete
//! when every online pCPU has caught up; until then the operation that made it returns
//! `-EAGAIN` and a second change is refused with `-EAGAIN`.

use core::sync::atomic::Ordering;

use crate::backend::{GuestPolicy, MsrOutcome, PmuBackend};
use crate::core::{CoreError, Mode, PolicySnapshot, VcpuTable, Vpmu, may_count_host};
use crate::msr::{Msr, MsrBus};
use crate::platform::{Platform, VcpuId};
use crate::state::{ImagesUnder, PcpuPmu, SystemContext, VcpuPmu, VcpuState};

/// Work the core needs done on another physical CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrossCpuRequest {
    /// Bring this pCPU in line with the newest policy epoch (save or restrict what is loaded
    /// here, drop a system-wide context when all mode ends).
    CatchUp,
    /// Tear `vcpu`'s vPMU down here if its context is loaded here (it runs here): a finish or
    /// `Vpmu::teardown_vcpu` called on another pCPU. The vCPU counts until this request is
    /// handled, and its teardown is whole then (see `Vpmu::teardown_vcpu`). If it is no longer
    /// loaded here, nothing: the caller's next try finds it elsewhere.
    Teardown {
        /// The vCPU.
        vcpu: VcpuId,
    },
    /// All mode: `profiler` wrote `value` to `msr` on another pCPU it profiles; the same write
    /// (already validated against its program) reaches this pCPU's instance, whose other
    /// registers keep their values. An absent instance is made from the program.
    SystemWrite {
        /// The privileged vCPU that profiles this pCPU.
        profiler: VcpuId,
        /// The register written.
        msr: Msr,
        /// The value written.
        value: u64,
    },
    /// All mode: `profiler` flushed the sample of this pCPU's system-wide context; load the
    /// verified context it handed over and restart the counters.
    ResumeSystem {
        /// The privileged vCPU.
        profiler: VcpuId,
    },
    /// All mode: stop and drop this pCPU's system-wide context of `profiler` (its finish).
    DropSystem {
        /// The privileged vCPU.
        profiler: VcpuId,
    },
}

/// Whether an operation that needed other pCPUs has completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Everything has happened.
    Done,
    /// Requests are in flight; the operation completes when they have been handled (call it
    /// again to find out, or watch `Vpmu::change_in_progress`).
    Pending,
}

impl<B: PmuBackend> Vpmu<B> {
    /// Runs a request on the pCPU it was sent to: `pcpu` must be that pCPU's state, and the
    /// call must happen on that CPU.
    pub fn complete_request<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        request: CrossCpuRequest,
    ) -> Result<(), CoreError> {
        self.catch_up_with_table(platform, pcpu, vcpus)?;
        let here = pcpu.index;
        let mut result = Ok(());
        match request {
            CrossCpuRequest::CatchUp => {}
            CrossCpuRequest::Teardown { vcpu } => {
                vcpus.with_vcpu(vcpu, &mut |v| {
                    if v.state == (VcpuState::Loaded { pcpu: here }) {
                        // Saving stops its counters: the teardown happens now, whole, rather
                        // than leave it running with nothing counting until the caller's retry.
                        result = self.teardown_local(platform, pcpu, v);
                    }
                });
            }
            CrossCpuRequest::SystemWrite {
                profiler,
                msr,
                value,
            } => {
                let policy = self.policy();
                if policy.mode != Mode::All {
                    return Ok(());
                }
                // An instance here names the profiler it was made for (`profiler_of` of this
                // pCPU then, a vCPU of the privileged domain): the write reaches it without
                // asking the platform who profiles here or visiting the profiler. Only
                // without one (or when the write no longer applies) is the instance made
                // from the program.
                let owned = match pcpu.system {
                    SystemContext::Loaded { profiler: owner }
                    | SystemContext::Cached { profiler: owner } => owner == profiler,
                    SystemContext::Absent => {
                        if Self::profiler_of(platform, here) != Some(profiler) {
                            return Ok(());
                        }
                        false
                    }
                };
                // The program classified and accepted the MSR already.
                let Some(register) = self.backend.classify(msr) else {
                    return Ok(());
                };
                if owned {
                    // The privileged profiler's policy in all mode (`Vpmu::guest_policy`).
                    let guest = GuestPolicy {
                        features: policy.features,
                        filter: platform.event_filter(profiler.domain),
                        may_count_host: may_count_host(policy.mode, true),
                    };
                    if self.write_instance(pcpu, policy, &guest, register, value)? {
                        return Ok(());
                    }
                }
                vcpus.with_vcpu(profiler, &mut |p| {
                    result = self.reload_system(pcpu, p);
                });
            }
            CrossCpuRequest::ResumeSystem { profiler } => {
                vcpus.with_vcpu(profiler, &mut |p| {
                    result = self.resume_system(platform, pcpu, p);
                });
            }
            CrossCpuRequest::DropSystem { profiler } => {
                let owned = match pcpu.system {
                    SystemContext::Loaded { profiler: owner }
                    | SystemContext::Cached { profiler: owner } => owner == profiler,
                    SystemContext::Absent => false,
                };
                if owned {
                    self.drop_system_context(platform, pcpu)?;
                    vcpus.with_vcpu(profiler, &mut |p| self.count_instance(p, false));
                }
            }
        }
        result
    }

    /// Brings `pcpu` in line with the newest policy, with `current` the vCPU running there
    /// (if the caller has it at hand; else the table is used).
    #[inline(always)]
    pub(crate) fn catch_up_with_table<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
    ) -> Result<(), CoreError> {
        if pcpu.seen.epoch == self.policy().epoch {
            return Ok(());
        }
        self.catch_up_changed(platform, pcpu, vcpus)
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn catch_up_changed<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
    ) -> Result<(), CoreError> {
        let mut result = Ok(());
        let found = match pcpu.current {
            Some(id) => vcpus.with_vcpu(id, &mut |v| {
                result = self.catch_up(platform, pcpu, Some(v));
            }),
            None => false,
        };
        if !found {
            result = self.catch_up(platform, pcpu, None);
        }
        result
    }

    /// See `catch_up_with_table`; `current` must be the vCPU running on `pcpu`, if any.
    pub(crate) fn catch_up<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        mut current: Option<&mut VcpuPmu<B::Context>>,
    ) -> Result<(), CoreError> {
        let now = self.policy();
        if pcpu.seen.epoch == now.epoch {
            return Ok(());
        }
        let before = pcpu.seen;
        let crosses_all = (before.mode == Mode::All) != (now.mode == Mode::All);
        let here = pcpu.index;
        if let Some(vcpu) = current.as_deref_mut() {
            if vcpu.state == (VcpuState::Loaded { pcpu: here }) {
                if crosses_all || !now.mode.switches_contexts() {
                    // The new mode starts from PMUs where nothing counts (only privileged contexts can be
                    // live across a change that needs no vPMU in use), and no control is left
                    // programmed under rules that may no longer allow it.
                    self.save_vcpu(pcpu, vcpu)?;
                    self.scrub(pcpu)?;
                } else if Self::same_guest_policy(platform, before, now, vcpu) {
                    // Restricting is a function of the control and the guest policy alone:
                    // under the same guest policy it would change nothing.
                    vcpu.validated = now.epoch;
                } else {
                    self.restrict_loaded(platform, now, pcpu, vcpu)?;
                }
            }
        }
        if crosses_all {
            self.drop_system_context(platform, pcpu)?;
        }
        pcpu.seen = now;
        // One decrement per online pCPU per epoch; saturating so that a check-then-decrement
        // race between two pCPUs could never wrap the count into "forever in progress".
        let _ = self
            .lagging
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if let Some(vcpu) = current {
            // A privileged vCPU running here picks its saved context up again.
            self.settle(platform, now, vcpu);
            self.load_if_active(platform, now, pcpu, vcpu)?;
            // It keeps running: an overflow the save above found is due now (or, in a mode
            // without contexts, gone with its vPMU), not at its next switch-in.
            self.deliver_pending(platform, pcpu, vcpu)?;
        }
        Ok(())
    }

    /// Whether `vcpu`'s guest policy (features, event filter, `may_count_host`) under `now` is
    /// the one its context was validated under, `before`, the epoch this pCPU applied last:
    /// then its loaded controls need not be judged again. Only for the next epoch (each epoch
    /// changes one thing): a new epoch with the mode and features unchanged is an event-filter
    /// change (`event_filter_changed`), which may change any domain's filter; one that changes
    /// the mode keeps the filters and changes `may_count_host` only for the privileged domain
    /// between self and hv/all mode (asked of the platform only then).
    fn same_guest_policy<P: Platform>(
        platform: &P,
        before: PolicySnapshot,
        now: PolicySnapshot,
        vcpu: &VcpuPmu<B::Context>,
    ) -> bool {
        if now.epoch != before.epoch.wrapping_add(1)
            || vcpu.validated != before.epoch
            || before.mode == now.mode
            || before.features != now.features
        {
            return false;
        }
        may_count_host(before.mode, true) == may_count_host(now.mode, true)
            || vcpu.id.domain != platform.privileged_domain()
    }

    /// Starts a policy change from the caller's pCPU, or reports how the one it started is
    /// going. `exclusive`: the change needs no unprivileged vPMU in use.
    pub(crate) fn change_policy<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        mode: Mode,
        features: u64,
        exclusive: bool,
    ) -> Result<Completion, ChangeRefused> {
        self.commit_and_announce(platform, pcpu, vcpus, mode, features, exclusive, false)
    }

    /// Commits the policy (`mode`, `features`) as a new epoch, unless it is the one in force
    /// and `even_if_same` is false, and starts every pCPU catching up with it.
    #[allow(clippy::too_many_arguments)]
    fn commit_and_announce<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        mode: Mode,
        features: u64,
        exclusive: bool,
        even_if_same: bool,
    ) -> Result<Completion, ChangeRefused> {
        let committed = {
            let _control = self.control.lock();
            if self.change_in_progress() {
                // One change at a time: a caller retrying the change it started learns
                // whether it has completed; anyone else waits too.
                return Err(ChangeRefused::InProgress);
            }
            let old = self.policy();
            if !even_if_same && old.mode == mode && old.features == features {
                return Ok(Completion::Done);
            }
            self.commit_policy(mode, features, exclusive)
                .ok_or(ChangeRefused::InUse)?
        };
        self.announce(platform, pcpu, vcpus, committed)
            .map_err(ChangeRefused::Fault)
    }

    /// The integrator changed `domain`'s event filter (`Platform::event_filter`): counters
    /// already programmed with an event the new filter denies stop counting, on every pCPU,
    /// before its next guest entry (KVM reprograms at the next entry too). Call it on a pCPU
    /// after the platform answers with the new filter. `Pending` until every pCPU caught up;
    /// `Err(InProgress)` while another change is being applied (try again).
    pub fn event_filter_changed<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
    ) -> Result<Completion, ChangeRefused> {
        // The filter is the platform's: the same mode and features make a new epoch all the
        // same, so that every context is judged again.
        let old = self.policy();
        self.commit_and_announce(platform, pcpu, vcpus, old.mode, old.features, false, true)
    }

    fn announce<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        committed: PolicySnapshot,
    ) -> Result<Completion, CoreError> {
        self.catch_up_with_table(platform, pcpu, vcpus)?;
        for other in (0..self.pcpu_count).filter(|&p| p != pcpu.index) {
            platform.send_request(other, CrossCpuRequest::CatchUp);
        }
        // Only privileged vCPUs can hold a context or a cached window across a change that
        // needs none in use; those not on hardware are brought in line now (no hardware is
        // involved), so that a window the new mode does not have ends with the change.
        let privileged = platform.privileged_domain();
        vcpus.for_each_in_domain(privileged, &mut |v| self.settle(platform, committed, v));
        Ok(if self.change_in_progress() {
            Completion::Pending
        } else {
            Completion::Done
        })
    }

    /// All mode: `profiler`'s write of `value` to `register`, which its program accepted,
    /// reaches this pCPU's instance: the live one through the hardware, a cached one in memory
    /// (the flush then verifies the page against it), an absent one is made from the program
    /// (which holds this write already). `guest` is `profiler`'s policy under `policy`, which
    /// this pCPU has caught up with (the caller made it once for the program's verdict or for
    /// the request).
    pub(crate) fn write_system_instance<H: MsrBus>(
        &self,
        pcpu: &mut PcpuPmu<B::Context, H>,
        profiler: &mut VcpuPmu<B::Context>,
        policy: PolicySnapshot,
        guest: &GuestPolicy<'_>,
        register: B::Register,
        value: u64,
    ) -> Result<(), CoreError> {
        if self.write_instance(pcpu, policy, guest, register, value)? {
            return Ok(());
        }
        self.reload_system(pcpu, profiler)
    }

    /// [`Vpmu::write_system_instance`] to an instance this pCPU holds: `Ok(false)` when there
    /// is none or the write does not apply to it, and the caller makes it from the program.
    #[inline(always)]
    fn write_instance<H: MsrBus>(
        &self,
        pcpu: &mut PcpuPmu<B::Context, H>,
        policy: PolicySnapshot,
        guest: &GuestPolicy<'_>,
        register: B::Register,
        value: u64,
    ) -> Result<bool, CoreError> {
        if matches!(pcpu.system, SystemContext::Absent) {
            return Ok(false);
        }
        // The written control is judged under `policy`; the others keep their epochs.
        pcpu.system_images = pcpu.system_images.after_write(policy.epoch);
        let ctx = &mut pcpu.system_ctx;
        let outcome = if matches!(pcpu.system, SystemContext::Loaded { .. }) {
            self.backend
                .write_register(ctx, Some(&mut pcpu.hw), guest, register, value)?
        } else {
            self.backend
                .write_register(ctx, None::<&mut H>, guest, register, value)?
        };
        // Refused: the policy changed since the program accepted it (the catch-up before this
        // request restricted the program too), and the instance follows the program.
        Ok(outcome == MsrOutcome::Handled(()))
    }

    /// All mode: this pCPU's system-wide context becomes `profiler`'s program.
    pub(crate) fn reload_system<H: MsrBus>(
        &self,
        pcpu: &mut PcpuPmu<B::Context, H>,
        profiler: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        let Some(program) = profiler.program.clone() else {
            return Ok(());
        };
        match core::mem::replace(&mut pcpu.system, SystemContext::Absent) {
            SystemContext::Absent => {
                Self::load_on(&self.backend, &program, &mut pcpu.hw, &mut pcpu.record)?;
                self.count_instance(profiler, true);
            }
            SystemContext::Loaded { .. } => {
                Self::save_on(
                    &self.backend,
                    &mut pcpu.system_ctx,
                    &mut pcpu.hw,
                    &mut pcpu.record,
                )?;
                Self::load_on(&self.backend, &program, &mut pcpu.hw, &mut pcpu.record)?;
            }
            cached @ SystemContext::Cached { .. } => {
                // Its sample is the profiler's to flush; the flush brings the page's context.
                pcpu.system = cached;
                return Ok(());
            }
        }
        pcpu.system_ctx = program;
        pcpu.system_images = ImagesUnder::Unvouched;
        pcpu.system = SystemContext::Loaded {
            profiler: profiler.id,
        };
        Ok(())
    }

    fn resume_system<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        profiler: &mut VcpuPmu<B::Context>,
    ) -> Result<(), CoreError> {
        let here = pcpu.index;
        let Some((_, ctx, images)) = profiler.handover.take_if(|(p, ..)| *p == here) else {
            return Ok(());
        };
        if !matches!(pcpu.system, SystemContext::Cached { .. }) {
            return Ok(());
        }
        Self::load_on(&self.backend, &ctx, &mut pcpu.hw, &mut pcpu.record)?;
        pcpu.system_ctx = ctx;
        pcpu.system_images = images;
        pcpu.system = SystemContext::Loaded {
            profiler: profiler.id,
        };
        self.unmask_physical_lvtpc(platform, pcpu);
        Ok(())
    }

    /// Counts a system-wide instance of `profiler`'s program made (`true`) or dropped.
    pub(crate) fn count_instance(&self, profiler: &mut VcpuPmu<B::Context>, made: bool) {
        let since = self.all_since.load(Ordering::Acquire);
        if profiler.system_instances.1 < since {
            profiler.system_instances = (0, since);
        }
        let count = &mut profiler.system_instances.0;
        *count = if made {
            *count + 1
        } else {
            count.saturating_sub(1)
        };
    }

    /// System-wide instances of `profiler`'s program in this all-mode period.
    pub(crate) fn instances(&self, profiler: &VcpuPmu<B::Context>) -> u32 {
        if profiler.system_instances.1 < self.all_since.load(Ordering::Acquire) {
            0
        } else {
            profiler.system_instances.0
        }
    }
}

/// Why a policy change was not started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeRefused {
    /// Another change is still being applied (`-EAGAIN`).
    InProgress,
    /// Unprivileged vPMUs are in use (`-EBUSY`).
    InUse,
    /// A hardware access faulted while the caller's pCPU caught up (a hypervisor bug; the
    /// change itself is committed).
    Fault(CoreError),
}
