//! Intercept throughput of the core on real threads (issue 11): each thread is a pCPU with its
//! own `PcpuPmu` and runs one vCPU, which programs a counter and then does intercepted
//! WRMSR/RDMSR pairs of it. Three variants side by side in one run, so that the result reads
//! as ratios on a noisy shared machine:
//!
//! * `1 pCPU`: one thread;
//! * `2 pCPUs`: two threads, each locking only its own vCPU (the core's intended use);
//! * `2 pCPUs, one global lock`: two threads that take one shared mutex around every call,
//!   as an integrator of the single-lock core had to;
//! * `1 thread` / `2 threads, model only`: the same accesses straight on each thread's own
//!   model, no core: what two threads of this work scale to on this machine at best.
//!
//! Criterion reports each as time per element (one intercept); throughput(2) / throughput(1)
//! is the scaling. Both vendors' v2-style PMUs.

use std::hint::black_box;
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use vpmu::abi::XENPMU_MODE_SELF;
use vpmu::{Mode, Msr, MsrBus, MsrOutcome, VcpuId, Vpmu};
use vpmu_sim::machine::Ctx;
use vpmu_sim::{SimVendor, amd_v2, intel_v5};
use vpmu_tests::smp::rng::Rng;
use vpmu_tests::smp::{OwnedBus, PcpuPlatform, Shared};

/// EN | OS | USR | instructions retired (event 0xc0 on both vendors).
const COUNT_INSTRUCTIONS: u64 = (1 << 22) | (1 << 17) | (1 << 16) | 0xc0;

/// Counter 0's control and value MSRs and the global enable, per vendor.
struct Registers {
    control: u32,
    counter: u32,
    global: Option<u32>,
}

const INTEL: Registers = Registers {
    control: 0x186,
    counter: 0x4c1,
    global: Some(0x38f),
};
const AMD_V2: Registers = Registers {
    control: 0xc001_0200,
    counter: 0xc001_0201,
    global: Some(0xc000_0301),
};

/// A value alone on its cache lines (two, for the adjacent-line prefetcher).
#[repr(align(128))]
struct Padded<T>(T);

/// How the threads reach the core.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Locking {
    /// Each thread locks only its own vCPU.
    PerVcpu,
    /// Every call also holds one lock shared by all threads.
    Global,
    /// No core at all: each thread writes and reads its own model's counter directly. The
    /// machine's own ceiling for two threads of this shape of work, measured beside the rest.
    ModelOnly,
}

