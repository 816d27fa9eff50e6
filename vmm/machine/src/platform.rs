//! The `vpmu::Platform` of the VMM: the VM seen from one pCPU thread between runs (shared
//! pages in guest RAM, PMI delivery through the guest's LVTPC, the PMU VIRQ as an MSI,
//! cross-CPU requests) over `Host` (host.rs), the part every pCPU thread shares.

use kvm_bindings::{kvm_msi, kvm_sync_regs};
use kvm_ioctls::VcpuFd;
use vpmu::abi::{
    Page, Regs, XENPMU_REGS_MODE_16, XENPMU_REGS_MODE_32, XENPMU_REGS_MODE_64,
    XENPMU_REGS_MODE_HYPERVISOR, XENPMU_REGS_MODE_REAL, XENPMU_REGS_MODE_USER,
};
use vpmu::{
    AllowAll, CrossCpuRequest, Diagnostic, EventFilter, Interrupted, Interruption, LvtpcDelivery,
    MapError, PageSlot, Platform, RingSlot, SampledContext, VcpuId,
};
use zerocopy::IntoBytes;

use super::{PRIVILEGED_DOMAIN, VIRQ_VECTOR};
use crate::host::{Host, QueuedPmi};
use crate::kvm::Vm;
use crate::page_write::write_changes;
use crate::translate::Paging;

const LAPIC_ID: usize = 0x20;
const LAPIC_SVR: usize = 0xF0;
const LAPIC_LVTPC: usize = 0x340;
const LVT_MASKED: u32 = 1 << 16;

/// What the VMM was doing while a hypervisor sample was taken (hv mode): the exit it was
/// handling. The VMM is a host process whose code addresses mean nothing to a guest, so a
/// hypervisor sample's RIP is the activity's ID in a reserved range (`rip`, one page of
/// addresses per activity), which a consumer may name as it likes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmmActivity {
    /// A port I/O exit (console, slices, the profiler's idle loop).
    PortIo = 0,
    /// A PMU MSR exit handled by the vpmu core.
    MsrAccess = 1,
    /// The control-operation hypercall.
    Hypercall = 2,
    /// A kick (timed overflow or the end of a slice).
    Kick = 3,
    /// A single-step exit or anything else.
    Other = 4,
}

impl VmmActivity {
    /// The first reserved hypervisor RIP.
    pub const RIP_BASE: u64 = 0xffff_ff00_0000_0000;
    /// The addresses each activity's range spans.
    pub const STRIDE: u64 = 0x1000;
    /// Every activity.
    pub const ALL: [Self; 5] = [
        Self::PortIo,
        Self::MsrAccess,
        Self::Hypercall,
        Self::Kick,
        Self::Other,
    ];

    /// The RIP of a hypervisor sample taken during this activity.
    pub fn rip(self) -> u64 {
        Self::RIP_BASE + self as u64 * Self::STRIDE
    }

    /// The registers of a hypervisor sample (only the RIP, CS and mode are meaningful: the
    /// VMM's own registers are no guest's business).
    pub fn regs(self) -> Regs {
        Regs {
            rip: self.rip(),
            cs: 0x8,
            mode: XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_HYPERVISOR,
            ..Regs::default()
        }
    }
}

/// Per-vCPU platform state kept across exits.
#[derive(Debug, Default)]
pub(super) struct PlatformState {
    /// The last guest registers (sync regs), for `Platform::interrupted`.
    pub(super) regs: Regs,
    /// The vCPU's paging state at the last exit, for reading a sample's call chain through
    /// the guest's own page tables.
    pub(super) paging: Paging,
    /// The host TSC frequency (kHz) the samples' timestamps count in; 0 if unknown.
    pub(super) tsc_khz: u64,
    /// An interrupt was injected (vector), so the next retired instruction is its handler's.
    pub(super) injected: Option<u8>,
    pub(super) diagnostics: u64,
    pub(super) pmis: u64,
    /// The interrupted context of each PMI delivered through the LVTPC (the first
    /// `MAX_PMI_CONTEXTS`), as `interrupted` gave it to the core.
    pub(super) pmi_contexts: Vec<PmiContext>,
    /// The interrupted context of the last delivered PMI.
    pub(super) last_pmi: Option<PmiContext>,
    /// Set while the PMIs raised by the VMM's own time are handled (hv mode): the VMM, not
    /// the guest, was interrupted.
    pub(super) hypervisor: Option<VmmActivity>,
    /// Where the time of this vCPU's PMIs went (the core's PMI path, the kick's lateness).
    pub(super) timing: crate::timing::PmiTiming,
    /// The predicted overflow the timed source armed the current run's kick for.
    pub(super) kick_deadline: Option<std::time::Instant>,
}

