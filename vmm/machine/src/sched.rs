//! The vCPUs of one pCPU (one software PMU model), time-sliced on ONE host thread: round
//! robin, a slice of `SLICE_EXITS` exits each (timed source: `SLICE_TIME` of the thread's CPU
//! time; a vCPU preempted by a boosted one finishes its slice afterwards), with
//! `Vpmu::context_switch` at every switch (it saves the outgoing vCPU's counters from the
//! model and loads the incoming one's). Each VM has its own vCPU fd and `kvm_run` page; the
//! thread's kicker is pointed at the page of the vCPU it runs.

use std::time::{Duration, Instant};

use vpmu::SystemContext;

use super::runner::Runner;
use super::{Pcpu, PmiRecord, RunResult};
use crate::error::MachineError;
use crate::kick::ThreadKick;
use crate::personality::Personality;

/// Exits per time slice: small, so that the switches land inside the measured loops (a
/// single-stepped instruction is one exit).
pub(super) const SLICE_EXITS: u64 = 7;

/// Timed mode on a shared pCPU: the longest slice.
pub(crate) const SLICE_TIME: Duration = Duration::from_millis(1);

/// A time slice of a vCPU on a shared pCPU: at most `exits` exits and, with the timed source,
/// at most `time` (a CPL3 workload may run without exits for as long as no counter is about to
/// overflow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slice {
    pub(crate) exits: u64,
    pub(crate) time: Duration,
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`; guest execution inside
/// `KVM_RUN` is the thread's), zero if the clock cannot be read.
pub(crate) fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut t) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// A whole slice.
const FULL_SLICE: Slice = Slice {
    exits: SLICE_EXITS,
    time: SLICE_TIME,
};

/// Runs `runners` (all on pCPU `cpu`, which this thread is) alternately until each writes its
/// exit status, fails, or `timeout` passes; with `finish_with`, until those domains' vCPUs
/// have (the others are stopped). A vCPU sent the PMU VIRQ while another runs ends that slice
/// and runs next. Results in the order of `runners` (the caller adds the statistics), and the
/// pCPU's PMI record.
pub(super) fn run_shared<P: Personality>(
    mut runners: Vec<Runner<'_, P>>,
    cpu: Pcpu<P>,
    timeout: Duration,
    finish_with: Option<&[u32]>,
) -> (Vec<RunResult>, Vec<PmiRecord>) {
    let start = Instant::now();
    let mut results = vec![RunResult::default(); runners.len()];
    let mut done = vec![false; runners.len()];
    let required: Vec<bool> = runners
        .iter()
        .map(|r| finish_with.is_none_or(|d| d.contains(&r.me.domain)))
        .collect();
    let group: Vec<_> = runners.iter().map(|r| r.me).collect();
    let pcpu = cpu.pmu.index();
    let mut cpu = cpu;
    cpu.ring_poll.vcpus.clone_from(&group);
    let mut cpu = Some(cpu);
    let Some(first) = runners.first_mut() else {
        return (results, Vec::new());
    };
    let shared = first.shared;
    // Declared after `runners`, so dropped before the vCPUs whose pages it points at.
    let kick = match ThreadKick::new(first.vcpu.fd.get_kvm_run(), &shared.host) {
        Ok(kick) => kick,
        Err(e) => {
            for r in &mut results {
                r.error = Some(e.to_string());
            }
            first.cpu = cpu.take();
            let (log, _) = first.leave_pcpu();
            return (results, log);
        }
    };
    kick.register(pcpu);
    // Round robin; a boosted vCPU runs out of turn without moving the rotation, so that the
    // profiler's wake-ups do not starve the vCPUs after it, and the vCPUs it preempted then
    // finish their slices (latest first), so that the samples do not shape the schedule.
    let mut rotation = 0;
    let mut boosted: Option<usize> = None;
    let mut preempted: Vec<usize> = Vec::new();
    // A Linux domain's vCPU halted in `hlt`: until when its turns are passed over (`idle`).
    let mut idle: Vec<Option<Instant>> = vec![None; runners.len()];
    let idle_aware: Vec<bool> = runners.iter().map(|r| r.devices.is_some()).collect();
    // Its last slice ended halted: it is idling, and may halt again in the next one.
    let mut halting = vec![false; runners.len()];
    let held = |r: &Runner<'_, P>| shared.hold.holds(r.me.domain);
    while done.iter().zip(&required).any(|(&d, &r)| r && !d) {
        let now = Instant::now();
        // An idle vCPU whose timer is due runs next, as one sent an interrupt by the VMM.
        let due = idle.iter().position(|w| w.is_some_and(|t| t <= now));
        let picked = boosted.take().or(due).or_else(|| preempted.pop());
        let i = picked.unwrap_or_else(|| {
            let i = rotation;
            rotation = (rotation + 1) % runners.len();
            i
        });
        if !done[i] && held(&runners[i]) {
            if (0..runners.len()).all(|j| done[j] || held(&runners[j])) {
                // Nobody left to release them (domain 0 ends the hold when it ends).
                shared.hold.release();
            }
            continue;
        }
        // An idle vCPU's turn goes to the others while one of them can run.
        let blocked = |j: usize| done[j] || held(&runners[j]) || idle[j].is_some_and(|t| t > now);
        let others = (0..runners.len()).any(|j| j != i && !blocked(j));
        if picked.is_none() && blocked(i) && others {
            continue;
        }
        idle[i] = None;
        let slice_start = Instant::now();
        let mut budget = runners[i].preempted.take().unwrap_or(FULL_SLICE);
        if done[i] {
            continue;
        }
        // The slice ends when an idle vCPU's timer fires.
        if let Some(wake) = idle.iter().flatten().min() {
            budget.time = budget.time.min(
                wake.saturating_duration_since(now)
                    .max(crate::idle::MIN_SLICE),
            );
        }
        // A vCPU that may halt in its slice while another could use the pCPU is looked at
        // often: its `hlt` would block in KVM_RUN for the rest of the slice. Only while it is
        // idling: each look is an exit, which a busy vCPU need not pay.
        runners[i].halt_check =
            (idle_aware[i] && halting[i] && others).then_some(crate::idle::HALT_CHECK);
        let runner = &mut runners[i];
        kick.kick().retarget(runner.vcpu.fd.get_kvm_run());
        let me = runner.me;
        runner.cpu = cpu.take();
        shared.host.unwake(me);
        let switched = runner.switch(Some(me));
        runner.slices += 1;
        let slice = switched
            .map_err(|error| MachineError::Core {
                call: "context_switch",
                error,
            })
            .and_then(|()| runner.run_loop(timeout, start, &mut results[i], &kick, Some(budget)));
        cpu = runner.cpu.take();
        if runner.preempted.is_some() && !preempted.contains(&i) {
            preempted.push(i);
        }
        match slice {
            Ok(finished) => done[i] = finished,
            Err(e) => {
                results[i].error = Some(e.to_string());
                done[i] = true;
            }
        }
        if idle_aware[i] && !done[i] {
            (idle[i], halting[i]) = runners[i].idle_until();
            if halting[i] {
                results[i].idle_slices += 1;
                results[i].idle_slice_ns += slice_start.elapsed().as_nanos();
            }
        }
        if done[i] && runners[i].me.domain == crate::PRIVILEGED_DOMAIN {
            shared.hold.release();
        }
        // The boost: a vCPU of this pCPU that was sent the PMU VIRQ runs next. A vCPU that is
        // done leaves the list (it would end every other slice at once otherwise).
        if done[i] {
            shared.host.unwake(me);
        }
        // First of all the vCPU whose page holds this pCPU's system-wide sample (all mode):
        // the pCPU's counters are stopped until it flushes, so whoever ran instead would run
        // uncounted (its own slice does not end while it holds one; this covers the rest).
        let reader = cpu.as_ref().and_then(|c| match c.pmu.system() {
            SystemContext::Cached { profiler, .. } => Some(*profiler),
            _ => None,
        });
        let woken = reader
            .filter(|r| group.contains(r))
            .or_else(|| shared.host.first_woken(&group))
            .and_then(|w| runners.iter().position(|r| r.me == w));
        if let Some(w) = woken.filter(|&w| !done[w]) {
            boosted = Some(w);
        }
    }
    for (result, finished) in results.iter_mut().zip(&done) {
        result.stopped = !finished;
    }
    // The vCPU still on the pCPU is switched off (its context saved) by its own runner, and
    // the pCPU leaves service.
    let current = cpu.as_ref().and_then(|c| c.pmu.current());
    let last = runners
        .iter()
        .position(|r| Some(r.me) == current)
        .unwrap_or(0);
    runners[last].cpu = cpu.take();
    let (log, left) = runners[last].leave_pcpu();
    if let (Some(e), Some(r)) = (left, results.get_mut(last)) {
        r.error.get_or_insert(e.to_string());
    }
    drop(kick);
    for (result, runner) in results.iter_mut().zip(&runners) {
        result.elapsed = start.elapsed();
        result.pmis = runner.state.pmis;
        result.pmi_timing = runner.state.timing;
        result.vcpu = Some(runner.me);
        result.guest_ns = runner.run_ns;
        result.halted_ns = runner.halted_ns;
        result.pmi_contexts.clone_from(&runner.state.pmi_contexts);
    }
    (results, log)
}
