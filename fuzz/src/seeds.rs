//! The seed corpus, generated from real structures: the simulator's guest perf driver
//! (`vpmu_sim::Driver`) programs the counters and edits the page as its PMI handler does, the
//! backends publish the contexts, a simulated run's cached samples are shipped in batches as
//! `vpmu profile`'s protocol encodes them, and the VMM's own test profile is the raw profile.
//! `tests/corpus.rs` checks that `corpus/<target>/seed-*` are exactly these (and writes them
//! with `VPMU_FUZZ_BLESS=1`).

use vpmu::abi::{PageView, XENPMU_MODE_SELF, XENPMU_OP_INIT, XENPMU_OP_LVTPC_SET};
use vpmu::{HwRecord, PmuBackend};
use vpmu_abi::{Page, VendorArea};
use vpmu_profile::protocol::{BATCH_MAGIC, BatchHeader, BatchSample};
use vpmu_sim::helpers::{counting, sampling};
use vpmu_sim::plan::{CounterSpec, PlanSpec};
use vpmu_sim::truth::CounterSetup;
use vpmu_sim::{Run, Scenario, SimEvent, SimVendor, Step, Timing, World};
use zerocopy::{FromZeros, IntoBytes};

use crate::shapes::{Access, FuzzShape, OnShape, cleaned, on_shape};
use crate::targets::core_world::{Action, CoreInput, CounterIn, GuestIn, RunIn};
use crate::targets::flush_verify::{EDIT_BYTES, edit_bytes};
use crate::targets::guest_msr::MACHINE;
use crate::targets::profile_batch;

/// One seed file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seed {
    /// The target (its corpus directory).
    pub target: &'static str,
    /// The file name (`seed-…`).
    pub name: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut seeds = Vec::new();
    seeds.extend(programmed());
    seeds.extend(profile_batches());
    seeds.push(Seed {
        target: "coverage_profile",
        name: "seed-minicov-v10.profraw".into(),
        bytes: include_bytes!("../../vmm/coverage/tests-data/minicov-v10.profraw").to_vec(),
    });
    seeds.extend(core_worlds());
    seeds.extend(crate::targets::ring_reader::seeds());
    seeds.extend(crate::targets::ring_producer::seeds());
    seeds.extend(crate::targets::core_world::ring_seeds());
    seeds.extend(crate::targets::snapshot_decode::seeds());
    seeds
}

/// The policy byte of the seeds: no filter, no feature, no host counting.
const POLICY: u8 = 0;

/// Sampling counter 0 (period 40) and counting counter 1, as a perf driver programs them.
fn setups() -> [CounterSetup; 2] {
    [sampling(0, 40), counting(1, 5)]
}

/// The driver's writes that program `setups` on `shape`, as steps.
fn program<S: SimVendor>(shape: &S, setups: &[CounterSetup]) -> Vec<Access> {
    let driver = shape.driver();
    let ranges = shape.backend().msr_ranges();
    let mut writes = Vec::new();
    let mut global = 0;
    for setup in setups {
        writes.push(driver.disable(setup.ctr));
        writes.push(driver.write_counter(setup.ctr, setup.start_value()));
        writes.push(driver.control(setup));
        global |= setup.bit();
    }
    writes.extend(driver.global_enable(global));
    writes
        .into_iter()
        .map(|(msr, value)| Access::to(ranges, msr, value, false))
        .collect()
}

/// A step that counts `n` instructions at CPL 0.
fn instructions(n: u64) -> Access {
    Access {
        range: MACHINE,
        offset: 0,
        value: n,
    }
}

/// A step that saves and loads the context.
fn round_trip() -> Access {
    Access {
        range: MACHINE,
        offset: 0x80,
        value: 0,
    }
}

