//! Enumeration: which AMD core PMU the CPU (or the guest's CPUID) describes.
//!
//! * PerfMonV2 (CPUID `0x8000_0022` EAX[0]): version 2, `EBX[3:0]` counters (clipped to
//!   [`MAX_COUNTERS`]), the interleaved MSRs and the global control/status MSRs.
//! * else PerfCtrExtCore (CPUID `0x8000_0001` ECX[23]): 6 counters through the interleaved MSRs.
//! * else the 4 legacy K7 counters.
//!
//! The order and the clip follow KVM's `amd_pmu_refresh`. The K7 MSRs alias counters 0–3 in
//! every shape.

use raw_cpuid::{CpuId, CpuIdReader};
use vpmu::bank::{BankMap, Controls, MsrSeries};
use vpmu::{CounterSet, Msr, PmuCapabilities, Vendor};

use crate::msrs::{
    self, Block, COUNTER_WIDTH, EXT_PERF_CTL0, K7_COUNTERS, K7_PERF_CTL0, K7_PERF_CTR0,
    MAX_COUNTERS, Register,
};

/// Which generation of the AMD core PMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PmuShape {
    /// Four counters through the K7 MSRs only.
    LegacyK7,
    /// Six counters through the interleaved PerfCtrExtCore MSRs (K7 MSRs alias 0–3).
    PerfCtrExtCore,
    /// PerfMonV2: `counters` core counters (1–6 here) plus the global MSRs.
    PerfMonV2 {
        /// Number of core counters, as enumerated and clipped.
        counters: u8,
    },
}

/// Why no AMD PMU could be enumerated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnumerationError {
    /// The CPUID vendor is neither `AuthenticAMD` nor `HygonGenuine`.
    NotAmd,
    /// PerfMonV2 is advertised with zero core counters.
    NoCounters,
}

impl core::fmt::Display for EnumerationError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EnumerationError::NotAmd => f.write_str("CPU vendor is not AMD or Hygon"),
            EnumerationError::NoCounters => f.write_str("PerfMonV2 with no core counters"),
        }
    }
}

impl core::error::Error for EnumerationError {}

/// What [`AmdCaps::lookup`] found for an MSR number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lookup {
    /// Not an AMD core-PMU MSR.
    NotPmu,
    /// Part of the architecture but absent from this PMU (or beyond its counters): #GP.
    Absent,
    /// Present.
    Present(Register),
}

/// The enumerated AMD core PMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AmdCaps {
    shape: PmuShape,
    // What the shape implies, worked out once at enumeration: every intercept's decode
    // (`lookup`) asks it.
    gp_counters: u32,
    ext_core: bool,
    perfmon_v2: bool,
}

impl AmdCaps {
    /// The PMU of `shape`. PerfMonV2's counter count is clipped to [`MAX_COUNTERS`]; zero is an
    /// error.
    pub fn from_shape(shape: PmuShape) -> Result<Self, EnumerationError> {
        let shape = match shape {
            PmuShape::PerfMonV2 { counters: 0 } => return Err(EnumerationError::NoCounters),
            PmuShape::PerfMonV2 { counters } => PmuShape::PerfMonV2 {
                counters: counters.min(MAX_COUNTERS as u8),
            },
            other => other,
        };
        let (gp_counters, ext_core, perfmon_v2) = match shape {
            PmuShape::LegacyK7 => (K7_COUNTERS, false, false),
            PmuShape::PerfCtrExtCore => (MAX_COUNTERS, true, false),
            PmuShape::PerfMonV2 { counters } => (u32::from(counters), true, true),
        };
        Ok(Self {
            shape,
            gp_counters,
            ext_core,
            perfmon_v2,
        })
    }

