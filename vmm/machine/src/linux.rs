//! Linux boot mode (`vpmu boot` with a kernel): the x86 64-bit boot protocol
//! (Documentation/x86/boot.rst, "64-bit Boot Protocol") for an uncompressed `vmlinux` (ELF64)
//! or a `bzImage`, loaded with rust-vmm's `linux-loader`, on one vCPU with the PC devices of
//! [`crate::boot`] (COM1 with its transmitter interrupt on IRQ 4, isa-debug-exit, the
//! keyboard controller's reset) and an Intel MP table, so that an unmodified kernel boots to
//! its `/init` with the virtual PMU.
//!
//! Guest-physical layout (RAM from 0 to `mem_size`):
//!
//! | GPA | what |
//! |---|---|
//! | 0x500 | GDT (64-bit code 0x8, data 0x10), TSS at 0x600 (the machine's long-mode set-up) |
//! | 0x1000–0x6fff | identity page tables of 0–4 GiB (2 MiB pages) |
//! | [`ZERO_PAGE`] | `boot_params` (RSI at entry) |
//! | [`CMDLINE`] | the command line, NUL-terminated |
//! | [`MP_TABLE`] | MP floating pointer and configuration table (reserved in the e820 map) |
//! | 0xf0000–0xfffff | reserved (the BIOS area an MP-table scan looks at) |
//! | 16 MiB | `vmlinux` at its physical load addresses (a `bzImage`'s payload at 1 MiB) |
//! | top of RAM | the initrd, page-aligned, below `initrd_addr_max` |
//!
//! The vCPU enters in 64-bit mode at CPL0 with interrupts off, paging on (the identity map),
//! RSI = [`ZERO_PAGE`]: at `e_entry` of a `vmlinux`, at the load address + 0x200 of a
//! `bzImage` (its 64-bit entry). The kernel loads its own GDT, IDT and page tables at once.
//!
//! The MP table names one processor (LAPIC 0, the BSP), the ISA bus, KVM's in-kernel IOAPIC
//! at 0xfec00000 and the ISA interrupts routed to it (IRQ 0 to pin 2, the others to their own
//! pin), ExtINT on LINT0 and NMI on LINT1. Without one, Linux scans low memory for it
//! 16 bytes at a time through `early_memremap` (seconds under an emulated CPL0) and runs
//! in virtual-wire mode. No crate builds MP tables (Firecracker's builder is not published),
//! so it is written here from the Intel MultiProcessor Specification 1.4, chapter 4.

use std::io::Cursor;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::{BzImage, Elf, KernelLoader};
use vm_memory::GuestAddress;

use std::time::Duration;

use vpmu_models::shapes::Shape;

use crate::RunResult;
use crate::boot::PcDevices;
use crate::error::{MachineError, Result};
use crate::kvm::GuestMem;
use crate::personality::Personality;
use crate::personality::{Source, with_personality};
use crate::quirks::HostQuirks;
use crate::{Layout, Machine};

/// Where `boot_params` (the zero page) is.
pub const ZERO_PAGE: u64 = 0x7000;
/// Where the command line is.
pub const CMDLINE: u64 = 0x2_0000;
/// The longest command line (bytes, without the NUL): Linux's x86 `COMMAND_LINE_SIZE` less one.
pub const MAX_CMDLINE: usize = 2047;
/// Where the MP floating pointer is: the last KiB of base memory, which Linux scans second.
pub const MP_TABLE: u64 = 0x9_fc00;
/// The end of base memory (640 KiB).
const BASE_END: u64 = 0xa_0000;
/// The BIOS area (reserved).
const BIOS_START: u64 = 0xf_0000;
/// 1 MiB: where high memory starts.
const HIGH_MEMORY: u64 = 0x10_0000;
/// The initial stack (Linux sets its own at once).
const BOOT_STACK: u64 = 0x9_0000;
/// The 64-bit entry of a `bzImage`, from its load address.
const BZIMAGE_ENTRY_64: u64 = 0x200;
/// The LAPIC and IOAPIC of KVM's in-kernel irqchip.
const LAPIC_BASE: u32 = 0xfee0_0000;
const IOAPIC_BASE: u32 = 0xfec0_0000;
const IOAPIC_ID: u8 = 1;

