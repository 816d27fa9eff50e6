//! Guest control operations (init, finish, flush, LVTPC, mode and feature set) and the
//! check of each answer against what the operation may legally return.

use std::sync::atomic::Ordering;

use vpmu::abi::ops::{OpError, Params, is_valid_features, is_valid_mode};
use vpmu::abi::{
    PageViewMut, XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS, XENPMU_FEATURE_IPC_ONLY,
    XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF, XENPMU_OP_FEATURE_SET,
    XENPMU_OP_FINISH, XENPMU_OP_FLUSH, XENPMU_OP_INIT, XENPMU_OP_LVTPC_SET, XENPMU_OP_MODE_SET,
};
use vpmu::{Mode, VcpuId};

use vpmu_sim::SimVendor;

use crate::smp::shared::{FRAMES_PER_DOMAIN, guest_frame, lock};

use super::{OpKind, Runner};

impl<V: SimVendor> Runner<'_, V> {
    fn sibling(&mut self, x: VcpuId) -> VcpuId {
        VcpuId {
            domain: x.domain,
            vcpu: self
                .rng
                .below(u64::from(self.shared.vcpu_counts[x.domain as usize]))
                as u32,
        }
    }

    pub(super) fn init(&mut self, x: VcpuId) {
        let target = if self.rng.chance(3, 4) {
            x
        } else {
            self.sibling(x)
        };
        let foreign = self.rng.chance(1, 20);
        let gfn = if foreign {
            guest_frame((x.domain + 1) % self.shared.vcpu_counts.len() as u32, 0)
        } else {
            guest_frame(x.domain, self.rng.below(FRAMES_PER_DOMAIN))
        };
        let mode_before = self.vpmu.mode();
        let result = self.op(x, XENPMU_OP_INIT, &Params::new(gfn, target.vcpu));
        let switching = mode_before.switches_contexts() && self.vpmu.mode().switches_contexts();
        match result {
            Ok(_) if foreign => {
                self.find("foreign frame registered", format!("{x:?} frame {gfn:#x}"))
            }
            Ok(_) => {
                self.shared.coverage.hit("pages registered");
                if target == x && self.rng.chance(3, 4) {
                    self.lvtpc_set(x, false);
                }
            }
            Err(OpError::InvalidArgument) if foreign => {}
            Err(OpError::AlreadyRegistered) => {}
            Err(OpError::FrameInUse) => self
                .shared
                .coverage
                .hit("registrations refused: frame in use"),
            Err(OpError::NoVpmu) if !switching || x.domain == 0 => {}
            Err(e) => self.find(
                "init answered an impossible error",
                format!("{x:?} for {target:?}: {e:?}"),
            ),
        }
    }

    pub(super) fn finish(&mut self, x: VcpuId) {
        let target = if self.rng.chance(1, 2) {
            x
        } else {
            self.sibling(x)
        };
        self.start_op(
            x,
            XENPMU_OP_FINISH,
            Params::new(0, target.vcpu),
            OpKind::Finish,
        );
    }

    pub(super) fn flush(&mut self, x: VcpuId) {
        self.start_op(x, XENPMU_OP_FLUSH, Params::new(0, 0), OpKind::Flush);
    }

    pub(super) fn lvtpc(&mut self, x: VcpuId) {
        if self.rng.chance(1, 2) {
            let masked = self.rng.chance(1, 5);
            lock(&self.shared.vlapics[self.shared.flat(x)]).masked = masked;
            self.note(format!("{x:?} vLAPIC LVTPC masked {masked}"));
        } else {
            let masked = self.rng.chance(1, 4);
            self.lvtpc_set(x, masked);
        }
    }

    /// `x` writes its page's LVTPC mask and tells the hypervisor.
    fn lvtpc_set(&mut self, x: VcpuId, masked: bool) {
        if let Some(slot) = self.table.lock(x).pmu.page() {
            self.shared.with_mapped(slot.0, |page| {
                if let Ok(mut view) = PageViewMut::new(page) {
                    view.set_lvtpc_masked(masked);
                }
            });
        }
        match self.op(x, XENPMU_OP_LVTPC_SET, &Params::new(0, 0)) {
            Ok(_) | Err(OpError::NoVpmu) => {}
            Err(e) => self.find(
                "lvtpc_set answered an impossible error",
                format!("{x:?}: {e:?}"),
            ),
        }
    }

    pub(super) fn mode_set(&mut self, x: VcpuId) {
        let quiet = self.shared.quiet.load(Ordering::SeqCst);
        let target = if self.rng.chance(1, 20) {
            XENPMU_MODE_SELF | XENPMU_MODE_HV
        } else if quiet {
            self.rng.pick(&[
                XENPMU_MODE_ALL,
                XENPMU_MODE_ALL,
                XENPMU_MODE_OFF,
                XENPMU_MODE_SELF,
            ])
        } else {
            self.rng.pick(&[
                XENPMU_MODE_SELF,
                XENPMU_MODE_HV,
                XENPMU_MODE_ALL,
                XENPMU_MODE_OFF,
            ])
        };
        {
            self.start_op(
                x,
                XENPMU_OP_MODE_SET,
                Params::new(target, 0),
                OpKind::ModeSet { target },
            );
        }
    }

    pub(super) fn feature_set(&mut self, x: VcpuId) {
        let features = if self.driver.is_intel() {
            self.rng.pick(&[
                0,
                XENPMU_FEATURE_INTEL_BTS,
                XENPMU_FEATURE_IPC_ONLY,
                XENPMU_FEATURE_ARCH_ONLY,
                XENPMU_FEATURE_IPC_ONLY | XENPMU_FEATURE_INTEL_BTS,
                XENPMU_FEATURE_IPC_ONLY | XENPMU_FEATURE_ARCH_ONLY,
            ])
        } else {
            self.rng.pick(&[0, XENPMU_FEATURE_INTEL_BTS])
        };
        {
            self.start_op(
                x,
                XENPMU_OP_FEATURE_SET,
                Params::new(features, 0),
                OpKind::FeatureSet { features },
            );
        }
    }

    pub(super) fn check_op(
        &mut self,
        caller: VcpuId,
        kind: OpKind,
        mode_before: Mode,
        result: Result<(), OpError>,
    ) {
        let mode_after = self.vpmu.mode();
        let allowed = match (kind, result) {
            (OpKind::ModeSet { target }, Err(OpError::InvalidArgument)) => !is_valid_mode(target),
            (OpKind::ModeSet { target }, Ok(())) => {
                self.shared.coverage.hit(match target {
                    XENPMU_MODE_OFF => "mode set to off",
                    XENPMU_MODE_SELF => "mode set to self",
                    XENPMU_MODE_HV => "mode set to hv",
                    _ => "mode set to all",
                });
                is_valid_mode(target)
            }
            (OpKind::ModeSet { target }, Err(OpError::Busy)) => {
                // Only leaving or entering the modes where every vCPU has a vPMU needs none
                // in use; self ⇄ hv never does (and no other change completed meanwhile).
                let swap = Mode::from_abi(target).is_some_and(Mode::switches_contexts)
                    && mode_before.switches_contexts()
                    && mode_after.switches_contexts();
                !swap
            }
            (OpKind::FeatureSet { features }, Err(OpError::InvalidArgument)) => {
                !is_valid_features(features)
            }
            (OpKind::FeatureSet { features }, Err(OpError::NotSupported)) => {
                !self.driver.is_intel() && features != 0
            }
            (OpKind::FeatureSet { features }, Ok(())) => {
                self.shared.coverage.hit("features set");
                is_valid_features(features) && (self.driver.is_intel() || features == 0)
            }
            (OpKind::FeatureSet { .. }, Err(OpError::Busy)) => true,
            (OpKind::Finish, Ok(())) => {
                self.shared.coverage.hit("finishes");
                true
            }
            (OpKind::Finish, Err(OpError::NoVpmu)) => true,
            (OpKind::Flush, Ok(())) => {
                self.shared.coverage.hit("flushes");
                true
            }
            (OpKind::Flush, Err(OpError::InvalidContext)) => {
                self.find(
                    "unedited page refused at flush (-EIO)",
                    format!("{caller:?}: the guest never edited its vendor area"),
                );
                true
            }
            (OpKind::Flush, Err(OpError::InvalidArgument | OpError::NoVpmu)) => true,
            _ => false,
        };
        if !allowed {
            self.find(
                "control operation answered an impossible result",
                format!("{caller:?} {kind:?}: {result:?} (mode {mode_before:?} -> {mode_after:?})"),
            );
        }
    }
}
