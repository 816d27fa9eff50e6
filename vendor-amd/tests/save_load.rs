//! Save/load round trips, the clean-hardware invariant, the MSR traffic of a context switch, and
//! the shared-page conversion.

mod common;

use common::*;
use vpmu::abi::{
    AmdBanks, VendorArea, VendorLayout, XENPMU_REFUSED_RESERVED, XENPMU_REFUSED_STATUS,
};
use vpmu::{
    ContextError, CountingBus, GuestPolicy, MsrAccessStats, MsrBus, PmuBackend, PublishedImages,
};
use vpmu_amd::{AmdPmu, PmuShape};
use vpmu_models::amd::AmdPmuModel;
use vpmu_models::{HwEvent, SoftwarePmu};

fn program_all(vcpu: &mut Vcpu, shape: PmuShape) {
    let v2 = matches!(shape, PmuShape::PerfMonV2 { .. });
    for i in 0..pmu(shape).gp_counters() {
        let value = 0x0000_8000_0000_0000 | (u64::from(i) << 20) | 0x55;
        vcpu.set(ctr_msr(shape, i), value);
        let int = if i % 2 == 0 { INT } else { 0 };
        let event = [INSTRUCTIONS, BRANCHES, CYCLES][i as usize % 3];
        vcpu.set(ctl_msr(shape, i), EN | OS | USR | int | event);
    }
    if v2 {
        let mask = pmu(shape).counter_mask();
        vcpu.set(GLOBAL_CTL, mask & 0b10_1111);
        vcpu.set(GLOBAL_STATUS_SET, mask & 0b100);
    }
}

/// Every guest-visible register, read through the backend.
fn guest_view(vcpu: &mut Vcpu, shape: PmuShape) -> Vec<u64> {
    let mut view = vec![];
    for i in 0..pmu(shape).gp_counters() {
        view.push(vcpu.value(ctr_msr(shape, i)));
        view.push(vcpu.value(ctl_msr(shape, i)));
    }
    if matches!(shape, PmuShape::PerfMonV2 { .. }) {
        view.push(vcpu.value(GLOBAL_CTL));
        view.push(vcpu.value(GLOBAL_STATUS));
    }
    view
}

#[test]
fn save_then_load_preserves_every_counter_and_control() {
    for shape in SHAPES {
        let mut vcpu = Vcpu::new(shape);
        program_all(&mut vcpu, shape);
        vcpu.run(HwEvent::Instructions, 1234, KERNEL);
        vcpu.run(HwEvent::Branches, 56, USER);
        let before = guest_view(&mut vcpu, shape);

        vcpu.save();
        assert!(
            vcpu.nothing_can_count(),
            "{shape:?}: save leaves nothing counting"
        );
        assert_eq!(
            guest_view(&mut vcpu, shape),
            before,
            "saved context reads the same"
        );

        // Another vCPU uses the CPU in between and leaves its values behind.
        let other = vcpu.backend.new_context();
        let mut other_ctx = other.clone();
        vcpu.backend
            .load(&other_ctx, &mut vcpu.hw, &mut vcpu.record)
            .unwrap();
        for i in 0..pmu(shape).gp_counters() {
            let msr = vpmu::Msr(ctr_msr(shape, i));
            vcpu.backend
                .guest_write(
                    &mut other_ctx,
                    Some(&mut vcpu.hw),
                    &vcpu.policy,
                    msr,
                    0x7777,
                )
                .unwrap();
            let ctl = vpmu::Msr(ctl_msr(shape, i));
            vcpu.backend
                .guest_write(
                    &mut other_ctx,
                    Some(&mut vcpu.hw),
                    &vcpu.policy,
                    ctl,
                    EN | OS | CYCLES,
                )
                .unwrap();
        }
        vcpu.hw.count(HwEvent::CoreCycles, 99, KERNEL);
        vcpu.backend
            .save(&mut other_ctx, &mut vcpu.hw, &mut vcpu.record)
            .unwrap();
        assert!(vcpu.nothing_can_count());

        vcpu.load();
        assert_eq!(
            guest_view(&mut vcpu, shape),
            before,
            "{shape:?}: loaded context reads the same"
        );
        // And it goes on counting from where it was.
        vcpu.run(HwEvent::Instructions, 1, KERNEL);
        assert_eq!(vcpu.value(ctr_msr(shape, 0)), before[0] + 1);
        vcpu.save();
        assert!(vcpu.nothing_can_count());
    }
}

