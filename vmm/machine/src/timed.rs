//! The timed event source: the duration of each `KVM_RUN`, in TSC ticks, fed as core and
//! reference cycles; the overflow deadline is computed arithmetically by the model
//! (`SoftwarePmu::cycles_until_pmi`: the distance of each interrupting cycles counter to its
//! wrap), with no copy of the model and no search. The bisection on copies of the model it
//! replaced (13–22 k instructions per entry) is the tests' oracle, `vpmu_models::oracle`;
//! `cargo bench -p vpmu-tests --bench hot_paths` compares the two.

use std::time::Duration;

use vpmu::Mode;
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

use super::PRIVILEGED_DOMAIN;
use super::runner::Runner;
use crate::error::Result;
use crate::halt::EmulationCount;
use crate::personality::Personality;

impl<P: Personality> Runner<'_, P> {
    /// Timed mode: `KVM_RUN` lasted `ran` of wall time, of which the thread was on a CPU for
    /// `on_cpu`; feed the cycles of the time the vCPU ran: not the time the host ran other
    /// threads, nor the time it was halted (unhalted cycles: a `hlt` counts nothing; the
    /// halt-polling host spins on the CPU for the halted vCPU), exact over time (the
    /// fractional remainder carries over). The same time is the vCPU's CPU time
    /// (`RunResult::guest_ns`), so samples and CPU time have one measure.
    ///
    /// A run that began and ended with the vCPU halted (a guest parked in `hlt`, brought out
    /// by the VMM's kick) executed nothing at all: what is left of it after the halted time is
    /// KVM's entry and exit, not the guest's, and feeds nothing (else a parked guest would
    /// collect samples at the instruction after its `hlt`).
    pub(super) fn feed_cycles(&mut self, ran: Duration, on_cpu: Duration, entry: ExecMode) {
        let halted = self.halted_during_run(ran);
        // Only a run with halted time can end halted (one KVM_GET_MP_STATE then). KVM's halt
        // statistics also grow in runs of vCPUs that never execute `hlt` (under kvm_pvm:
        // ~25 % of a busy guest's runs), so they are believed only for a vCPU that is halted
        // at the exit.
        let halted_now = !halted.is_zero() && self.vcpu_halted();
        self.halted_in_run = halted_now;
        let parked = halted_now && self.halted_at_entry;
        self.halted_at_entry = halted_now;
        let unhalted = if parked {
            Duration::ZERO
        } else if halted_now {
            (ran - halted).min(on_cpu)
        } else {
            ran.min(on_cpu)
        };
        self.halted_ns += (ran - unhalted).as_nanos();
        self.run_ns += unhalted.as_nanos();
        if self.split.is_some() {
            self.feed_split(unhalted.as_nanos(), entry);
            return;
        }
        let total = (self.run_ns * u128::from(self.tsc_khz) / 1_000_000) as u64;
        let cycles = total - self.fed_cycles;
        self.fed_cycles = total;
        if cycles == 0 {
            return;
        }
        let mode = self.mode();
        let model = self.model();
        model.count(HwEvent::CoreCycles, cycles, mode);
        model.count(HwEvent::RefCycles, cycles, mode);
    }

    /// A host that emulates CPL0: the run's unhalted time, split between CPL0 and CPL3 by the
    /// instructions KVM emulated in it (`CplSplit`), fed to each level's counters.
    fn feed_split(&mut self, unhalted_ns: u128, entry: ExecMode) {
        let exit = self.mode();
        let tsc_khz = u128::from(self.tsc_khz);
        let Some(split) = self.split.as_mut() else {
            return;
        };
        let [user, kernel] = split.feed(unhalted_ns, entry.cpl, exit.cpl, tsc_khz);
        let model = self.model();
        let levels = [(kernel, 0u8), (user, 3u8)];
        // The level the run ended in last: an overflow raised now is that context's.
        let order = if exit.cpl == 3 { [0, 1] } else { [1, 0] };
        for i in order {
            let (cycles, cpl) = levels[i];
            if cycles > 0 {
                let mode = ExecMode { cpl, host: false };
                model.count(HwEvent::CoreCycles, cycles, mode);
                model.count(HwEvent::RefCycles, cycles, mode);
            }
        }
    }

    /// How much of the last `KVM_RUN`, which lasted `ran`, the vCPU spent halted (KVM's
    /// statistics, `HaltClock`; zero where they are not available).
    fn halted_during_run(&mut self, ran: Duration) -> Duration {
        self.halt.as_mut().map_or(Duration::ZERO, |c| {
            Duration::from_nanos(c.halted_since()).min(ran)
        })
    }

    /// Whether the vCPU is halted now (between runs: it would block in the next one).
    fn vcpu_halted(&self) -> bool {
        self.vcpu
            .fd
            .get_mp_state()
            .is_ok_and(|s| s.mp_state == kvm_bindings::KVM_MP_STATE_HALTED)
    }

    /// hv mode: the VMM's own time between two runs of the privileged profiler's vCPU, fed
    /// as hypervisor-mode cycles into the pCPU's counters (which then hold the profiler's
    /// context: a hypervisor keeps the privileged domain's counters running across VM exits
    /// in hv mode, and stops every other domain's). A PMI it raises interrupted the VMM.
    pub(super) fn feed_vmm_cycles(&mut self, vmm_time: Duration) -> Result<()> {
        let cycles = (vmm_time.as_nanos() * u128::from(self.tsc_khz) / 1_000_000) as u64;
        if self.shared.vpmu.mode() != Mode::Hypervisor
            || self.me.domain != PRIVILEGED_DOMAIN
            || cycles == 0
        {
            return Ok(());
        }
        let host = ExecMode { cpl: 0, host: true };
        let model = self.model();
        model.count(HwEvent::CoreCycles, cycles, host);
        model.count(HwEvent::RefCycles, cycles, host);
        self.state.hypervisor = Some(self.activity);
        let handled = self.check_pmi();
        self.state.hypervisor = None;
        handled
    }
}

