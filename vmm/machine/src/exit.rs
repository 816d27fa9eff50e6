//! Exits: copying them out of `kvm_run`, and answering PMU MSR accesses and the
//! control-operation hypercall through the vpmu core.

use std::io;
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuExit;
use vpmu::abi::ops::{OpError, Params};
use vpmu::{Msr, MsrOutcome};
use zerocopy::{FromBytes, IntoBytes};

use super::RunResult;
use super::runner::Runner;
use crate::personality::Personality;

/// Between two attempts of a control operation the core answered `-EAGAIN`: long enough for
/// the other pCPU threads to run (two cores here), short against a kick's latency.
const AGAIN_BACKOFF: Duration = Duration::from_micros(20);

/// An exit, copied out of `kvm_run` so that the vCPU is free again; replies go through the
/// raw pointers into the `kvm_run` page (valid while the vCPU fd lives).
pub(super) enum Exit {
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

    pub(super) fn next_exit(&mut self) -> io::Result<Exit> {
        let exit = match self.vcpu.fd.run() {
            Ok(exit) => exit,
            Err(e) if e.errno() == libc::EINTR => {
                self.vcpu.fd.set_kvm_immediate_exit(0);
                return Ok(Exit::Kicked);
            }
            Err(e) => return Err(e.into()),
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
                    value: u32::from_le_bytes(b),
                }
            }
            VcpuExit::IoIn(port, data) => Exit::In {
                port,
                data: data.as_mut_ptr(),
                len: data.len(),
            },
            VcpuExit::Debug(d) => Exit::Debug { pc: d.pc },
            other => Exit::Other(format!("unexpected exit {other:?}")),
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

    /// The control-operation hypercall: EDI = op, RSI (ESI in compatibility mode) = GPA of
    /// the parameter block. Returns 0 or `-errno` (as the 32-bit EAX value). An operation
    /// that waits for other pCPUs (`-EAGAIN`) is restarted here, as a hypervisor restarts the
    /// hypercall, after this pCPU completed its own requests (another pCPU's operation may
    /// wait for them) and holding no lock, until it completes or `deadline` passes (the guest
    /// then sees the `-EAGAIN`).
    pub(super) fn hypercall(&mut self, deadline: Instant) -> io::Result<u32> {
        let op = self.sync.regs.rdi as u32;
        // From compatibility mode (CS.L = 0) the address is ESI: the upper half of RSI is
        // whatever 64-bit code left there.
        let gpa = if self.sync.sregs.cs.l == 0 {
            self.sync.regs.rsi & 0xffff_ffff
        } else {
            self.sync.regs.rsi
        };
        let size = std::mem::size_of::<Params>();
        let Some(params) = self
            .vm
            .mem
            .slice_mut(gpa, size)
            .and_then(|b| Params::read_from_bytes(b).ok())
        else {
            return Ok((-i64::from(vpmu::abi::ops::XENPMU_EINVAL)) as u32);
        };
        let me = self.me;
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
        Ok(match result {
            Ok(out) => {
                if let Some(b) = self.vm.mem.slice_mut(gpa, size) {
                    b.copy_from_slice(out.as_bytes());
                }
                0
            }
            Err(e) => {
                // The one error with an OUT field: -ENOBUFS tells the size needed.
                if let OpError::BufferTooSmall { needed } = e {
                    let mut out = vpmu::abi::ops::CoverageParams::from(params);
                    out.size = needed;
                    if let Some(b) = self.vm.mem.slice_mut(gpa, size) {
                        b.copy_from_slice(Params::from(out).as_bytes());
                    }
                }
                e.return_value() as u32
            }
        })
    }
}
