//! The scenario on both CPUs: their synchronization, the run of checks (`Run`) and its order.

use core::fmt::Write as _;
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};

use vpmu::abi::ops::{XENPMU_MODE_HV, XENPMU_MODE_SELF};
use vpmu::msr::hardware::HardwareMsrBus;
use vpmu::{MsrOutcome, PmuBackend, VcpuId};
use vpmu_guest_protocol::ring0 as proto;

use crate::hw::{TracedBus, relax, trace_word, without_interrupts};
use crate::plan::{EN, INSTRUCTIONS, OS, Plan};
use crate::platform::{CURRENT, HANDLER_ERRORS, InnerPlatform, NONE, PMIS_SPURIOUS, QUEUE_FULL};
use crate::report::{Name, check, check_val, name, say};
use crate::world::World;
use crate::{PCPUS, guest};

// ---------------------------------------------------------------------------------------------
// Synchronization of the two CPUs.

static BARRIER: AtomicU64 = AtomicU64::new(0);

/// Waits until both CPUs arrived (`round` counts from 1; interrupts are let in meanwhile).
fn barrier(round: u64) {
    BARRIER.fetch_add(1, SeqCst);
    let mut spins = 0u64;
    while BARRIER.load(SeqCst) < round * PCPUS as u64 {
        relax();
        spins += 1;
        if spins > 50_000_000 {
            break;
        }
    }
}

/// Waits (interrupts on) until `counter` reaches `value`; false on a timeout.
pub(crate) fn wait_for(counter: &AtomicU64, value: u64) -> bool {
    let mut spins = 0u64;
    while counter.load(SeqCst) < value {
        relax();
        spins += 1;
        if spins > 5_000_000 {
            return false;
        }
    }
    true
}

/// Per CPU, figures: switches that saved one context and loaded another, and their MSR accesses.
/// The hardware accesses of each switch that saved one context and loaded another (stored
/// at a constant cost: the next context counts while it is written).
struct Figures {
    per_switch: [u64; 64],
    len: usize,
}

pub(crate) struct Run<'w, B: PmuBackend> {
    pub(crate) w: &'w World<B>,
    pub(crate) cpu: u32,
    pub(crate) plan: Plan,
    figures: Figures,
}

impl<B: PmuBackend> Run<'_, B>
where
    B::Context: Send,
{
    pub(crate) fn check(&self, name: Name, ok: bool) -> bool {
        check(self.cpu, name, ok)
    }

    pub(crate) fn check_val(&self, name: Name, got: u64, want: u64) -> bool {
        check_val(self.cpu, name, got, want)
    }

    /// Programs counter 0 of `v` (instructions, OS, enabled) while it runs here.
    fn program(&mut self, v: VcpuId) -> bool {
        let p = self.plan;
        let ok = self.w.switch(self.cpu, Some(v))
            && self.w.wr(self.cpu, v, p.ctl(0), EN | OS | INSTRUCTIONS)
                == Some(MsrOutcome::Handled(()))
            && self.w.wr(self.cpu, v, p.ctr(0), 0) == Some(MsrOutcome::Handled(()))
            && p.global
                .is_none_or(|g| self.w.wr(self.cpu, v, g, 1) == Some(MsrOutcome::Handled(())));
        self.check(
            name!(
                "cpu{} programs inner vCPU {} counter 0 through the intercepts",
                self.cpu,
                v.vcpu
            ),
            ok,
        )
    }

    /// Switches to `next` and counts the accesses of a switch that saved and loaded.
    pub(crate) fn switch_counted(&mut self, next: Option<VcpuId>) -> bool {
        let before = self.w.accesses(self.cpu);
        let prev = CURRENT[self.cpu as usize].load(SeqCst);
        let ok = self.w.switch(self.cpu, next);
        let n = self.w.accesses(self.cpu) - before;
        let f = &mut self.figures;
        // Branch-free: 0 for a switch that did not both save and load.
        let counted = n * u64::from(prev != NONE) * u64::from(next.is_some());
        f.per_switch[f.len % 64] = counted;
        f.len += 1;
        ok
    }
}

// ---------------------------------------------------------------------------------------------
// The scenario, on both CPUs.

