//! What callgrind must not count as the core's: the harness's own exclusions. Collection is
//! on only inside `vpmu_bench_measured`; every call the core makes out of itself while an
//! operation is measured goes through `vpmu_bench_excluded` (entering and leaving a toggle
//! function switches collection off and on again), and every callback into the core from
//! there through `vpmu_bench_included` (on and off again). Excluded: the MSR bus and the
//! software PMU model behind it (`ExcludedBus`), and, unless `count_platform` was called, the
//! integrator's platform (`ExcludedPlatform`) and vCPU table (`ExcludedTable`): the
//! simulator's page map, queues and `RefCell` table, which a hypervisor replaces by its own;
//! and the scenario's own steps between two measured calls (`unmeasured`: the model counting
//! for the other vCPU, a request taken off the platform's queue). What each crossing costs
//! the harness itself (a check, a counter, a call) is still collected: it is not subtracted
//! per crossing, but attributed to the harness by its source lines (`table::harness_share`),
//! and the calibration runs check that a measurement of nothing but crossings comes out at 0.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use vpmu::abi::{Page, Regs};
use vpmu::{
    CrossCpuRequest, Diagnostic, EventFilter, Interrupted, Interruption, LvtpcDelivery, MapError,
    Msr, MsrAccessStats, MsrBus, MsrFault, PageSlot, Platform, RingSlot, SampledContext, VcpuId,
    VcpuPmu, VcpuTable,
};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_sim::{Driver, SimPlatform, SimVendor};

/// Whether `vpmu_bench_measured` is running.
pub static MEASURING: AtomicBool = AtomicBool::new(false);

/// `instructions trace`: print each access made while measuring.
pub static TRACING: AtomicBool = AtomicBool::new(false);

/// Whether platform and vCPU-table calls are left out of the count (the default).
static PLATFORM_EXCLUDED: AtomicBool = AtomicBool::new(true);

/// Platform and vCPU-table calls made while measuring, and the callbacks into the core they
/// made: the crossings, reported in the table's "platform calls" column.
pub static PLATFORM_CALLS: AtomicU64 = AtomicU64::new(0);
pub static CALLBACKS: AtomicU64 = AtomicU64::new(0);

/// Counts the platform and the vCPU table with the core (`--with-platform`): the figure of
/// a hypervisor whose platform is the simulator's.
pub fn count_platform() {
    PLATFORM_EXCLUDED.store(false, Ordering::Relaxed);
}

/// The one function callgrind collects in. Never inlined, so that its name is in the binary.
#[inline(never)]
pub fn vpmu_bench_measured<R>(operation: impl FnOnce() -> R) -> R {
    PLATFORM_CALLS.store(0, Ordering::Relaxed);
    CALLBACKS.store(0, Ordering::Relaxed);
    MEASURING.store(true, Ordering::Relaxed);
    let result = std::hint::black_box(operation());
    MEASURING.store(false, Ordering::Relaxed);
    result
}

// Callgrind toggles collection when a toggle function is entered or left, but not when it
// is entered again while already on the stack (a recursive entry). Exclusions nest (a bus
// access inside a callback into the core inside a platform call), so each nesting depth has
// its own non-generic toggle function, and `DEPTH` says which is next.
static DEPTH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// Each body differs (its depth goes through `black_box`) so that the compiler cannot fold
// them into one function, which would be a recursive entry again.
macro_rules! toggles {
    ($($name:ident = $depth:literal),*) => {
        $(
            #[inline(never)]
            fn $name(call: &mut dyn FnMut()) {
                call();
                std::hint::black_box($depth);
            }
        )*
    };
}

toggles!(
    vpmu_bench_off_0 = 0u8,
    vpmu_bench_on_1 = 1u8,
    vpmu_bench_off_2 = 2u8,
    vpmu_bench_on_3 = 3u8,
    vpmu_bench_off_4 = 4u8,
    vpmu_bench_on_5 = 5u8,
    vpmu_bench_off_6 = 6u8
);

/// Runs `call` through the toggle function of the current depth (collection off at even
/// depths, on again at odd ones).
fn toggled<R>(call: impl FnOnce() -> R) -> R {
    let mut call = Some(call);
    let mut result = None;
    let mut thunk = || result = call.take().map(|call| call());
    let depth = DEPTH.fetch_add(1, Ordering::Relaxed);
    match depth {
        0 => vpmu_bench_off_0(&mut thunk),
        1 => vpmu_bench_on_1(&mut thunk),
        2 => vpmu_bench_off_2(&mut thunk),
        3 => vpmu_bench_on_3(&mut thunk),
        4 => vpmu_bench_off_4(&mut thunk),
        5 => vpmu_bench_on_5(&mut thunk),
        6 => vpmu_bench_off_6(&mut thunk),
        _ => panic!("the harness's exclusions nest deeper than its toggles"),
    }
    DEPTH.fetch_sub(1, Ordering::Relaxed);
    result.expect("the toggle function ran the call")
}