#[test]
fn a_context_migrates_to_another_cpu() {
    let shape = PmuShape::PerfMonV2 { counters: 6 };
    let mut vcpu = Vcpu::new(shape);
    program_all(&mut vcpu, shape);
    vcpu.run(HwEvent::Instructions, 10, KERNEL);
    vcpu.save();
    let before = guest_view(&mut vcpu, shape);
    let mut cpu1 = AmdPmuModel::new(pmu(shape));
    vcpu.backend.clean_hardware(&mut cpu1).unwrap();
    vcpu.hw = cpu1;
    // Another pCPU: its own record, which knows only that its controls were cleared.
    vcpu.record = vpmu::HwRecord::unknown();
    vcpu.record.controls_cleared();
    vcpu.load();
    assert_eq!(guest_view(&mut vcpu, shape), before);
    let live = vcpu.hw.registers();
    for i in 0..6 {
        assert_eq!(live.values[i], vcpu.ctx.counter(i as u32).unwrap());
        assert_eq!(
            live.controls[i],
            vcpu.ctx.hardware_control(i as u32).unwrap()
        );
    }
    assert_eq!(live.global_ctl, 0b10_1111);
}

#[test]
fn clean_hardware_resets_a_cpu() {
    let shape = PmuShape::PerfMonV2 { counters: 6 };
    let p = pmu(shape);
    let backend = AmdPmu::new(p).unwrap();
    let mut hw = AmdPmuModel::new(p);
    hw.write(vpmu::Msr(ext_ctl(3)), EN | OS | INSTRUCTIONS)
        .unwrap();
    hw.write(vpmu::Msr(GLOBAL_STATUS_SET), 0b1).unwrap();
    assert_eq!(
        hw.registers().global_ctl,
        0x3f,
        "hardware resets GlobalCtl to all enabled"
    );
    backend.clean_hardware(&mut hw).unwrap();
    let regs = hw.registers();
    assert_eq!(
        (regs.controls, regs.global_ctl, regs.global_status),
        ([0; 6], 0, 0)
    );
}

#[test]
fn a_stopped_counter_stays_live_until_saved_then_costs_nothing() {
    let shape = PmuShape::PerfCtrExtCore;
    let mut vcpu = Vcpu::new(shape);
    vcpu.set(ext_ctl(1), EN | OS | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 9, KERNEL);
    vcpu.set(ext_ctl(1), 0);
    assert!(
        vcpu.backend.is_active(&vcpu.ctx),
        "its value is only on the hardware"
    );
    vcpu.save();
    assert_eq!(vcpu.ctx.counter(1), Some(9));
    assert!(!vcpu.backend.is_active(&vcpu.ctx));
    let stats = vcpu.load();
    assert_eq!(stats.total(), 0);
    assert_eq!(vcpu.value(ext_ctr(1)), 9);
}

struct Traffic {
    save: MsrAccessStats,
    load: MsrAccessStats,
}

/// One context switch (save, then load on the same CPU) of a vCPU with `active` counters
/// counting, measured by both the model's own counters and a `CountingBus`.
fn context_switch_traffic(shape: PmuShape, active: u32) -> Traffic {
    let mut vcpu = Vcpu::new(shape);
    for i in 0..active {
        vcpu.set(ctr_msr(shape, i), 1000 + u64::from(i));
        vcpu.set(ctl_msr(shape, i), EN | OS | USR | INSTRUCTIONS);
    }
    vcpu.run(HwEvent::Instructions, 10, KERNEL);

    let model_before = vcpu.hw.access_stats();
    let save = vcpu.save();
    let model_after_save = vcpu.hw.access_stats();
    let load = vcpu.load();
    let model_after_load = vcpu.hw.access_stats();
    assert_eq!(
        model_after_save - model_before,
        save,
        "model and CountingBus agree"
    );
    assert_eq!(model_after_load - model_after_save, load);
    assert_eq!(save.faults + load.faults, 0);
    for i in 0..active {
        assert_eq!(vcpu.value(ctr_msr(shape, i)), 1010 + u64::from(i));
    }
    Traffic { save, load }
}

