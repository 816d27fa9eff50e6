//! `XENPMU_OP_RING_INIT` and `XENPMU_OP_RING_FINISH` (ABI 1.4), exactly as docs/abi.md ("The
//! operations" of the sample ring) specifies them: arguments (the vCPU, the configuration read
//! once into a private copy and verified whole, the frames) before state (no page, a ring
//! already, an area in use, a sample cached); a call that fails changes nothing.

use vpmu_abi::ops::{OpError, Params};
use vpmu_abi::{
    RingConfig, RingInfo, XENPMU_RECORD_MAX, XENPMU_RING_CONTROL_SIZE, XENPMU_RING_INFO_OFFSET,
    XENPMU_RING_MAGIC, XENPMU_RING_MAX_DATA_PAGES, XENPMU_RING_PAGE_SIZE,
    XENPMU_RING_PRODUCER_OFFSET, XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR,
};
use zerocopy::{FromZeros, IntoBytes};

use crate::backend::{CounterIndex, PmuBackend, RearmPeriods};
use crate::core::{VcpuTable, Vpmu};
use crate::platform::{MapError, Platform, RingSlot, VcpuId};
use crate::ring::{ProducerCounters, Ring, latency_ticks};
use crate::state::{VcpuPmu, VcpuState};

/// A configuration that passed every check: what the ring is made of.
pub(crate) struct Verified {
    pub(crate) data_pages: u32,
    pub(crate) data_size: u32,
    pub(crate) wakeup_bytes: u32,
    pub(crate) max_latency_us: u32,
    pub(crate) periods: RearmPeriods,
}

impl Ring {
    /// Whether the frames `first..first + count` overlap this ring's area.
    pub(crate) fn overlaps(&self, first: u64, count: u64) -> bool {
        first < self.gfn.saturating_add(self.frames) && self.gfn < first.saturating_add(count)
    }
}

/// Whether `vcpu`'s page or ring lies in the frames `first..first + count` (`ring`: its ring
/// counts too).
fn uses_frames<C>(vcpu: &VcpuPmu<C>, first: u64, count: u64, ring: bool) -> bool {
    let page = vcpu
        .page
        .is_some_and(|p| p.gfn >= first && p.gfn - first < count);
    page || (ring && vcpu.ring.as_ref().is_some_and(|r| r.overlaps(first, count)))
}

impl<B: PmuBackend> Vpmu<B> {
    /// Checks a copied configuration completely: sizes, reserved words, and each period by
    /// the backend's WRMSR rule (`PmuBackend::rearm_period_max`).
    pub(crate) fn verify_ring_config(&self, config: &RingConfig) -> Result<Verified, OpError> {
        let pages = config.data_pages;
        if !pages.is_power_of_two() || pages > XENPMU_RING_MAX_DATA_PAGES {
            return Err(OpError::InvalidArgument);
        }
        let data_size = pages * XENPMU_RING_PAGE_SIZE as u32;
        if config.wakeup_bytes > data_size
            || config.flags != 0
            || config._reserved0.iter().any(|&word| word != 0)
            || config._reserved1.iter().any(|&word| word != 0)
        {
            return Err(OpError::InvalidArgument);
        }
        let period_ok = |counter: CounterIndex, period: u64| {
            period == 0
                || self
                    .backend
                    .rearm_period_max(counter)
                    .is_some_and(|max| period <= max)
        };
        let gp_ok = (0u32..)
            .zip(config.period_gp)
            .all(|(index, period)| period_ok(CounterIndex::General(index), period));
        let fixed_ok = (0u32..)
            .zip(config.period_fixed)
            .all(|(index, period)| period_ok(CounterIndex::Fixed(index), period));
        if !gp_ok || !fixed_ok {
            return Err(OpError::InvalidArgument);
        }
        Ok(Verified {
            data_pages: pages,
            data_size,
            wakeup_bytes: if config.wakeup_bytes == 0 {
                data_size / 2
            } else {
                config.wakeup_bytes
            },
            max_latency_us: config.max_latency_us,
            periods: RearmPeriods {
                gp: config.period_gp,
                fixed: config.period_fixed,
            },
        })
    }

