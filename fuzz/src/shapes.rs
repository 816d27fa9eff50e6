//! The machines under test and the invariants the hardware state must keep whatever a guest
//! feeds the backends.
//!
//! The PMUs are built through `vpmu_models::shapes`, like the simulator's and the VMM's: the
//! `intel-v2`, `intel-v5` (with the debug store), `amd-k7` and `amd-perfmonv2` test shapes,
//! and three exotic ones (Intel v5 with 6 GP counters and a sparse fixed bitmap, Intel v2 with
//! 2 GP and no fixed counter, AMD PerfCtrExtCore). Each is a [`SimVendor`], so "nothing can
//! count" is the simulator's own predicate.

use vpmu::{AllowAll, EventFilter, GuestPolicy, Msr, PmuBackend, RawEvent};
use vpmu_amd::PmuShape;
use vpmu_intel::PERF_CAP_FW_WRITES;
use vpmu_models::amd::AmdPmuModel;
use vpmu_models::intel::{IntelPmuModel, SyntheticCpuid};
use vpmu_models::shapes::{ALL_EVENTS, AmdShape, IntelShape};
use vpmu_sim::SimVendor;

/// A filter that denies every event with an odd event select, to exercise the filtered path.
#[derive(Debug)]
pub struct DenyOdd;

impl EventFilter for DenyOdd {
    fn allows(&self, event: RawEvent) -> bool {
        event.select.is_multiple_of(2)
    }

    fn allows_fixed(&self, index: u32) -> bool {
        index.is_multiple_of(2)
    }
}

/// A guest policy chosen by one input byte: bit 0 the filter, bits 3:1 the features, bit 4
/// whether the guest may count host time.
pub fn policy(selector: u8) -> GuestPolicy<'static> {
    let filter: &'static dyn EventFilter = if selector & 1 != 0 {
        &DenyOdd
    } else {
        &AllowAll
    };
    GuestPolicy {
        features: u64::from((selector >> 1) & 0x7),
        filter,
        may_count_host: selector & 0x10 != 0,
    }
}

/// One of four Intel PMUs: the `intel-v2` and `intel-v5` test shapes (the latter with the
/// debug store), and two exotic ones.
pub fn intel(shape: u8) -> IntelShape {
    match shape % 4 {
        0 => IntelShape::v2(ALL_EVENTS),
        1 => {
            let v5 = IntelShape::v5(ALL_EVENTS);
            IntelShape {
                cpuid: SyntheticCpuid {
                    debug_store: true,
                    ..v5.cpuid
                },
                ..v5
            }
        }
        2 => IntelShape {
            cpuid: SyntheticCpuid::v5(6, 0, 0b1011),
            perf_capabilities: Some(PERF_CAP_FW_WRITES),
        },
        _ => IntelShape {
            cpuid: SyntheticCpuid::v2(2, 0),
            perf_capabilities: None,
        },
    }
}

/// One of three AMD PMUs: the `amd-k7` and `amd-perfmonv2` test shapes and PerfCtrExtCore.
pub fn amd(shape: u8) -> AmdShape {
    match shape % 3 {
        0 => AmdShape::k7(),
        1 => AmdShape {
            pmu: PmuShape::PerfCtrExtCore,
        },
        _ => AmdShape::perfmon_v2(),
    }
}

