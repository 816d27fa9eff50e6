//! A synthetic CPUID describing an Intel architectural PMU of any shape, as a raw-cpuid
//! `CpuIdReader`: what a simulator or reference VMM hands both to the backend's enumeration and
//! to its guest, and what tests use to try PMU shapes no machine at hand has.

use raw_cpuid::{CpuIdReader, CpuIdResult};

const ZERO: CpuIdResult = CpuIdResult {
    eax: 0,
    ebx: 0,
    ecx: 0,
    edx: 0,
};

/// The PMU-relevant CPUID of a "GenuineIntel" family-6 CPU whose max basic leaf is 0xA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticCpuid {
    /// `CPUID.0AH:EAX[7:0]`.
    pub version: u8,
    /// `CPUID.0AH:EAX[15:8]`.
    pub gp_counters: u8,
    /// `CPUID.0AH:EAX[23:16]`.
    pub gp_width: u8,
    /// `CPUID.0AH:EAX[31:24]`: length of the EBX event-availability vector.
    pub event_vector_length: u8,
    /// CPUID.0AH:EBX: bit set = architectural event unavailable.
    pub unavailable_events: u32,
    /// `CPUID.0AH:EDX[4:0]`: number of contiguous fixed counters.
    pub fixed_counters: u8,
    /// `CPUID.0AH:EDX[12:5]`.
    pub fixed_width: u8,
    /// CPUID.0AH:ECX: v5 fixed-counter support bitmap.
    pub fixed_bitmap: u32,
    /// `CPUID.0AH:EDX[15]`: AnyThread deprecated.
    pub anythread_deprecated: bool,
    /// `CPUID.1:ECX[15]`: IA32_PERF_CAPABILITIES exists.
    pub pdcm: bool,
    /// `CPUID.1:EDX[21]` DS and `CPUID.1:ECX[2]` DTES64.
    pub debug_store: bool,
}

impl SyntheticCpuid {
    /// Version 2 with `gp` 48-bit GP counters and `fixed` 48-bit fixed counters, all seven
    /// architectural events available, no PDCM, no DS.
    pub const fn v2(gp: u8, fixed: u8) -> Self {
        SyntheticCpuid {
            version: 2,
            gp_counters: gp,
            gp_width: 48,
            event_vector_length: 7,
            unavailable_events: 0,
            fixed_counters: fixed,
            fixed_width: 48,
            fixed_bitmap: 0,
            anythread_deprecated: false,
            pdcm: false,
            debug_store: false,
        }
    }

    /// Version 5 with `gp` GP counters, `fixed` contiguous fixed counters plus the ECX
    /// `fixed_bitmap`, AnyThread deprecated, PDCM (so PERF_CAPABILITIES is read).
    pub const fn v5(gp: u8, fixed: u8, fixed_bitmap: u32) -> Self {
        SyntheticCpuid {
            version: 5,
            event_vector_length: 8,
            fixed_bitmap,
            anythread_deprecated: true,
            pdcm: true,
            ..SyntheticCpuid::v2(gp, fixed)
        }
    }

    /// The registers of `leaf`/`subleaf`.
    pub const fn leaf(&self, leaf: u32, _subleaf: u32) -> CpuIdResult {
        match leaf {
            0 => CpuIdResult {
                eax: 0xa,
                ebx: u32::from_le_bytes(*b"Genu"),
                ecx: u32::from_le_bytes(*b"ntel"),
                edx: u32::from_le_bytes(*b"ineI"),
            },
            1 => CpuIdResult {
                eax: 0x0009_06ea,
                ebx: 0,
                ecx: (self.pdcm as u32) << 15 | (self.debug_store as u32) << 2,
                edx: (self.debug_store as u32) << 21,
            },
            0xa => CpuIdResult {
                eax: self.version as u32
                    | (self.gp_counters as u32) << 8
                    | (self.gp_width as u32) << 16
                    | (self.event_vector_length as u32) << 24,
                ebx: self.unavailable_events,
                ecx: self.fixed_bitmap,
                edx: (self.fixed_counters as u32 & 0x1f)
                    | (self.fixed_width as u32) << 5
                    | (self.anythread_deprecated as u32) << 15,
            },
            0x8000_0000 => CpuIdResult {
                eax: 0x8000_0000,
                ..ZERO
            },
            _ => ZERO,
        }
    }
}

impl CpuIdReader for SyntheticCpuid {
    fn cpuid2(&self, eax: u32, ecx: u32) -> CpuIdResult {
        self.leaf(eax, ecx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raw_cpuid::CpuId;

    #[test]
    fn raw_cpuid_parses_the_synthetic_leaves() {
        let shape = SyntheticCpuid {
            unavailable_events: 0b100,
            ..SyntheticCpuid::v5(6, 3, 0b1000)
        };
        let cpuid = CpuId::with_cpuid_reader(shape);
        assert_eq!(
            cpuid
                .get_vendor_info()
                .map(|v| v.as_str() == "GenuineIntel"),
            Some(true)
        );
        let info = cpuid.get_performance_monitoring_info().expect("leaf 0xA");
        assert_eq!(info.version_id(), 5);
        assert_eq!(info.number_of_counters(), 6);
        assert_eq!(info.counter_bit_width(), 48);
        assert_eq!(info.fixed_function_counters(), 3);
        assert_eq!(info.fixed_function_counters_bit_width(), 48);
        assert!(info.has_any_thread_deprecation());
        assert!(info.is_ref_cycle_ev_unavailable());
        assert!(!info.is_core_cyc_ev_unavailable());
        assert!(cpuid.get_feature_info().expect("leaf 1").has_pdcm());
    }
}