/// `boot_params` header constants (boot.rst).
const BOOT_FLAG: u16 = 0xaa55;
const HDRS: u32 = 0x5372_6448;
const PROTOCOL_2_15: u16 = 0x020f;
const LOADER_UNDEFINED: u8 = 0xff;
const LOADED_HIGH: u8 = 0x01;
const KERNEL_ALIGNMENT: u32 = 16 << 20;
const INITRD_ADDR_MAX: u32 = 0x7fff_ffff;
/// e820 types.
const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;

/// The smallest and largest RAM of a Linux guest (MiB): the kernel is loaded at 16 MiB and
/// RAM must stay below the 32-bit MMIO hole (IOAPIC at 0xfec00000).
pub const MIN_MEM_MIB: u64 = 32;
/// See [`MIN_MEM_MIB`] (the same bound as a multiboot image's).
pub const MAX_MEM_MIB: u64 = crate::boot::MAX_MEM_MIB;
/// `vpmu boot`'s default RAM for a kernel (MiB): a kernel initialises and frees all of it
/// emulated, about 2.5 s per 128 MiB here, so keep it small.
pub const DEFAULT_MEM_MIB: u64 = 128;

/// How a Linux kernel is booted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxOptions {
    /// Guest RAM in bytes, from GPA 0.
    pub mem_size: usize,
    /// The kernel command line.
    pub cmdline: String,
    /// The initrd (an uncompressed or compressed cpio, as the kernel is built to read).
    pub initrd: Option<Vec<u8>>,
    /// Copy the console to stdout as it is written.
    pub echo: bool,
}

/// The kind of a kernel image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    /// An uncompressed ELF64 x86-64 `vmlinux`, loaded at its physical addresses.
    Vmlinux,
    /// A `bzImage`: the setup header ("HdrS" at 0x202) and a self-decompressing payload.
    BzImage,
}

/// What kind of kernel `image` is, if it is one this mode boots. A `vmlinux` is an ELF64 x86-64
/// executable (`ET_EXEC`, not position-independent) whose entry and every loadable segment's
/// physical address are at or above 1 MiB, as the kernel links itself; a program that is not
/// a kernel (a PIE, a user-space binary at low addresses) is not taken for one.
pub fn kernel_format(image: &[u8]) -> Option<KernelFormat> {
    if image.len() >= 4 && image[..4] == *b"\x7fELF" {
        return vmlinux(image).then_some(KernelFormat::Vmlinux);
    }
    (image.len() > 0x206 && image[0x202..0x206] == HDRS.to_le_bytes())
        .then_some(KernelFormat::BzImage)
}

fn vmlinux(image: &[u8]) -> bool {
    use object::Endianness;
    use object::read::elf::{FileHeader, ProgramHeader};
    const EM_X86_64: u16 = 62;
    const ET_EXEC: u16 = 2;
    const PT_LOAD: u32 = 1;
    let Ok(header) = object::elf::FileHeader64::<Endianness>::parse(image) else {
        return false;
    };
    let Ok(endian) = header.endian() else {
        return false;
    };
    let Ok(segments) = header.program_headers(endian, image) else {
        return false;
    };
    let loads: Vec<u64> = segments
        .iter()
        .filter(|p| p.p_type(endian) == PT_LOAD)
        .map(|p| p.p_paddr(endian))
        .collect();
    header.e_machine(endian) == EM_X86_64
        && header.e_type(endian) == ET_EXEC
        && header.e_entry(endian) >= HIGH_MEMORY
        && !loads.is_empty()
        && loads.iter().all(|&paddr| paddr >= HIGH_MEMORY)
}

fn boot_error(what: impl std::fmt::Display) -> MachineError {
    MachineError::Boot(what.to_string())
}

/// A kernel in guest memory.
struct Loaded {
    /// The 64-bit entry point.
    entry: u64,
    /// A `bzImage`'s setup header (a `vmlinux` has none).
    header: Option<setup_header>,
    /// The end of the memory the kernel occupies: a `vmlinux`'s highest segment; for a
    /// `bzImage`, the end of its decompressed image (`pref_address + init_size`, where the
    /// decompressor puts it) or of the payload, whichever is higher.
    end: u64,
}

