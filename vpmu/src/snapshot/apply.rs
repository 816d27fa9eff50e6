//! Taking a snapshot of a quiesced vCPU and restoring one into a fresh vCPU: copy, verify
//! everything, then apply (docs/snapshot.md, "Restoring").

use vpmu_abi::{RingConfig, XENPMU_CALLCHAIN_MAX, XENPMU_RING_INFO_OFFSET, XENPMU_RING_PAGE_SIZE};
use zerocopy::FromZeros;

use super::{
    PageRegistration, Registers, RestoreError, RingLostRecord, RingRegistration, SnapshotBackend,
    SnapshotState, TakeError, VcpuSnapshot,
};
use crate::backend::{GuestPolicy, PmuCapabilities};
use crate::core::{VcpuTable, Vpmu};
use crate::platform::{PageSlot, Platform, RingSlot, VcpuId};
use crate::ring::{PendingLost, Ring, latency_ticks};
use crate::state::{FastIntercepts, ImagesUnder, SampleSource, SharedPage, VcpuPmu, VcpuState};

/// The pCPU a restored cached sample names as the one its overflow happened on: none (the
/// source's pCPUs mean nothing here; the index only ever selects a pCPU whose physical LVTPC
/// the sample masked, and a restored sample masked none).
pub const RESTORED_SAMPLE_PCPU: u32 = u32::MAX;

/// Offset of `RingInfo::tsc_khz` in the control page.
const RING_TSC_KHZ_AT: u32 = XENPMU_RING_INFO_OFFSET as u32 + 24;
const _: () = assert!(core::mem::offset_of!(vpmu_abi::RingInfo, tsc_khz) == 24);

/// The first field of `snapshot` that differs from `here`.
fn shape_difference(
    snapshot: &PmuCapabilities,
    here: &PmuCapabilities,
) -> Option<(&'static str, u32, u32)> {
    let fields = [
        (
            "version",
            u32::from(snapshot.version),
            u32::from(here.version),
        ),
        (
            "gp_counters",
            u32::from(snapshot.gp_counters),
            u32::from(here.gp_counters),
        ),
        (
            "gp_width",
            u32::from(snapshot.gp_width),
            u32::from(here.gp_width),
        ),
        (
            "fixed_counters",
            snapshot.fixed_counters,
            here.fixed_counters,
        ),
        (
            "fixed_width",
            u32::from(snapshot.fixed_width),
            u32::from(here.fixed_width),
        ),
        (
            "global_ctrl",
            u32::from(snapshot.global_ctrl),
            u32::from(here.global_ctrl),
        ),
        (
            "full_width_writes",
            u32::from(snapshot.full_width_writes),
            u32::from(here.full_width_writes),
        ),
    ];
    fields.into_iter().find(|&(_, a, b)| a != b)
}

/// The verified registrations a restore maps and installs.
struct Verified<C> {
    ctx: C,
    ring: Option<(Ring, u32)>,
}

impl<B: SnapshotBackend> Vpmu<B> {
    /// A snapshot of `vcpu`, which must be quiesced: switched out (not running on any pCPU,
    /// its context not loaded anywhere), in a mode that keeps contexts with their vCPUs (self
    /// or hv), holding no all-mode state and no PMI whose delivery the platform has not
    /// reported. Reads `vcpu` only.
    pub fn take_snapshot(&self, vcpu: &VcpuPmu<B::Context>) -> Result<VcpuSnapshot, TakeError> {
        let policy = self.policy();
        if !policy.mode.switches_contexts() {
            return Err(TakeError::Mode(policy.mode));
        }
        if vcpu.running_on.is_some() {
            return Err(TakeError::NotQuiesced);
        }
        let state = match vcpu.state {
            VcpuState::Allocated => SnapshotState::Unused,
            VcpuState::Saved => SnapshotState::Saved,
            VcpuState::Cached {
                from: SampleSource::Own { .. },
            } => SnapshotState::SampleCached,
            VcpuState::Loaded { .. } => return Err(TakeError::NotQuiesced),
            VcpuState::Cached {
                from: SampleSource::System { .. },
            } => return Err(TakeError::SystemWide),
        };
        if vcpu.program.is_some() || vcpu.handover.is_some() || vcpu.sampled.is_some() {
            return Err(TakeError::SystemWide);
        }
        if vcpu.stats.pmis_in_flight != 0 {
            return Err(TakeError::PmiInFlight);
        }
        let mut registers = Registers::new();
        self.backend.context_registers(&vcpu.ctx, &mut registers);
        if registers.overflowed() {
            return Err(TakeError::TooManyRegisters);
        }
        Ok(VcpuSnapshot {
            shape: *self.backend.capabilities(),
            mode: policy.mode,
            features: policy.features,
            state,
            registers,
            pending_pmi: vcpu.pending_pmi.map(|overflow| overflow.counters),
            page_lvtpc_masked: vcpu.page_lvtpc_masked,
            page: vcpu.page.map(|page| PageRegistration {
                gfn: page.gfn,
                samples: page.samples,
                chain_written: page.chain_written,
            }),
            ring: vcpu.ring.as_ref().map(|ring| RingRegistration {
                gfn: ring.gfn,
                data_pages: ring.frames.saturating_sub(1) as u32,
                wakeup_bytes: ring.wakeup_bytes,
                max_latency_us: ring.max_latency_us,
                period_gp: ring.periods.gp,
                period_fixed: ring.periods.fixed,
                head: ring.head,
                counters: ring.counters,
                pending_lost: ring.pending_lost.map(|lost| RingLostRecord {
                    count: lost.count,
                    sequence: lost.sequence,
                    tsc: lost.tsc,
                }),
                unsignalled_bytes: ring.unsignalled_bytes,
                unsignalled_since: ring.unsignalled_since,
                loss_signalled: ring.loss_signalled,
            }),
        })
    }

