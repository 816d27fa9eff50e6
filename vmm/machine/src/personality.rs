//! Vendor personalities: the backend, the software PMU model each pCPU gets, and the guest's
//! CPUID: the vendor string, and the PMU leaves the vendor crates synthesize from the
//! enumeration (`IntelCaps::guest_leaf_0xa`, `AmdCaps::guest_leaves`), edited into KVM's table.
//! The PMUs are the test shapes of `vpmu_models::shapes` (`intel-v5`, `intel-v2`,
//! `amd-perfmonv2`, `amd-k7`), which also build the backend and the model.
//!
//! Each personality runs under one event [`Source`], and what that source cannot count is
//! advertised as unavailable. Intel: through the leaf 0xA EBX vector and the fixed counters
//! present (precise: instructions, branches and core cycles, fixed counters 0 and 1; timed: core and reference
//! cycles, fixed counters 1 and 2 through the v5 bitmap; v2 keeps three contiguous fixed
//! counters, of which only the ones of its source count). AMD has no availability vector,
//! which is a limitation of the AMD personality: events its source cannot count are accepted
//! and never count.

use kvm_bindings::{CpuId, kvm_cpuid_entry2};
use vpmu::PmuBackend;
use vpmu_amd::{AmdPmu, CPUID_PERFMON_LEAF, PmuShape};
use vpmu_intel::IntelPmu;
use vpmu_models::SoftwarePmu;
use vpmu_models::amd::AmdPmuModel;
use vpmu_models::intel::IntelPmuModel;
use vpmu_models::shapes::{AmdShape, IntelShape, VendorShape};

/// Where the software PMU's events come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The VMM single-steps CPL0 code while a counter is enabled and counts every retired
    /// instruction and branch exactly.
    Precise,
    /// Core and reference cycles from the TSC while the vCPU runs (the `KVM_RUN` interval);
    /// overflow delivered by kicking the vCPU at the predicted time.
    Timed,
}

impl Source {
    /// Label.
    pub fn name(self) -> &'static str {
        match self {
            Source::Precise => "precise",
            Source::Timed => "timed",
        }
    }
}

/// Evaluates `$body` with `$p` bound to the personality of test shape `$shape` under event
/// source `$source` (each arm its own type: the body is generic code instantiated four times).
macro_rules! with_personality {
    ($shape:expr, $source:expr, |$p:ident| $body:expr) => {
        match $shape {
            vpmu_models::shapes::Shape::IntelV5 => {
                let $p = $crate::personality::Intel::v5($source);
                $body
            }
            vpmu_models::shapes::Shape::IntelV2 => {
                let $p = $crate::personality::Intel::v2($source);
                $body
            }
            vpmu_models::shapes::Shape::AmdPerfMonV2 => {
                let $p = $crate::personality::Amd::perfmon_v2($source);
                $body
            }
            vpmu_models::shapes::Shape::AmdK7 => {
                let $p = $crate::personality::Amd::k7($source);
                $body
            }
        }
    };
}
pub(crate) use with_personality;

/// A vendor personality.
pub trait Personality {
    /// The core's backend.
    type Backend: PmuBackend<Context: Send> + Send + Sync;
    /// The software PMU model of a pCPU.
    type Model: SoftwarePmu + Send + Clone;
    /// The event source.
    fn source(&self) -> Source;
    /// Label for reports.
    fn name(&self) -> String;
    /// A fresh backend.
    fn backend(&self) -> Self::Backend;
    /// A fresh model.
    fn model(&self) -> Self::Model;
    /// Whether any counter of `model` is enabled (the VMM single-steps only then).
    fn counting(&self, model: &Self::Model) -> bool;
    /// The event a write of `value` to PMU MSR `msr` enables that this personality's source
    /// never counts and that the guest was not told of: AMD's event select (it has no CPUID to
    /// say an event is unavailable). None for anything else (Intel's leaf 0xA says so).
    fn uncountable_event(&self, msr: u32, value: u64) -> Option<u16> {
        let _ = (msr, value);
        None
    }
    /// Edits the host's supported CPUID into this personality's.
    fn cpuid(&self, cpuid: &mut CpuId);
}