/// At most this many PMI contexts are kept per vCPU.
pub(super) const MAX_PMI_CONTEXTS: usize = 1 << 16;

/// Where a delivered PMI interrupted the guest (from sync regs at the exit that raised it; in
/// timed mode, the kick at the predicted overflow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmiContext {
    /// Interrupted RIP.
    pub rip: u64,
    /// Interrupted CPL (CS.RPL).
    pub cpl: u8,
    /// `XENPMU_REGS_MODE_*` of the interrupted context.
    pub mode: u32,
}

impl PmiContext {
    /// The `port::PMI_CONTEXT` encoding: RIP bits 0..29 | CPL << 30.
    pub fn port_value(&self) -> u32 {
        (self.rip & 0x3fff_ffff) as u32 | u32::from(self.cpl & 3) << 30
    }
}

/// The `Platform` view of the host from one pCPU thread and the vCPU it runs, built between
/// runs.
pub(super) struct KvmPlatform<'a> {
    /// This vCPU's VM (its domain's).
    pub(super) vm: &'a Vm,
    /// Every domain's VM, by domain number.
    pub(super) vms: &'a [Vm],
    /// This thread's vCPU (the only one whose LAPIC it may touch between runs).
    pub(super) vcpu: &'a VcpuFd,
    pub(super) me: VcpuId,
    /// The pCPU this thread is.
    pub(super) pcpu: u32,
    pub(super) host: &'a Host,
    /// This pCPU's physical LVTPC mask (set by the core while a sample is cached).
    pub(super) physical_masked: &'a mut bool,
    pub(super) state: &'a mut PlatformState,
}

/// A page slot names the domain and the frame: `domain << 32 | gfn`, for a frame number that
/// fits in 32 bits (None otherwise: its high bits would name another domain's slot).
fn slot_of(domain: u32, gfn: u64) -> Option<PageSlot> {
    let gfn = u32::try_from(gfn).ok()?;
    Some(PageSlot(u64::from(domain) << 32 | u64::from(gfn)))
}

fn page_of(slot: PageSlot) -> (u32, u64) {
    ((slot.0 >> 32) as u32, slot.0 & 0xffff_ffff)
}

impl KvmPlatform<'_> {
    /// The registers of the context the PMI being handled interrupted: the guest's, or the
    /// VMM's activity (hv mode).
    pub(super) fn interrupted_regs(&self) -> Regs {
        match self.state.hypervisor {
            Some(activity) => activity.regs(),
            None => self.state.regs,
        }
    }

    /// Where the PMI being handled interrupted: the guest's context, or the VMM's (hv mode).
    pub(super) fn interrupted_context(&self) -> PmiContext {
        let regs = self.interrupted_regs();
        PmiContext {
            rip: regs.rip,
            cpl: regs.cpl,
            mode: regs.mode,
        }
    }

    /// Raises a PMI through this thread's vCPU's LVTPC (between runs): drops it if the LVTPC
    /// is masked or the APIC disabled, sets the mask first if `mask_on_delivery`, then an MSI
    /// or an NMI by delivery mode. On delivery, records `context` as the interrupted one.
    pub(super) fn inject_lvtpc(&mut self, mask_on_delivery: bool, context: PmiContext) -> bool {
        let Ok(mut lapic) = self.vcpu.get_lapic() else {
            return false;
        };
        let read = |l: &kvm_bindings::kvm_lapic_state, off: usize| {
            u32::from_le_bytes(std::array::from_fn(|i| l.regs[off + i] as u8))
        };
        let lvtpc = read(&lapic, LAPIC_LVTPC);
        let enabled = read(&lapic, LAPIC_SVR) & 0x100 != 0;
        if lvtpc & LVT_MASKED != 0 || !enabled {
            return false;
        }
        if mask_on_delivery {
            let masked = (lvtpc | LVT_MASKED).to_le_bytes();
            for (i, b) in masked.iter().enumerate() {
                lapic.regs[LAPIC_LVTPC + i] = *b as std::os::raw::c_char;
            }
            // set_lapic before the interrupt is raised, so that the written image cannot
            // overwrite the IRR bit.
            if self.vcpu.set_lapic(&lapic).is_err() {
                return false;
            }
        }
        let apic_id = read(&lapic, LAPIC_ID) >> 24;
        let vector = (lvtpc & 0xff) as u8;
        let delivered = match (lvtpc >> 8) & 7 {
            4 => {
                self.state.injected = Some(2);
                self.vcpu.nmi().is_ok()
            }
            _ => {
                self.state.injected = Some(vector);
                msi(self.vm, apic_id, vector)
            }
        };
        if delivered {
            self.state.pmis += 1;
            self.state.last_pmi = Some(context);
            if self.state.pmi_contexts.len() < MAX_PMI_CONTEXTS {
                self.state.pmi_contexts.push(context);
            }
        }
        delivered
    }
}

