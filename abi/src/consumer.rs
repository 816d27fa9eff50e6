//! The consumer's side: a guest profiler (or a profiling domain) reading its page.
//!
//! `PageView::new` checks the header before anything else is read; vendor contexts are
//! reached through `PageView::intel`/`PageView::amd`, which validate the bank offsets the
//! hypervisor wrote, and every bank access is bounds-checked. Nothing here panics.

use zerocopy::FromBytes;

use crate::error::AbiError;
use crate::page::{
    Header, Identity, Page, Regs, XENPMU_DEFINED_SIZE_1_0, XENPMU_FLAG_CACHED,
    XENPMU_FLAG_SAMPLE_REAL, XENPMU_FLAG_SAMPLE_USER, XENPMU_LVTPC_MASKED, XENPMU_MAGIC,
    XENPMU_PAGE_SIZE, XENPMU_VENDOR_AMD, XENPMU_VENDOR_INTEL, XENPMU_VENDOR_NONE,
    XENPMU_VERSION_MAJOR,
};
use crate::vendor::{AmdBanks, AmdCtxt, CounterPair, IntelBanks, IntelCtxt, VendorArea};

/// Checks a header as a consumer must before reading anything else from the page.
pub fn check_header(header: &Header) -> Result<(), AbiError> {
    if header.magic != XENPMU_MAGIC {
        return Err(AbiError::BadMagic {
            found: header.magic,
        });
    }
    if header.version_major != XENPMU_VERSION_MAJOR {
        return Err(AbiError::MajorMismatch {
            found: header.version_major,
        });
    }
    let size = header.defined_size;
    if size < XENPMU_DEFINED_SIZE_1_0 || size as usize > XENPMU_PAGE_SIZE || size % 8 != 0 {
        return Err(AbiError::DefinedSizeInvalid { found: size });
    }
    match header.vendor {
        XENPMU_VENDOR_NONE | XENPMU_VENDOR_INTEL | XENPMU_VENDOR_AMD => Ok(()),
        found => Err(AbiError::UnknownVendor { found }),
    }
}

/// A page whose header has been checked.
#[derive(Clone, Copy, Debug)]
pub struct PageView<'a> {
    page: &'a Page,
}

impl<'a> PageView<'a> {
    /// Checks the page's header.
    pub fn new(page: &'a Page) -> Result<Self, AbiError> {
        check_header(&page.header)?;
        Ok(Self { page })
    }

    /// Views raw bytes as a page: exactly 4096 bytes, 8-byte aligned, with a valid header.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<Self, AbiError> {
        let page =
            Page::ref_from_bytes(bytes).map_err(|_| AbiError::NotAPage { len: bytes.len() })?;
        Self::new(page)
    }

    /// The header.
    pub fn header(&self) -> Header {
        self.page.header
    }

    /// The minor version of the hypervisor that wrote the page; fields a later minor added are
    /// meaningful only when this is at least that minor.
    pub fn minor(&self) -> u16 {
        self.page.header.version_minor
    }

    /// `pmu_flags`.
    pub fn flags(&self) -> u64 {
        self.page.pmu_flags
    }

    /// Whether a sample is pending (`XENPMU_FLAG_CACHED`).
    pub fn is_cached(&self) -> bool {
        self.page.pmu_flags & XENPMU_FLAG_CACHED != 0
    }

    /// Whether the sample was taken in user mode.
    pub fn sample_is_user(&self) -> bool {
        self.page.pmu_flags & XENPMU_FLAG_SAMPLE_USER != 0
    }

    /// Whether the sample was taken in real or virtual-8086 mode.
    pub fn sample_is_real_mode(&self) -> bool {
        self.page.pmu_flags & XENPMU_FLAG_SAMPLE_REAL != 0
    }

    /// The sample identity.
    pub fn identity(&self) -> Identity {
        self.page.identity
    }

    /// The sampled registers.
    pub fn regs(&self) -> Regs {
        self.page.regs
    }

    /// The guest's virtual LVTPC as stored in the page.
    pub fn lvtpc(&self) -> u32 {
        self.page.lapic_lvtpc
    }

    /// The Intel context; fails if the page holds another vendor's or invalid bank offsets.
    pub fn intel(&self) -> Result<IntelView<'a>, AbiError> {
        expect_vendor(&self.page.header, XENPMU_VENDOR_INTEL)?;
        let ctxt = self.page.vendor.intel_ctxt();
        let banks = IntelBanks::from_ctxt(&ctxt)?;
        Ok(IntelView {
            ctxt,
            banks,
            area: &self.page.vendor,
        })
    }

    /// The AMD context; fails if the page holds another vendor's or invalid bank offsets.
    pub fn amd(&self) -> Result<AmdView<'a>, AbiError> {
        expect_vendor(&self.page.header, XENPMU_VENDOR_AMD)?;
        let ctxt = self.page.vendor.amd_ctxt();
        let banks = AmdBanks::from_ctxt(&ctxt)?;
        Ok(AmdView {
            ctxt,
            banks,
            area: &self.page.vendor,
        })
    }
}

