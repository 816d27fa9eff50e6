//! A pCPU catching up with a new policy epoch judges the context loaded there again only when
//! its vCPU's guest policy (features, event filter, may-count-host) changed: a mode change
//! between self and hv changes may-count-host for the privileged domain alone. These check
//! that the privileged vCPU's loaded context is restricted by that catch-up (it stops counting
//! while the hypervisor runs) and that an unprivileged one, judged the same under both modes,
//! keeps counting its guest instructions. AMD shapes only: may-count-host is AMD's
//! host/guest qualifiers (Intel's counters have none; `vpmu_intel`'s crate doc).

use vpmu::Mode;
use vpmu::VcpuId;
use vpmu::abi::ops::Params;
use vpmu::abi::{XENPMU_MODE_HV, XENPMU_MODE_SELF, XENPMU_OP_MODE_SET};
use vpmu_sim::helpers::counting;
use vpmu_sim::workload::Instruction;
use vpmu_sim::{Machine, SimVendor, amd_legacy, amd_v2};

const P: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };

fn guest_insn() -> Instruction {
    Instruction {
        rip: 0x40_1000,
        cpl: 3,
        branch: false,
    }
}

/// P (privileged) on pCPU 0 counts in hv mode, hypervisor instructions included; A
/// (unprivileged) on pCPU 1 counts its own. P switches to self mode from pCPU 0 (which
/// catches up at once); pCPU 1 catches up at its next guest write.
fn hv_to_self<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let counter = vendor.driver().read_counter(0);
    let mut m = Machine::new(vendor, 2, &[1, 1], XENPMU_MODE_HV);
    m.schedule(0, Some(P));
    m.schedule(1, Some(A));
    m.program(P, &[counting(0, 0)]);
    m.program(A, &[counting(0, 0)]);
    m.retire_hypervisor(0, 0xffff_8000_0000_1000);
    let counted = m.rdmsr(P, counter);
    assert_eq!(
        counted,
        vpmu::MsrOutcome::Handled(1),
        "{name}: P counts the hypervisor in hv mode"
    );
    m.hold_requests = true;
    let _ = m.op_once(P, XENPMU_OP_MODE_SET, &Params::new(XENPMU_MODE_SELF, 0));
    assert_eq!(m.vpmu.mode(), Mode::SelfProfiling, "{name}");
    // P's pCPU caught up: P's context no longer counts the hypervisor.
    m.retire_hypervisor(0, 0xffff_8000_0000_1000);
    assert_eq!(
        m.rdmsr(P, counter),
        counted,
        "{name}: P's loaded context still counts the hypervisor after the change to self mode"
    );
    // A's pCPU catches up at A's write (its guest policy is the same in both modes) and A's
    // counter keeps counting its own instructions.
    m.wrmsr(A, counter, 100);
    assert_eq!(m.pcpus[1].mode_seen(), Mode::SelfProfiling, "{name}");
    m.retire(1, &guest_insn());
    assert_eq!(
        m.rdmsr(A, counter),
        vpmu::MsrOutcome::Handled(101),
        "{name}: A counts after its pCPU caught up"
    );
    m.hold_requests = false;
    m.deliver_requests();
}

#[test]
fn a_mode_change_restricts_the_privileged_context_and_keeps_the_others() {
    hv_to_self(amd_legacy());
    hv_to_self(amd_v2());
}
