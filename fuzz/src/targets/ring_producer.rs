//! The sample ring's producer (ABI 1.4), the hypervisor side, against a hostile consumer: a
//! [`RingWorld`] (the core over two pCPUs with software PMU models, two profilers sampling
//! through rings, self or all mode) plays PMIs in bursts, consumers that read some records or
//! none, tails of every kind (misaligned, ahead of the head, too far behind, rewound, any
//! value), page LVTPC masking, re-registration, frames of a ring area taken away under the
//! producer, the latency timer, and RING_INIT with patched configuration bytes. After every
//! step the world checks the ring's invariants (`vpmu_sim::ring_world`): no unread byte is
//! ever overwritten and nothing is written while the tail is impossible, every sample is
//! exactly one of published, lost or withheld and every sequence number is accounted for, the
//! producer's line is the hypervisor's, one VIRQ per wakeup, the re-armed periods add up to
//! what was counted, a refused RING_INIT changes nothing, PMIs are conserved. Nothing may make
//! the core return an error or panic.
//!
//! Input ([`RingInput::parse`], [`RingInput::to_bytes`] its inverse): vendor, mode, two
//! periods (u16 each: `2 + p % 600`), the data pages (bits 0-1 and 2-3: `1 << (b % 3)`), the
//! watermark and the latency bound (u16 each), then up to [`MAX_STEPS`] steps, each an opcode
//! byte (`% 8`) and its operands.

use vpmu::abi::{XENPMU_MODE_ALL, XENPMU_MODE_SELF};
use vpmu_sim::ring_world::{RingStep, RingWorld};
use vpmu_sim::{SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};

use crate::seeds::Seed;

/// Milestone: a consumer read a sample record.
pub const PUBLISHED: &str = "ring_producer: a sample record read";
/// Milestone: a consumer read a lost record.
pub const LOST: &str = "ring_producer: a lost record read";
/// Milestone: a consumer read a PAD (the data area wrapped).
pub const PAD: &str = "ring_producer: a PAD read (the data area wrapped)";

/// Steps per input at most.
pub const MAX_STEPS: usize = 64;
/// Bursts per input at most (each retires one burst of instructions).
pub const MAX_BURSTS: u32 = 3000;

/// A whole input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingInput {
    /// `% 4`: intel-v5, intel-v2, amd-perfmonv2, amd-k7.
    pub vendor: u8,
    /// Bit 0: all mode (else self).
    pub mode: u8,
    /// The profilers' periods, `2 + p % 600`.
    pub periods: [u16; 2],
    /// Bits 1:0 and 3:2: each ring's data pages, `1 << (b % 3)`.
    pub pages: u8,
    /// The watermark (`wakeup_bytes`; at most the data size is valid, 0 half of it).
    pub wakeup_bytes: u16,
    /// `max_latency_us`.
    pub max_latency_us: u16,
    /// The steps.
    pub steps: Vec<RingStep>,
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn byte(&mut self) -> Option<u8> {
        self.bytes::<1>().map(|[b]| b)
    }

    fn u64(&mut self) -> Option<u64> {
        self.bytes::<8>().map(u64::from_le_bytes)
    }
}

