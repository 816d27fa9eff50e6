//! Enumeration: what the CPU's architectural PMU offers, from CPUID leaf 0xA (through
//! raw-cpuid) and IA32_PERF_CAPABILITIES. Every mask elsewhere in the crate is derived from an
//! [`IntelCaps`], never from constants.

use raw_cpuid::{CpuId, CpuIdReader};
use vpmu::bank::{BankMap, Controls, MsrSeries};
use vpmu::{CounterSet, PmuCapabilities, Vendor};

use crate::events::ArchEvent;
use crate::msrs::{IA32_A_PMC0, IA32_FIXED_CTR_CTRL, IA32_FIXED_CTR0, IA32_PERFEVTSEL0, IA32_PMC0};

/// Highest architectural PMU version this backend knows the rules of. Later versions only add
/// registers and bits; the backend exposes none of them, so it treats the CPU as this version.
pub const MAX_SUPPORTED_VERSION: u8 = 5;
/// The general-purpose bank as [`IntelCaps::banks`] gives it, but for what the enumeration
/// decides (the write alias, the value mask): these fields are the same on every CPU, and
/// the switch path takes them from here so that the compiler folds them into its loops.
pub(crate) const GP_BANK_MAP: BankMap = BankMap {
    first_bit: 0,
    counters: MsrSeries::new(IA32_PMC0, 1),
    counter_writes: MsrSeries::new(IA32_PMC0, 1),
    controls: Controls::PerCounter(MsrSeries::new(IA32_PERFEVTSEL0, 1)),
    value_mask: u64::MAX,
};

/// The fixed bank as [`IntelCaps::banks`] gives it, but for the value mask (see
/// [`GP_BANK_MAP`]).
pub(crate) const FIXED_BANK_MAP: BankMap = BankMap {
    first_bit: CounterSet::FIXED_BASE,
    counters: MsrSeries::new(IA32_FIXED_CTR0, 1),
    counter_writes: MsrSeries::new(IA32_FIXED_CTR0, 1),
    controls: Controls::Shared(vpmu::Msr(IA32_FIXED_CTR_CTRL)),
    value_mask: u64::MAX,
};

/// Lowest version with IA32_PERF_GLOBAL_CTRL/STATUS, which save/restore relies on (Xen refuses
/// v1 for the same reason).
pub const MIN_SUPPORTED_VERSION: u8 = 2;
/// General-purpose counters the MSR map has room for (IA32_PMC0–7, PERFEVTSEL0–7): more are
/// clipped.
pub const MAX_GP_COUNTERS: u8 = 8;
/// Fixed counters the backend knows: 0 instructions, 1 core cycles, 2 reference cycles,
/// 3 topdown slots. Higher ones are not exposed.
pub const FIXED_COUNTER_LIMIT: u32 = 4;
/// IA32_PERF_CAPABILITIES.FW_WRITE: IA32_A_PMCx full-width writes are supported.
pub const PERF_CAP_FW_WRITES: u64 = 1 << 13;

/// Why the CPU's PMU cannot be driven by this backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnumerationError {
    /// CPUID leaf 0xA is absent (not Intel, or the max basic leaf is below 0xA).
    NoArchitecturalPmu,
    /// The architectural PMU version is below 2 (no global control registers).
    UnsupportedVersion(u8),
    /// A counter width this backend cannot represent: legacy counter writes sign-extend from
    /// bit 31, so widths below 32 (and above 64) are refused.
    UnsupportedWidth {
        /// `"general-purpose"` or `"fixed"`.
        counters: &'static str,
        /// The enumerated width.
        width: u8,
    },
}

impl core::fmt::Display for EnumerationError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EnumerationError::NoArchitecturalPmu => f.write_str("CPUID leaf 0xA is absent"),
            EnumerationError::UnsupportedVersion(version) => write!(
                f,
                "architectural PMU version {version} has no global control registers"
            ),
            EnumerationError::UnsupportedWidth { counters, width } => {
                write!(
                    f,
                    "{counters} counters are {width} bits wide (need 32..=64)"
                )
            }
        }
    }
}

impl core::error::Error for EnumerationError {}

/// The enumerated Intel PMU. Built only by enumeration, so its counts and widths are always
/// within the limits the rest of the crate indexes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntelCaps {
    version: u8,
    reported_version: u8,
    gp_counters: u8,
    gp_width: u8,
    fixed_counters: u32,
    fixed_width: u8,
    event_vector_length: u8,
    unavailable_events: u32,
    anythread_deprecated: bool,
    perf_capabilities: Option<u64>,
    debug_store: bool,
}

