//! The reference transport of the xenpmu ABI (docs/abi.md "Transport"): the CPUID leaves a
//! guest discovers the interface by, and the decoding of a call through the I/O port.
//!
//! Discovery: the leaves sit at `CPUID_BASE` (0x4000_0100), the second base of the hypervisor
//! range, so that KVM's own leaves at 0x4000_0000 (which Linux guests use: kvm-clock) stay
//! where they are. A call: a 32-bit IN from `port::HYPERCALL` at CPL0 with RAX =
//! `XENPMU_HYPERCALL_NR`, RDI = operation, RSI = the parameter block's guest-physical address
//! (EAX, EDI, ESI outside 64-bit mode); EAX = the result.

use kvm_bindings::{CpuId, kvm_cpuid_entry2, kvm_sync_regs};
use vpmu::abi::ops::{Params, XENPMU_EOPNOTSUPP, XENPMU_EPERM, XENPMU_OP_COUNT};
use vpmu::abi::transport::{
    XENPMU_CPUID_LEAF_TRANSPORT, XENPMU_CPUID_LEAF_VERSION, XENPMU_CPUID_LEAVES,
    XENPMU_CPUID_SIGNATURE, XENPMU_ENOSYS, XENPMU_HYPERCALL_NR, XENPMU_TRANSPORT_IO_PORT,
    XENPMU_TRANSPORT_VIRQ_VECTOR, cpuid_version,
};
use vpmu::abi::{XENPMU_EFAULT, XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR};

use crate::VIRQ_VECTOR;
use crate::port;

/// The base of the VMM's xenpmu leaves: the second base of the hypervisor range (KVM's leaves
/// keep the first).
pub const CPUID_BASE: u32 = 0x4000_0100;

/// The leaves of the interface, as `(function, [eax, ebx, ecx, edx])`: the signature with the
/// highest leaf, the version (the ABI version of the `vpmu-abi` crate the VMM is built with,
/// and its operation count), the transport (the I/O port and the PMU VIRQ's vector).
pub fn cpuid_leaves() -> [(u32, [u32; 4]); 3] {
    let sig = XENPMU_CPUID_SIGNATURE;
    [
        (
            CPUID_BASE,
            [CPUID_BASE + XENPMU_CPUID_LEAVES, sig, sig, sig],
        ),
        (
            CPUID_BASE + XENPMU_CPUID_LEAF_VERSION,
            [
                cpuid_version(XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR),
                XENPMU_OP_COUNT,
                0,
                0,
            ],
        ),
        (
            CPUID_BASE + XENPMU_CPUID_LEAF_TRANSPORT,
            [
                XENPMU_TRANSPORT_IO_PORT | XENPMU_TRANSPORT_VIRQ_VECTOR,
                u32::from(port::HYPERCALL),
                u32::from(VIRQ_VECTOR),
                0,
            ],
        ),
    ]
}

/// Adds (or replaces) the interface's leaves in `cpuid`, and sets CPUID.1:ECX bit 31 (a
/// hypervisor is present: guests look at the hypervisor range only then). Every guest's CPUID
/// gets them (the personalities call this).
pub fn add_cpuid_leaves(cpuid: &mut CpuId) {
    for (function, [eax, ebx, ecx, edx]) in cpuid_leaves() {
        if let Some(e) = cpuid
            .as_mut_slice()
            .iter_mut()
            .find(|e| e.function == function)
        {
            (e.index, e.flags, e.eax, e.ebx, e.ecx, e.edx) = (0, 0, eax, ebx, ecx, edx);
            continue;
        }
        // A full table (KVM_MAX_CPUID_ENTRIES) would be a host oddity; the guest then finds
        // no interface and says so.
        let _ = cpuid.push(kvm_cpuid_entry2 {
            function,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        });
    }
    if let Some(e) = cpuid
        .as_mut_slice()
        .iter_mut()
        .find(|e| e.function == 1 && e.index == 0)
    {
        e.ecx |= 1 << 31;
    }
}

/// What an IN from the transport's port asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// No call (an 8- or 16-bit IN): nothing happens, the read returns all ones.
    Ignored,
    /// Refused by the transport before any operation check: EAX = this `-errno`.
    Refused(i32),
    /// Operation `op` with its parameter block at guest-physical `gpa` (inside RAM, within
    /// one page: checked).
    Op { op: u32, gpa: u64 },
}