/// How a host that emulates the guest's CPL0 (and runs its CPL3 natively) splits a run's time
/// between the levels. Charging a whole `KVM_RUN` to the CPL at its exit is wrong for a
/// kernel: a run that ends at CPL3 may hold a timer interrupt's or a PMI's handler (emulated,
/// milliseconds), and a run that ends in the kernel may hold a long stretch of user code.
/// KVM counts the instructions it emulated (`insn_emulation`); a run's kernel time is that
/// count times the time one emulated instruction takes, at most the run's time, and the rest
/// is user time.
///
/// The time per instruction is measured as the run goes: the median of the ratio time /
/// instructions over the last [`RATIOS`] runs that began and ended at CPL0 with at least
/// [`MIN_CALIBRATION_INSNS`] instructions (their fixed entry and exit cost is then a few per
/// cent), seeded by the probe's loop (`quirks`). A median, not a sum, and a run more than
/// [`MAX_CALIBRATION_FACTOR`] times slower per instruction than the estimate does not count:
/// a kernel run that held user code in the middle (the kernel returned to user space and a
/// tick brought it back before its next exit) has a far higher ratio and would charge that
/// user time to every later kernel instruction (measured on Linux 6.1: kernel runs 0.9–1.3 µs
/// per instruction, the mixed ones 2.5–5 µs; with a PMU access at every tick, every run of a
/// counted user loop is such a mixed kernel run).
#[derive(Debug)]
pub(crate) struct CplSplit {
    count: EmulationCount,
    /// The most recent kernel runs' nanoseconds per instruction (in thousandths), a ring.
    ratios: [u64; RATIOS],
    next: usize,
    /// The current estimate: their median, picoseconds per instruction.
    ps_per_insn: u64,
    /// Nanoseconds charged so far to [CPL3, CPL0], and the cycles fed for them.
    charged_ns: [u128; 2],
    fed: [u64; 2],
    /// `VPMU_TRACE_RUNS`: print each run's split on stderr.
    trace: bool,
}

/// How far a kernel run may exceed its instructions' estimated time and still be all kernel
/// (nanoseconds; a timer tick is 10 ms at the guest kernel's HZ=100).
const KERNEL_RUN_SLACK: u128 = 1_000_000;

/// The soonest a kick is armed for an overflow while runs are split (nanoseconds): at most
/// this late past the overflow a PMI is raised.
pub(crate) const MIN_SPLIT_KICK_NS: u128 = 50_000;

