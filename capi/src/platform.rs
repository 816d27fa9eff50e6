//! The callback tables as the core's traits: [`CMsrBus`] is a pCPU's `MsrBus`, [`CPlatform`]
//! the `Platform` of one call on one pCPU. Every C call is here, each behind the one check
//! its table's contract leaves: the callback is present.

use std::ffi::c_void;
use std::sync::Arc;

use vpmu_abi::{Page, Regs};
use vpmu_vendor_any::vpmu::{
    CrossCpuRequest, Diagnostic, EventFilter, Interrupted, LvtpcDelivery, MapError, Msr, MsrBus,
    MsrFault, PageSlot, Platform, RingSlot, SampledContext, VcpuId,
};
use zerocopy::IntoBytes;

use crate::callbacks::{
    VPMU_INTERRUPTED_GUEST, VPMU_LVTPC_DELIVERED, VPMU_LVTPC_QUEUED, VPMU_REQUEST_CATCH_UP,
    VPMU_REQUEST_DROP_SYSTEM, VPMU_REQUEST_RESUME_SYSTEM, VPMU_REQUEST_SYSTEM_WRITE,
    VPMU_REQUEST_TEARDOWN, VPMU_SAMPLED_GUEST, VPMU_SAMPLED_HYPERVISOR, VpmuDiagnostic,
    VpmuDiagnosticKind, VpmuInterrupted, VpmuMsrOps, VpmuPlatformOps, VpmuRequest,
};
use crate::handles::{Filters, VcpuRegistry};

/// A pCPU's MSR bus: the C table and its context.
#[derive(Debug)]
pub(crate) struct CMsrBus {
    pub(crate) ops: VpmuMsrOps,
    pub(crate) ctx: *mut c_void,
}

impl MsrBus for CMsrBus {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        let Some(rdmsr) = self.ops.rdmsr else {
            return Err(MsrFault { msr });
        };
        let mut value = 0;
        // SAFETY: `vpmu_pcpu_attach` took the table and its context from the caller, who
        // promised they stay valid until detach; `value` is a live local.
        let status = unsafe { rdmsr(self.ctx, msr.0, &mut value) };
        if status == 0 {
            Ok(value)
        } else {
            Err(MsrFault { msr })
        }
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        let Some(wrmsr) = self.ops.wrmsr else {
            return Err(MsrFault { msr });
        };
        // SAFETY: as in `read`: the caller's table and context, valid until detach.
        let status = unsafe { wrmsr(self.ctx, msr.0, value) };
        if status == 0 {
            Ok(())
        } else {
            Err(MsrFault { msr })
        }
    }
}

/// The platform of one entry point on one pCPU: the C table, that pCPU's context, and what
/// the library answers itself (the privileged domain, vCPU counts from its table, the event
/// filters, a snapshot of which is held for the call).
pub(crate) struct CPlatform<'a> {
    pub(crate) ops: &'a VpmuPlatformOps,
    pub(crate) ctx: *mut c_void,
    pub(crate) privileged: u32,
    pub(crate) vcpus: &'a VcpuRegistry,
    pub(crate) filters: Arc<Filters>,
}

/// Every domain without a filter of its own counts every event.
static NO_FILTER: vpmu_vendor_any::vpmu::AllowAll = vpmu_vendor_any::vpmu::AllowAll;

/// A request as C data.
pub(crate) fn request_to_c(request: CrossCpuRequest) -> VpmuRequest {
    let of = |kind, id: VcpuId| VpmuRequest {
        kind,
        domain: id.domain,
        vcpu: id.vcpu,
        ..VpmuRequest::default()
    };
    match request {
        CrossCpuRequest::CatchUp => VpmuRequest::default(),
        CrossCpuRequest::Teardown { vcpu } => of(VPMU_REQUEST_TEARDOWN, vcpu),
        CrossCpuRequest::SystemWrite {
            profiler,
            msr,
            value,
        } => VpmuRequest {
            msr: msr.0,
            value,
            ..of(VPMU_REQUEST_SYSTEM_WRITE, profiler)
        },
        CrossCpuRequest::ResumeSystem { profiler } => of(VPMU_REQUEST_RESUME_SYSTEM, profiler),
        CrossCpuRequest::DropSystem { profiler } => of(VPMU_REQUEST_DROP_SYSTEM, profiler),
    }
}

