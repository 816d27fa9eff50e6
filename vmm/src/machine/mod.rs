//! One guest run: one VM per domain (`Layout`): either one domain with one or more vCPUs,
//! each on its own host thread, which is also its pCPU with its own software PMU model; or
//! several one-vCPU domains time-sliced on one thread = one pCPU. The vpmu core (`Vpmu`, the
//! pCPU states and the vCPU table of all domains, behind one mutex) drives the models through
//! `vpmu::Platform`.
//!
//! Exits:
//! * RDMSR/WRMSR of a filtered PMU MSR → `Vpmu::rdmsr`/`wrmsr` (`GeneralProtection` or an MSR
//!   of the other vendor → #GP through `exit.error`);
//! * port I/O: console, exit status, the control-operation hypercall, benchmark control;
//! * `Debug` (single-step): one retired instruction, decoded with iced-x86, fed to the model.
//!
//! Precise mode: while the pCPU's model has a counter enabled the vCPU is single-stepped, and
//! each retired instruction is counted as `Instructions` (and `Branches` for any control
//! transfer) in the mode of its CPL, with the counter state after it retired. Single-step works
//! only at CPL0 on this host's KVM, so CPL3 code is never counted. After every exit, a raised
//! PMI line goes through `Vpmu::handle_pmi`, which delivers through the guest's LVTPC (or the
//! shared page and the VIRQ).
//!
//! Timed mode: the vCPU runs free; the time each `KVM_RUN` lasted, in TSC ticks (the guest TSC
//! is the host's here), is fed as core and reference cycles in the mode of the CPL at the exit
//! (an approximation: a run may span CPLs). Before each entry the model computes after how
//! many cycles a PMI would be raised (`SoftwarePmu::cycles_until_pmi`, arithmetic), and the
//! VMM arms a kick for that time. The
//! interrupted context of a PMI (`Platform::interrupted`) is the sync-regs state at the exit
//! that raised it, so at a kick that landed in CPL3 code it is that code's RIP and CPL 3; every
//! delivered PMI's context is kept (`RunResult::pmi_contexts`, guest port 0x15 for the last).
//!
//! Modules: `platform` (the `vpmu::Platform` impl), `runner` (the vCPU thread's run loop and
//! migrations), `sched` (several domains' vCPUs on one thread and pCPU), `exit` (copying exits
//! out of `kvm_run`, MSR and hypercall handling), `precise` and `timed` (the two event
//! sources).

use std::fmt::Write as _;
use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_bindings::{CpuId, kvm_sync_regs};
use kvm_ioctls::Kvm;
use vpmu::abi::XENPMU_MODE_SELF;
use vpmu::{PcpuPmu, PmuBackend, VcpuId, VcpuPmu, VcpuTable, Vpmu};

use crate::kvm::{GuestMem, STACK_TOP, Vcpu, Vm};
use crate::personality::Personality;

use exit::MsrHandler;
use platform::{PlatformState, QueuedPmi};
pub use platform::{PmiContext, VmmActivity};
use runner::{Rendezvous, Runner};

/// Runs `f` on the core and a platform view for `runner`'s vCPU.
macro_rules! with_core {
    ($runner:expr, |$platform:ident, $core:ident| $body:expr) => {{
        let mut guard = $runner.core.lock().expect("vpmu core lock");
        let $core = &mut *guard;
        let mut $platform = KvmPlatform {
            vm: $runner.vm,
            vms: $runner.vms,
            vcpu: &$runner.vcpu.fd,
            me: $runner.me,
            counts: $runner.counts,
            pages: $runner.pages,
            physical_masked: &mut $core.physical_masked,
            queued: &mut $core.queued_lvtpc,
            wake: &mut $core.wake,
            state: &mut $runner.state,
        };
        $body
    }};
}

mod exit;
mod platform;
mod precise;
mod runner;
mod sched;
#[cfg(test)]
mod tests;
mod timed;

/// The privileged domain (domain 0; a run has one VM per domain, numbered from 0).
pub const PRIVILEGED_DOMAIN: u32 = 0;
/// The vector of the PMU VIRQ (a sample is in the shared page).
pub const VIRQ_VECTOR: u8 = 0x41;
/// Stack per vCPU.
const STACK_SIZE: u64 = 0x1_0000;