/// Sets (or adds) leaf `function`/`index`.
fn set_leaf(cpuid: &mut CpuId, function: u32, index: u32, regs: [u32; 4]) {
    let [eax, ebx, ecx, edx] = regs;
    if let Some(e) = cpuid
        .as_mut_slice()
        .iter_mut()
        .find(|e| e.function == function && e.index == index)
    {
        (e.eax, e.ebx, e.ecx, e.edx) = (eax, ebx, ecx, edx);
        return;
    }
    let entry = kvm_cpuid_entry2 {
        function,
        index,
        eax,
        ebx,
        ecx,
        edx,
        ..Default::default()
    };
    // A full table (KVM_MAX_CPUID_ENTRIES) would be a host oddity; the leaf then stays absent.
    let _ = cpuid.push(entry);
}

fn edit_leaf(cpuid: &mut CpuId, function: u32, edit: impl FnOnce(&mut kvm_cpuid_entry2)) {
    if let Some(e) = cpuid
        .as_mut_slice()
        .iter_mut()
        .find(|e| e.function == function && e.index == 0)
    {
        edit(e);
    }
}

/// CPUID.(EAX=7,ECX=0):EBX HLE (4) and RTM (11): TSX. XBEGIN at guest CPL0 raises #UD in
/// this host's KVM emulator, so no personality advertises TSX (a guest told of RTM counts
/// transactional cycles that cannot happen: kvm-unit-tests' `check_tsx_cycles`).
const LEAF7_EBX_TSX: u32 = 1 << 4 | 1 << 11;
/// CPUID.(EAX=7,ECX=0):EDX RTM_ALWAYS_ABORT (11) and TSX_FORCE_ABORT (13): TSX too.
const LEAF7_EDX_TSX: u32 = 1 << 11 | 1 << 13;
/// CPUID.1:ECX PDCM (IA32_PERF_CAPABILITIES).
const LEAF1_ECX_PDCM: u32 = 1 << 15;
/// CPUID.(EAX=7,ECX=0):EDX SPEC_CTRL (26): IBRS and IBPB, Intel's enumeration.
const LEAF7_EDX_SPEC_CTRL: u32 = 1 << 26;
/// CPUID.80000008H:EBX IBPB (12), AMD's enumeration.
const EXT8_EBX_AMD_IBPB: u32 = 1 << 12;

/// What every personality hides from the guest because the PMU model cannot keep the promise
/// it makes: TSX (above), and IBPB. The precise source has no branch predictor and counts no
/// mispredicted branches; a guest told of IBPB may rely on it to force one (kvm-unit-tests
/// x86/pmu then expects at least one branch miss, and without IBPB allows none). Hiding it
/// makes that expectation the same on every host, whatever its CPU enumerates.
fn hide_unusable(cpuid: &mut CpuId) {
    edit_leaf(cpuid, 7, |e| {
        e.ebx &= !LEAF7_EBX_TSX;
        e.edx &= !(LEAF7_EDX_TSX | LEAF7_EDX_SPEC_CTRL);
    });
    edit_leaf(cpuid, 0x8000_0008, |e| e.ebx &= !EXT8_EBX_AMD_IBPB);
}

