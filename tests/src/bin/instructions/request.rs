//! The cross-pCPU request row: an all-mode profiler's write replayed on another pCPU it
//! profiles (`CrossCpuRequest::SystemWrite`), sent and completed. Why this request: see
//! `reference.rs` (`request` in `minimum`).

use vpmu::abi::ops::Params;
use vpmu::abi::{XENPMU_MODE_ALL, XENPMU_MODE_SELF, XENPMU_OP_MODE_SET};
use vpmu::{CrossCpuRequest, Msr, MsrBus, SystemContext};
use vpmu_sim::helpers::counting;
use vpmu_sim::{Machine, SimVendor};

use crate::harness::{Excluded, ExcludedPlatform, ExcludedTable, unmeasured};
use crate::{A, M, Mark, Measured, P, Pass, check, handled};

/// Whether pCPU `p` holds P's system-wide context, counting.
fn profiled<V: SimVendor>(m: &M<V>, p: usize) -> bool
where
    V::Model: Clone,
{
    *m.pcpus[p].system() == SystemContext::Loaded { profiler: P }
}

/// `request`: two pCPUs in all mode, P (the one privileged vCPU, so it profiles both) runs on
/// pCPU 0 with counter 0 counting, A runs on pCPU 1. Measured together: P's WRMSR of counter
/// 0 on pCPU 0 (validated once, written to pCPU 0's instance, `SystemWrite` sent to pCPU 1)
/// and pCPU 1's `complete_request` of it; taking the request off the platform's queue
/// between the two is not measured. Fails unless exactly one request went to pCPU 1 and both
/// pCPUs' counters hold the written value afterwards.
pub(crate) fn system_write<V: SimVendor>(excluded: Excluded<V>) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 2, &[1, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(P));
    m.register_page(P);
    m.op(P, XENPMU_OP_MODE_SET, &Params::new(XENPMU_MODE_ALL, 0))
        .map_err(|e| format!("mode all: {e:?}"))?;
    m.program(P, &[counting(0, 0)]);
    m.schedule(1, Some(A));
    check(profiled(&m, 0) && profiled(&m, 1), || {
        "P's system-wide context is not counting on both pCPUs".into()
    })?;
    let counter = driver.read_counter(0);
    let mut cost = (0, 0);
    for (round, pass) in Pass::BOTH.into_iter().enumerate() {
        let (msr, value) = driver.write_counter(0, 0x5000 + round as u64);
        m.platform.calling_pcpu = Some(0);
        let mark = Mark::of(&m);
        let (wrote, request, completed) = {
            let [p0, p1] = m.pcpus.as_mut_slice() else {
                return Err("two pCPUs".into());
            };
            let cell = &m.vcpus.domains[P.domain as usize][P.vcpu as usize];
            let (vpmu, platform, vcpus) = (
                &m.vpmu,
                &mut ExcludedPlatform(&mut m.platform),
                &ExcludedTable(&m.vcpus),
            );
            pass.run(|| {
                let mut profiler = unmeasured(|| cell.borrow_mut());
                let wrote = vpmu.wrmsr(platform, p0, &mut profiler, Msr(msr), value);
                // The request travels (the platform's queue; an IPI in a hypervisor).
                let request = unmeasured(|| {
                    drop(profiler);
                    platform.0.calling_pcpu = Some(1);
                    platform.0.requests[1].pop_front()
                });
                let completed = request.map(|r| vpmu.complete_request(platform, p1, vcpus, r));
                (wrote, request, completed)
            })
        };
        cost = mark.since(&m);
        m.platform.calling_pcpu = None;
        check(handled(&wrote), || format!("P's WRMSR: {wrote:?}"))?;
        let expected = CrossCpuRequest::SystemWrite {
            profiler: P,
            msr: Msr(msr),
            value,
        };
        check(request == Some(expected), || {
            format!("pCPU 1 was sent {request:?}, not {expected:?}")
        })?;
        check(matches!(completed, Some(Ok(()))), || {
            format!("pCPU 1 did not complete the request: {completed:?}")
        })?;
        check(m.platform.requests.iter().all(|q| q.is_empty()), || {
            "other requests were sent".into()
        })?;
        for p in 0..2 {
            let now = m.pcpus[p].hw_mut().read(Msr(counter));
            check(now == Ok(driver.stored(0, value)), || {
                format!("pCPU {p}'s counter 0 is {now:x?}, not the value written")
            })?;
        }
    }
    Ok(Measured {
        msr_accesses: cost.0,
        allocations: cost.1,
        counters_used: 1,
    })
}
