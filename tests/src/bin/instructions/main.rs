//! Deterministic cost of the core's hot paths: instructions retired by the core itself per
//! operation, counted by valgrind's callgrind, with the MSR accesses each operation made, the
//! platform calls, and heap allocations.
//!
//! * `instructions table` runs every scenario of both vendors in its own process under
//!   `valgrind --tool=callgrind` and prints a Markdown table, with two references per row: the
//!   must-change minimum of MSR accesses and what Xen's VPMU does for the same scenario. The
//!   instructions are the core's alone: the MSR bus, the software PMU model, the platform and
//!   the vCPU table (the integrator's parts) are excluded, and the calls into the platform
//!   and the table are counted in their own column.
//! * `instructions run VENDOR SCENARIO [--with-platform]` is one such process: it sets the
//!   scenario up, runs the operation once to warm up, then once more inside
//!   `vpmu_bench_measured`, the only function callgrind collects in (`--collect-atstart=no
//!   --toggle-collect`); `harness.rs` says how the excluded parts are toggled out.
//!   `--with-platform` counts the simulator's platform and vCPU table with the core (for
//!   profiling the whole path by hand; the harness's per-call cost is then not calibrated).
//! * `instructions trace VENDOR SCENARIO` prints the MSR accesses of the measured operation.
//! * `instructions list` lists the scenarios.
//!
//! Instruction counts are deterministic for one binary: no timing is involved. The harness's
//! own instructions (the measuring call, the wrappers around each excluded call) are left
//! out by their source lines (`harness_share`), and calibration runs that measure nothing but
//! the harness check that they come out at 0. `scripts/instructions.sh` installs valgrind and
//! runs the table.

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

mod harness;
mod table;

use harness::{
    CALLBACKS, Excluded, ExcludedPlatform, ExcludedTable, PLATFORM_CALLS, TRACING, count_platform,
    vpmu_bench_measured,
};
use vpmu::abi::ops::Params;
use vpmu::abi::{XENPMU_MODE_ALL, XENPMU_MODE_SELF, XENPMU_OP_FLUSH, XENPMU_OP_MODE_SET};
use vpmu::{Interrupted, Msr, MsrBus, Platform, PmiOutcome, VcpuId, VcpuTable};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_sim::helpers::{counting, sampling};
use vpmu_sim::{Driver, Machine, SimVendor, amd_v2, intel_v5};

/// Heap allocations made by this process so far.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

