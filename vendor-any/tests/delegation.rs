//! `VendorPmu` behaves exactly as the vendor backend it wraps: random guest programs (WRMSR,
//! RDMSR, RDPMC, counting, save and load, PMIs, the shared page) run through the erased
//! backend and through the bare one, each against its own software PMU, give the same
//! outcomes, the same contexts and the same hardware at every step, on the four test shapes.
//! And a backend handed the other vendor's context refuses without touching the hardware.

use proptest::prelude::*;
use vpmu::abi::VendorArea;
use vpmu::bank::HwRecord;
use vpmu::{
    CounterIndex, CounterSet, GuestPolicy, Msr, MsrBus, PmuBackend, PublishedImages, RawEvent,
    Vendor,
};
use vpmu_models::shapes::{ALL_EVENTS, Shape, VendorShape};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_vendor_any::{FOREIGN_STATE_MSR, VendorContext, VendorPmu};

/// One step of a guest program on one CPU.
#[derive(Clone, Debug)]
enum Step {
    /// WRMSR of the `n`-th MSR of the backend's ranges (modulo their size).
    Write(usize, u64),
    /// RDMSR of the `n`-th MSR.
    Read(usize),
    /// RDPMC with this ECX.
    Rdpmc(u32),
    /// A guest driver programs general-purpose counter `i` (0..4) to count instructions with
    /// its interrupt enabled, from `2^48 - n`, and enables it globally.
    Program(u32, u64),
    /// Instructions retired in guest kernel mode.
    Count(u64),
    /// Save the context if loaded, else load it.
    Switch,
    /// Collect overflows as a PMI does, if loaded.
    Pmi,
    /// The context through the shared page and back (a flush of an unedited page), if saved.
    Page,
}

fn step() -> impl Strategy<Value = Step> {
    // Values that enable counting (EN, USR, OS, INT with instructions retired) are frequent,
    // so that counters really count and overflow; arbitrary values exercise the refusals.
    let value = prop_oneof![
        any::<u64>(),
        Just(0x53_00c0u64),
        Just((1u64 << 48) - 100),
        Just(0xffff_ffffu64),
        (0u64..16),
    ];
    prop_oneof![
        4 => (any::<usize>(), value).prop_map(|(n, v)| Step::Write(n, v)),
        2 => any::<usize>().prop_map(Step::Read),
        1 => prop_oneof![0u32..8, Just(1 << 30), any::<u32>()].prop_map(Step::Rdpmc),
        2 => (0u32..4, 1u64..500).prop_map(|(i, n)| Step::Program(i, n)),
        2 => (1u64..300).prop_map(Step::Count),
        1 => Just(Step::Switch),
        1 => Just(Step::Pmi),
        1 => Just(Step::Page),
    ]
}

/// The `n`-th MSR of `ranges`, cyclically.
fn nth_msr(ranges: &[(u32, u32)], n: usize) -> Msr {
    let total: usize = ranges.iter().map(|(a, b)| (b - a + 1) as usize).sum();
    let mut n = n % total;
    for &(first, last) in ranges {
        let len = (last - first + 1) as usize;
        if n < len {
            return Msr(first + n as u32);
        }
        n -= len;
    }
    unreachable!("n is below the total")
}

/// One CPU: a backend, its context, the software PMU and the pCPU's record of it.
struct Cpu<B: PmuBackend, M> {
    backend: B,
    ctx: B::Context,
    model: M,
    record: HwRecord,
    loaded: bool,
}

impl<B: PmuBackend, M: SoftwarePmu> Cpu<B, M> {
    fn new(backend: B, mut model: M) -> Self {
        backend.init_hardware(&mut model).expect("clean hardware");
        let mut record = HwRecord::default();
        record.controls_cleared();
        Cpu {
            ctx: backend.new_context(),
            backend,
            model,
            record,
            loaded: false,
        }
    }

