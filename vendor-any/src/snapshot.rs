//! [`VendorPmu`] as the core's [`SnapshotBackend`]: the vendor backend's own register list and
//! validators, with the context of that vendor. The other vendor's context (an integration
//! bug, see the `backend` module) lists nothing and is never written: rebuilding into it is
//! refused without touching it.

use vpmu::snapshot::{Registers, SnapshotBackend};
use vpmu::{ContextError, GuestPolicy, PmuBackend};

use crate::VendorPmu;
use crate::backend::{FOREIGN_STATE_MSR, VendorContext};

impl SnapshotBackend for VendorPmu {
    fn context_registers(&self, ctx: &VendorContext, out: &mut Registers) {
        match (self, ctx) {
            (VendorPmu::Intel(pmu), VendorContext::Intel(ctx)) => pmu.context_registers(ctx, out),
            (VendorPmu::Amd(pmu), VendorContext::Amd(ctx)) => pmu.context_registers(ctx, out),
            _ => *out = Registers::new(),
        }
    }

    fn context_from_registers(
        &self,
        registers: &Registers,
        policy: &GuestPolicy<'_>,
        out: &mut VendorContext,
    ) -> Result<(), ContextError> {
        // A context of this backend's vendor to rebuild into, whatever `out` was.
        let mut ctx = self.new_context();
        let rebuilt = match (self, &mut ctx) {
            (VendorPmu::Intel(pmu), VendorContext::Intel(ctx)) => {
                pmu.context_from_registers(registers, policy, ctx)
            }
            (VendorPmu::Amd(pmu), VendorContext::Amd(ctx)) => {
                pmu.context_from_registers(registers, policy, ctx)
            }
            _ => Err(ContextError {
                register: "context of the other vendor",
                index: None,
                value: 0,
                msr: FOREIGN_STATE_MSR.0,
                reason: vpmu::abi::XENPMU_REFUSED_ABSENT,
            }),
        };
        rebuilt.map(|()| *out = ctx)
    }
}