/// Kernel runs the estimate is the median of.
const RATIOS: usize = 31;
/// A kernel run more than this many times slower per instruction than the estimate does not
/// calibrate (it held user code).
const MAX_CALIBRATION_FACTOR: u64 = 2;

/// A kernel run with fewer emulated instructions does not calibrate.
const MIN_CALIBRATION_INSNS: u64 = 1000;

impl CplSplit {
    /// The split of `vcpu`'s runs, seeded with `ps_per_insn` picoseconds per emulated
    /// instruction; None where KVM does not count emulated instructions.
    pub(crate) fn new(vcpu: &kvm_ioctls::VcpuFd, ps_per_insn: u64) -> Option<Self> {
        let count = EmulationCount::new(vcpu)?;
        let ps_per_insn = ps_per_insn.max(1);
        Some(Self {
            count,
            ratios: [ps_per_insn; RATIOS],
            next: 0,
            ps_per_insn,
            charged_ns: [0; 2],
            fed: [0; 2],
            trace: std::env::var_os("VPMU_TRACE_RUNS").is_some(),
        })
    }

    /// A run of `unhalted_ns` from `entry` to `exit` CPL: the cycles to feed [CPL3, CPL0].
    fn feed(&mut self, unhalted_ns: u128, entry: u8, exit: u8, tsc_khz: u128) -> [u64; 2] {
        let insns = self.count.since();
        let [user, kernel] = self.split(unhalted_ns, insns, entry == 0 && exit == 0);
        if self.trace {
            eprintln!(
                "vpmu-run entry={entry} exit={exit} ns={unhalted_ns} insns={insns} \
                 kernel_ns={kernel} user_ns={user} ps_per_insn={}",
                self.ps_per_insn
            );
        }
        self.charged_ns[0] += user;
        self.charged_ns[1] += kernel;
        std::array::from_fn(|i| {
            let total = (self.charged_ns[i] * tsc_khz / 1_000_000) as u64;
            let cycles = total - self.fed[i];
            self.fed[i] = total;
            cycles
        })
    }

