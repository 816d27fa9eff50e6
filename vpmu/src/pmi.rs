//! PMI routing: the backend finds the overflow, the core decides where the interrupt goes.
//!
//! * A vCPU without a page gets it through its virtual LVTPC (counters keep running; the
//!   overflow is in its virtual status).
//! * A vCPU with a page gets a sample in the page (the cached window opens, its counters stop,
//!   the physical LVTPC is masked until flush) and the PMU VIRQ.
//! * In all mode every PMI goes, as a sample, to the privileged vCPU that profiles the pCPU.
//!   In hv mode, a PMI of the privileged profiler's own counters that interrupted the
//!   hypervisor goes to it with the hypervisor's registers. Hypervisor registers never reach
//!   any other domain.

use vpmu_abi::writer::{SampleHead, publish_sample, publish_sample_details, record_dropped_sample};
use vpmu_abi::{
    Identity, Page, Regs, XENPMU_CALLCHAIN_MAX, XENPMU_CHAIN_NONE, XENPMU_DOMID_FIRST_RESERVED,
    XENPMU_DOMID_HYPERVISOR, XENPMU_DOMID_SELF,
};

use crate::backend::{Overflow, PmuBackend};
use crate::core::{CoreError, Mode, VcpuTable, Vpmu};
use crate::msr::MsrBus;
use crate::platform::{
    Diagnostic, Interrupted, Interruption, LvtpcDelivery, Platform, SampledContext, VcpuId,
};
use crate::state::{
    ImagesUnder, PcpuPmu, SampleSource, SharedPage, SystemContext, VcpuPmu, VcpuState,
};

/// What became of a PMI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmiOutcome {
    /// No context on this pCPU had an overflow: not ours.
    Spurious,
    /// Counters overflowed, but none with its interrupt enabled.
    NoInterrupt(Overflow),
    /// Delivered to `to` (through its LVTPC, or as a sample in its page).
    Delivered {
        /// The receiving vCPU.
        to: VcpuId,
        /// What overflowed.
        overflow: Overflow,
    },
    /// Routed to `to`, whose platform queued the LVTPC delivery (see `LvtpcDelivery::Queued`).
    Queued {
        /// The receiving vCPU.
        to: VcpuId,
        /// What overflowed.
        overflow: Overflow,
    },
    /// Routed to `to` but dropped (sample still cached, LVTPC masked, or no page).
    Dropped {
        /// The vCPU it was routed to.
        to: VcpuId,
        /// What overflowed.
        overflow: Overflow,
    },
}

/// The sample to publish: who it is attributed to, the registers (borrowed from the
/// interrupted state: a PMI through the LVTPC never copies them), and whose memory its call
/// chain is read from.
pub(crate) struct Sample<'r> {
    pub(crate) domain_id: u32,
    pub(crate) vcpu_id: u32,
    pub(crate) regs: &'r Regs,
    pub(crate) context: SampledContext,
}

/// A sample as it goes into the page: its identity and registers, and its details (ABI 1.2),
/// gathered before the page is borrowed (the walk reads through the platform) and written
/// straight into it by `Details::write`. One structure, so that the page access takes one
/// reference to it.
struct Details<'c, 'r> {
    identity: Identity,
    regs: &'r Regs,
    head: SampleHead,
    chain: &'c [u64],
    chain_end: u32,
    /// Call-chain entries the previous sample in the page wrote (`SharedPage::chain_written`).
    stale: u32,
}

impl Details<'_, '_> {
    /// Writes the whole sample into the page `to`: `ctx` into its vendor area, these details
    /// (the call-chain entries a previous sample left past the new chain, `stale`, cleared),
    /// then the identity and registers with the cached flag last. Returns the chain's length.
    /// One function for the whole write, out of line: it is built once per backend (not per
    /// platform and caller, as the page-access closures are) and the writers it calls are
    /// inlined into it, with no call of their own.
    #[inline(never)]
    fn write<B: PmuBackend>(&self, backend: &B, ctx: &B::Context, to: &mut Page) -> u32 {
        backend.context_to_page(ctx, &mut to.vendor);
        let chain = publish_sample_details(to, &self.head, self.chain, self.chain_end, self.stale);
        publish_sample(to, &self.identity, self.regs);
        chain
    }
}

