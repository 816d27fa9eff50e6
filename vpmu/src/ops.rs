//! The control operations, exactly as docs/abi.md specifies them: operation number, then
//! version, then privilege, then arguments, then state; an operation that fails changes
//! nothing, and its OUT fields are only produced on success.

use vpmu_abi::ops::{CoverageParams, Op, OpError, Params, is_valid_features, is_valid_mode};
use vpmu_abi::writer::{clear_cached, copy_vendor_area, guest_lvtpc_masked, init_page};
use vpmu_abi::{
    XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_SELF, XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR,
};

use crate::backend::PmuBackend;
use crate::core::{VcpuTable, Vpmu};
use crate::msr::MsrBus;
use crate::platform::{Diagnostic, MapError, Platform, VcpuId};
use crate::state::{PcpuPmu, VcpuPmu, VcpuState};

/// Features this backend can enforce; the Intel-only ones are refused elsewhere.
fn enforceable_features(vendor: crate::backend::Vendor) -> u64 {
    match vendor {
        crate::backend::Vendor::Intel => vpmu_abi::XENPMU_FEATURE_MASK,
        crate::backend::Vendor::Amd => 0,
    }
}

impl<B: PmuBackend> Vpmu<B> {
    /// Runs control operation `op` for `caller` with the parameter block `params` (already
    /// copied in from guest memory). On success returns the block to copy back (OUT fields
    /// filled in); on failure nothing has changed and nothing is to be copied back.
    pub fn control_op<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpus: &mut T,
        caller: VcpuId,
        op: u32,
        params: &Params,
    ) -> Result<Params, OpError> {
        let op = Op::from_number(op)?;
        if op == Op::Coverage {
            // Its own block layout and checks (coverage.rs); independent of the PMU.
            return self
                .coverage_op(platform, caller, &CoverageParams::from(*params))
                .map(Params::from);
        }
        if !self.available {
            return Err(OpError::NotSupported);
        }
        if op != Op::ModeGet && params.version.major != u32::from(XENPMU_VERSION_MAJOR) {
            return Err(OpError::VersionMismatch);
        }
        let privileged = platform.privileged_domain();
        if op.is_privileged() && caller.domain != privileged {
            return Err(OpError::NotPrivileged);
        }
        let takes_vcpu = matches!(op, Op::Init | Op::Finish);
        let takes_no_val = matches!(op, Op::LvtpcSet | Op::Flush);
        if params._pad0 != 0
            || (!takes_vcpu && params.vcpu != 0)
            || (takes_no_val && params.val != 0)
        {
            return Err(OpError::InvalidArgument);
        }
        let mut out = *params;
        match op {
            Op::ModeGet => {
                out.val = self.mode;
                out.version.major = u32::from(XENPMU_VERSION_MAJOR);
                out.version.minor = u32::from(XENPMU_VERSION_MINOR);
            }
            Op::FeatureGet => out.val = self.features,
            Op::ModeSet => self.mode_set(platform, pcpus, vcpus, caller, params.val)?,
            Op::FeatureSet => self.feature_set(platform, caller, params.val)?,
            Op::Init => self.init(platform, vcpus, caller, params)?,
            Op::Finish => {
                let target = self.target(platform, vcpus, caller, params.vcpu)?;
                if target.page.is_none() {
                    return Err(OpError::NoVpmu);
                }
                self.teardown_vcpu(platform, pcpus, target)
                    .map_err(|_| OpError::InvalidContext)?;
            }
            Op::LvtpcSet => {
                let vcpu = vcpus.get_mut(caller).ok_or(OpError::InvalidArgument)?;
                let slot = vcpu.page.ok_or(OpError::NoVpmu)?;
                let lvtpc = platform
                    .with_page(slot, |page| page.lapic_lvtpc)
                    .ok_or(OpError::NoVpmu)?;
                // While a sample is cached the new mask applies at flush, which reads it again.
                if vcpu.state != VcpuState::Cached {
                    vcpu.page_lvtpc_masked = guest_lvtpc_masked(lvtpc);
                }
            }
            // Returned above.
            Op::Coverage => return Err(OpError::NotSupported),
            Op::Flush => {
                let vcpu = vcpus.get_mut(caller).ok_or(OpError::InvalidArgument)?;
                self.flush(platform, pcpus, vcpu)?;
            }
        }
        Ok(out)
    }

    fn target<'t, P: Platform, T: VcpuTable<B::Context>>(
        &self,
        platform: &P,
        vcpus: &'t mut T,
        caller: VcpuId,
        vcpu: u32,
    ) -> Result<&'t mut VcpuPmu<B::Context>, OpError> {
        let count = platform
            .vcpu_count(caller.domain)
            .ok_or(OpError::InvalidArgument)?;
        if vcpu >= count {
            return Err(OpError::InvalidArgument);
        }
        vcpus
            .get_mut(VcpuId {
                domain: caller.domain,
                vcpu,
            })
            .ok_or(OpError::InvalidArgument)
    }

    fn mode_set<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpus: &mut T,
        caller: VcpuId,
        mode: u64,
    ) -> Result<(), OpError> {
        if !is_valid_mode(mode) {
            return Err(OpError::InvalidArgument);
        }
        if mode == self.mode {
            return Ok(());
        }
        let self_hv_swap = (self.mode ^ mode) == (XENPMU_MODE_SELF | XENPMU_MODE_HV);
        if self.unprivileged_in_use > 0 && !self_hv_swap {
            platform.diagnostic(Diagnostic::ChangeRefusedBusy { caller });
            return Err(OpError::Busy);
        }
        if !self_hv_swap {
            // Only privileged contexts can be live here; take them all off the hardware so the
            // new mode starts from clean PMUs. A hardware fault here is a hypervisor bug, and
            // the mode is left as it was.
            self.quiesce(platform, pcpus, vcpus)
                .map_err(|_| OpError::InvalidContext)?;
        }
        self.mode = mode;
        if mode != XENPMU_MODE_ALL && !self_hv_swap {
            // Privileged vCPUs that are running pick their saved contexts up again.
            let privileged = platform.privileged_domain();
            let mut result = Ok(());
            vcpus.for_each_in_domain(privileged, &mut |vcpu| {
                if result.is_ok() {
                    result = self.load_if_active(pcpus, vcpu);
                }
            });
            result.map_err(|_| OpError::InvalidContext)?;
        }
        Ok(())
    }

    fn feature_set<P: Platform>(
        &mut self,
        platform: &mut P,
        caller: VcpuId,
        features: u64,
    ) -> Result<(), OpError> {
        if !is_valid_features(features) {
            return Err(OpError::InvalidArgument);
        }
        if features & !enforceable_features(self.backend.capabilities().vendor) != 0 {
            return Err(OpError::NotSupported);
        }
        if features == self.features {
            return Ok(());
        }
        if self.unprivileged_in_use > 0 {
            platform.diagnostic(Diagnostic::ChangeRefusedBusy { caller });
            return Err(OpError::Busy);
        }
        self.features = features;
        Ok(())
    }

    fn init<P: Platform, T: VcpuTable<B::Context>>(
        &mut self,
        platform: &mut P,
        vcpus: &mut T,
        caller: VcpuId,
        params: &Params,
    ) -> Result<(), OpError> {
        let privileged = platform.privileged_domain();
        let target = self.target(platform, vcpus, caller, params.vcpu)?;
        // The frame is an argument: an invalid one is refused before any state check (check
        // order, docs/abi.md). Only mapping can tell, so map first and undo it if a state
        // check fails; running out of room is a resource error, reported after them.
        let mapped = platform.map_page(caller.domain, params.val);
        if mapped == Err(MapError::InvalidFrame) {
            return Err(OpError::InvalidArgument);
        }
        let state = if !self.has_vpmu(privileged, target.id) {
            Err(OpError::NoVpmu)
        } else if target.page.is_some() {
            Err(OpError::AlreadyRegistered)
        } else {
            Ok(())
        };
        if let Err(error) = state {
            if let Ok(slot) = mapped {
                platform.unmap_page(slot);
            }
            return Err(error);
        }
        let slot = mapped.map_err(|_| OpError::MapFailed)?;
        let layout = self.backend.page_layout();
        if platform
            .with_page(slot, |page| init_page(page, &layout))
            .is_none()
        {
            platform.unmap_page(slot);
            return Err(OpError::MapFailed);
        }
        let was_in_use = target.in_use();
        target.page = Some(slot);
        target.page_lvtpc_masked = true;
        self.track_use(privileged, target, was_in_use);
        Ok(())
    }

    /// Ends the cached window: copy the vendor area, verify it as WRMSRs would be, load it.
    fn flush<P: Platform, H: MsrBus>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), OpError> {
        let slot = vcpu.page.ok_or(OpError::NoVpmu)?;
        if vcpu.state != VcpuState::Cached {
            return Err(OpError::InvalidArgument);
        }
        let (area, lvtpc) = platform
            .with_page(slot, |page| (copy_vendor_area(page), page.lapic_lvtpc))
            .ok_or(OpError::NoVpmu)?;
        let policy = self.policy(platform, vcpu.id.domain);
        let system_pcpu = if self.mode == XENPMU_MODE_ALL {
            vcpu.cached_from
        } else {
            None
        };
        let verified = match system_pcpu {
            Some(p) => {
                let saved = pcpus
                    .get(p as usize)
                    .and_then(|cpu| cpu.system.as_ref())
                    .ok_or(OpError::InvalidArgument)?;
                self.backend.context_from_page(&area, saved, &policy)
            }
            None => self.backend.context_from_page(&area, &vcpu.ctx, &policy),
        };
        let context = match verified {
            Ok(context) => context,
            Err(error) => {
                platform.diagnostic(Diagnostic::InvalidContextAtFlush {
                    vcpu: vcpu.id,
                    register: error.register,
                });
                return Err(OpError::InvalidContext);
            }
        };
        let from = vcpu.cached_from;
        match system_pcpu {
            Some(p) => {
                let cpu = pcpus.get_mut(p as usize).ok_or(OpError::InvalidArgument)?;
                self.backend
                    .load(&context, &mut cpu.hw)
                    .map_err(|_| OpError::InvalidContext)?;
                cpu.system = Some(context);
                cpu.system_cached = false;
                vcpu.state = VcpuState::Saved;
            }
            None => {
                vcpu.ctx = context;
                vcpu.state = VcpuState::Saved;
                self.load_if_active(pcpus, vcpu)
                    .map_err(|_| OpError::InvalidContext)?;
            }
        }
        vcpu.cached_from = None;
        vcpu.page_lvtpc_masked = guest_lvtpc_masked(lvtpc);
        platform.with_page(slot, clear_cached);
        if let Some(p) = from {
            self.unmask_physical_lvtpc(platform, pcpus, p);
        }
        Ok(())
    }
}