    /// Runs `step`; what the guest or the hypervisor would see of it, as text.
    fn run(&mut self, step: &Step, policy: &GuestPolicy<'_>) -> String {
        let hw = if self.loaded {
            Some(&mut self.model)
        } else {
            None
        };
        let ranges = self.backend.msr_ranges();
        match *step {
            Step::Write(n, value) => {
                let msr = nth_msr(ranges, n);
                format!(
                    "{:?}",
                    self.backend
                        .guest_write(&mut self.ctx, hw, policy, msr, value)
                )
            }
            Step::Read(n) => {
                let msr = nth_msr(ranges, n);
                format!("{:?}", self.backend.guest_read(&mut self.ctx, hw, msr))
            }
            Step::Rdpmc(selector) => match self.backend.rdpmc_counter(selector) {
                Some(msr) => format!("{:?}", self.backend.guest_read(&mut self.ctx, hw, msr)),
                None => "#GP".into(),
            },
            Step::Program(i, n) => {
                // EN, INT, OS, USR; event 0xC0 (instructions retired on both vendors).
                let control = 1 << 22 | 1 << 20 | 1 << 17 | 1 << 16 | 0xc0;
                let start = (1u64 << 48) - n;
                let writes = match self.backend.capabilities().vendor {
                    // IA32_PERFEVTSELi, IA32_PMCi (bits 31:0 sign-extended), GLOBAL_CTRL.
                    Vendor::Intel => [(0x186 + i, control), (0xc1 + i, start), (0x38f, 0xf)],
                    // PERF_CTLi, PERF_CTRi of the K7 block (present on every shape); the
                    // PerfMonV2 GlobalCtl resets to every counter enabled.
                    Vendor::Amd => [
                        (0xc001_0000 + i, control),
                        (0xc001_0004 + i, start),
                        (0xc001_0000 + i, control),
                    ],
                };
                let mut hw = hw;
                let outcomes: Vec<_> = writes
                    .iter()
                    .map(|&(msr, value)| {
                        let hw = hw.as_deref_mut();
                        self.backend
                            .guest_write(&mut self.ctx, hw, policy, Msr(msr), value)
                    })
                    .collect();
                format!("{outcomes:?}")
            }
            Step::Count(n) => {
                let mode = ExecMode {
                    cpl: 0,
                    host: false,
                };
                self.model.count(HwEvent::Instructions, n, mode);
                format!("pmi {}", self.model.take_pmi())
            }
            Step::Switch if self.loaded => {
                self.loaded = false;
                let saved = self
                    .backend
                    .save(&mut self.ctx, &mut self.model, &mut self.record);
                format!("{saved:?}")
            }
            Step::Switch => {
                self.loaded = true;
                let loaded = self
                    .backend
                    .load(&self.ctx, &mut self.model, &mut self.record);
                format!("{loaded:?}")
            }
            Step::Pmi if self.loaded => {
                format!(
                    "{:?}",
                    self.backend.handle_overflow(&mut self.ctx, &mut self.model)
                )
            }
            Step::Pmi => "not loaded".into(),
            Step::Page if self.loaded => "loaded".into(),
            Step::Page => {
                let mut area = VendorArea::default();
                self.backend.context_to_page(&self.ctx, &mut area);
                let mut out = self.backend.new_context();
                let flushed = self.backend.context_from_page_into(
                    &area,
                    &self.ctx,
                    PublishedImages::Stale,
                    policy,
                    &mut out,
                );
                let same = out == self.ctx;
                format!("{flushed:?} {same} {:?}", area.words)
            }
        }
    }
}

/// A filter that denies one event select, so that the filter's path is taken too.
struct DenyBranches;

impl vpmu::EventFilter for DenyBranches {
    fn allows(&self, event: RawEvent) -> bool {
        event.select != 0xc4
    }

    fn allows_fixed(&self, _index: u32) -> bool {
        true
    }
}