/// Per shape (every Intel and AMD one the targets pick): the guest_msr sequence that programs
/// a sampling and a counting counter, runs past the sampling counter's overflow and
/// switches out and in; the flush_verify input whose area is that context as published, with
/// the PMI handler's edits (re-arm, acknowledge); and page_view's page holding it.
fn programmed() -> Vec<Seed> {
    let mut seeds = Vec::new();
    for shape in 0..4u8 {
        on_shape(0, shape, Programmed(&mut seeds, 0, shape));
    }
    for shape in 0..3u8 {
        on_shape(1, shape, Programmed(&mut seeds, 1, shape));
    }
    seeds
}

struct Programmed<'a>(&'a mut Vec<Seed>, u8, u8);

impl OnShape for Programmed<'_> {
    fn on<S: FuzzShape>(self, shape: S) {
        let Programmed(seeds, vendor, index) = self;
        let label = file_name(&format!("{vendor}{index}-{}", shape.name()));
        let setups = setups();
        let mut steps = program(&shape, &setups);
        steps.push(instructions(45));
        steps.push(round_trip());
        steps.push(instructions(3));
        let header = [vendor, index, POLICY];
        let mut guest_msr = header.to_vec();
        steps.iter().for_each(|s| guest_msr.extend(s.to_bytes()));
        seeds.push(Seed {
            target: "guest_msr",
            name: format!("seed-{label}"),
            bytes: guest_msr,
        });

        // The context saved after the overflow, published, and edited by the handler.
        let (pmu, mut model) = cleaned(&shape);
        let mut record = HwRecord::unknown();
        record.controls_cleared();
        let mut saved = pmu.new_context();
        pmu.load(&saved, &mut model, &mut record)
            .expect("a new context loads");
        let policy = crate::shapes::policy(POLICY);
        let sample_steps = &steps[..steps.len() - 2];
        for &step in sample_steps {
            crate::targets::guest_msr::play::<S>(
                &pmu,
                &mut saved,
                &mut model,
                &mut record,
                &policy,
                step,
            );
        }
        pmu.save(&mut saved, &mut model, &mut record)
            .expect("no fault");
        let mut page = Page::new_zeroed();
        vpmu_abi::writer::init_page(&mut page, &pmu.page_layout());
        pmu.context_to_page(&saved, &mut page.vendor);
        let published = page.vendor.clone();
        seeds.push(Seed {
            target: "page_view",
            name: format!("seed-{label}"),
            bytes: page.as_bytes().to_vec(),
        });
        let driver = shape.driver();
        let status = driver.page_status(&PageView::new(&page).expect("initialised"));
        let overflowed = if driver.has_global() { status } else { 1 };
        driver.edit_page(
            &mut page,
            &[(0, setups[0].start_value())],
            overflowed,
            vendor == 0 && index % 2 == 0,
        );
        let mut flush = header.to_vec();
        flush.push(sample_steps.len() as u8);
        sample_steps.iter().for_each(|s| flush.extend(s.to_bytes()));
        let mut refused = flush.clone();
        flush.extend(edits(&published, &page.vendor));
        seeds.push(Seed {
            target: "flush_verify",
            name: format!("seed-{label}"),
            bytes: flush,
        });
        // The same edits plus a bit the vendor's rules certainly refuse (the simulator's
        // corrupted-page suite's choice).
        let mut corrupt = page.vendor.clone();
        let register = driver.make_invalid(&mut corrupt, status, false, u32::from(index) + 1, 5);
        refused.extend(edits(&published, &corrupt));
        seeds.push(Seed {
            target: "flush_verify",
            name: file_name(&format!("seed-{label}-refused-{register}")),
            bytes: refused,
        });
    }
}

/// `name` with every character but ASCII alphanumerics, `+`, `.` and `-` replaced by `-`.
fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+.-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The edits that turn `from` into `to`, one per differing 8-byte word.
fn edits(from: &VendorArea, to: &VendorArea) -> Vec<u8> {
    let (from, to) = (from.as_bytes(), to.as_bytes());
    let mut out = Vec::with_capacity(EDIT_BYTES);
    for (index, (a, b)) in from.chunks_exact(8).zip(to.chunks_exact(8)).enumerate() {
        if a != b {
            let value = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            out.extend(edit_bytes((index * 8) as u16, value));
        }
    }
    out
}

