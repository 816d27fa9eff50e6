//! The consumer side: any 4 KiB of bytes through `PageView`. Nothing panics, and every bank
//! access within a validated geometry succeeds.

use vpmu_abi::{Page, PageView};
use zerocopy::FromBytes;

/// Milestone: a page whose header and vendor banks validated, every bank entry read.
pub const BANKS_READ: &str = "page_view: a validated page's banks read";

/// The target.
pub fn run(data: &[u8]) {
    let mut bytes = [0u8; 4096];
    let len = data.len().min(bytes.len());
    bytes[..len].copy_from_slice(&data[..len]);
    let Ok(page) = Page::read_from_bytes(&bytes) else {
        return;
    };
    let Ok(view) = PageView::new(&page) else {
        return;
    };
    let _ = (
        view.identity(),
        view.regs(),
        view.flags(),
        view.dropped_samples(),
    );
    if let Ok(intel) = view.intel() {
        for i in 0..intel.banks().fixed_count() as usize {
            intel.fixed_counter(i).expect("inside the validated bank");
        }
        for i in 0..intel.banks().arch_count() as usize {
            intel.pair(i).expect("inside the validated bank");
        }
        if intel.banks().arch_count() > 0 {
            crate::reached(BANKS_READ);
        }
    }
    if let Ok(amd) = view.amd() {
        for i in 0..amd.banks().count() as usize {
            amd.counter(i).expect("inside the validated bank");
            amd.ctrl(i).expect("inside the validated bank");
        }
        if amd.banks().count() > 0 {
            crate::reached(BANKS_READ);
        }
    }
}