/// The leaves the personalities edit for honesty (PMU enumeration, TSX, IBPB) on which `installed`
/// (what `KVM_GET_CPUID2` reports) differs from `asked` (what was set): one line each. A host
/// that forced a leaf through would make the guest see what it cannot use.
pub fn cpuid_differences(asked: &CpuId, installed: &CpuId) -> Vec<String> {
    let leaf = |c: &CpuId, function: u32, index: u32| {
        c.as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .map(|e| [e.eax, e.ebx, e.ecx, e.edx])
    };
    // (function, index, the register bits that matter: eax, ebx, ecx, edx masks).
    let checked: [(u32, u32, [u32; 4]); 6] = [
        (1, 0, [0, 0, LEAF1_ECX_PDCM, 0]),
        (
            7,
            0,
            [0, LEAF7_EBX_TSX, 0, LEAF7_EDX_TSX | LEAF7_EDX_SPEC_CTRL],
        ),
        (0x8000_0008, 0, [0, EXT8_EBX_AMD_IBPB, 0, 0]),
        (0xa, 0, [u32::MAX; 4]),
        (0x8000_0001, 0, [0, 0, vpmu_amd::CPUID_PERF_CTR_EXT_CORE, 0]),
        (CPUID_PERFMON_LEAF, 0, [u32::MAX; 4]),
    ];
    checked
        .iter()
        .filter_map(|&(function, index, masks)| {
            let a = leaf(asked, function, index).unwrap_or_default();
            let i = leaf(installed, function, index).unwrap_or_default();
            let differs = (0..4).any(|r| (a[r] ^ i[r]) & masks[r] != 0);
            differs
                .then(|| format!("leaf {function:#x}.{index}: asked {a:08x?}, installed {i:08x?}"))
        })
        .collect()
}

/// CPUID.80000008H:EBX XSAVEERPTR (2): FXSAVE/XSAVE always save the x87 error pointers.
const EXT8_EBX_XSAVEERPTR: u32 = 1 << 2;

/// An AMD personality on an Intel host: Intel's FXSAVE always saves the x87 error pointers
/// (FIP, FDP, FOP), so the hardware under the guest has what XSAVEERPTR promises, and the
/// guest is told so. Without it Linux takes the guest for an AMD part with the FXSAVE leak
/// (`X86_BUG_FXSAVE_LEAK`, set by `init_amd` when XSAVEERPTR is clear) and runs `fnclex;
/// emms; fildl` in `restore_fpregs_from_fpstate` at every FPU restore: x87 instructions this
/// host's KVM cannot emulate at CPL0 (`KVM_EXIT_INTERNAL_ERROR` at `fnclex`, seen on an Intel
/// Xeon host). On an AMD host the host's own bit passes through unchanged.
fn advertise_error_pointers_on_intel(cpuid: &mut CpuId) {
    let host_is_intel = cpuid.as_slice().iter().any(|e| {
        let (b, d, c) = vendor_words(b"GenuineIntel");
        e.function == 0 && e.index == 0 && (e.ebx, e.ecx, e.edx) == (b, c, d)
    });
    if host_is_intel {
        if cpuid
            .as_slice()
            .iter()
            .any(|e| e.function == 0x8000_0008 && e.index == 0)
        {
            edit_leaf(cpuid, 0x8000_0008, |e| e.ebx |= EXT8_EBX_XSAVEERPTR);
        } else {
            set_leaf(cpuid, 0x8000_0008, 0, [0, EXT8_EBX_XSAVEERPTR, 0, 0]);
        }
    }
}

fn vendor_words(vendor: &[u8; 12]) -> (u32, u32, u32) {
    let w = |i: usize| u32::from_le_bytes([vendor[i], vendor[i + 1], vendor[i + 2], vendor[i + 3]]);
    (w(0), w(4), w(8))
}

/// An Intel architectural PMU.
#[derive(Clone, Copy, Debug)]
pub struct Intel {
    /// The event source.
    pub source: Source,
    /// The PMU: the synthetic CPUID the backend enumerates and the guest sees, and
    /// IA32_PERF_CAPABILITIES.
    pub shape: IntelShape,
}

/// Architectural events the precise source cannot count (leaf 0xA EBX: reference cycles 2,
/// LLC references 3, LLC misses 4, branch misses 6, topdown slots 7). It counts instructions,
/// branches and core cycles (one per retired instruction: `precise.rs`).
pub const INTEL_UNAVAILABLE_PRECISE: u32 = 0b1101_1100;
/// Architectural events the timed source cannot count: all but core (0) and reference (2)
/// cycles.
pub const INTEL_UNAVAILABLE_TIMED: u32 = 0b1111_1010;