/// Loads `kernel` into `mem`.
fn load_kernel(mem: &GuestMem, kernel: &[u8]) -> Result<Loaded> {
    let mut image = Cursor::new(kernel);
    match kernel_format(kernel) {
        Some(KernelFormat::Vmlinux) => {
            let loaded = Elf::load(
                mem.backend(),
                None,
                &mut image,
                Some(GuestAddress(HIGH_MEMORY)),
            )
            .map_err(|e| boot_error(format!("loading the vmlinux: {e}")))?;
            Ok(Loaded {
                entry: loaded.kernel_load.0,
                header: None,
                end: loaded.kernel_end,
            })
        }
        Some(KernelFormat::BzImage) => {
            let loaded = BzImage::load(
                mem.backend(),
                None,
                &mut image,
                Some(GuestAddress(HIGH_MEMORY)),
            )
            .map_err(|e| boot_error(format!("loading the bzImage: {e}")))?;
            let header = loaded
                .setup_header
                .ok_or_else(|| boot_error("no setup header"))?;
            if header.version < PROTOCOL_2_15 && header.xloadflags & 1 == 0 {
                return Err(boot_error(
                    "the bzImage has no 64-bit entry (XLF_KERNEL_64 clear)",
                ));
            }
            let decompressed =
                header.pref_address.max(loaded.kernel_load.0) + u64::from(header.init_size);
            Ok(Loaded {
                entry: loaded.kernel_load.0 + BZIMAGE_ENTRY_64,
                header: Some(header),
                end: loaded.kernel_end.max(decompressed),
            })
        }
        None => Err(boot_error(
            "not a kernel: neither an ELF64 x86-64 vmlinux nor a bzImage (HdrS at 0x202)",
        )),
    }
}

/// Where the initrd of `len` bytes goes: page-aligned at the top of RAM, at most at
/// `addr_max` (the kernel's `initrd_addr_max`), above the kernel's end.
fn initrd_address(mem_size: u64, len: u64, kernel_end: u64, addr_max: u64) -> Result<u64> {
    let top = mem_size.min(addr_max.saturating_add(1));
    let start = top
        .checked_sub(len)
        .map(|a| a & !0xfff)
        .filter(|&a| a >= kernel_end)
        .ok_or_else(|| {
            boot_error(format!(
                "the initrd ({len} bytes) does not fit between the kernel's end \
                 ({kernel_end:#x}) and the top of RAM ({top:#x}): give the guest more memory"
            ))
        })?;
    Ok(start)
}

/// The e820 map of a guest with `mem_size` bytes of RAM.
fn e820_map(mem_size: u64) -> [boot_e820_entry; 4] {
    let entry = |addr: u64, end: u64, kind: u32| boot_e820_entry {
        addr,
        size: end - addr,
        r#type: kind,
    };
    [
        entry(0, MP_TABLE, E820_RAM),
        entry(MP_TABLE, BASE_END, E820_RESERVED),
        entry(BIOS_START, HIGH_MEMORY, E820_RESERVED),
        entry(HIGH_MEMORY, mem_size, E820_RAM),
    ]
}

/// The boot parameters for a kernel with `header` (a `bzImage`'s, or the defaults of the
/// protocol for a `vmlinux`), the command line of `cmdline_len` bytes, the initrd at
/// `initrd` (GPA, bytes), over `mem_size` bytes of RAM.
fn boot_params_for(
    header: Option<setup_header>,
    cmdline_len: usize,
    initrd: Option<(u64, u64)>,
    mem_size: u64,
) -> boot_params {
    let mut params = boot_params::default();
    if let Some(h) = header {
        params.hdr = h;
    } else {
        params.hdr.boot_flag = BOOT_FLAG;
        params.hdr.header = HDRS;
        params.hdr.version = PROTOCOL_2_15;
        params.hdr.kernel_alignment = KERNEL_ALIGNMENT;
        params.hdr.initrd_addr_max = INITRD_ADDR_MAX;
    }
    params.hdr.type_of_loader = LOADER_UNDEFINED;
    params.hdr.loadflags |= LOADED_HIGH;
    params.hdr.cmd_line_ptr = CMDLINE as u32;
    params.hdr.cmdline_size = cmdline_len as u32 + 1;
    if let Some((at, len)) = initrd {
        params.hdr.ramdisk_image = at as u32;
        params.hdr.ramdisk_size = len as u32;
    }
    let map = e820_map(mem_size);
    params.e820_table[..map.len()].copy_from_slice(&map);
    params.e820_entries = map.len() as u8;
    params
}

/// An MP configuration's bytes, checksummed: each section's bytes sum to 0 mod 256.
fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |s, &b| s.wrapping_add(b)))
}

