//! Deterministic cost of the core's hot paths: instructions retired by the core itself per
//! operation, counted by valgrind's callgrind, with the MSR accesses each operation made, the
//! platform calls, and heap allocations.
//!
//! * `instructions table` runs every scenario of both vendors in its own process under
//!   `valgrind --tool=callgrind` and prints a Markdown table, with two references per row: the
//!   must-change minimum of MSR accesses and what Xen's VPMU does for the same scenario
//!   (`reference.rs` works both out, row by row), and the budget each row must meet. The
//!   instructions are the core's alone: the MSR bus, the software PMU model, the platform and
//!   the vCPU table (the integrator's parts) are excluded, and the calls into the platform
//!   and the table are counted in their own column.
//! * `instructions run VENDOR SCENARIO [--with-platform]` is one such process: it sets the
//!   scenario up, runs the operation once to warm up, then once more inside
//!   `vpmu_bench_measured`, the only function callgrind collects in (`--collect-atstart=no
//!   --toggle-collect`); `harness.rs` says how the excluded parts are toggled out.
//!   `--with-platform` counts the simulator's platform and vCPU table with the core (for
//!   profiling the whole path by hand).
//! * `instructions trace VENDOR SCENARIO` prints the MSR accesses of the measured operation.
//! * `instructions list [VENDOR]` lists the scenarios (those that exist on `VENDOR`).
//!
//! Every scenario checks, on both passes, that it exercised what its name says (the other
//! vCPU's counters really counted, the number of overflowed counters is the row's, the catch-up
//! really caught up, the request really crossed pCPUs, ...), and fails the run otherwise.
//!
//! Instruction counts are deterministic for one binary: no timing is involved. The harness's
//! own instructions (the measuring call, the wrappers around each excluded call) are not
//! subtracted per access or per call: `table.rs` attributes every instruction callgrind
//! collected by its source line, and removes those of this binary's own files (and of the
//! standard library inlined into its functions). Calibration runs that measure nothing but
//! the harness (an empty measurement, one excluded MSR access, one excluded platform call,
//! one excluded vCPU visit, one unmeasured step) must then come out at 0 core instructions, or the table is not
//! printed: that checks the attribution. `scripts/instructions.sh` installs valgrind and runs
//! the table.

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

mod harness;
mod intercepts;
mod pmis;
mod reference;
mod request;
mod switches;
mod table;

use harness::{CALLBACKS, Excluded, PLATFORM_CALLS, TRACING, count_platform, vpmu_bench_measured};
use reference::minimum;
use vpmu::{MsrOutcome, VcpuId};
use vpmu_models::{ExecMode, SoftwarePmu};
use vpmu_sim::{Machine, SimVendor, amd_v2, intel_v5};

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

    /// Both passes, in order.
    const BOTH: [Pass; 2] = [Pass::WarmUp, Pass::Measured];
}

/// The profiling domain's vCPU, a guest vCPU, and a second vCPU of the same guest.
const P: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };
/// Instructions between two samples.
const PERIOD: u64 = 1000;

const KERNEL: ExecMode = ExecMode {
    cpl: 0,
    host: false,
};

/// The simulated machine of a scenario, its PMU models behind the excluded bus.
type M<V> = Machine<Excluded<V>>;

/// What one scenario measures. `None` as a counter count means every counter that can count
/// instructions (8 GP and fixed counter 0 on Intel v5, 6 on AMD PerfMonV2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// An intercepted WRMSR of A's loaded counter 0 (its value).
    Wrmsr,
    /// An intercepted RDMSR of A's loaded counter 0.
    Rdmsr,
    /// An intercepted WRMSR of A's loaded, enabled counter 0's event select (a new event).
    WrmsrEvtsel,
    /// An intercepted WRMSR of the global control enabling (`true`) or disabling A's 4
    /// programmed counters.
    WrmsrGlobal(bool),
    /// Intel: an intercepted WRMSR of FIXED_CTR_CTRL changing loaded fixed counter 0's rings.
    WrmsrFixedCtrl,
    /// A vCPU's first PMU MSR write (Linux's `check_hw_exists` counter write), which takes its
    /// vPMU from unused to in use.
    WrmsrFirstUse,
    /// A's WRMSR of its loaded counter 0 on pCPU 0 after a mode change (self ⇄ hv, made on
    /// pCPU 1) that pCPU 0 has not caught up with: the intercept catches it up.
    WrmsrCatchUp,
    /// A with `n` counters switched out for B, which never used the PMU, and back in.
    SwitchPair(Option<u32>),
    /// A with `n` counters switched out for B with the same `n` counters counting too (B's
    /// general-purpose counters count branches when `other_events`, else instructions) and
    /// back in.
    SwitchBusy { n: Option<u32>, other_events: bool },
    /// `SwitchBusy` with 4 counters, same events, on two pCPUs: A and B swap pCPUs, each
    /// loaded on the pCPU the other one last ran on.
    SwitchMigrated,
    /// `n` of A's sampling counters overflow at once; the PMI is delivered through A's
    /// virtual LVTPC.
    PmiLvtpc(Option<u32>),
    /// All mode: `n` of P's sampling counters overflow at once while A runs; the sample goes
    /// into P's page.
    PmiSample(Option<u32>),
    /// Self mode: `n` of A's sampling counters overflow at once; A has a sample ring (ABI
    /// 1.4), so the overflow is re-armed on the hardware and the sample becomes a record.
    PmiRing(Option<u32>),
    /// P flushes the sample (its counter re-armed and acknowledged in the page).
    Flush,
    /// As `Flush`, with the profiler also editing counter 0's control in the page.
    FlushCtrl,
    /// All mode, two pCPUs: P's WRMSR on pCPU 0 sends a `SystemWrite` to pCPU 1, which
    /// completes it.
    Request,
    /// Calibration: nothing but the measuring harness itself (must measure 0).
    CalibrateEmpty,
    /// Calibration: one RDMSR through the excluded bus and nothing else (must measure 0).
    CalibrateAccess,
    /// Calibration: one excluded platform call (`privileged_domain`) (must measure 0).
    CalibratePlatformCall,
    /// Calibration: one excluded vCPU-table visit with an empty callback (must measure 0).
    CalibrateCallback,
    /// Calibration: one unmeasured step between measured calls (must measure 0).
    CalibrateUnmeasured,
}

