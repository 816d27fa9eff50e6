//! The control operations, exactly as docs/abi.md specifies them: operation number, then
//! version, then privilege, then arguments, then state; an operation that fails changes
//! nothing, and its OUT fields are only produced on success. `-EAGAIN` is the exception that
//! docs/abi.md describes: a change that has begun and is being applied on other pCPUs.

use vpmu_abi::ops::{CoverageParams, Op, OpError, Params, is_valid_features, is_valid_mode};
use vpmu_abi::writer::{
    clear_cached, clear_vendor_words, copy_vendor_words, guest_lvtpc_masked, init_page, set_tsc_khz,
};
use vpmu_abi::{XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR};

use crate::backend::{ContextError, GuestPolicy, PmuBackend, PublishedImages};
use crate::core::{Mode, PolicySnapshot, VcpuTable, Vpmu};
use crate::msr::MsrBus;
use crate::platform::{Diagnostic, MapError, PageSlot, Platform, VcpuId};
use crate::request::{ChangeRefused, Completion, CrossCpuRequest};
use crate::state::{
    ImagesUnder, PcpuPmu, PendingChange, PolicyChange, SampleSource, SharedPage, SystemContext,
    VcpuPmu, VcpuState,
};

/// Features this backend can enforce; the Intel-only ones are refused elsewhere.
fn enforceable_features(vendor: crate::backend::Vendor) -> u64 {
    match vendor {
        crate::backend::Vendor::Intel => vpmu_abi::XENPMU_FEATURE_MASK,
        crate::backend::Vendor::Amd => 0,
    }
}

fn completion(done: Completion) -> Result<(), OpError> {
    match done {
        Completion::Done => Ok(()),
        Completion::Pending => Err(OpError::Again),
    }
}

fn refused<P: Platform>(platform: &mut P, caller: VcpuId, why: ChangeRefused) -> OpError {
    match why {
        ChangeRefused::InProgress => OpError::Again,
        ChangeRefused::InUse => {
            platform.diagnostic(Diagnostic::ChangeRefusedBusy { caller });
            OpError::Busy
        }
        ChangeRefused::Fault(_) => OpError::InvalidContext,
    }
}

