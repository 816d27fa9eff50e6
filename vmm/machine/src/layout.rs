//! How the vCPUs of a run map to domains, host threads and pCPUs.

use vpmu::VcpuId;

use crate::error::{MachineError, Result};

/// How the vCPUs of a run map to domains, host threads and pCPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One domain (the privileged one) with `n` vCPUs, each on its own host thread, which is
    /// its own pCPU. vCPU `i` is entered with RSI = `i`.
    ThreadPerVcpu(u32),
    /// `n` domains (domain 0 privileged), one VM of one vCPU each, all time-sliced on ONE
    /// host thread, which is one pCPU: `Vpmu::context_switch` at every switch. The vCPU of
    /// domain `d` is entered with RSI = `d`.
    SharedPcpu(u32),
    /// The whole machine: `pcpus` host threads, each one pCPU that time-slices its vCPUs as
    /// `SharedPcpu` does. The privileged domain has one vCPU per pCPU (vCPU `p` on pCPU `p`:
    /// in all mode it profiles that pCPU); every other domain has `vcpus` vCPUs, vCPU `i` on
    /// pCPU `i mod pcpus`. vCPU `i` of domain `d` is entered with RSI = `d` (its LAPIC ID is
    /// `i`).
    SharedPcpus {
        /// pCPUs (host threads).
        pcpus: u32,
        /// Domains, the privileged one included.
        domains: u32,
        /// vCPUs of each unprivileged domain.
        vcpus: u32,
    },
}

impl Layout {
    /// vCPUs of each domain, and the pCPUs, of this layout.
    pub(crate) fn shape(self) -> (Vec<u32>, u32) {
        match self {
            Layout::ThreadPerVcpu(n) => (vec![n], n),
            Layout::SharedPcpu(n) => (vec![1; n as usize], 1),
            Layout::SharedPcpus {
                pcpus,
                domains,
                vcpus,
            } => (
                (0..domains)
                    .map(|d| if d == 0 { pcpus } else { vcpus })
                    .collect(),
                pcpus,
            ),
        }
    }

    /// The pCPU a vCPU runs on in a shared layout (it never moves).
    pub(crate) fn home_pcpu(self, vcpu: VcpuId) -> u32 {
        match self {
            Layout::SharedPcpus { pcpus, .. } => vcpu.vcpu % pcpus.max(1),
            _ => 0,
        }
    }

    pub(crate) fn shared(self) -> bool {
        !matches!(self, Layout::ThreadPerVcpu(_))
    }

    /// Refuses a layout with a domain id the ABI reserves (`XENPMU_DOMID_FIRST_RESERVED` and
    /// up): a sample naming such a domain would read as `XENPMU_DOMID_SELF` or
    /// `XENPMU_DOMID_HYPERVISOR`.
    pub(crate) fn check_domains(self) -> Result<()> {
        let (counts, _) = self.shape();
        let first_reserved = vpmu::abi::XENPMU_DOMID_FIRST_RESERVED;
        if counts.len() > first_reserved as usize {
            return Err(MachineError::ReservedDomain {
                domain: first_reserved,
            });
        }
        Ok(())
    }
}