/// The calibration runs, not rows of the table.
const CALIBRATIONS: [(&str, Scenario); 5] = [
    ("calibrate-empty", Scenario::CalibrateEmpty),
    ("calibrate-access", Scenario::CalibrateAccess),
    ("calibrate-platform-call", Scenario::CalibratePlatformCall),
    ("calibrate-callback", Scenario::CalibrateCallback),
    ("calibrate-unmeasured", Scenario::CalibrateUnmeasured),
];

/// The rows of the table, in order.
const SCENARIOS: [(&str, Scenario); 26] = [
    ("wrmsr", Scenario::Wrmsr),
    ("rdmsr", Scenario::Rdmsr),
    ("wrmsr-evtsel", Scenario::WrmsrEvtsel),
    ("wrmsr-global-enable", Scenario::WrmsrGlobal(true)),
    ("wrmsr-global-disable", Scenario::WrmsrGlobal(false)),
    ("wrmsr-fixed-ctrl", Scenario::WrmsrFixedCtrl),
    ("wrmsr-first-use", Scenario::WrmsrFirstUse),
    ("wrmsr-catch-up", Scenario::WrmsrCatchUp),
    ("switch-1", Scenario::SwitchPair(Some(1))),
    ("switch-4", Scenario::SwitchPair(Some(4))),
    ("switch-all", Scenario::SwitchPair(None)),
    (
        "switch-4-same",
        Scenario::SwitchBusy {
            n: Some(4),
            other_events: false,
        },
    ),
    (
        "switch-4-other",
        Scenario::SwitchBusy {
            n: Some(4),
            other_events: true,
        },
    ),
    (
        "switch-all-both",
        Scenario::SwitchBusy {
            n: None,
            other_events: true,
        },
    ),
    ("switch-4-migrated", Scenario::SwitchMigrated),
    ("pmi-lvtpc-1", Scenario::PmiLvtpc(Some(1))),
    ("pmi-lvtpc-3", Scenario::PmiLvtpc(Some(3))),
    ("pmi-lvtpc-all", Scenario::PmiLvtpc(None)),
    ("pmi-sample-1", Scenario::PmiSample(Some(1))),
    ("pmi-sample-3", Scenario::PmiSample(Some(3))),
    ("pmi-sample-all", Scenario::PmiSample(None)),
    ("pmi-ring-1", Scenario::PmiRing(Some(1))),
    ("pmi-ring-all", Scenario::PmiRing(None)),
    ("flush", Scenario::Flush),
    ("flush-ctrl", Scenario::FlushCtrl),
    ("request", Scenario::Request),
];

/// Issue 13's names of the one-counter PMI rows, which `run` and `trace` still accept.
const ALIASES: [(&str, Scenario); 3] = [
    ("pmi-lvtpc", Scenario::PmiLvtpc(Some(1))),
    ("pmi-sample", Scenario::PmiSample(Some(1))),
    ("pmi-ring", Scenario::PmiRing(Some(1))),
];

const VENDORS: [&str; 2] = ["intel-v5", "amd-perfmonv2"];

/// Whether `scenario` exists on `vendor` (AMD has no fixed counters).
fn applies(vendor: &str, scenario: Scenario) -> bool {
    scenario != Scenario::WrmsrFixedCtrl || vendor.starts_with("intel")
}

/// What a measured run reports on stdout (besides the instructions callgrind counts).
struct Measured {
    msr_accesses: u64,
    allocations: u64,
    /// Counters of the PMU the measured operation concerns (a switch pair's `k`, a PMI's
    /// overflowed counters).
    counters_used: u32,
}