/// A request from C data; `None` for an unknown kind.
pub(crate) fn request_from_c(request: &VpmuRequest) -> Option<CrossCpuRequest> {
    let id = VcpuId {
        domain: request.domain,
        vcpu: request.vcpu,
    };
    Some(match request.kind {
        VPMU_REQUEST_CATCH_UP => CrossCpuRequest::CatchUp,
        VPMU_REQUEST_TEARDOWN => CrossCpuRequest::Teardown { vcpu: id },
        VPMU_REQUEST_SYSTEM_WRITE => CrossCpuRequest::SystemWrite {
            profiler: id,
            msr: Msr(request.msr),
            value: request.value,
        },
        VPMU_REQUEST_RESUME_SYSTEM => CrossCpuRequest::ResumeSystem { profiler: id },
        VPMU_REQUEST_DROP_SYSTEM => CrossCpuRequest::DropSystem { profiler: id },
        _ => return None,
    })
}

/// A diagnostic as C data.
fn diagnostic_to_c(diagnostic: Diagnostic) -> VpmuDiagnostic {
    let mut out = VpmuDiagnostic {
        kind: VpmuDiagnosticKind::SampleDropped,
        domain: 0,
        vcpu: 0,
        other_domain: 0,
        other_vcpu: 0,
        register_name: [0; 32],
    };
    let (kind, vcpu, register) = match diagnostic {
        Diagnostic::InvalidContextAtFlush { vcpu, register } => {
            (VpmuDiagnosticKind::InvalidContextAtFlush, vcpu, register)
        }
        Diagnostic::ChangeRefusedBusy { caller } => {
            (VpmuDiagnosticKind::ChangeRefusedBusy, caller, "")
        }
        Diagnostic::RestrictedByPolicy { vcpu, register } => {
            (VpmuDiagnosticKind::RestrictedByPolicy, vcpu, register)
        }
        Diagnostic::SampleDropped { vcpu } => (VpmuDiagnosticKind::SampleDropped, vcpu, ""),
        Diagnostic::PmiOfAnotherVcpu {
            loaded,
            interrupted,
        } => {
            (out.other_domain, out.other_vcpu) = (interrupted.domain, interrupted.vcpu);
            (VpmuDiagnosticKind::PmiOfAnotherVcpu, loaded, "")
        }
        Diagnostic::PublishedImagesDiffer { vcpu } => {
            (VpmuDiagnosticKind::PublishedImagesDiffer, vcpu, "")
        }
    };
    out.kind = kind;
    (out.domain, out.vcpu) = (vcpu.domain, vcpu.vcpu);
    // Truncated to leave the NUL (the backends' names are short).
    let name = register.as_bytes();
    let len = name.len().min(out.register_name.len() - 1);
    out.register_name[..len].copy_from_slice(&name[..len]);
    out
}

/// A length that fits the callbacks' `u32`, or `None`.
fn len32(bytes: &[u8]) -> Option<u32> {
    u32::try_from(bytes.len()).ok()
}

/// A map callback's status as the core's result.
fn mapped(status: i32, slot: u64) -> Result<u64, MapError> {
    match status {
        0 => Ok(slot),
        s if s == -crate::error::VPMU_EINVAL => Err(MapError::InvalidFrame),
        _ => Err(MapError::NoMemory),
    }
}

