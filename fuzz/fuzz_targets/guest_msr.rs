//! Guest RDMSR/WRMSR sequences through a backend whose context is loaded on a software model:
//! nothing panics, the backend never makes the hardware fault, no forbidden bit reaches it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vpmu::{Msr, PmuBackend};

/// Turns an input byte into an MSR near the PMU ranges (present, absent and neighbouring).
fn pick_msr(ranges: &[(u32, u32)], selector: u8) -> Msr {
    let (first, last) = ranges[usize::from(selector) % ranges.len()];
    let span = last - first + 3;
    Msr(first.wrapping_sub(1) + u32::from(selector >> 3) % span)
}

fuzz_target!(|data: &[u8]| {
    let [vendor, shape, policy, ops @ ..] = data else { return };
    let policy = vpmu_fuzz::policy(*policy);
    let accesses = ops.chunks_exact(9).map(|chunk| {
        let mut value = [0u8; 8];
        value.copy_from_slice(&chunk[1..]);
        (chunk[0], u64::from_le_bytes(value))
    });
    if vendor % 2 == 0 {
        let (pmu, mut model) = vpmu_fuzz::intel(*shape);
        let mut ctx = pmu.new_context();
        for (selector, value) in accesses {
            let msr = pick_msr(pmu.msr_ranges(), selector);
            if selector & 4 != 0 {
                pmu.guest_read(&mut ctx, Some(&mut model), msr).expect("no hardware fault");
            } else {
                pmu.guest_write(&mut ctx, Some(&mut model), &policy, msr, value).expect("no hardware fault");
            }
            vpmu_fuzz::assert_intel_clean(&model);
        }
        pmu.save(&mut ctx, &mut model, &mut vpmu::HwRecord::unknown()).expect("no hardware fault");
        assert_eq!(model.registers().global_ctrl, 0, "save leaves the hardware stopped");
    } else {
        let (pmu, mut model) = vpmu_fuzz::amd(*shape);
        let mut ctx = pmu.new_context();
        for (selector, value) in accesses {
            let msr = pick_msr(pmu.msr_ranges(), selector);
            if selector & 4 != 0 {
                pmu.guest_read(&mut ctx, Some(&mut model), msr).expect("no hardware fault");
            } else {
                pmu.guest_write(&mut ctx, Some(&mut model), &policy, msr, value).expect("no hardware fault");
            }
            vpmu_fuzz::assert_amd_clean(&model, policy.may_count_host);
        }
        pmu.save(&mut ctx, &mut model, &mut vpmu::HwRecord::unknown()).expect("no hardware fault");
        assert!(model.registers().controls.iter().all(|&ctl| ctl == 0), "save leaves the hardware clean");
    }
});