fn check_width(counters: &'static str, width: u8) -> Result<u8, EnumerationError> {
    if (32..=64).contains(&width) {
        Ok(width)
    } else {
        Err(EnumerationError::UnsupportedWidth { counters, width })
    }
}

/// All ones in the low `width` bits.
pub(crate) const fn width_mask(width: u8) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

impl IntelCaps {
    /// Enumerates through `reader` (raw-cpuid's `CpuIdReader`: the native CPUID, a closure, a
    /// table). `perf_capabilities` is the value of IA32_PERF_CAPABILITIES if the caller could
    /// read it; it is consulted only when CPUID.1:ECX.PDCM says the MSR exists (reading it
    /// otherwise faults, the Xen boot bug fixed by 15c39c7c91).
    pub fn from_cpuid<R: CpuIdReader>(
        reader: R,
        perf_capabilities: Option<u64>,
    ) -> Result<Self, EnumerationError> {
        // raw-cpuid does not expose leaf 0xA's ECX (the v5 fixed-counter bitmap) and gives no
        // access to its reader, so keep a clone to ask for it directly.
        let raw_reader = reader.clone();
        let cpuid = CpuId::with_cpuid_reader(reader);
        let info = cpuid
            .get_performance_monitoring_info()
            .ok_or(EnumerationError::NoArchitecturalPmu)?;
        let reported_version = info.version_id();
        if reported_version < MIN_SUPPORTED_VERSION {
            return Err(EnumerationError::UnsupportedVersion(reported_version));
        }
        let version = reported_version.min(MAX_SUPPORTED_VERSION);

        let gp_counters = info.number_of_counters().min(MAX_GP_COUNTERS);
        let gp_width = if gp_counters > 0 {
            check_width("general-purpose", info.counter_bit_width())?
        } else {
            0
        };

        // SDM: fixed counter i exists if ECX[i] (v5+) or i < EDX[4:0].
        let counted = u32::from(info.fixed_function_counters());
        let mut fixed_counters = CounterSet::first_gp(counted).gp_bits();
        if version >= 5 {
            fixed_counters |= raw_reader.cpuid2(0xa, 0).ecx;
        }
        fixed_counters &= (1 << FIXED_COUNTER_LIMIT) - 1;
        let fixed_width = if fixed_counters != 0 {
            check_width("fixed", info.fixed_function_counters_bit_width())?
        } else {
            0
        };

        // EBX bit i set, or i beyond the vector length EAX[31:24], means "not available".
        let event_vector_length = info.ebx_length().min(32);
        let known = CounterSet::first_gp(u32::from(event_vector_length)).gp_bits();
        let ebx = raw_reader.cpuid2(0xa, 0).ebx;
        let unavailable_events = (ebx & known) | !known;

        let features = cpuid.get_feature_info();
        let pdcm = features.as_ref().is_some_and(|f| f.has_pdcm());
        // Xen requires both DS and its 64-bit layout before letting a guest own DS_AREA.
        let debug_store = features
            .as_ref()
            .is_some_and(|f| f.has_ds() && f.has_ds_area());

        Ok(IntelCaps {
            version,
            reported_version,
            gp_counters,
            gp_width,
            fixed_counters,
            fixed_width,
            event_vector_length,
            unavailable_events,
            anythread_deprecated: info.has_any_thread_deprecation(),
            perf_capabilities: if pdcm {
                Some(perf_capabilities.unwrap_or(0))
            } else {
                None
            },
            debug_store,
        })
    }

    /// The architectural PMU version the backend implements (2..=5).
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The version CPUID reported (may exceed 5).
    pub fn reported_version(&self) -> u8 {
        self.reported_version
    }

    /// Number of general-purpose counters (at most 8).
    pub fn gp_counters(&self) -> u32 {
        u32::from(self.gp_counters)
    }

    /// Width of the general-purpose counters in bits (0 without GP counters).
    pub fn gp_width(&self) -> u8 {
        self.gp_width
    }

    /// Values a general-purpose counter can hold.
    pub fn gp_value_mask(&self) -> u64 {
        width_mask(self.gp_width)
    }

    /// Present fixed counters as a bitmap of indices (within bits 0..=3).
    pub fn fixed_counters(&self) -> u32 {
        self.fixed_counters
    }

    /// Whether fixed counter `index` exists.
    pub fn has_fixed(&self, index: u32) -> bool {
        index < FIXED_COUNTER_LIMIT && self.fixed_counters & (1 << index) != 0
    }

    /// Whether general-purpose counter `index` exists.
    pub fn has_gp(&self, index: u32) -> bool {
        index < self.gp_counters()
    }