pub(crate) fn scenario<B: PmuBackend + Sync>(w: &World<B>, cpu: u32)
where
    B::Context: Send,
{
    let mut run = Run {
        w,
        cpu,
        plan: w.plan,
        figures: Figures {
            per_switch: [0; 64],
            len: 0,
        },
    };
    let mut round = 0u64;
    let mut sync = || {
        round += 1;
        barrier(round);
    };
    // Attach this CPU with the hardware bus.
    let bus = TracedBus {
        pcpu: cpu,
        // SAFETY: CPL0; the backend touches only the PMU MSRs CPUID enumerated; this CPU's
        // PMU belongs to this inner hypervisor alone.
        hw: unsafe { HardwareMsrBus::new() },
        accesses: 0,
    };
    let attached = without_interrupts(|| {
        trace_word(proto::TRACE_BEGIN, proto::OP_ATTACH, cpu, NONE);
        let r = w.vpmu.attach_pcpu(cpu, bus);
        trace_word(proto::TRACE_END, proto::OP_ATTACH, cpu, NONE);
        r
    });
    let ok = match attached {
        Ok(p) => {
            without_interrupts(|| {
                // SAFETY: this CPU's own slot, interrupts off, nothing else refers to it.
                unsafe { *w.cpus[cpu as usize].0.get() = Some(p) };
            });
            true
        }
        Err(_) => false,
    };
    run.check(name!("cpu{cpu} attach_pcpu with the hardware bus"), ok);
    sync();
    if !ok {
        return;
    }

    // Exact counts and isolation: two inner vCPUs per CPU, switched back and forth.
    let (x, y) = (guest(2 * cpu), guest(2 * cpu + 1));
    let (ox, oy) = (guest(2 * (1 - cpu)), guest(2 * (1 - cpu) + 1));
    run.program(x);
    run.program(y);
    run.switch_counted(Some(x));
    // Loop lengths differ per CPU so that a count leaking between CPUs would show.
    let k = u64::from(cpu) * 7;
    for (v, n, then) in [
        (x, 100 + k, Some(y)),
        (y, 600 + k, Some(x)),
        (x, 300, Some(y)),
        (y, 50 + k, Some(x)),
        (x, 120, Some(y)),
        (y, 400, None),
    ] {
        run.seg(v, n, then, 1);
    }
    sync();
    // Migration: each CPU runs the other's inner vCPUs (saved there, loaded here).
    run.switch_counted(Some(ox));
    for (v, n, then) in [
        (ox, 200 + k, Some(oy)),
        (oy, 500, Some(ox)),
        (ox, 60, Some(oy)),
        (oy, 110 + k, None),
    ] {
        run.seg(v, n, then, 2);
    }
    sync();
    run.judge_segments();
    run.check(
        name!("cpu{cpu} idle between contexts"),
        CURRENT[cpu as usize].load(SeqCst) == NONE,
    );
    run.idle_clean("after switching out");

    // #GP and PMIs, with this CPU's first vCPU running again.
    run.switch_counted(Some(x));
    run.gp_checks(x);
    run.pmis(x);
    sync();

    // Cross-CPU operations through IPIs: x runs on each CPU, counting.
    let first = guest(0); // on cpu0
    let third = guest(2); // on cpu1
    if cpu == 1 {
        run.teardown_remote(first);
        run.still_exact(x, "after its CPU tore down cpu0's vCPU");
    }
    sync();
    if cpu == 0 {
        run.idle_clean("after cpu1 tore down its running vCPU");
        run.switch_counted(Some(y));
    }
    sync();
    if cpu == 0 {
        run.teardown_remote(third);
        run.still_exact(y, "after its CPU tore down cpu1's vCPU");
    }
    sync();
    if cpu == 1 {
        run.idle_clean("after cpu0 tore down its running vCPU");
        run.switch_counted(Some(y));
    }
    sync();
    if cpu == 0 {
        run.mode_set(XENPMU_MODE_HV);
        run.still_exact(y, "after the mode change");
    }
    sync();
    if cpu == 1 {
        run.mode_set(XENPMU_MODE_SELF);
        run.still_exact(y, "after the mode change");
    }
    sync();

    // Idle: nothing counts, then the CPU leaves.
    run.switch_counted(None);
    run.idle_clean("idle at the end");
    let f = &run.figures;
    let counted = f.per_switch[..f.len.min(64)].iter().filter(|&&n| n > 0);
    let (mut switches, mut sum, mut min, mut max) = (0u64, 0u64, u64::MAX, 0u64);
    for &n in counted {
        switches += 1;
        sum += n;
        min = min.min(n);
        max = max.max(n);
    }
    say(name!(
        "RING0 figure: cpu{cpu} switches saving and loading: {switches}, MSR accesses per switch {}..{max} (mean {}.{})",
        if switches > 0 { min } else { 0 },
        sum / switches.max(1),
        (sum * 10 / switches.max(1)) % 10
    ));
    run.check_val(
        name!("cpu{cpu} no core call failed in a handler"),
        HANDLER_ERRORS[cpu as usize].load(SeqCst),
        0,
    );
    run.check_val(
        name!("cpu{cpu} no spurious PMI"),
        PMIS_SPURIOUS[cpu as usize].load(SeqCst),
        0,
    );
    sync();
    let detached = without_interrupts(|| {
        trace_word(proto::TRACE_BEGIN, proto::OP_DETACH, cpu, NONE);
        // SAFETY: this CPU's own slot, interrupts off, nothing else refers to it.
        let slot = unsafe { &mut *w.cpus[cpu as usize].0.get() };
        let r = slot
            .take()
            .map(|p| w.vpmu.detach_pcpu(&mut InnerPlatform, p, &w.table).is_ok());
        trace_word(proto::TRACE_END, proto::OP_DETACH, cpu, NONE);
        r
    });
    run.check(name!("cpu{cpu} detach_pcpu"), detached == Some(true));
    if cpu == 0 {
        run.check(
            name!("request queues never overflowed"),
            !QUEUE_FULL.load(SeqCst),
        );
    }
}