    /// Enumerates through `reader` (raw-cpuid's `CpuIdReader`: the native CPUID, a closure, a
    /// table). Requires an AMD or Hygon vendor string: raw-cpuid only decodes the AMD leaves
    /// for those.
    pub fn from_cpuid<R: CpuIdReader>(reader: R) -> Result<Self, EnumerationError> {
        let cpuid = CpuId::with_cpuid_reader(reader);
        let vendor = cpuid.get_vendor_info().ok_or(EnumerationError::NotAmd)?;
        if !matches!(vendor.as_str(), "AuthenticAMD" | "HygonGenuine") {
            return Err(EnumerationError::NotAmd);
        }
        if let Some(leaf) = cpuid.get_extended_performance_monitoring_and_debug() {
            if leaf.has_perf_mon_v2() {
                return Self::from_shape(PmuShape::PerfMonV2 {
                    counters: leaf.num_perf_ctr_core(),
                });
            }
        }
        let ext_core = cpuid
            .get_extended_processor_and_feature_identifiers()
            .is_some_and(|f| f.has_perf_cntr_extensions());
        Self::from_shape(if ext_core {
            PmuShape::PerfCtrExtCore
        } else {
            PmuShape::LegacyK7
        })
    }

    /// The shape.
    pub fn shape(&self) -> PmuShape {
        self.shape
    }

    /// Number of core counters (the general-purpose counters of [`PmuCapabilities`]).
    pub fn gp_counters(&self) -> u32 {
        self.gp_counters
    }

    /// Bits `0..counters`: the counters in the global index space, and the defined bits of
    /// the PerfMonV2 global registers.
    pub fn counter_mask(&self) -> u64 {
        (1u64 << self.gp_counters()) - 1
    }

    /// Every present counter as a [`CounterSet`] (the bits of [`AmdCaps::counter_mask`]).
    pub fn all_counters(&self) -> CounterSet {
        CounterSet(self.counter_mask())
    }

    /// Whether the interleaved PerfCtrExtCore MSRs exist.
    pub fn has_ext_core(&self) -> bool {
        self.ext_core
    }

    /// Whether the PerfMonV2 global MSRs exist.
    pub fn has_perfmon_v2(&self) -> bool {
        self.perfmon_v2
    }

    /// The vendor-neutral summary the core works with.
    pub fn pmu_capabilities(&self) -> PmuCapabilities {
        PmuCapabilities {
            vendor: Vendor::Amd,
            version: if self.has_perfmon_v2() { 2 } else { 1 },
            gp_counters: self.gp_counters() as u8,
            gp_width: COUNTER_WIDTH as u8,
            fixed_counters: 0,
            fixed_width: 0,
            global_ctrl: self.has_perfmon_v2(),
            full_width_writes: false,
        }
    }

    /// Whether `msr` exists on this PMU, and which register it is.
    #[inline]
    pub fn lookup(&self, msr: Msr) -> Lookup {
        let Some((register, block)) = msrs::decode(msr) else {
            return Lookup::NotPmu;
        };
        let block_present = match block {
            Block::Legacy => true,
            Block::Extended => self.has_ext_core(),
            Block::Global => self.has_perfmon_v2(),
        };
        let index_present = match register {
            Register::Control(i) | Register::Counter(i) => i < self.gp_counters(),
            _ => true,
        };
        if block_present && index_present {
            Lookup::Present(register)
        } else {
            Lookup::Absent
        }
    }

    /// The one counter bank as the backend drives it: the interleaved PerfCtrExtCore MSRs when
    /// present, else the K7 ones (which alias counters 0–3 anyway).
    pub fn banks(&self) -> [BankMap; 1] {
        [if self.has_ext_core() {
            EXT_CORE_BANK
        } else {
            K7_BANK
        }]
    }

    /// The MSR this backend uses for PERF_CTL `index` (see [`AmdCaps::banks`]).
    pub fn control_msr(&self, index: u32) -> Msr {
        self.banks()[0].control_msr(index)
    }

    /// The MSR this backend uses for PERF_CTR `index` (see [`AmdCaps::banks`]).
    pub fn counter_msr(&self, index: u32) -> Msr {
        self.banks()[0].counters.at(index)
    }
}

/// The interleaved PerfCtrExtCore bank (see [`AmdCaps::banks`]). Both maps are constants, so
/// that the switch path can hand the bank loops a map the compiler folds into them.
pub(crate) const EXT_CORE_BANK: BankMap = BankMap {
    first_bit: 0,
    counters: MsrSeries::new(EXT_PERF_CTL0 + 1, 2),
    counter_writes: MsrSeries::new(EXT_PERF_CTL0 + 1, 2),
    controls: Controls::PerCounter(MsrSeries::new(EXT_PERF_CTL0, 2)),
    // The bits above the 48 counter bits read as 0: nothing to mask.
    value_mask: u64::MAX,
};

