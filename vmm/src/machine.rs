//! One guest run: a VM of one domain with one or more vCPUs, each on its own host thread,
//! which is also its pCPU with its own software PMU model; the vpmu core (`Vpmu`, the pCPU
//! states and the vCPU table, behind one mutex) drives the models through `vpmu::Platform`.
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
//! (an approximation: a run may span CPLs). Before each entry the VMM finds, on a copy of the
//! model, after how many cycles a PMI would be raised, and arms a kick for that time.

use std::fmt::Write as _;
use std::io;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use kvm_bindings::{CpuId, kvm_msi, kvm_sync_regs};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd};
use vpmu::abi::ops::Params;
use vpmu::abi::{Page, Regs, XENPMU_MODE_SELF, XENPMU_REGS_MODE_64, XENPMU_REGS_MODE_USER};
use vpmu::{
    AllowAll, Diagnostic, EventFilter, ExecMode, HwEvent, Interrupted, LvtpcDelivery, MapError,
    Msr, MsrOutcome, PageSlot, PcpuPmu, Platform, PmuBackend, SoftwarePmu, VcpuId, VcpuPmu,
    VcpuTable, Vpmu,
};
use zerocopy::{FromBytes, IntoBytes};

use crate::guest::port;
use crate::kick::Kick;
use crate::kvm::{STACK_TOP, Vcpu, Vm};
use crate::personality::{Personality, Source};

/// The only domain of a run (also the privileged one: a single-VM host).
pub const DOMAIN: u32 = 0;
/// The vector of the PMU VIRQ (a sample is in the shared page).
pub const VIRQ_VECTOR: u8 = 0x41;
/// Stack per vCPU.
const STACK_SIZE: u64 = 0x1_0000;
const LAPIC_ID: usize = 0x20;
const LAPIC_SVR: usize = 0xF0;
const LAPIC_LVTPC: usize = 0x340;
const LVT_MASKED: u32 = 1 << 16;

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
}

/// Per-vCPU platform state kept across exits.
#[derive(Debug, Default)]
struct PlatformState {
    /// The last guest registers (sync regs), for `Platform::interrupted`.
    regs: Regs,
    /// The physical LVTPC of this vCPU's pCPU is masked.
    physical_masked: bool,
    /// An interrupt was injected (vector), so the next retired instruction is its handler's.
    injected: Option<u8>,
    diagnostics: u64,
    pmis: u64,
}

/// The `Platform` view of the VM from one vCPU thread, built between runs.
struct KvmPlatform<'a> {
    vm: &'a Vm,
    /// This thread's vCPU (the only one whose LAPIC it may touch between runs).
    vcpu: &'a VcpuFd,
    me: VcpuId,
    /// The pCPU this thread currently is.
    pcpu: u32,
    vcpus: u32,
    /// Mapped shared pages (frame numbers), VM-wide.
    pages: &'a Mutex<Vec<u64>>,
    state: &'a mut PlatformState,
}

