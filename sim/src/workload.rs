//! Synthetic workloads: every domain has named functions with disjoint address ranges, and a
//! workload is a sequence of instructions, each with an address inside one of its domain's
//! functions, a privilege level (the function's: kernel or user code) and a branch flag.

use proptest::prelude::*;
use vpmu::VcpuId;
use vpmu::abi::{Regs, XENPMU_REGS_MODE_64, XENPMU_REGS_MODE_USER};

/// Functions per domain.
pub const FUNCTIONS: u32 = 8;
/// Size of every function's address range.
pub const FUNCTION_SIZE: u64 = 0x10_000;

const NAMES: [&str; FUNCTIONS as usize] = [
    "schedule",
    "tcp_v4_rcv",
    "copy_to_user",
    "handle_page_fault",
    "main",
    "parse_request",
    "memcpy",
    "hash_lookup",
];

/// First address of function `function` of `domain`.
pub fn function_base(domain: u32, function: u32) -> u64 {
    0x1000_0000 * u64::from(domain + 1) + FUNCTION_SIZE * u64::from(function)
}

/// Whether a function is user code (CPL 3); the others are kernel code (CPL 0).
pub fn is_user_function(function: u32) -> bool {
    function >= FUNCTIONS / 2
}

/// The function of `domain` containing `rip`.
pub fn symbolize(domain: u32, rip: u64) -> Option<u32> {
    (0..FUNCTIONS).find(|&f| {
        (function_base(domain, f)..function_base(domain, f) + FUNCTION_SIZE).contains(&rip)
    })
}

/// A function's name as a profiler reports it.
pub fn function_name(domain: u32, function: u32) -> String {
    format!("dom{domain}:{}", NAMES[(function % FUNCTIONS) as usize])
}

/// One retired instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Instruction {
    /// Its address.
    pub rip: u64,
    /// Privilege level: 0 (kernel) or 3 (user).
    pub cpl: u8,
    /// Whether it is a branch.
    pub branch: bool,
}

/// A stretch of a workload spent in one function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Function index.
    pub function: u32,
    /// Instructions.
    pub len: u32,
    /// Every `branch_every`-th instruction is a branch (0: none).
    pub branch_every: u32,
}

/// The instructions of `runs` for a vCPU of `domain`. Successive runs of a function continue
/// where the previous one stopped, so that addresses vary.
pub fn build(domain: u32, runs: &[Run]) -> Vec<Instruction> {
    let mut offsets = [0u64; FUNCTIONS as usize];
    let mut out = Vec::new();
    for run in runs {
        let f = run.function % FUNCTIONS;
        let offset = &mut offsets[f as usize];
        for k in 0..run.len {
            out.push(Instruction {
                rip: function_base(domain, f) + *offset,
                cpl: if is_user_function(f) { 3 } else { 0 },
                branch: run.branch_every != 0 && k % run.branch_every == run.branch_every - 1,
            });
            *offset = (*offset + 4) % FUNCTION_SIZE;
        }
    }
    if out.is_empty() {
        out.push(Instruction {
            rip: function_base(domain, 0),
            cpl: 0,
            branch: false,
        });
    }
    out
}

/// Frames of every simulated vCPU's call chain (the stack `SimPlatform` lays out).
pub const STACK_FRAMES: usize = 3;

/// Where `vcpu`'s stack pointer is while it retires instructions.
pub fn stack_pointer(vcpu: VcpuId) -> u64 {
    let tag = u64::from(vcpu.domain) << 32 | u64::from(vcpu.vcpu);
    0x7fff_0000_0000 - (tag << 12)
}

/// `vcpu`'s innermost frame: RBP while it retires instructions.
pub fn frame_pointer(vcpu: VcpuId) -> u64 {
    stack_pointer(vcpu) + 0x40
}

