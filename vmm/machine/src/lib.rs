//! One guest run: one VM per domain (`Layout`): either one domain with one or more vCPUs,
//! each on its own host thread, which is also its pCPU with its own software PMU model; or
//! several one-vCPU domains time-sliced on one thread = one pCPU. The vpmu core drives the
//! models through `vpmu::Platform`, with no global lock: the `Vpmu` is shared by `&self`, each
//! pCPU thread owns its `PcpuPmu` (with its physical LVTPC mask, its request queue and its PMI
//! record: `Pcpu`), and each vCPU's state sits behind its own mutex (`Table`). Work the core
//! needs done on another pCPU arrives in that pCPU's queue and is completed by its thread before
//! its next entry (`Platform::send_request` kicks it out of `KVM_RUN`).
//!
//! Exits:
//! * RDMSR/WRMSR of a filtered PMU MSR → `Vpmu::rdmsr`/`wrmsr` (`GeneralProtection` or an MSR
//!   of the other vendor → #GP through `exit.error`);
//! * port I/O: console, exit status, the control-operation hypercall (restarted inside the VMM
//!   while the core answers `-EAGAIN`), benchmark control;
//! * `Debug` (single-step): one retired instruction, decoded with iced-x86, fed to the model.
//!
//! Precise mode: while the pCPU's model has a counter enabled the vCPU is single-stepped, and
//! each retired instruction is counted as `Instructions` (and `Branches` for any control
//! transfer) in the mode of its CPL, with the counter state after it retired. Single-step works
//! only at CPL0 on this host's KVM, so CPL3 code is never counted. After every exit, a raised
//! PMI line goes through `Vpmu::handle_pmi`, which delivers through the guest's LVTPC (or the
//! shared page and the VIRQ).
//!
//! Timed mode: the vCPU runs free; the time it ran in each `KVM_RUN` (the thread's CPU time
//! there, less the time KVM reports it halted: `halt`), in TSC ticks (the guest TSC is the
//! host's here), is fed as core and reference cycles in the mode of the CPL at the exit (an
//! approximation: a run may span CPLs). Before each entry the model computes after how
//! many cycles a PMI would be raised (`SoftwarePmu::cycles_until_pmi`, arithmetic, on the
//! thread's own model), and the VMM arms a kick for that time. The
//! interrupted context of a PMI (`Platform::interrupted`) is the sync-regs state at the exit
//! that raised it, so at a kick that landed in CPL3 code it is that code's RIP and CPL 3; every
//! delivered PMI's context is kept (`RunResult::pmi_contexts`, guest port 0x15 for the last).
//!
//! Modules: `platform` (the `vpmu::Platform` impl and the state the pCPU threads share),
//! `runner` (the vCPU thread's run loop and migrations), `sched` (several domains' vCPUs on one
//! thread and pCPU), `exit` (copying exits out of `kvm_run`, MSR and hypercall handling),
//! `precise` and `timed` (the two event sources), `window` (the MMIO port window: `outl`s by
//! MMIO, for guest code whose port I/O does not reach the VMM), `mixed` (a Linux domain 0 with
//! ELF workload domains on one pCPU) and `idle` (held workloads, a halted Linux vCPU's turns).

use std::fmt::Write as _;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kvm_bindings::{CpuId, kvm_sync_regs};
use kvm_ioctls::Kvm;
use vpmu::{CrossCpuRequest, Mode, PcpuPmu, PmuBackend, VcpuId, VcpuPmu, VcpuTable, Vpmu};

pub use crate::error::MachineError;
use crate::error::Result;
use crate::kvm::Vcpu;
pub use crate::kvm::{GuestMem, Vm};
use crate::personality::Personality;
pub use vpmu_models::shapes::Shape;

pub use complete::Completions;
use exit::MsrHandler;
use host::Host;
use platform::PlatformState;
pub use platform::{PmiContext, VmmActivity};
use rendezvous::Rendezvous;
use runner::Runner;

pub mod boot;
mod complete;
pub mod error;
mod exit;
mod halt;
mod host;
mod idle;
pub mod interface_off;
pub mod kick;
pub mod kvm;
mod layout;
pub mod linux;
pub mod loader;
mod mixed;
mod page_write;
pub mod personality;
mod platform;
pub mod port;
mod precise;
pub mod quirks;
mod rdpmc;
mod rendezvous;
mod results;
mod ring;
mod runner;
pub mod save;
mod sched;
pub mod symbols;
#[cfg(test)]
mod tests;
pub(crate) mod timed;
pub mod timing;
pub mod translate;
pub mod transport;
mod window;

