//! The hypervisor's side: initialising a page, publishing a sample, and taking a guest-edited
//! vendor area for verification.
//!
//! The hypervisor keeps its own `VendorLayout` (computed from the enumerated counters) and never
//! reads the header or the bank-geometry words back from the page: the guest can write them.

use zerocopy::IntoBytes;

use crate::page::{
    FlushRefusal, Header, Identity, Page, Regs, SampleInfo, XENPMU_CALLCHAIN_MAX,
    XENPMU_DEFINED_SIZE_1_2, XENPMU_FLAG_CACHED, XENPMU_FLAG_SAMPLE_REAL, XENPMU_FLAG_SAMPLE_USER,
    XENPMU_LVTPC_MASKED, XENPMU_MAGIC, XENPMU_REGS_MODE_REAL, XENPMU_REGS_MODE_USER,
    XENPMU_VENDOR_AMD, XENPMU_VENDOR_INTEL, XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR,
};
use crate::vendor::{AmdBanks, AmdCtxt, IntelBanks, IntelCtxt, VendorArea};

/// The hypervisor's own record of where the banks are in a page it initialised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VendorLayout {
    /// Intel context with these banks.
    Intel(IntelBanks),
    /// AMD context with these banks.
    Amd(AmdBanks),
}

impl VendorLayout {
    /// Words at the start of the vendor area that the layout uses (the fixed part and the
    /// banks); the hypervisor reads nothing after them.
    pub fn used_words(&self) -> usize {
        let end = match self {
            VendorLayout::Intel(banks) => banks.end(),
            VendorLayout::Amd(banks) => banks.end(),
        };
        end.div_ceil(core::mem::size_of::<u64>())
    }

    /// The `XENPMU_VENDOR_*` value for the header.
    pub fn vendor_id(&self) -> u32 {
        match self {
            VendorLayout::Intel(_) => XENPMU_VENDOR_INTEL,
            VendorLayout::Amd(_) => XENPMU_VENDOR_AMD,
        }
    }
}

/// The header this crate's version writes.
pub fn current_header(layout: &VendorLayout) -> Header {
    Header {
        magic: XENPMU_MAGIC,
        version_major: XENPMU_VERSION_MAJOR,
        version_minor: XENPMU_VERSION_MINOR,
        defined_size: XENPMU_DEFINED_SIZE_1_2,
        vendor: layout.vendor_id(),
    }
}

/// Initialises a freshly registered page: zeroes it, writes the header and the bank geometry,
/// and sets the virtual LVTPC masked (no PMI until the guest unmasks it).
pub fn init_page(page: &mut Page, layout: &VendorLayout) {
    *page = Page::zeroed();
    page.header = current_header(layout);
    page.lapic_lvtpc = XENPMU_LVTPC_MASKED;
    match layout {
        VendorLayout::Intel(banks) => {
            let mut ctxt = IntelCtxt::default();
            banks.describe_in(&mut ctxt);
            page.vendor.set_intel_ctxt(&ctxt);
        }
        VendorLayout::Amd(banks) => {
            let mut ctxt = AmdCtxt::default();
            banks.describe_in(&mut ctxt);
            page.vendor.set_amd_ctxt(&ctxt);
        }
    }
}

/// Records in the page which register a flush refused and why (version 1.3): written at each
/// flush that fails verification, before the operation returns `-EIO`.
pub fn set_flush_refusal(page: &mut Page, refusal: FlushRefusal) {
    page.flush_refusal = refusal;
}

/// The `pmu_flags` sample bits that go with `regs.mode`, so that the two never disagree.
pub fn sample_flags(regs: &Regs) -> u64 {
    let mut flags = 0;
    if regs.mode & XENPMU_REGS_MODE_USER != 0 {
        flags |= XENPMU_FLAG_SAMPLE_USER;
    }
    if regs.mode & XENPMU_REGS_MODE_REAL != 0 {
        flags |= XENPMU_FLAG_SAMPLE_REAL;
    }
    flags
}

/// Publishes a sample: identity and registers, then `pmu_flags` with `XENPMU_FLAG_CACHED`.
/// The vendor context must already be in `page.vendor`. The caller raises the PMU VIRQ after
/// this returns; interrupt delivery orders these stores before the consumer's reads.
#[inline]
pub fn publish_sample(page: &mut Page, identity: &Identity, regs: &Regs) {
    page.identity = *identity;
    // Two fixed-size halves: each compiles to a few vector moves in place, where the whole
    // (above the compiler's inline-copy threshold) would be a library copy call.
    let (to, from) = (page.regs.as_mut_bytes(), regs.as_bytes());
    let half = core::mem::size_of::<Regs>() / 2;
    let ((to_low, to_high), (from_low, from_high)) = (to.split_at_mut(half), from.split_at(half));
    to_low.copy_from_slice(from_low);
    to_high.copy_from_slice(from_high);
    page.pmu_flags = sample_flags(regs) | XENPMU_FLAG_CACHED;
}