    /// Restores `snapshot` into vCPU `target` of `vcpus`, which must be fresh (made by
    /// `Vpmu::new_vcpu`, never run, no page, no ring): the snapshot is verified whole — its
    /// shape against this backend's, the policy, every register through the backend's WRMSR
    /// validators under the policy in force, the core's state for consistency, the ring's
    /// configuration as `XENPMU_OP_RING_INIT` checks it — then the page and the ring are
    /// mapped at their guest frames (refused if another vCPU of the domain uses one) and
    /// everything is installed. A refusal changes nothing. The vCPU's context is then saved;
    /// the next switch onto a pCPU loads it there. The clock rate the page and the ring's
    /// control page show is this host's (`Platform::tsc_khz`), written at the restore.
    pub fn restore_snapshot<P: Platform, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        vcpus: &T,
        target: VcpuId,
        snapshot: &VcpuSnapshot,
    ) -> Result<(), RestoreError> {
        let verified = self.verify_snapshot(platform, target, snapshot)?;
        let page_slot = match snapshot.page {
            Some(page) => Some(
                platform
                    .map_page(target.domain, page.gfn)
                    .map_err(RestoreError::Map)?,
            ),
            None => None,
        };
        let ring_slot = match (&verified.ring, snapshot.ring) {
            (Some((ring, _)), Some(registration)) => {
                match platform.map_ring(target.domain, registration.gfn, ring.frames as u32) {
                    Ok(slot) => Some(slot),
                    Err(error) => {
                        if let Some(slot) = page_slot {
                            platform.unmap_page(slot);
                        }
                        return Err(RestoreError::Map(error));
                    }
                }
            }
            _ => None,
        };
        let result = self.install(
            platform, vcpus, target, snapshot, verified, page_slot, ring_slot,
        );
        if result.is_err() {
            if let Some(slot) = page_slot {
                platform.unmap_page(slot);
            }
            if let Some(slot) = ring_slot {
                platform.unmap_ring(slot);
            }
        }
        result
    }

    /// Everything of `snapshot` that can be checked without the vCPU table: the context it
    /// restores, and the ring it registers.
    fn verify_snapshot<P: Platform>(
        &self,
        platform: &P,
        target: VcpuId,
        snapshot: &VcpuSnapshot,
    ) -> Result<Verified<B::Context>, RestoreError> {
        let here = self.backend.capabilities();
        if snapshot.shape.vendor != here.vendor {
            return Err(RestoreError::Vendor);
        }
        if let Some((field, snapshot, here)) = shape_difference(&snapshot.shape, here) {
            return Err(RestoreError::Shape {
                field,
                snapshot,
                here,
            });
        }
        let policy = self.policy();
        let privileged = platform.privileged_domain();
        if !policy.mode.switches_contexts() || !self.has_vpmu(policy, privileged, target) {
            return Err(RestoreError::Mode(policy.mode));
        }
        if snapshot.features != policy.features {
            return Err(RestoreError::Features {
                snapshot: snapshot.features,
                here: policy.features,
            });
        }
        let mut expected = Registers::new();
        let reset = self.backend.new_context();
        self.backend.context_registers(&reset, &mut expected);
        let (listed, given) = (expected.as_slice(), snapshot.registers.as_slice());
        for index in 0..listed.len().max(given.len()) {
            let (want, got) = (listed.get(index), given.get(index));
            let key = |r: Option<&super::SnapshotRegister>| r.map(|r| (r.kind, r.number));
            if key(want) != key(got) {
                return Err(RestoreError::RegisterSet {
                    index,
                    expected: key(want),
                    found: key(got),
                });
            }
        }
        let guest: GuestPolicy<'_> = self.guest_policy(policy, platform, target.domain);
        let mut ctx = self.backend.new_context();
        self.backend
            .context_from_registers(&snapshot.registers, &guest, &mut ctx)
            .map_err(RestoreError::Register)?;

        let inconsistent = |what| Err(RestoreError::Inconsistent(what));
        match snapshot.state {
            SnapshotState::Unused if ctx != reset => {
                return inconsistent("an unused vPMU with registers other than the reset ones");
            }
            SnapshotState::Unused if snapshot.pending_pmi.is_some() => {
                return inconsistent("an unused vPMU with a pending PMI");
            }
            SnapshotState::SampleCached if snapshot.page.is_none() => {
                return inconsistent("a cached sample without a page");
            }
            SnapshotState::SampleCached if snapshot.ring.is_some() => {
                return inconsistent("a cached sample with a ring");
            }
            _ => {}
        }
        if let Some(counters) = snapshot.pending_pmi {
            if counters.is_empty() || !here.all_counters().contains(counters) {
                return inconsistent("a pending PMI of no counter or of an absent one");
            }
        }
        if let Some(page) = snapshot.page {
            if page.chain_written as usize > XENPMU_CALLCHAIN_MAX {
                return inconsistent("a call chain longer than XENPMU_CALLCHAIN_MAX");
            }
        }
        let ring = match snapshot.ring {
            Some(_) if snapshot.page.is_none() => {
                return inconsistent("a ring without a page");
            }
            Some(ring) => Some(self.verify_ring(platform, &ring)?),
            None => None,
        };
        Ok(Verified { ctx, ring })
    }

    /// The ring of `registration`: its configuration through the checks of
    /// `XENPMU_OP_RING_INIT`, the producer's state for consistency. The slot is a placeholder
    /// until the area is mapped. Also returns the frames it spans.
    fn verify_ring<P: Platform>(
        &self,
        platform: &P,
        registration: &RingRegistration,
    ) -> Result<(Ring, u32), RestoreError> {
        let mut config = RingConfig::new_zeroed();
        config.data_pages = registration.data_pages;
        config.wakeup_bytes = registration.wakeup_bytes;
        config.max_latency_us = registration.max_latency_us;
        config.period_gp = registration.period_gp;
        config.period_fixed = registration.period_fixed;
        let verified = self
            .verify_ring_config(&config)
            .map_err(|_| RestoreError::RingConfig)?;
        let frames = u64::from(verified.data_pages) + 1;
        // A watermark of 0 asks for half the area at registration: what is in force is never 0.
        let address = registration
            .gfn
            .checked_add(frames)
            .and_then(|end| end.checked_mul(XENPMU_RING_PAGE_SIZE as u64));
        if registration.wakeup_bytes == 0 || address.is_none() {
            return Err(RestoreError::RingConfig);
        }
        let inconsistent = |what| Err(RestoreError::Inconsistent(what));
        if registration.head % 8 != 0 {
            return inconsistent("a ring head that is not 8-byte aligned");
        }
        // Every record is published with a wakeup once the bytes reach the watermark, and the
        // bytes and the time of the oldest are set and cleared together.
        if registration.unsignalled_bytes >= u64::from(verified.wakeup_bytes)
            || (registration.unsignalled_bytes == 0) != registration.unsignalled_since.is_none()
        {
            return inconsistent("unsignalled ring bytes past the watermark or without a time");
        }
        if registration
            .pending_lost
            .is_some_and(|lost| lost.count == 0)
        {
            return inconsistent("a pending lost record of no sample");
        }
        let ring = Ring {
            slot: RingSlot(0),
            gfn: registration.gfn,
            frames,
            data_size: verified.data_size,
            wakeup_bytes: verified.wakeup_bytes,
            latency_ticks: latency_ticks(verified.max_latency_us, platform.tsc_khz()),
            max_latency_us: verified.max_latency_us,
            periods: verified.periods,
            head: registration.head,
            counters: registration.counters,
            pending_lost: registration.pending_lost.map(|lost| PendingLost {
                count: lost.count,
                sequence: lost.sequence,
                tsc: lost.tsc,
            }),
            unsignalled_bytes: registration.unsignalled_bytes,
            unsignalled_since: registration.unsignalled_since,
            loss_signalled: registration.loss_signalled,
        };
        Ok((ring, frames as u32))
    }

    /// The table part: the frames checked against the domain's other vCPUs and the target
    /// checked fresh under the control lock (as INIT and RING_INIT do), then installed.
    #[allow(clippy::too_many_arguments)]
    fn install<P: Platform, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        vcpus: &T,
        target: VcpuId,
        snapshot: &VcpuSnapshot,
        verified: Verified<B::Context>,
        page_slot: Option<PageSlot>,
        ring_slot: Option<RingSlot>,
    ) -> Result<(), RestoreError> {
        let privileged = platform.privileged_domain();
        let _control = self.control.lock();
        let mut in_use = false;
        let page_gfn = snapshot.page.map(|page| page.gfn);
        let ring_frames = verified
            .ring
            .as_ref()
            .map(|(ring, _)| (ring.gfn, ring.frames));
        vcpus.for_each_in_domain(target.domain, &mut |v| {
            if v.id == target {
                return;
            }
            let page_of_v = v.page.map(|p| p.gfn);
            if let Some(gfn) = page_gfn {
                in_use |= page_of_v == Some(gfn);
                in_use |= v.ring.as_ref().is_some_and(|r| r.overlaps(gfn, 1));
            }
            if let Some((first, count)) = ring_frames {
                in_use |= page_of_v.is_some_and(|g| g >= first && g - first < count);
                in_use |= v.ring.as_ref().is_some_and(|r| r.overlaps(first, count));
            }
        });
        if in_use {
            return Err(RestoreError::FrameInUse);
        }
        if let (Some(gfn), Some((first, count))) = (page_gfn, ring_frames) {
            if gfn >= first && gfn - first < count {
                return Err(RestoreError::FrameInUse);
            }
        }
        let policy = self.policy();
        let claimed = target.domain != privileged;
        if claimed {
            self.claim_use();
        }
        let mut result = Err(RestoreError::NoSuchVcpu);
        let mut verified = Some(verified);
        let found = vcpus.with_vcpu(target, &mut |v| {
            let fresh = v.state == VcpuState::Allocated
                && v.page.is_none()
                && v.ring.is_none()
                && v.running_on.is_none()
                && v.program.is_none();
            let was_in_use = v.in_use();
            result = match (fresh, verified.take()) {
                (true, Some(verified)) => {
                    Self::apply(v, snapshot, verified, page_slot, ring_slot, policy.epoch);
                    Ok(())
                }
                _ => Err(RestoreError::TargetNotFresh),
            };
            self.settle_use(privileged, v, was_in_use, claimed);
        });
        if !found && claimed {
            self.release_use();
        }
        result?;
        let tsc_khz = platform.tsc_khz();
        if let Some(slot) = page_slot {
            platform.with_page(slot, |page| vpmu_abi::writer::set_tsc_khz(page, tsc_khz));
        }
        if let Some(slot) = ring_slot {
            platform.ring_write(slot, RING_TSC_KHZ_AT, &tsc_khz.to_le_bytes());
        }
        Ok(())
    }

    /// Installs a verified snapshot into a fresh vCPU. Nothing fails from here on.
    fn apply(
        vcpu: &mut VcpuPmu<B::Context>,
        snapshot: &VcpuSnapshot,
        verified: Verified<B::Context>,
        page_slot: Option<PageSlot>,
        ring_slot: Option<RingSlot>,
        epoch: u64,
    ) {
        vcpu.ctx = verified.ctx;
        vcpu.state = match snapshot.state {
            SnapshotState::Unused => VcpuState::Allocated,
            SnapshotState::Saved => VcpuState::Saved,
            SnapshotState::SampleCached => VcpuState::Cached {
                from: SampleSource::Own {
                    pcpu: RESTORED_SAMPLE_PCPU,
                },
            },
        };
        vcpu.validated = epoch;
        vcpu.fast = FastIntercepts::NONE;
        vcpu.published_images = ImagesUnder::Unvouched;
        vcpu.pending_pmi = snapshot
            .pending_pmi
            .map(|counters| crate::backend::Overflow {
                counters,
                interrupt: true,
            });
        vcpu.page_lvtpc_masked = snapshot.page_lvtpc_masked;
        vcpu.page = match (snapshot.page, page_slot) {
            (Some(page), Some(slot)) => Some(SharedPage {
                slot,
                gfn: page.gfn,
                samples: page.samples,
                chain_written: page.chain_written,
            }),
            _ => None,
        };
        vcpu.ring = match (verified.ring, ring_slot) {
            (Some((ring, _)), Some(slot)) => Some(Ring { slot, ..ring }),
            _ => None,
        };
    }
}