/// The details of `sample`, published under `identity`: the clock, the page's sequence
/// number, what overflowed, and the call chain walked now, in the sampled context's address
/// space, into `chain` (`stale`: what the page's previous sample wrote). Inlined into its two
/// callers: its result then stays in registers instead of going through memory.
#[inline(always)]
fn sample_details<'c, 'r, P: Platform>(
    platform: &mut P,
    sample: &Sample<'r>,
    identity: Identity,
    overflow: Overflow,
    page: &SharedPage,
    chain: &'c mut [u64; XENPMU_CALLCHAIN_MAX],
) -> Details<'c, 'r> {
    let head = SampleHead {
        tsc: platform.timestamp(),
        tsc_khz: platform.tsc_khz(),
        sequence: page.samples,
        overflowed: overflow.counters.0,
    };
    if !platform.reads_sampled_memory(sample.context) {
        return Details {
            identity,
            regs: sample.regs,
            head,
            chain: &[],
            chain_end: XENPMU_CHAIN_NONE,
            stale: page.chain_written,
        };
    }
    let context = sample.context;
    let (len, chain_end) = crate::callchain::walk(sample.regs, chain, |at, out| {
        platform.read_sampled(context, at, out)
    });
    Details {
        identity,
        regs: sample.regs,
        head,
        chain: chain.get(..len as usize).unwrap_or(chain),
        chain_end,
        stale: page.chain_written,
    }
}