impl Platform for KvmPlatform<'_> {
    fn privileged_domain(&self) -> u32 {
        PRIVILEGED_DOMAIN
    }

    fn vcpu_count(&self, domain: u32) -> Option<u32> {
        self.host.index.counts.get(domain as usize).copied()
    }

    fn event_filter(&self, _domain: u32) -> &dyn EventFilter {
        &AllowAll
    }

    fn map_page(&mut self, domain: u32, gfn: u64) -> Result<PageSlot, MapError> {
        let in_ram = self.vms.get(domain as usize).is_some_and(|vm| {
            gfn.checked_mul(4096)
                .is_some_and(|gpa| vm.mem.contains(gpa, 4096))
        });
        let slot = slot_of(domain, gfn);
        let Some(slot) = slot.filter(|_| in_ram && gfn != 0) else {
            return Err(MapError::InvalidFrame);
        };
        if !self.host.pages.map(domain, gfn) {
            return Err(MapError::NoMemory);
        }
        Ok(slot)
    }

    fn unmap_page(&mut self, slot: PageSlot) {
        let (domain, gfn) = page_of(slot);
        self.host.pages.unmap(domain, gfn);
    }

    fn with_page<R>(&mut self, slot: PageSlot, access: impl FnOnce(&mut Page) -> R) -> Option<R> {
        let (domain, gfn) = page_of(slot);
        // A page is one vCPU's, and the core registers, reaches and unmaps it under that
        // vCPU's lock, so no unmap races with this access; the memory stays the VM's anyway.
        if !self.host.pages.mapped(domain, gfn) {
            return None;
        }
        // The core works on a private copy, read once; what it changed is written back
        // (only the bytes it changed, so that the guest's own writes to the rest of the page
        // in the meantime stand, as they would on a page both write in place).
        let mem = &self.vms.get(domain as usize)?.mem;
        let gpa = gfn.checked_mul(4096)?;
        let before: Box<Page> = Box::new(mem.read_as(gpa)?);
        let mut page = before.clone();
        let result = access(&mut page);
        write_changes(mem, gpa, before.as_bytes(), page.as_bytes());
        Some(result)
    }

    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, mask_on_delivery: bool) -> LvtpcDelivery {
        let context = self.interrupted_context();
        if vcpu == self.me {
            return if self.inject_lvtpc(mask_on_delivery, context) {
                LvtpcDelivery::Delivered
            } else {
                LvtpcDelivery::Masked
            };
        }
        // Another vCPU's LAPIC: only its own run loop may change it, before its next entry.
        let queued = self.host.queue_lvtpc(QueuedPmi {
            to: vcpu,
            mask_on_delivery,
            context,
        });
        if queued {
            LvtpcDelivery::Queued
        } else {
            LvtpcDelivery::Masked
        }
    }

    fn raise_pmu_virq(&mut self, vcpu: VcpuId) {
        if vcpu == self.me {
            self.state.injected = Some(VIRQ_VECTOR);
        } else if self.host.layout.shared() {
            self.host.wake(vcpu);
        }
        // An MSI through the receiver's VM (a VM ioctl: safe from any thread). For a vCPU that
        // is not running (another domain's on a shared pCPU) KVM only sets the IRR bit, and the
        // VIRQ is injected at that vCPU's next entry; a running one on another thread is kicked.
        // KVM's LAPIC IDs are the vCPU indices (in the vCPU's domain's VM).
        if let Some(vm) = self.vms.get(vcpu.domain as usize) {
            msi(vm, vcpu.vcpu, VIRQ_VECTOR);
        }
    }

    fn supports_ring(&self) -> bool {
        true
    }

    fn read_guest(&mut self, domain: u32, address: u64, out: &mut [u8]) -> bool {
        // One volatile copy: the core gets a private copy, read once.
        self.vms
            .get(domain as usize)
            .is_some_and(|vm| vm.mem.read(address, out).is_ok())
    }

    fn map_ring(&mut self, domain: u32, gfn: u64, frames: u32) -> Result<RingSlot, MapError> {
        let valid = self
            .vms
            .get(domain as usize)
            .is_some_and(|vm| crate::ring::ring_frames_valid(&vm.mem, gfn, frames));
        if !valid {
            return Err(MapError::InvalidFrame);
        }
        self.host.rings.map(domain, gfn, frames)
    }

    fn unmap_ring(&mut self, slot: RingSlot) {
        self.host.rings.unmap(slot);
    }

    fn ring_read(&mut self, slot: RingSlot, offset: u32, out: &mut [u8]) -> bool {
        let Some((domain, gpa)) = self.host.rings.locate(slot, offset, out.len()) else {
            return false;
        };
        self.vms
            .get(domain as usize)
            .is_some_and(|vm| crate::ring::read(&vm.mem, gpa, out))
    }

    fn ring_write(&mut self, slot: RingSlot, offset: u32, data: &[u8]) -> bool {
        let Some((domain, gpa)) = self.host.rings.locate(slot, offset, data.len()) else {
            return false;
        };
        self.vms
            .get(domain as usize)
            .is_some_and(|vm| crate::ring::write(&vm.mem, gpa, data))
    }

    fn write_guest(&mut self, caller: VcpuId, address: u64, data: &[u8]) -> bool {
        let Some(vm) = self.vms.get(caller.domain as usize) else {
            return false;
        };
        vm.mem.write(address, data).is_ok()
    }

    fn send_request(&mut self, pcpu: u32, request: CrossCpuRequest) {
        debug_assert_ne!(pcpu, self.pcpu, "the core sent {request:?} to its own pCPU");
        self.host.send(pcpu, request);
    }

    fn set_physical_lvtpc_masked(&mut self, pcpu: u32, masked: bool) {
        // Always the caller's own pCPU (the core never touches another's).
        debug_assert_eq!(pcpu, self.pcpu, "the core masked another pCPU's LVTPC");
        if pcpu == self.pcpu {
            *self.physical_masked = masked;
        }
    }

    fn timestamp(&mut self) -> u64 {
        // The host TSC when the VMM handles the PMI: one clock for every pCPU thread.
        // SAFETY: RDTSC reads a counter and has no memory effects; every x86-64 CPU has it
        // (CR4.TSD, which would make it fault in user mode, is never set by Linux here).
        unsafe { std::arch::x86_64::_rdtsc() }
    }

    fn tsc_khz(&self) -> u64 {
        self.state.tsc_khz
    }

    fn reads_sampled_memory(&self, context: SampledContext) -> bool {
        // Only the vCPU this thread runs has its paging state here (a PMI is always handled on
        // the thread that ran the interrupted vCPU); the VMM's own memory is not a guest's.
        context == SampledContext::Guest(self.me)
    }

    fn read_sampled(&mut self, context: SampledContext, address: u64, out: &mut [u8]) -> bool {
        if context != SampledContext::Guest(self.me) {
            return false;
        }
        self.state.paging.read(&self.vm.mem, address, out)
    }

    fn resume_regs(&self, vcpu: VcpuId) -> Option<Regs> {
        // A vCPU is switched in by the thread that runs it next, with its own platform view:
        // its registers at its last exit are where it resumes.
        (vcpu == self.me).then_some(self.state.regs)
    }

    fn interrupted(&self, _pcpu: u32) -> Interrupted {
        match self.state.hypervisor {
            Some(activity) => Interrupted::Hypervisor {
                regs: activity.regs(),
                on_behalf_of: Some((self.me, self.state.regs)),
            },
            None => Interrupted::Guest {
                vcpu: self.me,
                regs: self.state.regs,
            },
        }
    }

    fn interruption(&self, _pcpu: u32) -> Interruption {
        match self.state.hypervisor {
            Some(_) => Interruption::Hypervisor {
                on_behalf_of: Some(self.me),
            },
            None => Interruption::Guest(self.me),
        }
    }

    fn diagnostic(&mut self, diagnostic: Diagnostic) {
        // Rate limit: the first few per vCPU only.
        self.state.diagnostics += 1;
        if self.state.diagnostics <= 8 {
            eprintln!("vpmu diagnostic: {diagnostic:?}");
        }
    }
}