/// Runs `steps` on the bare backend and on the erased one, comparing everything after each.
fn same_behaviour<S: VendorShape>(
    shape: S,
    wrap: fn(S::Backend) -> VendorPmu,
    unwrap: fn(&VendorContext) -> Option<&<S::Backend as PmuBackend>::Context>,
    registers: fn(&S::Model) -> String,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let policy = GuestPolicy {
        features: 0,
        filter: &DenyBranches,
        may_count_host: false,
    };
    let mut bare = Cpu::new(shape.backend(), shape.model());
    let mut erased = Cpu::new(wrap(shape.backend()), shape.model());
    for (i, step) in steps.iter().enumerate() {
        let expected = bare.run(step, &policy);
        let got = erased.run(step, &policy);
        prop_assert_eq!(&got, &expected, "step {} {:?}", i, step);
        prop_assert_eq!(unwrap(&erased.ctx), Some(&bare.ctx), "step {}", i);
        prop_assert_eq!(registers(&erased.model), registers(&bare.model));
        prop_assert_eq!(erased.model.access_stats(), bare.model.access_stats());
        prop_assert_eq!(&erased.record, &bare.record);
    }
    Ok(())
}

fn intel_ctx(ctx: &VendorContext) -> Option<&vpmu_intel::IntelContext> {
    match ctx {
        VendorContext::Intel(ctx) => Some(ctx),
        VendorContext::Amd(_) => None,
    }
}