/// The architectural events `source` cannot count. The model is told too (it then counts none
/// of them), not only the guest.
fn intel_unavailable(source: Source) -> u32 {
    match source {
        Source::Precise => INTEL_UNAVAILABLE_PRECISE,
        Source::Timed => INTEL_UNAVAILABLE_TIMED,
    }
}

impl Intel {
    /// Version 5 (the `intel-v5` test shape): 8 GP counters, FW_WRITE; fixed counters 0 and 1
    /// (precise) or 1 and 2 (timed).
    pub fn v5(source: Source) -> Self {
        Self {
            source,
            shape: IntelShape::v5(intel_unavailable(source)),
        }
    }

    /// Version 2 (the `intel-v2` test shape): 4 GP counters, legacy writes only; fixed counter
    /// 0 and 1 (precise) or 0–2 (timed: v2 has no bitmap; fixed counter 0 never counts).
    pub fn v2(source: Source) -> Self {
        Self {
            source,
            shape: IntelShape::v2(intel_unavailable(source)),
        }
    }
}

impl Personality for Intel {
    type Backend = IntelPmu;
    type Model = IntelPmuModel;

    fn source(&self) -> Source {
        self.source
    }

    fn name(&self) -> String {
        format!("{} {}", self.shape, self.source.name())
    }

    fn backend(&self) -> IntelPmu {
        self.shape.backend()
    }

    fn model(&self) -> IntelPmuModel {
        self.shape.model()
    }

    fn counting(&self, model: &IntelPmuModel) -> bool {
        let r = model.registers();
        let gp = r
            .event_selects
            .iter()
            .enumerate()
            .filter(|(_, sel)| **sel & (1 << 22) != 0)
            .fold(0u64, |m, (i, _)| m | 1 << i);
        let fixed = (0..4)
            .filter(|i| (r.fixed_ctrl >> (4 * i)) & 3 != 0)
            .fold(0u64, |m, i| m | 1 << (32 + i));
        r.global_ctrl & (gp | fixed) != 0
    }

    fn cpuid(&self, cpuid: &mut CpuId) {
        let (b, d, c) = vendor_words(b"GenuineIntel");
        edit_leaf(cpuid, 0, |e| {
            e.eax = e.eax.max(0xa);
            (e.ebx, e.ecx, e.edx) = (b, c, d);
        });
        hide_unusable(cpuid);
        let caps = self.shape.caps();
        let pdcm = u32::from(caps.has_perf_capabilities()) * LEAF1_ECX_PDCM;
        edit_leaf(cpuid, 1, |e| e.ecx = (e.ecx & !LEAF1_ECX_PDCM) | pdcm);
        set_leaf(
            cpuid,
            0xa,
            0,
            caps.guest_leaf_0xa(intel_unavailable(self.source)),
        );
        // No AMD PMU leaves for an Intel guest.
        edit_leaf(cpuid, 0x8000_0001, |e| {
            e.ecx &= !vpmu_amd::CPUID_PERF_CTR_EXT_CORE
        });
        set_leaf(cpuid, CPUID_PERFMON_LEAF, 0, [0; 4]);
        crate::transport::add_cpuid_leaves(cpuid);
    }
}

/// AMD: an enumerated core-PMU shape.
#[derive(Clone, Copy, Debug)]
pub struct Amd {
    /// The event source.
    pub source: Source,
    /// The shape the guest's CPUID describes.
    pub shape: AmdShape,
}

impl Amd {
    /// PerfMonV2 with 6 counters (the `amd-perfmonv2` test shape).
    pub fn perfmon_v2(source: Source) -> Self {
        Self {
            source,
            shape: AmdShape::perfmon_v2(),
        }
    }

    /// Legacy K7 (the `amd-k7` test shape).
    pub fn k7(source: Source) -> Self {
        Self {
            source,
            shape: AmdShape::k7(),
        }
    }
}

impl Personality for Amd {
    type Backend = AmdPmu;
    type Model = AmdPmuModel;

