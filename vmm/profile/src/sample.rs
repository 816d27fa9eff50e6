//! What the sampler guests ship to the VMM: samples as read from a xenpmu page, resolved to
//! who they belong to.

use serde::Serialize;
use vpmu::abi::Regs;

/// Whose execution a sample caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Origin {
    /// A guest domain (by domain number; `XENPMU_DOMID_SELF` already resolved to the
    /// shipping domain).
    Domain(u32),
    /// The hypervisor (here: the VMM handling a guest's exit), `XENPMU_DOMID_HYPERVISOR`.
    Hypervisor,
}

/// One sample, as a sampler guest read it from its page and shipped it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileSample {
    /// Whose execution it caught.
    pub origin: Origin,
    /// The vCPU it caught (of `origin`'s domain; for the hypervisor, the vCPU it served).
    pub vcpu: u32,
    /// The pCPU it was taken on (as the page told the privileged domain).
    pub pcpu: u32,
    /// The interrupted instruction pointer.
    pub rip: u64,
    /// Taken at CPL3 (`XENPMU_FLAG_SAMPLE_USER`).
    pub user: bool,
    /// The full interrupted register set from the page.
    pub regs: Regs,
    /// The domain whose guest shipped it (the profiler in all/hv mode, the domain itself in
    /// self mode).
    pub shipped_by: u32,
}
