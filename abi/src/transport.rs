//! The reference transport (`docs/abi.md`, "Transport"; version 1.3): how a guest discovers the
//! interface (a CPUID leaf range in the hypervisor space, as Xen and KVM enumerate themselves)
//! and how it invokes the control operations (an I/O-port read with Xen's hypercall register
//! convention) and receives the PMU interrupt.
//!
//! Discovery: for each base `XENPMU_CPUID_FIRST + n * XENPMU_CPUID_STRIDE` up to
//! `XENPMU_CPUID_END` (exclusive), CPUID(base) with EBX = ECX = EDX = `XENPMU_CPUID_SIGNATURE`
//! and EAX (the highest leaf of the range) at least `base + XENPMU_CPUID_LEAVES` is the
//! interface. Leaf `base + XENPMU_CPUID_LEAF_VERSION`: EAX = `cpuid_version(major, minor)`,
//! EBX = `XENPMU_OP_COUNT` of the hypervisor. Leaf `base + XENPMU_CPUID_LEAF_TRANSPORT`: EAX
//! = `XENPMU_TRANSPORT_*` flags, EBX = the I/O port, ECX = the PMU interrupt's vector. Every
//! other register of these leaves is reserved (zero).

/// First base of the CPUID range a guest scans (the hypervisor range, leaves reserved for
/// software by Intel and AMD).
pub const XENPMU_CPUID_FIRST: u32 = 0x4000_0000;
/// End of the scan (exclusive): the bases are `XENPMU_CPUID_FIRST + n * XENPMU_CPUID_STRIDE`
/// below it, as Linux and Xen scan for hypervisor signatures.
pub const XENPMU_CPUID_END: u32 = 0x4001_0000;
/// Distance between two candidate bases.
pub const XENPMU_CPUID_STRIDE: u32 = 0x100;
/// The signature: EBX, ECX and EDX of the base leaf each hold it (the bytes "XPMU", as
/// `XENPMU_MAGIC`; "XPMUXPMUXPMU" as a 12-byte string). No other hypervisor uses it.
pub const XENPMU_CPUID_SIGNATURE: u32 = 0x554D_5058;
/// Leaf offset (from the base) of the version leaf.
pub const XENPMU_CPUID_LEAF_VERSION: u32 = 1;
/// Leaf offset (from the base) of the transport leaf.
pub const XENPMU_CPUID_LEAF_TRANSPORT: u32 = 2;
/// The highest leaf offset version 1.3 defines: a base whose EAX is below `base +
/// XENPMU_CPUID_LEAVES` is not usable.
pub const XENPMU_CPUID_LEAVES: u32 = 2;

/// Transport leaf EAX: the control operations are invoked by a 32-bit IN from the I/O port in
/// EBX, with RAX = `XENPMU_HYPERCALL_NR`, RDI = operation, RSI = the parameter block's
/// guest-physical address; EAX = the result.
pub const XENPMU_TRANSPORT_IO_PORT: u32 = 1 << 0;
/// Transport leaf EAX: a sample published in a registered page is signalled by a
/// fixed-delivery, edge-triggered interrupt on the vector in ECX (the PMU VIRQ).
pub const XENPMU_TRANSPORT_VIRQ_VECTOR: u32 = 1 << 1;

/// RAX (EAX) of a call through the I/O port: Xen's hypercall number of `xenpmu_op`
/// (`__HYPERVISOR_xenpmu_op`), so that Xen's register convention carries over unchanged.
pub const XENPMU_HYPERCALL_NR: u32 = 40;
/// errno (transport): RAX did not hold `XENPMU_HYPERCALL_NR`; nothing was done.
pub const XENPMU_ENOSYS: i32 = 38;

/// The version leaf's EAX for ABI `major`.`minor`: `major << 16 | minor` (Xen's encoding of
/// its own version leaf).
pub const fn cpuid_version(major: u16, minor: u16) -> u32 {
    (major as u32) << 16 | minor as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_the_page_magic_and_matches_no_known_hypervisor() {
        assert_eq!(XENPMU_CPUID_SIGNATURE, crate::XENPMU_MAGIC);
        let mut sig = [0u8; 12];
        for chunk in sig.chunks_mut(4) {
            chunk.copy_from_slice(&XENPMU_CPUID_SIGNATURE.to_le_bytes());
        }
        assert_eq!(&sig, b"XPMUXPMUXPMU");
        // The signatures Linux's hypervisor drivers (arch/x86/kernel/cpu/*, x86/xen, x86/kvm)
        // and Xen's own compare against.
        for other in [
            &b"KVMKVMKVM\0\0\0"[..],
            b"XenVMMXenVMM",
            b"Microsoft Hv",
            b"VMwareVMware",
            b"Jailhouse\0\0\0",
            b"ACRNACRNACRN",
            b"bhyve bhyve ",
            b"TCGTCGTCGTCG",
            b"QNXQVMBSQG\0\0",
        ] {
            assert_ne!(&sig[..], other);
        }
    }

    #[test]
    fn version_encoding() {
        assert_eq!(cpuid_version(1, 3), 0x0001_0003);
        assert_eq!(cpuid_version(0xffff, 0xffff), u32::MAX);
        assert_eq!(
            (XENPMU_CPUID_END - XENPMU_CPUID_FIRST) / XENPMU_CPUID_STRIDE,
            256
        );
    }
}
