//! The inner hypervisor of the ring-0 guest (`ring0.elf`): the vpmu core and a vendor backend
//! chosen from this guest's own CPUID, with the `hw-msr` bus (real RDMSR/WRMSR, which the
//! reference VMM routes to its outer vPMU, per vCPU), running at guest CPL0 on two vCPUs = two
//! inner pCPUs.
//!
//! Each inner pCPU attaches itself with the hardware bus and schedules plain data contexts
//! (inner vCPUs): it switches them with `Vpmu::context_switch`, programs their counters with
//! guest-style intercepts (`Vpmu::wrmsr`/`rdmsr`), takes PMIs through its (virtual) LVTPC
//! into `Vpmu::handle_pmi`, and asks the other pCPU for work by a real IPI (x2APIC ICR):
//! `Platform::send_request` queues the request and sends the IPI, whose handler on the target
//! runs `Vpmu::complete_request`. Every MSR access of an inner pCPU's bus is preceded by a
//! trace word naming that pCPU (`port::TRACE`), so the VMM, which knows which vCPU each MSR
//! exit came from, sees any access made on the wrong CPU.
//!
//! The C harness (`ring0.c`) enters `ring0_main(cpu)` on each vCPU after switching its LAPIC
//! to x2APIC mode, and routes the PMI and IPI vectors to `ring0_pmi` and `ring0_ipi`. Results
//! go through the runtime's result records (`report`, `report_val`). Interrupts are off
//! (`cli`) around every call into the core: the handlers never find the core half-way through
//! a call on their CPU.
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod checks;
mod hw;
mod plan;
mod platform;
mod report;
mod scenario;
mod segments;
mod world;

use core::arch::asm;
use core::fmt::Write as _;
use core::sync::atomic::Ordering::SeqCst;

use raw_cpuid::{CpuId, CpuIdReaderNative};
use vpmu::VcpuId;
use vpmu_amd::AmdPmu;
use vpmu_guest_protocol::port;
use vpmu_guest_protocol::ring0 as proto;
use vpmu_intel::IntelPmu;

pub use hw::TracedBus;
use hw::{PMI_VECTOR, X2APIC_EOI, X2APIC_LVTPC, apic_write, outl, relax, trace_word, x2apic_id};
use report::{FAILED, Name, check, name, say};
use scenario::scenario;
use world::{AMD, INTEL, VENDOR, handlers, make};

/// The inner pCPUs (= the guest's vCPUs, x2APIC IDs 0 and 1).
const PCPUS: usize = 2;
/// Inner vCPUs: the privileged domain 0 has one (it makes the control operations), domain 1
/// has four (two per pCPU at first).
const VCPUS: usize = 5;
const PRIVILEGED: VcpuId = VcpuId { domain: 0, vcpu: 0 };

const fn guest(vcpu: u32) -> VcpuId {
    VcpuId { domain: 1, vcpu }
}

/// The table index of an inner vCPU (the trace's `vcpu` field).
fn index_of(id: VcpuId) -> Option<usize> {
    match id.domain {
        0 if id.vcpu == 0 => Some(0),
        1 if (id.vcpu as usize) < VCPUS - 1 => Some(1 + id.vcpu as usize),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// The entry points from ring0.c.

/// The request IPI (vector `RING0_IPI_VECTOR`), from ring0.c's interrupt stub.
#[unsafe(no_mangle)]
pub extern "C" fn ring0_ipi() {
    let cpu = x2apic_id() % PCPUS as u32;
    if let Some(h) = handlers() {
        h.on_ipi(cpu);
    }
    apic_write(X2APIC_EOI, 0);
}

/// The PMI (vector 0x40, the LVTPC's), from ring0.c's interrupt stub.
#[unsafe(no_mangle)]
pub extern "C" fn ring0_pmi() {
    let cpu = x2apic_id() % PCPUS as u32;
    if let Some(h) = handlers() {
        h.on_pmi(cpu);
    }
    // The outer (Intel) PMU masks the LVTPC on delivery, as hardware does: unmask it.
    apic_write(X2APIC_LVTPC, PMI_VECTOR);
    apic_write(X2APIC_EOI, 0);
}

/// The entry from ring0.c on each vCPU (`cpu` = its x2APIC ID = inner pCPU index); returns
/// this CPU's failed checks.
#[unsafe(no_mangle)]
pub extern "C" fn ring0_main(cpu: u32) -> u32 {
    let cpu = cpu % PCPUS as u32;
    if cpu == 0 {
        // The backend from this guest's own CPUID.
        let cpuid = CpuId::with_cpuid_reader(CpuIdReaderNative);
        let vendor = match cpuid.get_vendor_info() {
            Some(v) if v.as_str() == "GenuineIntel" => 1,
            Some(v) if v.as_str() == "AuthenticAMD" => 2,
            _ => 3,
        };
        let made = match vendor {
            1 => {
                let pdcm = cpuid.get_feature_info().is_some_and(|f| f.has_pdcm());
                let caps = pdcm.then(|| {
                    // This CPU (inner pCPU 0) reads its own MSR: say so to the VMM's check.
                    trace_word(proto::TRACE_OWNER, 0, 0, 0);
                    // SAFETY: IA32_PERF_CAPABILITIES exists when CPUID says PDCM; CPL0.
                    unsafe { x86::msr::rdmsr(0x345) }
                });
                match IntelPmu::from_cpuid(CpuIdReaderNative, caps) {
                    Ok(b) => {
                        INTEL.call_once(|| make(b));
                        1
                    }
                    Err(_) => 3,
                }
            }
            2 => match AmdPmu::from_cpuid(CpuIdReaderNative) {
                Ok(b) => {
                    AMD.call_once(|| make(b));
                    2
                }
                Err(_) => 3,
            },
            _ => 3,
        };
        VENDOR.store(made, SeqCst);
    }
    let mut spins = 0u64;
    while VENDOR.load(SeqCst) == 0 && spins < 50_000_000 {
        relax();
        spins += 1;
    }
    let vendor = VENDOR.load(SeqCst);
    if cpu == 0 {
        let (name, plan) = match vendor {
            1 => ("Intel", INTEL.get().map(|w| w.plan)),
            2 => ("AMD", AMD.get().map(|w| w.plan)),
            _ => ("none", None),
        };
        if let Some(p) = plan {
            say(name!(
                "RING0 backend from CPUID: {name}, {} counters, global control {}, {} MSRs",
                p.counters,
                p.global.is_some(),
                if p.intel {
                    "architectural"
                } else if p.ext {
                    "PerfCtrExtCore"
                } else {
                    "K7"
                }
            ));
        }
    }
    check(
        cpu,
        name!("cpu{cpu} backend chosen from CPUID"),
        vendor == 1 || vendor == 2,
    );
    match vendor {
        1 => {
            if let Some(w) = INTEL.get() {
                scenario(w, cpu)
            }
        }
        2 => {
            if let Some(w) = AMD.get() {
                scenario(w, cpu)
            }
        }
        _ => {}
    }
    FAILED[cpu as usize].load(SeqCst)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let mut n = Name::new();
    let _ = write!(n, "inner hypervisor panicked");
    if let Some(l) = info.location() {
        let _ = write!(n, " at {}:{}", l.file(), l.line());
    }
    let cpu = x2apic_id() % PCPUS as u32;
    check(cpu, n, false);
    outl(port::EXIT, vpmu_guest_protocol::selftest::FATAL_STATUS);
    loop {
        // SAFETY: halts this CPU for good; CPL0.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) };
    }
}
