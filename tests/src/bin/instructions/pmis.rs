//! The PMI rows (through A's virtual LVTPC, published as an all-mode sample into P's page, or
//! as a record into A's sample ring) with 1, 3 or every counter overflowed at once, and the
//! profiler's flush of a sample.

use vpmu::abi::ops::Params;
use vpmu::abi::{
    CounterPair, Page, PageView, PageViewMut, XENPMU_MODE_ALL, XENPMU_MODE_SELF, XENPMU_OP_FLUSH,
    XENPMU_OP_MODE_SET, XENPMU_OP_RING_INIT,
};
use vpmu::{Interrupted, Msr, MsrBus, PmiOutcome, VcpuId};
use vpmu_models::{HwEvent, SoftwarePmu};
use vpmu_sim::helpers::sampling;
use vpmu_sim::ring::{Record, RingGuest, config};
use vpmu_sim::{Driver, Machine, SimVendor, guest_frame};

use crate::harness::{Excluded, ExcludedPlatform, ExcludedTable};
use crate::switches::counters;
use crate::{A, KERNEL, M, Mark, Measured, P, PERIOD, Pass, check};

/// The USR bit of an event select (the same position on both vendors).
const USR: u64 = 1 << 16;

/// The counter index of Intel's fixed counter 0 (`CounterSetup::ctr`).
const FIXED0: u32 = 32;

/// `vcpu` interrupted in kernel code (what the simulator's retire loop records).
fn interrupted_guest(vcpu: VcpuId) -> Interrupted {
    Interrupted::Guest {
        vcpu,
        regs: vpmu::abi::Regs {
            rip: 0xffff_8000_0010_0000,
            ..Default::default()
        },
    }
}

/// What the core answered to a PMI.
type PmiResult = Result<PmiOutcome, vpmu::CoreError>;

/// pCPU 0's counters run `PERIOD` kernel instructions, to the overflow of every sampling
/// counter programmed with `PERIOD`; the PMI the model raised is handed to the core, inside
/// the measured call when `measured` names a pass. The core's outcome and its (MSR accesses,
/// allocations); an error if the model raised no PMI.
fn raise_and_handle_pmi<V: SimVendor>(
    m: &mut M<V>,
    measured: Option<Pass>,
) -> Result<(PmiResult, (u64, u64)), String>
where
    V::Model: Clone,
{
    let model = m.pcpus[0].hw_mut();
    model.count(HwEvent::Instructions, PERIOD, KERNEL);
    check(model.take_pmi(), || "no counter raised a PMI".into())?;
    m.platform.calling_pcpu = Some(0);
    let mark = Mark::of(m);
    let outcome = {
        let (vpmu, pcpu) = (&m.vpmu, &mut m.pcpus[0]);
        let (platform, vcpus) = (
            &mut ExcludedPlatform(&mut m.platform),
            &ExcludedTable(&m.vcpus),
        );
        match measured {
            Some(pass) => pass.run(|| vpmu.handle_pmi(platform, pcpu, vcpus)),
            None => vpmu.handle_pmi(platform, pcpu, vcpus),
        }
    };
    let cost = mark.since(m);
    m.platform.calling_pcpu = None;
    Ok((outcome, cost))
}

/// The overflow bits of `ctrs`.
fn bits(ctrs: &[u32]) -> u64 {
    ctrs.iter().fold(0, |b, &c| b | 1 << c)
}

/// `pmi-lvtpc-1`, `-3`, `-all`: `n` of A's counters sample with the same period and overflow
/// on the same instruction; the PMI goes through A's virtual LVTPC. Fails unless it was
/// delivered to A and A's overflow status shows exactly those `n` counters.
pub(crate) fn lvtpc<V: SimVendor>(excluded: Excluded<V>, n: Option<u32>) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    m.platform.set_lvtpc_masked(A, false);
    m.schedule(0, Some(A));
    m.platform.interrupted[0] = interrupted_guest(A);
    let ctrs = counters(&driver, n)?;
    let setups: Vec<_> = ctrs.iter().map(|&c| sampling(c, PERIOD)).collect();
    m.program(A, &setups);
    let status = driver
        .status_msr()
        .ok_or("the shape has no overflow status")?;
    let overflowed = bits(&ctrs);
    let mut cost = (0, 0);
    for pass in Pass::BOTH {
        let (outcome, c) = raise_and_handle_pmi(&mut m, Some(pass))?;
        check(
            matches!(outcome, Ok(PmiOutcome::Delivered { to: A, .. })),
            || format!("the PMI was not delivered through A's LVTPC: {outcome:?}"),
        )?;
        cost = c;
        let seen = m.read(A, status);
        check(seen == overflowed, || {
            format!(
                "A's overflow status {seen:#x}, not the {} counters {overflowed:#x}",
                ctrs.len()
            )
        })?;
        // The guest's handler: acknowledge, re-arm, unmask its LVTPC.
        if let Some(ack) = driver.ack(overflowed) {
            m.write(A, ack);
        }
        for setup in &setups {
            m.write(A, driver.write_counter(setup.ctr, setup.start_value()));
        }
        m.platform.set_lvtpc_masked(A, false);
        m.platform.lvtpc_deliveries.clear();
    }
    Ok(Measured {
        msr_accesses: cost.0,
        allocations: cost.1,
        counters_used: ctrs.len() as u32,
    })
}