/// What one vCPU's run produced.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// The exit status the guest wrote (None: stopped by the VMM).
    pub status: Option<u32>,
    /// Console output.
    pub console: String,
    /// Single-step exits.
    pub steps: u64,
    /// MSR exits.
    pub msr_exits: u64,
    /// PMIs delivered through the LVTPC.
    pub pmis: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Why the run failed, if it did.
    pub error: Option<String>,
    /// MSR exits and the handler time (ns) spent in them, by handler: `[vpmu, null]`.
    pub msr_exit_ns: [(u64, u64); 2],
    /// Exits and the total user-space time (ns) between `KVM_RUN`s.
    pub user_time: (u64, u64),
    /// Kicks (timed mode).
    pub kicks: u64,
    /// The interrupted context of each PMI delivered through the LVTPC (the first 65536).
    pub pmi_contexts: Vec<PmiContext>,
    /// The VMM's own record of every PMI the core handled on this vCPU's pCPU, in order: what
    /// ran there and was interrupted, and the outcome (shared layout: in the first result).
    pub pmi_log: Vec<PmiRecord>,
    /// The core's statistics of this vCPU at the end of the run.
    pub stats: Option<vpmu::VcpuStats>,
    /// The sample batches this vCPU shipped through `port::BATCH`, as raw bytes copied out of
    /// guest memory (decoded by `crate::profile::protocol`).
    pub batches: Vec<Vec<u8>>,
    /// The VMM stopped this vCPU before it wrote an exit status (shared pCPU, `finish_with`).
    pub stopped: bool,
    /// Which vCPU this is (None only in a result made before its vCPU existed).
    pub vcpu: Option<VcpuId>,
    /// Nanoseconds this vCPU spent in `KVM_RUN` (timed source: its CPU time).
    pub guest_ns: u128,
    /// Guest memory copied after the run (`Machine::peek_after_run`): (GPA, bytes).
    pub peeked: Vec<(u64, Vec<u8>)>,
}

/// One PMI as the VMM saw it: the vCPU that was running on the pCPU (independent of the
/// core's routing), where it was interrupted, and the core's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmiRecord {
    /// The vCPU the VMM was running when the PMI was raised.
    pub running: VcpuId,
    /// The VMM itself was interrupted, serving `running` (hv mode).
    pub hypervisor: bool,
    /// The interrupted registers the core was given (`Platform::interrupted`: sync regs at
    /// the exit that raised the PMI, or the VMM activity's if `hypervisor`).
    pub regs: vpmu::abi::Regs,
    /// The pCPU whose PMI it was.
    pub pcpu: u32,
    /// `Some(receiver)` if the core delivered it (LVTPC or a page sample), `None` otherwise.
    pub delivered_to: Option<VcpuId>,
    /// The core routed it but dropped it (`PmiOutcome::Dropped`).
    pub dropped: bool,
}

/// The vCPU table of every domain, in creation order (a handful of vCPUs: searched).
struct Table<C>(Vec<VcpuPmu<C>>);

impl<C> Table<C> {
    fn vcpu(&self, id: VcpuId) -> Option<&VcpuPmu<C>> {
        self.0.iter().find(|v| v.id() == id)
    }

    fn vcpu_mut(&mut self, id: VcpuId) -> Option<&mut VcpuPmu<C>> {
        self.0.iter_mut().find(|v| v.id() == id)
    }
}

impl<C> VcpuTable<C> for Table<C> {
    fn get_mut(&mut self, id: VcpuId) -> Option<&mut VcpuPmu<C>> {
        self.vcpu_mut(id)
    }

    fn for_each_in_domain(&mut self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
        for v in self.0.iter_mut().filter(|v| v.id().domain == domain) {
            visit(v);
        }
    }
}

type Ctx<P> = <<P as Personality>::Backend as PmuBackend>::Context;

/// Everything the vpmu core works on, shared by the vCPU threads.
struct Core<P: Personality> {
    vpmu: Vpmu<P::Backend>,
    pcpus: Vec<PcpuPmu<Ctx<P>, P::Model>>,
    vcpus: Table<Ctx<P>>,
    /// The physical LVTPC mask of each pCPU.
    physical_masked: Vec<bool>,
    /// The VMM's record of every PMI handled (the first `MAX_PMI_LOG`).
    pmi_log: Vec<PmiRecord>,
    /// LVTPC deliveries queued for vCPUs other than the raising thread's.
    queued_lvtpc: Vec<QueuedPmi>,
    /// Shared pCPUs: vCPUs that were sent the PMU VIRQ while another ran, to run next on
    /// their pCPU (the profiler flushes its sample sooner, as a hypervisor scheduler boosts a
    /// woken vCPU).
    wake: Vec<VcpuId>,
}

