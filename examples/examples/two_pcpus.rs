//! # Two pCPUs, three vCPUs, two domains: the vPMU from the hypervisor's side
//!
//! A toy hypervisor (the `vpmu-examples` library: `host`, `pcpu`, `machine`, `guest`) boots on
//! a machine whose vendor it learns from CPUID, with two physical CPUs on two host threads.
//! Domain 0 (privileged) has one vCPU, domain 1 two. The scheduler (this `main`) gives each
//! pCPU thread jobs — run this vCPU, let the guest execute this — and checks what the guests
//! and the hardware see:
//!
//! 1. guest 1.0 counts its instructions on counter 0 (WRMSR intercepts), reads them with
//!    RDPMC and RDMSR; a reserved bit and an absent counter fault (#GP);
//! 2. guest 1.1 does the same on the other pCPU, with the same counter index;
//! 3. pCPU 0 switches to dom0's vCPU and back: each guest counts only its own instructions;
//! 4. guest 1.0 migrates from pCPU 0 to pCPU 1 and counts on there;
//! 5. guest 1.1 registers its shared page and samples: the PMI arrives at the exact
//!    instruction that overflowed the counter, the sample in its page names it, the PMU
//!    VIRQ is raised, and after the guest's flush the counters run again;
//! 6. domain 1 is destroyed from pCPU 0 while guest 1.0 runs on pCPU 1: the teardown is a
//!    cross-CPU request, completed on pCPU 1 before its next guest entry;
//! 7. teardown: both pCPUs detach, and no counter is left counting.
//!
//! It runs on the four test shapes (Intel v5 and v2, AMD PerfMonV2 and K7) and exits with
//! an error if any check fails: `cargo test -p vpmu-examples` runs it, and
//! `cargo run -p vpmu-examples --example two_pcpus` shows what it did.

use std::thread;

use vpmu_examples::guest::PerfDriver;
use vpmu_examples::host::Host;
use vpmu_examples::machine::Machine;
use vpmu_examples::pcpu::{self, Cpu, PcpuHandle, PowerOff, TakenPmi};
use vpmu_examples::{Booted, boot, guest_frame};
use vpmu_models::shapes::Shape;
use vpmu_vendor_any::vpmu::abi::ops::Params;
use vpmu_vendor_any::vpmu::abi::{
    PageView, PageViewMut, XENPMU_DOMID_SELF, XENPMU_OP_FLUSH, XENPMU_OP_INIT, XENPMU_OP_LVTPC_SET,
};
use vpmu_vendor_any::vpmu::{Completion, MsrOutcome, PmiOutcome, PmuBackend, VcpuId, VcpuState};

/// Domain 0's vCPU (the privileged domain).
const DOM0: VcpuId = VcpuId { domain: 0, vcpu: 0 };
/// Domain 1's vCPUs.
const GUEST_0: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const GUEST_1: VcpuId = VcpuId { domain: 1, vcpu: 1 };
/// Where the guests' instructions are (only the sampled one matters).
const KERNEL_TEXT: u64 = 0xffff_ffff_8100_0000;
const SAMPLED_FUNCTION: u64 = 0xffff_ffff_8123_4000;
/// The sampling period of step 5.
const PERIOD: u64 = 250;

fn main() {
    for shape in Shape::ALL {
        let summary = run_on(Machine { shape });
        println!("{shape}: {summary}");
    }
}

/// Boots the hypervisor on `machine`, runs the scenario on its two pCPU threads and powers
/// off; returns a line on what happened.
fn run_on(machine: Machine) -> String {
    let Booted {
        host,
        pcpus,
        queues,
    } = boot(&machine, 2, &[1, 2]).expect("the machine's PMU is supported");
    // The backend is the one the machine's CPUID names.
    let backend = host.vpmu.backend();
    assert_eq!(backend.vendor(), machine.shape.vendor());
    let driver = PerfDriver::new(backend.capabilities());

    let (summary, hardware) = thread::scope(|s| {
        let threads: Vec<_> = (0..)
            .zip(queues)
            .map(|(index, queue)| {
                let (host, hw) = (&host, machine.pmu());
                s.spawn(move || pcpu::run(host, index, hw, queue))
            })
            .collect();
        // Powers the pCPUs off when the scenario ends, also if one of its checks fails.
        let power = PowerOff(&pcpus);
        let summary = scenario(&host, &pcpus, driver);
        drop(power);
        let hardware: Vec<_> = threads
            .into_iter()
            .map(|thread| thread.join().expect("the pCPU thread"))
            .collect();
        (summary, hardware)
    });

    // 7. Nothing is left counting on either CPU, no page stays mapped, nothing went wrong.
    for (index, pmu) in hardware.iter().enumerate() {
        assert!(!pmu.anything_can_count(), "pCPU {index} left counting");
    }
    assert!(host.mappings.lock().unwrap().is_empty());
    assert_eq!(*host.diagnostics.lock().unwrap(), []);
    format!("{:?} backend from CPUID; {summary}", backend.vendor())
}

