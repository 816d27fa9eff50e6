//! Moving a vCPU's PMU state between machines as a VMM does at a live migration: the vPMU's
//! part as a snapshot (`vpmu::snapshot`: taken on the switched-out vCPU, encoded, decoded,
//! restored into a fresh vCPU of the destination), the rest as the VMM's own state (the
//! domain's guest memory, the vCPU's virtual LVTPC and resume registers, a continuous guest
//! clock and instruction tag). Also the guest's view of its PMU, for comparing a migrated vCPU
//! with a twin that never moved.

use vpmu::snapshot::{SnapshotBackend, VcpuSnapshot};
use vpmu::{DecodeError, Msr, MsrOutcome, RestoreError, TakeError, VcpuId};

use super::machine::Machine;
use super::vendor::SimVendor;

/// Why bytes could not be restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a snapshot.
    Decode(DecodeError),
    /// A snapshot the destination refuses.
    Restore(RestoreError),
}

/// `id`'s snapshot on `m`, encoded.
pub fn take_bytes<V: SimVendor>(m: &Machine<V>, id: VcpuId) -> Result<Vec<u8>, TakeError>
where
    V::Backend: SnapshotBackend,
{
    let snapshot = m.vpmu.take_snapshot(&m.vcpu(id))?;
    let mut bytes = vec![0; VcpuSnapshot::MAX_ENCODED_LEN];
    let len = snapshot
        .encode(&mut bytes)
        .expect("MAX_ENCODED_LEN holds every snapshot");
    bytes.truncate(len);
    Ok(bytes)
}

/// Decodes `bytes` and restores them into `id` on `m` (through the platform, like a VMM).
pub fn restore_bytes<V: SimVendor>(
    m: &mut Machine<V>,
    id: VcpuId,
    bytes: &[u8],
) -> Result<(), Refused>
where
    V::Backend: SnapshotBackend,
{
    let snapshot = VcpuSnapshot::decode(bytes).map_err(Refused::Decode)?;
    m.vpmu
        .restore_snapshot(&mut m.platform, &m.vcpus, id, &snapshot)
        .map_err(Refused::Restore)
}

/// The VMM's part of migrating `id` from `from` to `to`: the domain's guest memory, the
/// vCPU's virtual LVTPC mask and resume registers, the guest clock and the instruction tag
/// (so that samples taken after the move read what the unmoved machine's read).
pub fn carry_vmm_state<V: SimVendor>(from: &Machine<V>, to: &mut Machine<V>, id: VcpuId) {
    for (&(domain, gfn), page) in &from.platform.memory {
        if domain == id.domain {
            to.platform.memory.insert((domain, gfn), page.clone());
        }
    }
    match from.platform.vlapic_masked.get(&id) {
        Some(&masked) => to.platform.vlapic_masked.insert(id, masked),
        None => to.platform.vlapic_masked.remove(&id),
    };
    match from.platform.resume_regs.get(&id) {
        Some(&regs) => to.platform.resume_regs.insert(id, regs),
        None => to.platform.resume_regs.remove(&id),
    };
    to.platform.clock = from.platform.clock;
    to.retired = from.retired;
}

/// What `id` reads from every MSR its vendor's PMU architecture defines (present or not).
pub fn guest_view<V: SimVendor>(m: &mut Machine<V>, id: VcpuId) -> Vec<(u32, MsrOutcome<u64>)> {
    let ranges = vpmu::PmuBackend::msr_ranges(m.vpmu.backend());
    ranges
        .iter()
        .flat_map(|&(first, last)| first..=last)
        .map(|msr| (msr, m.rdmsr(id, Msr(msr).0)))
        .collect()
}