/// Sends an MSI for `vector` to LAPIC `apic_id` of `vm`.
fn msi(vm: &Vm, apic_id: u32, vector: u8) -> bool {
    let msi = kvm_msi {
        address_lo: 0xFEE0_0000 | apic_id << 12,
        data: u32::from(vector),
        ..Default::default()
    };
    matches!(vm.vm.signal_msi(msi), Ok(n) if n > 0)
}

/// The `XENPMU_REGS_MODE_*` code-size bit of the interrupted context: 64-bit (CS.L), 32-bit
/// (compatibility or protected mode, CS.D), 16-bit, or real mode (CR0.PE clear).
fn code_size(s: &kvm_sync_regs) -> u32 {
    let cs = &s.sregs.cs;
    if s.sregs.cr0 & 1 == 0 {
        XENPMU_REGS_MODE_REAL
    } else if cs.l != 0 && s.sregs.efer & (1 << 10) != 0 {
        XENPMU_REGS_MODE_64
    } else if cs.db != 0 {
        XENPMU_REGS_MODE_32
    } else {
        XENPMU_REGS_MODE_16
    }
}

/// The interrupted-context registers, from sync regs.
/// The paging state in sync regs.
pub(super) fn paging_of(s: &kvm_sync_regs) -> Paging {
    Paging {
        cr0: s.sregs.cr0,
        cr3: s.sregs.cr3,
        cr4: s.sregs.cr4,
        efer: s.sregs.efer,
    }
}