/// The guest on `cpu` programs counter `counter` from `start` to count instructions
/// (interrupting on overflow if `interrupt`) and enables it: three or four WRMSR exits.
fn program(cpu: &mut Cpu<'_>, driver: PerfDriver, counter: u32, start: u64, interrupt: bool) {
    let handled = MsrOutcome::Handled(());
    assert_eq!(cpu.wrmsr(driver.counter_msr(counter), start), handled);
    let control = driver.count_instructions(interrupt);
    assert_eq!(cpu.wrmsr(driver.control_msr(counter), control), handled);
    if let Some(global) = driver.global_ctrl_msr() {
        let MsrOutcome::Handled(enabled) = cpu.rdmsr(global) else {
            panic!("the global control reads");
        };
        assert_eq!(cpu.wrmsr(global, enabled | 1 << counter), handled);
    }
}

/// Steps 1–6; returns a line on what happened.
fn scenario(host: &Host, pcpus: &[PcpuHandle], driver: PerfDriver) -> String {
    let counted = |n| MsrOutcome::Handled(n);

    // 1. pCPU 0 runs guest 1.0, which counts its own instructions on counter 0.
    pcpus[0].run(move |cpu| {
        cpu.switch_to(Some(GUEST_0)).unwrap();
        program(cpu, driver, 0, 0, false);
        assert!(cpu.retire(KERNEL_TEXT, 1000).is_empty());
        assert_eq!(cpu.rdpmc(0), counted(1000));
        assert_eq!(cpu.rdmsr(driver.counter_msr(0)), counted(1000));
        // Guest mistakes are answered with #GP, never a panic: a reserved control bit, a
        // counter this PMU does not have.
        let reserved = driver.count_instructions(false) | 1 << 63;
        let gp = MsrOutcome::GeneralProtection;
        assert_eq!(cpu.wrmsr(driver.control_msr(0), reserved), gp);
        assert_eq!(cpu.rdpmc(31), MsrOutcome::GeneralProtection);
    });

    // 2. pCPU 1 runs guest 1.1, which counts on the same counter index.
    pcpus[1].run(move |cpu| {
        cpu.switch_to(Some(GUEST_1)).unwrap();
        program(cpu, driver, 0, 0, false);
        cpu.retire(KERNEL_TEXT, 500);
        assert_eq!(cpu.rdpmc(0), counted(500));
    });

    // 3. pCPU 0 switches to dom0's vCPU, which counts 300, and back to guest 1.0, which
    //    counts 200 more: neither sees the other's instructions.
    pcpus[0].run(move |cpu| {
        cpu.switch_to(Some(DOM0)).unwrap();
        program(cpu, driver, 0, 0, false);
        cpu.retire(KERNEL_TEXT, 300);
        assert_eq!(cpu.rdpmc(0), counted(300));
        cpu.switch_to(Some(GUEST_0)).unwrap();
        cpu.retire(KERNEL_TEXT, 200);
        assert_eq!(cpu.rdpmc(0), counted(1200));
    });

    // 4. Guest 1.0 migrates to pCPU 1. The scheduler switches it out where it ran first
    //    (its context is saved there), then in where it goes (loaded there).
    pcpus[0].run(|cpu| cpu.switch_to(Some(DOM0)).unwrap());
    assert_eq!(host.vcpus.lock(GUEST_0).state(), VcpuState::Saved);
    pcpus[1].run(move |cpu| {
        cpu.switch_to(Some(GUEST_0)).unwrap();
        cpu.retire(KERNEL_TEXT, 100);
        assert_eq!(cpu.rdpmc(0), counted(1300));
    });
    assert_eq!(
        host.vcpus.lock(GUEST_0).state(),
        VcpuState::Loaded { pcpu: 1 }
    );

    // 5. Guest 1.1, now on pCPU 0, samples: it registers its shared page, unmasks the page's
    //    LVTPC, and arms counter 1 to overflow after PERIOD instructions.
    let gfn = guest_frame(GUEST_1.domain, 1);
    let pmis = pcpus[0].run(move |cpu| {
        cpu.switch_to(Some(GUEST_1)).unwrap();
        cpu.hypercall(XENPMU_OP_INIT, Params::new(gfn, GUEST_1.vcpu))
            .expect("INIT of a free frame of its own");
        // The guest clears the LVTPC mask bit in its page (its own memory), then tells the
        // hypervisor.
        let host = cpu.platform.host;
        let mut memory = host.memory.lock().unwrap();
        let page = memory.get_mut(&(GUEST_1.domain, gfn)).unwrap();
        PageViewMut::new(page).unwrap().set_lvtpc_masked(false);
        drop(memory);
        cpu.hypercall(XENPMU_OP_LVTPC_SET, Params::new(0, 0))
            .expect("LVTPC_SET");
        program(cpu, driver, 1, driver.overflow_after(PERIOD), true);
        cpu.retire(SAMPLED_FUNCTION, 2 * PERIOD)
    });
    // The PMI interrupted exactly the instruction that overflowed the counter, and the sample
    // went to guest 1.1's page; its counters stopped there (nothing more interrupted).
    let overflowed_at = SAMPLED_FUNCTION + 4 * (PERIOD - 1);
    assert!(
        matches!(pmis[..], [TakenPmi { rip, outcome: PmiOutcome::Delivered { to: GUEST_1, .. } }]
            if rip == overflowed_at),
        "{pmis:?}"
    );
    assert_eq!(host.virqs.lock().unwrap().pop_front(), Some(GUEST_1));
    // The guest takes the PMU VIRQ and reads its page: its own sample (`XENPMU_DOMID_SELF`),
    // of its vCPU 1, at that instruction.
    {
        let memory = host.memory.lock().unwrap();
        let page = PageView::new(&memory[&(GUEST_1.domain, gfn)]).unwrap();
        assert!(page.is_cached());
        let identity = page.identity();
        assert_eq!(
            (identity.domain_id, identity.vcpu_id),
            (XENPMU_DOMID_SELF, 1)
        );
        assert_eq!(page.regs().rip, overflowed_at);
    }
    let flushed = pcpus[0].run(move |cpu| {
        // Between the sample and the flush the counters are stopped: counter 0 has 500 + the
        // PERIOD instructions before the overflow, counter 1 has wrapped to 0.
        assert_eq!(cpu.rdpmc(0), counted(500 + PERIOD));
        assert_eq!(cpu.rdpmc(1), counted(0));
        cpu.hypercall(XENPMU_OP_FLUSH, Params::new(0, 0))
            .expect("FLUSH of an unedited page");
        // The flush put the context back on the hardware: both count again.
        cpu.retire(KERNEL_TEXT, 50);
        (cpu.rdpmc(0), cpu.rdpmc(1))
    });
    assert_eq!(flushed, (counted(550 + PERIOD), counted(50)));
    let stats = *host.vcpus.lock(GUEST_1).stats();
    assert_eq!((stats.pmis_generated, stats.pmis_delivered), (1, 1));

    // 6. Domain 1 is destroyed. The hypervisor's destroy path runs on pCPU 0, which
    //    deschedules guest 1.1 and tears it down at once (its page is unmapped); guest 1.0
    //    still runs on pCPU 1, so its teardown is a request to pCPU 1, which completes it
    //    before its next guest entry, and pCPU 0's retry finds it done.
    let first_try = pcpus[0].run(|cpu| {
        cpu.switch_to(Some(DOM0)).unwrap();
        assert_eq!(cpu.teardown(GUEST_1), Completion::Done);
        cpu.teardown(GUEST_0)
    });
    assert_eq!(first_try, Completion::Pending);
    // pCPU 1 was kicked; this job runs after the kick, and after its inbox was drained.
    let (completed, counting) =
        pcpus[1].run(|cpu| (cpu.requests_completed, cpu.pmu.hw().anything_can_count()));
    assert_eq!(completed, 1, "the teardown completed on pCPU 1");
    assert!(!counting, "guest 1.0's counters stopped on pCPU 1");
    let (retry, sent) = pcpus[0].run(|cpu| (cpu.teardown(GUEST_0), cpu.platform.requests_sent));
    assert_eq!((retry, sent), (Completion::Done, 1));
    for vcpu in [GUEST_0, GUEST_1] {
        assert_eq!(host.vcpus.lock(vcpu).state(), VcpuState::Allocated);
    }
    pcpus[1].run(|cpu| cpu.switch_to(None).unwrap());
    pcpus[0].run(|cpu| {
        cpu.switch_to(None).unwrap();
        assert_eq!(cpu.teardown(DOM0), Completion::Done);
    });

    format!(
        "counts 1000, 500, 300, 1200, 1300 after migration; sample at {overflowed_at:#x}, \
         flushed; teardown request completed on pCPU 1"
    )
}