/// The MP floating pointer (16 bytes) at `at`, followed by the configuration table for one
/// processor with LAPIC `lapic_id` whose CPUID signature and feature flags are `signature`
/// and `features` (module docs).
pub fn mp_table(at: u64, lapic_id: u8, signature: u32, features: u32) -> Vec<u8> {
    const INT: u8 = 0;
    const NMI: u8 = 1;
    const EXT_INT: u8 = 3;
    const ISA_BUS: u8 = 0;
    let mut entries: Vec<u8> = Vec::new();
    // Processor: enabled, bootstrap processor; LAPIC version 0x14 (an integrated APIC).
    entries.extend([0, lapic_id, 0x14, 0b11]);
    entries.extend(signature.to_le_bytes());
    entries.extend(features.to_le_bytes());
    entries.extend([0; 8]);
    // Bus 0: ISA.
    entries.extend([1, ISA_BUS]);
    entries.extend(*b"ISA   ");
    // The IOAPIC: version 0x11, enabled.
    entries.extend([2, IOAPIC_ID, 0x11, 1]);
    entries.extend(IOAPIC_BASE.to_le_bytes());
    // I/O interrupts: ExtINT on pin 0, ISA IRQ 0 on pin 2, IRQ n on pin n (conforming
    // polarity and trigger: edge, active high, as ISA).
    let io = |kind: u8, irq: u8, pin: u8| [3, kind, 0, 0, ISA_BUS, irq, IOAPIC_ID, pin];
    entries.extend(io(EXT_INT, 0, 0));
    entries.extend(io(INT, 0, 2));
    for irq in (1..16u8).filter(|&i| i != 2) {
        entries.extend(io(INT, irq, irq));
    }
    // Local interrupts: ExtINT on LINT0, NMI on LINT1, of every LAPIC (0xff).
    entries.extend([4, EXT_INT, 0, 0, ISA_BUS, 0, 0xff, 0]);
    entries.extend([4, NMI, 0, 0, ISA_BUS, 0, 0xff, 1]);
    let count = 1 + 1 + 1 + 16 + 2u16;

    let table_at = at + 16;
    let mut table: Vec<u8> = Vec::new();
    table.extend(*b"PCMP");
    table.extend(((44 + entries.len()) as u16).to_le_bytes());
    table.extend([4, 0]); // spec 1.4, checksum below
    table.extend(*b"VPMU    ");
    table.extend(*b"VPMU LINUX  ");
    table.extend(0u32.to_le_bytes()); // no OEM table
    table.extend(0u16.to_le_bytes());
    table.extend(count.to_le_bytes());
    table.extend(LAPIC_BASE.to_le_bytes());
    table.extend(0u16.to_le_bytes()); // no extended table
    table.extend([0, 0]);
    table.extend(entries);
    table[7] = checksum(&table);

    let mut pointer: Vec<u8> = Vec::new();
    pointer.extend(*b"_MP_");
    pointer.extend((table_at as u32).to_le_bytes());
    pointer.extend([1, 4, 0, 0, 0, 0, 0, 0]); // 16 bytes, spec 1.4, checksum, a table follows
    pointer[10] = checksum(&pointer);
    pointer.extend(table);
    pointer
}

/// CPUID leaf 1 EAX and EDX of `cpuid` (the MP table's processor signature and features).
fn leaf1(cpuid: &CpuId) -> (u32, u32) {
    cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == 1)
        .map_or((0, 0), |e| (e.eax, e.edx))
}

impl<P: Personality> Machine<P> {
    /// A one-vCPU machine booting the Linux kernel `kernel` (module docs) under
    /// `personality`.
    pub fn boot_linux(
        kvm: &Kvm,
        personality: P,
        base_cpuid: &CpuId,
        kernel: &[u8],
        options: &LinuxOptions,
    ) -> Result<Self> {
        let mut cpuid = base_cpuid.clone();
        personality.cpuid(&mut cpuid);
        let (vm, vcpu) = linux_vm(kvm, &cpuid, kernel, options, &options.cmdline)?;
        let mut machine = Self::assemble(
            personality,
            Layout::ThreadPerVcpu(1),
            vec![vm],
            vec![(
                vpmu::VcpuId {
                    domain: crate::PRIVILEGED_DOMAIN,
                    vcpu: 0,
                },
                vcpu,
            )],
        )?;
        machine.devices = Some(PcDevices::new(options.mem_size as u64, options.echo));
        Ok(machine)
    }
}

