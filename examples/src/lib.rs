//! # vpmu-examples: a toy hypervisor embedding the vPMU
//!
//! The hypervisor side of an integration, small enough to read in one sitting, and run by
//! `cargo test` (the `two_pcpus` example) on every vendor shape. It is written once, against
//! the vendor-erased backend of `vpmu-vendor-any`: the vendor is read from CPUID at boot.
//!
//! * [`machine`]: what the hypervisor boots on: a CPUID and one PMU per physical CPU, both
//!   software here (the `vpmu-models` PMUs, which behave like the hardware).
//! * [`host`]: the state every pCPU shares ([`host::Host`]: the `Vpmu`, the vCPU table with a
//!   lock per vCPU, guest memory for the shared pages, virtual LAPICs, the request inboxes)
//!   and the core's `Platform` ([`host::HostCpu`], one per pCPU thread).
//! * [`pcpu`]: a physical CPU as a host thread owning its `PcpuPmu`: guest entry, the VM
//!   exits of guest RDMSR/WRMSR/RDPMC and of the hypercall, the PMU interrupt, context
//!   switches, cross-CPU requests completed before the next guest entry, teardown.
//! * [`guest`]: the guest's perf driver (which MSRs a guest kernel writes).
//!
//! The scenario, with every check, is `examples/two_pcpus.rs`:
//! `cargo run -p vpmu-examples --example two_pcpus`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender};

use vpmu_vendor_any::vpmu::abi::Page;
use vpmu_vendor_any::vpmu::{Mode, VcpuId, Vpmu};
use vpmu_vendor_any::{SelectError, VendorPmu};

pub mod guest;
pub mod host;
pub mod machine;
pub mod pcpu;

use host::{Host, Vcpus};
use machine::Machine;
use pcpu::{Job, PcpuHandle};

/// Guest frame `index` of `domain`: every domain has [`FRAMES_PER_DOMAIN`] frames of RAM here,
/// at numbers no other domain uses.
pub fn guest_frame(domain: u32, index: u64) -> u64 {
    0x1000 * u64::from(domain + 1) + index
}

/// Frames of RAM each domain has (its vCPUs' shared pages among them).
pub const FRAMES_PER_DOMAIN: u64 = 4;

/// A booted toy hypervisor, before its pCPU threads start: the shared host, and per pCPU the
/// scheduler's handle and the thread's job queue.
#[derive(Debug)]
pub struct Booted {
    /// The state every pCPU shares.
    pub host: Host,
    /// The scheduler's handle on each pCPU.
    pub pcpus: Vec<PcpuHandle>,
    /// Each pCPU thread's job queue, for [`pcpu::run`].
    pub queues: Vec<Receiver<Job>>,
}

/// Boots the hypervisor on `machine` with `pcpus` physical CPUs and domains of
/// `vcpus_per_domain[d]` vCPUs (domain 0 privileged), the vPMU in self mode (every guest
/// profiles itself). The vendor backend is chosen from the machine's CPUID, with
/// IA32_PERF_CAPABILITIES read only if CPUID says it exists.
pub fn boot(
    machine: &Machine,
    pcpus: u32,
    vcpus_per_domain: &[u32],
) -> Result<Booted, SelectError> {
    let backend = VendorPmu::from_cpuid(machine.cpuid(), || machine.read_perf_capabilities())?;
    let vpmu = Vpmu::new(backend, Mode::SelfProfiling, pcpus);
    let ids = (0u32..)
        .zip(vcpus_per_domain)
        .flat_map(|(domain, &n)| (0..n).map(move |vcpu| VcpuId { domain, vcpu }));
    let vcpus = Vcpus::new(ids.map(|id| {
        vpmu.new_vcpu(id)
            .expect("a domain id below the reserved range")
    }));
    let mut memory = BTreeMap::new();
    for domain in 0..vcpus_per_domain.len() as u32 {
        for index in 0..FRAMES_PER_DOMAIN {
            memory.insert(
                (domain, guest_frame(domain, index)),
                Box::new(Page::zeroed()),
            );
        }
    }
    let (mut handles, mut kicks, mut queues) = (Vec::new(), Vec::<Sender<Job>>::new(), Vec::new());
    for _ in 0..pcpus {
        let (handle, kick, queue) = pcpu::job_queue();
        handles.push(handle);
        kicks.push(kick);
        queues.push(queue);
    }
    let host = Host {
        vpmu,
        vcpus,
        privileged: 0,
        memory: Mutex::new(memory),
        mappings: Mutex::default(),
        lapics: Mutex::default(),
        virqs: Mutex::default(),
        inboxes: (0..pcpus).map(|_| Mutex::default()).collect(),
        kick: kicks,
        resume_regs: Mutex::default(),
        diagnostics: Mutex::default(),
    };
    Ok(Booted {
        host,
        pcpus: handles,
        queues,
    })
}