/// The privileged domain (domain 0; a run has one VM per domain, numbered from 0).
pub const PRIVILEGED_DOMAIN: u32 = 0;
/// The vector of the PMU VIRQ (a sample is in the shared page), reported to guests in the
/// transport's CPUID leaf (`transport`).
pub const VIRQ_VECTOR: u8 = vpmu_guest_protocol::virq::VIRQ_VECTOR;
/// Stack per vCPU.
const STACK_SIZE: u64 = 0x1_0000;

pub use layout::Layout;
pub use mixed::Workloads;
pub use results::{LockCount, PmiRecord, RunResult};
pub(crate) use results::{count_shared_lock, lock_shared, lock_vcpu, locks_taken};

/// Where each vCPU's state is in the per-vCPU arrays: vCPUs in creation order, domain by
/// domain, so vCPU `v` of domain `d` is at `first[d] + v`.
#[derive(Clone, Debug)]
struct VcpuIndex {
    first: Vec<usize>,
    counts: Vec<u32>,
}

impl VcpuIndex {
    fn new(counts: &[u32]) -> Self {
        let first = counts
            .iter()
            .scan(0usize, |next, &n| {
                let at = *next;
                *next += n as usize;
                Some(at)
            })
            .collect();
        Self {
            first,
            counts: counts.to_vec(),
        }
    }

    fn of(&self, id: VcpuId) -> Option<usize> {
        let count = *self.counts.get(id.domain as usize)?;
        (id.vcpu < count).then(|| self.first[id.domain as usize] + id.vcpu as usize)
    }
}

/// The vCPU table of every domain, each vCPU's state behind its own mutex: the core visits one
/// at a time (it never nests visits), so any pCPU thread can reach any vCPU without a lock
/// that serializes the others.
struct Table<C> {
    vcpus: Vec<Mutex<VcpuPmu<C>>>,
    index: VcpuIndex,
}

impl<C> Table<C> {
    fn lock(&self, id: VcpuId) -> Option<MutexGuard<'_, VcpuPmu<C>>> {
        let slot = self.vcpus.get(self.index.of(id)?)?;
        Some(lock_vcpu(slot))
    }
}

impl<C> VcpuTable<C> for Table<C> {
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) -> bool {
        match self.lock(id) {
            Some(mut vcpu) => {
                visit(&mut vcpu);
                true
            }
            None => false,
        }
    }

    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
        let Some(&count) = self.index.counts.get(domain as usize) else {
            return;
        };
        for vcpu in 0..count {
            if let Some(mut v) = self.lock(VcpuId { domain, vcpu }) {
                visit(&mut v);
            }
        }
    }
}

type Ctx<P> = <<P as Personality>::Backend as PmuBackend>::Context;

impl<P: Personality> Shared<P> {
    /// Drops the LVTPC deliveries still queued for `vcpu` (torn down, or out of the mode they
    /// were routed under) and reports each to the core as not delivered
    /// (`Vpmu::lvtpc_delivery_done(.., false)`: the PMI leaves the in-flight count as dropped).
    /// Returns how many were dropped.
    fn discard_queued(&self, vcpu: VcpuId) -> usize {
        let dropped = self.host.drop_queued(vcpu);
        if dropped > 0 {
            if let Some(mut v) = self.vcpus.lock(vcpu) {
                for _ in 0..dropped {
                    self.vpmu.lvtpc_delivery_done(&mut v, false);
                }
            }
        }
        dropped
    }

    /// `discard_queued` for every vCPU.
    fn discard_all_queued(&self) -> usize {
        self.host
            .vcpu_ids()
            .map(|vcpu| self.discard_queued(vcpu))
            .sum()
    }
}

/// What every pCPU thread of a run shares, by `&`: the core, the vCPU table, the platform's
/// shared state, and the slots through which pCPUs change threads at a migration.
struct Shared<P: Personality> {
    vpmu: Vpmu<P::Backend>,
    vcpus: Table<Ctx<P>>,
    host: Host,
    /// A migration parks each pCPU here until the thread that becomes it takes it.
    parking: Vec<Mutex<Option<Pcpu<P>>>>,
    /// Whether the workload domains wait for domain 0 (`idle`; a mixed machine's).
    hold: idle::Hold,
}