/// Records the TSC frequency in a freshly initialised page (`SampleInfo::tsc_khz`), so that a
/// consumer can convert timestamps before the first sample arrives.
pub fn set_tsc_khz(page: &mut Page, tsc_khz: u64) {
    page.sample.tsc_khz = tsc_khz;
}

/// Writes the sample details (version 1.2). Call it before [`publish_sample`], which sets
/// `XENPMU_FLAG_CACHED` last.
pub fn publish_sample_info(page: &mut Page, info: &SampleInfo) {
    page.sample = *info;
}

/// The details of a sample besides its call chain (version 1.2): see [`SampleInfo`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleHead {
    /// `SampleInfo::tsc`.
    pub tsc: u64,
    /// `SampleInfo::tsc_khz`.
    pub tsc_khz: u64,
    /// `SampleInfo::sequence`.
    pub sequence: u64,
    /// `SampleInfo::overflowed`.
    pub overflowed: u64,
}

/// Writes the sample details (version 1.2) straight into the page: `head`, then the call
/// chain `chain` (its first `XENPMU_CALLCHAIN_MAX` entries) and why it ends, `chain_end`.
/// Entries past the chain must read zero, and clearing all of them with every sample would
/// cost more than the chain itself: `stale` is how many entries the hypervisor's previous
/// sample in this page wrote (what this function returned then; 0 for a page fresh from
/// [`init_page`]), and only those past the new chain are cleared. The hypervisor keeps that
/// count itself, never reading the page's `chain_len` back. Returns the new chain's length.
/// Call it before [`publish_sample`], which sets `XENPMU_FLAG_CACHED` last.
#[inline]
pub fn publish_sample_details(
    page: &mut Page,
    head: &SampleHead,
    chain: &[u64],
    chain_end: u32,
    stale: u32,
) -> u32 {
    let info = &mut page.sample;
    info.tsc = head.tsc;
    info.tsc_khz = head.tsc_khz;
    info.sequence = head.sequence;
    info.overflowed = head.overflowed;
    let chain = chain.get(..XENPMU_CALLCHAIN_MAX).unwrap_or(chain);
    let (valid, past) = info.callchain.split_at_mut(chain.len());
    // A platform that cannot read the sampled memory gives every sample an empty chain: no
    // copy call for nothing.
    if !chain.is_empty() {
        valid.copy_from_slice(chain);
    }
    let stale = (stale as usize).min(XENPMU_CALLCHAIN_MAX);
    if stale > chain.len() {
        if let Some(stale) = past.get_mut(..stale - chain.len()) {
            stale.fill(0);
        }
    }
    info.chain_len = chain.len() as u32;
    info.chain_end = chain_end;
    info._reserved0 = [0; 4];
    chain.len() as u32
}

/// Counts a sample dropped because the page's previous sample was still cached.
pub fn record_dropped_sample(page: &mut Page) {
    page.dropped_samples = page.dropped_samples.wrapping_add(1);
}

/// Ends the cached window in the page (after a successful flush).
pub fn clear_cached(page: &mut Page) {
    page.pmu_flags &= !XENPMU_FLAG_CACHED;
}

/// Copies the vendor area out of a page the guest can write, for verification; the copy is
/// what the hypervisor checks and loads, so a guest changing the page afterwards changes
/// nothing.
pub fn copy_vendor_area(page: &Page) -> VendorArea {
    page.vendor.clone()
}

/// Copies the first `words` words of the vendor area (a layout's
/// [`VendorLayout::used_words`]) out of a page the guest can write, into `into`, for
/// verification, as [`copy_vendor_area`] does for the whole area: the copy is what the
/// hypervisor checks and loads. The rest of `into` is left as it was; nothing addressed
/// through the layout lies there. A hot path that keeps its `into` from call to call (and
/// wipes it with [`clear_vendor_words`]) copies a few hundred bytes instead of moving the
/// whole area. Inlined: a flush calls it once, a library call (the copy's own) in its place.
#[inline]
pub fn copy_vendor_words(page: &Page, words: usize, into: &mut VendorArea) {
    let used = words.min(into.words.len());
    if let (Some(to), Some(from)) = (into.words.get_mut(..used), page.vendor.words.get(..used)) {
        to.copy_from_slice(from);
    }
}

