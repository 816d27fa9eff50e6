//! Exits: copying them out of `kvm_run`, and answering PMU MSR accesses and the
//! control-operation hypercall through the vpmu core.

use std::time::{Duration, Instant};

use kvm_ioctls::VcpuExit;
use vpmu::abi::ops::{OpError, Params, XENPMU_OP_FINISH, XENPMU_OP_MODE_SET};
use vpmu::{Msr, MsrOutcome, VcpuId};
use zerocopy::IntoBytes;

use super::RunResult;
use super::runner::Runner;
use crate::error::{MachineError, Result};
use crate::personality::Personality;
use crate::transport::{self, Call};

/// Between two attempts of a control operation the core answered `-EAGAIN`: long enough for
/// the other pCPU threads to run (two cores here), short against a kick's latency.
const AGAIN_BACKOFF: Duration = Duration::from_micros(20);

/// An exit, copied out of `kvm_run` so that the vCPU is free again; replies go through the
/// raw pointers into the `kvm_run` page (valid while the vCPU fd lives).
pub(crate) enum Exit {
    Rdmsr {
        index: u32,
        data: *mut u64,
        error: *mut u8,
    },
    Wrmsr {
        index: u32,
        value: u64,
        error: *mut u8,
    },
    Out {
        port: u16,
        size: usize,
        value: u32,
    },
    In {
        port: u16,
        data: *mut u8,
        len: usize,
    },
    Debug {
        pc: u64,
    },
    /// A read of guest-physical memory that is not RAM, at `addr`; `data` points at `len`
    /// bytes of the `kvm_run` page, the value the read returns.
    MmioRead {
        addr: u64,
        data: *mut u8,
        len: usize,
    },
    /// A write of `len` bytes (at most 8, little-endian in `value`) to guest-physical memory
    /// that is not RAM, at `addr`.
    MmioWrite {
        addr: u64,
        value: u64,
        len: usize,
    },
    /// The vCPU shut down (a triple fault).
    Shutdown,
    /// KVM could not run the guest's next instruction (`KVM_EXIT_INTERNAL_ERROR`).
    InternalError,
    /// `KVM_RUN` returned `EINTR`: kicked.
    Kicked,
    Other(String),
}

/// How PMU MSR exits are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MsrHandler {
    Vpmu,
    /// Benchmark baseline: reads return 0, writes are dropped, nothing else runs.
    Null,
}