/// A VM with the Linux kernel `kernel` loaded for `options` with the command line `cmdline`
/// (module docs), and its one vCPU (CPUID `cpuid`) at the kernel's 64-bit entry.
pub(crate) fn linux_vm(
    kvm: &Kvm,
    cpuid: &CpuId,
    kernel: &[u8],
    options: &LinuxOptions,
    cmdline: &str,
) -> Result<(crate::kvm::Vm, crate::kvm::Vcpu)> {
    if cmdline.len() > MAX_CMDLINE || cmdline.contains('\0') {
        return Err(boot_error(format!(
            "the kernel command line must be at most {MAX_CMDLINE} bytes without NUL"
        )));
    }
    let mem_size = options.mem_size as u64;
    if !(MIN_MEM_MIB << 20..=MAX_MEM_MIB << 20).contains(&mem_size) {
        return Err(boot_error(format!(
            "a Linux guest needs {MIN_MEM_MIB} to {MAX_MEM_MIB} MiB of RAM"
        )));
    }
    let vm = crate::kvm::Vm::empty(kvm, &crate::all_pmu_msr_ranges(), options.mem_size)?;
    crate::kvm::setup_page_tables(&vm.mem)?;
    let Loaded { entry, header, end } = load_kernel(&vm.mem, kernel)?;
    let initrd = match &options.initrd {
        Some(bytes) => {
            let max = header.map_or(INITRD_ADDR_MAX, |h| h.initrd_addr_max);
            let at = initrd_address(mem_size, bytes.len() as u64, end, u64::from(max))?;
            vm.mem.write(at, bytes)?;
            Some((at, bytes.len() as u64))
        }
        None => None,
    };
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    vm.mem.write(CMDLINE, &bytes)?;
    let params = boot_params_for(header, cmdline.len(), initrd, mem_size);
    LinuxBootConfigurator::write_bootparams::<vm_memory::GuestMemoryMmap>(
        &BootParams::new(&params, GuestAddress(ZERO_PAGE)),
        vm.mem.backend(),
    )
    .map_err(|e| boot_error(format!("writing boot_params: {e}")))?;
    let (signature, features) = leaf1(cpuid);
    vm.mem
        .write(MP_TABLE, &mp_table(MP_TABLE, 0, signature, features))?;
    let vcpu = vm.create_vcpu(0, cpuid, entry, BOOT_STACK, 0, ZERO_PAGE)?;
    Ok((vm, vcpu))
}

/// What a Linux boot run gives back: the vCPU's result, the host quirks the probes found and
/// the command line the kernel got.
#[derive(Debug)]
pub struct LinuxRun {
    /// The one vCPU's result (console, exit status or reset, PMIs, completions, ...).
    pub result: RunResult,
    /// What the probes found (and the VMM completed or switched off).
    pub quirks: HostQuirks,
    /// The kernel command line, with the quirks' parameters appended.
    pub cmdline: String,
}

/// Boots `kernel` on the test shape `shape` with event source `source`, for at most
/// `timeout`: probes the host's quirks first (`quirks`), appends the kernel parameters that
/// keep Linux off what this host cannot execute, and runs.
pub fn run(
    kvm: &Kvm,
    shape: Shape,
    source: Source,
    kernel: &[u8],
    options: LinuxOptions,
    timeout: Duration,
) -> Result<LinuxRun> {
    run_switching_off(kvm, shape, source, kernel, options, timeout, None)
}

/// [`run`], and with `interface_off_after` the host switches the xenpmu interface off that
/// long after the guest's first PMI (`Machine::switch_interface_off_after`,
/// [`crate::interface_off`]).
pub fn run_switching_off(
    kvm: &Kvm,
    shape: Shape,
    source: Source,
    kernel: &[u8],
    mut options: LinuxOptions,
    timeout: Duration,
    interface_off_after: Option<Duration>,
) -> Result<LinuxRun> {
    let base = crate::kvm::supported_cpuid(kvm)?;
    with_personality!(shape, source, |p| {
        let (quirks, cmdline) = quirks_for(kvm, &p, &base, &options)?;
        // The command line is replaced, not the options copied (an initrd may be tens of MB).
        options.cmdline = cmdline;
        let mut machine = Machine::boot_linux(kvm, p, &base, kernel, &options)?;
        machine.quirks = quirks.clone();
        if let Some(after) = interface_off_after {
            machine.switch_interface_off_after(after);
        }
        let result = machine.run(timeout).pop().unwrap_or_default();
        Ok(LinuxRun {
            result,
            quirks,
            cmdline: options.cmdline,
        })
    })
}