/// Zeroes the first `words` words of a copy made by [`copy_vendor_words`], once it has been
/// verified: a copy kept from call to call then holds no guest data between calls. Inlined,
/// as [`copy_vendor_words`].
#[inline]
pub fn clear_vendor_words(copy: &mut VendorArea, words: usize) {
    let used = words.min(copy.words.len());
    if let Some(words) = copy.words.get_mut(..used) {
        words.fill(0);
    }
}

/// Whether the guest asked for the LVTPC to be masked (the only bit it controls).
pub fn guest_lvtpc_masked(lapic_lvtpc: u32) -> bool {
    lapic_lvtpc & XENPMU_LVTPC_MASKED != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::PageView;
    use crate::page::{XENPMU_REGS_MODE_32, XENPMU_REGS_MODE_64};
    use crate::vendor::CounterPair;

    #[test]
    fn init_writes_header_geometry_and_a_masked_lvtpc() {
        let mut page = Page::zeroed();
        page.pmu_flags = 0xff;
        page._reserved1[7] = 1;
        let banks = IntelBanks::new(4, 8).unwrap();
        init_page(&mut page, &VendorLayout::Intel(banks));
        assert_eq!(page.header, current_header(&VendorLayout::Intel(banks)));
        assert_eq!(page.header.vendor, XENPMU_VENDOR_INTEL);
        assert_eq!(
            (page.pmu_flags, page._reserved1[7]),
            (0, 0),
            "init zeroes the page"
        );
        assert!(guest_lvtpc_masked(page.lapic_lvtpc));
        let ctxt = page.vendor.intel_ctxt();
        assert_eq!(
            (
                ctxt.fixed_counters,
                ctxt.fixed_count,
                ctxt.arch_counters,
                ctxt.arch_count
            ),
            (64, 4, 96, 8)
        );
        assert_eq!(
            PageView::new(&page).unwrap().intel().unwrap().banks(),
            banks
        );
    }

    #[test]
    fn canonical_amd_geometry() {
        let mut page = Page::zeroed();
        init_page(&mut page, &VendorLayout::Amd(AmdBanks::new(6).unwrap()));
        let ctxt = page.vendor.amd_ctxt();
        assert_eq!(
            (ctxt.counters, ctxt.ctrls, ctxt.counter_count),
            (64, 112, 6)
        );
        assert_eq!(page.header.vendor, XENPMU_VENDOR_AMD);
    }

    #[test]
    fn counters_that_do_not_fit_are_refused() {
        // 64 + 8*4 + 16*60 = 1056 > 1024.
        assert!(IntelBanks::new(4, 60).is_err());
        assert!(IntelBanks::new(4, 58).is_ok());
        assert!(AmdBanks::new(120).is_err());
        assert!(AmdBanks::new(60).is_ok());
        assert!(IntelBanks::new(u32::MAX, u32::MAX).is_err());
    }

    #[test]
    fn published_sample_flags_follow_the_register_mode() {
        let mut page = Page::zeroed();
        init_page(&mut page, &VendorLayout::Amd(AmdBanks::new(4).unwrap()));
        let identity = Identity {
            domain_id: 7,
            vcpu_id: 1,
            pcpu_id: 1,
            _pad0: 0,
        };
        let kernel = Regs {
            rip: 0xffff_8000_0000_1000,
            mode: XENPMU_REGS_MODE_64,
            ..Regs::default()
        };
        publish_sample(&mut page, &identity, &kernel);
        assert_eq!(page.pmu_flags, XENPMU_FLAG_CACHED);
        let user = Regs {
            mode: XENPMU_REGS_MODE_32 | XENPMU_REGS_MODE_USER,
            cpl: 3,
            ..Regs::default()
        };
        publish_sample(&mut page, &identity, &user);
        assert_eq!(page.pmu_flags, XENPMU_FLAG_CACHED | XENPMU_FLAG_SAMPLE_USER);
        let real = Regs {
            mode: XENPMU_REGS_MODE_REAL,
            ..Regs::default()
        };
        publish_sample(&mut page, &identity, &real);
        assert_eq!(page.pmu_flags, XENPMU_FLAG_CACHED | XENPMU_FLAG_SAMPLE_REAL);
        // Every register arrives, both halves of the copy.
        let mut every = Regs::default();
        for (i, byte) in every.as_mut_bytes().iter_mut().enumerate() {
            *byte = i as u8 | 1;
        }
        publish_sample(&mut page, &identity, &every);
        assert_eq!(page.regs, every);
        publish_sample(&mut page, &identity, &real);
        clear_cached(&mut page);
        assert_eq!(page.pmu_flags, XENPMU_FLAG_SAMPLE_REAL);
        record_dropped_sample(&mut page);
        record_dropped_sample(&mut page);
        assert_eq!(PageView::new(&page).unwrap().dropped_samples(), 2);
        assert_eq!(page.identity, identity);
    }

    #[test]
    fn the_used_copy_takes_the_fixed_part_and_every_bank_entry_and_nothing_after() {
        let intel = IntelBanks::new(4, 8).unwrap();
        let amd = AmdBanks::new(6).unwrap();
        // 64-byte fixed part, then 4 words and 8 pairs; then 6 counters and 6 controls.
        assert_eq!(VendorLayout::Intel(intel).used_words(), 28);
        assert_eq!(VendorLayout::Amd(amd).used_words(), 20);
        assert_eq!(
            VendorLayout::Intel(IntelBanks::new(0, 0).unwrap()).used_words(),
            8
        );
        for layout in [VendorLayout::Intel(intel), VendorLayout::Amd(amd)] {
            let mut page = Page::zeroed();
            init_page(&mut page, &layout);
            for (i, word) in (1u64..).zip(page.vendor.words.iter_mut()) {
                *word = i;
            }
            let mut copy = VendorArea::default();
            copy_vendor_words(&page, layout.used_words(), &mut copy);
            let used = layout.used_words();
            assert_eq!(copy.words[..used], page.vendor.words[..used]);
            assert!(copy.words[used..].iter().all(|&w| w == 0));
            let mut wiped = copy.clone();
            clear_vendor_words(&mut wiped, used);
            assert_eq!(wiped, VendorArea::default());
            match layout {
                VendorLayout::Intel(banks) => {
                    let fixed = banks.fixed_bank(&copy).unwrap();
                    let arch = banks.arch_bank(&copy).unwrap();
                    assert_eq!((fixed.len(), arch.len()), (4, 8));
                    for (i, &value) in fixed.iter().enumerate() {
                        assert_eq!(banks.fixed_counter(&copy, i), Ok(value));
                    }
                    for (i, &pair) in arch.iter().enumerate() {
                        assert_eq!(banks.pair(&copy, i), Ok(pair));
                    }
                }
                VendorLayout::Amd(banks) => {
                    let counters = banks.counter_bank(&copy).unwrap();
                    let ctrls = banks.ctrl_bank(&copy).unwrap();
                    assert_eq!((counters.len(), ctrls.len()), (6, 6));
                    for i in 0..6 {
                        assert_eq!(banks.counter(&copy, i), Ok(counters[i]));
                        assert_eq!(banks.ctrl(&copy, i), Ok(ctrls[i]));
                    }
                }
            }
        }
    }

    #[test]
    fn the_vendor_copy_is_detached_from_the_page() {
        let mut page = Page::zeroed();
        let banks = IntelBanks::new(3, 8).unwrap();
        init_page(&mut page, &VendorLayout::Intel(banks));
        banks
            .set_pair(
                &mut page.vendor,
                7,
                CounterPair {
                    counter: 1,
                    control: 2,
                },
            )
            .unwrap();
        let copy = copy_vendor_area(&page);
        banks
            .set_pair(
                &mut page.vendor,
                7,
                CounterPair {
                    counter: 9,
                    control: 9,
                },
            )
            .unwrap();
        assert_eq!(
            banks.pair(&copy, 7),
            Ok(CounterPair {
                counter: 1,
                control: 2
            })
        );
    }

    #[test]
    fn banks_set_at_once_match_entry_by_entry() {
        let intel = IntelBanks::new(3, 8).unwrap();
        let (fixed, counters, controls) = ([1, 2, 3, 4], [10u64; 9], [20u64; 9]);
        let mut at_once = VendorArea::default();
        intel.set_banks(&mut at_once, &fixed, &counters[..8], &controls[..8]);
        let mut one_by_one = VendorArea::default();
        for (i, &value) in fixed.iter().enumerate().take(3) {
            intel.set_fixed_counter(&mut one_by_one, i, value).unwrap();
        }
        for (i, (&counter, &control)) in counters.iter().zip(&controls).enumerate().take(8) {
            let pair = CounterPair { counter, control };
            intel.set_pair(&mut one_by_one, i, pair).unwrap();
        }
        assert_eq!(at_once, one_by_one);
        // Fewer values than entries: only those are written.
        let mut short = VendorArea::default();
        intel.set_banks(&mut short, &fixed[..1], &counters[..2], &controls[..1]);
        assert_eq!(intel.fixed_counter(&short, 1), Ok(0));
        assert_eq!(intel.pair(&short, 0).unwrap().control, 20);
        assert_eq!(intel.pair(&short, 1), Ok(CounterPair::default()));

        let amd = AmdBanks::new(6).unwrap();
        let mut at_once = VendorArea::default();
        amd.set_banks(&mut at_once, &counters, &controls);
        let mut one_by_one = VendorArea::default();
        for (i, (&counter, &control)) in counters.iter().zip(&controls).enumerate().take(6) {
            amd.set_counter(&mut one_by_one, i, counter).unwrap();
            amd.set_ctrl(&mut one_by_one, i, control).unwrap();
        }
        assert_eq!(at_once, one_by_one);
    }

    #[test]
    fn details_written_in_place_clear_what_the_previous_chain_left() {
        let mut page = Page::zeroed();
        init_page(&mut page, &VendorLayout::Amd(AmdBanks::new(6).unwrap()));
        let head = SampleHead {
            tsc: 5,
            tsc_khz: 1000,
            sequence: 3,
            overflowed: 1,
        };
        let long: [u64; 5] = [1, 2, 3, 4, 5];
        let stale =
            publish_sample_details(&mut page, &head, &long, crate::XENPMU_CHAIN_COMPLETE, 0);
        assert_eq!(stale, 5);
        let mut expected = SampleInfo {
            tsc: 5,
            tsc_khz: 1000,
            sequence: 3,
            overflowed: 1,
            chain_len: 5,
            chain_end: crate::XENPMU_CHAIN_COMPLETE,
            ..SampleInfo::default()
        };
        expected.callchain[..5].copy_from_slice(&long);
        assert_eq!(page.sample, expected);
        // A shorter chain: the entries past it that the previous one wrote read zero again.
        let stale = publish_sample_details(
            &mut page,
            &head,
            &[9, 8],
            crate::XENPMU_CHAIN_UNREADABLE,
            stale,
        );
        assert_eq!(stale, 2);
        expected.callchain = [0; XENPMU_CALLCHAIN_MAX];
        expected.callchain[..2].copy_from_slice(&[9, 8]);
        expected.chain_len = 2;
        expected.chain_end = crate::XENPMU_CHAIN_UNREADABLE;
        assert_eq!(page.sample, expected);
        // No chain at all, and a chain longer than the page holds: truncated, never past it.
        assert_eq!(
            publish_sample_details(&mut page, &head, &[], crate::XENPMU_CHAIN_NONE, stale),
            0
        );
        assert_eq!(page.sample.callchain, [0; XENPMU_CALLCHAIN_MAX]);
        let too_long = [7u64; XENPMU_CALLCHAIN_MAX + 3];
        let stale = publish_sample_details(
            &mut page,
            &head,
            &too_long,
            crate::XENPMU_CHAIN_TRUNCATED,
            u32::MAX,
        );
        assert_eq!(stale as usize, XENPMU_CALLCHAIN_MAX);
        assert_eq!(page.sample.callchain, [7; XENPMU_CALLCHAIN_MAX]);
    }

    #[test]
    fn sample_details_round_trip_and_need_a_1_2_page() {
        let mut page = Page::zeroed();
        init_page(&mut page, &VendorLayout::Amd(AmdBanks::new(6).unwrap()));
        set_tsc_khz(&mut page, 2_596_000);
        let mut info = SampleInfo {
            tsc: 123_456,
            tsc_khz: 2_596_000,
            sequence: 7,
            overflowed: 1 << 2,
            chain_len: 2,
            chain_end: crate::XENPMU_CHAIN_COMPLETE,
            ..SampleInfo::default()
        };
        info.callchain[..2].copy_from_slice(&[0x40_1000, 0x40_2000]);
        publish_sample_info(&mut page, &info);
        publish_sample(&mut page, &Identity::default(), &Regs::default());
        let view = PageView::new(&page).unwrap();
        let read = view.sample_info().expect("a 1.2 page has sample details");
        assert_eq!(read, info);
        assert_eq!(read.chain(), &[0x40_1000, 0x40_2000]);
        // A page of an older minor defines no details.
        page.header.defined_size = crate::XENPMU_DEFINED_SIZE_1_0;
        assert_eq!(PageView::new(&page).unwrap().sample_info(), None);
        // A lying chain_len never reads past the array.
        let long = SampleInfo {
            chain_len: u32::MAX,
            ..info
        };
        assert_eq!(long.chain().len(), crate::XENPMU_CALLCHAIN_MAX);
    }
}
