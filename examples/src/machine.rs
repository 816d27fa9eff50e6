//! The machine the toy hypervisor boots on: a CPUID and, per physical CPU, a PMU. Both are
//! software here (the `vpmu-models` PMUs, which behave like the hardware); on a real host the
//! CPUID is `raw_cpuid::CpuIdReaderNative` and the PMU is `vpmu::msr::hardware`'s bus.

use vpmu_models::amd::AmdPmuModel;
use vpmu_models::intel::{IntelPmuModel, SyntheticCpuid};
use vpmu_models::shapes::{ALL_EVENTS, Shape, VendorShape};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_vendor_any::raw_cpuid::{CpuIdReader, CpuIdResult};
use vpmu_vendor_any::vpmu::{Msr, MsrBus, MsrFault};

const ZERO: CpuIdResult = CpuIdResult {
    eax: 0,
    ebx: 0,
    ecx: 0,
    edx: 0,
};

/// A machine of one of the four test shapes (`intel-v5`, `intel-v2`, `amd-perfmonv2`,
/// `amd-k7`).
#[derive(Clone, Copy, Debug)]
pub struct Machine {
    /// The PMU shape of every CPU of the machine.
    pub shape: Shape,
}

impl Machine {
    /// What CPUID answers on this machine: the hypervisor's only way to learn its vendor.
    pub fn cpuid(&self) -> MachineCpuid {
        if let Some(intel) = self.shape.intel(ALL_EVENTS) {
            return MachineCpuid::Intel(intel.cpuid);
        }
        let amd = self.shape.amd().expect("every shape is Intel's or AMD's");
        // The leaves an AMD CPU of this PMU reports: exactly what the backend gives a guest.
        let leaves = amd.caps().guest_leaves();
        MachineCpuid::Amd {
            max_extended_leaf: leaves.max_extended_leaf,
            ext_features_ecx: leaves.ext_features,
            perfmon: leaves.perfmon,
        }
    }

    /// IA32_PERF_CAPABILITIES, as RDMSR of it on this machine gives it (`None`: it faults).
    pub fn read_perf_capabilities(&self) -> Option<u64> {
        self.shape
            .intel(ALL_EVENTS)
            .and_then(|intel| intel.perf_capabilities)
    }

    /// The PMU of one physical CPU, in its power-on state.
    pub fn pmu(&self) -> MachinePmu {
        match (self.shape.intel(ALL_EVENTS), self.shape.amd()) {
            (Some(intel), _) => MachinePmu::Intel(intel.model()),
            (_, Some(amd)) => MachinePmu::Amd(amd.model()),
            (None, None) => unreachable!("every shape is Intel's or AMD's"),
        }
    }
}

/// The machine's CPUID, as raw-cpuid's `CpuIdReader`.
#[derive(Clone, Copy, Debug)]
pub enum MachineCpuid {
    /// A "GenuineIntel" CPU (leaves 0, 1 and 0xA of the PMU's shape).
    Intel(SyntheticCpuid),
    /// An "AuthenticAMD" CPU (leaf 0 and the PMU's extended leaves).
    Amd {
        /// `0x8000_0000` EAX.
        max_extended_leaf: u32,
        /// `0x8000_0001` ECX.
        ext_features_ecx: u32,
        /// `0x8000_0022` EAX, EBX, ECX, EDX.
        perfmon: [u32; 4],
    },
}

impl CpuIdReader for MachineCpuid {
    fn cpuid2(&self, leaf: u32, subleaf: u32) -> CpuIdResult {
        match *self {
            MachineCpuid::Intel(cpuid) => cpuid.leaf(leaf, subleaf),
            MachineCpuid::Amd {
                max_extended_leaf,
                ext_features_ecx,
                perfmon,
            } => match leaf {
                0 => CpuIdResult {
                    eax: 0x10,
                    ebx: u32::from_le_bytes(*b"Auth"),
                    edx: u32::from_le_bytes(*b"enti"),
                    ecx: u32::from_le_bytes(*b"cAMD"),
                },
                0x8000_0000 => CpuIdResult {
                    eax: max_extended_leaf,
                    ..ZERO
                },
                0x8000_0001 => CpuIdResult {
                    ecx: ext_features_ecx,
                    ..ZERO
                },
                0x8000_0022 => CpuIdResult {
                    eax: perfmon[0],
                    ebx: perfmon[1],
                    ecx: perfmon[2],
                    edx: perfmon[3],
                },
                _ => ZERO,
            },
        }
    }
}

/// One physical CPU's PMU: the `MsrBus` the core drives, and the events the CPU executes.
#[derive(Clone, Debug)]
pub enum MachinePmu {
    /// An Intel architectural PMU.
    Intel(IntelPmuModel),
    /// An AMD core PMU.
    Amd(AmdPmuModel),
}

impl MachinePmu {
    /// The CPU retires one instruction in guest kernel mode.
    pub fn retire_guest_instruction(&mut self) {
        let guest_kernel = ExecMode {
            cpl: 0,
            host: false,
        };
        self.software()
            .count(HwEvent::Instructions, 1, guest_kernel);
    }

    /// Takes the PMU's interrupt line: whether it was raised (the CPU then takes the PMI).
    pub fn take_pmi(&mut self) -> bool {
        self.software().take_pmi()
    }

    fn software(&mut self) -> &mut dyn SoftwarePmu {
        match self {
            MachinePmu::Intel(model) => model,
            MachinePmu::Amd(model) => model,
        }
    }

    /// Whether any counter can count (enabled, and globally enabled where the PMU has a
    /// global control): what a pCPU's PMU must never be with no vCPU loaded.
    pub fn anything_can_count(&self) -> bool {
        match self {
            MachinePmu::Intel(model) => {
                let r = model.registers();
                let gp = (0..8)
                    .any(|i| r.event_selects[i] & (1 << 22) != 0 && r.global_ctrl & (1 << i) != 0);
                let fixed = (0..4).any(|i| {
                    (r.fixed_ctrl >> (4 * i)) & 0b11 != 0 && r.global_ctrl & (1 << (32 + i)) != 0
                });
                gp || fixed
            }
            MachinePmu::Amd(model) => !model.nothing_can_count(),
        }
    }
}

impl MsrBus for MachinePmu {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        match self {
            MachinePmu::Intel(model) => model.read(msr),
            MachinePmu::Amd(model) => model.read(msr),
        }
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        match self {
            MachinePmu::Intel(model) => model.write(msr, value),
            MachinePmu::Amd(model) => model.write(msr, value),
        }
    }
}