/// Runs `threads` pCPU threads doing `pairs` WRMSR+RDMSR pairs each; returns the wall time of
/// the slowest (all start together).
fn run<V>(vendor: &V, regs: &Registers, threads: u32, locking: Locking, pairs: u64) -> Duration
where
    V: SimVendor + Sync,
    V::Backend: Sync,
    V::Model: Send,
    Ctx<V>: Send,
{
    if locking == Locking::ModelOnly {
        return run_model_only(vendor, regs, threads, pairs);
    }
    let vpmu = Vpmu::new(vendor.backend(), Mode::SelfProfiling, threads);
    assert_eq!(vpmu.mode().to_abi(), XENPMU_MODE_SELF);
    let shared = Shared::new(threads, &[1, threads], 0, true);
    // Each vCPU on cache lines of its own, as a hypervisor's per-vCPU structures are: a
    // neighbour's lock word next to this vCPU's statistics would be measured as the core's.
    let vcpus: Vec<Padded<Mutex<_>>> = (0..threads)
        .map(|v| {
            let vcpu = vpmu.new_vcpu(VcpuId { domain: 1, vcpu: v });
            Padded(Mutex::new(vcpu.expect("an ordinary domain")))
        })
        .collect();
    let global = Mutex::new(());
    let start = Barrier::new(threads as usize);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|p| {
                let (vpmu, shared, vcpus, global, start) =
                    (&vpmu, &shared, &vcpus, &global, &start);
                scope.spawn(move || {
                    let bus = OwnedBus::new(p, vendor.model());
                    let mut pcpu = vpmu.attach_pcpu(p, bus).expect("clean model");
                    let mut platform = PcpuPlatform::new(shared, p, Rng::new(0, u64::from(p)));
                    let vcpu = &vcpus[p as usize].0;
                    let mut call = |f: &mut dyn FnMut(&mut PcpuPlatform, &mut _, &mut _)| {
                        let _global = (locking == Locking::Global).then(|| global.lock().unwrap());
                        f(&mut platform, &mut pcpu, &mut vcpu.lock().unwrap());
                    };
                    let write =
                        |platform: &mut PcpuPlatform, pcpu: &mut _, v: &mut _, msr, value| {
                            let outcome = vpmu.wrmsr(platform, pcpu, v, Msr(msr), value);
                            assert_eq!(outcome, Ok(MsrOutcome::Handled(())));
                        };
                    let setup = [(regs.control, COUNT_INSTRUCTIONS)]
                        .into_iter()
                        .chain(regs.global.map(|global| (global, 1)));
                    for (msr, value) in setup {
                        call(&mut |platform, pcpu, v| write(platform, pcpu, v, msr, value));
                    }
                    start.wait();
                    let begin = Instant::now();
                    for i in 0..pairs {
                        call(&mut |platform, pcpu, v| {
                            write(platform, pcpu, v, regs.counter, black_box(i & 0xffff));
                        });
                        call(&mut |platform, pcpu, v| {
                            let read = vpmu.rdmsr(platform, pcpu, v, Msr(regs.counter));
                            black_box(read).expect("the model never faults");
                        });
                    }
                    begin.elapsed()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .max()
            .unwrap_or_default()
    })
}

/// `threads` threads each doing `pairs` WRMSR+RDMSR pairs straight on a model of its own.
fn run_model_only<V>(vendor: &V, regs: &Registers, threads: u32, pairs: u64) -> Duration
where
    V: SimVendor + Sync,
    V::Model: Send,
{
    let start = Barrier::new(threads as usize);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let start = &start;
                scope.spawn(move || {
                    let mut model = Padded(vendor.model());
                    start.wait();
                    let begin = Instant::now();
                    for i in 0..pairs {
                        model
                            .0
                            .write(Msr(regs.counter), black_box(i & 0xffff))
                            .expect("the model never faults");
                        black_box(model.0.read(Msr(regs.counter))).expect("the model never faults");
                    }
                    begin.elapsed()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .max()
            .unwrap_or_default()
    })
}

fn bench_vendor<V>(c: &mut Criterion, name: &str, vendor: V, regs: &Registers)
where
    V: SimVendor + Sync,
    V::Backend: Sync,
    V::Model: Send,
    Ctx<V>: Send,
{
    let mut group = c.benchmark_group(format!("{name} intercept throughput"));
    for (label, threads, locking) in [
        ("1 pCPU", 1, Locking::PerVcpu),
        ("2 pCPUs", 2, Locking::PerVcpu),
        ("2 pCPUs, one global lock", 2, Locking::Global),
        ("1 thread, model only (no core)", 1, Locking::ModelOnly),
        ("2 threads, model only (no core)", 2, Locking::ModelOnly),
    ] {
        // One element = one intercepted access, on whichever thread.
        group.throughput(Throughput::Elements(2 * u64::from(threads)));
        group.bench_function(label, |b| {
            b.iter_custom(|iters| run(&vendor, regs, threads, locking, iters))
        });
    }
    group.finish();
}

fn smp_scaling(c: &mut Criterion) {
    bench_vendor(c, "intel v5", intel_v5(), &INTEL);
    bench_vendor(c, "amd PerfMonV2", amd_v2(), &AMD_V2);
}

criterion_group!(benches, smp_scaling);
criterion_main!(benches);
