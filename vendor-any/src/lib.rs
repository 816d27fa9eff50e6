//! # vpmu-vendor-any: one backend for either vendor, chosen at run time
//!
//! The core is generic over its backend ([`vpmu::Vpmu<B>`], [`vpmu::PcpuPmu<C, H>`],
//! [`vpmu::VcpuPmu<C>`], [`vpmu::VcpuTable<C>`]), and a hypervisor binary that boots on Intel
//! and AMD hosts learns which one it runs on only from CPUID. [`VendorPmu`] is an enum over
//! both vendor backends that implements [`vpmu::PmuBackend`] by delegation, with
//! [`VendorContext`] as its context, so that such a hypervisor writes its integration once,
//! against `Vpmu<VendorPmu>`, `PcpuPmu<VendorContext, H>` and `VcpuPmu<VendorContext>`: no
//! enum of its own, no glue compiled twice. [`VendorPmu::from_cpuid`] picks the backend from
//! the CPU's vendor string and says why when it cannot ([`SelectError`]).
//!
//! The cost is one match on the vendor per backend call (the vendor backends' own code is
//! unchanged); a hypervisor built for one vendor only can still use `vpmu-intel` or `vpmu-amd`
//! directly.
//!
//! ```
//! use vpmu::{Mode, PmuBackend, Vendor, Vpmu};
//! use vpmu_vendor_any::raw_cpuid::CpuIdResult;
//! use vpmu_vendor_any::{SelectError, VendorPmu};
//!
//! // On the host this is `raw_cpuid::CpuIdReaderNative`; here, the CPUID of an AMD CPU with
//! // PerfMonV2 and 6 core counters, as a closure over (leaf, subleaf).
//! let amd = |leaf: u32, _subleaf: u32| match leaf {
//!     // Highest basic leaf, and "AuthenticAMD" in EBX, EDX, ECX.
//!     0 => CpuIdResult { eax: 0x10, ebx: 0x6874_7541, edx: 0x6974_6e65, ecx: 0x444d_4163 },
//!     // Highest extended leaf: 0x8000_0022 exists.
//!     0x8000_0000 => CpuIdResult { eax: 0x8000_0022, ebx: 0, ecx: 0, edx: 0 },
//!     // PerfCtrExtCore (ECX bit 23).
//!     0x8000_0001 => CpuIdResult { eax: 0, ebx: 0, ecx: 1 << 23, edx: 0 },
//!     // PerfMonV2 (EAX bit 0) with 6 core counters (EBX[3:0]).
//!     0x8000_0022 => CpuIdResult { eax: 1, ebx: 6, ecx: 0, edx: 0 },
//!     _ => CpuIdResult { eax: 0, ebx: 0, ecx: 0, edx: 0 },
//! };
//! // IA32_PERF_CAPABILITIES would be read here, on an Intel CPU that has it.
//! let backend = VendorPmu::from_cpuid(amd, || None)?;
//! assert_eq!(backend.vendor(), Vendor::Amd);
//! assert_eq!(backend.capabilities().gp_counters, 6);
//!
//! // One vPMU type whatever the vendor: a hypervisor of 2 pCPUs in self mode.
//! let vpmu: Vpmu<VendorPmu> = Vpmu::new(backend, Mode::SelfProfiling, 2);
//! assert!(vpmu.backend().as_amd().is_some());
//!
//! // A CPU neither backend drives is refused with its vendor string.
//! let other = |leaf: u32, _: u32| match leaf {
//!     0 => CpuIdResult { eax: 0x10, ebx: 0x746e_6543, edx: 0x4872_7561, ecx: 0x736c_7561 },
//!     _ => CpuIdResult { eax: 0, ebx: 0, ecx: 0, edx: 0 },
//! };
//! let refused = VendorPmu::from_cpuid(other, || None).unwrap_err();
//! assert!(matches!(refused, SelectError::UnknownVendor(id) if id.as_str() == Some("CentaurHauls")));
//! # Ok::<(), SelectError>(())
//! ```
//!
//! ## CPUID read
//!
//! Everything goes through the `CpuIdReader` given to [`VendorPmu::from_cpuid`]; nothing
//! else is read but IA32_PERF_CAPABILITIES, through the closure given, and only when CPUID
//! says it exists.
//!
//! | leaf (subleaf 0) | register, bits | read by | for |
//! |---|---|---|---|
//! | 0 | EBX, EDX, ECX | this crate, and raw-cpuid in both vendor crates | the vendor string that picks the backend |
//! | 0 | EAX | this crate (Intel), raw-cpuid | the highest basic leaf: 0xA absent below it (no PMU) |
//! | 0xA | `EAX[7:0]` | this crate (Intel) | version 0 means no PMU |
//! | 1 | `ECX[15]` (PDCM) | this crate (Intel) | whether to read IA32_PERF_CAPABILITIES |
//! | 1, 0xA, 0x8000_0000 (Intel); 0x8000_0000, 0x8000_0001, 0x8000_0022 (AMD) | | the vendor crate | the enumeration: see the crate docs of [`vpmu_intel`] and [`vpmu_amd`] |
//!
//! ## Context ownership
//!
//! A [`VendorContext`] belongs to the backend that made it. The core never hands a backend
//! another's; a backend that is handed the other vendor's context or register anyway (an
//! integration bug) answers without panicking and without touching the hardware: a fault
//! naming [`FOREIGN_STATE_MSR`] where the method can fail (the core's entry points then return
//! `CoreError::Fault`), else a context that counts nothing.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod backend;
mod select;
mod snapshot;