/// One call out of the core, not collected.
fn vpmu_bench_excluded<R>(call: impl FnOnce() -> R) -> R {
    debug_assert!(
        DEPTH.load(Ordering::Relaxed) % 2 == 0,
        "excluded while excluded"
    );
    toggled(call)
}

/// A callback into the core from an excluded call: collected again.
fn vpmu_bench_included<R>(callback: impl FnOnce() -> R) -> R {
    debug_assert!(
        DEPTH.load(Ordering::Relaxed) % 2 == 1,
        "included while included"
    );
    toggled(callback)
}

/// A step of the scenario between two measured calls of one operation (the guest running,
/// a request travelling between pCPUs): not collected while measuring, not counted as a
/// crossing. It must make no MSR access (the scenarios count the accesses of the whole
/// window).
pub fn unmeasured<R>(step: impl FnOnce() -> R) -> R {
    if MEASURING.load(Ordering::Relaxed) {
        vpmu_bench_excluded(step)
    } else {
        step()
    }
}

/// A platform or table call: excluded while measuring (and counted as a crossing).
fn platform_call<R>(call: impl FnOnce() -> R) -> R {
    if MEASURING.load(Ordering::Relaxed) && PLATFORM_EXCLUDED.load(Ordering::Relaxed) {
        PLATFORM_CALLS.fetch_add(1, Ordering::Relaxed);
        vpmu_bench_excluded(call)
    } else {
        call()
    }
}

/// A callback into the core from inside `platform_call`: collected again.
fn core_callback<R>(callback: impl FnOnce() -> R) -> R {
    if MEASURING.load(Ordering::Relaxed) && PLATFORM_EXCLUDED.load(Ordering::Relaxed) {
        CALLBACKS.fetch_add(1, Ordering::Relaxed);
        vpmu_bench_included(callback)
    } else {
        callback()
    }
}

fn trace(what: &str, msr: Msr, value: &Result<u64, MsrFault>) {
    if TRACING.load(Ordering::Relaxed) && MEASURING.load(Ordering::Relaxed) {
        eprintln!("  {what} {:#010x} {value:x?}", msr.0);
    }
}

/// The PMU model of a pCPU behind a bus whose accesses callgrind does not collect while an
/// operation is measured: each access then goes through `vpmu_bench_excluded`, whose toggle
/// function switches collection off on entry and on again on exit
/// (`--toggle-collect=*vpmu_bench_off_*`), so the model's
/// own instructions are left out of the core's count. Outside the measured operation the
/// accesses go straight to the model (a toggle there would switch collection on). What remains
/// collected per access is this wrapper's check and call, a handful of instructions, which
/// the table attributes to the harness by their source lines.
#[derive(Clone, Debug)]
pub struct ExcludedBus<M>(M);

impl<M: MsrBus> MsrBus for ExcludedBus<M> {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        if MEASURING.load(Ordering::Relaxed) {
            vpmu_bench_excluded(|| {
                let value = self.0.read(msr);
                trace("RDMSR", msr, &value);
                value
            })
        } else {
            self.0.read(msr)
        }
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        if MEASURING.load(Ordering::Relaxed) {
            vpmu_bench_excluded(|| {
                trace("WRMSR", msr, &Ok(value));
                self.0.write(msr, value)
            })
        } else {
            self.0.write(msr, value)
        }
    }
}

impl<M: SoftwarePmu> SoftwarePmu for ExcludedBus<M> {
    fn count(&mut self, event: HwEvent, n: u64, mode: ExecMode) {
        self.0.count(event, n, mode);
    }

    fn pmi_pending(&self) -> bool {
        self.0.pmi_pending()
    }

    fn take_pmi(&mut self) -> bool {
        self.0.take_pmi()
    }

    fn access_stats(&self) -> MsrAccessStats {
        self.0.access_stats()
    }

    fn cycles_until_pmi(&self, mode: ExecMode) -> Option<u64> {
        self.0.cycles_until_pmi(mode)
    }
}

/// A vendor shape whose models sit behind `ExcludedBus`.
#[derive(Clone, Debug)]
pub struct Excluded<V>(pub V);

impl<V: SimVendor> SimVendor for Excluded<V>
where
    V::Model: Clone,
{
    type Backend = V::Backend;
    type Model = ExcludedBus<V::Model>;
    type Raw = V::Raw;

    fn name(&self) -> String {
        self.0.name()
    }

    fn backend(&self) -> V::Backend {
        self.0.backend()
    }

    fn model(&self) -> Self::Model {
        ExcludedBus(self.0.model())
    }

    fn raw(model: &Self::Model) -> V::Raw {
        V::raw(&model.0)
    }

    fn nothing_can_count(model: &Self::Model) -> bool {
        V::nothing_can_count(&model.0)
    }

    fn driver(&self) -> Driver {
        self.0.driver()
    }
}

/// The simulator's platform behind `platform_call`, with the callbacks of `with_page` into
/// the core collected again.
pub struct ExcludedPlatform<'a>(pub &'a mut SimPlatform);

