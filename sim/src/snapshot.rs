//! The observable state of a machine, for "an operation that fails changes nothing": the
//! global mode, features and in-use count; every vCPU's whole core state (context, state, page,
//! statistics, LVTPC mask); every pCPU's whole core state including its model's raw registers
//! and access counts; and the platform — guest memory (so every page's bytes), mappings,
//! virtual and physical LVTPC masks, pending interrupts — except its diagnostics log.

use super::machine::Machine;
use super::platform::SimPlatform;
use super::vendor::SimVendor;

/// A machine's observable state.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// `Vpmu::mode`.
    pub mode: u64,
    /// `Vpmu::features`.
    pub features: u64,
    /// `Vpmu::unprivileged_in_use`.
    pub unprivileged_in_use: u32,
    /// Every `VcpuPmu`, formatted.
    pub vcpus: Vec<String>,
    /// Every `PcpuPmu` (with its model), formatted.
    pub pcpus: Vec<String>,
    /// The platform without its diagnostics.
    pub platform: SimPlatform,
}

impl Snapshot {
    /// The state of `m` now.
    pub fn take<V: SimVendor>(m: &Machine<V>) -> Self {
        Self {
            mode: m.vpmu.mode().to_abi(),
            features: m.vpmu.features(),
            unprivileged_in_use: m.vpmu.unprivileged_in_use(),
            vcpus: m
                .vcpus
                .domains
                .iter()
                .flatten()
                .map(|v| format!("{:?}", v.borrow()))
                .collect(),
            pcpus: m.pcpus.iter().map(|p| format!("{p:?}")).collect(),
            platform: m.platform.observable(),
        }
    }
}