/// The quirks of this host for a guest of `personality`, and the command line with their
/// kernel parameters appended.
pub(crate) fn quirks_for<P: Personality>(
    kvm: &Kvm,
    personality: &P,
    base: &CpuId,
    options: &LinuxOptions,
) -> Result<(HostQuirks, String)> {
    let mut cpuid = base.clone();
    personality.cpuid(&mut cpuid);
    let quirks = HostQuirks::detect(kvm, &cpuid)?;
    let cmdline = with_kernel_parameters(&options.cmdline, &quirks.kernel_parameters());
    Ok((quirks, cmdline))
}

/// `cmdline` with `extra` added to the kernel's parameters: before a ` -- `, after which
/// Linux hands the words to init.
fn with_kernel_parameters(cmdline: &str, extra: &str) -> String {
    if extra.is_empty() {
        return cmdline.to_string();
    }
    let (kernel, init) = match cmdline.split_once("-- ") {
        Some((kernel, init)) if kernel.is_empty() || kernel.ends_with(' ') => {
            (kernel.trim_end(), Some(init))
        }
        _ => (cmdline.trim_end(), None),
    };
    let kernel = if kernel.is_empty() {
        extra.to_string()
    } else {
        format!("{kernel} {extra}")
    };
    match init {
        Some(init) => format!("{kernel} -- {init}"),
        None => kernel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF64 header and one PT_LOAD program header: type, machine, entry, paddr.
    fn elf(e_type: u16, machine: u16, entry: u64, paddr: u64) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56];
        elf[..4].copy_from_slice(b"\x7fELF");
        (elf[4], elf[5], elf[6]) = (2, 1, 1); // 64-bit, little-endian, version 1
        elf[16..18].copy_from_slice(&e_type.to_le_bytes());
        elf[18..20].copy_from_slice(&machine.to_le_bytes());
        elf[20..24].copy_from_slice(&1u32.to_le_bytes());
        elf[24..32].copy_from_slice(&entry.to_le_bytes());
        elf[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        elf[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        elf[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        elf[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        elf[64..68].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        elf[64 + 24..64 + 32].copy_from_slice(&paddr.to_le_bytes());
        elf
    }

    #[test]
    fn kernel_formats_are_recognised() {
        let kernel = elf(2, 62, 0x100_0000, 0x100_0000);
        assert_eq!(kernel_format(&kernel), Some(KernelFormat::Vmlinux));
        assert_eq!(
            kernel_format(&elf(2, 3, 0x100_0000, 0x100_0000)),
            None,
            "i386"
        );
        assert_eq!(
            kernel_format(&elf(3, 62, 0x100_0000, 0x100_0000)),
            None,
            "a PIE"
        );
        assert_eq!(
            kernel_format(&elf(2, 62, 0x8_1000, 0x10_0000)),
            None,
            "low entry"
        );
        assert_eq!(
            kernel_format(&elf(2, 62, 0x100_0000, 0x1000)),
            None,
            "low segment"
        );
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(kernel_format(&bz), Some(KernelFormat::BzImage));
        assert_eq!(kernel_format(b"not a kernel"), None);
    }

    /// A bzImage as the boot protocol lays it out: setup sectors with the header at 0x1f1,
    /// then the protected-mode payload, which goes to 1 MiB; the 64-bit entry is 0x200 in.
    #[test]
    fn a_bzimage_payload_goes_to_one_mib_with_its_64_bit_entry() {
        let setup_sects = 4u8;
        let mut image = vec![0u8; (usize::from(setup_sects) + 1) * 512];
        image[0x1f1] = setup_sects;
        image[0x1fe..0x200].copy_from_slice(&BOOT_FLAG.to_le_bytes());
        image[0x202..0x206].copy_from_slice(b"HdrS");
        image[0x206..0x208].copy_from_slice(&PROTOCOL_2_15.to_le_bytes());
        image[0x211] = LOADED_HIGH;
        image[0x214..0x218].copy_from_slice(&(HIGH_MEMORY as u32).to_le_bytes()); // code32_start
        image[0x236..0x238].copy_from_slice(&1u16.to_le_bytes()); // XLF_KERNEL_64
        image[0x260..0x264].copy_from_slice(&(1u32 << 20).to_le_bytes()); // init_size
        let payload: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        image.extend(&payload);
        assert_eq!(kernel_format(&image), Some(KernelFormat::BzImage));
        let mem = GuestMem::new(8 << 20).expect("memory");
        let loaded = load_kernel(&mem, &image).expect("loads");
        assert_eq!(loaded.entry, HIGH_MEMORY + BZIMAGE_ENTRY_64);
        assert_eq!(mem.to_vec(HIGH_MEMORY, payload.len()), Some(payload));
        assert!(loaded.header.is_some());
        assert!(
            loaded.end >= HIGH_MEMORY + (1 << 20),
            "room for the decompressed kernel"
        );
        // Without the 64-bit entry flag (and an older protocol) it is refused.
        image[0x236] = 0;
        image[0x206..0x208].copy_from_slice(&0x020cu16.to_le_bytes());
        assert!(load_kernel(&mem, &image).is_err());
        assert!(load_kernel(&mem, b"neither").is_err());
    }

    #[test]
    fn host_parameters_go_before_the_init_arguments() {
        let x = "clearcpuid=154,151";
        assert_eq!(
            with_kernel_parameters("console=ttyS0", x),
            "console=ttyS0 clearcpuid=154,151"
        );
        assert_eq!(with_kernel_parameters("", x), x);
        assert_eq!(with_kernel_parameters("console=ttyS0", ""), "console=ttyS0");
        assert_eq!(
            with_kernel_parameters("rdinit=/bin/busybox -- halt -f", x),
            "rdinit=/bin/busybox clearcpuid=154,151 -- halt -f"
        );
        assert_eq!(
            with_kernel_parameters("-- sh", x),
            "clearcpuid=154,151 -- sh"
        );
        // `--` inside a word is not the separator.
        assert_eq!(
            with_kernel_parameters("a=b--c", x),
            "a=b--c clearcpuid=154,151"
        );
    }

    #[test]
    fn mp_table_checksums_and_counts() {
        let t = mp_table(MP_TABLE, 0, 0x806f8, 0x178bfbff);
        assert_eq!(&t[..4], b"_MP_");
        assert_eq!(t[..16].iter().fold(0u8, |s, &b| s.wrapping_add(b)), 0);
        let table = &t[16..];
        assert_eq!(&table[..4], b"PCMP");
        let len = u16::from_le_bytes([table[4], table[5]]) as usize;
        assert_eq!(len, table.len());
        assert_eq!(table.iter().fold(0u8, |s, &b| s.wrapping_add(b)), 0);
        assert_eq!(u16::from_le_bytes([table[34], table[35]]), 21);
        // Pointer's physical address is the table's.
        assert_eq!(
            u32::from_le_bytes([t[4], t[5], t[6], t[7]]),
            (MP_TABLE + 16) as u32
        );
        // It fits in the reserved KiB.
        assert!(MP_TABLE + t.len() as u64 <= BASE_END);
    }

    #[test]
    fn initrd_goes_to_the_top_page_aligned_or_is_refused() {
        let at = initrd_address(128 << 20, 3000, 32 << 20, 0x7fff_ffff).expect("fits");
        assert_eq!(at, (128 << 20) - 4096);
        assert!(initrd_address(128 << 20, 200 << 20, 32 << 20, 0x7fff_ffff).is_err());
        let capped = initrd_address(1 << 32, 4096, 32 << 20, 0x7fff_ffff).expect("fits");
        assert_eq!(capped, 0x8000_0000 - 4096);
    }

    #[test]
    fn boot_params_carry_map_cmdline_and_initrd() {
        let p = boot_params_for(None, 10, Some((0x700_0000, 1234)), 128 << 20);
        assert_eq!({ p.hdr.boot_flag }, BOOT_FLAG);
        assert_eq!({ p.hdr.header }, HDRS);
        assert_eq!({ p.hdr.cmd_line_ptr }, CMDLINE as u32);
        assert_eq!({ p.hdr.ramdisk_image }, 0x700_0000);
        assert_eq!({ p.hdr.ramdisk_size }, 1234);
        assert_eq!(p.e820_entries, 4);
        let last = p.e820_table[3];
        assert_eq!(
            ({ last.addr }, { last.size }),
            (HIGH_MEMORY, (128 << 20) - HIGH_MEMORY)
        );
        assert_eq!({ p.e820_table[1].r#type }, E820_RESERVED);
    }
}