impl<B: PmuBackend> Vpmu<B> {
    /// Runs control operation `op` for `caller`, which runs on `pcpu` (the caller's own
    /// pCPU), with the parameter block `params` (already copied in from guest memory). On
    /// success returns the block to copy back (OUT fields filled in); on failure nothing has
    /// changed and nothing is to be copied back. `OpError::Again` (`-EAGAIN`) means the
    /// operation waits for other pCPUs to handle the requests it sent: deliver them and call
    /// again (a hypervisor restarts the hypercall, as Xen's continuations do).
    pub fn control_op<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        caller: VcpuId,
        op: u32,
        params: &Params,
    ) -> Result<Params, OpError> {
        let op = Op::from_number(op)?;
        // Step 1 for every operation, coverage's included: a hypervisor without a vPMU has none.
        if !self.available {
            return Err(OpError::NotSupported);
        }
        // A platform that cannot map ring areas has no ring: step 1 too (a 1.4 driver falls
        // back to the page).
        if matches!(op, Op::RingInit | Op::RingFinish) && !platform.supports_ring() {
            return Err(OpError::NotSupported);
        }
        if op == Op::Coverage {
            // Its own block layout and checks (coverage.rs).
            return self
                .coverage_op(platform, caller, &CoverageParams::from(*params))
                .map(Params::from);
        }
        if op != Op::ModeGet && params.version.major != u32::from(XENPMU_VERSION_MAJOR) {
            return Err(OpError::VersionMismatch);
        }
        // Asked only when it matters: the hot operations (FLUSH, LVTPC_SET) are anyone's.
        if op.is_privileged() && caller.domain != platform.privileged_domain() {
            return Err(OpError::NotPrivileged);
        }
        let takes_vcpu = matches!(op, Op::Init | Op::Finish | Op::RingInit | Op::RingFinish);
        let takes_no_val = matches!(op, Op::LvtpcSet | Op::Flush | Op::RingFinish);
        if params._pad0 != 0
            || (!takes_vcpu && params.vcpu != 0)
            || (takes_no_val && params.val != 0)
        {
            return Err(OpError::InvalidArgument);
        }
        self.catch_up_with_table(platform, pcpu, vcpus)
            .map_err(|_| OpError::InvalidContext)?;
        let mut out = *params;
        match op {
            Op::ModeGet => {
                out.val = self.policy().mode.to_abi();
                out.version.major = u32::from(XENPMU_VERSION_MAJOR);
                out.version.minor = u32::from(XENPMU_VERSION_MINOR);
            }
            Op::FeatureGet => out.val = self.policy().features,
            Op::ModeSet => self.mode_set(platform, pcpu, vcpus, caller, params.val)?,
            Op::FeatureSet => self.feature_set(platform, pcpu, vcpus, caller, params.val)?,
            Op::Init => self.init(platform, vcpus, caller, params)?,
            Op::Finish => {
                let target = self.target(platform, caller, params.vcpu)?;
                self.finish(platform, pcpu, vcpus, caller, target)?;
            }
            Op::LvtpcSet => {
                let mut result = Err(OpError::InvalidArgument);
                vcpus.with_vcpu(caller, &mut |vcpu| {
                    result = Self::lvtpc_set(platform, vcpu);
                });
                result?;
            }
            // Returned above.
            Op::Coverage => return Err(OpError::NotSupported),
            Op::RingInit => self.ring_init(platform, vcpus, caller, params)?,
            Op::RingFinish => self.ring_finish(platform, vcpus, caller, params)?,
            Op::Flush => vcpus
                .visit(caller, |vcpu| self.flush(platform, pcpu, vcpu))
                .unwrap_or(Err(OpError::InvalidArgument))?,
        }
        Ok(out)
    }

    fn lvtpc_set<P: Platform>(
        platform: &mut P,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), OpError> {
        let page = vcpu.page.ok_or(OpError::NoVpmu)?;
        let lvtpc = platform
            .with_page(page.slot, |page| page.lapic_lvtpc)
            .ok_or(OpError::NoVpmu)?;
        // While a sample is cached the new mask applies at flush, which reads it again.
        if !matches!(vcpu.state, VcpuState::Cached { .. }) {
            vcpu.page_lvtpc_masked = guest_lvtpc_masked(lvtpc);
        }
        Ok(())
    }

    pub(crate) fn target<P: Platform>(
        &self,
        platform: &P,
        caller: VcpuId,
        vcpu: u32,
    ) -> Result<VcpuId, OpError> {
        let count = platform
            .vcpu_count(caller.domain)
            .ok_or(OpError::InvalidArgument)?;
        if vcpu >= count {
            return Err(OpError::InvalidArgument);
        }
        Ok(VcpuId {
            domain: caller.domain,
            vcpu,
        })
    }

    fn mode_set<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        caller: VcpuId,
        mode: u64,
    ) -> Result<(), OpError> {
        if !is_valid_mode(mode) {
            return Err(OpError::InvalidArgument);
        }
        let mode = Mode::from_abi(mode).ok_or(OpError::InvalidArgument)?;
        let old = self.policy();
        let request = PolicyChange::Mode(mode);
        if let Some(answer) = self.retried_change(vcpus, caller, request) {
            return answer;
        }
        if mode == old.mode {
            return Ok(());
        }
        let self_hv_swap = old.mode.switches_contexts() && mode.switches_contexts();
        let done = self
            .change_policy(platform, pcpu, vcpus, mode, old.features, !self_hv_swap)
            .map_err(|why| refused(platform, caller, why))?;
        self.started_change(vcpus, caller, request, done)
    }

    fn feature_set<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
        caller: VcpuId,
        features: u64,
    ) -> Result<(), OpError> {
        if !is_valid_features(features) {
            return Err(OpError::InvalidArgument);
        }
        if features & !enforceable_features(self.backend.capabilities().vendor) != 0 {
            return Err(OpError::NotSupported);
        }
        let old = self.policy();
        let request = PolicyChange::Features(features);
        if let Some(answer) = self.retried_change(vcpus, caller, request) {
            return answer;
        }
        if features == old.features {
            return Ok(());
        }
        let done = self
            .change_policy(platform, pcpu, vcpus, old.mode, features, true)
            .map_err(|why| refused(platform, caller, why))?;
        self.started_change(vcpus, caller, request, done)
    }

    /// A MODE_SET/FEATURE_SET call while a change is being applied. The caller's own change
    /// (the same request it started, `PendingChange`) answers 0 once it is complete, even if
    /// another caller's change followed it: the two are then serialized, the caller's first.
    /// Without this, two callers retrying different values would each re-commit theirs as
    /// soon as the other's completed, forever. `None`: go on with the request.
    fn retried_change<T: VcpuTable<B::Context>>(
        &self,
        vcpus: &T,
        caller: VcpuId,
        request: PolicyChange,
    ) -> Option<Result<(), OpError>> {
        let in_progress = self.change_in_progress();
        let epoch = self.policy().epoch;
        let mut answer = None;
        vcpus.with_vcpu(caller, &mut |v| {
            answer = match v.pending_change.take() {
                Some(started) if started.request == request => {
                    if in_progress && epoch == started.epoch {
                        v.pending_change = Some(started);
                        Some(Err(OpError::Again))
                    } else {
                        // Complete (a later change may be being applied: this one is done).
                        Some(Ok(()))
                    }
                }
                // None, or a different request: an earlier one is abandoned by its caller
                // (it completes all the same).
                _ => None,
            };
        });
        match answer {
            None if in_progress => Some(Err(OpError::Again)),
            answer => answer,
        }
    }

    /// Remembers a change `caller` began that is still being applied, for `retried_change`.
    fn started_change<T: VcpuTable<B::Context>>(
        &self,
        vcpus: &T,
        caller: VcpuId,
        request: PolicyChange,
        done: Completion,
    ) -> Result<(), OpError> {
        if done == Completion::Pending {
            let epoch = self.policy().epoch;
            vcpus.with_vcpu(caller, &mut |v| {
                v.pending_change = Some(PendingChange { request, epoch });
            });
        }
        completion(done)
    }

    fn init<P: Platform, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        vcpus: &T,
        caller: VcpuId,
        params: &Params,
    ) -> Result<(), OpError> {
        let privileged = platform.privileged_domain();
        let target = self.target(platform, caller, params.vcpu)?;
        // The frame is an argument: an invalid one is refused before any state check (check
        // order, docs/abi.md). Only mapping can tell, so map first and undo it if a state
        // check fails; running out of room is a resource error, reported after them.
        let mapped = platform.map_page(caller.domain, params.val);
        if mapped == Err(MapError::InvalidFrame) {
            return Err(OpError::InvalidArgument);
        }
        // Serializes inits, so the frame check below and the registration are one step.
        let _control = self.control.lock();
        let gfn = params.val;
        let mut frame_in_use = false;
        vcpus.for_each_in_domain(caller.domain, &mut |v| {
            frame_in_use |= v.id != target && v.page.is_some_and(|p| p.gfn == gfn);
            // 1.4: nor part of a ring (a ring area holds no page).
            frame_in_use |= v.ring.as_ref().is_some_and(|r| r.overlaps(gfn, 1));
        });
        let claimed = target.domain != privileged;
        if claimed {
            self.claim_use();
        }
        let policy = self.policy();
        let mut result = Err(OpError::InvalidArgument);
        let found = vcpus.with_vcpu(target, &mut |v| {
            let was_in_use = v.in_use();
            result = if !self.has_vpmu(policy, privileged, v.id) {
                Err(OpError::NoVpmu)
            } else if v.page.is_some() {
                Err(OpError::AlreadyRegistered)
            } else if frame_in_use {
                Err(OpError::FrameInUse)
            } else {
                Ok(())
            };
            if result.is_ok() {
                result = self.register(platform, v, mapped, gfn);
            } else if let Ok(slot) = mapped {
                platform.unmap_page(slot);
            }
            self.settle_use(privileged, v, was_in_use, claimed);
        });
        if !found {
            if claimed {
                self.release_use();
            }
            if let Ok(slot) = mapped {
                platform.unmap_page(slot);
            }
        }
        result
    }

    fn register<P: Platform>(
        &self,
        platform: &mut P,
        vcpu: &mut VcpuPmu<B::Context>,
        mapped: Result<crate::platform::PageSlot, MapError>,
        gfn: u64,
    ) -> Result<(), OpError> {
        let slot = mapped.map_err(|_| OpError::MapFailed)?;
        let layout = self.backend.page_layout();
        let tsc_khz = platform.tsc_khz();
        if platform
            .with_page(slot, |page| {
                init_page(page, &layout);
                set_tsc_khz(page, tsc_khz);
            })
            .is_none()
        {
            platform.unmap_page(slot);
            return Err(OpError::MapFailed);
        }
        vcpu.page = Some(SharedPage {
            slot,
            gfn,
            samples: 0,
            chain_written: 0,
        });
        vcpu.page_lvtpc_masked = true;
        Ok(())
    }

    /// Ends the cached window: copy the vendor area, verify it as WRMSRs would be, load it
    /// (an all-mode sample of another pCPU: hand it over to that pCPU to load).
    fn flush<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), OpError> {
        let page = vcpu.page.ok_or(OpError::NoVpmu)?;
        let policy = self.policy();
        self.settle(platform, policy, vcpu);
        let VcpuState::Cached { from } = vcpu.state else {
            return Err(OpError::InvalidArgument);
        };
        if let SampleSource::System { pcpu: p } = from {
            if p != pcpu.index && vcpu.handover.is_some() {
                // The previous flush's context is still on its way to its pCPU.
                return Err(OpError::Again);
            }
        }
        // The one read of the guest's vendor area: only what the backend's layout addresses,
        // into this pCPU's copy, which is all that is verified from here on.
        let words = pcpu.page_copy_words;
        let copy = &mut pcpu.page_copy;
        let lvtpc = platform
            .with_page(page.slot, |page| {
                copy_vendor_words(page, words, copy);
                page.lapic_lvtpc
            })
            .ok_or(OpError::NoVpmu)?;
        let guest = self.guest_policy(policy, platform, vcpu.id.domain);
        let cached = match pcpu.system {
            SystemContext::Cached { profiler } => Some(profiler),
            _ => None,
        };
        match (from, cached) {
            (SampleSource::System { pcpu: p }, Some(profiler)) if p == pcpu.index => {
                // The sampled pCPU's own flush verifies straight into its system-wide
                // context, the one the sample stopped (only a flush loads it while it is
                // cached): on a refusal it is unchanged.
                let images = vcpu.published_images.at(policy.epoch);
                let verified = vcpu.sampled.as_ref().map(|saved| {
                    self.verify_published(
                        &pcpu.page_copy,
                        saved,
                        images,
                        &guest,
                        &mut pcpu.system_ctx,
                    )
                });
                // No guest data outlives the flush, and a refused one leaves the pCPU as it
                // was.
                clear_vendor_words(&mut pcpu.page_copy, words);
                let verified = verified.ok_or(OpError::InvalidArgument)?;
                Self::accepted(platform, vcpu.id, page.slot, verified)?;
                pcpu.system_images = ImagesUnder::Epoch(policy.epoch);
                let ctx = &pcpu.system_ctx;
                if Self::load_on(&self.backend, ctx, &mut pcpu.hw, &mut pcpu.record).is_err() {
                    // The sample stays cached: its context goes back to the one saved at
                    // the sample, which the cached window's reads answer from.
                    if let Some(saved) = vcpu.sampled.as_ref() {
                        pcpu.system_ctx.clone_from(saved);
                        pcpu.system_images = vcpu.published_images;
                    }
                    return Err(OpError::InvalidContext);
                }
                pcpu.system = SystemContext::Loaded { profiler };
                vcpu.state = VcpuState::Saved;
                vcpu.sampled = None;
                self.unmask_physical_lvtpc(platform, pcpu);
            }
            _ => {
                let saved = match from {
                    // The sampled pCPU's context as saved at the sample (kept with the
                    // sample: that pCPU's state is not ours to read).
                    SampleSource::System { .. } => vcpu.sampled.as_ref(),
                    SampleSource::Own { .. } => Some(&vcpu.ctx),
                };
                let images = vcpu.published_images.at(policy.epoch);
                let mut ctx = self.backend.new_context();
                let verified = saved.map(|saved| {
                    self.verify_published(&pcpu.page_copy, saved, images, &guest, &mut ctx)
                });
                // No guest data outlives the flush, and a refused one leaves the pCPU as it
                // was.
                clear_vendor_words(&mut pcpu.page_copy, words);
                let verified = verified.ok_or(OpError::InvalidArgument)?;
                Self::accepted(platform, vcpu.id, page.slot, verified)?;
                self.place_flushed(platform, policy, pcpu, vcpu, from, cached, ctx)?;
            }
        }
        vcpu.page_lvtpc_masked = guest_lvtpc_masked(lvtpc);
        platform.with_page(page.slot, clear_cached);
        Ok(())
    }

    /// The end of a flush that verified into a fresh context `ctx`: it moves into place (a
    /// vCPU's own context, or a system-wide one handed over to the pCPU it was sampled on).
    #[allow(clippy::too_many_arguments)]
    fn place_flushed<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        policy: PolicySnapshot,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        from: SampleSource,
        cached: Option<VcpuId>,
        ctx: B::Context,
    ) -> Result<(), OpError> {
        match from {
            SampleSource::System { pcpu: p } if p == pcpu.index => {
                // Sampled here, but this pCPU's context is not cached (any more).
                let Some(profiler) = cached else {
                    return Err(OpError::InvalidArgument);
                };
                Self::load_on(&self.backend, &ctx, &mut pcpu.hw, &mut pcpu.record)
                    .map_err(|_| OpError::InvalidContext)?;
                pcpu.system_ctx = ctx;
                pcpu.system_images = ImagesUnder::Epoch(policy.epoch);
                pcpu.system = SystemContext::Loaded { profiler };
                vcpu.state = VcpuState::Saved;
                vcpu.sampled = None;
                self.unmask_physical_lvtpc(platform, pcpu);
            }
            SampleSource::System { pcpu: p } => {
                vcpu.handover = Some((p, ctx, ImagesUnder::Epoch(policy.epoch)));
                vcpu.state = VcpuState::Saved;
                vcpu.sampled = None;
                platform.send_request(p, CrossCpuRequest::ResumeSystem { profiler: vcpu.id });
            }
            SampleSource::Own { pcpu: p } => {
                vcpu.ctx = ctx;
                vcpu.state = VcpuState::Saved;
                if p == pcpu.index && pcpu.lvtpc_masked_for == Some(vcpu.id) {
                    self.unmask_physical_lvtpc(platform, pcpu);
                }
                self.load_if_active(platform, policy, pcpu, vcpu)
                    .map_err(|_| OpError::InvalidContext)?;
            }
        }
        Ok(())
    }

    /// Verifies the copied vendor area `area` into `out` (`PmuBackend::context_from_page_into`).
    /// Debug builds also check the claim behind `PublishedImages::Current` on every flush
    /// that makes it: judging the unedited controls again must give the same verdict (filters
    /// never refuse, and the rest of the policy is the epoch's) and, unless the domain's event
    /// filter is changing, the same context. Inlined, as is `accepted`: called out of line,
    /// with the verdict passed between them, they cost the flush some 30 instructions.
    #[inline(always)]
    fn verify_published(
        &self,
        area: &vpmu_abi::VendorArea,
        saved: &B::Context,
        images: PublishedImages,
        guest: &GuestPolicy<'_>,
        out: &mut B::Context,
    ) -> PageVerdict {
        let verified = self
            .backend
            .context_from_page_into(area, saved, images, guest, out);
        let images_differ = cfg!(debug_assertions) && images == PublishedImages::Current && {
            let judged = self.backend.context_from_page(area, saved, guest);
            assert_eq!(
                verified.as_ref().err(),
                judged.as_ref().err(),
                "the page's verdict depends on judging its unedited controls again"
            );
            judged.is_ok_and(|judged| &judged != out)
        };
        PageVerdict {
            verified,
            images_differ,
        }
    }

    /// A flushed page's verdict: a refusal is reported to the platform and, in the page's
    /// `flush_refusal` (which register, why: docs/abi.md, version 1.3), to the owner, and is
    /// `-EIO`.
    #[inline(always)]
    fn accepted<P: Platform>(
        platform: &mut P,
        vcpu: VcpuId,
        slot: PageSlot,
        verdict: PageVerdict,
    ) -> Result<(), OpError> {
        if verdict.images_differ {
            platform.diagnostic(Diagnostic::PublishedImagesDiffer { vcpu });
        }
        match verdict.verified {
            Ok(()) => Ok(()),
            Err(error) => Err(Self::refused(platform, vcpu, slot, &error)),
        }
    }

    /// Out of line: only a refused page gets here.
    #[cold]
    #[inline(never)]
    fn refused<P: Platform>(
        platform: &mut P,
        vcpu: VcpuId,
        slot: PageSlot,
        error: &ContextError,
    ) -> OpError {
        platform.diagnostic(Diagnostic::InvalidContextAtFlush {
            vcpu,
            register: error.register,
        });
        let refusal = error.refusal();
        platform.with_page(slot, |page| {
            vpmu_abi::writer::set_flush_refusal(page, refusal)
        });
        OpError::InvalidContext
    }
}

/// A flush's verification of its page copy.
struct PageVerdict {
    verified: Result<(), ContextError>,
    /// Debug builds: the published images taken unjudged differ from judging them again
    /// (`Diagnostic::PublishedImagesDiffer`).
    images_differ: bool,
}
