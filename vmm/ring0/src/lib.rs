//! The ring-0 run: the guest `vpmu_guests::RING0` is an inner hypervisor built from this
//! project's crates (the vpmu core, both vendor backends, the `hw-msr` bus executing real
//! RDMSR/WRMSR) running at guest CPL0 on two vCPUs, which are its two inner pCPUs. Its MSR
//! accesses exit to this VMM's MSR filter and reach the outer vpmu and the software PMU of the
//! vCPU's own thread (the precise source counts its instructions exactly); its cross-CPU
//! requests travel as real IPIs between the two vCPUs through KVM's in-kernel LAPIC (x2APIC
//! ICR). The guest checks its own results (result records) and traces, through
//! `port::TRACE`, which inner pCPU's bus makes each MSR access and which operation runs on
//! which inner pCPU; this side records which vCPU each MSR exit and trace word came from
//! (`GuestPorts::msr`, `GuestPorts::out`, in one global order) and fails the run if an inner
//! pCPU's hardware or state was touched from the other vCPU. It also measures the MSR
//! accesses per inner context switch and the IPIs per cross-CPU operation.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use vpmu::VcpuId;
use vpmu_guest_protocol::port;
use vpmu_guest_protocol::ring0::{
    CASE, OP_ATTACH, OP_DETACH, OP_GP, OP_HARNESS, OP_MODE_SET, OP_PMI, OP_RDMSR, OP_REQUEST,
    OP_SWITCH, OP_TEARDOWN, OP_WRMSR, TRACE_BEGIN, TRACE_END, TRACE_IPI_SENT, TRACE_IPI_TAKEN,
    TRACE_OWNER,
};
use vpmu_machine::personality::{Amd, Intel, Personality, Source};
use vpmu_machine::{GuestPorts, Machine, MachineError, PortAccess, RunResult};
use vpmu_selftest::records::{ResultPort, tally};

/// The guest's vCPUs = the inner hypervisor's pCPUs.
pub const VCPUS: u32 = 2;
/// PMIs each inner pCPU raises (three overflows of one inner vCPU's counter).
const PMIS_PER_VCPU: u64 = 3;
/// Cross-CPU operations the guest makes (two teardowns, two mode changes).
const CROSS_CPU_OPS: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(120);

/// What the VMM saw, in the order its vCPU threads reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// A PMU MSR exit.
    Msr { msr: u32, write: Option<u64> },
    /// A trace word.
    Trace(u32),
}

/// The consumer's ports of a ring-0 run: the result records and the trace, with every PMU
/// MSR exit, each with the vCPU it came from.
#[derive(Debug, Default)]
pub struct Ring0Ports {
    results: ResultPort,
    events: Mutex<Vec<(VcpuId, Event)>>,
}

impl Ring0Ports {
    fn push(&self, vcpu: VcpuId, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((vcpu, event));
    }
}

impl GuestPorts for Ring0Ports {
    fn out(&self, access: PortAccess<'_>, port: u16, value: u32) -> Result<(), String> {
        if port == port::TRACE {
            self.push(access.vcpu, Event::Trace(value));
            return Ok(());
        }
        self.results.out(access, port, value)
    }

    fn msr(&self, access: PortAccess<'_>, msr: u32, write: Option<u64>) {
        self.push(access.vcpu, Event::Msr { msr, write });
    }
}

/// A trace word's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Word {
    kind: u32,
    op: u32,
    pcpu: u32,
    vcpu: u32,
}

fn decode(w: u32) -> Word {
    Word {
        kind: w >> 28,
        op: (w >> 20) & 0xff,
        pcpu: (w >> 16) & 0xf,
        vcpu: w & 0xffff,
    }
}

fn op_name(op: u32) -> &'static str {
    match op {
        OP_ATTACH => "attach",
        OP_SWITCH => "switch",
        OP_WRMSR => "wrmsr",
        OP_RDMSR => "rdmsr",
        OP_GP => "#GP write",
        OP_PMI => "PMI",
        OP_REQUEST => "request",
        OP_TEARDOWN => "teardown",
        OP_MODE_SET => "mode change",
        OP_HARNESS => "idle check",
        OP_DETACH => "detach",
        _ => "?",
    }
}