#[test]
fn msr_traffic_of_a_context_switch() {
    println!("MSR accesses per context switch (reads/writes):");
    for shape in [
        PmuShape::PerfMonV2 { counters: 6 },
        PmuShape::PerfCtrExtCore,
        PmuShape::LegacyK7,
    ] {
        let n = pmu(shape).gp_counters();
        let v2 = u64::from(matches!(shape, PmuShape::PerfMonV2 { .. }));
        for (name, active) in [
            ("PMU never used", 0),
            ("1 counter active", 1),
            ("all active", n),
        ] {
            let t = context_switch_traffic(shape, active);
            println!(
                "  {shape:?}, {name} ({active}/{n}): save {}r/{}w = {}, load {}r/{}w = {}",
                t.save.reads,
                t.save.writes,
                t.save.total(),
                t.load.reads,
                t.load.writes,
                t.load.total()
            );
            // The algorithm's cost, the vCPU switched back with nothing in between: PerfMonV2
            // save = one GlobalCtl write + one read per live counter + the status read, load =
            // GlobalCtl (the values and controls are still on the hardware); before PerfMonV2
            // save = one stop and one read per live counter, load = one control write per
            // live counter (the values are still there). Nothing at all for a context that
            // never counted.
            let a = u64::from(active);
            let (save_reads, save_writes, load_writes) = if active == 0 {
                (0, 0, 0)
            } else if v2 == 1 {
                (a + 1, 1, 1)
            } else {
                (a, a, a)
            };
            assert_eq!(
                (t.save.reads, t.save.writes, t.load.reads, t.load.writes),
                (save_reads, save_writes, 0, load_writes),
                "{shape:?} {name}"
            );
        }
    }
}