/// The architectural CPL of the vCPU at the exit: 0 in real mode, 3 in virtual-8086 mode,
/// SS.DPL otherwise (what KVM and the processor take as the CPL).
pub(crate) fn cpl(sync: &kvm_sync_regs) -> u8 {
    if sync.sregs.cr0 & 1 == 0 {
        0
    } else if sync.regs.rflags & (1 << 17) != 0 {
        3
    } else {
        sync.sregs.ss.dpl
    }
}

/// Decodes an IN of `len` bytes from the transport's port, in docs/abi.md's order: the access
/// size, the CPL (`-EPERM` above 0), RAX (`-ENOSYS` unless `XENPMU_HYPERCALL_NR`; in 64-bit
/// mode all 64 bits), the operation (`-EOPNOTSUPP` for an RDI above 32 bits or a number this
/// ABI version does not define, whatever RSI holds), the parameter block (`-EFAULT` unless
/// its 24 bytes are guest RAM, as `in_ram` says, within one 4 KiB page). Outside 64-bit mode
/// (CS.L = 0) EAX, EDI and ESI are taken, whatever 64-bit code left in the upper halves.
pub(crate) fn decode(
    sync: &kvm_sync_regs,
    len: usize,
    in_ram: impl Fn(u64, usize) -> bool,
) -> Call {
    if len != 4 {
        return Call::Ignored;
    }
    if cpl(sync) != 0 {
        return Call::Refused(-XENPMU_EPERM);
    }
    let long = sync.sregs.cs.l != 0;
    let r = &sync.regs;
    let (rax, rdi, rsi) = if long {
        (r.rax, r.rdi, r.rsi)
    } else {
        (
            r.rax & 0xffff_ffff,
            r.rdi & 0xffff_ffff,
            r.rsi & 0xffff_ffff,
        )
    };
    if rax != u64::from(XENPMU_HYPERCALL_NR) {
        return Call::Refused(-XENPMU_ENOSYS);
    }
    let Some(op) = u32::try_from(rdi).ok().filter(|&op| op < XENPMU_OP_COUNT) else {
        return Call::Refused(-XENPMU_EOPNOTSUPP);
    };
    let size = size_of::<Params>();
    let one_page = rsi % 4096 + size as u64 <= 4096;
    if !one_page || !in_ram(rsi, size) {
        return Call::Refused(-XENPMU_EFAULT);
    }
    Call::Op { op, gpa: rsi }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu::abi::ops::{XENPMU_OP_COVERAGE, XENPMU_OP_FINISH, XENPMU_OP_MODE_GET};

    fn sync64(rax: u64, rdi: u64, rsi: u64) -> kvm_sync_regs {
        let mut s = kvm_sync_regs::default();
        s.sregs.cr0 = 0x8000_0011;
        s.sregs.cs.l = 1;
        (s.regs.rax, s.regs.rdi, s.regs.rsi) = (rax, rdi, rsi);
        s
    }

    const RAM: u64 = 4 << 20;
    fn ram(gpa: u64, len: usize) -> bool {
        gpa.checked_add(len as u64).is_some_and(|end| end <= RAM)
    }

    const NR: u64 = XENPMU_HYPERCALL_NR as u64;

    #[test]
    fn a_well_formed_call_decodes() {
        let s = sync64(NR, u64::from(XENPMU_OP_FINISH), 0x3000);
        assert_eq!(
            decode(&s, 4, ram),
            Call::Op {
                op: XENPMU_OP_FINISH,
                gpa: 0x3000
            }
        );
        // The last op this version defines, and a block ending exactly at a page's end.
        let s = sync64(NR, u64::from(XENPMU_OP_COVERAGE), 0x3fe8);
        assert_eq!(
            decode(&s, 4, ram),
            Call::Op {
                op: XENPMU_OP_COVERAGE,
                gpa: 0x3fe8
            }
        );
    }

    #[test]
    fn bad_calls_get_the_specified_errors_in_order() {
        let op = u64::from(XENPMU_OP_MODE_GET);
        // Size first: an inb/inw is no call at all, whatever the registers hold.
        for len in [1, 2] {
            assert_eq!(decode(&sync64(NR, op, 0x3000), len, ram), Call::Ignored);
        }
        // CPL before RAX.
        let mut user = sync64(0, op, 0x3000);
        user.sregs.ss.dpl = 3;
        assert_eq!(decode(&user, 4, ram), Call::Refused(-1));
        user.sregs.ss.dpl = 1;
        assert_eq!(decode(&user, 4, ram), Call::Refused(-1));
        // Virtual-8086 mode is CPL 3 whatever SS says.
        let mut v86 = sync64(NR, op, 0x3000);
        v86.regs.rflags = 1 << 17;
        assert_eq!(decode(&v86, 4, ram), Call::Refused(-1));
        // RAX: only 40, all 64 bits of it in 64-bit mode.
        for rax in [0, 41, NR | 1 << 32, u64::MAX] {
            assert_eq!(decode(&sync64(rax, op, 0x3000), 4, ram), Call::Refused(-38));
        }
        // The op: above 32 bits (not cut to MODE_GET), or unknown, whatever RSI holds.
        for rdi in [1 << 32, u64::from(XENPMU_OP_COUNT), u64::from(u32::MAX)] {
            assert_eq!(
                decode(&sync64(NR, rdi, u64::MAX), 4, ram),
                Call::Refused(-95)
            );
        }
        // The block: outside RAM, wrapping, or across a page boundary.
        for rsi in [RAM, RAM - 8, u64::MAX - 7, 0x3ff0, 0x3ffc] {
            assert_eq!(
                decode(&sync64(NR, op, rsi), 4, ram),
                Call::Refused(-14),
                "{rsi:#x}"
            );
        }
    }

    #[test]
    fn outside_64_bit_mode_the_low_halves_count() {
        let mut s = sync64(
            0xdead_beef_0000_0000 | NR,
            0xdead_beef_0000_0000 | u64::from(XENPMU_OP_MODE_GET),
            0xdead_beef_0000_3000,
        );
        s.sregs.cs.l = 0;
        assert_eq!(
            decode(&s, 4, ram),
            Call::Op {
                op: XENPMU_OP_MODE_GET,
                gpa: 0x3000
            }
        );
        // Real mode is CPL 0 whatever SS holds.
        s.sregs.cr0 = 0;
        s.sregs.ss.dpl = 3;
        assert_eq!(cpl(&s), 0);
    }

    #[test]
    fn leaves_carry_the_abi_crates_version_and_keep_kvms_base() {
        let entries = [0x4000_0000u32, 1].map(|function| kvm_cpuid_entry2 {
            function,
            eax: 0x4000_0001,
            ebx: 0x4b4d_564b,
            ..Default::default()
        });
        let mut cpuid = CpuId::from_entries(&entries).expect("small table");
        add_cpuid_leaves(&mut cpuid);
        add_cpuid_leaves(&mut cpuid); // idempotent
        let leaf = |f: u32| {
            let found: Vec<_> = cpuid
                .as_slice()
                .iter()
                .filter(|e| e.function == f)
                .map(|e| [e.eax, e.ebx, e.ecx, e.edx])
                .collect();
            assert_eq!(found.len(), 1, "leaf {f:#x}");
            found[0]
        };
        // KVM's leaf untouched (Linux finds KVM first, as before).
        assert_eq!(leaf(0x4000_0000), [0x4000_0001, 0x4b4d_564b, 0, 0]);
        assert_eq!(leaf(1)[2] >> 31, 1, "hypervisor bit");
        let sig = u32::from_le_bytes(*b"XPMU");
        assert_eq!(leaf(CPUID_BASE), [CPUID_BASE + 2, sig, sig, sig]);
        let version = leaf(CPUID_BASE + 1);
        assert_eq!(
            version[0],
            u32::from(XENPMU_VERSION_MAJOR) << 16 | u32::from(XENPMU_VERSION_MINOR)
        );
        assert_eq!(version[1], XENPMU_OP_COUNT);
        assert_eq!(leaf(CPUID_BASE + 2), [3, 0x11, 0x41, 0]);
    }
}