impl RingInput {
    /// Decodes an input; `None` if it is shorter than its header.
    pub fn parse(data: &[u8]) -> Option<RingInput> {
        let mut r = Reader(data);
        let [vendor, mode, p0, p1, p2, p3, pages, w0, w1, l0, l1] = r.bytes::<11>()?;
        let mut steps = Vec::new();
        while steps.len() < MAX_STEPS {
            let Some(op) = r.byte() else { break };
            let step = match op % 8 {
                0 => {
                    let [pcpu, bursts, b0, b1] = r.bytes::<4>()?;
                    RingStep::Run {
                        pcpu,
                        bursts,
                        burst: u16::from_le_bytes([b0, b1]),
                    }
                }
                1 => {
                    let [subject, limit] = r.bytes::<2>()?;
                    RingStep::Consume { subject, limit }
                }
                2 => {
                    let [subject, kind] = r.bytes::<2>()?;
                    RingStep::HostileTail {
                        subject,
                        kind,
                        amount: r.u64()?,
                    }
                }
                3 => {
                    let [subject, masked] = r.bytes::<2>()?;
                    RingStep::Mask {
                        subject,
                        masked: masked & 1 != 0,
                    }
                }
                4 => RingStep::Reregister { subject: r.byte()? },
                5 => {
                    let [subject, frame, bursts] = r.bytes::<3>()?;
                    RingStep::Unmapped {
                        subject,
                        frame,
                        bursts,
                    }
                }
                6 => RingStep::Timer {
                    ticks: u32::from_le_bytes(r.bytes::<4>()?),
                },
                _ => {
                    let subject = r.byte()?;
                    let mut patches = [(0u8, 0u64); 4];
                    for patch in &mut patches {
                        *patch = (r.byte()?, r.u64()?);
                    }
                    RingStep::HostileConfig { subject, patches }
                }
            };
            steps.push(step);
        }
        Some(RingInput {
            vendor,
            mode,
            periods: [u16::from_le_bytes([p0, p1]), u16::from_le_bytes([p2, p3])],
            pages,
            wakeup_bytes: u16::from_le_bytes([w0, w1]),
            max_latency_us: u16::from_le_bytes([l0, l1]),
            steps,
        })
    }

    /// The input's bytes: `parse(to_bytes(x)) == x` for every `x` of at most [`MAX_STEPS`]
    /// steps (with `masked` read back as given).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![self.vendor, self.mode];
        for period in self.periods {
            out.extend(period.to_le_bytes());
        }
        out.push(self.pages);
        out.extend(self.wakeup_bytes.to_le_bytes());
        out.extend(self.max_latency_us.to_le_bytes());
        for step in &self.steps {
            match *step {
                RingStep::Run {
                    pcpu,
                    bursts,
                    burst,
                } => {
                    out.extend([0, pcpu, bursts]);
                    out.extend(burst.to_le_bytes());
                }
                RingStep::Consume { subject, limit } => out.extend([1, subject, limit]),
                RingStep::HostileTail {
                    subject,
                    kind,
                    amount,
                } => {
                    out.extend([2, subject, kind]);
                    out.extend(amount.to_le_bytes());
                }
                RingStep::Mask { subject, masked } => out.extend([3, subject, u8::from(masked)]),
                RingStep::Reregister { subject } => out.extend([4, subject]),
                RingStep::Unmapped {
                    subject,
                    frame,
                    bursts,
                } => out.extend([5, subject, frame, bursts]),
                RingStep::Timer { ticks } => {
                    out.push(6);
                    out.extend(ticks.to_le_bytes());
                }
                RingStep::HostileConfig { subject, patches } => {
                    out.extend([7, subject]);
                    for (offset, value) in patches {
                        out.push(offset);
                        out.extend(value.to_le_bytes());
                    }
                }
            }
        }
        out
    }
}

/// The target.
pub fn run(data: &[u8]) {
    let Some(input) = RingInput::parse(data) else {
        return;
    };
    match input.vendor % 4 {
        0 => play(intel_v5(), &input),
        1 => play(intel_v2(), &input),
        2 => play(amd_v2(), &input),
        _ => play(amd_legacy(), &input),
    }
}