    fn source(&self) -> Source {
        self.source
    }

    fn name(&self) -> String {
        format!("{} {}", self.shape, self.source.name())
    }

    fn backend(&self) -> AmdPmu {
        self.shape.backend()
    }

    fn model(&self) -> AmdPmuModel {
        self.shape.model()
    }

    fn counting(&self, model: &AmdPmuModel) -> bool {
        let r = model.registers();
        let enabled = r.controls[..r.counters as usize]
            .iter()
            .enumerate()
            .filter(|(_, c)| **c & (1 << 22) != 0)
            .fold(0u64, |m, (i, _)| m | 1 << i);
        match self.shape.pmu {
            PmuShape::PerfMonV2 { .. } => enabled & r.global_ctl != 0,
            _ => enabled != 0,
        }
    }

    fn uncountable_event(&self, msr: u32, value: u64) -> Option<u16> {
        const EN: u64 = 1 << 22;
        let legacy = (0xc001_0000..=0xc001_0003).contains(&msr);
        let core = (0xc001_0200..0xc001_0200 + 2 * 6).contains(&msr) && msr % 2 == 0;
        if !(legacy || core) || value & EN == 0 {
            return None;
        }
        let event = (value & 0xff) | (value >> 24 & 0xf00);
        // What each source feeds the model (`vpmu_models::amd`): core cycles; the precise
        // source also instructions and branches.
        let counted: &[u64] = match self.source {
            Source::Timed => &[0x076],
            Source::Precise => &[0x076, 0x0c0, 0x0c2],
        };
        (!counted.contains(&event)).then_some(event as u16)
    }