    /// Entries of the fixed-counter bank: the highest present fixed counter + 1, so that bank
    /// entry *i* is fixed counter *i* even with a sparse v5 bitmap.
    pub fn fixed_bank_len(&self) -> u32 {
        32 - self.fixed_counters.leading_zeros()
    }

    /// Width of the fixed counters in bits (0 without fixed counters).
    pub fn fixed_width(&self) -> u8 {
        self.fixed_width
    }

    /// Values a fixed counter can hold.
    pub fn fixed_value_mask(&self) -> u64 {
        width_mask(self.fixed_width)
    }

    /// Every present counter in the global index space (GP bit i, fixed bit 32 + i).
    pub fn all_counters(&self) -> CounterSet {
        CounterSet::first_gp(self.gp_counters()).union(CounterSet(
            u64::from(self.fixed_counters) << CounterSet::FIXED_BASE,
        ))
    }

    /// Whether CPUID enumerates architectural event `event` as available.
    pub fn event_available(&self, event: ArchEvent) -> bool {
        self.unavailable_events & (1 << event.unavailable_bit) == 0
    }

    /// The availability vector as CPUID.0AH:EBX states it (bit set = unavailable), with bits
    /// beyond the enumerated vector length set.
    pub fn unavailable_events(&self) -> u32 {
        self.unavailable_events
    }

    /// `CPUID.0AH:EAX[31:24]`: how many architectural events the EBX vector describes (at most
    /// 32); events beyond it are unavailable.
    pub fn event_vector_length(&self) -> u8 {
        self.event_vector_length
    }

    /// `CPUID.0AH:EDX[15]`: AnyThread is deprecated (and reserved) on this CPU.
    pub fn anythread_deprecated(&self) -> bool {
        self.anythread_deprecated
    }

    /// Whether IA32_PERF_CAPABILITIES exists (CPUID.1:ECX.PDCM).
    pub fn has_perf_capabilities(&self) -> bool {
        self.perf_capabilities.is_some()
    }

    /// IA32_PERF_CAPABILITIES as read from the CPU (0 if it was not readable).
    pub fn perf_capabilities(&self) -> u64 {
        self.perf_capabilities.unwrap_or(0)
    }

    /// IA32_A_PMCx full-width writes (PERF_CAPABILITIES.FW_WRITE, bit 13).
    pub fn full_width_writes(&self) -> bool {
        self.perf_capabilities() & PERF_CAP_FW_WRITES != 0
    }

    /// Whether the debug store with its 64-bit layout exists (CPUID.1:EDX.DS and ECX.DTES64),
    /// so IA32_DS_AREA can be given to a guest under `XENPMU_FEATURE_INTEL_BTS`.
    pub fn debug_store(&self) -> bool {
        self.debug_store
    }

    /// The counter banks as the backend drives them: the general-purpose counters (read
    /// through IA32_PMCx, written through IA32_A_PMCx when FW_WRITE makes that exact, each with
    /// its PERFEVTSELx) and the fixed counters (under the one FIXED_CTR_CTRL).
    pub fn banks(&self) -> [BankMap; 2] {
        [
            BankMap {
                counter_writes: if self.full_width_writes() {
                    MsrSeries::new(IA32_A_PMC0, 1)
                } else {
                    GP_BANK_MAP.counters
                },
                value_mask: self.gp_value_mask(),
                ..GP_BANK_MAP
            },
            BankMap {
                value_mask: self.fixed_value_mask(),
                ..FIXED_BANK_MAP
            },
        ]
    }

    /// CPUID leaf 0xA as a guest of this PMU sees it, `[eax, ebx, ecx, edx]` (SDM vol. 2A,
    /// CPUID leaf 0AH; vol. 3B 20.2):
    ///
    /// * EAX: 7:0 version (the one the backend implements, at most 5), 15:8 general-purpose
    ///   counters, 23:16 their width, 31:24 the length of the EBX vector;
    /// * EBX: bit *i* set = architectural event *i* unavailable: the enumerated vector, plus
    ///   `unavailable_events` (what the integrator's counters cannot count), within the length;
    /// * ECX (v5 only, else 0): the fixed-counter bitmap, every present fixed counter;
    /// * EDX: 4:0 the fixed counters contiguous from 0 (before v5 the only way to state them;
    ///   from v5 counter *i* exists if ECX bit *i* is set or *i* < this count), 12:5 their
    ///   width, 15 AnyThread deprecated. PERF_CAPABILITIES and the debug store are in leaf 1,
    ///   which stays the integrator's.
    ///
    /// Enumerating the leaf ([`IntelCaps::from_cpuid`]) gives these caps back, with the events
    /// of `unavailable_events` unavailable. Before v5 the fixed counters are always contiguous
    /// (that is all CPUID can state), so the count covers them exactly.
    pub fn guest_leaf_0xa(&self, unavailable_events: u32) -> [u32; 4] {
        let known = CounterSet::first_gp(u32::from(self.event_vector_length)).gp_bits();
        let eax = u32::from(self.version)
            | u32::from(self.gp_counters) << 8
            | u32::from(self.gp_width) << 16
            | u32::from(self.event_vector_length) << 24;
        let ebx = (self.unavailable_events | unavailable_events) & known;
        let ecx = if self.version >= 5 {
            self.fixed_counters
        } else {
            0
        };
        let contiguous = self.fixed_counters.trailing_ones();
        let edx = contiguous
            | u32::from(self.fixed_width) << 5
            | u32::from(self.anythread_deprecated) << 15;
        [eax, ebx, ecx, edx]
    }