impl Platform for KvmPlatform<'_> {
    fn privileged_domain(&self) -> u32 {
        DOMAIN
    }

    fn vcpu_count(&self, domain: u32) -> Option<u32> {
        (domain == DOMAIN).then_some(self.vcpus)
    }

    fn event_filter(&self, _domain: u32) -> &dyn EventFilter {
        &AllowAll
    }

    fn map_page(&mut self, domain: u32, gfn: u64) -> Result<PageSlot, MapError> {
        let in_ram = gfn
            .checked_mul(4096)
            .and_then(|gpa| self.vm.mem.slice_mut(gpa, 4096))
            .is_some();
        if domain != DOMAIN || !in_ram || gfn == 0 {
            return Err(MapError::InvalidFrame);
        }
        let mut pages = self.pages.lock().map_err(|_| MapError::NoMemory)?;
        pages.push(gfn);
        Ok(PageSlot(gfn))
    }

    fn unmap_page(&mut self, slot: PageSlot) {
        if let Ok(mut pages) = self.pages.lock() {
            if let Some(i) = pages.iter().position(|&g| g == slot.0) {
                pages.swap_remove(i);
            }
        }
    }

    fn with_page<R>(&mut self, slot: PageSlot, access: impl FnOnce(&mut Page) -> R) -> Option<R> {
        if !self.pages.lock().ok()?.contains(&slot.0) {
            return None;
        }
        let bytes = self.vm.mem.slice_mut(slot.0 * 4096, 4096)?;
        let page = Page::mut_from_bytes(bytes).ok()?;
        Some(access(page))
    }

    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, mask_on_delivery: bool) -> LvtpcDelivery {
        // In self and hv mode the receiver is the vCPU this thread runs. Another vCPU's LAPIC
        // (all mode) would need a cross-thread request: not implemented, reported as masked.
        if vcpu != self.me {
            return LvtpcDelivery::Masked;
        }
        let Ok(mut lapic) = self.vcpu.get_lapic() else {
            return LvtpcDelivery::Masked;
        };
        let read = |l: &kvm_bindings::kvm_lapic_state, off: usize| {
            u32::from_le_bytes(std::array::from_fn(|i| l.regs[off + i] as u8))
        };
        let lvtpc = read(&lapic, LAPIC_LVTPC);
        let enabled = read(&lapic, LAPIC_SVR) & 0x100 != 0;
        if lvtpc & LVT_MASKED != 0 || !enabled {
            return LvtpcDelivery::Masked;
        }
        if mask_on_delivery {
            let masked = (lvtpc | LVT_MASKED).to_le_bytes();
            for (i, b) in masked.iter().enumerate() {
                lapic.regs[LAPIC_LVTPC + i] = *b as std::os::raw::c_char;
            }
            // set_lapic before the interrupt is raised, so that the written image cannot
            // overwrite the IRR bit.
            if self.vcpu.set_lapic(&lapic).is_err() {
                return LvtpcDelivery::Masked;
            }
        }
        let apic_id = read(&lapic, LAPIC_ID) >> 24;
        let vector = (lvtpc & 0xff) as u8;
        let delivered = match (lvtpc >> 8) & 7 {
            4 => {
                self.state.injected = Some(2);
                self.vcpu.nmi().is_ok()
            }
            _ => {
                self.state.injected = Some(vector);
                self.msi(apic_id, vector)
            }
        };
        if delivered {
            self.state.pmis += 1;
            LvtpcDelivery::Delivered
        } else {
            LvtpcDelivery::Masked
        }
    }

    fn raise_pmu_virq(&mut self, vcpu: VcpuId) {
        if vcpu == self.me {
            self.state.injected = Some(VIRQ_VECTOR);
        }
        // KVM's LAPIC IDs are the vCPU indices.
        self.msi(vcpu.vcpu, VIRQ_VECTOR);
    }

    fn set_physical_lvtpc_masked(&mut self, pcpu: u32, masked: bool) {
        // Only this thread's own pCPU is ever asked here (self/hv mode).
        if pcpu == self.pcpu {
            self.state.physical_masked = masked;
        }
    }

    fn interrupted(&self, _pcpu: u32) -> Interrupted {
        Interrupted::Guest {
            vcpu: self.me,
            regs: self.state.regs,
        }
    }

    fn diagnostic(&mut self, diagnostic: Diagnostic) {
        // Rate limit: the first few per vCPU only.
        self.state.diagnostics += 1;
        if self.state.diagnostics <= 8 {
            eprintln!("vpmu diagnostic: {diagnostic:?}");
        }
    }
}

impl KvmPlatform<'_> {
    fn msi(&self, apic_id: u32, vector: u8) -> bool {
        let msi = kvm_msi {
            address_lo: 0xFEE0_0000 | apic_id << 12,
            data: u32::from(vector),
            ..Default::default()
        };
        matches!(self.vm.vm.signal_msi(msi), Ok(n) if n > 0)
    }
}

/// The vCPU table of the VM's domain: vCPU `i` at index `i`.
struct Table<C>(Vec<VcpuPmu<C>>);

impl<C> VcpuTable<C> for Table<C> {
    fn get_mut(&mut self, id: VcpuId) -> Option<&mut VcpuPmu<C>> {
        self.0.get_mut(id.vcpu as usize).filter(|v| v.id() == id)
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
}

/// An exit, copied out of `kvm_run` so that the vCPU is free again; replies go through the
/// raw pointers into the `kvm_run` page (valid while the vCPU fd lives).
enum Exit {
    Rdmsr {
        index: u32,
        data: *mut u64,
        error: *mut u8,
    },
    Wrmsr {
        index: u32,
        value: u64,
        error: *mut u8,
    },
    Out {
        port: u16,
        value: u32,
    },
    In {
        port: u16,
        data: *mut u8,
        len: usize,
    },
    Debug {
        pc: u64,
    },
    /// `KVM_RUN` returned `EINTR`: kicked.
    Kicked,
    Other(String),
}

/// How PMU MSR exits are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MsrHandler {
    Vpmu,
    /// Benchmark baseline: reads return 0, writes are dropped, nothing else runs.
    Null,
}