/// A simulated self-mode run whose guest samples through its page with handlers deferred:
/// each sample is shipped as the profiler guest ships it (`struct batch_sample` from the
/// page), two batches of two and one samples.
fn profile_batches() -> Vec<Seed> {
    let mut seeds = Vec::new();
    for (name, samples) in [
        ("intel-v5", cached_samples(vpmu_sim::intel_v5(), 3)),
        ("amd-perfmonv2", cached_samples(vpmu_sim::amd_v2(), 3)),
    ] {
        let batch = |sequence: u64, samples: &[BatchSample]| {
            let header = BatchHeader {
                magic: BATCH_MAGIC,
                count: samples.len() as u32,
                sequence,
                dropped: 0,
                lost: 0,
                handler_ticks: 0,
                ship_ticks: 0,
            };
            let mut bytes = header.as_bytes().to_vec();
            samples.iter().for_each(|s| bytes.extend(s.as_bytes()));
            bytes
        };
        let batches = [batch(0, &samples[..2]), batch(1, &samples[2..])];
        seeds.push(Seed {
            target: "profile_batch",
            name: format!("seed-{name}"),
            bytes: profile_batch::join(1, &batches),
        });
    }
    seeds.push(Seed {
        target: "profile_batch",
        name: "seed-ring-intel-v5".into(),
        bytes: profile_batch::join(
            1,
            &ring_shipments(&cached_samples(vpmu_sim::intel_v5(), 18)),
        ),
    });
    seeds
}

/// Ring mode: `samples` as the hypervisor writes them into a 4 KiB ring (ABI 1.4, with the
/// `vpmu_abi` encoder: sample records, a lost record for two samples the ring had no room
/// for, and a PAD where the records wrap), shipped as two `struct ring_batch` shipments of
/// the bytes the VMM copies out of the ring: positions 0 to the middle, then on past the wrap.
/// Sequence numbers run 1, 2, ... with the lost samples' numbers skipped.
fn ring_shipments(samples: &[BatchSample]) -> Vec<Vec<u8>> {
    use vpmu::abi::{
        Identity, RingSample, XENPMU_FLAG_SAMPLE_REAL, XENPMU_FLAG_SAMPLE_USER, append_record,
        encode_lost, encode_sample,
    };
    use vpmu_profile::ring_batch::{RING_BATCH_MAGIC, RingBatch};
    const DATA_SIZE: usize = 4096;
    let mut data = vec![0u8; DATA_SIZE];
    let mut record = vec![0u8; vpmu::abi::XENPMU_RECORD_MAX];
    let (mut head, mut sequence, mut records, mut lost) = (0u64, 0u64, 0u64, 0u64);
    let mut cuts = vec![0u64];
    // Each shipment's bytes as the VMM copies them, before later records reuse the area.
    let mut shipped: Vec<Vec<u8>> = Vec::new();
    let copy_out = |data: &[u8], tail: u64, head: u64| -> Vec<u8> {
        (tail..head)
            .map(|p| data[(p % DATA_SIZE as u64) as usize])
            .collect()
    };
    for (i, s) in samples.iter().enumerate() {
        if i == samples.len() / 2 {
            shipped.push(copy_out(&data, 0, head));
            cuts.push(head);
            // Two samples found the ring full: a lost record precedes the next sample.
            sequence += 2;
            lost += 2;
            let size = encode_lost(&mut record, 2, sequence, s.tsc).expect("fits");
            head = append_record(&mut data, head, head, &record[..size]).expect("room");
        }
        sequence += 1;
        let fixed = RingSample {
            header: vpmu::abi::RecordHeader {
                misc: s.flags & (XENPMU_FLAG_SAMPLE_USER | XENPMU_FLAG_SAMPLE_REAL) as u32,
                ..Default::default()
            },
            sequence,
            tsc: s.tsc,
            identity: Identity {
                domain_id: s.domain_id,
                vcpu_id: s.vcpu_id,
                pcpu_id: s.pcpu_id,
                _pad0: 0,
            },
            overflowed: s.overflowed,
            chain_len: 0,
            chain_end: s.chain_end,
            regs: s.regs,
        };
        let chain = &s.callchain[..s.chain_len as usize];
        let size = encode_sample(&mut record, &fixed, chain).expect("fits");
        // The consumer keeps up: the ring holds at most the current shipment's records.
        let tail = *cuts.last().expect("a cut");
        head = append_record(&mut data, tail, head, &record[..size]).expect("room");
        records += 1;
    }
    shipped.push(copy_out(&data, *cuts.last().expect("a cut"), head));
    cuts.push(head);
    assert!(
        head > DATA_SIZE as u64,
        "the records wrap around the 4 KiB area"
    );
    cuts.windows(2)
        .enumerate()
        .map(|(i, w)| {
            let (tail, head) = (w[0], w[1]);
            let batch = RingBatch {
                magic: RING_BATCH_MAGIC,
                data_size: DATA_SIZE as u32,
                sequence: i as u64,
                data_gpa: 0x20_0000,
                tail,
                head,
                tsc_khz: samples[0].tsc_khz,
                records,
                lost,
                record_max: vpmu::abi::XENPMU_RECORD_MAX as u32,
                ..RingBatch::default()
            };
            let mut bytes = batch.as_bytes().to_vec();
            bytes.extend(&shipped[i]);
            bytes
        })
        .collect()
}