    /// The vendor-neutral summary the core works with.
    pub fn pmu_capabilities(&self) -> PmuCapabilities {
        PmuCapabilities {
            vendor: Vendor::Intel,
            version: self.version,
            gp_counters: self.gp_counters,
            gp_width: self.gp_width,
            fixed_counters: self.fixed_counters,
            fixed_width: self.fixed_width,
            global_ctrl: true,
            full_width_writes: self.full_width_writes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::ARCH_EVENTS;
    use raw_cpuid::CpuIdResult;

    fn reader(leaf_a: CpuIdResult, leaf1_ecx: u32) -> impl Fn(u32, u32) -> CpuIdResult + Clone {
        move |leaf, _subleaf| match leaf {
            // "GenuineIntel", max basic leaf 0xA.
            0 => CpuIdResult {
                eax: 0xa,
                ebx: 0x756e_6547,
                ecx: 0x6c65_746e,
                edx: 0x4965_6e69,
            },
            1 => CpuIdResult {
                eax: 0x000906ea,
                ebx: 0,
                ecx: leaf1_ecx,
                edx: 0,
            },
            0xa => leaf_a,
            _ => CpuIdResult {
                eax: 0,
                ebx: 0,
                ecx: 0,
                edx: 0,
            },
        }
    }

    #[test]
    fn narrow_counters_are_refused() {
        // v2, 2 GP counters of 16 bits.
        let leaf = CpuIdResult {
            eax: 0x0710_0202,
            ebx: 0,
            ecx: 0,
            edx: 0,
        };
        assert_eq!(
            IntelCaps::from_cpuid(reader(leaf, 0), None),
            Err(EnumerationError::UnsupportedWidth {
                counters: "general-purpose",
                width: 16
            })
        );
    }

    #[test]
    fn perf_capabilities_ignored_without_pdcm() {
        let leaf = CpuIdResult {
            eax: 0x0730_0402,
            ebx: 0,
            ecx: 0,
            edx: 0x603,
        };
        let caps =
            IntelCaps::from_cpuid(reader(leaf, 0), Some(PERF_CAP_FW_WRITES)).expect("v2 PMU");
        assert!(!caps.has_perf_capabilities());
        assert!(!caps.full_width_writes());
        let with_pdcm =
            IntelCaps::from_cpuid(reader(leaf, 1 << 15), Some(PERF_CAP_FW_WRITES)).expect("v2 PMU");
        assert!(with_pdcm.full_width_writes());
    }

    #[test]
    fn event_vector_length_limits_availability() {
        // Vector length 2: only core cycles and instructions are enumerated; EBX bit 0 says
        // core cycles is unavailable.
        let leaf = CpuIdResult {
            eax: 0x0230_0402,
            ebx: 0x1,
            ecx: 0,
            edx: 0x603,
        };
        let caps = IntelCaps::from_cpuid(reader(leaf, 0), None).expect("v2 PMU");
        let available = ARCH_EVENTS.map(|event| caps.event_available(event));
        assert_eq!(available, [false, true, false, false, false, false, false]);
    }

    #[test]
    fn fixed_bank_length_covers_highest_counter() {
        // v5, EDX count 0, ECX bitmap {0, 3}.
        let leaf = CpuIdResult {
            eax: 0x0830_0805,
            ebx: 0,
            ecx: 0b1001,
            edx: 0x600,
        };
        let caps = IntelCaps::from_cpuid(reader(leaf, 0), None).expect("v5 PMU");
        assert_eq!(caps.fixed_counters(), 0b1001);
        assert_eq!(caps.fixed_bank_len(), 4);
        assert!(caps.has_fixed(3) && !caps.has_fixed(1));
    }

    #[test]
    fn width_mask_edges() {
        assert_eq!(width_mask(0), 0);
        assert_eq!(width_mask(48), 0xffff_ffff_ffff);
        assert_eq!(width_mask(64), u64::MAX);
    }
}