/// The return addresses `vcpu`'s frame-pointer chain holds, innermost first: addresses in its
/// own domain's functions, distinct per vCPU, so that a chain read from any other address
/// space (another vCPU's, another domain's) is caught.
pub fn expected_chain(vcpu: VcpuId) -> [u64; STACK_FRAMES] {
    core::array::from_fn(|k| {
        function_base(vcpu.domain, k as u32) + 0x10 * u64::from(vcpu.vcpu) + 8 * k as u64 + 5
    })
}

/// `vcpu`'s stack as (address, 64-bit word) pairs: `STACK_FRAMES` frames of saved RBP and
/// return address from `frame_pointer(vcpu)` upwards, the outermost with a saved RBP of 0.
pub fn stack_words(vcpu: VcpuId) -> Vec<(u64, u64)> {
    let chain = expected_chain(vcpu);
    let mut words = Vec::new();
    let mut frame = frame_pointer(vcpu);
    for (k, &ret) in chain.iter().enumerate() {
        let next = if k + 1 == STACK_FRAMES {
            0
        } else {
            frame + 0x30
        };
        words.push((frame, next));
        words.push((frame + 8, ret));
        frame += 0x30;
    }
    words
}

/// The register state of `vcpu` retiring `insn`: RIP, CPL and mode from the instruction,
/// selectors from the privilege level, and registers tagged with the vCPU's identity and the
/// instruction's sequence number, so a sample carrying anyone else's registers is caught.
pub fn regs(vcpu: VcpuId, insn: &Instruction, seq: u64) -> Regs {
    let user = insn.cpl == 3;
    let tag = u64::from(vcpu.domain) << 32 | u64::from(vcpu.vcpu);
    Regs {
        rax: tag,
        rbx: seq,
        rsp: stack_pointer(vcpu),
        rbp: frame_pointer(vcpu),
        rip: insn.rip,
        rflags: 0x202,
        cs: if user { 0x33 } else { 0x10 },
        ss: if user { 0x2b } else { 0x18 },
        cpl: insn.cpl,
        mode: XENPMU_REGS_MODE_64 | if user { XENPMU_REGS_MODE_USER } else { 0 },
        ..Regs::default()
    }
}

/// A run of up to `max_len` instructions in any function.
pub fn run_strategy(max_len: u32) -> impl Strategy<Value = Run> {
    (0..FUNCTIONS, 1..=max_len, 0..4u32).prop_map(|(function, len, branch_every)| Run {
        function,
        len,
        branch_every,
    })
}

/// A workload of up to `max_runs` runs.
pub fn workload_strategy(max_runs: usize, max_len: u32) -> impl Strategy<Value = Vec<Run>> {
    proptest::collection::vec(run_strategy(max_len), 1..=max_runs)
}

/// A workload dominated by one function (`hot`): random long runs of it and short runs of the
/// others, topped up so that `hot` has at least three quarters of the instructions. Take
/// enough runs that the workload does not repeat during a run: a short cyclic workload sampled
/// with a fixed period aliases (every sample can land on the same few instructions).
pub fn skewed_workload_strategy(
    hot: u32,
    runs: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Vec<Run>> {
    let run = prop_oneof![
        (40..=90u32, 0..4u32).prop_map(move |(len, branch_every)| Run {
            function: hot,
            len,
            branch_every,
        }),
        (0..FUNCTIONS, 1..=12u32, 0..4u32).prop_map(move |(f, len, branch_every)| Run {
            function: if f == hot { (f + 1) % FUNCTIONS } else { f },
            len,
            branch_every,
        }),
    ];
    proptest::collection::vec(run, runs).prop_map(move |mut runs| {
        let (hot_len, cold_len) = runs.iter().fold((0, 0), |(h, c), r| {
            if r.function == hot {
                (h + r.len, c)
            } else {
                (h, c + r.len)
            }
        });
        if hot_len < 3 * cold_len + 1 {
            runs.push(Run {
                function: hot,
                len: 3 * cold_len + 1 - hot_len,
                branch_every: 2,
            });
        }
        runs
    })
}