impl Platform for ExcludedPlatform<'_> {
    fn privileged_domain(&self) -> u32 {
        platform_call(|| self.0.privileged_domain())
    }

    fn vcpu_count(&self, domain: u32) -> Option<u32> {
        platform_call(|| self.0.vcpu_count(domain))
    }

    fn event_filter(&self, domain: u32) -> &dyn EventFilter {
        platform_call(|| self.0.event_filter(domain))
    }

    fn map_page(&mut self, domain: u32, gfn: u64) -> Result<PageSlot, MapError> {
        platform_call(|| self.0.map_page(domain, gfn))
    }

    fn unmap_page(&mut self, slot: PageSlot) {
        platform_call(|| self.0.unmap_page(slot))
    }

    fn with_page<R>(&mut self, slot: PageSlot, access: impl FnOnce(&mut Page) -> R) -> Option<R> {
        platform_call(|| {
            self.0
                .with_page(slot, |page| core_callback(|| access(page)))
        })
    }

    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, mask_on_delivery: bool) -> LvtpcDelivery {
        platform_call(|| self.0.deliver_lvtpc_pmi(vcpu, mask_on_delivery))
    }

    fn raise_pmu_virq(&mut self, vcpu: VcpuId) {
        platform_call(|| self.0.raise_pmu_virq(vcpu))
    }

    fn send_request(&mut self, pcpu: u32, request: CrossCpuRequest) {
        platform_call(|| self.0.send_request(pcpu, request))
    }

    fn set_physical_lvtpc_masked(&mut self, pcpu: u32, masked: bool) {
        platform_call(|| self.0.set_physical_lvtpc_masked(pcpu, masked))
    }

    fn interrupted(&self, pcpu: u32) -> Interrupted {
        platform_call(|| self.0.interrupted(pcpu))
    }

    fn interrupted_into(&self, pcpu: u32, into: &mut Interrupted) {
        platform_call(|| self.0.interrupted_into(pcpu, into))
    }

    fn interruption(&self, pcpu: u32) -> Interruption {
        platform_call(|| self.0.interruption(pcpu))
    }

    fn resume_regs(&self, vcpu: VcpuId) -> Option<Regs> {
        platform_call(|| self.0.resume_regs(vcpu))
    }

    fn timestamp(&mut self) -> u64 {
        platform_call(|| self.0.timestamp())
    }

    fn tsc_khz(&self) -> u64 {
        platform_call(|| self.0.tsc_khz())
    }

    fn reads_sampled_memory(&self, context: SampledContext) -> bool {
        platform_call(|| self.0.reads_sampled_memory(context))
    }

    fn read_sampled(&mut self, context: SampledContext, address: u64, out: &mut [u8]) -> bool {
        platform_call(|| self.0.read_sampled(context, address, out))
    }

    fn diagnostic(&mut self, diagnostic: Diagnostic) {
        platform_call(|| self.0.diagnostic(diagnostic))
    }

    fn write_guest(&mut self, caller: VcpuId, address: u64, data: &[u8]) -> bool {
        platform_call(|| self.0.write_guest(caller, address, data))
    }

    fn supports_ring(&self) -> bool {
        platform_call(|| self.0.supports_ring())
    }

    fn read_guest(&mut self, domain: u32, address: u64, out: &mut [u8]) -> bool {
        platform_call(|| self.0.read_guest(domain, address, out))
    }

    fn map_ring(&mut self, domain: u32, gfn: u64, frames: u32) -> Result<RingSlot, MapError> {
        platform_call(|| self.0.map_ring(domain, gfn, frames))
    }

    fn unmap_ring(&mut self, slot: RingSlot) {
        platform_call(|| self.0.unmap_ring(slot))
    }

    fn ring_read(&mut self, slot: RingSlot, offset: u32, out: &mut [u8]) -> bool {
        platform_call(|| self.0.ring_read(slot, offset, out))
    }

    fn ring_write(&mut self, slot: RingSlot, offset: u32, data: &[u8]) -> bool {
        platform_call(|| self.0.ring_write(slot, offset, data))
    }
}

/// The simulator's vCPU table behind `platform_call`, each visit of the core collected again.
pub struct ExcludedTable<'a, T>(pub &'a T);

impl<C, T: VcpuTable<C>> VcpuTable<C> for ExcludedTable<'_, T> {
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) -> bool {
        platform_call(|| self.0.with_vcpu(id, &mut |v| core_callback(|| visit(v))))
    }

    fn visit<R, F>(&self, id: VcpuId, visit: F) -> Option<R>
    where
        F: FnOnce(&mut VcpuPmu<C>) -> R,
    {
        platform_call(|| self.0.visit(id, |v| core_callback(|| visit(v))))
    }

    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
        platform_call(|| {
            self.0
                .for_each_in_domain(domain, &mut |v| core_callback(|| visit(v)))
        })
    }
}
