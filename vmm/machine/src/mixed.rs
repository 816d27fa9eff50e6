//! The mixed machine (`vpmu profile --profiler linux`): domain 0 is a Linux kernel booted as
//! `vpmu boot` boots one (`linux`: one vCPU, the PC devices, the host's quirks completed),
//! the privileged profiling domain; domains 1.. are the project's ELF programs, built as
//! `Machine::with_images` builds them, with the project's ports. All share ONE pCPU
//! (`Layout::SharedPcpus { pcpus: 1, .. }`: Linux here is uniprocessor), time-sliced on one
//! thread by `sched`.
//!
//! Linux idles in `hlt`; on a shared pCPU its idle turns go to the workloads until its LAPIC
//! timer is due, and the workloads can be held while it boots (`idle`). Linux reaches the
//! VMM's ports from user space through the MMIO port window (`window`).

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use vpmu::VcpuId;

use crate::boot::PcDevices;
use crate::error::Result;
use crate::kvm::{STACK_TOP, Vcpu, Vm};
use crate::linux::{LinuxOptions, linux_vm, quirks_for};
use crate::personality::Personality;
use crate::quirks::HostQuirks;
use crate::{Layout, Machine, PRIVILEGED_DOMAIN, STACK_SIZE};

/// The ELF domains of a mixed machine (domains 1..).
#[derive(Clone, Copy)]
pub struct Workloads<'i> {
    /// Domain `d`'s program (`d` from 1), as `Machine::with_images` takes it.
    pub image_of: &'i dyn Fn(u32) -> &'i [u8],
    /// How many ELF domains (0: Linux alone).
    pub domains: u32,
    /// vCPUs of each ELF domain.
    pub vcpus: u32,
    /// RDI of every ELF vCPU at entry (RSI is its domain number, as in shared layouts).
    pub arg: u64,
}

impl std::fmt::Debug for Workloads<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workloads")
            .field("domains", &self.domains)
            .field("vcpus", &self.vcpus)
            .field("arg", &self.arg)
            .finish_non_exhaustive()
    }
}

/// Domain `domain`'s VM running the ELF program `image`, and its `count` vCPUs (CPUID
/// `cpuid`), vCPU `i` entered with RDI = `arg` and RSI = `domain` in a shared layout, `i`
/// otherwise, each on its own stack.
pub(crate) fn elf_domain(
    kvm: &Kvm,
    cpuid: &CpuId,
    image: &[u8],
    domain: u32,
    count: u32,
    arg: u64,
    shared: bool,
) -> Result<(Vm, Vec<(VcpuId, Vcpu)>)> {
    let (vm, entry) = Vm::new(kvm, &crate::all_pmu_msr_ranges(), image)?;
    let mut vcpus = Vec::new();
    for i in 0..count {
        let rsp = STACK_TOP - u64::from(i) * STACK_SIZE;
        let rsi = if shared { domain } else { i };
        let fd = vm.create_vcpu(u64::from(i), cpuid, entry, rsp, arg, u64::from(rsi))?;
        vcpus.push((VcpuId { domain, vcpu: i }, fd));
    }
    Ok((vm, vcpus))
}

impl<P: Personality> Machine<P> {
    /// The mixed machine (module docs): domain 0 boots the Linux kernel `kernel` with
    /// `options` (its command line with the kernel parameters this host's quirks need
    /// appended: the quirks are probed here, as `linux::run` does, and completed for domain
    /// 0), ONE vCPU with the PC devices (COM1 captured in its result's console,
    /// isa-debug-exit giving its status, the keyboard controller's reset); domains 1.. run
    /// `workloads`; all on one pCPU (`Layout::SharedPcpus { pcpus: 1, domains: 1 +
    /// workloads.domains, vcpus: workloads.vcpus }`); the vpmu in self mode. Results come
    /// back one per vCPU, domain 0's first (with the pCPU's PMI log). `finish_with`,
    /// `extend`, `peek_after_run`, `memory` and `tsc_khz` work as with `with_images`; a run
    /// whose workloads never exit by themselves wants `finish_with(vec![0])` (Linux's
    /// isa-debug-exit or reset ends it, the workloads are stopped then). The window's and
    /// the project's ports reach the extension from every domain; Linux's port I/O goes to
    /// its PC devices (and the xenpmu transport's port to the vpmu).
    pub fn linux_with_images(
        kvm: &Kvm,
        personality: P,
        base_cpuid: &CpuId,
        kernel: &[u8],
        options: &LinuxOptions,
        workloads: &Workloads<'_>,
    ) -> Result<Self> {
        if workloads.domains > 0 && workloads.vcpus == 0 {
            return Err(crate::MachineError::Boot(
                "a workload domain needs at least one vCPU".into(),
            ));
        }
        let layout = Layout::SharedPcpus {
            pcpus: 1,
            domains: 1 + workloads.domains,
            vcpus: workloads.vcpus,
        };
        layout.check_domains()?;
        let (quirks, cmdline) = quirks_for(kvm, &personality, base_cpuid, options)?;
        let mut cpuid = base_cpuid.clone();
        personality.cpuid(&mut cpuid);
        let (linux, vcpu) = linux_vm(kvm, &cpuid, kernel, options, &cmdline)?;
        let mut vms = vec![linux];
        let linux_vcpu = VcpuId {
            domain: PRIVILEGED_DOMAIN,
            vcpu: 0,
        };
        let mut vcpus = vec![(linux_vcpu, vcpu)];
        for domain in 1..=workloads.domains {
            let image = (workloads.image_of)(domain);
            let (vm, fds) = elf_domain(
                kvm,
                &cpuid,
                image,
                domain,
                workloads.vcpus,
                workloads.arg,
                true,
            )?;
            vms.push(vm);
            vcpus.extend(fds);
        }
        let mut machine = Self::assemble(personality, layout, vms, vcpus)?;
        machine.devices = Some(PcDevices::new(options.mem_size as u64, options.echo));
        machine.quirks = quirks;
        Ok(machine)
    }

    /// A mixed machine: the workload domains are not scheduled until domain 0 writes
    /// `port::START` (non-zero) or `port::BATCH` (an `outl`, or the MMIO port window), or
    /// ends; so Linux boots alone on the pCPU. `port::START` with 0 holds them again.
    pub fn hold_workloads(&mut self) {
        self.shared.hold.hold();
    }

    /// The host quirks the machine completes for domain 0 (a Linux domain's; none
    /// otherwise).
    pub fn host_quirks(&self) -> &HostQuirks {
        &self.quirks
    }
}
