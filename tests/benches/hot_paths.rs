//! Hot paths of the core, through the simulator machine, for both vendors: an intercepted
//! WRMSR/RDMSR of a running counter, a context switch out and in, and a PMI handled end to end
//! (overflow, sample into the page, guest-side flush). The baseline is one MSR write straight to
//! the software model, so results read as ratios ("an intercepted WRMSR costs N raw writes").

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use vpmu::abi::XENPMU_MODE_SELF;
use vpmu::{Msr, MsrBus, VcpuId};
use vpmu_models::oracle::bisect_cycles_until_pmi;
use vpmu_models::{ExecMode, SoftwarePmu};
use vpmu_sim::{Machine, SimVendor, amd_v2, intel_v5};

const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

/// EN | OS | USR | instructions retired (event 0xc0 on both vendors).
const COUNT_INSTRUCTIONS: u64 = (1 << 22) | (1 << 17) | (1 << 16) | 0xc0;

/// EN | INT | OS, with the vendor's core-cycles event.
const INTERRUPT_IN_KERNEL: u64 = (1 << 22) | (1 << 20) | (1 << 17);

/// The MSRs a guest uses for counter 0 and global enable, per vendor.
struct Registers {
    control: u32,
    counter: u32,
    global: Option<u32>,
    /// The event select of core cycles.
    cycles: u64,
}

const INTEL: Registers = Registers {
    control: 0x186,
    counter: 0x4c1,
    global: Some(0x38f),
    cycles: 0x3c,
};
const AMD_V2: Registers = Registers {
    control: 0xc001_0200,
    counter: 0xc001_0201,
    global: Some(0xc000_0301),
    cycles: 0x76,
};

/// A machine with one pCPU, A running with counter 0 counting, B idle and never using the PMU.
fn machine<V: SimVendor>(vendor: V, regs: &Registers) -> Machine<V> {
    let mut m = Machine::new(vendor, 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    m.wrmsr(A, regs.control, COUNT_INSTRUCTIONS);
    if let Some(global) = regs.global {
        m.wrmsr(A, global, 1);
    }
    m
}

fn bench_vendor<V: SimVendor>(c: &mut Criterion, name: &str, vendor: V, regs: &Registers)
where
    V::Model: Clone,
{
    let mut group = c.benchmark_group(name);
    let mut model = vendor.model();
    group.bench_function("baseline: raw model WRMSR", |b| {
        b.iter(|| model.write(black_box(Msr(regs.control)), black_box(COUNT_INSTRUCTIONS)))
    });
    let mut m = machine(vendor.clone(), regs);
    group.bench_function("intercepted WRMSR, loaded counter", |b| {
        b.iter(|| m.wrmsr(A, black_box(regs.counter), black_box(0x1234)))
    });
    group.bench_function("intercepted RDMSR, loaded counter", |b| {
        b.iter(|| m.rdmsr(A, black_box(regs.counter)))
    });
    group.bench_function("switch out+in, 1 counter active", |b| {
        b.iter(|| {
            m.schedule(0, Some(B));
            m.schedule(0, Some(A));
        })
    });
    group.bench_function("switch to the same vCPU", |b| {
        b.iter(|| m.schedule(0, Some(A)))
    });
    // The timed event source's per-exit question: when does the next PMI fall due? A model
    // counting cycles with an interrupt 10^6 cycles away.
    let mut timed = vendor.model();
    timed
        .write(Msr(regs.counter), (1 << 48) - 1_000_000)
        .expect("counter");
    timed
        .write(Msr(regs.control), INTERRUPT_IN_KERNEL | regs.cycles)
        .expect("control");
    if let Some(global) = regs.global {
        timed.write(Msr(global), 1).expect("global");
    }
    let kernel = ExecMode {
        cpl: 0,
        host: false,
    };
    assert_eq!(timed.cycles_until_pmi(kernel), Some(1_000_000));
    assert_eq!(bisect_cycles_until_pmi(&timed, kernel), Some(1_000_000));
    group.bench_function("timed source deadline: the model's arithmetic", |b| {
        b.iter(|| black_box(&timed).cycles_until_pmi(kernel))
    });
    group.bench_function(
        "timed source deadline: bisection (the replaced method)",
        |b| b.iter(|| bisect_cycles_until_pmi(black_box(&timed), kernel)),
    );
    group.finish();
}

fn hot_paths(c: &mut Criterion) {
    bench_vendor(c, "intel v5", intel_v5(), &INTEL);
    bench_vendor(c, "amd PerfMonV2", amd_v2(), &AMD_V2);
}

criterion_group!(benches, hot_paths);
criterion_main!(benches);