/// `count` samples a guest read from its page, in the profiler's `struct batch_sample` form.
fn cached_samples<V: SimVendor>(vendor: V, count: usize) -> Vec<BatchSample> {
    let scenario = Scenario {
        pcpus: 1,
        domains: vec![1],
        mode: XENPMU_MODE_SELF,
        timing: Timing::Deferred,
        workloads: vec![vec![Run {
            function: 5,
            len: 40,
            branch_every: 3,
        }]],
        plans: vec![PlanSpec {
            counters: vec![CounterSpec {
                slot: 0,
                event: SimEvent::Instructions,
                os: true,
                usr: true,
                period: Some(17),
                initial: 0,
            }],
            page: true,
        }],
        steps: Vec::new(),
        filters: vec![None],
    };
    let mut world = World::new(vendor, &scenario);
    let id = world.guests[0].id;
    let gfn = world.guests[0].page_gfn.expect("a page");
    let mut samples = Vec::new();
    while samples.len() < count {
        world.step(Step::Run {
            pcpu: 0,
            vcpu: 0,
            count: 20,
        });
        let page = world.m.platform.frame(id.domain, gfn);
        let view = PageView::new(page).expect("a page");
        if view.is_cached() {
            let info = view.sample_info().expect("a 1.2 page");
            let identity = view.identity();
            samples.push(BatchSample {
                domain_id: identity.domain_id,
                vcpu_id: identity.vcpu_id,
                pcpu_id: identity.pcpu_id,
                flags: view.flags() as u32,
                regs: view.regs(),
                tsc: info.tsc,
                tsc_khz: info.tsc_khz,
                sequence: info.sequence,
                overflowed: info.overflowed,
                chain_len: info.chain_len,
                chain_end: info.chain_end,
                callchain: info.callchain,
            });
            // The handler runs when the vCPU is next scheduled in.
            world.step(Step::Read { vcpu: 0 });
        }
    }
    world.finish();
    samples
}

