//! KVM plumbing: guest memory, a long-mode vCPU, the in-kernel irqchip, the PMU MSR filter,
//! CPUID, sync regs and single-step control.

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use zerocopy::FromBytes;

use kvm_bindings::{
    CpuId, KVM_CAP_X86_USER_SPACE_MSR, KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP,
    KVM_GUESTDBG_USE_HW_BP, KVM_MAX_CPUID_ENTRIES, KVM_MSR_EXIT_REASON_FILTER,
    KVM_MSR_EXIT_REASON_INVAL, KVM_MSR_EXIT_REASON_UNKNOWN, kvm_enable_cap, kvm_guest_debug,
    kvm_segment, kvm_userspace_memory_region,
};
use kvm_ioctls::{
    Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, SyncReg, VcpuFd, VmFd,
};

use crate::error::{MachineError, Result};

/// Size of guest RAM (GPA 0 upwards).
pub const MEM_SIZE: usize = 4 << 20;
/// Top of the initial stack.
pub const STACK_TOP: u64 = 0x8_0000;
const PML4: u64 = 0x1000;
const PDPT: u64 = 0x2000;
const PD: u64 = 0x3000;
const GDT: u64 = 0x500;
/// GDT entries before the TSS descriptors (null, kernel code 64, kernel data, code 32, user
/// data, user code 64).
const GDT_SEGMENTS: u64 = 6;
/// The 64-bit TSS of vCPU `i` is at `TSS_BASE + i * TSS_STRIDE` (`runtime/rt.h` knows this);
/// its 16-byte descriptor is GDT entry `GDT_SEGMENTS + 2 * i` (selector 0x30 + 16 * i).
pub const TSS_BASE: u64 = 0x600;
const TSS_STRIDE: u64 = 0x80;
/// vCPUs per VM that get a TSS (the others run without a task register: no CPL3).
pub const TSS_VCPUS: u64 = 8;
/// The I/O permission bitmap's offset in each TSS (right after the 104-byte TSS proper).
const TSS_IOPB: u64 = 0x68;
/// Bytes of the bitmap: ports 0-31 (one bit each, set = CPL3 access faults), then the
/// terminating 0xff byte the processor requires; ports above 31 are outside the limit and
/// always fault at CPL3. The VMM sets every bit; a guest kernel may clear one to open a port to
/// its user code (the transport test does, to see the VMM refuse a CPL3 call).
const TSS_IOPB_BYTES: usize = 5;
/// TSS limit: the 104 bytes and the bitmap.
const TSS_LIMIT: u32 = (TSS_IOPB as u32) + TSS_IOPB_BYTES as u32 - 1;
const _: () = assert!(
    (TSS_LIMIT as u64) < TSS_STRIDE,
    "a TSS and its bitmap fit the stride"
);
/// Default TSS.RSP0 below the vCPU's initial stack (the guest's `user_call` replaces it).
const RSP0_BELOW_STACK: u64 = 0x8000;

/// `KVM_CAP_PMU_CAPABILITY` and `KVM_PMU_CAP_DISABLE` (not wrapped by kvm-ioctls 0.25).
const KVM_CAP_PMU_CAPABILITY: u32 = 212;
const KVM_PMU_CAP_DISABLE: u64 = 1;

/// Guest RAM (GPA 0 upwards), anonymous memory through vm-memory's `GuestMemoryMmap`.
///
/// The guest's vCPUs (on other threads) write it at any time, so the machine never holds a
/// Rust reference into it: every read is one volatile copy into a private buffer
/// (`read`, `read_u64`, `to_vec`, `read_as`), every write one explicit copy in (`write`,
/// `write_u64`), through the volatile `Bytes` API. What a guest changes concurrently is the
/// guest's race, as on its own CPUs; the VMM only ever sees a copy.
#[derive(Debug)]
pub struct GuestMem {
    mem: GuestMemoryMmap,
    len: usize,
}