impl Platform for CPlatform<'_> {
    fn privileged_domain(&self) -> u32 {
        self.privileged
    }

    fn vcpu_count(&self, domain: u32) -> Option<u32> {
        Some(self.vcpus.count(domain)).filter(|&n| n > 0)
    }

    fn event_filter(&self, domain: u32) -> &dyn EventFilter {
        match self.filters.get(&domain) {
            Some(filter) => filter,
            None => &NO_FILTER,
        }
    }

    fn map_page(&mut self, domain: u32, gfn: u64) -> Result<PageSlot, MapError> {
        let Some(map_page) = self.ops.map_page else {
            return Err(MapError::InvalidFrame);
        };
        let mut slot = 0;
        // SAFETY: the table and the pCPU's context were given by the caller as valid while
        // the vPMU and the pCPU exist (`vpmu_create`, `vpmu_pcpu_attach`); `slot` is a local.
        let status = unsafe { map_page(self.ctx, domain, gfn, &mut slot) };
        mapped(status, slot).map(PageSlot)
    }

    fn unmap_page(&mut self, slot: PageSlot) {
        if let Some(unmap_page) = self.ops.unmap_page {
            // SAFETY: the caller's table and context (see `map_page`).
            unsafe { unmap_page(self.ctx, slot.0) };
        }
    }

    /// The core works on a private copy read through `read_page`; the bytes it changed are
    /// written back through `write_page`, run by run.
    fn with_page<R>(&mut self, slot: PageSlot, access: impl FnOnce(&mut Page) -> R) -> Option<R> {
        let (read_page, write_page) = (self.ops.read_page?, self.ops.write_page?);
        let mut before = Box::new(Page::zeroed());
        // SAFETY: the caller's table and context (see `map_page`); `before` is a live
        // 4096-byte page, all of which `read_page` may write.
        let status = unsafe { read_page(self.ctx, slot.0, before.as_mut_bytes().as_mut_ptr()) };
        if status != 0 {
            return None;
        }
        let mut copy = before.clone();
        let result = access(&mut copy);
        let (old, new) = (before.as_bytes(), copy.as_bytes());
        let mut at = 0;
        while at < new.len() {
            if old[at] == new[at] {
                at += 1;
                continue;
            }
            let end = (at..new.len())
                .find(|&i| old[i] == new[i])
                .unwrap_or(new.len());
            let run = &new[at..end];
            // SAFETY: the caller's table and context; `run` lies within the 4096-byte copy,
            // so both casts are exact (a page offset and length fit u32).
            unsafe { write_page(self.ctx, slot.0, at as u32, run.as_ptr(), run.len() as u32) };
            at = end;
        }
        Some(result)
    }

    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, mask_on_delivery: bool) -> LvtpcDelivery {
        let Some(deliver) = self.ops.deliver_lvtpc_pmi else {
            return LvtpcDelivery::Masked;
        };
        // SAFETY: the caller's table and context (see `map_page`).
        match unsafe { deliver(self.ctx, vcpu.domain, vcpu.vcpu, mask_on_delivery) } {
            VPMU_LVTPC_DELIVERED => LvtpcDelivery::Delivered,
            VPMU_LVTPC_QUEUED => LvtpcDelivery::Queued,
            _ => LvtpcDelivery::Masked,
        }
    }

    fn raise_pmu_virq(&mut self, vcpu: VcpuId) {
        if let Some(raise) = self.ops.raise_pmu_virq {
            // SAFETY: the caller's table and context (see `map_page`).
            unsafe { raise(self.ctx, vcpu.domain, vcpu.vcpu) };
        }
    }

    fn send_request(&mut self, pcpu: u32, request: CrossCpuRequest) {
        if let Some(send) = self.ops.send_request {
            let request = request_to_c(request);
            // SAFETY: the caller's table and context; `request` is a live local the callback
            // copies before it returns.
            unsafe { send(self.ctx, pcpu, &request) };
        }
    }

    fn set_physical_lvtpc_masked(&mut self, pcpu: u32, masked: bool) {
        if let Some(set) = self.ops.set_physical_lvtpc_masked {
            // SAFETY: the caller's table and context (see `map_page`).
            unsafe { set(self.ctx, pcpu, masked) };
        }
    }

    fn interrupted(&self, pcpu: u32) -> Interrupted {
        let mut out = VpmuInterrupted::default();
        if let Some(interrupted) = self.ops.interrupted {
            // SAFETY: the caller's table and context; `out` is a live, zeroed local.
            unsafe { interrupted(self.ctx, pcpu, &mut out) };
        }
        let id = VcpuId {
            domain: out.domain,
            vcpu: out.vcpu,
        };
        if out.kind == VPMU_INTERRUPTED_GUEST {
            return Interrupted::Guest {
                vcpu: id,
                regs: out.regs,
            };
        }
        Interrupted::Hypervisor {
            regs: out.regs,
            on_behalf_of: (out.on_behalf_of != 0).then_some((id, out.vcpu_regs)),
        }
    }

    fn resume_regs(&self, vcpu: VcpuId) -> Option<Regs> {
        let resume_regs = self.ops.resume_regs?;
        let mut regs = Regs::default();
        // SAFETY: the caller's table and context; `regs` is a live local.
        unsafe { resume_regs(self.ctx, vcpu.domain, vcpu.vcpu, &mut regs) }.then_some(regs)
    }

    fn timestamp(&mut self) -> u64 {
        // SAFETY: the caller's table and context (see `map_page`).
        self.ops.timestamp.map_or(0, |f| unsafe { f(self.ctx) })
    }

    fn tsc_khz(&self) -> u64 {
        // SAFETY: the caller's table and context (see `map_page`).
        self.ops.tsc_khz.map_or(0, |f| unsafe { f(self.ctx) })
    }

    fn reads_sampled_memory(&self, _context: SampledContext) -> bool {
        self.ops.read_sampled.is_some()
    }

    fn read_sampled(&mut self, context: SampledContext, address: u64, out: &mut [u8]) -> bool {
        let (Some(read), Some(len)) = (self.ops.read_sampled, len32(out)) else {
            return false;
        };
        let (kind, id) = match context {
            SampledContext::Guest(id) => (VPMU_SAMPLED_GUEST, id),
            SampledContext::Hypervisor => (VPMU_SAMPLED_HYPERVISOR, VcpuId { domain: 0, vcpu: 0 }),
        };
        // SAFETY: the caller's table and context; `out` is `len` writable bytes.
        unsafe {
            read(
                self.ctx,
                kind,
                id.domain,
                id.vcpu,
                address,
                out.as_mut_ptr(),
                len,
            )
        }
    }

    fn diagnostic(&mut self, diagnostic: Diagnostic) {
        if let Some(report) = self.ops.diagnostic {
            let diagnostic = diagnostic_to_c(diagnostic);
            // SAFETY: the caller's table and context; `diagnostic` is a live local.
            unsafe { report(self.ctx, &diagnostic) };
        }
    }

    fn supports_ring(&self) -> bool {
        self.ops.ring()
    }

    fn read_guest(&mut self, domain: u32, address: u64, out: &mut [u8]) -> bool {
        let (Some(read), Some(len)) = (self.ops.read_guest, len32(out)) else {
            return false;
        };
        // SAFETY: the caller's table and context; `out` is `len` writable bytes.
        unsafe { read(self.ctx, domain, address, out.as_mut_ptr(), len) }
    }

    fn map_ring(&mut self, domain: u32, gfn: u64, frames: u32) -> Result<RingSlot, MapError> {
        let Some(map_ring) = self.ops.map_ring else {
            return Err(MapError::InvalidFrame);
        };
        let mut slot = 0;
        // SAFETY: the caller's table and context; `slot` is a live local.
        let status = unsafe { map_ring(self.ctx, domain, gfn, frames, &mut slot) };
        mapped(status, slot).map(RingSlot)
    }

    fn unmap_ring(&mut self, slot: RingSlot) {
        if let Some(unmap_ring) = self.ops.unmap_ring {
            // SAFETY: the caller's table and context (see `map_page`).
            unsafe { unmap_ring(self.ctx, slot.0) };
        }
    }

    fn ring_read(&mut self, slot: RingSlot, offset: u32, out: &mut [u8]) -> bool {
        let (Some(read), Some(len)) = (self.ops.ring_read, len32(out)) else {
            return false;
        };
        // SAFETY: the caller's table and context; `out` is `len` writable bytes.
        unsafe { read(self.ctx, slot.0, offset, out.as_mut_ptr(), len) }
    }

    fn ring_write(&mut self, slot: RingSlot, offset: u32, data: &[u8]) -> bool {
        let (Some(write), Some(len)) = (self.ops.ring_write, len32(data)) else {
            return false;
        };
        // SAFETY: the caller's table and context; `data` is `len` readable bytes.
        unsafe { write(self.ctx, slot.0, offset, data.as_ptr(), len) }
    }

    fn write_guest(&mut self, caller: VcpuId, address: u64, data: &[u8]) -> bool {
        let (Some(write), Some(len)) = (self.ops.write_guest, len32(data)) else {
            return false;
        };
        // SAFETY: the caller's table and context; `data` is `len` readable bytes.
        unsafe {
            write(
                self.ctx,
                caller.domain,
                caller.vcpu,
                address,
                data.as_ptr(),
                len,
            )
        }
    }
}