struct CountingAllocator;

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on as it is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc` is passed on as it is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Which run of a scenario's operation this is: only the second is measured (the first brings
/// the caches of the core's own state, such as the per-pCPU hardware record, to steady state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    WarmUp,
    Measured,
}

impl Pass {
    /// Runs `operation`, inside `vpmu_bench_measured` only on the measured pass.
    fn run<R>(self, operation: impl FnOnce() -> R) -> R {
        match self {
            Pass::WarmUp => std::hint::black_box(operation()),
            Pass::Measured => vpmu_bench_measured(operation),
        }
    }
}

/// The profiling domain's vCPU, a guest vCPU, and a vCPU that never uses the PMU.
const P: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };
/// Instructions between two samples.
const PERIOD: u64 = 1000;

const KERNEL: ExecMode = ExecMode {
    cpl: 0,
    host: false,
};

/// What one scenario measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// An intercepted WRMSR of A's loaded counter 0.
    Wrmsr,
    /// An intercepted RDMSR of A's loaded counter 0.
    Rdmsr,
    /// A with `n` counters (`None`: every counter) switched out for B and back in.
    SwitchPair(Option<u32>),
    /// A's counter overflows; the PMI is delivered through A's virtual LVTPC.
    PmiLvtpc,
    /// All mode: P's counter overflows while A runs; the sample goes into P's page.
    PmiSample,
    /// P flushes the sample (its counter re-armed and acknowledged in the page).
    Flush,
    /// Calibration: nothing but the measuring harness itself (subtracted from every row).
    CalibrateEmpty,
    /// Calibration: one RDMSR through the excluded bus and nothing else; what it costs above
    /// `CalibrateEmpty` is the bus wrapper's share, subtracted per MSR access.
    CalibrateAccess,
    /// Calibration: one excluded platform call (`privileged_domain`); its cost above
    /// `CalibrateEmpty` is subtracted per platform or vCPU-table call.
    CalibratePlatformCall,
    /// Calibration: one excluded vCPU-table visit with an empty callback; its cost above
    /// `CalibratePlatformCall` is subtracted per callback into the core.
    CalibrateCallback,
}

/// The calibration runs, not rows of the table.
const CALIBRATIONS: [(&str, Scenario); 4] = [
    ("calibrate-empty", Scenario::CalibrateEmpty),
    ("calibrate-access", Scenario::CalibrateAccess),
    ("calibrate-platform-call", Scenario::CalibratePlatformCall),
    ("calibrate-callback", Scenario::CalibrateCallback),
];

const SCENARIOS: [(&str, Scenario); 8] = [
    ("wrmsr", Scenario::Wrmsr),
    ("rdmsr", Scenario::Rdmsr),
    ("switch-1", Scenario::SwitchPair(Some(1))),
    ("switch-4", Scenario::SwitchPair(Some(4))),
    ("switch-all", Scenario::SwitchPair(None)),
    ("pmi-lvtpc", Scenario::PmiLvtpc),
    ("pmi-sample", Scenario::PmiSample),
    ("flush", Scenario::Flush),
];

const VENDORS: [&str; 2] = ["intel-v5", "amd-perfmonv2"];

/// What a measured run reports on stdout (besides the instructions callgrind counts).
struct Measured {
    msr_accesses: u64,
    allocations: u64,
    /// Counters of the PMU that the scenario programs (the switch pairs' `k`).
    counters_used: u32,
}

/// The crossings into the excluded platform and back made by the measured operation.
fn crossings() -> (u64, u64) {
    (
        PLATFORM_CALLS.load(Ordering::Relaxed),
        CALLBACKS.load(Ordering::Relaxed),
    )
}

fn all_counters(driver: &Driver) -> Vec<u32> {
    driver.counters()
}

fn run_scenario<V: SimVendor>(vendor: V, scenario: Scenario) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let excluded = Excluded(vendor);
    let driver = excluded.driver();
    match scenario {
        Scenario::CalibrateEmpty
        | Scenario::CalibrateAccess
        | Scenario::CalibratePlatformCall
        | Scenario::CalibrateCallback => {
            let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
            let counter = Msr(driver.read_counter(0));
            let mut once = |pass: Pass| {
                let (hw, platform, vcpus) = (
                    m.pcpus[0].hw_mut(),
                    &mut ExcludedPlatform(&mut m.platform),
                    &ExcludedTable(&m.vcpus),
                );
                let mark = Mark::take(&*hw);
                let read = pass.run(|| match scenario {
                    Scenario::CalibrateAccess => hw.read(counter).is_ok(),
                    Scenario::CalibratePlatformCall => platform.privileged_domain() == 0,
                    Scenario::CalibrateCallback => vcpus.with_vcpu(A, &mut |_| {}),
                    _ => true,
                });
                read.then(|| mark.since(&*hw))
            };
            once(Pass::WarmUp).ok_or("warm-up calibration failed")?;
            let (msr_accesses, allocations) = once(Pass::Measured).ok_or("calibration failed")?;
            Ok(Measured {
                msr_accesses,
                allocations,
                counters_used: 0,
            })
        }
        Scenario::Wrmsr | Scenario::Rdmsr => {
            let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
            m.schedule(0, Some(A));
            m.program(A, &[counting(0, 0)]);
            let counter = driver.read_counter(0);
            let (msr, value) = driver.write_counter(0, 0x1234);
            let once = |m: &mut Machine<Excluded<V>>, pass: Pass| {
                m.platform.calling_pcpu = Some(0);
                let cell = &m.vcpus.domains[1][0];
                let (vpmu, pcpu) = (&m.vpmu, &mut m.pcpus[0]);
                let platform = &mut ExcludedPlatform(&mut m.platform);
                let mut vcpu = cell.borrow_mut();
                let mark = Mark::take(pcpu.hw());
                let ok = pass.run(|| match scenario {
                    Scenario::Wrmsr => vpmu
                        .wrmsr(platform, pcpu, &mut vcpu, Msr(msr), value)
                        .is_ok(),
                    _ => vpmu.rdmsr(platform, pcpu, &mut vcpu, Msr(counter)).is_ok(),
                });
                ok.then(|| mark.since(pcpu.hw()))
            };
            once(&mut m, Pass::WarmUp).ok_or("warm-up intercept failed")?;
            let (msr_accesses, allocations) =
                once(&mut m, Pass::Measured).ok_or("intercept failed")?;
            Ok(Measured {
                msr_accesses,
                allocations,
                counters_used: 1,
            })
        }
        Scenario::SwitchPair(n) => {
            let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
            m.schedule(0, Some(A));
            let counters: Vec<u32> = all_counters(&driver)
                .into_iter()
                .take(n.map_or(usize::MAX, |n| n as usize))
                .collect();
            if n.is_some_and(|n| counters.len() < n as usize) {
                return Err(format!("the PMU has only {} counters", counters.len()));
            }
            let setups: Vec<_> = counters.iter().map(|&c| counting(c, 0)).collect();
            m.program(A, &setups);
            let pair = |m: &mut Machine<Excluded<V>>, pass: Pass| {
                // Let A's counters move, so that a save has something new to read.
                m.pcpus[0].hw_mut().count(HwEvent::Instructions, 10, KERNEL);
                m.platform.calling_pcpu = Some(0);
                let (vpmu, pcpu) = (&m.vpmu, &mut m.pcpus[0]);
                let (platform, vcpus) = (
                    &mut ExcludedPlatform(&mut m.platform),
                    &ExcludedTable(&m.vcpus),
                );
                let mark = Mark::take(pcpu.hw());
                let ok = pass.run(|| {
                    vpmu.context_switch(platform, pcpu, vcpus, Some(B)).is_ok()
                        && vpmu.context_switch(platform, pcpu, vcpus, Some(A)).is_ok()
                });
                ok.then(|| mark.since(pcpu.hw()))
            };
            pair(&mut m, Pass::WarmUp).ok_or("warm-up switch failed")?;
            let (msr_accesses, allocations) =
                pair(&mut m, Pass::Measured).ok_or("switch failed")?;
            Ok(Measured {
                msr_accesses,
                allocations,
                counters_used: counters.len() as u32,
            })
        }
        Scenario::PmiLvtpc => {
            let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
            m.platform.set_lvtpc_masked(A, false);
            m.schedule(0, Some(A));
            m.platform.interrupted[0] = interrupted_guest(A);
            let setup = sampling(0, PERIOD);
            m.program(A, &[setup]);
            let pmi = |m: &mut Machine<Excluded<V>>, pass: Pass| {
                let (outcome, cost) = raise_and_handle_pmi(m, Some(pass))?;
                if !matches!(outcome, Ok(PmiOutcome::Delivered { to: A, .. })) {
                    return None;
                }
                // The guest's handler: acknowledge, re-arm, unmask its LVTPC.
                if let Some(ack) = driver.ack(1) {
                    m.write(A, ack);
                }
                m.write(A, driver.write_counter(0, setup.start_value()));
                m.platform.set_lvtpc_masked(A, false);
                m.platform.lvtpc_deliveries.clear();
                Some(cost)
            };
            pmi(&mut m, Pass::WarmUp).ok_or("warm-up PMI was not delivered through the LVTPC")?;
            let (msr_accesses, allocations) =
                pmi(&mut m, Pass::Measured).ok_or("the PMI was not delivered through the LVTPC")?;
            Ok(Measured {
                msr_accesses,
                allocations,
                counters_used: 1,
            })
        }
        Scenario::PmiSample | Scenario::Flush => {
            let mut m = Machine::new(excluded, 1, &[1, 1], XENPMU_MODE_SELF);
            let gfn = m.register_page(P);
            m.schedule(0, Some(P));
            m.op(P, XENPMU_OP_MODE_SET, &Params::new(XENPMU_MODE_ALL, 0))
                .map_err(|e| format!("mode all: {e:?}"))?;
            let setup = sampling(0, PERIOD);
            m.program(P, &[setup]);
            m.schedule(0, Some(A));
            m.platform.interrupted[0] = interrupted_guest(A);
            let cycle = |m: &mut Machine<Excluded<V>>, pass: Pass| -> Option<(u64, u64)> {
                let measured = (scenario == Scenario::PmiSample).then_some(pass);
                let (outcome, mut cost) = raise_and_handle_pmi(m, measured)?;
                if !matches!(outcome, Ok(PmiOutcome::Delivered { to: P, .. })) {
                    return None;
                }
                // The profiler's handler: re-arm and acknowledge in the page, then flush.
                let page = m.platform.frame_mut(P.domain, gfn);
                driver.edit_page(page, &[(0, setup.start_value())], 1, false);
                m.platform.virqs.clear();
                m.platform.calling_pcpu = Some(0);
                let (vpmu, pcpu) = (&m.vpmu, &mut m.pcpus[0]);
                let (platform, vcpus) = (
                    &mut ExcludedPlatform(&mut m.platform),
                    &ExcludedTable(&m.vcpus),
                );
                let mut flush = |pcpu: &mut _| {
                    vpmu.control_op(
                        platform,
                        pcpu,
                        vcpus,
                        P,
                        XENPMU_OP_FLUSH,
                        &Params::new(0, 0),
                    )
                };
                let mark = Mark::take(pcpu.hw());
                let flushed = if scenario == Scenario::Flush {
                    pass.run(|| flush(pcpu))
                } else {
                    flush(pcpu)
                };
                if scenario == Scenario::Flush {
                    cost = mark.since(pcpu.hw());
                }
                m.platform.calling_pcpu = None;
                flushed.ok().map(|_| cost)
            };
            cycle(&mut m, Pass::WarmUp).ok_or("warm-up sample or flush failed")?;
            let (msr_accesses, allocations) =
                cycle(&mut m, Pass::Measured).ok_or("sample or flush failed")?;
            Ok(Measured {
                msr_accesses,
                allocations,
                counters_used: 1,
            })
        }
    }
}

/// pCPU 0's counter 0 runs `PERIOD` kernel instructions to its overflow; whether the model
/// raised the PMI line (taken here, as the interrupt arriving).
/// Overflows the sampling counter, raises the PMI on pCPU 0 and hands it to the core, inside
/// the measured call when `measured` names a pass: the core's outcome and the MSR accesses and
/// allocations it made (`None` if no PMI could be raised).
fn raise_and_handle_pmi<V: SimVendor>(
    m: &mut Machine<Excluded<V>>,
    measured: Option<Pass>,
) -> Option<(Result<PmiOutcome, vpmu::CoreError>, (u64, u64))>
where
    V::Model: Clone,
{
    if !overflow_and_raise(m) {
        return None;
    }
    m.platform.calling_pcpu = Some(0);
    let (vpmu, pcpu) = (&m.vpmu, &mut m.pcpus[0]);
    let (platform, vcpus) = (
        &mut ExcludedPlatform(&mut m.platform),
        &ExcludedTable(&m.vcpus),
    );
    let mark = Mark::take(pcpu.hw());
    let outcome = match measured {
        Some(pass) => pass.run(|| vpmu.handle_pmi(platform, pcpu, vcpus)),
        None => vpmu.handle_pmi(platform, pcpu, vcpus),
    };
    let cost = mark.since(pcpu.hw());
    m.platform.calling_pcpu = None;
    Some((outcome, cost))
}

fn overflow_and_raise<V: SimVendor>(m: &mut Machine<Excluded<V>>) -> bool
where
    V::Model: Clone,
{
    let model = m.pcpus[0].hw_mut();
    model.count(HwEvent::Instructions, PERIOD, KERNEL);
    model.take_pmi()
}

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

/// The MSR accesses a pCPU's model served and the heap allocations made, at one moment.
#[derive(Clone, Copy)]
struct Mark {
    accesses: u64,
    allocations: u64,
}

impl Mark {
    fn take(model: &impl SoftwarePmu) -> Self {
        Mark {
            accesses: model.access_stats().total(),
            allocations: alloc_count(),
        }
    }

    /// (MSR accesses, allocations) since `self`.
    fn since(self, model: &impl SoftwarePmu) -> (u64, u64) {
        let now = Mark::take(model);
        (
            now.accesses - self.accesses,
            now.allocations - self.allocations,
        )
    }
}

fn alloc_count() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

fn run(vendor: &str, scenario: &str) -> Result<Measured, String> {
    let scenario = SCENARIOS
        .iter()
        .chain(&CALIBRATIONS)
        .find(|(name, _)| *name == scenario)
        .map(|&(_, s)| s)
        .ok_or_else(|| format!("no scenario {scenario:?} (instructions list)"))?;
    match vendor {
        "intel-v5" => run_scenario(intel_v5(), scenario),
        "amd-perfmonv2" => run_scenario(amd_v2(), scenario),
        other => Err(format!("no vendor {other:?}: intel-v5 or amd-perfmonv2")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["list"] => Ok(SCENARIOS
            .iter()
            .map(|(n, _)| format!("{n}\n"))
            .collect::<String>()),
        ["run", vendor, scenario] | ["run", vendor, scenario, "--with-platform"] => {
            if args.len() == 4 {
                count_platform();
            }
            run(vendor, scenario).map(|m| {
                let (calls, callbacks) = crossings();
                format!(
                    "msr_accesses={} allocations={} counters={} platform_calls={calls} \
                     callbacks={callbacks}\n",
                    m.msr_accesses, m.allocations, m.counters_used
                )
            })
        }
        ["table"] => table::table(),
        ["trace", vendor, scenario] => {
            TRACING.store(true, Ordering::Relaxed);
            run(vendor, scenario).map(|m| format!("msr_accesses={}\n", m.msr_accesses))
        }
        _ => Err(
            "usage: instructions list | run VENDOR SCENARIO [--with-platform] | trace VENDOR SCENARIO | table".into(),
        ),
    };
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("instructions: {e}");
            ExitCode::FAILURE
        }
    }
}