impl GuestMem {
    /// Maps `len` bytes of zeroed anonymous memory at GPA 0.
    pub fn new(len: usize) -> Result<Self> {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), len)])
            .map_err(|source| MachineError::MemoryAllocation { len, source })?;
        Ok(Self { mem, len })
    }

    /// The vm-memory object itself, for loaders that write guest memory through it
    /// (`linux-loader`); the same volatile copies as every other access.
    pub(crate) fn backend(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Host address of GPA 0 (for KVM's memory region).
    fn host_addr(&self) -> Result<u64> {
        self.mem
            .get_host_address(GuestAddress(0))
            .map(|p| p as u64)
            .map_err(|_| self.outside(0, self.len))
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No memory at all (never, for a machine's guest).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[gpa, gpa + len)` is inside guest RAM.
    pub fn contains(&self, gpa: u64, len: usize) -> bool {
        usize::try_from(gpa)
            .ok()
            .and_then(|start| start.checked_add(len))
            .is_some_and(|end| end <= self.len)
    }

    fn outside(&self, gpa: u64, len: usize) -> MachineError {
        MachineError::OutsideMemory { gpa, len }
    }

    /// Copies `buf.len()` bytes at `gpa` into `buf` (one volatile copy; nothing is read if the
    /// range is not all inside RAM).
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<()> {
        if !self.contains(gpa, buf.len()) {
            return Err(self.outside(gpa, buf.len()));
        }
        self.mem
            .read_slice(buf, GuestAddress(gpa))
            .map_err(|_| self.outside(gpa, buf.len()))
    }

    /// Copies `data` to `gpa` (nothing is written if the range is not all inside RAM).
    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<()> {
        if !self.contains(gpa, data.len()) {
            return Err(self.outside(gpa, data.len()));
        }
        self.mem
            .write_slice(data, GuestAddress(gpa))
            .map_err(|_| self.outside(gpa, data.len()))
    }

    /// A copy of the `len` bytes at `gpa`, if inside RAM.
    pub fn to_vec(&self, gpa: u64, len: usize) -> Option<Vec<u8>> {
        if !self.contains(gpa, len) {
            return None;
        }
        let mut bytes = vec![0; len];
        self.read(gpa, &mut bytes).ok()?;
        Some(bytes)
    }

    /// A copy of the `T` at `gpa` (any bit pattern is a `T`), if inside RAM.
    pub fn read_as<T: FromBytes>(&self, gpa: u64) -> Option<T> {
        let bytes = self.to_vec(gpa, std::mem::size_of::<T>())?;
        T::read_from_bytes(&bytes).ok()
    }

    /// Reads a little-endian u64.
    pub fn read_u64(&self, gpa: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(gpa, &mut b).ok()?;
        Some(u64::from_le_bytes(b))
    }

    /// Writes a little-endian u64.
    pub fn write_u64(&self, gpa: u64, v: u64) -> Result<()> {
        self.write(gpa, &v.to_le_bytes())
    }

    /// Stores `v` at the 8-byte aligned `gpa` with one single-copy-atomic 64-bit store (a
    /// guest reading the word with one 64-bit load sees the old or the new value, never a mix),
    /// ordered by `order` against the VMM's other accesses.
    pub fn store_u64(&self, gpa: u64, v: u64, order: std::sync::atomic::Ordering) -> Result<()> {
        if gpa % 8 != 0 || !self.contains(gpa, 8) {
            return Err(self.outside(gpa, 8));
        }
        self.mem
            .store(v, GuestAddress(gpa), order)
            .map_err(|_| self.outside(gpa, 8))
    }

    /// Loads the 8-byte aligned u64 at `gpa` with one single-copy-atomic 64-bit load.
    pub fn load_u64(&self, gpa: u64, order: std::sync::atomic::Ordering) -> Option<u64> {
        if gpa % 8 != 0 || !self.contains(gpa, 8) {
            return None;
        }
        self.mem.load(GuestAddress(gpa), order).ok()
    }
}

/// One VM: guest memory, the in-kernel irqchip, the PMU MSR filter, the loaded image.
#[derive(Debug)]
pub struct Vm {
    /// The VM.
    pub vm: VmFd,
    /// Guest RAM.
    pub mem: GuestMem,
}

/// One vCPU of a [`Vm`].
#[derive(Debug)]
pub struct Vcpu {
    /// The vCPU fd.
    pub fd: VcpuFd,
    /// What `KVM_SET_GUEST_DEBUG` last installed.
    debug: GuestDebug,
}

/// What the VMM asks KVM to stop the guest for (`KVM_SET_GUEST_DEBUG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestDebug {
    /// Nothing.
    Off,
    /// A `KVM_EXIT_DEBUG` after every instruction (CPL0 only on this host).
    SingleStep,
    /// A `KVM_EXIT_DEBUG` before the instruction at either linear address runs (hardware
    /// execution breakpoints in DR0 and DR1; `None` leaves that register unused).
    Breakpoints([Option<u64>; 2]),
}

/// A denied range for the MSR filter: every bit 0.
static DENY: [u8; 0x600] = [0; 0x600];

impl Vm {
    /// Creates the VM: RAM with page tables and GDT for long mode, irqchip, user-space MSR
    /// exits for every MSR in `deny` (inclusive ranges), KVM's own PMU off, and the ELF
    /// executable `elf` loaded. Returns the VM and the entry point.
    pub fn new(kvm: &Kvm, deny: &[(u32, u32)], elf: &[u8]) -> Result<(Self, u64)> {
        let vm = Self::empty(kvm, deny, MEM_SIZE)?;
        setup_page_tables(&vm.mem)?;
        let entry = crate::loader::load_elf(elf, &vm.mem)?;
        Ok((vm, entry))
    }

    /// A VM with `mem_size` bytes of zeroed RAM at GPA 0 and nothing in it: irqchip,
    /// user-space MSR exits for every MSR in `deny`, KVM's own PMU off.
    pub fn empty(kvm: &Kvm, deny: &[(u32, u32)], mem_size: usize) -> Result<Self> {
        let vm = kvm
            .create_vm()
            .map_err(MachineError::kvm("KVM_CREATE_VM"))?;
        let mem = GuestMem::new(mem_size)?;
        let region = kvm_userspace_memory_region {
            slot: 0,
            guest_phys_addr: 0,
            memory_size: mem.len() as u64,
            userspace_addr: mem.host_addr()?,
            flags: 0,
        };
        // SAFETY: the region is the whole of our own anonymous mapping (`mem`), which outlives
        // the VM (both are fields of `Vm`; the VM fd is dropped first).
        unsafe { vm.set_user_memory_region(region) }
            .map_err(MachineError::kvm("KVM_SET_USER_MEMORY_REGION"))?;
        vm.create_irq_chip()
            .map_err(MachineError::kvm("KVM_CREATE_IRQCHIP"))?;
        // KVM's own vPMU must not answer anything: disable it where the cap exists. Here (PVM,
        // enable_pmu=N) the cap reports 0 and enabling fails with EINVAL: already off.
        if vm.check_extension_raw(KVM_CAP_PMU_CAPABILITY.into()) > 0 {
            let cap = kvm_enable_cap {
                cap: KVM_CAP_PMU_CAPABILITY,
                args: [KVM_PMU_CAP_DISABLE, 0, 0, 0],
                ..Default::default()
            };
            if let Err(e) = vm.enable_cap(&cap) {
                if e.errno() != libc::EINVAL {
                    return Err(MachineError::Kvm {
                        ioctl: "KVM_ENABLE_CAP(KVM_CAP_PMU_CAPABILITY)",
                        source: e,
                    });
                }
            }
        }
        let cap = kvm_enable_cap {
            cap: KVM_CAP_X86_USER_SPACE_MSR,
            args: [
                u64::from(
                    KVM_MSR_EXIT_REASON_FILTER
                        | KVM_MSR_EXIT_REASON_UNKNOWN
                        | KVM_MSR_EXIT_REASON_INVAL,
                ),
                0,
                0,
                0,
            ],
            ..Default::default()
        };
        vm.enable_cap(&cap).map_err(MachineError::kvm(
            "KVM_ENABLE_CAP(KVM_CAP_X86_USER_SPACE_MSR)",
        ))?;
        let ranges: Vec<MsrFilterRange<'_>> = deny
            .iter()
            .map(|&(first, last)| {
                let count = last - first + 1;
                MsrFilterRange {
                    flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
                    base: first,
                    msr_count: count,
                    bitmap: &DENY[..count.div_ceil(8) as usize],
                }
            })
            .collect();
        vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &ranges)
            .map_err(MachineError::kvm("KVM_X86_SET_MSR_FILTER"))?;
        Ok(Self { vm, mem })
    }

    /// Creates vCPU `id` with `cpuid`, in 64-bit mode at `rip` with `rsp`, RDI and RSI set,
    /// and guest state read through sync regs (GPRs and sregs).
    pub fn create_vcpu(
        &self,
        id: u64,
        cpuid: &CpuId,
        rip: u64,
        rsp: u64,
        rdi: u64,
        rsi: u64,
    ) -> Result<Vcpu> {
        let fd = self.new_vcpu_fd(id, cpuid)?;
        setup_long_mode(&fd, id)?;
        if id < TSS_VCPUS {
            // TSS.RSP0 (offset 4), until the guest sets its own.
            self.mem
                .write_u64(TSS_BASE + id * TSS_STRIDE + 4, rsp - RSP0_BELOW_STACK)?;
            // The I/O map base (offset 102) and a closed bitmap: CPL3 port I/O faults (#GP)
            // unless the guest opens a port. Left 0, the "bitmap" would be the TSS's own
            // first bytes, whose reserved zeros opened ports 0-31 to CPL3.
            let tss = TSS_BASE + id * TSS_STRIDE;
            self.mem
                .write(tss + 102, &(TSS_IOPB as u16).to_le_bytes())?;
            self.mem.write(tss + TSS_IOPB, &[0xff; TSS_IOPB_BYTES])?;
        }
        let mut regs = fd.get_regs().map_err(MachineError::kvm("KVM_GET_REGS"))?;
        regs.rip = rip;
        regs.rsp = rsp;
        regs.rdi = rdi;
        regs.rsi = rsi;
        regs.rflags = 0x2;
        fd.set_regs(&regs)
            .map_err(MachineError::kvm("KVM_SET_REGS"))?;
        if id > 0 {
            // Application processors start in wait-for-SIPI under an in-kernel LAPIC.
            let runnable = kvm_bindings::kvm_mp_state {
                mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
            };
            fd.set_mp_state(runnable)
                .map_err(MachineError::kvm("KVM_SET_MP_STATE"))?;
        }
        Ok(Vcpu::with_sync_regs(fd))
    }

    /// Creates vCPU `id` with `cpuid` as a multiboot loader leaves the boot processor: flat
    /// 32-bit protected mode (CS 0x8 and data 0x10 of the GDT at `GDT`, base 0, limit 4 GiB),
    /// paging off, interrupts off, at `entry` with EAX = `magic` and EBX = `info` (the
    /// multiboot info block). ESP is 0: the image sets up its own stack.
    pub fn create_flat32_vcpu(
        &self,
        id: u64,
        cpuid: &CpuId,
        entry: u64,
        magic: u32,
        info: u32,
    ) -> Result<Vcpu> {
        let fd = self.new_vcpu_fd(id, cpuid)?;
        self.mem.write_u64(GDT, 0)?;
        self.mem.write_u64(GDT + 8, 0x00cf_9b00_0000_ffff)?;
        self.mem.write_u64(GDT + 16, 0x00cf_9300_0000_ffff)?;
        let mut sregs = fd.get_sregs().map_err(MachineError::kvm("KVM_GET_SREGS"))?;
        sregs.gdt.base = GDT;
        sregs.gdt.limit = 3 * 8 - 1;
        sregs.cs = segment(0x8, 0xb, false);
        let data = segment(0x10, 0x3, false);
        (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
        sregs.cr0 = 0x11; // ET | PE
        sregs.cr3 = 0;
        sregs.cr4 = 0;
        sregs.efer = 0;
        fd.set_sregs(&sregs)
            .map_err(MachineError::kvm("KVM_SET_SREGS"))?;
        let mut regs = fd.get_regs().map_err(MachineError::kvm("KVM_GET_REGS"))?;
        regs.rip = entry;
        regs.rax = u64::from(magic);
        regs.rbx = u64::from(info);
        regs.rsp = 0;
        regs.rflags = 0x2;
        fd.set_regs(&regs)
            .map_err(MachineError::kvm("KVM_SET_REGS"))?;
        Ok(Vcpu::with_sync_regs(fd))
    }

    /// A new vCPU fd with `cpuid`. The PMU-honesty bits of `cpuid` are checked against what
    /// KVM installed (`KVM_GET_CPUID2`): a host that forces a leaf through is named loudly.
    fn new_vcpu_fd(&self, id: u64, cpuid: &CpuId) -> Result<VcpuFd> {
        let fd = self
            .vm
            .create_vcpu(id)
            .map_err(MachineError::kvm("KVM_CREATE_VCPU"))?;
        fd.set_cpuid2(cpuid)
            .map_err(MachineError::kvm("KVM_SET_CPUID2"))?;
        if id == 0 {
            if let Ok(installed) = fd.get_cpuid2(KVM_MAX_CPUID_ENTRIES) {
                for what in crate::personality::cpuid_differences(cpuid, &installed) {
                    eprintln!(
                        "vpmu: WARNING: KVM does not install the guest CPUID asked for: {what}"
                    );
                }
            }
        }
        Ok(fd)
    }
}

impl Vcpu {
    fn with_sync_regs(mut fd: VcpuFd) -> Self {
        fd.set_sync_valid_reg(SyncReg::Register);
        fd.set_sync_valid_reg(SyncReg::SystemRegister);
        Vcpu {
            fd,
            debug: GuestDebug::Off,
        }
    }

    /// Turns VMM single-stepping on or off (no ioctl if unchanged).
    pub fn set_stepping(&mut self, on: bool) -> Result<()> {
        self.set_debug(if on {
            GuestDebug::SingleStep
        } else {
            GuestDebug::Off
        })
    }

    /// Installs `debug` (no ioctl if unchanged).
    pub fn set_debug(&mut self, debug: GuestDebug) -> Result<()> {
        if debug == self.debug {
            return Ok(());
        }
        let mut request = kvm_guest_debug::default();
        match debug {
            GuestDebug::Off => {}
            GuestDebug::SingleStep => {
                request.control = KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP;
            }
            GuestDebug::Breakpoints(addresses) => {
                request.control = KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP;
                for (i, address) in addresses.iter().enumerate() {
                    if let Some(address) = *address {
                        request.arch.debugreg[i] = address;
                        // DR7: Li, an execution breakpoint (R/Wi = 00, LENi = 00).
                        request.arch.debugreg[7] |= 1 << (2 * i);
                    }
                }
            }
        }
        self.fd
            .set_guest_debug(&request)
            .map_err(MachineError::kvm("KVM_SET_GUEST_DEBUG"))?;
        self.debug = debug;
        Ok(())
    }

    /// What `KVM_SET_GUEST_DEBUG` last installed.
    pub fn debug(&self) -> GuestDebug {
        self.debug
    }
}

fn segment(selector: u16, type_: u8, long: bool) -> kvm_segment {
    flat_segment(selector, type_, long, 0)
}

/// A flat (base 0, 4 GiB) code (`type_` 0xb) or data (0x3) segment at privilege `dpl`; a
/// 64-bit code segment if `long`.
pub(crate) fn flat_segment(selector: u16, type_: u8, long: bool, dpl: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl,
        db: u8::from(!long),
        s: 1,
        l: u8::from(long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Identity-maps the low 4 GiB with 2 MiB pages (RAM and the LAPIC page), every page with U/S
/// set: the guests are test harnesses, not protection domains, and their CPL3 workloads call
/// code and touch data (`.text`, `.rodata`, `.bss`, stacks) spread over the one image, so the
/// whole map is user-accessible (CR4.SMEP/SMAP stay clear: CPL0 may still use every page).
/// GDT: null, 64-bit code (0x8), data (0x10), 32-bit code (0x18, for -m32 code in
/// compatibility mode), user data (0x20, DPL3: SS = 0x23), user 64-bit code (0x28, DPL3:
/// CS = 0x2b), then one 64-bit TSS descriptor per vCPU (0x30 + 16 * i, see `TSS_BASE`).
pub(crate) fn setup_page_tables(mem: &GuestMem) -> Result<()> {
    const USER: u64 = 0x4;
    mem.write_u64(PML4, PDPT | 0x3 | USER)?;
    for i in 0..4u64 {
        mem.write_u64(PDPT + 8 * i, (PD + 0x1000 * i) | 0x3 | USER)?;
        let pd: Vec<u8> = (0..512u64)
            .flat_map(|j| ((i << 30) | (j << 21) | 0x83 | USER).to_le_bytes())
            .collect();
        mem.write(PD + 0x1000 * i, &pd)?;
    }
    mem.write_u64(GDT, 0)?;
    mem.write_u64(GDT + 8, 0x00af_9b00_0000_ffff)?;
    mem.write_u64(GDT + 16, 0x00cf_9300_0000_ffff)?;
    mem.write_u64(GDT + 24, 0x00cf_9b00_0000_ffff)?;
    mem.write_u64(GDT + 32, 0x00cf_f300_0000_ffff)?;
    mem.write_u64(GDT + 40, 0x00af_fb00_0000_ffff)?;
    for i in 0..TSS_VCPUS {
        let [low, high] = tss_descriptor(TSS_BASE + i * TSS_STRIDE);
        let entry = GDT + 8 * (GDT_SEGMENTS + 2 * i);
        mem.write_u64(entry, low)?;
        mem.write_u64(entry + 8, high)?;
    }
    Ok(())
}

/// The 16-byte descriptor of an available 64-bit TSS at `base` (limit `TSS_LIMIT`, DPL0).
fn tss_descriptor(base: u64) -> [u64; 2] {
    let limit = u64::from(TSS_LIMIT);
    let low = (limit & 0xffff)
        | (base & 0xff_ffff) << 16
        | 0x89 << 40 // present, type 9 (available 64-bit TSS)
        | (limit >> 16 & 0xf) << 48
        | (base >> 24 & 0xff) << 56;
    [low, base >> 32]
}

/// Puts vCPU `id` in 64-bit mode at CPL0 through `set_sregs` (no real-mode trampoline), with
/// its task register on its TSS (if it has one).
fn setup_long_mode(vcpu: &VcpuFd, id: u64) -> Result<()> {
    let mut sregs = vcpu
        .get_sregs()
        .map_err(MachineError::kvm("KVM_GET_SREGS"))?;
    sregs.gdt.base = GDT;
    sregs.gdt.limit = (8 * (GDT_SEGMENTS + 2 * TSS_VCPUS) - 1) as u16;
    sregs.cs = segment(0x8, 0xb, true);
    let data = segment(0x10, 0x3, false);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    if id < TSS_VCPUS {
        sregs.tr = kvm_segment {
            base: TSS_BASE + id * TSS_STRIDE,
            limit: TSS_LIMIT,
            selector: (8 * (GDT_SEGMENTS + 2 * id)) as u16,
            type_: 0xb, // busy 64-bit TSS, as after LTR
            present: 1,
            ..Default::default()
        };
    }
    sregs.cr3 = PML4;
    sregs.cr4 = 0x20; // PAE
    sregs.cr0 = 0x8000_0033; // PG | NE | ET | MP | PE
    sregs.efer = 0x500; // LMA | LME
    vcpu.set_sregs(&sregs)
        .map_err(MachineError::kvm("KVM_SET_SREGS"))
}

/// The host's supported CPUID, the base the personalities edit.
pub fn supported_cpuid(kvm: &Kvm) -> Result<CpuId> {
    kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(MachineError::kvm("KVM_GET_SUPPORTED_CPUID"))
}

/// The API version every KVM answers `KVM_GET_API_VERSION` with.
const KVM_API_VERSION: i32 = 12;

/// Whether `/dev/kvm` (or `$VPMU_KVM_DEVICE`, for testing the skip path) can be opened, is
/// KVM, and has what the VMM needs.
pub fn usable() -> Result<Kvm> {
    match std::env::var("VPMU_KVM_DEVICE") {
        Ok(path) => usable_at(&path, true),
        Err(_) => usable_at("/dev/kvm", false),
    }
}

/// `usable` for the device at `path` (`from_env`: named by `$VPMU_KVM_DEVICE`).
fn usable_at(path: &str, from_env: bool) -> Result<Kvm> {
    let cpath =
        std::ffi::CString::new(path).map_err(|_| MachineError::DevicePath(path.to_string()))?;
    let kvm = Kvm::new_with_path(&cpath).map_err(|source| MachineError::OpenDevice {
        path: path.to_string(),
        source,
    })?;
    // Anything that opens (/dev/null, a file) fails every KVM ioctl: say so rather than blame
    // the first capability checked.
    if kvm.get_api_version() != KVM_API_VERSION {
        return Err(MachineError::NotKvm {
            path: path.to_string(),
            from_env,
        });
    }
    for cap in [
        kvm_ioctls::Cap::X86UserSpaceMsr,
        kvm_ioctls::Cap::X86MsrFilter,
        kvm_ioctls::Cap::SetGuestDebug,
        kvm_ioctls::Cap::Irqchip,
        kvm_ioctls::Cap::SignalMsi,
    ] {
        if !kvm.check_extension(cap) {
            return Err(MachineError::MissingCapability(cap));
        }
    }
    Ok(kvm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_memory_is_copied_in_and_out_and_bounded() {
        let mem = GuestMem::new(MEM_SIZE).expect("memory");
        mem.write(0x1000, &[1, 2, 3]).expect("in RAM");
        let mut buf = [0u8; 4];
        mem.read(0x0fff, &mut buf).expect("in RAM");
        assert_eq!(buf, [0, 1, 2, 3]);
        assert_eq!(mem.to_vec(0x1001, 2), Some(vec![2, 3]));
        mem.write_u64(0x2000, 0x0102_0304_0506_0708)
            .expect("in RAM");
        assert_eq!(mem.read_u64(0x2000), Some(0x0102_0304_0506_0708));
        assert_eq!(mem.read_as::<[u8; 2]>(0x2000), Some([8, 7]));
        // The last byte is RAM, one past it is not; nothing is done by a refused access.
        let end = MEM_SIZE as u64;
        assert!(mem.contains(end - 1, 1) && !mem.contains(end - 1, 2));
        assert!(mem.write(end - 1, &[0xff, 0xff]).is_err());
        assert_eq!(mem.to_vec(end - 1, 1), Some(vec![0]));
        assert!(matches!(
            mem.read(end - 3, &mut buf),
            Err(MachineError::OutsideMemory { gpa, len: 4 }) if gpa == end - 3
        ));
        mem.read(end - 4, &mut buf).expect("the last 4 bytes");
        assert_eq!(mem.read_u64(u64::MAX - 3), None);
        assert_eq!(mem.to_vec(u64::MAX, 2), None);
        assert!(!mem.contains(0, usize::MAX));
    }

    #[test]
    fn a_device_that_is_not_kvm_is_named_as_such() {
        let Err(e) = usable_at("/dev/null", true) else {
            panic!("/dev/null taken for KVM");
        };
        assert!(
            matches!(&e, MachineError::NotKvm { path, from_env: true } if path == "/dev/null"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "VPMU_KVM_DEVICE=/dev/null is not a KVM device"
        );
        let e = usable_at("/dev/null", false).expect_err("not KVM");
        assert_eq!(e.to_string(), "/dev/null is not a KVM device");
        let e = usable_at("/nonexistent/kvm", true).expect_err("absent");
        assert!(
            e.to_string().starts_with("cannot open /nonexistent/kvm: "),
            "{e}"
        );
    }

    #[test]
    fn tss_descriptor_encodes_base_limit_and_type() {
        let [low, high] = tss_descriptor(0x1234_5678_9abc_def0);
        assert_eq!(low & 0xffff, u64::from(TSS_LIMIT));
        let base = (low >> 16 & 0xff_ffff) | (low >> 56 & 0xff) << 24 | high << 32;
        assert_eq!(base, 0x1234_5678_9abc_def0);
        // Present, DPL0, system descriptor of type 9 (available 64-bit TSS).
        assert_eq!(low >> 40 & 0xff, 0x89);
    }

    #[test]
    fn gdt_has_user_segments_and_pages_are_user_accessible() {
        let mem = GuestMem::new(MEM_SIZE).expect("memory");
        setup_page_tables(&mem).expect("in RAM");
        let gdt = |sel: u64| mem.read_u64(GDT + sel).expect("in RAM");
        // User data (0x20): present, DPL3, writable data; user code (0x28): DPL3, L.
        assert_eq!(gdt(0x20) >> 40 & 0xff, 0xf3);
        assert_eq!(gdt(0x28) >> 40 & 0xff, 0xfb);
        assert_eq!(gdt(0x28) >> 53 & 1, 1);
        // vCPU 1's TSS descriptor points at its TSS.
        let low = gdt(0x30 + 16);
        assert_eq!(low >> 16 & 0xff_ffff, TSS_BASE + TSS_STRIDE);
        // U/S on every level of the map of the first and the LAPIC's 2 MiB page.
        assert_eq!(mem.read_u64(PML4).expect("in RAM") & 0x7, 0x7);
        assert_eq!(mem.read_u64(PDPT + 24).expect("in RAM") & 0x7, 0x7);
        assert_eq!(mem.read_u64(PD).expect("in RAM"), 0x87);
        let lapic = PD + 0x1000 * 3 + 8 * 503;
        assert_eq!(
            mem.read_u64(lapic).expect("in RAM"),
            0xfee0_0000 & !0x1f_ffff | 0x87
        );
    }
}
