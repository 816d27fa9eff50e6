//! The checks of one CPU beyond the segments: idle hardware, cross-CPU teardown and mode
//! change through IPIs, PMIs, and refused writes.

use core::fmt::Write as _;
use core::sync::atomic::Ordering::SeqCst;

use vpmu::abi::ops::{OpError, Params, Version, XENPMU_OP_MODE_SET};
use vpmu::abi::{XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR};
use vpmu::{Completion, MsrOutcome, PmuBackend, VcpuId, VcpuState};
use vpmu_guest_protocol::ring0 as proto;

use crate::hw::{relax, spin, trace_word, without_interrupts};
use crate::plan::{EN, INSTRUCTIONS, INT, OS};
use crate::platform::{
    IPIS_SENT, IPIS_TAKEN, InnerPlatform, LVTPC_PMIS, PMIS_TAKEN, REQUESTS_DONE, index_word,
};
use crate::report::{Name, name, say};
use crate::scenario::{Run, wait_for};
use crate::{PRIVILEGED, index_of};

impl<B: PmuBackend> Run<'_, B>
where
    B::Context: Send,
{
    /// Nothing counts on this CPU's hardware: the global control is 0 (or, without one, no
    /// control is enabled) and every counter stands still over a loop.
    pub(crate) fn idle_clean(&mut self, what: &str) -> bool {
        let p = self.plan;
        let w = self.w;
        let mut enabled = 0u64;
        if let Some(g) = p.global {
            enabled = w.raw(self.cpu, g);
        } else {
            for i in 0..p.counters {
                if w.raw(self.cpu, p.ctl(i)) & EN != 0 {
                    enabled |= 1 << i;
                }
            }
        }
        let mut before = [0u64; 8];
        for i in 0..p.counters.min(8) {
            before[i as usize] = w.raw(self.cpu, p.ctr(i));
        }
        spin(100);
        let mut moved = 0u64;
        for i in 0..p.counters.min(8) {
            if w.raw(self.cpu, p.ctr(i)) != before[i as usize] {
                moved |= 1 << i;
            }
        }
        self.check_val(
            name!("cpu{} {what}: nothing enabled on the hardware", self.cpu),
            enabled,
            0,
        ) & self.check_val(
            name!("cpu{} {what}: no hardware counter moves", self.cpu),
            moved,
            0,
        )
    }

    /// The cross-CPU teardown of `victim`, loaded on the other CPU: `Pending` until the
    /// target completed the request its IPI carried, then `Done`.
    pub(crate) fn teardown_remote(&mut self, victim: VcpuId) {
        let target = 1 - self.cpu;
        let sent = IPIS_SENT[target as usize].load(SeqCst);
        let taken = IPIS_TAKEN[target as usize].load(SeqCst);
        let done = REQUESTS_DONE[target as usize].load(SeqCst);
        let saves = self.w.stats(victim).saves;
        let vi = index_word(Some(victim));
        let mut calls = 0u64;
        let mut waited_ok = true;
        trace_word(proto::TRACE_BEGIN, proto::OP_TEARDOWN, self.cpu, vi);
        let result = loop {
            calls += 1;
            let r = without_interrupts(|| {
                // SAFETY: on this CPU, interrupts off, no other reference alive.
                let p = unsafe { self.w.pcpu(self.cpu) }?;
                Some(
                    self.w
                        .vpmu
                        .teardown_vcpu(&mut InnerPlatform, p, &self.w.table, victim),
                )
            });
            match r {
                Some(Ok(Completion::Pending)) if calls < 4 => {
                    if cfg!(feature = "sabotage-local-request") {
                        self.w.run_sent_here(target);
                    }
                    // Retry once the target has completed what was sent (a retry before that
                    // would send the request again).
                    let want = done + 1;
                    waited_ok &= wait_for(&REQUESTS_DONE[target as usize], want);
                }
                other => break other,
            }
        };
        trace_word(proto::TRACE_END, proto::OP_TEARDOWN, self.cpu, vi);
        self.check(
            name!(
                "cpu{} teardown of vCPU {} on cpu{target} completes",
                self.cpu,
                victim.vcpu
            ),
            matches!(result, Some(Ok(Completion::Done))) && waited_ok,
        );
        self.check_val(
            name!("cpu{} teardown: calls (Pending, then Done)", self.cpu),
            calls,
            2,
        );
        let ipis = IPIS_SENT[target as usize].load(SeqCst) - sent;
        let took = IPIS_TAKEN[target as usize].load(SeqCst) - taken;
        self.check_val(
            name!("cpu{} teardown: IPIs sent to cpu{target}", self.cpu),
            ipis,
            1,
        );
        self.check_val(
            name!("cpu{} teardown: IPIs cpu{target} took", self.cpu),
            took,
            1,
        );
        self.check_val(
            name!(
                "cpu{} teardown: vCPU {} saved once (on its pCPU)",
                self.cpu,
                victim.vcpu
            ),
            self.w.stats(victim).saves - saves,
            1,
        );
        self.check(
            name!("cpu{} teardown: vCPU {} is reset", self.cpu, victim.vcpu),
            self.w.state(victim) == VcpuState::Allocated,
        );
        say(name!(
            "RING0 figure: teardown cpu{}->cpu{target}: {ipis} IPI, {took} taken, {calls} calls",
            self.cpu
        ));
    }

    /// A MODE_SET by the privileged inner vCPU from this CPU: `-EAGAIN` until the other CPU
    /// caught up through the IPI's `CatchUp`.
    pub(crate) fn mode_set(&mut self, mode: u64) {
        let target = 1 - self.cpu;
        let sent = IPIS_SENT[target as usize].load(SeqCst);
        let taken = IPIS_TAKEN[target as usize].load(SeqCst);
        let done = REQUESTS_DONE[target as usize].load(SeqCst);
        let params = Params {
            version: Version {
                major: u32::from(XENPMU_VERSION_MAJOR),
                minor: u32::from(XENPMU_VERSION_MINOR),
            },
            val: mode,
            vcpu: 0,
            _pad0: 0,
        };
        let mut calls = 0u64;
        let mut waited_ok = true;
        trace_word(proto::TRACE_BEGIN, proto::OP_MODE_SET, self.cpu, 0);
        let result = loop {
            calls += 1;
            let r = without_interrupts(|| {
                // SAFETY: on this CPU, interrupts off, no other reference alive.
                let p = unsafe { self.w.pcpu(self.cpu) }?;
                Some(self.w.vpmu.control_op(
                    &mut InnerPlatform,
                    p,
                    &self.w.table,
                    PRIVILEGED,
                    XENPMU_OP_MODE_SET,
                    &params,
                ))
            });
            match r {
                Some(Err(OpError::Again)) if calls < 4 => {
                    if cfg!(feature = "sabotage-local-request") {
                        self.w.run_sent_here(target);
                    }
                    waited_ok &= wait_for(&REQUESTS_DONE[target as usize], done + 1);
                }
                other => break other,
            }
        };
        trace_word(proto::TRACE_END, proto::OP_MODE_SET, self.cpu, 0);
        self.check(
            name!("cpu{} MODE_SET {mode} completes", self.cpu),
            matches!(result, Some(Ok(_))) && waited_ok && self.w.vpmu.mode().to_abi() == mode,
        );
        let ipis = IPIS_SENT[target as usize].load(SeqCst) - sent;
        let took = IPIS_TAKEN[target as usize].load(SeqCst) - taken;
        self.check_val(
            name!("cpu{} MODE_SET: IPIs sent to cpu{target}", self.cpu),
            ipis,
            1,
        );
        self.check_val(
            name!("cpu{} MODE_SET: IPIs cpu{target} took", self.cpu),
            took,
            1,
        );
        say(name!(
            "RING0 figure: mode change cpu{}->cpu{target}: {ipis} IPI, {took} taken, {calls} calls",
            self.cpu
        ));
    }

    /// Three overflows of counter 1 of `v` (running here) with its interrupt enabled, each
    /// a PMI through the LVTPC into `handle_pmi` and one delivery to `v`.
    pub(crate) fn pmis(&mut self, v: VcpuId) {
        const K: u64 = 40;
        let p = self.plan;
        let i = index_of(v).unwrap_or(0);
        let before = LVTPC_PMIS[i].load(SeqCst);
        let stats = self.w.stats(v);
        let taken = PMIS_TAKEN[self.cpu as usize].load(SeqCst);
        let mut ok = self
            .w
            .wr(self.cpu, v, p.ctl(1), EN | OS | INT | INSTRUCTIONS)
            == Some(MsrOutcome::Handled(()));
        for round in 1..=3u64 {
            ok &= self.w.wr(self.cpu, v, p.ctr(1), p.preset(K)) == Some(MsrOutcome::Handled(()));
            if let Some(g) = p.global {
                ok &= self.w.wr(self.cpu, v, g, 3) == Some(MsrOutcome::Handled(()));
            }
            relax();
            spin(K);
            ok &= wait_for(&LVTPC_PMIS[i], before + round);
            if let Some(clear) = p.status_clear {
                ok &= self.w.wr(self.cpu, v, clear, 2) == Some(MsrOutcome::Handled(()));
            }
        }
        ok &= match p.global {
            Some(g) => self.w.wr(self.cpu, v, g, 1),
            None => self.w.wr(self.cpu, v, p.ctl(1), 0),
        } == Some(MsrOutcome::Handled(()));
        self.check(name!("cpu{} PMI programming accepted", self.cpu), ok);
        self.check_val(
            name!("cpu{} vCPU {} got each PMI on its LVTPC", self.cpu, v.vcpu),
            LVTPC_PMIS[i].load(SeqCst) - before,
            3,
        );
        self.check_val(
            name!("cpu{} PMIs taken by the inner handler", self.cpu),
            PMIS_TAKEN[self.cpu as usize].load(SeqCst) - taken,
            3,
        );
        let after = self.w.stats(v);
        self.check_val(
            name!("cpu{} core: PMIs generated = delivered", self.cpu),
            after.pmis_generated - stats.pmis_generated,
            after.pmis_delivered - stats.pmis_delivered,
        );
        self.check_val(
            name!("cpu{} core: no PMI dropped or in flight", self.cpu),
            (after.pmis_dropped - stats.pmis_dropped) + after.pmis_in_flight,
            0,
        );
    }

    /// A refused write #GPs and reaches no hardware.
    pub(crate) fn gp_checks(&mut self, v: VcpuId) {
        let p = self.plan;
        for (what, bit) in [("reserved bit", p.reserved), ("refused bit", p.refused)] {
            let before = self.w.accesses(self.cpu);
            let r = self.w.wr_op(
                self.cpu,
                proto::OP_GP,
                v,
                p.ctl(0),
                EN | OS | INSTRUCTIONS | bit,
            );
            self.check(
                name!("cpu{} event select {what} {bit:#x} #GP", self.cpu),
                r == Some(MsrOutcome::GeneralProtection),
            );
            self.check_val(
                name!("cpu{} {what} #GP made no hardware access", self.cpu),
                self.w.accesses(self.cpu) - before,
                0,
            );
        }
    }
}