impl<P: Personality> Runner<'_, P> {
    pub(super) fn account(&self, result: &mut RunResult, t: Instant) {
        let slot = &mut result.msr_exit_ns[usize::from(self.handler == MsrHandler::Null)];
        slot.0 += 1;
        slot.1 += t.elapsed().as_nanos() as u64;
    }

    pub(super) fn next_exit(&mut self) -> Result<Exit> {
        let exit = match self.vcpu.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR => {
                self.vcpu.fd.set_kvm_immediate_exit(0);
                return Ok(Exit::Kicked);
            }
            Err(e) => {
                return Err(MachineError::Kvm {
                    ioctl: "KVM_RUN",
                    source: e,
                });
            }
        };
        Ok(match exit {
            VcpuExit::X86Rdmsr(e) => Exit::Rdmsr {
                index: e.index,
                data: e.data,
                error: e.error,
            },
            VcpuExit::X86Wrmsr(e) => Exit::Wrmsr {
                index: e.index,
                value: e.data,
                error: e.error,
            },
            VcpuExit::IoOut(port, data) => {
                let mut b = [0u8; 4];
                let n = data.len().min(4);
                b[..n].copy_from_slice(&data[..n]);
                Exit::Out {
                    port,
                    size: n,
                    value: u32::from_le_bytes(b),
                }
            }
            VcpuExit::IoIn(port, data) => Exit::In {
                port,
                data: data.as_mut_ptr(),
                len: data.len(),
            },
            VcpuExit::Debug(d) => Exit::Debug { pc: d.pc },
            VcpuExit::MmioRead(addr, data) => Exit::MmioRead {
                addr,
                data: data.as_mut_ptr(),
                len: data.len(),
            },
            VcpuExit::MmioWrite(addr, data) => {
                let mut b = [0u8; 8];
                let len = data.len().min(8);
                b[..len].copy_from_slice(&data[..len]);
                Exit::MmioWrite {
                    addr,
                    value: u64::from_le_bytes(b),
                    len: data.len(),
                }
            }
            VcpuExit::Shutdown => Exit::Shutdown,
            VcpuExit::InternalError => Exit::InternalError,
            other => Exit::Other(format!("{other:?}")),
        })
    }

    pub(super) fn rdmsr(&mut self, index: u32) -> Option<u64> {
        if self.handler == MsrHandler::Null {
            return Some(0);
        }
        let me = self.me;
        let mut p = self.parts();
        // The vCPU at hand: its own lock, which no other pCPU holds for long.
        let mut vcpu = p.shared.vcpus.lock(me)?;
        let outcome = p
            .shared
            .vpmu
            .rdmsr(&mut p.platform, p.pmu, &mut vcpu, Msr(index))
            .ok();
        match outcome {
            Some(MsrOutcome::Handled(v)) => Some(v),
            // #GP: refused, absent, or another vendor's PMU MSR (NotPmu).
            _ => None,
        }
    }

    pub(super) fn wrmsr(&mut self, index: u32, value: u64) -> bool {
        if self.handler == MsrHandler::Null {
            return true;
        }
        let me = self.me;
        let mut p = self.parts();
        let Some(mut vcpu) = p.shared.vcpus.lock(me) else {
            return false;
        };
        let outcome = p
            .shared
            .vpmu
            .wrmsr(&mut p.platform, p.pmu, &mut vcpu, Msr(index), value);
        matches!(outcome, Ok(MsrOutcome::Handled(())))
    }

    /// A call through the reference transport (docs/abi.md "Transport"): an IN of `len`
    /// bytes from `port::HYPERCALL`, decoded by `transport::decode` (size, CPL, RAX, op, the
    /// block: each refusal is the transport's error, before any of the operation's checks);
    /// returns the IN's value: all ones for an access that is no call, else EAX = 0 or
    /// `-errno`. An operation that waits for
    /// other pCPUs (`-EAGAIN`) is restarted here, as a hypervisor restarts the hypercall,
    /// after this pCPU completed its own requests (another pCPU's operation may wait for them)
    /// and holding no lock, until it completes or `deadline` passes (the guest then sees the
    /// `-EAGAIN`). Once FINISH has torn a vCPU down, or MODE_SET has left a mode, the LVTPC
    /// deliveries still queued for the vCPUs concerned are dropped (reported not delivered).
    pub(super) fn hypercall(&mut self, len: usize, deadline: Instant) -> Result<u32> {
        let mem = &self.vm.mem;
        let (op, gpa) = match transport::decode(&self.sync, len, |gpa, n| mem.contains(gpa, n)) {
            Call::Ignored => return Ok(u32::MAX),
            Call::Refused(errno) => return Ok(errno as u32),
            Call::Op { op, gpa } => (op, gpa),
        };
        let Some(params) = self.vm.mem.read_as::<Params>(gpa) else {
            return Ok((-i64::from(vpmu::abi::XENPMU_EFAULT)) as u32);
        };
        let me = self.me;
        let mode_before = self.shared.vpmu.mode();
        let result = loop {
            self.complete_requests()?;
            let mut p = self.parts();
            let result =
                p.shared
                    .vpmu
                    .control_op(&mut p.platform, p.pmu, &p.shared.vcpus, me, op, &params);
            if result != Err(OpError::Again) || Instant::now() >= deadline {
                break result;
            }
            std::thread::sleep(AGAIN_BACKOFF);
        };
        if result.is_ok() {
            if op == XENPMU_OP_FINISH {
                self.shared.discard_queued(VcpuId {
                    domain: me.domain,
                    vcpu: params.vcpu,
                });
            } else if op == XENPMU_OP_MODE_SET && self.shared.vpmu.mode() != mode_before {
                self.shared.discard_all_queued();
            }
        }
        Ok(match result {
            Ok(out) => {
                // Inside RAM: the block was read from there.
                let _ = self.vm.mem.write(gpa, out.as_bytes());
                0
            }
            Err(e) => {
                // The one error with an OUT field: -ENOBUFS tells the size needed.
                if let OpError::BufferTooSmall { needed } = e {
                    let mut out = vpmu::abi::ops::CoverageParams::from(params);
                    out.size = needed;
                    let _ = self.vm.mem.write(gpa, Params::from(out).as_bytes());
                }
                e.return_value() as u32
            }
        })
    }
}