/// The VMM's reading of the trace.
#[derive(Clone, Debug, Default)]
pub struct TraceReport {
    /// MSR accesses made through an inner pCPU's bus on the other vCPU (descriptions of the
    /// first few, and the count).
    pub wrong_cpu: Vec<String>,
    /// How many MSR accesses were made on the wrong vCPU.
    pub wrong_cpu_count: u64,
    /// MSR accesses no trace word claimed.
    pub untagged: u64,
    /// Operations on an inner pCPU's state begun on the other vCPU.
    pub wrong_scope: Vec<String>,
    /// MSR accesses of each inner context switch that saved and loaded (on its own vCPU).
    pub switch_accesses: Vec<u64>,
    /// Per cross-CPU operation: (name, initiator, IPIs sent, IPIs the target took, requests
    /// completed on the target, MSR accesses of those requests made on the target).
    pub cross_cpu: Vec<CrossCpuOp>,
    /// #GP writes that reached the hardware (MSR exits inside them).
    pub gp_with_access: u64,
    /// MSR exits per vCPU.
    pub msr_exits: [u64; VCPUS as usize],
}

/// One cross-CPU operation as the VMM saw it.
#[derive(Clone, Debug, Default)]
pub struct CrossCpuOp {
    /// "teardown" or "mode change".
    pub name: &'static str,
    /// The vCPU (= inner pCPU) that made it.
    pub from: u32,
    /// IPIs the initiator sent meanwhile.
    pub ipis_sent: u64,
    /// IPIs the other vCPU took meanwhile.
    pub ipis_taken: u64,
    /// Requests completed meanwhile on the other vCPU (for the other inner pCPU).
    pub requests_on_target: u64,
    /// Requests for the other inner pCPU completed meanwhile on the initiator instead.
    pub requests_elsewhere: u64,
    /// MSR accesses of those requests, on the target.
    pub request_accesses: u64,
}

struct Open {
    op: u32,
    pcpu: u32,
    at: usize,
    accesses: u64,
}

