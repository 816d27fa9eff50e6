//! A physical CPU: a host thread that owns its `PcpuPmu` (the core's rule: each pCPU's state is
//! driven only from that CPU), runs the jobs the scheduler gives it, and before each one
//! completes the cross-CPU requests other pCPUs sent it, as a hypervisor does before it next
//! enters a guest.

use std::sync::mpsc::{self, Receiver, Sender};

use vpmu_vendor_any::VendorContext;
use vpmu_vendor_any::vpmu::abi::ops::{OpError, Params};
use vpmu_vendor_any::vpmu::abi::{Regs, XENPMU_REGS_MODE_64};
use vpmu_vendor_any::vpmu::{Completion, CoreError, Msr, MsrOutcome, PcpuPmu, PmiOutcome, VcpuId};

use crate::host::{Host, HostCpu};
use crate::machine::MachinePmu;

/// Work for a pCPU thread, run on it.
pub type Job = Box<dyn FnOnce(&mut Cpu<'_>) + Send>;

/// A PMI the pCPU took while a guest ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakenPmi {
    /// The guest instruction it interrupted.
    pub rip: u64,
    /// What the core did with it.
    pub outcome: PmiOutcome,
}

/// A pCPU as its own thread sees it.
#[derive(Debug)]
pub struct Cpu<'h> {
    /// The platform services, as this pCPU presents them to the core.
    pub platform: HostCpu<'h>,
    /// The core's per-pCPU state, with this CPU's PMU as its bus.
    pub pmu: PcpuPmu<VendorContext, MachinePmu>,
    /// Requests other pCPUs sent this one that it completed.
    pub requests_completed: u32,
    /// Set by the last job: the thread hands its PMU back and ends.
    powered_off: bool,
}

impl<'h> Cpu<'h> {
    fn host(&self) -> &'h Host {
        self.platform.host
    }

    /// The vCPU running here.
    ///
    /// # Panics
    /// If none runs: a guest action needs a guest.
    pub fn current(&self) -> VcpuId {
        self.pmu.current().expect("a vCPU runs on this pCPU")
    }

    /// Completes, in order, the requests other pCPUs sent this one.
    pub fn complete_requests(&mut self) {
        let host = self.host();
        loop {
            // The inbox lock is not held across the core's call: completing may send requests.
            let Some(request) = host.inboxes[self.platform.index as usize]
                .lock()
                .unwrap()
                .pop_front()
            else {
                return;
            };
            host.vpmu
                .complete_request(&mut self.platform, &mut self.pmu, &host.vcpus, request)
                .expect("a request completes");
            self.requests_completed += 1;
        }
    }

    /// The scheduler runs `next` on this pCPU (`None`: idle). A vCPU that runs elsewhere must
    /// have been switched out there first.
    pub fn switch_to(&mut self, next: Option<VcpuId>) -> Result<(), CoreError> {
        let host = self.host();
        self.platform.in_guest = None;
        host.vpmu
            .context_switch(&mut self.platform, &mut self.pmu, &host.vcpus, next)
    }

    /// The running guest executes WRMSR: the VM exit's handler.
    pub fn wrmsr(&mut self, msr: u32, value: u64) -> MsrOutcome<()> {
        let host = self.host();
        // The running vCPU's own lock may be held across an intercept (the core's rule).
        let mut vcpu = host.vcpus.lock(self.current());
        host.vpmu
            .wrmsr(
                &mut self.platform,
                &mut self.pmu,
                &mut vcpu,
                Msr(msr),
                value,
            )
            .expect("no hardware fault")
    }

    /// The running guest executes RDMSR.
    pub fn rdmsr(&mut self, msr: u32) -> MsrOutcome<u64> {
        let host = self.host();
        let mut vcpu = host.vcpus.lock(self.current());
        host.vpmu
            .rdmsr(&mut self.platform, &mut self.pmu, &mut vcpu, Msr(msr))
            .expect("no hardware fault")
    }

    /// The running guest executes RDPMC with ECX = `selector` in its kernel (CPL 0).
    pub fn rdpmc(&mut self, selector: u32) -> MsrOutcome<u64> {
        let host = self.host();
        let mut vcpu = host.vcpus.lock(self.current());
        host.vpmu
            .rdpmc(
                &mut self.platform,
                &mut self.pmu,
                &mut vcpu,
                selector,
                0,
                false,
            )
            .expect("no hardware fault")
    }

    /// The running guest makes the xenpmu hypercall `op`. The caller's lock is not held: the
    /// core visits it (and its siblings) through the table.
    pub fn hypercall(&mut self, op: u32, params: Params) -> Result<Params, OpError> {
        let host = self.host();
        let caller = self.current();
        host.vpmu.control_op(
            &mut self.platform,
            &mut self.pmu,
            &host.vcpus,
            caller,
            op,
            &params,
        )
    }

    /// The running guest retires `count` kernel instructions, 4 bytes apart from `rip`; the
    /// PMU's interrupt is handled as it is raised, at the instruction that raised it.
    pub fn retire(&mut self, rip: u64, count: u64) -> Vec<TakenPmi> {
        let host = self.host();
        let vcpu = self.current();
        let mut pmis = Vec::new();
        for k in 0..count {
            let regs = Regs {
                rip: rip + 4 * k,
                mode: XENPMU_REGS_MODE_64,
                ..Regs::default()
            };
            self.platform.in_guest = Some((vcpu, regs));
            host.resume_regs.lock().unwrap().insert(vcpu, regs);
            self.pmu.hw_mut().retire_guest_instruction();
            // A masked physical LVTPC holds the interrupt back until it is unmasked (the core
            // masks it while a sample waits in a page).
            if !self.platform.lvtpc_masked && self.pmu.hw_mut().take_pmi() {
                let outcome = host
                    .vpmu
                    .handle_pmi(&mut self.platform, &mut self.pmu, &host.vcpus)
                    .expect("no hardware fault");
                pmis.push(TakenPmi {
                    rip: regs.rip,
                    outcome,
                });
            }
        }
        self.platform.in_guest = None;
        pmis
    }

    /// The hypervisor destroys `vcpu`'s vPMU (its domain is being destroyed), from this pCPU.
    pub fn teardown(&mut self, vcpu: VcpuId) -> Completion {
        let host = self.host();
        host.vpmu
            .teardown_vcpu(&mut self.platform, &mut self.pmu, &host.vcpus, vcpu)
            .expect("no hardware fault")
    }
}