/// core_world: on every shape, a self-mode run with a sampling guest on a page and a counting
/// one, migrating between the pCPUs, toggling, reading, masking and restarting, while the
/// hostile vCPU registers a page, unmasks it, programs a sampling counter, runs into a sample,
/// flushes it and pokes at absent MSRs; and an all-mode run with the privileged profiler.
fn core_worlds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    for (vendor, name) in [
        (0u8, "intel-v5"),
        (1, "intel-v2"),
        (2, "amd-perfmonv2"),
        (3, "amd-k7"),
    ] {
        let hostile_program = match vendor {
            0 => program(&vpmu_sim::intel_v5(), &[sampling(0, 30)]),
            1 => program(&vpmu_sim::intel_v2(), &[sampling(0, 30)]),
            2 => program(&vpmu_sim::amd_v2(), &[sampling(0, 30)]),
            _ => program(&vpmu_sim::amd_legacy(), &[sampling(0, 30)]),
        };
        for (mode, mode_name) in [(1u8, "self"), (3, "all")] {
            let input = core_input(vendor, mode, &hostile_program);
            debug_assert_eq!(CoreInput::parse(&input.to_bytes()).as_ref(), Some(&input));
            seeds.push(Seed {
                target: "core_world",
                name: format!("seed-{name}-{mode_name}"),
                bytes: input.to_bytes(),
            });
        }
    }
    seeds
}

fn core_input(vendor: u8, mode: u8, hostile_program: &[Access]) -> CoreInput {
    let sampler = GuestIn {
        page: true,
        counters: vec![CounterIn {
            slot: 0,
            flags: 0b1110,
            period: 20,
            initial: 0,
        }],
        runs: vec![
            RunIn {
                function: 1,
                len: 30,
                branch_every: 2,
            },
            RunIn {
                function: 5,
                len: 25,
                branch_every: 3,
            },
        ],
    };
    let counter = GuestIn {
        page: false,
        counters: vec![
            CounterIn {
                slot: 1,
                flags: 0b0111,
                period: 0,
                initial: 7,
            },
            CounterIn {
                slot: 2,
                flags: 0b0110,
                period: 0,
                initial: 0,
            },
        ],
        runs: vec![RunIn {
            function: 4,
            len: 35,
            branch_every: 1,
        }],
    };
    let lvtpc = core::mem::offset_of!(Page, lapic_lvtpc) as u16;
    let hostile = |kind, a, b, value| Action::Hostile { kind, a, b, value };
    let mut actions = vec![
        Action::Run {
            pcpu: 0,
            vcpu: 0,
            count: 90,
        },
        Action::Run {
            pcpu: 1,
            vcpu: 1,
            count: 60,
        },
        // The hostile vCPU registers frame 0, unmasks its page's LVTPC and programs.
        hostile(0, XENPMU_OP_INIT as u8, 0, 0),
        hostile(2, 0, lvtpc, 0),
        hostile(0, XENPMU_OP_LVTPC_SET as u8, 0, 0),
    ];
    actions.extend(hostile_program.iter().map(|&a| Action::Access(a)));
    actions.extend([
        Action::Run {
            pcpu: 1,
            vcpu: 0,
            count: 70,
        },
        hostile(1, 0, 0, 40),
        hostile(3, 0, 0, 0),
        Action::Toggle {
            vcpu: 1,
            counter: 0,
        },
        Action::Run {
            pcpu: 0,
            vcpu: 1,
            count: 50,
        },
        Action::Read { vcpu: 1 },
        Action::MaskPage { vcpu: 0 },
        Action::Run {
            pcpu: 0,
            vcpu: 0,
            count: 45,
        },
        Action::MaskPage { vcpu: 0 },
        Action::Access(Access {
            range: 0x85,
            offset: 0,
            value: 0,
        }),
        Action::Access(Access {
            range: 0x7e,
            offset: 3,
            value: 0x4000_0000,
        }),
        Action::Restart { vcpu: 0 },
        Action::Idle { pcpu: 1 },
        Action::Run {
            pcpu: 1,
            vcpu: 0,
            count: 80,
        },
        hostile(1, 1, 0, 60),
        hostile(3, 0, 0, 0),
        hostile(0, 5, 0, 0),
    ]);
    CoreInput {
        vendor,
        mode,
        flags: 0,
        guests: vec![sampler, counter],
        actions,
    }
}