    /// [user, kernel] nanoseconds of a run of `ns` in which `insns` instructions were
    /// emulated; a kernel run (`calibrates`) also updates the time per instruction.
    fn split(&mut self, ns: u128, insns: u64, calibrates: bool) -> [u128; 2] {
        let ps = (ns * 1000 / u128::from(insns.max(1))).min(u128::from(u64::MAX)) as u64;
        // A kernel run far slower per instruction than the estimate held user code (the kernel
        // returned to user space and a tick brought it back before its next exit): it does not
        // calibrate, or a workload whose only exits are the kernel's (a PMU access at every
        // tick) would soon be all "kernel".
        let plausible = ps <= MAX_CALIBRATION_FACTOR * self.ps_per_insn;
        if calibrates && insns >= MIN_CALIBRATION_INSNS && plausible {
            self.ratios[self.next] = ps;
            self.next = (self.next + 1) % RATIOS;
            let mut sorted = self.ratios;
            let (_, median, _) = sorted.select_nth_unstable(RATIOS / 2);
            self.ps_per_insn = *median;
        }
        let estimate = u128::from(insns) * u128::from(self.ps_per_insn) / 1000;
        // A run that began and ended in the kernel held user code only if the kernel returned
        // to user space and an interrupt brought it back (syscalls and page faults from user
        // space end a run here: `quirks`); a user stretch is then milliseconds long (up to a
        // timer tick). Less than [`KERNEL_RUN_SLACK`] over the estimate is the estimate's
        // error and the run's entry and exit, not user time: a PMI handler's runs between
        // its MSR exits must not count user cycles.
        if calibrates && ns.saturating_sub(estimate) < KERNEL_RUN_SLACK {
            return [0, ns];
        }
        let kernel = estimate.min(ns);
        [ns - kernel, kernel]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::personality::{Amd, Intel, Source};
    use vpmu::{Msr, MsrBus};
    use vpmu_models::oracle::bisect_cycles_until_pmi as cycles_until_pmi;

    const KERNEL: ExecMode = ExecMode {
        cpl: 0,
        host: false,
    };

    /// A fake count: the split's arithmetic does not read it.
    fn split_with(ps: u64) -> Option<CplSplit> {
        let kvm = crate::kvm::usable().ok()?;
        let vm = kvm.create_vm().ok()?;
        let vcpu = vm.create_vcpu(0).ok()?;
        CplSplit::new(&vcpu, ps)
    }

    #[test]
    fn kernel_time_is_instructions_times_the_median_kernel_rate() {
        let Some(mut s) = split_with(1_000_000) else {
            println!("SKIPPED: no KVM emulation statistics here (split test)");
            eprintln!("SKIPPED: no KVM emulation statistics here (split test)");
            return;
        };
        // Seeded at 1 µs per instruction: a run of 10 ms with 2000 instructions is 2 ms kernel.
        assert_eq!(s.split(10_000_000, 2000, false), [8_000_000, 2_000_000]);
        // Never more kernel than the run.
        assert_eq!(s.split(1_000_000, 5000, false), [0, 1_000_000]);
        // A kernel run a little over its estimate is all kernel; far over, the rest is user.
        assert_eq!(s.split(400_000, 100, true), [0, 400_000]);
        assert_eq!(s.split(5_100_000, 100, true), [5_000_000, 100_000]);
        // Kernel runs at 1.2 µs move the median once they are the majority; a mixed run
        // (5 µs per instruction) among them does not.
        for i in 0..RATIOS {
            let ns = if i == 3 { 5_000 * 2000 } else { 1_200 * 2000 };
            s.split(ns, 2000, true);
        }
        assert_eq!(s.ps_per_insn, 1_200_000);
        // Small kernel runs do not calibrate.
        s.split(1_000_000_000, 10, true);
        assert_eq!(s.ps_per_insn, 1_200_000);
        // Kernel runs that held user code (2.5 µs per instruction and more), however many, do
        // not move the estimate: their user time stays user time.
        for _ in 0..3 * RATIOS {
            assert_eq!(s.split(9_000_000, 3000, true), [5_400_000, 3_600_000]);
        }
        assert_eq!(s.ps_per_insn, 1_200_000);
    }

    #[test]
    pub(super) fn bisection_finds_the_exact_overflow_point() {
        let p = Intel::v5(Source::Timed);
        let mut m = p.model();
        // GP0: core cycles (0x3c), OS, INT, EN; preset to -1000; globally enabled.
        m.write(Msr(0x4c1), (1u64 << 48) - 1000).expect("counter");
        m.write(Msr(0x186), 0x3c | 1 << 17 | 1 << 20 | 1 << 22)
            .expect("selector");
        m.write(Msr(0x38f), 1).expect("global");
        // Wrapping is counter = 2^48: the 1000th cycle wraps it.
        assert_eq!(cycles_until_pmi(&m, KERNEL), Some(1000));
        assert_eq!(m.cycles_until_pmi(KERNEL), Some(1000));
        m.count(HwEvent::CoreCycles, 999, KERNEL);
        assert!(!m.pmi_pending());
        m.count(HwEvent::CoreCycles, 1, KERNEL);
        assert!(m.pmi_pending());
    }

    #[test]
    pub(super) fn no_interrupt_bit_no_deadline() {
        let p = Amd::perfmon_v2(Source::Timed);
        let mut m = p.model();
        m.write(Msr(0xC001_0201), (1u64 << 48) - 10)
            .expect("counter");
        m.write(Msr(0xC001_0200), 0x76 | 1 << 17 | 1 << 22)
            .expect("control without INT");
        assert!(p.counting(&m));
        assert_eq!(cycles_until_pmi(&m, KERNEL), None);
        assert_eq!(m.cycles_until_pmi(KERNEL), None);
        // User-only counting never sees kernel cycles.
        m.write(Msr(0xC001_0200), 0x76 | 1 << 16 | 1 << 20 | 1 << 22)
            .expect("USR + INT");
        assert_eq!(cycles_until_pmi(&m, KERNEL), None);
        assert!(
            cycles_until_pmi(
                &m,
                ExecMode {
                    cpl: 3,
                    host: false
                }
            )
            .is_some()
        );
    }
}