#[test]
fn a_pending_overflow_is_acknowledged_at_save_only_when_there_is_one() {
    let shape = PmuShape::PerfMonV2 { counters: 6 };
    let mut vcpu = Vcpu::new(shape);
    vcpu.set(ext_ctr(0), MASK48);
    vcpu.set(ext_ctl(0), EN | OS | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    let stats = vcpu.save();
    assert_eq!(
        (stats.reads, stats.writes),
        (2, 2),
        "GlobalCtl, and STATUS_CLR as the status is non-zero"
    );
    assert_eq!(vcpu.ctx.global_status(), 1);
    assert!(vcpu.nothing_can_count());
    vcpu.load();
    assert_eq!(
        vcpu.value(GLOBAL_STATUS),
        1,
        "virtual status survives the switch"
    );
    assert_eq!(
        vcpu.hw.registers().global_status,
        0,
        "but is not put back on the hardware"
    );
}

#[test]
fn never_used_context_costs_nothing_even_through_the_page() {
    let mut vcpu = Vcpu::new(PmuShape::PerfMonV2 { counters: 6 });
    assert!(!vcpu.backend.is_active(&vcpu.ctx));
    // Reads of an idle context need no hardware either.
    let before = vcpu.hw.access_stats();
    let _ = vcpu.value(ext_ctr(3));
    let _ = vcpu.value(GLOBAL_STATUS);
    assert_eq!(vcpu.hw.access_stats(), before);
}

// ---------------------------------------------------------------------------------------------
// The shared page

fn saved_vcpu(shape: PmuShape) -> Vcpu {
    let mut vcpu = Vcpu::new(shape);
    program_all(&mut vcpu, shape);
    vcpu.run(HwEvent::Instructions, 77, KERNEL);
    vcpu.save();
    vcpu
}

#[test]
fn page_round_trip_preserves_the_context() {
    for shape in SHAPES {
        let vcpu = saved_vcpu(shape);
        let n = pmu(shape).gp_counters();
        let mut area = VendorArea::default();
        vcpu.backend.context_to_page(&vcpu.ctx, &mut area);
        let VendorLayout::Amd(banks) = vcpu.backend.page_layout() else {
            panic!("AMD layout");
        };
        assert_eq!(banks, AmdBanks::new(n).unwrap());
        let fixed = area.amd_ctxt();
        assert_eq!(fixed.counter_count, n);
        for i in 0..n as usize {
            assert_eq!(
                banks.counter(&area, i),
                Ok(vcpu.ctx.counter(i as u32).unwrap())
            );
            assert_eq!(
                banks.ctrl(&area, i),
                Ok(vcpu.ctx.control(i as u32).unwrap())
            );
        }
        let back = vcpu
            .backend
            .context_from_page(&area, &vcpu.ctx, &vcpu.policy)
            .unwrap();
        assert_eq!(back, vcpu.ctx, "{shape:?}");
    }
}

#[test]
fn page_geometry_words_are_never_trusted() {
    let shape = PmuShape::PerfCtrExtCore;
    let vcpu = saved_vcpu(shape);
    let mut area = VendorArea::default();
    vcpu.backend.context_to_page(&vcpu.ctx, &mut area);
    let mut fixed = area.amd_ctxt();
    fixed.counters = 1000;
    fixed.ctrls = 8;
    fixed.counter_count = 100;
    area.set_amd_ctxt(&fixed);
    let back = vcpu
        .backend
        .context_from_page(&area, &vcpu.ctx, &vcpu.policy)
        .unwrap();
    assert_eq!(back, vcpu.ctx);
}

#[test]
fn page_values_are_checked_like_wrmsr() {
    let shape = PmuShape::PerfMonV2 { counters: 6 };
    let vcpu = saved_vcpu(shape);
    let banks = AmdBanks::new(6).unwrap();
    let page = || {
        let mut area = VendorArea::default();
        vcpu.backend.context_to_page(&vcpu.ctx, &mut area);
        area
    };
    let from = |area: &VendorArea, policy: &GuestPolicy<'_>| {
        vcpu.backend.context_from_page(area, &vcpu.ctx, policy)
    };
    let guest = GuestPolicy::guest_default();

    let mut area = page();
    banks.set_ctrl(&mut area, 4, EN | (1 << 21)).unwrap();
    assert_eq!(
        from(&area, &guest),
        Err(ContextError {
            register: "ctrl",
            index: Some(4),
            value: EN | (1 << 21),
            msr: 0xC001_0208,
            reason: XENPMU_REFUSED_RESERVED,
        })
    );

    let mut area = page();
    banks.set_ctrl(&mut area, 2, EN | OS | HOST_ONLY).unwrap();
    assert_eq!(from(&area, &guest).unwrap_err().index, Some(2));
    let host = GuestPolicy {
        may_count_host: true,
        ..guest
    };
    let ctx = from(&area, &host).unwrap();
    assert_eq!(ctx.hardware_control(2), Some(EN | OS | HOST_ONLY));

    // A counter is taken as a WRMSR of PERF_CTR takes it: bits above 47 dropped, never
    // refused, so a 64-bit `-period` re-arms it.
    for (value, taken) in [(1 << 48, 0), (0u64.wrapping_sub(1000), (1 << 48) - 1000)] {
        let mut area = page();
        banks.set_counter(&mut area, 5, value).unwrap();
        assert_eq!(from(&area, &guest).unwrap().counter(5), Some(taken));
    }

    let mut area = page();
    let mut fixed = area.amd_ctxt();
    fixed.global_ctrl = 1 << 6;
    area.set_amd_ctxt(&fixed);
    assert_eq!(from(&area, &guest).unwrap_err().register, "global_ctrl");

    // The status may only lose bits: acknowledging is fine, inventing an overflow is not.
    assert_eq!(vcpu.ctx.global_status(), 0b100);
    let mut area = page();
    let mut fixed = area.amd_ctxt();
    fixed.global_status = 0;
    area.set_amd_ctxt(&fixed);
    assert_eq!(from(&area, &guest).unwrap().global_status(), 0);
    fixed.global_status = 0b101;
    area.set_amd_ctxt(&fixed);
    assert_eq!(
        from(&area, &guest),
        Err(ContextError {
            register: "global_status",
            index: None,
            value: 0b101,
            msr: 0xC000_0300,
            reason: XENPMU_REFUSED_STATUS,
        })
    );

    // A flushed control gets the same hardware value a WRMSR would give it.
    let mut area = page();
    banks
        .set_ctrl(&mut area, 0, EN | OS | INSTRUCTIONS)
        .unwrap();
    let ctx = from(&area, &guest).unwrap();
    assert_eq!(ctx.control(0), Some(EN | OS | INSTRUCTIONS));
    assert_eq!(
        ctx.hardware_control(0),
        Some(EN | OS | INSTRUCTIONS | GUEST_ONLY)
    );
}

