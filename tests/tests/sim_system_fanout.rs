//! All mode with a privileged domain of several vCPUs: vCPU v profiles the pCPUs p with
//! p mod n = v (n its vCPU count), and a write of its program reaches exactly those pCPUs'
//! instances. The fan-out steps through them (every n-th pCPU from v) rather than testing
//! every pCPU; this checks that it names the same pCPUs, on every vendor shape.

use vpmu::abi::XENPMU_MODE_ALL;
use vpmu::{CrossCpuRequest, SystemContext, VcpuId};
use vpmu_sim::helpers::counting;
use vpmu_sim::{Machine, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};

const PCPUS: u32 = 7;
const PROFILERS: u32 = 3;
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };

fn profiler(vcpu: u32) -> VcpuId {
    VcpuId { domain: 0, vcpu }
}

/// Each profiler programs a counter from a pCPU it does not profile (every profiler's
/// write is then a fan-out to all of its pCPUs): the requests sent name exactly the pCPUs it
/// profiles, and once delivered, each of those holds its instance and no other does.
fn writes_reach_exactly_the_profiled_pcpus<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = Machine::new(vendor, PCPUS, &[PROFILERS, 1], XENPMU_MODE_ALL);
    m.hold_requests = true;
    for v in 0..PROFILERS {
        let p = profiler(v);
        m.register_page(p);
        // A pCPU this profiler does not profile (v + 1 mod n), so that no instance is local.
        let from = (v + 1) % PROFILERS;
        m.schedule(from, Some(p));
        let before: Vec<usize> = m.platform.requests.iter().map(|q| q.len()).collect();
        m.program(p, &[counting(0, 0)]);
        for pcpu in 0..PCPUS {
            let sent = m.platform.requests[pcpu as usize]
                .iter()
                .skip(before[pcpu as usize])
                .any(|r| matches!(r, CrossCpuRequest::SystemWrite { profiler, .. } if *profiler == p));
            assert_eq!(
                sent,
                pcpu % PROFILERS == v,
                "{name}: {p:?}'s write sent to pCPU {pcpu}"
            );
        }
        m.schedule(from, None);
    }
    m.hold_requests = false;
    m.deliver_requests();
    m.schedule(0, Some(A));
    for pcpu in 0..PCPUS {
        assert_eq!(
            *m.pcpus[pcpu as usize].system(),
            SystemContext::Loaded {
                profiler: profiler(pcpu % PROFILERS)
            },
            "{name}: pCPU {pcpu}'s instance"
        );
    }
}

#[test]
fn a_profiler_write_reaches_exactly_its_pcpus() {
    writes_reach_exactly_the_profiled_pcpus(intel_v5());
    writes_reach_exactly_the_profiled_pcpus(intel_v2());
    writes_reach_exactly_the_profiled_pcpus(amd_v2());
    writes_reach_exactly_the_profiled_pcpus(amd_legacy());
}