/// Reads the events of a run.
fn analyze(events: &[(VcpuId, Event)]) -> TraceReport {
    let mut r = TraceReport::default();
    let n = VCPUS as usize;
    let mut owner: Vec<Option<u32>> = vec![None; n];
    let mut open: Vec<Vec<Open>> = (0..n).map(|_| Vec::new()).collect();
    // (at, vCPU, op, pcpu) of every closed scope, with its accesses.
    let mut closed: Vec<(usize, usize, usize, u32, u32, u64)> = Vec::new();
    for (at, &(who, event)) in events.iter().enumerate() {
        let q = who.vcpu as usize;
        if q >= n {
            continue;
        }
        match event {
            Event::Msr { msr, write } => {
                r.msr_exits[q] += 1;
                let scope = open[q].last().map_or(0, |o| o.op);
                match owner[q].take() {
                    None => r.untagged += 1,
                    Some(p) if p as usize != q => {
                        r.wrong_cpu_count += 1;
                        if r.wrong_cpu.len() < 5 {
                            r.wrong_cpu.push(format!(
                                "{} of MSR {msr:#x} through inner pCPU {p}'s bus executed on \
                                 vCPU {q} (inner operation: {})",
                                if write.is_some() { "WRMSR" } else { "RDMSR" },
                                op_name(scope)
                            ));
                        }
                    }
                    Some(_) => {}
                }
                if let Some(o) = open[q].last_mut() {
                    o.accesses += 1;
                }
            }
            Event::Trace(w) => {
                let w = decode(w);
                match w.kind {
                    TRACE_OWNER => owner[q] = Some(w.pcpu),
                    TRACE_BEGIN => {
                        if w.pcpu as usize != q && r.wrong_scope.len() < 5 {
                            r.wrong_scope.push(format!(
                                "inner {} on inner pCPU {}'s state run on vCPU {q}",
                                op_name(w.op),
                                w.pcpu
                            ));
                        }
                        open[q].push(Open {
                            op: w.op,
                            pcpu: w.pcpu,
                            at,
                            accesses: 0,
                        });
                    }
                    TRACE_END => {
                        if let Some(o) = open[q].pop() {
                            if let Some(parent) = open[q].last_mut() {
                                parent.accesses += o.accesses;
                            }
                            closed.push((o.at, at, q, o.op, o.pcpu, o.accesses));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    for &(_, _, _, op, _, accesses) in &closed {
        match op {
            OP_SWITCH if accesses > 0 => r.switch_accesses.push(accesses),
            OP_GP if accesses > 0 => r.gp_with_access += 1,
            _ => {}
        }
    }
    for &(begin, end, q, op, _, _) in &closed {
        if op != OP_TEARDOWN && op != OP_MODE_SET {
            continue;
        }
        let target = 1 - q as u32;
        let mut c = CrossCpuOp {
            name: op_name(op),
            from: q as u32,
            ..CrossCpuOp::default()
        };
        for &(who, event) in &events[begin..=end] {
            if let Event::Trace(w) = event {
                let w = decode(w);
                match w.kind {
                    TRACE_IPI_SENT if who.vcpu as usize == q && w.pcpu == target => {
                        c.ipis_sent += 1;
                    }
                    TRACE_IPI_TAKEN if who.vcpu == target => c.ipis_taken += 1,
                    _ => {}
                }
            }
        }
        for &(b, _, who, rop, pcpu, accesses) in &closed {
            if rop == OP_REQUEST && pcpu == target && (begin..=end).contains(&b) {
                if who as u32 == target {
                    c.requests_on_target += 1;
                    c.request_accesses += accesses;
                } else {
                    c.requests_elsewhere += 1;
                }
            }
        }
        r.cross_cpu.push(c);
    }
    r
}

/// One personality's ring-0 run.
#[derive(Clone, Debug)]
pub struct Ring0Result {
    /// The personality.
    pub personality: String,
    /// Checks passed (the guest's and the VMM's).
    pub passed: u32,
    /// Checks failed.
    pub failed: u32,
    /// The failing checks.
    pub failures: Vec<String>,
    /// The figures (MSR accesses per inner switch, IPIs per cross-CPU operation, ...).
    pub figures: Vec<String>,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Single steps of the precise source, both vCPUs.
    pub steps: u64,
    /// Both vCPUs' consoles.
    pub console: String,
}

fn run_one<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    cpuid: &CpuId,
    p: P,
) -> Result<Ring0Result, MachineError> {
    let mut machine = Machine::new(kvm, p, cpuid, vpmu_guests::RING0, CASE, VCPUS)?;
    let ports = Arc::new(Ring0Ports::default());
    machine.extend(ports.clone());
    let results = machine.run(TIMEOUT);
    let records = ports.results.take();
    let events = std::mem::take(&mut *ports.events.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(judge(p.name(), &results, &records, &events))
}

fn judge(
    personality: String,
    results: &[RunResult],
    records: &BTreeMap<VcpuId, Vec<vpmu_selftest::records::ResultRecord>>,
    events: &[(VcpuId, Event)],
) -> Ring0Result {
    let t = tally(CASE, records);
    let mut out = Ring0Result {
        personality,
        passed: t.passed,
        failed: t.failed,
        failures: t.failures.clone(),
        figures: Vec::new(),
        elapsed: results.iter().map(|r| r.elapsed).max().unwrap_or_default(),
        steps: results.iter().map(|r| r.steps).sum(),
        console: String::new(),
    };
    let mut vmm = |name: String, ok: bool| {
        if ok {
            out.passed += 1;
        } else {
            out.failed += 1;
            out.failures.push(format!("FAIL VMM: {name}"));
        }
    };
    for (i, r) in results.iter().enumerate() {
        let vcpu = VcpuId {
            domain: 0,
            vcpu: i as u32,
        };
        let failed_records = records.get(&vcpu).map_or(0, |recs| {
            recs.iter()
                .filter(|r| r.kind == vpmu_guest_protocol::selftest::Kind::Fail)
                .count() as u32
        });
        vmm(
            format!(
                "vCPU {i} ran to its end (error {:?}, exit status {:?} = its {failed_records} failed checks)",
                r.error, r.status
            ),
            r.error.is_none() && r.status == Some(failed_records),
        );
        vmm(
            format!(
                "vCPU {i}: the outer vpmu delivered {PMIS_PER_VCPU} PMIs through its LVTPC (got {})",
                r.pmis
            ),
            r.pmis == PMIS_PER_VCPU,
        );
    }
    let rep = analyze(events);
    vmm(
        format!(
            "no MSR access through an inner pCPU's bus ran on the other vCPU ({} did{}{})",
            rep.wrong_cpu_count,
            if rep.wrong_cpu.is_empty() { "" } else { ": " },
            rep.wrong_cpu.join("; ")
        ),
        rep.wrong_cpu_count == 0,
    );
    vmm(
        format!(
            "every MSR access was claimed by an inner pCPU ({} were not)",
            rep.untagged
        ),
        rep.untagged == 0 && rep.msr_exits.iter().all(|&n| n > 0),
    );
    vmm(
        format!(
            "no inner pCPU's state was used on the other vCPU{}{}",
            if rep.wrong_scope.is_empty() { "" } else { ": " },
            rep.wrong_scope.join("; ")
        ),
        rep.wrong_scope.is_empty(),
    );
    vmm(
        format!(
            "#GP writes reached no hardware ({} did)",
            rep.gp_with_access
        ),
        rep.gp_with_access == 0,
    );
    vmm(
        format!(
            "{} cross-CPU operations seen (want {CROSS_CPU_OPS})",
            rep.cross_cpu.len()
        ),
        rep.cross_cpu.len() == CROSS_CPU_OPS,
    );
    for c in &rep.cross_cpu {
        let target = 1 - c.from;
        vmm(
            format!(
                "{} from vCPU {}: 1 IPI sent, taken by vCPU {target}, its request completed \
                 there and only there (sent {}, taken {}, completed on target {}, elsewhere {})",
                c.name,
                c.from,
                c.ipis_sent,
                c.ipis_taken,
                c.requests_on_target,
                c.requests_elsewhere
            ),
            c.ipis_sent == 1
                && c.ipis_taken == 1
                && c.requests_on_target == 1
                && c.requests_elsewhere == 0,
        );
        if c.name == "teardown" {
            vmm(
                format!(
                    "teardown from vCPU {}: the save ran on vCPU {target}'s hardware ({} MSR accesses there)",
                    c.from, c.request_accesses
                ),
                c.request_accesses > 0,
            );
        }
    }
    let s = &rep.switch_accesses;
    if !s.is_empty() {
        out.figures.push(format!(
            "MSR accesses per inner switch that touched the hardware (saves and/or loads, traced by the VMM): {}..{}, mean {:.1} over {} switches",
            s.iter().min().unwrap_or(&0),
            s.iter().max().unwrap_or(&0),
            s.iter().sum::<u64>() as f64 / s.len() as f64,
            s.len()
        ));
    }
    for c in &rep.cross_cpu {
        out.figures.push(format!(
            "{} vCPU {} -> {}: {} IPI per operation, {} request(s) completed on the target with {} MSR accesses",
            c.name,
            c.from,
            1 - c.from,
            c.ipis_sent,
            c.requests_on_target,
            c.request_accesses
        ));
    }
    out.figures.push(format!(
        "PMU MSR exits: vCPU 0 {}, vCPU 1 {}; single steps {}",
        rep.msr_exits[0], rep.msr_exits[1], out.steps
    ));
    for (i, r) in results.iter().enumerate() {
        for line in r.console.lines() {
            if let Some(rest) = line.strip_prefix("RING0 ") {
                let what = rest.trim_start_matches("figure: ");
                out.figures.push(format!("vCPU {i}: {what}"));
            }
            out.console += &format!("[vcpu{i}] {line}\n");
        }
    }
    out
}

/// The four precise personalities, one run each.
pub fn ring0(kvm: &Kvm) -> Result<Vec<Ring0Result>, MachineError> {
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm)?;
    Ok(vec![
        run_one(kvm, &cpuid, Intel::v5(Source::Precise))?,
        run_one(kvm, &cpuid, Intel::v2(Source::Precise))?,
        run_one(kvm, &cpuid, Amd::perfmon_v2(Source::Precise))?,
        run_one(kvm, &cpuid, Amd::k7(Source::Precise))?,
    ])
}

/// The results as a report: a line per personality, its failures and figures.
pub fn report(results: &[Ring0Result]) -> String {
    let mut s = String::new();
    for r in results {
        s += &format!(
            "{:<34} pass {:>3} fail {:>3} steps {:>7} {:>6} ms  {}\n",
            r.personality,
            r.passed,
            r.failed,
            r.steps,
            r.elapsed.as_millis(),
            if r.failed == 0 { "PASS" } else { "FAIL" }
        );
        for f in &r.failures {
            s += &format!("    {f}\n");
        }
        for f in &r.figures {
            s += &format!("    figure: {f}\n");
        }
    }
    s
}

/// Whether the ring-0 guest was built (see `vpmu_guests::RING0`).
pub fn available() -> bool {
    !vpmu_guests::RING0.is_empty()
}