/// Plays `input` on `vendor`'s machine.
pub fn play<V: SimVendor>(vendor: V, input: &RingInput) {
    let mode = if input.mode & 1 != 0 {
        XENPMU_MODE_ALL
    } else {
        XENPMU_MODE_SELF
    };
    let periods = input.periods.map(|p| 2 + u64::from(p % 600));
    let pages = [input.pages, input.pages >> 2].map(|b| 1u32 << (b % 3));
    // A watermark above the data size would be refused: the world registers valid rings.
    let wakeup = u32::from(input.wakeup_bytes).min(4096);
    let mut world = RingWorld::new(
        vendor,
        mode,
        periods,
        pages,
        wakeup,
        u32::from(input.max_latency_us),
    );
    let mut budget = MAX_BURSTS;
    for &step in &input.steps {
        let step = match step {
            RingStep::Run {
                pcpu,
                bursts,
                burst,
            } => {
                let bursts = u32::from(bursts).min(budget);
                budget -= bursts;
                RingStep::Run {
                    pcpu,
                    bursts: bursts as u8,
                    burst,
                }
            }
            RingStep::Unmapped {
                subject,
                frame,
                bursts,
            } => {
                let bursts = u32::from(bursts % 16).min(budget);
                budget -= bursts;
                RingStep::Unmapped {
                    subject,
                    frame,
                    bursts: bursts as u8,
                }
            }
            other => other,
        };
        world.step(step);
    }
    world.finish();
    for (count, milestone) in [
        (world.records_read, PUBLISHED),
        (world.lost_read, LOST),
        (world.pads_read, PAD),
    ] {
        if count > 0 {
            crate::reached(milestone);
        }
    }
}

/// The seeds: on each shape, in self and all mode, a consumer that keeps up (records, a PAD
/// wrap), then one that does not (the ring fills, samples are lost, and the lost record comes
/// first once it reads again), with hostile tails, a masked page, a frame taken away, the
/// timer and a hostile configuration along the way.
pub fn seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    for vendor in 0..4u8 {
        for mode in 0..2u8 {
            let mut steps = Vec::new();
            for k in 0..12u8 {
                steps.push(RingStep::Run {
                    pcpu: k % 2,
                    bursts: 30,
                    burst: 7 + u16::from(k),
                });
                steps.push(RingStep::Consume {
                    subject: k % 2,
                    limit: u8::MAX,
                });
            }
            steps.extend([
                RingStep::HostileTail {
                    subject: 0,
                    kind: 1,
                    amount: 3,
                },
                RingStep::Run {
                    pcpu: 0,
                    bursts: 40,
                    burst: 9,
                },
                RingStep::Mask {
                    subject: 1,
                    masked: true,
                },
                RingStep::Run {
                    pcpu: 1,
                    bursts: 20,
                    burst: 9,
                },
                RingStep::Mask {
                    subject: 1,
                    masked: false,
                },
                RingStep::Unmapped {
                    subject: 1,
                    frame: 1,
                    bursts: 5,
                },
                RingStep::Timer { ticks: 300_000 },
                RingStep::HostileConfig {
                    subject: 0,
                    patches: [(0, 2), (4, 0), (64, 5000), (128, 0)],
                },
                RingStep::HostileConfig {
                    subject: 1,
                    patches: [(0, 3), (8, 1), (12, 1), (160, 1)],
                },
                // The slow consumer: 1-page rings fill, then it reads, and the losses come
                // first.
                RingStep::Run {
                    pcpu: 0,
                    bursts: 200,
                    burst: 5,
                },
                RingStep::Consume {
                    subject: 0,
                    limit: u8::MAX,
                },
                RingStep::Run {
                    pcpu: 0,
                    bursts: 20,
                    burst: 5,
                },
                RingStep::Consume {
                    subject: 0,
                    limit: 2,
                },
                RingStep::Consume {
                    subject: 0,
                    limit: u8::MAX,
                },
            ]);
            let input = RingInput {
                vendor,
                mode,
                periods: [10, 23],
                pages: 0,
                wakeup_bytes: 0,
                max_latency_us: 100,
                steps,
            };
            let shape = ["intel-v5", "intel-v2", "amd-perfmonv2", "amd-k7"][usize::from(vendor)];
            let mode = ["self", "all"][usize::from(mode)];
            seeds.push(Seed {
                target: "ring_producer",
                name: format!("seed-{shape}-{mode}"),
                bytes: input.to_bytes(),
            });
        }
    }
    seeds
}