fn expect_vendor(header: &Header, expected: u32) -> Result<(), AbiError> {
    if header.vendor != expected {
        return Err(AbiError::WrongVendor {
            expected,
            found: header.vendor,
        });
    }
    Ok(())
}

/// An Intel context read from a checked page.
#[derive(Clone, Copy, Debug)]
pub struct IntelView<'a> {
    ctxt: IntelCtxt,
    banks: IntelBanks,
    area: &'a VendorArea,
}

impl IntelView<'_> {
    /// The fixed part (global registers, bank geometry).
    pub fn ctxt(&self) -> IntelCtxt {
        self.ctxt
    }

    /// The validated bank layout.
    pub fn banks(&self) -> IntelBanks {
        self.banks
    }

    /// Fixed counter `index`.
    pub fn fixed_counter(&self, index: usize) -> Result<u64, AbiError> {
        self.banks.fixed_counter(self.area, index)
    }

    /// GP counter/control pair `index`.
    pub fn pair(&self, index: usize) -> Result<CounterPair, AbiError> {
        self.banks.pair(self.area, index)
    }
}

/// An AMD context read from a checked page.
#[derive(Clone, Copy, Debug)]
pub struct AmdView<'a> {
    ctxt: AmdCtxt,
    banks: AmdBanks,
    area: &'a VendorArea,
}

impl AmdView<'_> {
    /// The fixed part (PerfMonV2 globals, bank geometry).
    pub fn ctxt(&self) -> AmdCtxt {
        self.ctxt
    }

    /// The validated bank layout.
    pub fn banks(&self) -> AmdBanks {
        self.banks
    }

    /// Counter `index` (PERF_CTRn).
    pub fn counter(&self, index: usize) -> Result<u64, AbiError> {
        self.banks.counter(self.area, index)
    }

    /// Control `index` (PERF_CTLn).
    pub fn ctrl(&self, index: usize) -> Result<u64, AbiError> {
        self.banks.ctrl(self.area, index)
    }
}

/// A checked page the consumer may edit: the LVTPC, and the vendor context inside the cached
/// window. Hypervisor-owned words (header, identity, flags, registers, bank geometry) are not
/// writable through it.
#[derive(Debug)]
pub struct PageViewMut<'a> {
    page: &'a mut Page,
}

impl<'a> PageViewMut<'a> {
    /// Checks the page's header.
    pub fn new(page: &'a mut Page) -> Result<Self, AbiError> {
        check_header(&page.header)?;
        Ok(Self { page })
    }

    /// A read-only view of the same page.
    pub fn view(&self) -> PageView<'_> {
        PageView { page: self.page }
    }

    /// Sets or clears the LVTPC mask bit; the other bits of the stored value are kept. Takes
    /// effect at the next lvtpc_set or flush operation.
    pub fn set_lvtpc_masked(&mut self, masked: bool) {
        if masked {
            self.page.lapic_lvtpc |= XENPMU_LVTPC_MASKED;
        } else {
            self.page.lapic_lvtpc &= !XENPMU_LVTPC_MASKED;
        }
    }

    /// Edits the Intel context. `edit` receives the fixed part and the bank accessors; the
    /// bank-geometry words are restored afterwards, whatever `edit` did to them.
    pub fn edit_intel<R>(
        &mut self,
        edit: impl FnOnce(&mut IntelCtxt, &IntelBanks, &mut VendorArea) -> R,
    ) -> Result<R, AbiError> {
        expect_vendor(&self.page.header, XENPMU_VENDOR_INTEL)?;
        let mut ctxt = self.page.vendor.intel_ctxt();
        let banks = IntelBanks::from_ctxt(&ctxt)?;
        let result = edit(&mut ctxt, &banks, &mut self.page.vendor);
        banks.describe_in(&mut ctxt);
        self.page.vendor.set_intel_ctxt(&ctxt);
        Ok(result)
    }

    /// Edits the AMD context; as `edit_intel`.
    pub fn edit_amd<R>(
        &mut self,
        edit: impl FnOnce(&mut AmdCtxt, &AmdBanks, &mut VendorArea) -> R,
    ) -> Result<R, AbiError> {
        expect_vendor(&self.page.header, XENPMU_VENDOR_AMD)?;
        let mut ctxt = self.page.vendor.amd_ctxt();
        let banks = AmdBanks::from_ctxt(&ctxt)?;
        let result = edit(&mut ctxt, &banks, &mut self.page.vendor);
        banks.describe_in(&mut ctxt);
        self.page.vendor.set_amd_ctxt(&ctxt);
        Ok(result)
    }
}