fn amd_ctx(ctx: &VendorContext) -> Option<&vpmu_amd::AmdContext> {
    match ctx {
        VendorContext::Amd(ctx) => Some(ctx),
        VendorContext::Intel(_) => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_erased_backend_is_the_vendor_backend(
        shape in prop::sample::select(Shape::ALL.to_vec()),
        steps in prop::collection::vec(step(), 1..80),
    ) {
        match shape.vendor() {
            Vendor::Intel => same_behaviour(
                shape.intel(ALL_EVENTS).unwrap(),
                VendorPmu::Intel,
                intel_ctx,
                |m| format!("{:?}", m.registers()),
                &steps,
            )?,
            Vendor::Amd => same_behaviour(
                shape.amd().unwrap(),
                VendorPmu::Amd,
                amd_ctx,
                |m| format!("{:?}", m.registers()),
                &steps,
            )?,
        }
    }
}

/// What does not depend on a context, compared for one vendor backend.
fn same_static_answers<B: PmuBackend>(erased: &VendorPmu, bare: &B, selectors: &[u32]) {
    assert_eq!(erased.capabilities(), bare.capabilities());
    assert_eq!(erased.msr_ranges(), bare.msr_ranges());
    assert_eq!(erased.masks_lvtpc_on_pmi(), bare.masks_lvtpc_on_pmi());
    assert_eq!(erased.page_layout(), bare.page_layout());
    for &selector in selectors {
        assert_eq!(erased.rdpmc_counter(selector), bare.rdpmc_counter(selector));
    }
    for counter in (0..8)
        .map(CounterIndex::General)
        .chain((0..4).map(CounterIndex::Fixed))
    {
        assert_eq!(
            erased.rearm_period_max(counter),
            bare.rearm_period_max(counter)
        );
    }
    for &(first, last) in bare.msr_ranges() {
        for msr in [first.wrapping_sub(1), first, last, last.wrapping_add(1)] {
            assert_eq!(erased.owns(Msr(msr)), bare.owns(Msr(msr)), "{msr:#x}");
        }
    }
}

#[test]
fn static_answers_are_the_vendor_backends() {
    for shape in Shape::ALL {
        if let Some(setup) = shape.intel(ALL_EVENTS) {
            let erased = VendorPmu::from(setup.backend());
            let selectors = [0, 1, 7, 8, 1 << 30, (1 << 30) | 3, (1 << 30) | 4, 1 << 31];
            same_static_answers(&erased, &setup.backend(), &selectors);
            assert_eq!(erased.vendor(), Vendor::Intel);
        }
        if let Some(setup) = shape.amd() {
            let erased = VendorPmu::from(setup.backend());
            same_static_answers(&erased, &setup.backend(), &[0, 1, 3, 4, 5, 6, 15, 1 << 30]);
            assert_eq!(erased.vendor(), Vendor::Amd);
        }
    }
}

/// The other vendor's context (an integration bug: two vPMUs' vCPUs mixed up) is refused by
/// every method, with the hardware untouched.
#[test]
fn the_other_vendors_context_is_refused_without_touching_the_hardware() {
    let intel = shape_backend(Shape::IntelV5);
    let amd = shape_backend(Shape::AmdPerfMonV2);
    for (backend, other) in [(&intel, &amd), (&amd, &intel)] {
        let mut model = match backend {
            VendorPmu::Intel(_) => Model::Intel(Shape::IntelV5.intel(ALL_EVENTS).unwrap().model()),
            VendorPmu::Amd(_) => Model::Amd(Shape::AmdPerfMonV2.amd().unwrap().model()),
        };
        let before = model.stats();
        let mut foreign = other.new_context();
        let mut record = HwRecord::default();
        let policy = GuestPolicy::guest_default();
        let fault = Some(vpmu::MsrFault {
            msr: FOREIGN_STATE_MSR,
        });
        // A register of this backend with the other vendor's context, and the reverse.
        let own_register = backend.classify(Msr(backend.msr_ranges()[0].0)).unwrap();
        let other_register = other.classify(Msr(other.msr_ranges()[0].0)).unwrap();
        let mut own = backend.new_context();
        let hw = &mut model;
        let read = backend.read_register(&mut foreign, Some(&mut *hw), own_register);
        assert_eq!(read.err(), fault);
        let read = backend.read_register(&mut own, Some(&mut *hw), other_register);
        assert_eq!(read.err(), fault);
        let write = backend.write_register(&mut foreign, Some(&mut *hw), &policy, own_register, 0);
        assert_eq!(write.err(), fault);
        let write = backend.write_register(&mut own, Some(&mut *hw), &policy, other_register, 0);
        assert_eq!(write.err(), fault);
        assert_eq!(backend.save(&mut foreign, hw, &mut record).err(), fault);
        assert_eq!(backend.load(&foreign, hw, &mut record).err(), fault);
        assert_eq!(backend.handle_overflow(&mut foreign, hw).err(), fault);
        let periods = Default::default();
        let rearm = backend.rearm_overflowed(&mut foreign, hw, CounterSet::gp(0), &periods);
        assert_eq!(rearm.err(), fault);
        assert_eq!(
            own,
            backend.new_context(),
            "nothing written into the own context"
        );
        assert!(!backend.is_active(&foreign));
        let refusal = backend.restrict(&mut foreign, &policy).expect("reported");
        assert_eq!(refusal.msr, FOREIGN_STATE_MSR.0);
        // A page never shows the other vendor's layout: this backend's reset context instead.
        let mut area = VendorArea::default();
        backend.context_to_page(&foreign, &mut area);
        let mut reset = VendorArea::default();
        backend.context_to_page(&backend.new_context(), &mut reset);
        assert_eq!(area, reset);
        let mut out = backend.new_context();
        let untouched = out.clone();
        let flushed = backend.context_from_page_into(
            &reset,
            &foreign,
            PublishedImages::Stale,
            &policy,
            &mut out,
        );
        assert_eq!(flushed.map_err(|e| e.msr), Err(FOREIGN_STATE_MSR.0));
        assert_eq!(out, untouched);
        assert_eq!(
            foreign,
            other.new_context(),
            "the foreign context is left as it was"
        );
        assert_eq!(model.stats(), before, "no hardware access");
    }
}

fn shape_backend(shape: Shape) -> VendorPmu {
    match (shape.intel(ALL_EVENTS), shape.amd()) {
        (Some(intel), _) => intel.backend().into(),
        (_, Some(amd)) => amd.backend().into(),
        _ => unreachable!("every shape is one vendor's"),
    }
}

/// Either vendor's software PMU, as the hardware of a test.
enum Model {
    Intel(vpmu_models::intel::IntelPmuModel),
    Amd(vpmu_models::amd::AmdPmuModel),
}

impl Model {
    fn stats(&self) -> vpmu::MsrAccessStats {
        match self {
            Model::Intel(m) => m.access_stats(),
            Model::Amd(m) => m.access_stats(),
        }
    }
}

impl MsrBus for Model {
    fn read(&mut self, msr: Msr) -> Result<u64, vpmu::MsrFault> {
        match self {
            Model::Intel(m) => m.read(msr),
            Model::Amd(m) => m.read(msr),
        }
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), vpmu::MsrFault> {
        match self {
            Model::Intel(m) => m.write(msr, value),
            Model::Amd(m) => m.write(msr, value),
        }
    }
}
