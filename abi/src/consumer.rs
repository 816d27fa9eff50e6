//! The consumer's side: a guest profiler (or a profiling domain) reading its page.
//!
//! `PageView::new` checks the header before anything else is read; vendor contexts are
//! reached through `PageView::intel`/`PageView::amd`, which validate the bank offsets the
//! hypervisor wrote, and every bank access is bounds-checked. Nothing here panics.

use zerocopy::FromBytes;

use crate::error::AbiError;
use crate::page::{
    FlushRefusal, Header, Identity, Page, Regs, SampleInfo, XENPMU_DEFINED_SIZE_1_0,
    XENPMU_DEFINED_SIZE_1_2, XENPMU_FLAG_CACHED, XENPMU_FLAG_SAMPLE_REAL, XENPMU_FLAG_SAMPLE_USER,
    XENPMU_LVTPC_MASKED, XENPMU_MAGIC, XENPMU_PAGE_SIZE, XENPMU_VENDOR_AMD, XENPMU_VENDOR_INTEL,
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
    // An unknown vendor is not an error here: a later minor may add one, and the identity and
    // registers stay readable; only its vendor context is out of reach.
    Ok(())
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

    /// The sample details (timestamp, sequence number, overflowed counters, call chain), if
    /// the page's writer defines them (version 1.2 or later: `defined_size` at least
    /// `XENPMU_DEFINED_SIZE_1_2`); `None` for a page of an older minor.
    pub fn sample_info(&self) -> Option<SampleInfo> {
        (self.page.header.defined_size >= XENPMU_DEFINED_SIZE_1_2).then_some(self.page.sample)
    }

    /// Which register the last refused flush refused, and why (version 1.3), if the page's
    /// writer defines the report (`version_minor` at least 3; in older pages these bytes are
    /// reserved); read it after a flush failed with `-EIO`. A `reason` of
    /// `XENPMU_REFUSED_NONE` means no register was refused.
    pub fn flush_refusal(&self) -> Option<FlushRefusal> {
        (self.page.header.version_minor >= 3).then_some(self.page.flush_refusal)
    }

    /// Samples dropped because the previous one was still cached, since init.
    pub fn dropped_samples(&self) -> u64 {
        self.page.dropped_samples
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use zerocopy::{FromBytes, IntoBytes};

    use super::*;
    use crate::writer::{VendorLayout, init_page};
    use crate::{XENPMU_VENDOR_AREA_SIZE, XENPMU_VENDOR_CTXT_SIZE};

    fn intel_page() -> Page {
        let mut page = Page::zeroed();
        init_page(
            &mut page,
            &VendorLayout::Intel(IntelBanks::new(3, 4).unwrap()),
        );
        page
    }

    fn amd_page() -> Page {
        let mut page = Page::zeroed();
        init_page(&mut page, &VendorLayout::Amd(AmdBanks::new(6).unwrap()));
        page
    }

    #[test]
    fn valid_page_is_accepted() {
        let page = intel_page();
        let view = PageView::new(&page).unwrap();
        assert_eq!(view.minor(), crate::XENPMU_VERSION_MINOR);
        let intel = view.intel().unwrap();
        assert_eq!(
            (intel.banks().fixed_count(), intel.banks().arch_count()),
            (3, 4)
        );
        assert_eq!(intel.fixed_counter(2), Ok(0));
        assert!(!view.is_cached());
        assert_eq!(view.lvtpc(), XENPMU_LVTPC_MASKED);
    }

    #[test]
    fn wrong_magic_is_refused_before_anything_else() {
        let mut page = intel_page();
        page.header.magic = 0x1234_5678;
        page.header.version_major = 9;
        assert_eq!(
            PageView::new(&page).unwrap_err(),
            AbiError::BadMagic { found: 0x1234_5678 }
        );
        assert_eq!(Page::zeroed().header.magic, 0);
        assert!(matches!(
            PageView::new(&Page::zeroed()),
            Err(AbiError::BadMagic { found: 0 })
        ));
    }

    #[test]
    fn newer_minor_with_larger_defined_part_is_accepted() {
        let mut page = intel_page();
        page.header.version_minor = 7;
        page.header.defined_size = 2048;
        let view = PageView::new(&page).unwrap();
        assert_eq!(view.minor(), 7);
        assert!(view.intel().is_ok());
    }

    #[test]
    fn older_and_newer_majors_are_refused() {
        for major in [0, crate::XENPMU_VERSION_MAJOR + 1, u16::MAX] {
            let mut page = intel_page();
            page.header.version_major = major;
            assert_eq!(
                PageView::new(&page).unwrap_err(),
                AbiError::MajorMismatch { found: major }
            );
        }
    }

    #[test]
    fn bad_defined_sizes_are_refused() {
        for size in [0, XENPMU_DEFINED_SIZE_1_0 - 8, 4104, 1284, u32::MAX] {
            let mut page = intel_page();
            page.header.defined_size = size;
            assert_eq!(
                PageView::new(&page).unwrap_err(),
                AbiError::DefinedSizeInvalid { found: size }
            );
        }
    }

    #[test]
    fn unknown_vendor_keeps_the_sample_readable_but_not_the_context() {
        let mut page = intel_page();
        page.header.vendor = 3;
        page.regs.rip = 0x1234;
        let view = PageView::new(&page).unwrap();
        assert_eq!(view.regs().rip, 0x1234);
        let wrong = |expected| AbiError::WrongVendor { expected, found: 3 };
        assert_eq!(view.intel().unwrap_err(), wrong(XENPMU_VENDOR_INTEL));
        assert_eq!(view.amd().unwrap_err(), wrong(XENPMU_VENDOR_AMD));
    }

    #[test]
    fn wrong_vendors_are_refused() {
        let page = intel_page();
        let view = PageView::new(&page).unwrap();
        assert_eq!(
            view.amd().unwrap_err(),
            AbiError::WrongVendor {
                expected: XENPMU_VENDOR_AMD,
                found: XENPMU_VENDOR_INTEL
            }
        );
        let page = amd_page();
        assert!(PageView::new(&page).unwrap().intel().is_err());
        assert!(PageView::new(&page).unwrap().amd().is_ok());
    }

    fn with_intel_geometry(
        fixed_at: u32,
        fixed: u32,
        arch_at: u32,
        arch: u32,
    ) -> Result<(), AbiError> {
        let mut page = intel_page();
        let mut ctxt = page.vendor.intel_ctxt();
        ctxt.fixed_counters = fixed_at;
        ctxt.fixed_count = fixed;
        ctxt.arch_counters = arch_at;
        ctxt.arch_count = arch;
        page.vendor.set_intel_ctxt(&ctxt);
        PageView::new(&page)?.intel().map(|_| ())
    }

    #[test]
    fn bank_offsets_outside_the_vendor_area_are_refused() {
        let area = XENPMU_VENDOR_AREA_SIZE as u32;
        // Past the end, straddling the end, inside the fixed part, misaligned, absurd counts.
        assert!(matches!(
            with_intel_geometry(area, 1, 128, 1),
            Err(AbiError::BankOutOfBounds { .. })
        ));
        assert!(matches!(
            with_intel_geometry(64, 1, area - 8, 1),
            Err(AbiError::BankOutOfBounds { .. })
        ));
        assert!(matches!(
            with_intel_geometry(8, 1, 128, 1),
            Err(AbiError::BankOutOfBounds { .. })
        ));
        assert!(matches!(
            with_intel_geometry(65, 1, 128, 1),
            Err(AbiError::BankOutOfBounds { .. })
        ));
        assert!(matches!(
            with_intel_geometry(64, u32::MAX, 128, 1),
            Err(AbiError::BankOutOfBounds { .. })
        ));
        assert!(matches!(
            with_intel_geometry(u32::MAX, 1, 128, 1),
            Err(AbiError::BankOutOfBounds { .. })
        ));
        assert_eq!(
            with_intel_geometry(64, 4, 80, 1),
            Err(AbiError::BanksOverlap)
        );
        // Exactly filling the area is fine; empty banks anywhere in range are fine.
        assert_eq!(with_intel_geometry(64, 0, 64, (area - 64) / 16), Ok(()));
        assert_eq!(with_intel_geometry(area - 8, 1, 64, 0), Ok(()));
    }

    #[test]
    fn amd_bank_offsets_are_checked_too() {
        let mut page = amd_page();
        let mut ctxt = page.vendor.amd_ctxt();
        ctxt.ctrls = (XENPMU_VENDOR_AREA_SIZE - 16) as u32;
        page.vendor.set_amd_ctxt(&ctxt);
        assert!(matches!(
            PageView::new(&page).unwrap().amd(),
            Err(AbiError::BankOutOfBounds { .. })
        ));
        ctxt.ctrls = ctxt.counters + 8;
        page.vendor.set_amd_ctxt(&ctxt);
        assert_eq!(
            PageView::new(&page).unwrap().amd().unwrap_err(),
            AbiError::BanksOverlap
        );
    }

    #[test]
    fn indices_beyond_the_count_are_refused() {
        let page = amd_page();
        let view = PageView::new(&page).unwrap();
        let amd = view.amd().unwrap();
        assert_eq!(amd.counter(5), Ok(0));
        assert_eq!(
            amd.ctrl(6),
            Err(AbiError::IndexOutOfRange {
                bank: "amd ctrls",
                index: 6,
                count: 6
            })
        );
    }

    #[test]
    fn from_bytes_wants_one_aligned_page() {
        let page = intel_page();
        let bytes = page.as_bytes();
        assert!(PageView::from_bytes(bytes).is_ok());
        assert_eq!(
            PageView::from_bytes(&bytes[..100]).unwrap_err(),
            AbiError::NotAPage { len: 100 }
        );
        // An odd start address is refused rather than read unaligned.
        let words = [0u64; 513];
        let misaligned = &words.as_bytes()[1..4097];
        assert_eq!(
            PageView::from_bytes(misaligned).unwrap_err(),
            AbiError::NotAPage { len: 4096 }
        );
    }

    #[test]
    fn guest_edits_cannot_change_the_bank_geometry() {
        let mut page = intel_page();
        let mut view = PageViewMut::new(&mut page).unwrap();
        view.set_lvtpc_masked(false);
        view.edit_intel(|ctxt, banks, area| {
            ctxt.global_ctrl = 0x7;
            ctxt.fixed_counters = 999;
            ctxt.arch_count = 100;
            banks
                .set_pair(
                    area,
                    1,
                    CounterPair {
                        counter: 5,
                        control: 6,
                    },
                )
                .unwrap();
        })
        .unwrap();
        let view = PageView::new(&page).unwrap();
        assert_eq!(view.lvtpc() & XENPMU_LVTPC_MASKED, 0);
        let intel = view.intel().unwrap();
        assert_eq!(intel.ctxt().global_ctrl, 0x7);
        assert_eq!(intel.banks(), IntelBanks::new(3, 4).unwrap());
        assert_eq!(
            intel.pair(1),
            Ok(CounterPair {
                counter: 5,
                control: 6
            })
        );
        assert!(
            PageViewMut::new(&mut page)
                .unwrap()
                .edit_amd(|_, _, _| ())
                .is_err()
        );
    }

    proptest! {
        #[test]
        fn arbitrary_pages_never_panic(
            words in proptest::collection::vec(any::<u64>(), 512),
            make_header_valid in any::<bool>(),
            vendor in 0u32..4,
        ) {
            let mut page = Page::read_from_bytes(words.as_bytes()).unwrap();
            if make_header_valid {
                page.header.magic = XENPMU_MAGIC;
                page.header.version_major = XENPMU_VERSION_MAJOR;
                page.header.defined_size = XENPMU_DEFINED_SIZE_1_0;
                page.header.vendor = vendor;
            }
            if let Ok(view) = PageView::new(&page) {
                if let Ok(intel) = view.intel() {
                    let banks = intel.banks();
                    for i in 0..banks.fixed_count() as usize {
                        prop_assert!(intel.fixed_counter(i).is_ok());
                    }
                    for i in 0..banks.arch_count() as usize {
                        prop_assert!(intel.pair(i).is_ok());
                    }
                    prop_assert!(intel.fixed_counter(banks.fixed_count() as usize).is_err());
                }
                if let Ok(amd) = view.amd() {
                    for i in 0..amd.banks().count() as usize {
                        prop_assert!(amd.counter(i).is_ok() && amd.ctrl(i).is_ok());
                    }
                    prop_assert!(amd.ctrl(amd.banks().count() as usize).is_err());
                }
            }
        }

        #[test]
        fn geometry_is_accepted_exactly_when_banks_fit_and_are_disjoint(
            fixed_at in 0u32..1100, fixed in 0u32..140, arch_at in 0u32..1100, arch in 0u32..70,
        ) {
            let fits = |at: u32, count: u32, entry: u32| {
                at % 8 == 0 && at as usize >= XENPMU_VENDOR_CTXT_SIZE
                    && (at + count * entry) as usize <= XENPMU_VENDOR_AREA_SIZE
            };
            let (fixed_end, arch_end) = (fixed_at + 8 * fixed, arch_at + 16 * arch);
            let overlap = fixed > 0 && arch > 0 && fixed_at < arch_end && arch_at < fixed_end;
            let expected_ok = fits(fixed_at, fixed, 8) && fits(arch_at, arch, 16) && !overlap;
            prop_assert_eq!(with_intel_geometry(fixed_at, fixed, arch_at, arch).is_ok(), expected_ok);
        }
    }
}