/// How the vCPUs of a run map to domains, host threads and pCPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One domain (the privileged one) with `n` vCPUs, each on its own host thread, which is
    /// its own pCPU. vCPU `i` is entered with RSI = `i`.
    ThreadPerVcpu(u32),
    /// `n` domains (domain 0 privileged), one VM of one vCPU each, all time-sliced on ONE
    /// host thread, which is one pCPU: `Vpmu::context_switch` at every switch. The vCPU of
    /// domain `d` is entered with RSI = `d`.
    SharedPcpu(u32),
    /// The whole machine: `pcpus` host threads, each one pCPU that time-slices its vCPUs as
    /// `SharedPcpu` does. The privileged domain has one vCPU per pCPU (vCPU `p` on pCPU `p`:
    /// in all mode it profiles that pCPU); every other domain has `vcpus` vCPUs, vCPU `i` on
    /// pCPU `i mod pcpus`. vCPU `i` of domain `d` is entered with RSI = `d` (its LAPIC ID is
    /// `i`).
    SharedPcpus {
        /// pCPUs (host threads).
        pcpus: u32,
        /// Domains, the privileged one included.
        domains: u32,
        /// vCPUs of each unprivileged domain.
        vcpus: u32,
    },
}

impl Layout {
    /// vCPUs of each domain, and the pCPUs, of this layout.
    fn shape(self) -> (Vec<u32>, u32) {
        match self {
            Layout::ThreadPerVcpu(n) => (vec![n], n),
            Layout::SharedPcpu(n) => (vec![1; n as usize], 1),
            Layout::SharedPcpus {
                pcpus,
                domains,
                vcpus,
            } => (
                (0..domains)
                    .map(|d| if d == 0 { pcpus } else { vcpus })
                    .collect(),
                pcpus,
            ),
        }
    }

    /// The pCPU a vCPU runs on in a shared layout (it never moves).
    fn home_pcpu(self, vcpu: VcpuId) -> u32 {
        match self {
            Layout::SharedPcpus { pcpus, .. } => vcpu.vcpu % pcpus.max(1),
            _ => 0,
        }
    }

    fn shared(self) -> bool {
        !matches!(self, Layout::ThreadPerVcpu(_))
    }
}

/// The VMs of one run, ready to run a guest program under personality `P`.
pub struct Machine<P: Personality> {
    personality: P,
    layout: Layout,
    /// One VM per domain, by domain number.
    vms: Vec<Vm>,
    /// vCPUs per domain, by domain number.
    counts: Vec<u32>,
    vcpus: Vec<(VcpuId, Vcpu)>,
    core: Mutex<Core<P>>,
    pages: Mutex<Vec<(u32, u64)>>,
    /// Samples shipped through `port::BATCH` so far, by every vCPU (for progress reports).
    shipped: Arc<AtomicU64>,
    /// Shared pCPU: the domains whose exit ends the run (None: all of them).
    finish_with: Option<Vec<u32>>,
    /// Guest memory to copy into the results after the run: (domain, GPA, bytes).
    peeks: Vec<(u32, u64, usize)>,
}

/// All PMU MSRs of both vendors: a PMU MSR of the other vendor must fault, not reach KVM.
pub fn all_pmu_msr_ranges() -> Vec<(u32, u32)> {
    vpmu_intel::msrs::MSR_RANGES
        .iter()
        .chain(vpmu_amd::msrs::MSR_RANGES)
        .copied()
        .collect()
}

impl<P: Personality> Machine<P> {
    /// A VM with `vcpus` vCPUs running `image`, vCPU `i` entered with RDI = `arg`, RSI = `i`;
    /// one pCPU (software PMU of `personality`) per vCPU; the vpmu in self mode.
    pub fn new(
        kvm: &Kvm,
        personality: P,
        base_cpuid: &CpuId,
        image: &[u8],
        arg: u64,
        vcpus: u32,
    ) -> io::Result<Self> {
        Self::with_layout(
            kvm,
            personality,
            base_cpuid,
            image,
            arg,
            Layout::ThreadPerVcpu(vcpus),
        )
    }

    /// The VMs of `layout`, each running `image` with RDI = `arg`; the vpmu in self mode.
    pub fn with_layout(
        kvm: &Kvm,
        personality: P,
        base_cpuid: &CpuId,
        image: &[u8],
        arg: u64,
        layout: Layout,
    ) -> io::Result<Self> {
        Self::with_images(kvm, personality, base_cpuid, &|_| image, arg, layout)
    }