/// Flips the USR bit of counter 0's control in the page's vendor area (the profiler's edit
/// of `flush-ctrl`); the control it wrote.
fn edit_control(driver: &Driver, page: &mut Page) -> Result<u64, String> {
    let mut view = PageViewMut::new(page).map_err(|e| format!("page: {e:?}"))?;
    let edited = if driver.is_intel() {
        view.edit_intel(|_, banks, area| {
            let pair = banks.pair(area, 0)?;
            let control = pair.control ^ USR;
            banks.set_pair(area, 0, CounterPair { control, ..pair })?;
            Ok(control)
        })
    } else {
        view.edit_amd(|_, banks, area| {
            let control = banks.ctrl(area, 0)? ^ USR;
            banks.set_ctrl(area, 0, control)?;
            Ok(control)
        })
    };
    edited
        .and_then(|r| r)
        .map_err(|e: vpmu::abi::AbiError| format!("page edit: {e:?}"))
}

/// `pmi-sample-1`, `-3`, `-all` (`flush` = `None`), `flush` and `flush-ctrl` (`Some(edit)`,
/// one counter): all mode, P's `n` sampling counters overflow at once while A runs; the
/// sample goes into P's page, the profiler re-arms and acknowledges every counter there (and
/// with `edit`, changes counter 0's control too) and flushes. Fails unless the sample reached
/// P with exactly those `n` counters in its status, and the flush put the re-armed values (and
/// the edited control) on the hardware.
pub(crate) fn sample<V: SimVendor>(
    excluded: Excluded<V>,
    n: Option<u32>,
    flush: Option<bool>,
) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 1], XENPMU_MODE_SELF);
    let gfn = m.register_page(P);
    m.schedule(0, Some(P));
    m.op(P, XENPMU_OP_MODE_SET, &Params::new(XENPMU_MODE_ALL, 0))
        .map_err(|e| format!("mode all: {e:?}"))?;
    let ctrs = counters(&driver, n)?;
    let setups: Vec<_> = ctrs.iter().map(|&c| sampling(c, PERIOD)).collect();
    m.program(P, &setups);
    m.schedule(0, Some(A));
    m.platform.interrupted[0] = interrupted_guest(A);
    let overflowed = bits(&ctrs);
    let rearm: Vec<_> = setups.iter().map(|s| (s.ctr, s.start_value())).collect();
    let mut cost = (0, 0);
    for pass in Pass::BOTH {
        let (outcome, c) = raise_and_handle_pmi(&mut m, flush.is_none().then_some(pass))?;
        check(
            matches!(outcome, Ok(PmiOutcome::Delivered { to: P, .. })),
            || format!("the PMI was not published to P: {outcome:?}"),
        )?;
        if flush.is_none() {
            cost = c;
        }
        let page = m.platform.frame_mut(P.domain, gfn);
        let seen = driver.page_status(&PageView::new(page).map_err(|e| format!("{e:?}"))?);
        check(seen == overflowed, || {
            format!(
                "the sample's overflow status {seen:#x}, not the {} counters {overflowed:#x}",
                ctrs.len()
            )
        })?;
        // The profiler's handler: re-arm and acknowledge in the page (and edit a control),
        // then flush.
        driver.edit_page(page, &rearm, overflowed, false);
        let edited = match flush {
            Some(true) => Some(edit_control(&driver, page)?),
            _ => None,
        };
        m.platform.virqs.clear();
        let control = Msr(driver.control_msr(0));
        let control_before = m.pcpus[0].hw_mut().read(control);
        m.platform.calling_pcpu = Some(0);
        let mark = Mark::of(&m);
        let flushed = {
            let (vpmu, pcpu) = (&m.vpmu, &mut m.pcpus[0]);
            let (platform, vcpus) = (
                &mut ExcludedPlatform(&mut m.platform),
                &ExcludedTable(&m.vcpus),
            );
            let params = Params::new(0, 0);
            let mut flush_op =
                || vpmu.control_op(platform, pcpu, vcpus, P, XENPMU_OP_FLUSH, &params);
            match flush {
                Some(_) => pass.run(flush_op),
                None => flush_op(),
            }
        };
        if flush.is_some() {
            cost = mark.since(&m);
        }
        m.platform.calling_pcpu = None;
        check(flushed.is_ok(), || format!("the flush failed: {flushed:?}"))?;
        let hw = m.pcpus[0].hw_mut();
        for &(ctr, value) in &rearm {
            let now = hw.read(Msr(driver.read_counter(ctr)));
            check(now == Ok(driver.stored(ctr, value)), || {
                format!("counter {ctr} is {now:x?} after the flush, not re-armed")
            })?;
        }
        if let Some(edited) = edited {
            let now = hw.read(control);
            check(now != control_before, || {
                format!("the edited control {edited:#x} did not reach the hardware")
            })?;
            let page =
                PageView::new(m.platform.frame(P.domain, gfn)).map_err(|e| format!("{e:?}"))?;
            check(driver.page_control(&page, 0) == edited, || {
                "the page lost the edited control".into()
            })?;
        }
    }
    Ok(Measured {
        msr_accesses: cost.0,
        allocations: cost.1,
        counters_used: ctrs.len() as u32,
    })
}