/// One pCPU: owned by the one thread that is this pCPU (moved only at a migration, when the
/// thread that becomes it takes it over), never behind a lock.
struct Pcpu<P: Personality> {
    pmu: PcpuPmu<Ctx<P>, P::Model>,
    /// Requests other pCPUs sent this one (`Platform::send_request`), completed by this
    /// pCPU's thread before its next guest entry.
    requests: Receiver<CrossCpuRequest>,
    /// The physical LVTPC mask (set by the core while a sample is cached).
    masked: bool,
    /// The VMM's record of every PMI handled here (the first `MAX_PMI_LOG`).
    pmi_log: Vec<PmiRecord>,
    /// The vCPUs whose sample rings this pCPU's thread polls (`ring::RingPoll`).
    ring_poll: ring::RingPoll,
}

/// What a consumer of the machine (the profiler, a test) sees of a guest's port write: which
/// vCPU wrote and its domain's memory, to copy what the guest points at.
#[derive(Clone, Copy, Debug)]
pub struct PortAccess<'m> {
    /// The vCPU that wrote.
    pub vcpu: VcpuId,
    /// Its domain's guest memory.
    pub memory: &'m GuestMem,
}

/// Ports a consumer adds to the machine (`Machine::extend`): the machine handles its own
/// (`port`) and passes every other `outl` here. Called on the writing vCPU's thread; an error
/// ends that vCPU's run with it (a consumer's guest is the consumer's own program).
pub trait GuestPorts: Send + Sync {
    /// `outl(port, value)` by `access.vcpu`. Ports the extension does not know are ignored
    /// (`Ok`), as the machine ignores unknown ports.
    fn out(&self, access: PortAccess<'_>, port: u16, value: u32) -> Result<(), String>;

    /// A PMU MSR exit of `access.vcpu` (RDMSR, or WRMSR of `Some(value)`), before the vpmu
    /// answers it: which vCPU each access came from, for consumers that check where a guest's
    /// accesses land (`vpmu-ring0`). The default ignores it.
    fn msr(&self, access: PortAccess<'_>, msr: u32, write: Option<u64>) {
        let _ = (access, msr, write);
    }
}

/// The VMs of one run, ready to run a guest program under personality `P`.
pub struct Machine<P: Personality> {
    personality: P,
    layout: Layout,
    /// One VM per domain, by domain number.
    vms: Vec<Vm>,
    vcpus: Vec<(VcpuId, Vcpu)>,
    shared: Shared<P>,
    /// Each pCPU, until the run hands it to its thread.
    pcpus: Vec<Pcpu<P>>,
    /// The consumer's ports, if any (`Machine::extend`).
    extension: Option<Arc<dyn GuestPorts>>,
    /// Shared pCPU: the domains whose exit ends the run (None: all of them).
    finish_with: Option<Vec<u32>>,
    /// Guest memory to copy into the results after the run: (domain, GPA, bytes).
    peeks: Vec<(u32, u64, usize)>,
    /// Boot-image mode (`boot`): the PC devices of its one vCPU, which replace the project's
    /// guest ports.
    devices: Option<boot::PcDevices>,
    /// The host quirks the VMM completes (Linux boot mode probes them; none elsewhere).
    quirks: quirks::HostQuirks,
    /// The host switches the xenpmu interface off this long after domain 0's first PMI
    /// (`switch_interface_off_after`).
    interface_off_after: Option<Duration>,
    /// A save of the running VM asked for (`Machine::save_after`).
    save: Option<Arc<save::SaveSlot<P>>>,
}

impl<P: Personality> std::fmt::Debug for Machine<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("layout", &self.layout)
            .field("vcpus", &self.vcpus.len())
            .finish_non_exhaustive()
    }
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
    ) -> Result<Self> {
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
    ) -> Result<Self> {
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
    ) -> Result<Self> {
        let (counts, _) = layout.shape();
        layout.check_domains()?;
        let mut cpuid = base_cpuid.clone();
        personality.cpuid(&mut cpuid);
        let mut vms = Vec::new();
        let mut vcpus = Vec::new();
        for (domain, &per_domain) in (0u32..).zip(&counts) {
            let (vm, fds) = mixed::elf_domain(
                kvm,
                &cpuid,
                image_of(domain),
                domain,
                per_domain,
                arg,
                layout.shared(),
            )?;
            vcpus.extend(fds);
            vms.push(vm);
        }
        Self::assemble(personality, layout, vms, vcpus)
    }

    /// The machine of `layout` over its VMs (by domain) and vCPUs (domain by domain): the
    /// vpmu in self mode, one pCPU per vCPU or per shared pCPU.
    fn assemble(
        personality: P,
        layout: Layout,
        vms: Vec<Vm>,
        vcpus: Vec<(VcpuId, Vcpu)>,
    ) -> Result<Self> {
        let (counts, pcpu_count) = layout.shape();
        let vpmu = Vpmu::new(personality.backend(), Mode::SelfProfiling, pcpu_count);
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..pcpu_count).map(|_| mpsc::channel()).unzip();
        // Attached here, before any thread runs: a software model is clean wherever it is
        // attached, and it moves to its pCPU's thread with the rest of the pCPU.
        let pcpus = (0..pcpu_count)
            .zip(receivers)
            .map(|(index, requests)| {
                vpmu.attach_pcpu(index, personality.model())
                    .map(|pmu| Pcpu {
                        pmu,
                        requests,
                        masked: false,
                        pmi_log: Vec::new(),
                        ring_poll: ring::RingPoll::default(),
                    })
                    .map_err(|error| MachineError::Core {
                        call: "attach_pcpu",
                        error,
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let index = VcpuIndex::new(&counts);
        let table = Table {
            vcpus: vcpus
                .iter()
                .map(|&(id, _)| {
                    vpmu.new_vcpu(id)
                        .map(Mutex::new)
                        .map_err(|error| MachineError::Core {
                            call: "new_vcpu",
                            error,
                        })
                })
                .collect::<Result<Vec<_>>>()?,
            index: index.clone(),
        };
        let host = Host::new(layout, index, senders);
        Ok(Self {
            personality,
            layout,
            vms,
            vcpus,
            shared: Shared {
                vpmu,
                vcpus: table,
                host,
                parking: (0..pcpu_count).map(|_| Mutex::new(None)).collect(),
                hold: idle::Hold::default(),
            },
            pcpus,
            extension: None,
            finish_with: None,
            peeks: Vec::new(),
            devices: None,
            quirks: quirks::HostQuirks::default(),
            interface_off_after: None,
            save: None,
        })
    }

    /// Runs every vCPU until each writes its exit status, `timeout` passes, or something
    /// breaks: each on its own thread, or all on this thread (`Layout::SharedPcpu`). Results
    /// in vCPU creation order (by vCPU index, or by domain).
    pub fn run(self, timeout: Duration) -> Vec<RunResult>
    where
        P: Sync,
        P::Model: Send,
        P::Backend: Send + Sync,
        Ctx<P>: Send,
    {
        let Machine {
            personality,
            layout,
            vms,
            vcpus,
            shared,
            pcpus,
            extension,
            finish_with,
            peeks,
            devices,
            quirks,
            interface_off_after,
            save,
        } = self;
        let count = vcpus.len() as u32;
        let vcpu_ids: Vec<VcpuId> = vcpus.iter().map(|&(id, _)| id).collect();
        let tsc_khz = vcpus
            .first()
            .and_then(|(_, v)| v.fd.get_tsc_khz().ok())
            .map_or(1_000_000, u64::from);
        let barrier = Rendezvous::new(vcpus.len());
        let shared_layout = layout.shared();
        let timed = personality.source() == crate::personality::Source::Timed;
        // The quirks are the kernel's, in domain 0 (a mixed machine's ELF domains run as
        // `with_images` runs them).
        let plain = quirks::HostQuirks::default();
        let quirks_of = |me: VcpuId| [&quirks, &plain][usize::from(me.domain != PRIVILEGED_DOMAIN)];
        let runners = vcpus.into_iter().enumerate().map(|(i, (me, vcpu))| Runner {
            // The timed source feeds no cycles for the time a vCPU was halted.
            halt: timed.then(|| halt::HaltClock::new(&vcpu.fd)).flatten(),
            split: (timed && quirks_of(me).cpl0_emulated)
                .then(|| timed::CplSplit::new(&vcpu.fd, quirks_of(me).ps_per_emulated))
                .flatten(),
            personality: &personality,
            vm: &vms[me.domain as usize],
            vms: &vms,
            shared: &shared,
            extension: extension.as_deref(),
            vcpu,
            me,
            pcpu: if shared_layout {
                layout.home_pcpu(me)
            } else {
                i as u32
            },
            count,
            barrier: &barrier,
            cpu: None,
            state: PlatformState {
                tsc_khz,
                ..PlatformState::default()
            },
            sync: kvm_sync_regs::default(),
            next_rip: 0,
            handler: MsrHandler::Vpmu,
            tsc_khz,
            run_ns: 0,
            fed_cycles: 0,
            slices: 0,
            activity: platform::VmmActivity::Other,
            preempted: None,
            halted_ns: 0,
            halted_in_run: false,
            halted_at_entry: false,
            devices: None,
            stepping_over: false,
            quirks: quirks_of(me),
            completions: complete::Completions::default(),
            halt_check: None,
            interface_off: interface_off_after
                .filter(|_| me == interface_off::ADMINISTRATOR)
                .map(interface_off::Plan::new),
            save: save.as_deref(),
        });
        // Boot-image mode has one vCPU, which gets the devices.
        let mut devices = devices;
        let runners = runners.map(move |mut r| {
            r.devices = devices.take();
            r
        });
        let mut results = if shared_layout {
            Self::run_pcpus(runners.collect(), pcpus, timeout, finish_with.as_deref())
        } else {
            Self::run_threads(runners, pcpus, timeout)
        };
        // Every vCPU thread has ended: deliveries still queued never will be.
        shared.discard_all_queued();
        for (domain, gpa, len) in peeks {
            let bytes = vms[domain as usize].mem.to_vec(gpa, len);
            // The first vCPU of the domain carries its domain's peeks.
            let first = vcpu_ids.iter().position(|id| id.domain == domain);
            if let (Some(bytes), Some(r)) = (bytes, first.and_then(|i| results.get_mut(i))) {
                r.peeked.push((gpa, bytes));
            }
        }
        if shared_layout {
            for r in &mut results {
                r.stats = r
                    .vcpu
                    .and_then(|v| shared.vcpus.lock(v))
                    .map(|v| *v.stats());
            }
        }
        results
    }

    /// Shared layouts: one thread per pCPU, each time-slicing its vCPUs (`sched`). Results
    /// in vCPU creation order; the VMM's PMI record of every pCPU (pCPU by pCPU, each in its
    /// order: a vCPU's PMIs all come from its one pCPU) on the first result.
    fn run_pcpus<'r>(
        runners: Vec<Runner<'r, P>>,
        pcpus: Vec<Pcpu<P>>,
        timeout: Duration,
        finish_with: Option<&[u32]>,
    ) -> Vec<RunResult>
    where
        P: Sync + 'r,
        P::Model: Send,
        P::Backend: Send + Sync,
        Ctx<P>: Send,
    {
        let ids: Vec<VcpuId> = runners.iter().map(|r| r.me).collect();
        let mut groups: Vec<(Pcpu<P>, Vec<Runner<'r, P>>)> =
            pcpus.into_iter().map(|cpu| (cpu, Vec::new())).collect();
        for r in runners {
            let p = r.pcpu as usize;
            groups[p].1.push(r);
        }
        let outcomes: Vec<(Vec<RunResult>, Vec<PmiRecord>)> = if groups.len() == 1 {
            groups
                .into_iter()
                .map(|(cpu, group)| sched::run_shared(group, cpu, timeout, finish_with))
                .collect()
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = groups
                    .into_iter()
                    .map(|(cpu, group)| {
                        s.spawn(move || sched::run_shared(group, cpu, timeout, finish_with))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            let failed = RunResult {
                                error: Some("pCPU thread panicked".into()),
                                ..RunResult::default()
                            };
                            (vec![failed], Vec::new())
                        })
                    })
                    .collect()
            })
        };
        let mut log = Vec::new();
        let mut results = Vec::new();
        for (r, l) in outcomes {
            results.extend(r);
            log.extend(l);
        }
        results.sort_by_key(|r| r.vcpu.and_then(|v| ids.iter().position(|i| *i == v)));
        if let Some(first) = results.first_mut() {
            first.pmi_log = log;
        }
        results
    }

    fn run_threads<'r>(
        runners: impl Iterator<Item = Runner<'r, P>>,
        pcpus: Vec<Pcpu<P>>,
        timeout: Duration,
    ) -> Vec<RunResult>
    where
        P: Sync + 'r,
        P::Model: Send,
        P::Backend: Send + Sync,
        Ctx<P>: Send,
    {
        std::thread::scope(|s| {
            let handles: Vec<_> = runners
                .zip(pcpus)
                .map(|(mut runner, cpu)| {
                    runner.cpu = Some(cpu);
                    s.spawn(move || runner.run(timeout))
                })
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

    /// Hands the guests' `outl`s to ports the machine does not handle itself to `extension`
    /// (from every vCPU thread, while the vCPU is stopped in the exit).
    pub fn extend(&mut self, extension: Arc<dyn GuestPorts>) {
        self.extension = Some(extension);
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
        if !self.vms.get(domain as usize)?.mem.contains(gpa, len) {
            return None;
        }
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