/// A VM ready to run a guest program under personality `P`.
pub struct Machine<P: Personality> {
    personality: P,
    vm: Vm,
    vcpus: Vec<Vcpu>,
    core: Mutex<Core<P>>,
    pages: Mutex<Vec<u64>>,
}

/// Intel PMU MSRs no backend range covers, filtered anyway so that KVM never answers them
/// (the vpmu says `NotPmu` and the guest gets #GP): IA32_PERF_METRICS (0x329) and
/// IA32_PERF_GLOBAL_INUSE (0x392).
const UNMODELLED_PMU_MSRS: &[(u32, u32)] = &[(0x329, 0x329), (0x392, 0x392)];

/// All PMU MSRs of both vendors: a PMU MSR of the other vendor must fault, not reach KVM.
pub fn all_pmu_msr_ranges() -> Vec<(u32, u32)> {
    vpmu_intel::msrs::MSR_RANGES
        .iter()
        .chain(vpmu_amd::msrs::MSR_RANGES)
        .chain(UNMODELLED_PMU_MSRS)
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
        let mut cpuid = base_cpuid.clone();
        personality.cpuid(&mut cpuid);
        let (vm, entry) = Vm::new(kvm, &all_pmu_msr_ranges(), image)?;
        let fds = (0..vcpus)
            .map(|i| {
                let rsp = STACK_TOP - u64::from(i) * STACK_SIZE;
                vm.create_vcpu(u64::from(i), &cpuid, entry, rsp, arg, u64::from(i))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let vpmu = Vpmu::new(personality.backend(), XENPMU_MODE_SELF);
        let pcpus = (0..vcpus)
            .map(|_| vpmu.attach_pcpu(personality.model()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io::Error::other(format!("attach_pcpu: {e:?}")))?;
        let table = Table(
            (0..vcpus)
                .map(|i| {
                    vpmu.new_vcpu(VcpuId {
                        domain: DOMAIN,
                        vcpu: i,
                    })
                })
                .collect(),
        );
        Ok(Self {
            personality,
            vm,
            vcpus: fds,
            core: Mutex::new(Core {
                vpmu,
                pcpus,
                vcpus: table,
            }),
            pages: Mutex::new(Vec::new()),
        })
    }

    /// Runs every vCPU on its own thread until each writes its exit status, `timeout`
    /// passes, or something breaks. Results by vCPU index.
    pub fn run(self, timeout: Duration) -> Vec<RunResult>
    where
        P: Sync,
        P::Model: Send,
        P::Backend: Send,
        Ctx<P>: Send,
    {
        let Machine {
            personality,
            vm,
            vcpus,
            core,
            pages,
        } = self;
        let count = vcpus.len() as u32;
        let tsc_khz = vcpus
            .first()
            .and_then(|v| v.fd.get_tsc_khz().ok())
            .map_or(1_000_000, u64::from);
        let barrier = Rendezvous::new(vcpus.len());
        std::thread::scope(|s| {
            let handles: Vec<_> = vcpus
                .into_iter()
                .enumerate()
                .map(|(i, vcpu)| {
                    let runner = Runner {
                        personality: &personality,
                        vm: &vm,
                        core: &core,
                        pages: &pages,
                        vcpu,
                        me: VcpuId {
                            domain: DOMAIN,
                            vcpu: i as u32,
                        },
                        pcpu: i as u32,
                        count,
                        barrier: &barrier,
                        state: PlatformState::default(),
                        sync: kvm_sync_regs::default(),
                        next_rip: 0,
                        handler: MsrHandler::Vpmu,
                        tsc_khz,
                        run_ns: 0,
                        fed_cycles: 0,
                    };
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

    /// The guest TSC frequency KVM reports.
    pub fn tsc_khz(&self) -> Option<u32> {
        self.vcpus.first()?.fd.get_tsc_khz().ok()
    }
}

/// One vCPU thread: the vCPU and, as its pCPU, `core.pcpus[me.vcpu]`.
struct Runner<'a, P: Personality> {
    personality: &'a P,
    vm: &'a Vm,
    core: &'a Mutex<Core<P>>,
    pages: &'a Mutex<Vec<u64>>,
    vcpu: Vcpu,
    me: VcpuId,
    /// The pCPU (software PMU model) this thread is now; starts as the vCPU index and changes
    /// when the guest asks for a migration.
    pcpu: u32,
    count: u32,
    /// Rendezvous of all vCPU threads for a migration.
    barrier: &'a Rendezvous,
    state: PlatformState,
    sync: kvm_sync_regs,
    /// Address of the instruction the next single-step retires.
    next_rip: u64,
    handler: MsrHandler,
    /// Guest TSC kHz (timed mode).
    tsc_khz: u64,
    /// Timed mode: nanoseconds in `KVM_RUN` so far, and the cycles fed for them.
    run_ns: u128,
    fed_cycles: u64,
}

/// How long a vCPU waits for the others at a migration before giving up.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(10);

/// A reusable barrier that gives up after a timeout (a vCPU that died never arrives).
struct Rendezvous {
    count: usize,
    /// Generation and arrivals in it.
    state: Mutex<(u64, usize)>,
    all_arrived: Condvar,
}

impl Rendezvous {
    fn new(count: usize) -> Self {
        Self {
            count,
            state: Mutex::new((0, 0)),
            all_arrived: Condvar::new(),
        }
    }

    fn wait(&self, timeout: Duration) -> io::Result<()> {
        let poisoned = |_| io::Error::other("rendezvous lock poisoned");
        let mut state = self.state.lock().map_err(poisoned)?;
        let generation = state.0;
        state.1 += 1;
        if state.1 == self.count {
            *state = (generation + 1, 0);
            self.all_arrived.notify_all();
            return Ok(());
        }
        let (state, _) = self
            .all_arrived
            .wait_timeout_while(state, timeout, |s| s.0 == generation)
            .map_err(|_| io::Error::other("rendezvous lock poisoned"))?;
        if state.0 == generation {
            return Err(io::Error::other(
                "another vCPU never reached the rendezvous",
            ));
        }
        Ok(())
    }
}

/// Runs `f` on the core and a platform view for `runner`'s vCPU.
macro_rules! with_core {
    ($runner:expr, |$platform:ident, $core:ident| $body:expr) => {{
        let mut guard = $runner.core.lock().expect("vpmu core lock");
        let $core = &mut *guard;
        let mut $platform = KvmPlatform {
            vm: $runner.vm,
            vcpu: &$runner.vcpu.fd,
            me: $runner.me,
            pcpu: $runner.pcpu,
            vcpus: $runner.count,
            pages: $runner.pages,
            state: &mut $runner.state,
        };
        $body
    }};
}

impl<P: Personality> Runner<'_, P> {
    fn pcpu(&self) -> usize {
        self.pcpu as usize
    }

    /// `inl` from the migrate port: every vCPU moves to the next pCPU ((p + 1) mod n), all at
    /// once, through `Vpmu::context_switch` (saves on the old pCPU's model, loads on the new
    /// one). Returns the new pCPU.
    fn migrate(&mut self) -> io::Result<u32> {
        self.barrier.wait(RENDEZVOUS_TIMEOUT)?;
        let mut result = Ok(());
        if self.me.vcpu == 0 {
            let n = self.count;
            result = with_core!(self, |platform, core| {
                let on: Vec<u32> = (0..n)
                    .map(|v| core.vcpus.0[v as usize].running_on().unwrap_or(v))
                    .collect();
                let switched: Result<(), vpmu::MsrFault> = (0..n)
                    .try_for_each(|p| {
                        core.vpmu.context_switch(
                            &mut platform,
                            &mut core.pcpus,
                            &mut core.vcpus,
                            p,
                            None,
                        )
                    })
                    .and_then(|()| {
                        // vCPU v ran on pCPU p; it now runs on pCPU (p + 1) mod n.
                        (0..n).try_for_each(|v| {
                            let next = VcpuId {
                                domain: DOMAIN,
                                vcpu: v,
                            };
                            let p = (on[v as usize] + 1) % n;
                            core.vpmu.context_switch(
                                &mut platform,
                                &mut core.pcpus,
                                &mut core.vcpus,
                                p,
                                Some(next),
                            )
                        })
                    });
                switched
            });
        }
        self.barrier.wait(RENDEZVOUS_TIMEOUT)?;
        result.map_err(|e| io::Error::other(format!("migration: {e:?}")))?;
        self.pcpu = (self.pcpu + 1) % self.count;
        Ok(self.pcpu)
    }

    fn run(mut self, timeout: Duration) -> RunResult {
        let start = Instant::now();
        let mut result = RunResult::default();
        let pcpu = self.pcpu;
        let me = self.me;
        let switched = with_core!(self, |platform, core| core.vpmu.context_switch(
            &mut platform,
            &mut core.pcpus,
            &mut core.vcpus,
            pcpu,
            Some(me)
        ));
        // The kicker serves the timed source's overflows and, in both modes, the watchdog: a
        // guest spinning without exits is kicked out at the timeout.
        let kick = Kick::new(self.vcpu.fd.get_kvm_run());
        let outcome = match (switched, kick) {
            (Ok(()), Ok(kick)) => self.run_loop(timeout, start, &mut result, &kick),
            (Err(e), _) => Err(io::Error::other(format!("context_switch: {e:?}"))),
            (_, Err(e)) => Err(io::Error::other(e)),
        };
        result.elapsed = start.elapsed();
        result.pmis = self.state.pmis;
        if let Err(e) = outcome {
            result.error = Some(e.to_string());
        }
        result
    }

    fn run_loop(
        &mut self,
        timeout: Duration,
        start: Instant,
        result: &mut RunResult,
        kick: &Kick,
    ) -> io::Result<()> {
        let mut back: Option<Instant> = None;
        let mut armed: Option<Instant> = None;
        let precise = self.personality.source() == Source::Precise;
        loop {
            if start.elapsed() > timeout {
                return Err(io::Error::other(format!("timeout after {timeout:?}")));
            }
            let (counting, until_pmi) = {
                let core = self.core.lock().expect("vpmu core lock");
                let model = core.pcpus[self.pcpu()].hw();
                let counting = self.personality.counting(model);
                let until = if counting && !precise {
                    cycles_until_pmi(model, self.mode())
                } else {
                    None
                };
                (counting, until)
            };
            let step = precise && counting;
            // Round the overflow deadline up: the kick must not land before the overflow.
            let overflow = until_pmi.map(|cycles| {
                let ns = (u128::from(cycles) * 1_000_000).div_ceil(u128::from(self.tsc_khz));
                Instant::now() + Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
            });
            let watchdog = start + timeout;
            let deadline = overflow.map_or(watchdog, |o| o.min(watchdog));
            if armed != Some(deadline) {
                kick.arm(Some(deadline));
                armed = Some(deadline);
            }
            self.vcpu.set_stepping(step)?;
            if !step {
                // An injected interrupt's handler runs unstepped: nothing to attribute.
                self.state.injected = None;
            }
            if let Some(t) = back.take() {
                result.user_time.0 += 1;
                result.user_time.1 += t.elapsed().as_nanos() as u64;
            }
            let entered = Instant::now();
            let exit = self.next_exit()?;
            let ran = entered.elapsed();
            back = Some(Instant::now());
            self.sync = self.vcpu.fd.sync_regs();
            self.state.regs = regs_of(&self.sync);
            if !precise {
                self.feed_cycles(ran);
            }
            match exit {
                Exit::Debug { pc } => {
                    result.steps += 1;
                    self.retire();
                    self.next_rip = pc;
                }
                Exit::Rdmsr { index, data, error } => {
                    result.msr_exits += 1;
                    self.next_rip = self.sync.regs.rip;
                    let t = Instant::now();
                    let value = self.rdmsr(index);
                    self.account(result, t);
                    // SAFETY: both point into the vCPU's kvm_run page, mapped while the vCPU
                    // fd lives; no reference to that page is alive now.
                    unsafe {
                        match value {
                            Some(v) => *data = v,
                            None => *error = 1,
                        }
                    }
                }
                Exit::Wrmsr {
                    index,
                    value,
                    error,
                } => {
                    result.msr_exits += 1;
                    self.next_rip = self.sync.regs.rip;
                    let t = Instant::now();
                    let ok = self.wrmsr(index, value);
                    self.account(result, t);
                    if !ok {
                        // SAFETY: as for reads.
                        unsafe { *error = 1 };
                    }
                }
                Exit::Out { port, value } => match port {
                    port::CONSOLE => result.console.push(char::from(value as u8)),
                    port::EXIT => {
                        result.status = Some(value);
                        return Ok(());
                    }
                    port::CONTROL => {
                        self.handler = if value == 1 {
                            MsrHandler::Null
                        } else {
                            MsrHandler::Vpmu
                        }
                    }
                    _ => {}
                },
                Exit::In { port, data, len } => {
                    let value = match port {
                        port::HYPERCALL => self.hypercall(),
                        port::MIGRATE => self.migrate()?,
                        _ => u32::MAX,
                    };
                    let bytes = value.to_le_bytes();
                    // SAFETY: `data` points at `len` bytes of the kvm_run page (the I/O data
                    // area KVM named in the exit), alive while the vCPU fd lives.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, len.min(4)) };
                }
                Exit::Kicked => {
                    result.kicks += 1;
                    // The kicker fired and forgot its deadline.
                    armed = None;
                }
                Exit::Other(what) => return Err(io::Error::other(what)),
            }
            self.check_pmi()?;
        }
    }

    fn account(&self, result: &mut RunResult, t: Instant) {
        let slot = &mut result.msr_exit_ns[usize::from(self.handler == MsrHandler::Null)];
        slot.0 += 1;
        slot.1 += t.elapsed().as_nanos() as u64;
    }

    fn next_exit(&mut self) -> io::Result<Exit> {
        let exit = match self.vcpu.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR => {
                self.vcpu.fd.set_kvm_immediate_exit(0);
                return Ok(Exit::Kicked);
            }
            Err(e) => return Err(e.into()),
        };
        Ok(match exit {
            VcpuExit::X86Rdmsr(e) => Exit::Rdmsr {
                index: e.index,
                data: e.data,
                error: e.error,
            },
            VcpuExit::X86Wrmsr(e) => Exit::Wrmsr {
                index: e.index,
                value: e.data,
                error: e.error,
            },
            VcpuExit::IoOut(port, data) => {
                let mut b = [0u8; 4];
                let n = data.len().min(4);
                b[..n].copy_from_slice(&data[..n]);
                Exit::Out {
                    port,
                    value: u32::from_le_bytes(b),
                }
            }
            VcpuExit::IoIn(port, data) => Exit::In {
                port,
                data: data.as_mut_ptr(),
                len: data.len(),
            },
            VcpuExit::Debug(d) => Exit::Debug { pc: d.pc },
            other => Exit::Other(format!("unexpected exit {other:?}")),
        })
    }

    fn rdmsr(&mut self, index: u32) -> Option<u64> {
        if self.handler == MsrHandler::Null {
            return Some(0);
        }
        let me = self.me.vcpu as usize;
        let outcome = with_core!(self, |platform, core| {
            let vcpu = core.vcpus.0.get_mut(me)?;
            core.vpmu
                .rdmsr(&mut platform, &mut core.pcpus, vcpu, Msr(index))
                .ok()
        });
        match outcome {
            Some(MsrOutcome::Handled(v)) => Some(v),
            // #GP: refused, absent, or another vendor's PMU MSR (NotPmu).
            _ => None,
        }
    }

    fn wrmsr(&mut self, index: u32, value: u64) -> bool {
        if self.handler == MsrHandler::Null {
            return true;
        }
        let me = self.me.vcpu as usize;
        let outcome = with_core!(self, |platform, core| {
            let Some(vcpu) = core.vcpus.0.get_mut(me) else {
                return false;
            };
            core.vpmu
                .wrmsr(&mut platform, &mut core.pcpus, vcpu, Msr(index), value)
        });
        matches!(outcome, Ok(MsrOutcome::Handled(())))
    }

    /// The control-operation hypercall: EDI = op, RSI = GPA of the parameter block. Returns
    /// 0 or `-errno` (as the 32-bit EAX value).
    fn hypercall(&mut self) -> u32 {
        let op = self.sync.regs.rdi as u32;
        let gpa = self.sync.regs.rsi;
        let size = std::mem::size_of::<Params>();
        let Some(params) = self
            .vm
            .mem
            .slice_mut(gpa, size)
            .and_then(|b| Params::read_from_bytes(b).ok())
        else {
            return (-i64::from(vpmu::abi::ops::XENPMU_EINVAL)) as u32;
        };
        let me = self.me;
        let result = with_core!(self, |platform, core| core.vpmu.control_op(
            &mut platform,
            &mut core.pcpus,
            &mut core.vcpus,
            me,
            op,
            &params
        ));
        match result {
            Ok(out) => {
                if let Some(b) = self.vm.mem.slice_mut(gpa, size) {
                    b.copy_from_slice(out.as_bytes());
                }
                0
            }
            Err(e) => e.return_value() as u32,
        }
    }

    /// The guest's execution mode at the last exit.
    fn mode(&self) -> ExecMode {
        ExecMode {
            cpl: (self.sync.sregs.cs.selector & 3) as u8,
            host: false,
        }
    }

    /// Timed mode: the vCPU ran for `ran`; feed the cycles (exact over time: the fractional
    /// remainder carries over).
    fn feed_cycles(&mut self, ran: Duration) {
        self.run_ns += ran.as_nanos();
        let total = (self.run_ns * u128::from(self.tsc_khz) / 1_000_000) as u64;
        let cycles = total - self.fed_cycles;
        self.fed_cycles = total;
        if cycles == 0 {
            return;
        }
        let mode = self.mode();
        let mut core = self.core.lock().expect("vpmu core lock");
        let model = core.pcpus[self.pcpu()].hw_mut();
        model.count(HwEvent::CoreCycles, cycles, mode);
        model.count(HwEvent::RefCycles, cycles, mode);
    }

    /// One instruction retired (single-step): decode it and feed this pCPU's model.
    fn retire(&mut self) {
        let rip = match self.state.injected.take() {
            // The first instruction after an injected interrupt is its handler's.
            Some(vector) => self.handler_address(vector).unwrap_or(self.next_rip),
            None => self.next_rip,
        };
        let branch = self.is_branch(rip);
        let cpl = (self.sync.sregs.cs.selector & 3) as u8;
        let mode = ExecMode { cpl, host: false };
        let mut core = self.core.lock().expect("vpmu core lock");
        let model = core.pcpus[self.pcpu()].hw_mut();
        model.count(HwEvent::Instructions, 1, mode);
        if branch {
            model.count(HwEvent::Branches, 1, mode);
        }
    }

    fn is_branch(&self, rip: u64) -> bool {
        let Some(bytes) = self.vm.mem.slice_mut(rip, 15) else {
            return false;
        };
        let mut decoder = Decoder::with_ip(64, bytes, rip, DecoderOptions::NONE);
        let insn = decoder.decode();
        !matches!(
            insn.flow_control(),
            FlowControl::Next | FlowControl::Exception
        )
    }

    /// The entry point of IDT vector `vector` (64-bit gates).
    fn handler_address(&self, vector: u8) -> Option<u64> {
        let gate = self.sync.sregs.idt.base + 16 * u64::from(vector);
        let lo = self.vm.mem.read_u64(gate)?;
        let hi = self.vm.mem.read_u64(gate + 8)?;
        Some((lo & 0xffff) | ((lo >> 32) & 0xffff_0000) | ((hi & 0xffff_ffff) << 32))
    }

    fn check_pmi(&mut self) -> io::Result<()> {
        if self.state.physical_masked {
            return Ok(());
        }
        let pcpu = self.pcpu;
        let outcome = with_core!(self, |platform, core| {
            if !core.pcpus[pcpu as usize].hw_mut().take_pmi() {
                return Ok(());
            }
            core.vpmu
                .handle_pmi(&mut platform, &mut core.pcpus, &mut core.vcpus, pcpu)
        });
        outcome
            .map(|_| ())
            .map_err(|e| io::Error::other(format!("handle_pmi: {e:?}")))
    }
}

/// After how many core/reference cycles in `mode` `model` raises its PMI line (None: never
/// within 2^48 cycles), found by bisection on copies of the model.
fn cycles_until_pmi<M: SoftwarePmu + Clone>(model: &M, mode: ExecMode) -> Option<u64> {
    let raises = |cycles: u64| {
        let mut m = model.clone();
        m.take_pmi();
        m.count(HwEvent::CoreCycles, cycles, mode);
        m.count(HwEvent::RefCycles, cycles, mode);
        m.pmi_pending()
    };
    let (mut lo, mut hi) = (0u64, 1u64 << 48);
    if !raises(hi) {
        return None;
    }
    // Invariant: raises(hi) and !raises(lo) (0 cycles raise nothing new).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if raises(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// The interrupted-context registers, from sync regs.
fn regs_of(s: &kvm_sync_regs) -> Regs {
    let r = &s.regs;
    let cpl = (s.sregs.cs.selector & 3) as u8;
    Regs {
        rax: r.rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rbp: r.rbp,
        rsp: r.rsp,
        r8: r.r8,
        r9: r.r9,
        r10: r.r10,
        r11: r.r11,
        r12: r.r12,
        r13: r.r13,
        r14: r.r14,
        r15: r.r15,
        rip: r.rip,
        rflags: r.rflags,
        cs: s.sregs.cs.selector,
        ss: s.sregs.ss.selector,
        ds: s.sregs.ds.selector,
        es: s.sregs.es.selector,
        fs: s.sregs.fs.selector,
        gs: s.sregs.gs.selector,
        cpl,
        mode: XENPMU_REGS_MODE_64 | if cpl == 3 { XENPMU_REGS_MODE_USER } else { 0 },
        ..Regs::default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::personality::{Amd, Intel};
    use vpmu::MsrBus;
    use vpmu_amd::PmuShape;

    const KERNEL: ExecMode = ExecMode {
        cpl: 0,
        host: false,
    };

    #[test]
    fn bisection_finds_the_exact_overflow_point() {
        let p = Intel::v5(Source::Timed);
        let mut m = p.model();
        // GP0: core cycles (0x3c), OS, INT, EN; preset to -1000; globally enabled.
        m.write(Msr(0x4c1), (1u64 << 48) - 1000).expect("counter");
        m.write(Msr(0x186), 0x3c | 1 << 17 | 1 << 20 | 1 << 22)
            .expect("selector");
        m.write(Msr(0x38f), 1).expect("global");
        // Wrapping is counter = 2^48: the 1000th cycle wraps it.
        assert_eq!(cycles_until_pmi(&m, KERNEL), Some(1000));
        m.count(HwEvent::CoreCycles, 999, KERNEL);
        assert!(!m.pmi_pending());
        m.count(HwEvent::CoreCycles, 1, KERNEL);
        assert!(m.pmi_pending());
    }

    #[test]
    fn no_interrupt_bit_no_deadline() {
        let p = Amd {
            source: Source::Timed,
            shape: PmuShape::PerfMonV2 { counters: 6 },
        };
        let mut m = p.model();
        m.write(Msr(0xC001_0201), (1u64 << 48) - 10)
            .expect("counter");
        m.write(Msr(0xC001_0200), 0x76 | 1 << 17 | 1 << 22)
            .expect("control without INT");
        assert!(p.counting(&m));
        assert_eq!(cycles_until_pmi(&m, KERNEL), None);
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

    /// A guest spinning without exits is kicked out at the timeout (needs /dev/kvm).
    #[test]
    fn watchdog_ends_a_spinning_guest() {
        let Ok(kvm) = crate::kvm::usable() else {
            eprintln!("SKIPPED: /dev/kvm not available (watchdog test)");
            println!("SKIPPED: /dev/kvm not available (watchdog test)");
            return;
        };
        let cpuid = crate::kvm::supported_cpuid(&kvm).expect("cpuid");
        let machine = Machine::new(
            &kvm,
            Intel::v5(Source::Precise),
            &cpuid,
            crate::guest::PMU,
            999,
            1,
        )
        .expect("VM");
        let start = Instant::now();
        let results = machine.run(Duration::from_millis(300));
        assert!(start.elapsed() < Duration::from_secs(5));
        let error = results[0].error.as_deref().unwrap_or("");
        assert!(error.contains("timeout"), "{results:?}");
        assert!(results[0].kicks >= 1);
    }

    #[test]
    fn both_vendor_ranges_fit_one_filter() {
        let ranges = all_pmu_msr_ranges();
        // KVM_MSR_FILTER_MAX_RANGES, and each bitmap within KVM_MSR_FILTER_MAX_BITMAP_SIZE.
        assert!(ranges.len() <= 16);
        assert!(
            ranges
                .iter()
                .all(|&(a, b)| (b - a + 1).div_ceil(8) <= 0x600)
        );
        for msr in [0xc1, 0x186, 0x309, 0x345, 0x38d, 0x392, 0x3f1, 0x4c8, 0x600] {
            assert!(
                ranges.iter().any(|&(a, b)| (a..=b).contains(&msr)),
                "{msr:#x}"
            );
        }
        for msr in [0xC000_0300, 0xC001_0007, 0xC001_020B] {
            assert!(
                ranges.iter().any(|&(a, b)| (a..=b).contains(&msr)),
                "{msr:#x}"
            );
        }
    }
}
