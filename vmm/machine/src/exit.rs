//! Exits: copying them out of `kvm_run`, and answering PMU MSR accesses and the
//! control-operation hypercall through the vpmu core.

use std::time::{Duration, Instant};

use kvm_bindings::kvm_sync_regs;
use kvm_ioctls::VcpuExit;
use vpmu::abi::ops::{OpError, Params, XENPMU_OP_FINISH, XENPMU_OP_MODE_SET};
use vpmu::{Msr, MsrOutcome, VcpuId};
use zerocopy::IntoBytes;

use super::RunResult;
use super::runner::Runner;
use crate::error::{MachineError, Result};
use crate::personality::Personality;

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
    /// An access to guest-physical memory that is not RAM; `data` points at `len` bytes of
    /// the `kvm_run` page, the value a read returns.
    MmioRead {
        data: *mut u8,
        len: usize,
    },
    MmioWrite,
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
            VcpuExit::MmioRead(_, data) => Exit::MmioRead {
                data: data.as_mut_ptr(),
                len: data.len(),
            },
            VcpuExit::MmioWrite(..) => Exit::MmioWrite,
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

    /// The control-operation hypercall: RDI = op (EDI in compatibility mode), RSI (ESI in
    /// compatibility mode) = GPA of the parameter block. Returns 0 or `-errno` (as the 32-bit
    /// EAX value); an op number that does not fit 32 bits is an unknown operation
    /// (`-EOPNOTSUPP`, checked first as docs/abi.md orders). An operation that waits for
    /// other pCPUs (`-EAGAIN`) is restarted here, as a hypervisor restarts the hypercall,
    /// after this pCPU completed its own requests (another pCPU's operation may wait for them)
    /// and holding no lock, until it completes or `deadline` passes (the guest then sees the
    /// `-EAGAIN`). Once FINISH has torn a vCPU down, or MODE_SET has left a mode, the LVTPC
    /// deliveries still queued for the vCPUs concerned are dropped (reported not delivered).
    pub(super) fn hypercall(&mut self, deadline: Instant) -> Result<u32> {
        let (op, gpa) = hypercall_args(&self.sync);
        let Some(op) = op else {
            return Ok(OpError::NotSupported.return_value() as u32);
        };
        let Some(params) = self.vm.mem.read_as::<Params>(gpa) else {
            return Ok((-i64::from(vpmu::abi::ops::XENPMU_EINVAL)) as u32);
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

/// The hypercall's operation number and parameter block address from the guest's registers:
/// in 64-bit mode RDI and RSI, whole (an op above `u32::MAX` is no operation: `None`); from
/// compatibility mode (CS.L = 0) EDI and ESI, the upper halves being whatever 64-bit code
/// left there.
pub(super) fn hypercall_args(sync: &kvm_sync_regs) -> (Option<u32>, u64) {
    let (rdi, rsi) = (sync.regs.rdi, sync.regs.rsi);
    if sync.sregs.cs.l == 0 {
        (Some(rdi as u32), rsi & 0xffff_ffff)
    } else {
        (u32::try_from(rdi).ok(), rsi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu::abi::ops::XENPMU_OP_MODE_GET;

    #[test]
    fn hypercall_op_above_32_bits_is_refused_not_truncated() {
        let mut sync = kvm_sync_regs::default();
        sync.sregs.cs.l = 1;
        sync.regs.rdi = 1 << 32;
        sync.regs.rsi = 0x1_2345_6000;
        // 2^32 would be MODE_GET once cut to 32 bits.
        assert_eq!(hypercall_args(&sync), (None, 0x1_2345_6000));
        sync.regs.rdi = (1 << 32) | u64::from(XENPMU_OP_FINISH);
        assert_eq!(hypercall_args(&sync).0, None);
        sync.regs.rdi = u64::from(u32::MAX);
        assert_eq!(hypercall_args(&sync).0, Some(u32::MAX));
        sync.regs.rdi = u64::from(XENPMU_OP_FINISH);
        assert_eq!(hypercall_args(&sync).0, Some(XENPMU_OP_FINISH));
        // The refusal is the ABI's for an unknown operation.
        assert_eq!(OpError::NotSupported.return_value(), -95);
        // Compatibility mode: EDI and ESI, whatever 64-bit code left in the upper halves.
        sync.sregs.cs.l = 0;
        sync.regs.rdi = 0xdead_beef_0000_0000 | u64::from(XENPMU_OP_MODE_GET);
        sync.regs.rsi = 0xdead_beef_0000_3000;
        assert_eq!(hypercall_args(&sync), (Some(XENPMU_OP_MODE_GET), 0x3000));
    }
}