/// The scheduler's handle on a pCPU thread.
#[derive(Clone, Debug)]
pub struct PcpuHandle {
    jobs: Sender<Job>,
}

impl PcpuHandle {
    /// Runs `job` on the pCPU's thread and returns its result.
    ///
    /// # Panics
    /// If the pCPU's thread is gone (a check on it failed).
    pub fn run<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Cpu<'_>) -> R + Send + 'static,
    ) -> R {
        let (reply, result) = mpsc::channel();
        let job: Job = Box::new(move |cpu| {
            let _ = reply.send(job(cpu));
        });
        self.jobs.send(job).expect("the pCPU thread runs");
        result.recv().expect("the pCPU thread ran the job")
    }
}

/// Powers every pCPU off when dropped, without waiting for them: at the end of a run, and when
/// a check fails (a panic unwinding through the scheduler), so that the pCPU threads end and
/// the failure is reported rather than waited on forever. Each thread then runs no vCPU,
/// detaches its pCPU from the vPMU and returns its PMU.
#[derive(Debug)]
pub struct PowerOff<'a>(pub &'a [PcpuHandle]);

impl Drop for PowerOff<'_> {
    fn drop(&mut self) {
        for pcpu in self.0 {
            let off: Job = Box::new(|cpu| cpu.powered_off = true);
            // A thread that is gone (its job failed) has nothing left to stop.
            let _ = pcpu.jobs.send(off);
        }
    }
}

/// The job queue of one pCPU: the scheduler's handle, the host's kick, and the thread's end.
pub fn job_queue() -> (PcpuHandle, Sender<Job>, Receiver<Job>) {
    let (jobs, queue) = mpsc::channel();
    (PcpuHandle { jobs: jobs.clone() }, jobs, queue)
}

/// The body of pCPU `index`'s thread: attaches the CPU's PMU `hw` to the vPMU (on this CPU,
/// before it first enters a guest), runs jobs until powered off, then runs no vCPU and
/// detaches. Returns the PMU, for the caller to check what was left on it.
pub fn run(host: &Host, index: u32, hw: MachinePmu, jobs: Receiver<Job>) -> MachinePmu {
    let pmu = host.vpmu.attach_pcpu(index, hw).expect("attach the pCPU");
    let mut cpu = Cpu {
        platform: HostCpu {
            host,
            index,
            in_guest: None,
            lvtpc_masked: false,
            requests_sent: 0,
        },
        pmu,
        requests_completed: 0,
        powered_off: false,
    };
    while let Ok(job) = jobs.recv() {
        cpu.complete_requests();
        job(&mut cpu);
        if cpu.powered_off {
            break;
        }
    }
    cpu.complete_requests();
    cpu.switch_to(None).expect("switch to idle");
    host.vpmu
        .detach_pcpu(&mut cpu.platform, cpu.pmu, &host.vcpus)
        .expect("detach the pCPU")
}