/// A vendor shape with the invariant no guest may break on its hardware.
pub trait FuzzShape: SimVendor {
    /// Panics if a bit no guest may ever get onto the hardware is there.
    fn assert_clean(model: &Self::Model, policy: &GuestPolicy<'_>);
}

impl FuzzShape for IntelShape {
    /// PERFEVTSEL 63:32, AnyThread (21) and Pin Control (19); FIXED_CTR_CTRL AnyThread (bit 2
    /// of each nibble); any PEBS enable.
    fn assert_clean(model: &IntelPmuModel, _policy: &GuestPolicy<'_>) {
        let regs = model.registers();
        for (index, select) in regs.event_selects.iter().enumerate() {
            assert_eq!(
                select & (0xffff_ffff_0000_0000 | 1 << 21 | 1 << 19),
                0,
                "EVTSEL{index} = {select:#x}"
            );
        }
        assert_eq!(
            regs.fixed_ctrl & 0x4444,
            0,
            "FIXED_CTR_CTRL = {:#x}",
            regs.fixed_ctrl
        );
        assert_eq!(regs.pebs_enable, 0, "PEBS_ENABLE = {:#x}", regs.pebs_enable);
    }
}

impl FuzzShape for AmdShape {
    /// Reserved PERF_CTL bits, HostOnly unless host counting is allowed, and a programmed
    /// control without GuestOnly unless it is allowed.
    fn assert_clean(model: &AmdPmuModel, policy: &GuestPolicy<'_>) {
        const RESERVED: u64 = 0xffff_fc00_0000_0000 | 0xf << 36 | 1 << 21 | 1 << 19;
        const GUEST_ONLY: u64 = 1 << 40;
        const HOST_ONLY: u64 = 1 << 41;
        for (index, ctl) in model.registers().controls.iter().enumerate() {
            assert_eq!(ctl & RESERVED, 0, "PERF_CTL{index} = {ctl:#x}");
            if !policy.may_count_host {
                assert_eq!(ctl & HOST_ONLY, 0, "PERF_CTL{index} = {ctl:#x}");
                assert!(
                    *ctl == 0 || ctl & GUEST_ONLY != 0,
                    "PERF_CTL{index} = {ctl:#x}"
                );
            }
        }
    }
}

/// The backend of `shape` and a model of the same CPU, cleaned as a hypervisor cleans each
/// CPU's PMU before its first load.
pub fn cleaned<S: SimVendor>(shape: &S) -> (S::Backend, S::Model) {
    let (pmu, mut model) = (shape.backend(), shape.model());
    pmu.init_hardware(&mut model)
        .expect("a model accepts cleaning");
    (pmu, model)
}

/// Something to run on the shape an input picked.
pub trait OnShape {
    /// Runs on `shape`.
    fn on<S: FuzzShape>(self, shape: S);
}

/// Runs `what` on the shape `vendor` and `shape` pick: an even `vendor` an Intel shape, an odd
/// one an AMD shape.
pub fn on_shape(vendor: u8, shape: u8, what: impl OnShape) {
    if vendor.is_multiple_of(2) {
        what.on(intel(shape));
    } else {
        what.on(amd(shape));
    }
}

/// Bytes of one [`Access`] in an input.
pub const ACCESS_BYTES: usize = 10;

/// A guest RDMSR or WRMSR on or around the PMU MSR ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Bit 7: a read. Bits 6:0: the range of the backend's `msr_ranges` (modulo their count).
    pub range: u8,
    /// The MSR's offset from one below the range's first MSR (modulo its span plus 3), so
    /// that present, absent and neighbouring MSRs are all reached.
    pub offset: u8,
    /// The value written.
    pub value: u64,
}

impl Access {
    /// The accesses `bytes` hold, [`ACCESS_BYTES`] each (a trailing partial one is ignored).
    pub fn parse(bytes: &[u8]) -> impl Iterator<Item = Access> + '_ {
        bytes.chunks_exact(ACCESS_BYTES).map(|chunk| {
            let mut value = [0u8; 8];
            value.copy_from_slice(&chunk[2..]);
            Access {
                range: chunk[0],
                offset: chunk[1],
                value: u64::from_le_bytes(value),
            }
        })
    }

    /// The bytes of this access in an input.
    pub fn to_bytes(self) -> [u8; ACCESS_BYTES] {
        let mut out = [0u8; ACCESS_BYTES];
        out[0] = self.range;
        out[1] = self.offset;
        out[2..].copy_from_slice(&self.value.to_le_bytes());
        out
    }

    /// Whether this access is a read.
    pub fn is_read(self) -> bool {
        self.range & 0x80 != 0
    }

    /// The MSR this access names on a backend with `ranges`.
    pub fn msr(self, ranges: &[(u32, u32)]) -> Msr {
        let (first, last) = ranges[usize::from(self.range & 0x7f) % ranges.len()];
        let span = last - first + 3;
        Msr(first.wrapping_sub(1) + u32::from(self.offset) % span)
    }

    /// The access that writes `value` to (or, `read`, reads) `msr`, which must lie in one of
    /// `ranges`.
    pub fn to(ranges: &[(u32, u32)], msr: u32, value: u64, read: bool) -> Access {
        let range = ranges
            .iter()
            .position(|&(first, last)| (first..=last).contains(&msr))
            .expect("an MSR of the ranges");
        Access {
            range: range as u8 | if read { 0x80 } else { 0 },
            offset: (msr - ranges[range].0 + 1) as u8,
            value,
        }
    }
}
