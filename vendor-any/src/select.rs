//! Choosing the backend from CPUID: the vendor string of leaf 0 decides, the vendor crate
//! enumerates, and every refusal says which of the two refused and why.

use raw_cpuid::{CpuIdReader, CpuIdResult};
use vpmu::Vendor;
use vpmu_amd::AmdPmu;
use vpmu_intel::IntelPmu;

use crate::VendorPmu;

/// CPUID.1:ECX bit 15, PDCM: IA32_PERF_CAPABILITIES exists (reading it otherwise faults).
const CPUID_1_ECX_PDCM: u32 = 1 << 15;
/// The leaf of Intel's architectural PMU.
const INTEL_PMU_LEAF: u32 = 0xa;

/// The 12-byte vendor string of CPUID leaf 0 (EBX, EDX, ECX), as the CPU reports it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct VendorId(pub [u8; 12]);

impl VendorId {
    /// The vendor string of a leaf-0 result.
    pub fn from_leaf_0(leaf: CpuIdResult) -> Self {
        let mut bytes = [0; 12];
        bytes[0..4].copy_from_slice(&leaf.ebx.to_le_bytes());
        bytes[4..8].copy_from_slice(&leaf.edx.to_le_bytes());
        bytes[8..12].copy_from_slice(&leaf.ecx.to_le_bytes());
        VendorId(bytes)
    }

    /// The string, if it is UTF-8 (every real vendor string is ASCII).
    pub fn as_str(&self) -> Option<&str> {
        core::str::from_utf8(&self.0).ok()
    }

    /// The vendor whose backend drives this CPU's PMU: `GenuineIntel` is Intel;
    /// `AuthenticAMD` and `HygonGenuine` (Hygon's Dhyana is a Zen core) are AMD.
    pub fn vendor(&self) -> Option<Vendor> {
        match &self.0 {
            b"GenuineIntel" => Some(Vendor::Intel),
            b"AuthenticAMD" | b"HygonGenuine" => Some(Vendor::Amd),
            _ => None,
        }
    }
}

impl core::fmt::Debug for VendorId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(self, f)
    }
}

/// The string in quotes, each byte that is not printable ASCII as `\xNN`.
impl core::fmt::Display for VendorId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("\"")?;
        for &byte in &self.0 {
            if byte.is_ascii_graphic() || byte == b' ' {
                write!(f, "{}", byte as char)?;
            } else {
                write!(f, "\\x{byte:02x}")?;
            }
        }
        f.write_str("\"")
    }
}

/// Why [`VendorPmu::from_cpuid`] built no backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectError {
    /// CPUID leaf 0 names a vendor neither backend drives (only `GenuineIntel`,
    /// `AuthenticAMD` and `HygonGenuine` are). Another vendor's CPU that implements Intel's
    /// architectural PMU can still be driven by building [`VendorPmu::Intel`] from
    /// [`vpmu_intel::IntelPmu::from_cpuid`] directly, once its integrator has checked it.
    UnknownVendor(VendorId),
    /// An Intel CPU that advertises no architectural PMU: its highest basic leaf is below
    /// 0xA, or leaf 0xA reports version 0 (what a virtual machine whose hypervisor hides the
    /// PMU shows).
    NoPmu {
        /// The vendor of the CPU.
        vendor: Vendor,
    },
    /// An Intel PMU the Intel backend does not drive (version 1, counter widths it cannot
    /// represent, counters that do not fit the shared page).
    Intel(vpmu_intel::BackendError),
    /// An AMD or Hygon PMU the AMD backend does not drive (PerfMonV2 with no counters,
    /// counters that do not fit the shared page).
    Amd(vpmu_amd::BackendError),
}

impl core::fmt::Display for SelectError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SelectError::UnknownVendor(vendor) => write!(
                f,
                "CPU vendor {vendor} has no vPMU backend (GenuineIntel, AuthenticAMD and \
                 HygonGenuine have)"
            ),
            SelectError::NoPmu { vendor } => {
                write!(f, "the {vendor:?} CPU advertises no PMU (CPUID leaf 0xA)")
            }
            SelectError::Intel(error) => write!(f, "Intel backend: {error}"),
            SelectError::Amd(error) => write!(f, "AMD backend: {error}"),
        }
    }
}

impl core::error::Error for SelectError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            SelectError::Intel(error) => Some(error),
            SelectError::Amd(error) => Some(error),
            SelectError::UnknownVendor(_) | SelectError::NoPmu { .. } => None,
        }
    }
}

impl VendorPmu {
    /// The backend for the PMU `reader`'s CPUID describes (raw-cpuid's `CpuIdReader`: the
    /// native `raw_cpuid::CpuIdReaderNative` on the host, a closure or a table for a
    /// software model). The vendor string of leaf 0 picks the backend; the vendor crate then
    /// enumerates (see the crate docs for every leaf read).
    ///
    /// `read_perf_capabilities` reads IA32_PERF_CAPABILITIES (MSR 0x345; `None` if the read
    /// faulted). It is called only for an Intel CPU whose CPUID.1:ECX.PDCM (bit 15) says the
    /// MSR exists, because reading it otherwise faults; an AMD host never calls it.
    pub fn from_cpuid<R: CpuIdReader>(
        reader: R,
        read_perf_capabilities: impl FnOnce() -> Option<u64>,
    ) -> Result<Self, SelectError> {
        let leaf_0 = reader.cpuid2(0, 0);
        let vendor_id = VendorId::from_leaf_0(leaf_0);
        match vendor_id.vendor() {
            Some(Vendor::Intel) => {
                let max_basic_leaf = leaf_0.eax;
                // Version 0 (EAX[7:0]) is how CPUID says "no architectural PMU".
                if max_basic_leaf < INTEL_PMU_LEAF
                    || reader.cpuid2(INTEL_PMU_LEAF, 0).eax & 0xff == 0
                {
                    return Err(SelectError::NoPmu {
                        vendor: Vendor::Intel,
                    });
                }
                let pdcm = reader.cpuid2(1, 0).ecx & CPUID_1_ECX_PDCM != 0;
                let perf_capabilities = if pdcm { read_perf_capabilities() } else { None };
                IntelPmu::from_cpuid(reader, perf_capabilities)
                    .map(VendorPmu::Intel)
                    .map_err(SelectError::Intel)
            }
            Some(Vendor::Amd) => AmdPmu::from_cpuid(reader)
                .map(VendorPmu::Amd)
                .map_err(SelectError::Amd),
            None => Err(SelectError::UnknownVendor(vendor_id)),
        }
    }
}