/// `pmi-ring-1`, `-all`: self mode, A has a page and a sample ring (ABI 1.4) re-arming each of
/// its `n` sampling counters every `PERIOD`; they overflow at once and the PMI becomes a record
/// in the ring, the counters re-armed on the hardware and never stopped. Fails unless the
/// sample was published to A as a record reporting exactly those counters and every counter
/// reads its re-armed value afterwards.
pub(crate) fn ring<V: SimVendor>(excluded: Excluded<V>, n: Option<u32>) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    m.register_page(A);
    let ctrs = counters(&driver, n)?;
    let periods: Vec<(bool, usize, u64)> = ctrs
        .iter()
        .map(|&c| (c >= FIXED0, (c % FIXED0) as usize, PERIOD))
        .collect();
    let gfn = guest_frame(A.domain, 0x100);
    let mut ring = RingGuest::prepare(&mut m.platform, A.domain, gfn, &config(4, 0, 0, &periods));
    m.op(A, XENPMU_OP_RING_INIT, &Params::new(gfn, A.vcpu))
        .map_err(|e| format!("ring_init: {e:?}"))?;
    m.platform.interrupted[0] = interrupted_guest(A);
    let setups: Vec<_> = ctrs.iter().map(|&c| sampling(c, PERIOD)).collect();
    m.program(A, &setups);
    let overflowed = bits(&ctrs);
    let mut cost = (0, 0);
    for pass in Pass::BOTH {
        let (outcome, c) = raise_and_handle_pmi(&mut m, Some(pass))?;
        check(
            matches!(outcome, Ok(PmiOutcome::Delivered { to: A, .. })),
            || format!("the PMI was not published to A's ring: {outcome:?}"),
        )?;
        cost = c;
        let records = ring
            .consume(&mut m.platform)
            .map_err(|e| format!("{e:?}"))?;
        let reported: Vec<u64> = records
            .iter()
            .filter_map(|r| match r {
                Record::Sample(sample, _) => Some(sample.overflowed),
                _ => None,
            })
            .collect();
        check(reported == [overflowed], || {
            format!("the ring's records {records:?}, not one reporting {overflowed:#x}")
        })?;
        let hw = m.pcpus[0].hw_mut();
        for setup in &setups {
            let now = hw.read(Msr(driver.read_counter(setup.ctr)));
            check(
                now == Ok(driver.stored(setup.ctr, setup.start_value())),
                || {
                    format!(
                        "counter {} is {now:x?} after the PMI, not re-armed",
                        setup.ctr
                    )
                },
            )?;
        }
        m.platform.virqs.clear();
    }
    Ok(Measured {
        msr_accesses: cost.0,
        allocations: cost.1,
        counters_used: ctrs.len() as u32,
    })
}