pub use backend::{FOREIGN_STATE_MSR, VendorContext, VendorRegister};
pub use select::{SelectError, VendorId};

/// The CPUID reader crate the constructors take (`raw_cpuid::CpuIdReaderNative` on the host,
/// `raw_cpuid::CpuIdResult` for a table), re-exported so that an integrator uses the same
/// version.
pub use raw_cpuid;
/// The core, re-exported: `Vpmu<VendorPmu>` and everything around it.
pub use vpmu;
/// The AMD backend, re-exported for [`VendorPmu::Amd`] and its types.
pub use vpmu_amd;
/// The Intel backend, re-exported for [`VendorPmu::Intel`] and its types.
pub use vpmu_intel;

use vpmu::{PmuBackend, Vendor};
use vpmu_amd::AmdPmu;
use vpmu_intel::IntelPmu;

/// The backend of whichever vendor the CPU is: the core's [`vpmu::PmuBackend`] by delegation.
/// Build it with [`VendorPmu::from_cpuid`], or wrap a vendor backend built explicitly.
#[derive(Clone, Debug)]
pub enum VendorPmu {
    /// The Intel architectural-PMU backend.
    Intel(IntelPmu),
    /// The AMD (and Hygon) core-PMU backend.
    Amd(AmdPmu),
}

impl VendorPmu {
    /// The vendor.
    pub fn vendor(&self) -> Vendor {
        self.capabilities().vendor
    }

    /// The Intel backend, if this is one.
    pub fn as_intel(&self) -> Option<&IntelPmu> {
        match self {
            VendorPmu::Intel(pmu) => Some(pmu),
            VendorPmu::Amd(_) => None,
        }
    }

    /// The AMD backend, if this is one.
    pub fn as_amd(&self) -> Option<&AmdPmu> {
        match self {
            VendorPmu::Amd(pmu) => Some(pmu),
            VendorPmu::Intel(_) => None,
        }
    }
}

impl From<IntelPmu> for VendorPmu {
    fn from(pmu: IntelPmu) -> Self {
        VendorPmu::Intel(pmu)
    }
}

impl From<AmdPmu> for VendorPmu {
    fn from(pmu: AmdPmu) -> Self {
        VendorPmu::Amd(pmu)
    }
}