    /// The VMs of `layout`, domain `d` running `image_of(d)` with RDI = `arg`; the vpmu in
    /// self mode.
    pub fn with_images<'i>(
        kvm: &Kvm,
        personality: P,
        base_cpuid: &CpuId,
        image_of: &dyn Fn(u32) -> &'i [u8],
        arg: u64,
        layout: Layout,
    ) -> io::Result<Self> {
        let mut cpuid = base_cpuid.clone();
        personality.cpuid(&mut cpuid);
        let (counts, pcpu_count) = layout.shape();
        let mut vms = Vec::new();
        let mut vcpus = Vec::new();
        for (domain, &per_domain) in (0u32..).zip(&counts) {
            let (vm, entry) = Vm::new(kvm, &all_pmu_msr_ranges(), image_of(domain))?;
            for i in 0..per_domain {
                let rsp = STACK_TOP - u64::from(i) * STACK_SIZE;
                let rsi = if layout.shared() { domain } else { i };
                let fd = vm.create_vcpu(u64::from(i), &cpuid, entry, rsp, arg, u64::from(rsi))?;
                vcpus.push((VcpuId { domain, vcpu: i }, fd));
            }
            vms.push(vm);
        }
        let vpmu = Vpmu::new(personality.backend(), XENPMU_MODE_SELF);
        let pcpus = (0..pcpu_count)
            .map(|_| vpmu.attach_pcpu(personality.model()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io::Error::other(format!("attach_pcpu: {e:?}")))?;
        let table = Table(vcpus.iter().map(|&(id, _)| vpmu.new_vcpu(id)).collect());
        Ok(Self {
            personality,
            layout,
            vms,
            counts,
            vcpus,
            core: Mutex::new(Core {
                vpmu,
                pcpus,
                vcpus: table,
                physical_masked: vec![false; pcpu_count as usize],
                pmi_log: Vec::new(),
                queued_lvtpc: Vec::new(),
                wake: Vec::new(),
            }),
            pages: Mutex::new(Vec::new()),
            shipped: Arc::new(AtomicU64::new(0)),
            finish_with: None,
            peeks: Vec::new(),
        })
    }

    /// Runs every vCPU until each writes its exit status, `timeout` passes, or something
    /// breaks: each on its own thread, or all on this thread (`Layout::SharedPcpu`). Results
    /// in vCPU creation order (by vCPU index, or by domain).
    pub fn run(self, timeout: Duration) -> Vec<RunResult>
    where
        P: Sync,
        P::Model: Send,
        P::Backend: Send,
        Ctx<P>: Send,
    {
        let Machine {
            personality,
            layout,
            vms,
            counts,
            vcpus,
            core,
            pages,
            shipped,
            finish_with,
            peeks,
        } = self;
        let count = vcpus.len() as u32;
        let vcpu_ids: Vec<VcpuId> = vcpus.iter().map(|&(id, _)| id).collect();
        let tsc_khz = vcpus
            .first()
            .and_then(|(_, v)| v.fd.get_tsc_khz().ok())
            .map_or(1_000_000, u64::from);
        let barrier = Rendezvous::new(vcpus.len());
        let shared = layout.shared();
        let runners = vcpus.into_iter().enumerate().map(|(i, (me, vcpu))| Runner {
            personality: &personality,
            vm: &vms[me.domain as usize],
            vms: &vms,
            counts: &counts,
            core: &core,
            pages: &pages,
            shipped: &shipped,
            vcpu,
            me,
            pcpu: if shared {
                layout.home_pcpu(me)
            } else {
                i as u32
            },
            count,
            barrier: &barrier,
            state: PlatformState::default(),
            sync: kvm_sync_regs::default(),
            next_rip: 0,
            handler: MsrHandler::Vpmu,
            tsc_khz,
            run_ns: 0,
            fed_cycles: 0,
            slices: 0,
            activity: platform::VmmActivity::Other,
            group: Vec::new(),
        });
        let mut results = if shared {
            Self::run_pcpus(runners.collect(), timeout, finish_with.as_deref(), &core)
        } else {
            Self::run_threads(runners, timeout)
        };
        for (domain, gpa, len) in peeks {
            let bytes = vms[domain as usize]
                .mem
                .slice_mut(gpa, len)
                .map(|b| b.to_vec());
            // The first vCPU of the domain carries its domain's peeks.
            let first = vcpu_ids.iter().position(|id| id.domain == domain);
            if let (Some(bytes), Some(r)) = (bytes, first.and_then(|i| results.get_mut(i))) {
                r.peeked.push((gpa, bytes));
            }
        }
        results
    }

    /// Shared layouts: one thread per pCPU, each time-slicing its vCPUs (`sched`). Results
    /// in vCPU creation order; the VMM's PMI record (on the first result) and the core's
    /// statistics filled in once every pCPU is done.
    fn run_pcpus<'r>(
        runners: Vec<Runner<'r, P>>,
        timeout: Duration,
        finish_with: Option<&[u32]>,
        core: &Mutex<Core<P>>,
    ) -> Vec<RunResult>
    where
        P: Sync + 'r,
        P::Model: Send,
        P::Backend: Send,
        Ctx<P>: Send,
    {
        let ids: Vec<VcpuId> = runners.iter().map(|r| r.me).collect();
        let pcpus = runners.iter().map(|r| r.pcpu).max().map_or(0, |p| p + 1);
        let mut groups: Vec<Vec<Runner<'r, P>>> = (0..pcpus).map(|_| Vec::new()).collect();
        for r in runners {
            let p = r.pcpu as usize;
            groups[p].push(r);
        }
        let mut results: Vec<RunResult> = if groups.len() == 1 {
            let group = groups.pop().unwrap_or_default();
            sched::run_shared(group, timeout, finish_with)
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = groups
                    .into_iter()
                    .map(|group| s.spawn(move || sched::run_shared(group, timeout, finish_with)))
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| {
                        h.join().unwrap_or_else(|_| {
                            vec![RunResult {
                                error: Some("pCPU thread panicked".into()),
                                ..RunResult::default()
                            }]
                        })
                    })
                    .collect()
            })
        };
        results.sort_by_key(|r| r.vcpu.and_then(|v| ids.iter().position(|i| *i == v)));
        let guard = core.lock().expect("vpmu core lock");
        for (i, r) in results.iter_mut().enumerate() {
            r.pmi_log = if i == 0 {
                guard.pmi_log.clone()
            } else {
                Vec::new()
            };
            r.stats = r.vcpu.and_then(|v| guard.vcpus.vcpu(v)).map(|v| *v.stats());
        }
        results
    }

    fn run_threads<'r>(
        runners: impl Iterator<Item = Runner<'r, P>>,
        timeout: Duration,
    ) -> Vec<RunResult>
    where
        P: Sync + 'r,
        P::Model: Send,
        P::Backend: Send,
        Ctx<P>: Send,
    {
        std::thread::scope(|s| {
            let handles: Vec<_> = runners
                .map(|runner| s.spawn(move || runner.run(timeout)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| RunResult {
                        error: Some("vCPU thread panicked".into()),
                        ..RunResult::default()
                    })
                })
                .collect()
        })
    }

    /// Domain `domain`'s guest memory (to configure a guest before the run).
    pub fn memory(&self, domain: u32) -> Option<&GuestMem> {
        self.vms.get(domain as usize).map(|vm| &vm.mem)
    }

    /// A counter of the samples the guests ship through `port::BATCH` during `run` (shared,
    /// for a progress display on another thread).
    pub fn shipped_samples(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.shipped)
    }

    /// Shared pCPU: the run ends when every domain in `domains` has written its exit status;
    /// the others are stopped then (their results have no status and no error).
    pub fn finish_with(&mut self, domains: Vec<u32>) {
        self.finish_with = Some(domains);
    }

    /// After the run, copies `len` bytes at `gpa` of `domain`'s memory into the result of
    /// that domain's first vCPU (`RunResult::peeked`): what a guest left in memory (None if
    /// the range is outside guest memory).
    pub fn peek_after_run(&mut self, domain: u32, gpa: u64, len: usize) -> Option<()> {
        self.vms.get(domain as usize)?.mem.slice_mut(gpa, len)?;
        self.peeks.push((domain, gpa, len));
        Some(())
    }

    /// The guest TSC frequency KVM reports.
    pub fn tsc_khz(&self) -> Option<u32> {
        self.vcpus.first()?.1.fd.get_tsc_khz().ok()
    }
}

/// Formats the console output with a prefix per line (for verbose runs).
pub fn indent(text: &str, prefix: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let _ = writeln!(out, "{prefix}{line}");
    }
    out
}