/// The legacy K7 bank (see [`EXT_CORE_BANK`]).
pub(crate) const K7_BANK: BankMap = BankMap {
    first_bit: 0,
    counters: MsrSeries::new(K7_PERF_CTR0, 1),
    counter_writes: MsrSeries::new(K7_PERF_CTR0, 1),
    controls: Controls::PerCounter(MsrSeries::new(K7_PERF_CTL0, 1)),
    value_mask: u64::MAX,
};

/// CPUID `0x8000_0001` ECX bit 23, PerfCtrExtCore: the six interleaved core counters (APM
/// vol. 3, appendix E.4.2).
pub const CPUID_PERF_CTR_EXT_CORE: u32 = 1 << 23;
/// The extended CPUID leaf of PerfMonV2 and the core counter count (APM vol. 3, E.4.21).
pub const CPUID_PERFMON_LEAF: u32 = 0x8000_0022;
/// CPUID `0x8000_0022` EAX bit 0, PerfMonV2.
pub const CPUID_PERFMON_V2: u32 = 1 << 0;

/// The PMU's part of an AMD guest's CPUID, from [`AmdCaps::guest_leaves`]. The integrator
/// edits its CPUID table with it; every other bit of those leaves is its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AmdGuestLeaves {
    /// The bits of `0x8000_0001` ECX the PMU owns: PerfCtrExtCore (bit 23).
    pub ext_features_mask: u32,
    /// Their values.
    pub ext_features: u32,
    /// The least `0x8000_0000` EAX (max extended leaf) under which `0x8000_0022` is visible.
    /// Needed even without PerfMonV2: the zeroed leaf is what says so.
    pub max_extended_leaf: u32,
    /// `0x8000_0022` EAX, EBX, ECX, EDX. EAX bit 0 PerfMonV2 (bits 1 LbrStack and 2
    /// LbrAndPmcFreeze stay 0: no LBR is virtualised); EBX bits 3:0 NumPerfCtrCore (bits 9:4
    /// LbrStackSize, 15:10 NumPerfCtrNB and 21:16 NumPerfCtrUmc stay 0); ECX and EDX reserved.
    /// All zero without PerfMonV2.
    pub perfmon: [u32; 4],
}

impl AmdGuestLeaves {
    /// The guest's `0x8000_0001` ECX: `ecx` with the PMU's bits replaced.
    pub fn edit_ext_features(&self, ecx: u32) -> u32 {
        (ecx & !self.ext_features_mask) | self.ext_features
    }

    /// The guest's `0x8000_0000` EAX: `eax`, raised to [`AmdGuestLeaves::max_extended_leaf`].
    pub fn edit_max_extended_leaf(&self, eax: u32) -> u32 {
        eax.max(self.max_extended_leaf)
    }
}

impl AmdCaps {
    /// The CPUID bits that describe this PMU to a guest. Enumerating them ([`AmdCaps::from_cpuid`])
    /// gives this PMU back: PerfMonV2 with its counter count, else PerfCtrExtCore from
    /// `0x8000_0001` ECX, else the K7 counters. Reserved fields are 0.
    pub fn guest_leaves(&self) -> AmdGuestLeaves {
        let perfmon = match self.shape {
            PmuShape::PerfMonV2 { counters } => [CPUID_PERFMON_V2, u32::from(counters) & 0xf, 0, 0],
            PmuShape::LegacyK7 | PmuShape::PerfCtrExtCore => [0; 4],
        };
        AmdGuestLeaves {
            ext_features_mask: CPUID_PERF_CTR_EXT_CORE,
            ext_features: if self.has_ext_core() {
                CPUID_PERF_CTR_EXT_CORE
            } else {
                0
            },
            max_extended_leaf: CPUID_PERFMON_LEAF,
            perfmon,
        }
    }
}

#[cfg(test)]
mod tests {
    use raw_cpuid::CpuIdResult;

    use super::*;

    const ZERO: CpuIdResult = CpuIdResult {
        eax: 0,
        ebx: 0,
        ecx: 0,
        edx: 0,
    };