    fn cpuid(&self, cpuid: &mut CpuId) {
        advertise_error_pointers_on_intel(cpuid);
        let (b, d, c) = vendor_words(b"AuthenticAMD");
        edit_leaf(cpuid, 0, |e| (e.ebx, e.ecx, e.edx) = (b, c, d));
        hide_unusable(cpuid);
        // IA32_PERF_CAPABILITIES is Intel's (and faults here, another vendor's PMU MSR).
        edit_leaf(cpuid, 1, |e| e.ecx &= !LEAF1_ECX_PDCM);
        set_leaf(cpuid, 0xa, 0, [0; 4]);
        let leaves = self.shape.caps().guest_leaves();
        edit_leaf(cpuid, 0x8000_0001, |e| {
            e.ecx = leaves.edit_ext_features(e.ecx)
        });
        edit_leaf(cpuid, 0x8000_0000, |e| {
            e.eax = leaves.edit_max_extended_leaf(e.eax);
        });
        set_leaf(cpuid, CPUID_PERFMON_LEAF, 0, leaves.perfmon);
        crate::transport::add_cpuid_leaves(cpuid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu::{Msr, MsrBus};

    fn leaf(cpuid: &CpuId, function: u32) -> Option<kvm_cpuid_entry2> {
        cpuid
            .as_slice()
            .iter()
            .find(|e| e.function == function && e.index == 0)
            .copied()
    }

    #[test]
    fn amd_on_an_intel_host_promises_the_error_pointers_intel_saves() {
        let with_vendor = |vendor: &[u8; 12]| {
            let mut c = base();
            let (b, d, cx) = vendor_words(vendor);
            edit_leaf(&mut c, 0, |e| (e.ebx, e.ecx, e.edx) = (b, cx, d));
            c
        };
        let amd = Amd::perfmon_v2(Source::Timed);
        let mut on_intel = with_vendor(b"GenuineIntel");
        amd.cpuid(&mut on_intel);
        let ext8 = leaf(&on_intel, 0x8000_0008).expect("leaf 0x80000008 added");
        assert_ne!(ext8.ebx & EXT8_EBX_XSAVEERPTR, 0);
        let mut on_amd = with_vendor(b"AuthenticAMD");
        amd.cpuid(&mut on_amd);
        let bit = leaf(&on_amd, 0x8000_0008).map_or(0, |e| e.ebx & EXT8_EBX_XSAVEERPTR);
        assert_eq!(bit, 0, "an AMD host's own enumeration passes through");
    }

    fn base() -> CpuId {
        let entries = [0u32, 1, 0x8000_0000, 0x8000_0001].map(|function| kvm_cpuid_entry2 {
            function,
            eax: if function == 0 { 0xd } else { 0x8000_0021 },
            ..Default::default()
        });
        CpuId::from_entries(&entries).expect("small table")
    }

    #[test]
    fn intel_cpuid_carries_the_model_shape_and_availability() {
        let mut c = base();
        Intel::v5(Source::Precise).cpuid(&mut c);
        let l0 = leaf(&c, 0).expect("leaf 0");
        assert_eq!(&l0.ebx.to_le_bytes(), b"Genu");
        assert_eq!(&l0.edx.to_le_bytes(), b"ineI");
        assert_eq!(&l0.ecx.to_le_bytes(), b"ntel");
        let a = leaf(&c, 0xa).expect("leaf 0xA");
        assert_eq!(a.eax & 0xff, 5);
        assert_eq!((a.eax >> 8) & 0xff, 8);
        assert_eq!(a.ebx, INTEL_UNAVAILABLE_PRECISE);
        // Fixed counters 0 (instructions) and 1 (core cycles): what the precise source counts.
        assert_eq!(a.edx & 0x1f, 2);
        assert_eq!(
            leaf(&c, 1).expect("leaf 1").ecx & (1 << 15),
            1 << 15,
            "PDCM"
        );

        let mut t = base();
        Intel::v5(Source::Timed).cpuid(&mut t);
        let a = leaf(&t, 0xa).expect("leaf 0xA");
        assert_eq!(a.ebx, INTEL_UNAVAILABLE_TIMED);
        assert_eq!(
            (a.ecx, a.edx & 0x1f),
            (0b110, 0),
            "fixed 1 and 2 through the bitmap"
        );
    }

    #[test]
    fn amd_cpuid_advertises_the_shape() {
        let mut c = base();
        Amd::perfmon_v2(Source::Precise).cpuid(&mut c);
        assert_eq!(&leaf(&c, 0).expect("leaf 0").ebx.to_le_bytes(), b"Auth");
        assert_ne!(leaf(&c, 0x8000_0001).expect("ext").ecx & (1 << 23), 0);
        assert_eq!(leaf(&c, 0x8000_0000).expect("max").eax, 0x8000_0022);
        let v2 = leaf(&c, 0x8000_0022).expect("PerfMonV2 leaf");
        assert_eq!((v2.eax & 1, v2.ebx & 0xf), (1, 6));

        let mut k7 = base();
        Amd::k7(Source::Precise).cpuid(&mut k7);
        assert_eq!(leaf(&k7, 0x8000_0001).expect("ext").ecx & (1 << 23), 0);
        assert_eq!(leaf(&k7, 0x8000_0022).expect("zeroed").eax, 0);
    }

    #[test]
    fn no_personality_advertises_tsx_and_differences_are_named() {
        let mut with_tsx = base();
        let leaf7 = kvm_cpuid_entry2 {
            function: 7,
            ebx: LEAF7_EBX_TSX | 1,
            edx: LEAF7_EDX_TSX,
            ..Default::default()
        };
        with_tsx.push(leaf7).expect("room");
        let host = with_tsx.clone();
        let mut amd = with_tsx.clone();
        Intel::v2(Source::Precise).cpuid(&mut with_tsx);
        Amd::k7(Source::Precise).cpuid(&mut amd);
        for c in [&with_tsx, &amd] {
            let l7 = c
                .as_slice()
                .iter()
                .find(|e| e.function == 7)
                .expect("leaf 7");
            assert_eq!((l7.ebx, l7.edx), (1, 0), "TSX hidden, the rest kept");
        }
        assert!(cpuid_differences(&with_tsx, &with_tsx).is_empty());
        let named = cpuid_differences(&with_tsx, &host);
        assert!(
            named.iter().any(|d| d.starts_with("leaf 0x7.0")),
            "{named:?}"
        );
        assert!(
            named.iter().any(|d| d.starts_with("leaf 0xa.0")),
            "{named:?}"
        );
    }

    #[test]
    fn no_personality_advertises_ibpb_and_a_forced_one_is_named() {
        let mut host = base();
        let leaf7 = kvm_cpuid_entry2 {
            function: 7,
            edx: LEAF7_EDX_SPEC_CTRL | 1,
            ..Default::default()
        };
        let ext8 = kvm_cpuid_entry2 {
            function: 0x8000_0008,
            ebx: EXT8_EBX_AMD_IBPB | 1,
            ..Default::default()
        };
        host.push(leaf7).expect("room");
        host.push(ext8).expect("room");
        let (mut intel, mut amd) = (host.clone(), host.clone());
        Intel::v5(Source::Precise).cpuid(&mut intel);
        Amd::perfmon_v2(Source::Precise).cpuid(&mut amd);
        for c in [&intel, &amd] {
            let find = |function| c.as_slice().iter().find(|e| e.function == function);
            assert_eq!(
                find(7).expect("leaf 7").edx,
                1,
                "SPEC_CTRL hidden, the rest kept"
            );
            assert_eq!(
                find(0x8000_0008).expect("leaf 0x80000008").ebx,
                1,
                "AMD IBPB hidden"
            );
            let named = cpuid_differences(c, &host);
            assert!(
                named.iter().any(|d| d.starts_with("leaf 0x7.0")),
                "{named:?}"
            );
            assert!(
                named.iter().any(|d| d.starts_with("leaf 0x80000008.0")),
                "{named:?}"
            );
        }
    }

    #[test]
    fn amd_names_the_events_its_source_never_counts() {
        let timed = Amd::perfmon_v2(Source::Timed);
        let en = 1u64 << 22;
        assert_eq!(
            timed.uncountable_event(0xc001_0200, en | 0x76),
            None,
            "cycles count"
        );
        assert_eq!(timed.uncountable_event(0xc001_0202, en | 0xc0), Some(0xc0));
        assert_eq!(
            timed.uncountable_event(0xc001_0000, en | 0xc2),
            Some(0xc2),
            "K7 alias"
        );
        assert_eq!(
            timed.uncountable_event(0xc001_0202, 0xc0),
            None,
            "not enabled"
        );
        assert_eq!(
            timed.uncountable_event(0xc001_0201, en | 0xc0),
            None,
            "a counter"
        );
        assert_eq!(
            timed.uncountable_event(0xc001_0200, en | 1 << 32 | 0x76),
            Some(0x176)
        );
        let precise = Amd::k7(Source::Precise);
        assert_eq!(precise.uncountable_event(0xc001_0000, en | 0xc0), None);
        assert_eq!(
            Intel::v5(Source::Timed).uncountable_event(0x186, en | 0xc0),
            None
        );
    }

    #[test]
    fn counting_follows_the_enables() {
        let p = Intel::v2(Source::Precise);
        let mut m = p.model();
        assert!(
            !p.counting(&m),
            "RESET: GLOBAL_CTRL set but no selector enabled"
        );
        m.write(Msr(0x186), 0xc0 | 1 << 17 | 1 << 22)
            .expect("selector");
        assert!(p.counting(&m));
        m.write(Msr(0x38f), 0).expect("global off");
        assert!(!p.counting(&m));
        m.write(Msr(0x38d), 0x1).expect("fixed 0 OS");
        m.write(Msr(0x38f), 1 << 32).expect("fixed 0 global");
        assert!(p.counting(&m));

        let k7 = Amd::k7(Source::Precise);
        let mut m = k7.model();
        assert!(!k7.counting(&m));
        m.write(Msr(0xC001_0003), 0xc0 | 1 << 22)
            .expect("K7 control 3");
        assert!(k7.counting(&m));
    }
}