impl<B: PmuBackend> Vpmu<B> {
    /// The PMU interrupt of `pcpu`, the caller's own pCPU.
    pub fn handle_pmi<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
    ) -> Result<PmiOutcome, CoreError> {
        if !self.available {
            return Ok(PmiOutcome::Spurious);
        }
        self.catch_up_with_table(platform, pcpu, vcpus)?;
        if self.policy().mode == Mode::All {
            return self.system_pmi(platform, pcpu, vcpus);
        }
        let Some(current) = pcpu.current else {
            return Ok(PmiOutcome::Spurious);
        };
        let here = pcpu.index;
        let mut result = Ok(PmiOutcome::Spurious);
        vcpus.with_vcpu(current, &mut |vcpu| {
            if vcpu.state != (VcpuState::Loaded { pcpu: here }) {
                return;
            }
            let (mut bus, _) = pcpu.counted();
            // With a ring the hypervisor re-arms what overflowed (ring.rs).
            let periods = vcpu.ring.as_ref().map(|ring| &ring.periods);
            let overflow = self
                .backend
                .handle_overflow(&mut vcpu.ctx, &mut bus)
                .and_then(|o| self.rearm_for_ring(periods, &mut vcpu.ctx, &mut bus, o));
            vcpu.stats.hw_msr = vcpu.stats.hw_msr + bus.stats();
            result = match overflow {
                Err(fault) => Err(fault.into()),
                Ok(o) if o.counters.is_empty() => Ok(PmiOutcome::Spurious),
                Ok(o) if !o.interrupt => Ok(PmiOutcome::NoInterrupt(o)),
                Ok(o) => self.route_own(platform, pcpu, vcpu, o, None),
            };
        });
        result
    }

    /// Routes an overflow of `vcpu`'s own counters (with its interrupt enabled) while it runs
    /// on `pcpu`: to its page as a sample, or through its virtual LVTPC. `interrupted` is what
    /// the PMI interrupted, `None` to ask the platform (for the registers only if a sample
    /// needs them).
    pub(crate) fn route_own<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        overflow: Overflow,
        interrupted: Option<&Interrupted>,
    ) -> Result<PmiOutcome, CoreError> {
        vcpu.stats.pmis_generated += 1;
        let at = match interrupted {
            Some(interrupted) => interrupted.interruption(),
            None => platform.interruption(pcpu.index),
        };
        let Some(context) = self.own_sample_context(platform, vcpu.id, at) else {
            let interrupted = match at {
                Interruption::Guest(id)
                | Interruption::Hypervisor {
                    on_behalf_of: Some(id),
                } => Some(id),
                Interruption::Hypervisor { on_behalf_of: None } => None,
            };
            if let Some(interrupted) = interrupted.filter(|&id| id != vcpu.id) {
                platform.diagnostic(Diagnostic::PmiOfAnotherVcpu {
                    loaded: vcpu.id,
                    interrupted,
                });
            }
            vcpu.stats.pmis_dropped += 1;
            return Ok(PmiOutcome::Dropped {
                to: vcpu.id,
                overflow,
            });
        };
        let to = vcpu.id;
        if vcpu.page.is_none() {
            let delivered = match platform.deliver_lvtpc_pmi(to, self.backend.masks_lvtpc_on_pmi())
            {
                LvtpcDelivery::Delivered => true,
                LvtpcDelivery::Masked => false,
                LvtpcDelivery::Queued => {
                    vcpu.stats.pmis_in_flight += 1;
                    return Ok(PmiOutcome::Queued { to, overflow });
                }
            };
            return Ok(self.account(vcpu, delivered, overflow));
        }
        let asked;
        let interrupted = match interrupted {
            Some(interrupted) => interrupted,
            None => {
                asked = platform.interrupted(pcpu.index);
                &asked
            }
        };
        let regs = match (context, interrupted) {
            (SampledContext::Hypervisor, Interrupted::Hypervisor { regs, .. })
            | (
                SampledContext::Guest(_),
                Interrupted::Hypervisor {
                    on_behalf_of: Some((_, regs)),
                    ..
                }
                | Interrupted::Guest { regs, .. },
            ) => regs,
            // A platform whose `interruption` disagrees with `interrupted`: nothing sure to
            // attribute the sample to.
            _ => return Ok(self.account(vcpu, false, overflow)),
        };
        let sample = Sample {
            domain_id: match context {
                SampledContext::Hypervisor => XENPMU_DOMID_HYPERVISOR,
                SampledContext::Guest(_) => XENPMU_DOMID_SELF,
            },
            vcpu_id: vcpu.id.vcpu,
            regs,
            context,
        };
        let delivered = self.publish(platform, pcpu, vcpu, &sample, overflow)?;
        Ok(self.account(vcpu, delivered, overflow))
    }

    /// Whose sample an overflow of `vcpu`'s own counters is, given what its PMI interrupted:
    /// the hypervisor's (hv mode, the privileged profiler's counters), `vcpu`'s own, or
    /// nobody's (the loaded context is not the interrupted vCPU's).
    fn own_sample_context<P: Platform>(
        &self,
        platform: &P,
        vcpu: VcpuId,
        at: Interruption,
    ) -> Option<SampledContext> {
        match at {
            Interruption::Hypervisor { .. }
                if self.policy().mode == Mode::Hypervisor
                    && vcpu.domain == platform.privileged_domain() =>
            {
                Some(SampledContext::Hypervisor)
            }
            Interruption::Hypervisor {
                on_behalf_of: Some(id),
            }
            | Interruption::Guest(id)
                if id == vcpu =>
            {
                Some(SampledContext::Guest(vcpu))
            }
            _ => None,
        }
    }

    /// The platform reports the outcome of an LVTPC delivery it queued: `delivered` if the PMI
    /// reached the guest, `false` if its LVTPC turned out masked. Returns `false` (and changes
    /// nothing) if no delivery was in flight for `vcpu`.
    pub fn lvtpc_delivery_done(&self, vcpu: &mut VcpuPmu<B::Context>, delivered: bool) -> bool {
        if vcpu.stats.pmis_in_flight == 0 {
            return false;
        }
        vcpu.stats.pmis_in_flight -= 1;
        if delivered {
            vcpu.stats.pmis_delivered += 1;
        } else {
            vcpu.stats.pmis_dropped += 1;
        }
        true
    }

    pub(crate) fn account(
        &self,
        vcpu: &mut VcpuPmu<B::Context>,
        delivered: bool,
        overflow: Overflow,
    ) -> PmiOutcome {
        if delivered {
            vcpu.stats.pmis_delivered += 1;
            PmiOutcome::Delivered {
                to: vcpu.id,
                overflow,
            }
        } else {
            vcpu.stats.pmis_dropped += 1;
            PmiOutcome::Dropped {
                to: vcpu.id,
                overflow,
            }
        }
    }

    /// Page path for a vCPU's own context: save it into the page with the sample.
    fn publish<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        sample: &Sample,
        overflow: Overflow,
    ) -> Result<bool, CoreError> {
        if vcpu.ring.is_some() {
            // A record in the ring; the counters keep running (ring.rs).
            return Ok(self.ring_publish(platform, pcpu, vcpu, sample, overflow));
        }
        let Some(page) = vcpu.page.as_mut() else {
            return Ok(false);
        };
        // Every sample for the page takes a number, published or not: gaps show drops.
        page.samples += 1;
        let page = *page;
        if vcpu.page_lvtpc_masked || matches!(vcpu.state, VcpuState::Cached { .. }) {
            return Ok(false);
        }
        self.save_vcpu(pcpu, vcpu)?;
        // The sample reports this overflow: it is no longer pending.
        vcpu.pending_pmi = None;
        let identity = self.identity(platform, vcpu.id, pcpu.index, sample);
        let details = sample_details(platform, sample, identity, overflow, &page, &mut pcpu.chain);
        let backend = &self.backend;
        let ctx = &vcpu.ctx;
        let written = platform.with_page(page.slot, |to| details.write(backend, ctx, to));
        let Some(chain_written) = written else {
            return Ok(false);
        };
        if let Some(page) = vcpu.page.as_mut() {
            page.chain_written = chain_written;
        }
        // Outside a window no image of `ctx` is older than the epoch it was validated under.
        vcpu.published_images = ImagesUnder::Epoch(vcpu.validated);
        vcpu.state = VcpuState::Cached {
            from: SampleSource::Own { pcpu: pcpu.index },
        };
        self.mask_physical_lvtpc(platform, pcpu, vcpu.id);
        platform.raise_pmu_virq(vcpu.id);
        Ok(true)
    }

    pub(crate) fn identity<P: Platform>(
        &self,
        platform: &P,
        receiver: VcpuId,
        pcpu: u32,
        sample: &Sample,
    ) -> Identity {
        let privileged = receiver.domain == platform.privileged_domain();
        Identity {
            domain_id: sample.domain_id,
            vcpu_id: sample.vcpu_id,
            // The physical topology is only the privileged domain's to see.
            pcpu_id: if privileged { pcpu } else { sample.vcpu_id },
            _pad0: 0,
        }
    }

    /// All mode: the pCPU's system-wide context overflowed; the sample goes to its profiler
    /// (which may run on another pCPU: only its page and state are touched, never that
    /// pCPU's hardware).
    fn system_pmi<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpus: &T,
    ) -> Result<PmiOutcome, CoreError> {
        let SystemContext::Loaded { profiler } = pcpu.system else {
            return Ok(PmiOutcome::Spurious);
        };
        let mut result = Ok(PmiOutcome::Spurious);
        vcpus.with_vcpu(profiler, &mut |p| {
            result = self.system_sample(platform, pcpu, p);
        });
        result
    }

    /// Why a system-wide PMI would not be published into `profiler`'s page, as far as the
    /// profiler's state tells (the sampled domain is checked once the interrupted state is
    /// read). Judged before the hardware is touched: only a sample that will be published
    /// stops the counters (its save then reads the overflow status once, after the stop);
    /// any other PMI leaves them running and only collects the overflow.
    fn system_drop(&self, profiler: &VcpuPmu<B::Context>) -> Option<Dropped> {
        // This pCPU took the interrupt under all mode, but the profiler may have been brought
        // in line with a newer mode meanwhile (this pCPU's catch-up is still on its way): its
        // own context may then be loaded on the pCPU it runs on, and a sample would mark it
        // cached, leaving that context on the hardware with nobody to save it. Leaving all
        // mode discards the system-wide samples; under the profiler's lock the policy read
        // here orders this against its settle.
        if self.policy().mode != Mode::All
            || matches!(profiler.state, VcpuState::Loaded { .. })
            || profiler.page.is_none()
        {
            Some(Dropped::Unnumbered)
        } else if profiler.page_lvtpc_masked {
            Some(Dropped::Numbered)
        } else if matches!(profiler.state, VcpuState::Cached { .. }) || profiler.handover.is_some()
        {
            // Never overwrite an unconsumed sample (nor one whose flush is still on its way).
            Some(Dropped::Recorded)
        } else {
            None
        }
    }

    /// A system-wide PMI of `pcpu`, under `profiler`'s lock.
    fn system_sample<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        profiler: &mut VcpuPmu<B::Context>,
    ) -> Result<PmiOutcome, CoreError> {
        // With a ring, everything `system_drop` judges but a cached sample (a ring has none)
        // and the page's mask (the ring withholds) still holds: the sample is the ring's.
        let ring_mode = profiler.ring.is_some()
            && self.policy().mode == Mode::All
            && !matches!(profiler.state, VcpuState::Loaded { .. })
            && profiler.page.is_some();
        if ring_mode {
            // A record in the profiler's ring; the counters keep running (ring.rs).
            return self.ring_system_sample(platform, pcpu, profiler);
        }
        if let Some(dropped) = self.system_drop(profiler) {
            return self.system_unpublished(platform, pcpu, profiler, dropped);
        }
        // Written into this pCPU's buffer, where the sample borrows the registers from: they
        // are copied once more, into the page, and nowhere else.
        platform.interrupted_into(pcpu.index, &mut pcpu.interrupted);
        let interrupted = &pcpu.interrupted;
        let Some(sample) = Self::system_sample_of(profiler.id, interrupted) else {
            return self.system_unpublished(platform, pcpu, profiler, Dropped::Recorded);
        };
        let SystemContext::Loaded { profiler: owner } = pcpu.system else {
            return Ok(PmiOutcome::Spurious);
        };
        // Absent until it is known where the context stays (a failed save leaves it so).
        pcpu.system = SystemContext::Absent;
        // The save stops the counters first, then folds the overflow status into the
        // context's virtual status and acknowledges it (the one status read of this PMI: no
        // counter can overflow after the stop), then reads the counters.
        let ctx = &mut pcpu.system_ctx;
        let overflow = Self::save_on(&self.backend, ctx, &mut pcpu.hw, &mut pcpu.record)?;
        let Some(overflow) = Self::due(overflow) else {
            // Nothing with its interrupt enabled overflowed: no sample. The counters restart
            // from the values just read (on a PMU with a global control, one write).
            Self::load_on(&self.backend, ctx, &mut pcpu.hw, &mut pcpu.record)?;
            pcpu.system = SystemContext::Loaded { profiler: owner };
            return Ok(Self::not_due(overflow));
        };
        profiler.stats.pmis_generated += 1;
        let Some(page) = profiler.page.as_mut() else {
            // Checked by the verdict, under the same lock.
            return Ok(self.account(profiler, false, overflow));
        };
        // Every sample for the page takes a number, published or not: gaps show drops.
        page.samples += 1;
        let page = *page;
        let here = pcpu.index;
        let identity = self.identity(platform, profiler.id, here, &sample);
        let details = sample_details(
            platform,
            &sample,
            identity,
            overflow,
            &page,
            &mut pcpu.chain,
        );
        let ctx = &pcpu.system_ctx;
        let backend = &self.backend;
        let written = platform.with_page(page.slot, |to| details.write(backend, ctx, to));
        let Some(chain_written) = written else {
            // The page vanished under us: restart the counters and count the loss.
            Self::load_on(&self.backend, ctx, &mut pcpu.hw, &mut pcpu.record)?;
            pcpu.system = SystemContext::Loaded { profiler: owner };
            return Ok(self.account(profiler, false, overflow));
        };
        if let Some(page) = profiler.page.as_mut() {
            page.chain_written = chain_written;
        }
        match &mut profiler.sampled {
            Some(sampled) => sampled.clone_from(ctx),
            None => profiler.sampled = Some(ctx.clone()),
        }
        profiler.published_images = pcpu.system_images;
        pcpu.system = SystemContext::Cached { profiler: owner };
        profiler.state = VcpuState::Cached {
            from: SampleSource::System { pcpu: here },
        };
        self.mask_physical_lvtpc(platform, pcpu, profiler.id);
        platform.raise_pmu_virq(profiler.id);
        Ok(self.account(profiler, true, overflow))
    }

    /// The sample an all-mode PMI that interrupted `interrupted` gives `profiler`; `None` if
    /// the sampled domain cannot be named: an integrator's domain id in the reserved range
    /// would read as DOMID_SELF, DOMID_HYPERVISOR or a future special id, and a sample that
    /// cannot be attributed honestly is dropped, never published under a false identity.
    pub(crate) fn system_sample_of(
        profiler: VcpuId,
        interrupted: &Interrupted,
    ) -> Option<Sample<'_>> {
        Some(match interrupted {
            Interrupted::Guest { vcpu, .. } if vcpu.domain >= XENPMU_DOMID_FIRST_RESERVED => {
                return None;
            }
            Interrupted::Guest { vcpu, regs } => Sample {
                domain_id: if *vcpu == profiler {
                    XENPMU_DOMID_SELF
                } else {
                    vcpu.domain
                },
                vcpu_id: vcpu.vcpu,
                regs,
                context: SampledContext::Guest(*vcpu),
            },
            Interrupted::Hypervisor { regs, on_behalf_of } => Sample {
                domain_id: XENPMU_DOMID_HYPERVISOR,
                vcpu_id: on_behalf_of.map_or(0, |(id, _)| id.vcpu),
                regs,
                context: SampledContext::Hypervisor,
            },
        })
    }

    /// A system-wide PMI that is not published: the counters keep running; the overflow is
    /// recorded in the context's virtual status and acknowledged, and a due one is dropped.
    fn system_unpublished<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        profiler: &mut VcpuPmu<B::Context>,
        dropped: Dropped,
    ) -> Result<PmiOutcome, CoreError> {
        let overflow = self
            .backend
            .handle_overflow(&mut pcpu.system_ctx, &mut pcpu.hw)?;
        Ok(match Self::due(overflow) {
            Some(overflow) => self.drop_system(platform, profiler, dropped, overflow),
            None => Self::not_due(overflow),
        })
    }

    /// `overflow` if a PMI is due for it (something overflowed with its interrupt enabled).
    pub(crate) fn due(overflow: Overflow) -> Option<Overflow> {
        (!overflow.counters.is_empty() && overflow.interrupt).then_some(overflow)
    }

    /// The outcome of a PMI for which none is due.
    pub(crate) fn not_due(overflow: Overflow) -> PmiOutcome {
        if overflow.counters.is_empty() {
            PmiOutcome::Spurious
        } else {
            PmiOutcome::NoInterrupt(overflow)
        }
    }

    /// A due system-wide PMI that `profiler` does not get: counted, and numbered in its page
    /// (and recorded there as dropped) as `dropped` says.
    fn drop_system<P: Platform>(
        &self,
        platform: &mut P,
        profiler: &mut VcpuPmu<B::Context>,
        dropped: Dropped,
        overflow: Overflow,
    ) -> PmiOutcome {
        profiler.stats.pmis_generated += 1;
        if dropped != Dropped::Unnumbered {
            if let Some(page) = profiler.page.as_mut() {
                page.samples += 1;
                if dropped == Dropped::Recorded {
                    platform.with_page(page.slot, record_dropped_sample);
                    platform.diagnostic(Diagnostic::SampleDropped { vcpu: profiler.id });
                }
            }
        }
        self.account(profiler, false, overflow)
    }
}

/// What a dropped system-wide sample leaves in the profiler's page.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dropped {
    /// Nothing (the mode changed, the profiler's own context is loaded, or it has no page).
    Unnumbered,
    /// A sequence number (the page's LVTPC is masked).
    Numbered,
    /// A sequence number and a dropped sample (a sample is still cached, or its sampled
    /// domain cannot be named).
    Recorded,
}