    /// Leaf 0 for a vendor string (EBX, EDX, ECX order) and a max basic leaf of 0x10.
    fn vendor_leaf(vendor: &[u8; 12]) -> CpuIdResult {
        let word =
            |i: usize| u32::from_le_bytes([vendor[i], vendor[i + 1], vendor[i + 2], vendor[i + 3]]);
        CpuIdResult {
            eax: 0x10,
            ebx: word(0),
            edx: word(4),
            ecx: word(8),
        }
    }

    /// A CPUID table reader: (leaf, subleaf, result); unknown leaves read as zero.
    #[derive(Clone, Copy)]
    struct Table<'a>(&'a [(u32, u32, CpuIdResult)]);

    impl CpuIdReader for Table<'_> {
        fn cpuid2(&self, eax: u32, ecx: u32) -> CpuIdResult {
            self.0
                .iter()
                .find(|(leaf, sub, _)| *leaf == eax && *sub == ecx)
                .map_or(ZERO, |entry| entry.2)
        }
    }

    fn enumerate(table: &[(u32, u32, CpuIdResult)]) -> Result<AmdCaps, EnumerationError> {
        AmdCaps::from_cpuid(Table(table))
    }

    fn ext_max(max: u32) -> (u32, u32, CpuIdResult) {
        (0x8000_0000, 0, CpuIdResult { eax: max, ..ZERO })
    }

    fn ext_features(ecx: u32) -> (u32, u32, CpuIdResult) {
        (0x8000_0001, 0, CpuIdResult { ecx, ..ZERO })
    }

    fn perfmon(eax: u32, ebx: u32) -> (u32, u32, CpuIdResult) {
        (0x8000_0022, 0, CpuIdResult { eax, ebx, ..ZERO })
    }

    const PERF_CTR_EXT_CORE: u32 = CPUID_PERF_CTR_EXT_CORE;

    #[test]
    fn k7_only_cpu_has_four_legacy_counters() {
        // A family 10h part: extended leaves up to 0x8000_001B, no PerfCtrExtCore.
        let pmu = enumerate(&[
            (0, 0, vendor_leaf(b"AuthenticAMD")),
            ext_max(0x8000_001b),
            ext_features(1 << 2), // SVM only
        ])
        .unwrap();
        assert_eq!(pmu.shape(), PmuShape::LegacyK7);
        assert_eq!(pmu.gp_counters(), 4);
        let caps = pmu.pmu_capabilities();
        assert_eq!(
            (
                caps.version,
                caps.gp_counters,
                caps.gp_width,
                caps.global_ctrl
            ),
            (1, 4, 48, false)
        );
        assert_eq!((caps.fixed_counters, caps.fixed_width), (0, 0));
        assert_eq!(pmu.control_msr(3), Msr(0xC001_0003));
        assert_eq!(pmu.counter_msr(3), Msr(0xC001_0007));
    }

    #[test]
    fn fam15h_and_later_have_six_interleaved_counters() {
        let pmu = enumerate(&[
            (0, 0, vendor_leaf(b"AuthenticAMD")),
            ext_max(0x8000_001e),
            ext_features(PERF_CTR_EXT_CORE),
        ])
        .unwrap();
        assert_eq!(pmu.shape(), PmuShape::PerfCtrExtCore);
        assert_eq!(pmu.gp_counters(), 6);
        assert!(pmu.has_ext_core() && !pmu.has_perfmon_v2());
        assert_eq!(pmu.pmu_capabilities().version, 1);
        assert_eq!(pmu.control_msr(5), Msr(0xC001_020A));
        assert_eq!(pmu.counter_msr(5), Msr(0xC001_020B));
    }

    #[test]
    fn hygon_is_accepted() {
        let pmu = enumerate(&[
            (0, 0, vendor_leaf(b"HygonGenuine")),
            ext_max(0x8000_001f),
            ext_features(PERF_CTR_EXT_CORE),
        ])
        .unwrap();
        assert_eq!(pmu.shape(), PmuShape::PerfCtrExtCore);
    }

    #[test]
    fn perfmon_v2_takes_its_counter_count_from_ebx() {
        for (ebx, expected) in [(6, 6), (3, 3), (1, 1), (0x0000_03f5, 5)] {
            let pmu = enumerate(&[
                (0, 0, vendor_leaf(b"AuthenticAMD")),
                ext_max(0x8000_0028),
                ext_features(PERF_CTR_EXT_CORE),
                perfmon(0b111, ebx),
            ])
            .unwrap();
            assert_eq!(pmu.shape(), PmuShape::PerfMonV2 { counters: expected });
            let caps = pmu.pmu_capabilities();
            assert_eq!(
                (caps.version, caps.gp_counters, caps.global_ctrl),
                (2, expected, true)
            );
            assert_eq!(pmu.counter_mask(), (1 << expected) - 1);
        }
    }

    #[test]
    fn perfmon_v2_counter_count_is_clipped_to_the_msr_block() {
        let pmu = enumerate(&[
            (0, 0, vendor_leaf(b"AuthenticAMD")),
            ext_max(0x8000_0022),
            ext_features(PERF_CTR_EXT_CORE),
            perfmon(1, 0xf),
        ])
        .unwrap();
        assert_eq!(pmu.gp_counters(), 6);
        assert_eq!(
            pmu.lookup(Msr(0xC001_020B)),
            Lookup::Present(Register::Counter(5))
        );
    }

    #[test]
    fn perfmon_v2_leaf_beyond_the_max_extended_leaf_is_ignored() {
        // The leaf has data, but 0x8000_0000 says it does not exist.
        let pmu = enumerate(&[
            (0, 0, vendor_leaf(b"AuthenticAMD")),
            ext_max(0x8000_0021),
            ext_features(PERF_CTR_EXT_CORE),
            perfmon(1, 6),
        ])
        .unwrap();
        assert_eq!(pmu.shape(), PmuShape::PerfCtrExtCore);
    }

    #[test]
    fn perfmon_v2_bit_clear_falls_back() {
        let pmu = enumerate(&[
            (0, 0, vendor_leaf(b"AuthenticAMD")),
            ext_max(0x8000_0022),
            ext_features(0),
            perfmon(0b110, 6),
        ])
        .unwrap();
        assert_eq!(pmu.shape(), PmuShape::LegacyK7);
    }

    #[test]
    fn perfmon_v2_without_counters_is_refused() {
        let result = enumerate(&[
            (0, 0, vendor_leaf(b"AuthenticAMD")),
            ext_max(0x8000_0022),
            ext_features(PERF_CTR_EXT_CORE),
            perfmon(1, 0),
        ]);
        assert_eq!(result, Err(EnumerationError::NoCounters));
    }

    #[test]
    fn other_vendors_are_refused() {
        for vendor in [
            b"GenuineIntel",
            b"CentaurHauls",
            b"\0\0\0\0\0\0\0\0\0\0\0\0",
        ] {
            let result = enumerate(&[
                (0, 0, vendor_leaf(vendor)),
                ext_max(0x8000_0022),
                ext_features(PERF_CTR_EXT_CORE),
                perfmon(1, 6),
            ]);
            assert_eq!(result, Err(EnumerationError::NotAmd));
        }
    }

    #[test]
    fn a_closure_reader_drives_the_backend() {
        use vpmu::PmuBackend;
        use vpmu::abi::{AmdBanks, VendorLayout};

        let reader = |leaf: u32, _subleaf: u32| match leaf {
            0 => vendor_leaf(b"AuthenticAMD"),
            0x8000_0000 => CpuIdResult {
                eax: 0x8000_0022,
                ..ZERO
            },
            0x8000_0001 => CpuIdResult {
                ecx: PERF_CTR_EXT_CORE,
                ..ZERO
            },
            0x8000_0022 => CpuIdResult {
                eax: 1,
                ebx: 4,
                ..ZERO
            },
            _ => ZERO,
        };
        let backend = crate::AmdPmu::from_cpuid(reader).unwrap();
        let caps = backend.capabilities();
        assert_eq!(
            (caps.version, caps.gp_counters, caps.global_ctrl),
            (2, 4, true)
        );
        assert_eq!(
            backend.page_layout(),
            VendorLayout::Amd(AmdBanks::new(4).unwrap())
        );
        assert_eq!(backend.new_context().global_ctl(), 0b1111);
    }

    #[test]
    fn lookup_follows_the_shape() {
        let k7 = AmdCaps::from_shape(PmuShape::LegacyK7).unwrap();
        let ext = AmdCaps::from_shape(PmuShape::PerfCtrExtCore).unwrap();
        let v2_3 = AmdCaps::from_shape(PmuShape::PerfMonV2 { counters: 3 }).unwrap();
        let ctl = |n| Lookup::Present(Register::Control(n));
        let ctr = |n| Lookup::Present(Register::Counter(n));

        assert_eq!(k7.lookup(Msr(0xC001_0000)), ctl(0));
        assert_eq!(k7.lookup(Msr(0xC001_0007)), ctr(3));
        assert_eq!(k7.lookup(Msr(0xC001_0200)), Lookup::Absent);
        assert_eq!(k7.lookup(Msr(0xC000_0301)), Lookup::Absent);

        assert_eq!(ext.lookup(Msr(0xC001_0002)), ctl(2));
        assert_eq!(ext.lookup(Msr(0xC001_0204)), ctl(2));
        assert_eq!(ext.lookup(Msr(0xC001_020B)), ctr(5));
        assert_eq!(ext.lookup(Msr(0xC000_0300)), Lookup::Absent);

        assert_eq!(v2_3.lookup(Msr(0xC001_0205)), ctr(2));
        assert_eq!(v2_3.lookup(Msr(0xC001_0206)), Lookup::Absent);
        assert_eq!(v2_3.lookup(Msr(0xC001_0003)), Lookup::Absent);
        assert_eq!(v2_3.lookup(Msr(0xC001_0007)), Lookup::Absent);
        assert_eq!(
            v2_3.lookup(Msr(0xC000_0303)),
            Lookup::Present(Register::GlobalStatusSet)
        );

        assert_eq!(ext.lookup(Msr(0x186)), Lookup::NotPmu);
        assert_eq!(ext.lookup(Msr(0xC001_0008)), Lookup::NotPmu);
    }

    #[test]
    fn guest_leaves_enumerate_to_the_same_caps() {
        let shapes = [
            PmuShape::LegacyK7,
            PmuShape::PerfCtrExtCore,
            PmuShape::PerfMonV2 { counters: 1 },
            PmuShape::PerfMonV2 { counters: 4 },
            PmuShape::PerfMonV2 { counters: 6 },
        ];
        for shape in shapes {
            let caps = AmdCaps::from_shape(shape).unwrap();
            let leaves = caps.guest_leaves();
            // A host CPU with every PMU bit set, edited into the guest's view.
            let host_ecx = PERF_CTR_EXT_CORE | 1 << 2;
            let ecx = leaves.edit_ext_features(host_ecx);
            assert_eq!(ecx & 1 << 2, 1 << 2, "other bits are the integrator's");
            let [eax, ebx, ecx_v2, edx] = leaves.perfmon;
            let table = [
                (0, 0, vendor_leaf(b"AuthenticAMD")),
                ext_max(leaves.edit_max_extended_leaf(0x8000_001e)),
                ext_features(ecx),
                (
                    CPUID_PERFMON_LEAF,
                    0,
                    CpuIdResult {
                        eax,
                        ebx,
                        ecx: ecx_v2,
                        edx,
                    },
                ),
            ];
            assert_eq!(enumerate(&table), Ok(caps), "{shape:?}");
        }
    }

    #[test]
    fn guest_leaves_state_the_apm_bits() {
        let v2 = AmdCaps::from_shape(PmuShape::PerfMonV2 { counters: 5 }).unwrap();
        let leaves = v2.guest_leaves();
        assert_eq!(leaves.perfmon, [1, 5, 0, 0]);
        assert_eq!(leaves.ext_features, 1 << 23);
        assert_eq!(leaves.edit_max_extended_leaf(0x8000_0028), 0x8000_0028);
        let k7 = AmdCaps::from_shape(PmuShape::LegacyK7)
            .unwrap()
            .guest_leaves();
        assert_eq!((k7.perfmon, k7.ext_features), ([0; 4], 0));
        assert_eq!(k7.edit_ext_features(u32::MAX), !(1 << 23));
        assert_eq!(k7.edit_max_extended_leaf(0x8000_0008), 0x8000_0022);
    }
}