    /// `XENPMU_OP_RING_INIT` for `caller`'s sibling (or itself) `params.vcpu`.
    pub(crate) fn ring_init<P: Platform, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        vcpus: &T,
        caller: VcpuId,
        params: &Params,
    ) -> Result<(), OpError> {
        let privileged = platform.privileged_domain();
        let target = self.target(platform, caller, params.vcpu)?;
        let gfn = params.val;
        let address = gfn
            .checked_mul(XENPMU_RING_PAGE_SIZE as u64)
            .ok_or(OpError::InvalidArgument)?;
        // The one read of the configuration, into a private copy that alone is verified.
        let mut config = RingConfig::new_zeroed();
        if !platform.read_guest(caller.domain, address, config.as_mut_bytes()) {
            return Err(OpError::InvalidArgument);
        }
        let verified = self.verify_ring_config(&config)?;
        let frames = u64::from(verified.data_pages) + 1;
        if gfn.checked_add(frames).is_none() {
            return Err(OpError::InvalidArgument);
        }
        // The frames are an argument: only mapping can tell, so map first (as INIT does) and
        // undo it if a state check fails; running out of room is reported after them.
        let mapped = platform.map_ring(caller.domain, gfn, frames as u32);
        if mapped == Err(MapError::InvalidFrame) {
            return Err(OpError::InvalidArgument);
        }
        // Serializes registrations, so the overlap check and the registration are one step.
        let _control = self.control.lock();
        let mut in_use = false;
        vcpus.for_each_in_domain(caller.domain, &mut |v| {
            in_use |= uses_frames(v, gfn, frames, v.id != target);
        });
        let policy = self.policy();
        let mut result = Err(OpError::InvalidArgument);
        vcpus.with_vcpu(target, &mut |v| {
            result = if !self.has_vpmu(policy, privileged, v.id) || v.page.is_none() {
                Err(OpError::NoVpmu)
            } else if v.ring.is_some() {
                Err(OpError::AlreadyRegistered)
            } else if in_use {
                Err(OpError::FrameInUse)
            } else if matches!(v.state, VcpuState::Cached { .. }) {
                Err(OpError::Busy)
            } else {
                match mapped {
                    Ok(slot) => self.register_ring(platform, v, slot, gfn, frames, &verified),
                    Err(_) => Err(OpError::MapFailed),
                }
            };
        });
        if result.is_err() {
            if let Ok(slot) = mapped {
                platform.unmap_ring(slot);
            }
        }
        result
    }

    /// Writes the ring's `info`, zeroes the rest of the control page (producer, consumer,
    /// reserved) and registers the ring with `vcpu`.
    fn register_ring<P: Platform>(
        &self,
        platform: &mut P,
        vcpu: &mut VcpuPmu<B::Context>,
        slot: RingSlot,
        gfn: u64,
        frames: u64,
        verified: &Verified,
    ) -> Result<(), OpError> {
        let tsc_khz = platform.tsc_khz();
        let info = RingInfo {
            magic: XENPMU_RING_MAGIC,
            version_major: XENPMU_VERSION_MAJOR,
            version_minor: XENPMU_VERSION_MINOR,
            data_offset: XENPMU_RING_CONTROL_SIZE as u32,
            data_size: verified.data_size,
            record_max: XENPMU_RECORD_MAX as u32,
            wakeup_bytes: verified.wakeup_bytes,
            tsc_khz,
            _reserved0: [0; 4],
        };
        // The producer's line, the consumer's and the reserved rest: 59 cache lines, written
        // in eight pieces.
        const CLEARED: usize = XENPMU_RING_CONTROL_SIZE - XENPMU_RING_PRODUCER_OFFSET;
        const PIECE: usize = CLEARED / 8;
        let zeros = [0u8; PIECE];
        let written = platform.ring_write(slot, XENPMU_RING_INFO_OFFSET as u32, info.as_bytes())
            && (0..8).all(|piece| {
                let offset = XENPMU_RING_PRODUCER_OFFSET + piece * PIECE;
                platform.ring_write(slot, offset as u32, &zeros)
            });
        if !written {
            return Err(OpError::MapFailed);
        }
        vcpu.ring = Some(Ring {
            slot,
            gfn,
            frames,
            data_size: verified.data_size,
            wakeup_bytes: verified.wakeup_bytes,
            latency_ticks: latency_ticks(verified.max_latency_us, tsc_khz),
            max_latency_us: verified.max_latency_us,
            periods: verified.periods,
            head: 0,
            counters: ProducerCounters::default(),
            pending_lost: None,
            unsignalled_bytes: 0,
            unsignalled_since: None,
            loss_signalled: false,
        });
        Ok(())
    }

    /// `XENPMU_OP_RING_FINISH` of `caller`'s sibling (or itself) `params.vcpu`: under the
    /// target's lock, so a sample being produced into the ring on another pCPU completes (or
    /// is counted) before the ring goes.
    pub(crate) fn ring_finish<P: Platform, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        vcpus: &T,
        caller: VcpuId,
        params: &Params,
    ) -> Result<(), OpError> {
        let target = self.target(platform, caller, params.vcpu)?;
        let mut result = Err(OpError::InvalidArgument);
        vcpus.with_vcpu(target, &mut |v| {
            result = match v.ring.take() {
                Some(ring) => {
                    platform.unmap_ring(ring.slot);
                    Ok(())
                }
                None => Err(OpError::NoVpmu),
            };
        });
        result
    }
}

const _: () = assert!((XENPMU_RING_CONTROL_SIZE - XENPMU_RING_PRODUCER_OFFSET) % 8 == 0);