#[test]
fn pre_perfmon_v2_pages_must_leave_the_global_words_zero() {
    let vcpu = saved_vcpu(PmuShape::PerfCtrExtCore);
    let mut area = VendorArea::default();
    vcpu.backend.context_to_page(&vcpu.ctx, &mut area);
    assert_eq!(
        (area.amd_ctxt().global_ctrl, area.amd_ctxt().global_status),
        (0, 0)
    );
    let mut fixed = area.amd_ctxt();
    fixed.global_status = 1;
    area.set_amd_ctxt(&fixed);
    assert_eq!(
        vcpu.backend
            .context_from_page(&area, &vcpu.ctx, &vcpu.policy)
            .unwrap_err()
            .register,
        "global_status"
    );
}

#[test]
fn a_flushed_page_loads_and_counts() {
    let shape = PmuShape::PerfMonV2 { counters: 6 };
    let mut vcpu = saved_vcpu(shape);
    let banks = AmdBanks::new(6).unwrap();
    let mut area = VendorArea::default();
    vcpu.backend.context_to_page(&vcpu.ctx, &mut area);
    // The guest's profiler re-arms counter 1 from the page.
    banks
        .set_counter(&mut area, 1, 5u64.wrapping_neg() & MASK48)
        .unwrap();
    banks
        .set_ctrl(&mut area, 1, EN | OS | INT | INSTRUCTIONS)
        .unwrap();
    vcpu.ctx = vcpu
        .backend
        .context_from_page(&area, &vcpu.ctx, &vcpu.policy)
        .unwrap();
    let mut bus = CountingBus::new(&mut vcpu.hw);
    vcpu.backend
        .load(&vcpu.ctx, &mut bus, &mut vcpu.record)
        .unwrap();
    vcpu.loaded = true;
    vcpu.run(HwEvent::Instructions, 5, KERNEL);
    assert!(vcpu.hw.take_pmi());
    assert_eq!(vcpu.value(GLOBAL_STATUS) & 0b10, 0b10);
}

/// `context_from_page_into` writes every register of its target when the page is accepted,
/// whatever the target held (the flush reuses contexts), and none when it is refused.
#[test]
fn page_verified_in_place_writes_all_or_nothing() {
    for shape in SHAPES {
        let vcpu = saved_vcpu(shape);
        let mut area = VendorArea::default();
        vcpu.backend.context_to_page(&vcpu.ctx, &mut area);
        let published = vcpu.ctx.control(0).unwrap_or(0);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let (mut accepted, mut refused) = (0, 0);
        for round in 0..300 {
            let mut edited = area.clone();
            for _ in 0..round % 3 + 1 {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                // The fixed part and both banks (20 words with 6 counters).
                let word = (seed >> 33) as usize % 20;
                edited.words[word] = match seed % 5 {
                    0 => 0,
                    1 => seed >> 17,
                    2 => 1 << (seed % 64),
                    3 => (seed >> 40) & 0xffff,
                    _ => published,
                };
            }
            let by_value = vcpu
                .backend
                .context_from_page(&edited, &vcpu.ctx, &vcpu.policy);
            // The context was written under `vcpu.policy`: its images are current, and taking
            // them unjudged for the unedited controls gives the same result.
            let images = [PublishedImages::Stale, PublishedImages::Current];
            let prefills = [vcpu.ctx.clone(), vcpu.backend.new_context()];
            for (prefill, images) in prefills.iter().flat_map(|p| images.map(|i| (p, i))) {
                let mut out = prefill.clone();
                let verdict = vcpu.backend.context_from_page_into(
                    &edited,
                    &vcpu.ctx,
                    images,
                    &vcpu.policy,
                    &mut out,
                );
                match &by_value {
                    Ok(ctx) => {
                        assert_eq!(verdict, Ok(()), "{shape:?}");
                        assert_eq!(&out, ctx, "{shape:?}");
                    }
                    Err(error) => {
                        assert_eq!(verdict, Err(*error), "{shape:?}");
                        assert_eq!(&out, prefill, "{shape:?}");
                    }
                }
            }
            match by_value {
                Ok(_) => accepted += 1,
                Err(_) => refused += 1,
            }
        }
        assert!(
            accepted > 0 && refused > 0,
            "{shape:?}: {accepted} {refused}"
        );
    }
}