/// The crossings into the excluded platform and back made by the measured operation.
fn crossings() -> (u64, u64) {
    (
        PLATFORM_CALLS.load(Ordering::Relaxed),
        CALLBACKS.load(Ordering::Relaxed),
    )
}

/// Fails the run with `what` unless `ok`: a scenario that did not exercise what its name says.
fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

/// An intercepted access the core must handle.
fn handled<T>(outcome: &Result<MsrOutcome<T>, vpmu::CoreError>) -> bool {
    matches!(outcome, Ok(MsrOutcome::Handled(_)))
}

fn run_scenario<V: SimVendor>(vendor: V, scenario: Scenario) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let excluded = Excluded(vendor);
    match scenario {
        Scenario::CalibrateEmpty
        | Scenario::CalibrateAccess
        | Scenario::CalibratePlatformCall
        | Scenario::CalibrateCallback
        | Scenario::CalibrateUnmeasured => intercepts::calibrate(excluded, scenario),
        Scenario::Wrmsr | Scenario::Rdmsr => intercepts::counter_access(excluded, scenario),
        Scenario::WrmsrEvtsel => intercepts::evtsel(excluded),
        Scenario::WrmsrGlobal(enable) => intercepts::global(excluded, enable),
        Scenario::WrmsrFixedCtrl => intercepts::fixed_ctrl(excluded),
        Scenario::WrmsrFirstUse => intercepts::first_use(excluded),
        Scenario::WrmsrCatchUp => intercepts::catch_up(excluded),
        Scenario::SwitchPair(n) => switches::idle_pair(excluded, n),
        Scenario::SwitchBusy { n, other_events } => switches::busy_pair(excluded, n, other_events),
        Scenario::SwitchMigrated => switches::migrated(excluded),
        Scenario::PmiLvtpc(n) => pmis::lvtpc(excluded, n),
        Scenario::PmiSample(n) => pmis::sample(excluded, n, None),
        Scenario::PmiRing(n) => pmis::ring(excluded, n),
        Scenario::Flush => pmis::sample(excluded, Some(1), Some(false)),
        Scenario::FlushCtrl => pmis::sample(excluded, Some(1), Some(true)),
        Scenario::Request => request::system_write(excluded),
    }
}

/// The MSR accesses every pCPU's model served and the heap allocations made, at one moment.
#[derive(Clone, Copy)]
struct Mark {
    accesses: u64,
    allocations: u64,
}

impl Mark {
    fn of<V: SimVendor>(m: &M<V>) -> Self
    where
        V::Model: Clone,
    {
        Mark {
            accesses: m.pcpus.iter().map(|p| p.hw().access_stats().total()).sum(),
            allocations: ALLOCATIONS.load(Ordering::Relaxed),
        }
    }

    /// (MSR accesses, allocations) since `self`.
    fn since<V: SimVendor>(self, m: &M<V>) -> (u64, u64)
    where
        V::Model: Clone,
    {
        let now = Mark::of(m);
        (
            now.accesses - self.accesses,
            now.allocations - self.allocations,
        )
    }
}

fn find(scenario: &str) -> Result<Scenario, String> {
    SCENARIOS
        .iter()
        .chain(&ALIASES)
        .chain(&CALIBRATIONS)
        .find(|(name, _)| *name == scenario)
        .map(|&(_, s)| s)
        .ok_or_else(|| format!("no scenario {scenario:?} (instructions list)"))
}

fn run(vendor: &str, scenario: &str) -> Result<Measured, String> {
    let name = scenario;
    let scenario = find(scenario)?;
    if !applies(vendor, scenario) {
        return Err(format!("{name} does not exist on {vendor}"));
    }
    match vendor {
        "intel-v5" => run_scenario(intel_v5(), scenario),
        "amd-perfmonv2" => run_scenario(amd_v2(), scenario),
        other => Err(format!("no vendor {other:?}: intel-v5 or amd-perfmonv2")),
    }
}

fn list(vendor: Option<&str>) -> String {
    SCENARIOS
        .into_iter()
        .filter(|&(_, s)| vendor.is_none_or(|v| applies(v, s)))
        .map(|(n, _)| format!("{n}\n"))
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["list"] => Ok(list(None)),
        ["list", vendor] if VENDORS.contains(vendor) => Ok(list(Some(vendor))),
        ["run", vendor, scenario] | ["run", vendor, scenario, "--with-platform"] => {
            if args.len() == 4 {
                count_platform();
            }
            let name = *scenario;
            run(vendor, scenario).map(|m| {
                let (calls, callbacks) = crossings();
                let least = find(name).map_or(0, |s| minimum(vendor, s, m.counters_used));
                format!(
                    "msr_accesses={} minimum={least} allocations={} counters={} \
                     platform_calls={calls} callbacks={callbacks}\n",
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
            "usage: instructions list [VENDOR] | run VENDOR SCENARIO [--with-platform] | \
                  trace VENDOR SCENARIO | table"
                .into(),
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