pub(super) fn regs_of(s: &kvm_sync_regs) -> Regs {
    let r = &s.regs;
    let cpl = (s.sregs.cs.selector & 3) as u8;
    Regs {
        rax: r.rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rbp: r.rbp,
        rsp: r.rsp,
        r8: r.r8,
        r9: r.r9,
        r10: r.r10,
        r11: r.r11,
        r12: r.r12,
        r13: r.r13,
        r14: r.r14,
        r15: r.r15,
        rip: r.rip,
        rflags: r.rflags,
        cs: s.sregs.cs.selector,
        ss: s.sregs.ss.selector,
        ds: s.sregs.ds.selector,
        es: s.sregs.es.selector,
        fs: s.sregs.fs.selector,
        gs: s.sregs.gs.selector,
        cpl,
        mode: code_size(s) | if cpl == 3 { XENPMU_REGS_MODE_USER } else { 0 },
        ..Regs::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GuestMem, Layout, VcpuIndex};

    #[test]
    fn page_slots_refuse_frames_that_do_not_fit_32_bits() {
        // Domain 1's frame 5 and domain 0's frame 2^32 + 5 would share a slot unmasked.
        let slot = slot_of(1, 5).expect("fits");
        assert_eq!(page_of(slot), (1, 5));
        assert_eq!(slot_of(0, (1 << 32) | 5), None);
        assert_eq!(slot_of(0, u64::MAX), None);
        let last = slot_of(u32::MAX, u64::from(u32::MAX)).expect("fits");
        assert_eq!(page_of(last), (u32::MAX, u64::from(u32::MAX)));
    }

    #[test]
    fn only_the_changed_words_of_a_page_copy_are_written_back() {
        let mem = GuestMem::new(1 << 20).expect("memory");
        let bytes: Vec<u8> = (1..=24).collect();
        mem.write(0x1000, &bytes).expect("in RAM");
        let before = mem.to_vec(0x1000, 24).expect("in RAM");
        let mut after = before.clone();
        after[1] = 20; // word 0
        after[17] = 60; // word 2
        // The guest writes word 1 meanwhile: the write-back leaves it.
        mem.write(0x1008, &[80; 8]).expect("in RAM");
        write_changes(&mem, 0x1000, &before, &after);
        let mut want = after.clone();
        want[8..16].copy_from_slice(&[80; 8]);
        assert_eq!(mem.to_vec(0x1000, 24), Some(want));
    }

    #[test]
    fn queued_deliveries_can_be_dropped() {
        let index = VcpuIndex::new(&[2, 1]);
        let (tx, _rx) = std::sync::mpsc::channel();
        let host = Host::new(Layout::SharedPcpu(2), index, vec![tx]);
        let to = VcpuId { domain: 0, vcpu: 1 };
        let pmi = QueuedPmi {
            to,
            mask_on_delivery: true,
            context: PmiContext {
                rip: 0x1000,
                cpl: 0,
                mode: XENPMU_REGS_MODE_64,
            },
        };
        assert!(host.queue_lvtpc(pmi) && host.queue_lvtpc(pmi));
        assert!(host.has_queued(to));
        assert_eq!(host.drop_queued(VcpuId { domain: 1, vcpu: 0 }), 0);
        assert_eq!(host.drop_queued(to), 2);
        assert!(!host.has_queued(to));
        assert!(host.take_queued(to).is_empty());
        assert_eq!(host.drop_queued(to), 0);
        let ids: Vec<VcpuId> = host.vcpu_ids().collect();
        assert_eq!(
            ids,
            [(0, 0), (0, 1), (1, 0)].map(|(domain, vcpu)| VcpuId { domain, vcpu })
        );
    }

    #[test]
    fn code_size_follows_cs_and_cr0() {
        let mut s = kvm_sync_regs::default();
        assert_eq!(code_size(&s), XENPMU_REGS_MODE_REAL);
        s.sregs.cr0 = 0x8000_0011;
        s.sregs.efer = 0x500;
        s.sregs.cs.l = 1;
        assert_eq!(code_size(&s), XENPMU_REGS_MODE_64);
        // Compatibility mode: a 32-bit code segment under long mode.
        s.sregs.cs.l = 0;
        s.sregs.cs.db = 1;
        assert_eq!(code_size(&s), XENPMU_REGS_MODE_32);
        s.sregs.cs.db = 0;
        assert_eq!(code_size(&s), XENPMU_REGS_MODE_16);
        s.sregs.cs.selector = 0x1b;
        let regs = regs_of(&s);
        assert_eq!(regs.cpl, 3);
        assert_eq!(regs.mode, XENPMU_REGS_MODE_16 | XENPMU_REGS_MODE_USER);
    }

    #[test]
    fn user_mode_64bit_context() {
        // 64-bit user code as the guest runtime enters it: CS 0x2b (L), SS 0x23.
        let mut s = kvm_sync_regs::default();
        s.sregs.cr0 = 0x8000_0033;
        s.sregs.efer = 0x500;
        s.sregs.cs.l = 1;
        s.sregs.cs.selector = 0x2b;
        s.sregs.ss.selector = 0x23;
        s.regs.rip = 0x4010_2345;
        let regs = regs_of(&s);
        assert_eq!((regs.cpl, regs.cs, regs.ss), (3, 0x2b, 0x23));
        assert_eq!(regs.mode, XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_USER);
        let context = PmiContext {
            rip: regs.rip,
            cpl: regs.cpl,
            mode: regs.mode,
        };
        assert_eq!(context.port_value(), 0xc010_2345);
        // Kernel code: CPL0, no USER bit.
        s.sregs.cs.selector = 0x8;
        let regs = regs_of(&s);
        assert_eq!((regs.cpl, regs.mode), (0, XENPMU_REGS_MODE_64));
    }
}
