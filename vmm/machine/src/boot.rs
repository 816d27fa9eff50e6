//! Boot-image mode (`vpmu boot`): a multiboot (version 1) ELF image run as QEMU's `-kernel`
//! loads it, on one vCPU, with the few PC devices such an image expects. This is how upstream
//! kvm-unit-tests (`x86/pmu` and friends) runs unmodified on the machine.
//!
//! * Entry: flat 32-bit protected mode at the ELF entry, paging off, EAX = `0x2BADB002`,
//!   EBX = the GPA of the multiboot information block ([`INFO_GPA`]: `mem_lower`/`mem_upper`
//!   and the command line). The image builds its own GDT, page tables and IDT.
//! * RAM: `BootOptions::mem_size` from GPA 0 (256 MiB by default).
//! * Devices (`PcDevices`): COM1 at 0x3f8 (a 16550 whose transmitter is always empty; the
//!   bytes written to THR are the console), isa-debug-exit at 0xf4 (the run ends with the
//!   value written as the guest's exit code), fw_cfg at 0x510/0x511 (selector and data: the
//!   signature, the ID, `RAM_SIZE`, `NOGRAPHIC`, `NB_CPUS` = `MAX_CPUS` = 1; every other item
//!   reads as zeros, as QEMU answers an item it does not have). Every other port (the PIC, the
//!   Bochs shutdown port 0x8900, POST 0x80) ignores writes and reads as all ones, as an
//!   unclaimed ISA port does. The LAPIC is KVM's in-kernel one.
//! * The PMU: one of the test shapes on the precise event source, the vCPU's own pCPU,
//!   with the machine's MSR filter, stepping, LVTPC delivery and RDPMC completion unchanged.
//!   The project's own guest ports (`port`) are not served: the image is not one of them.

use std::io::Write as _;
use std::time::Duration;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use vpmu_models::shapes::Shape;

use crate::error::{MachineError, Result};
use crate::kvm::GuestMem;
use crate::personality::{Personality, Source, with_personality};
use crate::{Machine, RunResult};

/// EAX at the entry of a multiboot image.
pub const MULTIBOOT_BOOTLOADER_MAGIC: u32 = 0x2BAD_B002;
/// Where the multiboot information block is (EBX at entry).
pub const INFO_GPA: u64 = 0x9000;
/// Where the command line is (a NUL-terminated string).
const CMDLINE_GPA: u64 = 0x9100;
/// The longest command line (bytes, without the NUL).
pub const MAX_CMDLINE: usize = 0xf00 - 1;
/// RAM below 1 MiB a multiboot loader reports (`mem_lower`, KiB).
const MEM_LOWER_KIB: u32 = 640;
/// Multiboot information flags: `mem_*` valid (bit 0), `cmdline` valid (bit 2).
const INFO_MEM: u32 = 1 << 0;
const INFO_CMDLINE: u32 = 1 << 2;

/// The smallest and largest RAM of a boot image (MiB).
pub const MIN_MEM_MIB: u64 = 2;
/// See [`MIN_MEM_MIB`]; below the 32-bit MMIO hole (the LAPIC at 0xfee00000).
pub const MAX_MEM_MIB: u64 = 3072;
/// The RAM QEMU gives a kvm-unit-tests guest by default, and `vpmu boot`'s default (MiB).
pub const DEFAULT_MEM_MIB: u64 = 256;

/// How a boot image is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootOptions {
    /// Guest RAM in bytes, from GPA 0.
    pub mem_size: usize,
    /// The multiboot command line (QEMU passes the kernel's file name, then `-append`).
    pub cmdline: String,
    /// Copy the console to stdout as it is written (it is in `RunResult::console` anyway).
    pub echo: bool,
}

impl Default for BootOptions {
    fn default() -> Self {
        Self {
            mem_size: (DEFAULT_MEM_MIB << 20) as usize,
            cmdline: String::new(),
            echo: false,
        }
    }
}

/// Writes the multiboot information block for `options` at [`INFO_GPA`] (command line at
/// `CMDLINE_GPA`) and returns its GPA.
pub(crate) fn write_info(mem: &GuestMem, options: &BootOptions) -> Result<u32> {
    if options.cmdline.len() > MAX_CMDLINE || options.cmdline.contains('\0') {
        return Err(MachineError::Boot(format!(
            "the command line must be at most {MAX_CMDLINE} bytes without NUL"
        )));
    }
    let upper_kib = (mem.len() as u64).saturating_sub(1 << 20) / 1024;
    let mut info = [0u32; 22];
    info[0] = INFO_MEM | INFO_CMDLINE;
    info[1] = MEM_LOWER_KIB;
    info[2] = u32::try_from(upper_kib).unwrap_or(u32::MAX);
    info[4] = CMDLINE_GPA as u32;
    let bytes: Vec<u8> = info.iter().flat_map(|w| w.to_le_bytes()).collect();
    mem.write(INFO_GPA, &bytes)?;
    let mut cmdline = options.cmdline.as_bytes().to_vec();
    cmdline.push(0);
    mem.write(CMDLINE_GPA, &cmdline)?;
    Ok(INFO_GPA as u32)
}

impl<P: Personality> Machine<P> {
    /// A one-vCPU machine running the multiboot image `image` (ELF64 x86-64 or ELF32 i386
    /// with a multiboot header) as QEMU's `-kernel` would (module docs), under `personality`.
    pub fn boot(
        kvm: &Kvm,
        personality: P,
        base_cpuid: &CpuId,
        image: &[u8],
        options: &BootOptions,
    ) -> Result<Self> {
        if crate::loader::multiboot_header(image).is_none() {
            return Err(MachineError::Boot(
                "no multiboot header (magic 0x1BADB002 with its checksum) in the first 8 KiB"
                    .into(),
            ));
        }
        let mut cpuid = base_cpuid.clone();
        personality.cpuid(&mut cpuid);
        let vm = crate::kvm::Vm::empty(kvm, &crate::all_pmu_msr_ranges(), options.mem_size)?;
        let entry = crate::loader::load_elf_any_class(image, &vm.mem)?;
        let entry = u32::try_from(entry)
            .map_err(|_| MachineError::Boot(format!("entry point {entry:#x} above 4 GiB")))?;
        let info = write_info(&vm.mem, options)?;
        let vcpu = vm.create_flat32_vcpu(
            0,
            &cpuid,
            u64::from(entry),
            MULTIBOOT_BOOTLOADER_MAGIC,
            info,
        )?;
        let mut machine = Self::assemble(
            personality,
            crate::Layout::ThreadPerVcpu(1),
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

/// Runs `image` as a boot image on the test shape `shape` with event source `source` (the
/// precise one is what kvm-unit-tests' exact counts need), for at most `timeout`.
pub fn run(
    kvm: &Kvm,
    shape: Shape,
    source: Source,
    image: &[u8],
    options: &BootOptions,
    timeout: Duration,
) -> Result<RunResult> {
    let cpuid = crate::kvm::supported_cpuid(kvm)?;
    let result = with_personality!(shape, source, |p| Machine::boot(
        kvm, p, &cpuid, image, options
    )?
    .run(timeout)
    .pop());
    Ok(result.unwrap_or_default())
}

/// How often boot mode looks for a guest that powered off.
pub(crate) const POWER_CHECK: Duration = Duration::from_millis(100);
/// Consecutive looks that must find it halted with interrupts off.
const POWERED_OFF_LOOKS: u8 = 2;
/// RFLAGS.IF.
const RFLAGS_IF: u64 = 1 << 9;

/// The COM1 port base.
const COM1: u16 = 0x3f8;
/// isa-debug-exit.
const DEBUG_EXIT: u16 = 0xf4;
/// fw_cfg selector (16-bit) and data (8-bit) ports.
const FW_CFG_SELECTOR: u16 = 0x510;
const FW_CFG_DATA: u16 = 0x511;

/// 16550 LCR.DLAB: offsets 0 and 1 are the divisor latch.
const LCR_DLAB: u8 = 0x80;
/// LSR: transmitter holding register and transmitter empty.
const LSR_TX_EMPTY: u8 = 0x60;
/// IIR: no interrupt pending; the transmitter holding register is empty; FIFOs enabled.
const IIR_NONE: u8 = 0x01;
const IIR_THRE: u8 = 0x02;
const IIR_FIFO: u8 = 0xc0;
/// IER: the transmitter-empty interrupt enable.
const IER_THRI: u8 = 0x02;
/// FCR: FIFO enable.
const FCR_ENABLE: u8 = 0x01;
/// COM1's ISA interrupt line.
pub const COM1_IRQ: u32 = 4;
/// The keyboard controller's command/status port, and its "pulse the reset line" command.
const KBD_COMMAND: u16 = 0x64;
const KBD_RESET: u8 = 0xfe;
/// MSR: CTS, DSR, DCD (a null-modem peer that is always ready).
const MODEM_READY: u8 = 0xb0;

/// The fw_cfg items answered (the traditional I/O interface; numbers little-endian).
const FW_CFG_SIGNATURE: u16 = 0x00;
const FW_CFG_ID: u16 = 0x01;
const FW_CFG_RAM_SIZE: u16 = 0x03;
const FW_CFG_NOGRAPHIC: u16 = 0x04;
const FW_CFG_NB_CPUS: u16 = 0x05;
const FW_CFG_MAX_CPUS: u16 = 0x0f;

/// What a port write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PortEffect {
    /// Nothing the run loop must act on.
    None,
    /// isa-debug-exit: the guest ended with this code.
    Exit(u32),
    /// Raise this ISA interrupt line (an edge: the run loop pulses it).
    Interrupt(u32),
    /// The guest reset the machine through the keyboard controller.
    Reset,
}

/// The PC devices of a boot image (module docs), for one vCPU.
#[derive(Debug)]
pub(crate) struct PcDevices {
    /// LCR, IER, MCR, SCR, DLL, DLM of COM1.
    lcr: u8,
    ier: u8,
    mcr: u8,
    scr: u8,
    divisor: [u8; 2],
    /// FIFOs enabled (FCR bit 0): IIR then says so, and Linux's 8250 driver sees a 16550A.
    fifo: bool,
    /// A transmitter-empty interrupt is pending (cleared by reading IIR, as on a 16550).
    thre_pending: bool,
    /// fw_cfg: the selected item's bytes and the read position.
    item: Vec<u8>,
    at: usize,
    ram_size: u64,
    echo: bool,
    /// Ports the guest touched that no device claims (reported at the end).
    pub(crate) unclaimed: std::collections::BTreeSet<u16>,
    /// How many looks in a row found the vCPU halted with interrupts off.
    halted_off: u8,
}

impl PcDevices {
    pub(crate) fn new(ram_size: u64, echo: bool) -> Self {
        Self {
            lcr: 0x03,
            ier: 0,
            mcr: 0,
            scr: 0,
            divisor: [1, 0],
            fifo: false,
            thre_pending: false,
            item: Vec::new(),
            at: 0,
            ram_size,
            echo,
            unclaimed: std::collections::BTreeSet::new(),
            halted_off: 0,
        }
    }

    /// The bytes of fw_cfg item `key`.
    fn fw_cfg_item(&self, key: u16) -> Vec<u8> {
        match key & 0x3fff {
            FW_CFG_SIGNATURE => b"QEMU".to_vec(),
            // Bit 0: the traditional interface (no DMA).
            FW_CFG_ID => 1u32.to_le_bytes().to_vec(),
            FW_CFG_RAM_SIZE => self.ram_size.to_le_bytes().to_vec(),
            FW_CFG_NOGRAPHIC => 0u16.to_le_bytes().to_vec(),
            FW_CFG_NB_CPUS | FW_CFG_MAX_CPUS => 1u16.to_le_bytes().to_vec(),
            _ => Vec::new(),
        }
    }

    /// `out` of `size` bytes of `value` to `port`; console bytes are appended to `console`.
    pub(crate) fn out(
        &mut self,
        port: u16,
        size: usize,
        value: u32,
        console: &mut String,
    ) -> PortEffect {
        let byte = value as u8;
        match port {
            DEBUG_EXIT => {
                let mask = if size >= 4 {
                    u32::MAX
                } else {
                    (1u32 << (8 * size)) - 1
                };
                return PortEffect::Exit(value & mask);
            }
            COM1 if self.lcr & LCR_DLAB == 0 => {
                console.push(char::from(byte));
                if self.echo {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(&[byte]);
                    if byte == b'\n' {
                        let _ = out.flush();
                    }
                }
                // The byte is gone at once: the holding register is empty again.
                return self.transmitter_empty();
            }
            COM1 => self.divisor[0] = byte,
            0x3f9 if self.lcr & LCR_DLAB == 0 => {
                let was = self.ier;
                self.ier = byte & 0x0f;
                // Enabling the interrupt with the register empty raises it at once (how
                // Linux's 8250 driver starts a transmission and probes for the interrupt).
                if self.ier & IER_THRI != 0 && was & IER_THRI == 0 {
                    return self.transmitter_empty();
                }
                if self.ier & IER_THRI == 0 {
                    self.thre_pending = false;
                }
            }
            0x3f9 => self.divisor[1] = byte,
            0x3fa => self.fifo = byte & FCR_ENABLE != 0,
            KBD_COMMAND if byte == KBD_RESET => return PortEffect::Reset,
            KBD_COMMAND => {}
            0x3fb => self.lcr = byte,
            0x3fc => self.mcr = byte & 0x1f,
            0x3fd | 0x3fe => {} // LSR, MSR: read-only
            0x3ff => self.scr = byte,
            FW_CFG_SELECTOR => {
                self.item = self.fw_cfg_item(value as u16);
                self.at = 0;
            }
            FW_CFG_DATA => {} // writes through the data port are not supported (QEMU ignores them)
            other => {
                self.unclaimed.insert(other);
            }
        }
        PortEffect::None
    }

    /// The transmitter holding register became empty: an interrupt if it is enabled.
    fn transmitter_empty(&mut self) -> PortEffect {
        if self.ier & IER_THRI != 0 {
            self.thre_pending = true;
            PortEffect::Interrupt(COM1_IRQ)
        } else {
            PortEffect::None
        }
    }

    /// `in` of `size` bytes from `port`.
    pub(crate) fn input(&mut self, port: u16, size: usize) -> u32 {
        let byte = |b: u8| u32::from(b);
        match port {
            COM1 if self.lcr & LCR_DLAB == 0 => 0, // RBR: nothing received
            COM1 => byte(self.divisor[0]),
            0x3f9 if self.lcr & LCR_DLAB == 0 => byte(self.ier),
            0x3f9 => byte(self.divisor[1]),
            0x3fa => {
                let fifo = if self.fifo { IIR_FIFO } else { 0 };
                if std::mem::take(&mut self.thre_pending) {
                    byte(IIR_THRE | fifo)
                } else {
                    byte(IIR_NONE | fifo)
                }
            }
            // The keyboard controller: output and input buffers empty (its reset command is
            // taken at once).
            KBD_COMMAND => 0,
            0x3fb => byte(self.lcr),
            0x3fc => byte(self.mcr),
            0x3fd => byte(LSR_TX_EMPTY),
            0x3fe => byte(MODEM_READY),
            0x3ff => byte(self.scr),
            FW_CFG_DATA => {
                // Each byte read advances; past the item's end, zeros.
                (0..size.min(4)).fold(0, |v, i| {
                    let b = self.item.get(self.at).copied().unwrap_or(0);
                    self.at += 1;
                    v | u32::from(b) << (8 * i)
                })
            }
            other => {
                self.unclaimed.insert(other);
                if size >= 4 {
                    u32::MAX
                } else {
                    (1u32 << (8 * size)) - 1
                }
            }
        }
    }
}

impl<P: Personality> crate::runner::Runner<'_, P> {
    /// An exit in boot mode that the PC devices take: `Some(true)` if it ended the run,
    /// `Some(false)` if it was handled, None if it is not theirs (the machine's own handling
    /// applies).
    pub(crate) fn device_exit(
        &mut self,
        exit: &crate::exit::Exit,
        result: &mut RunResult,
    ) -> Result<Option<bool>> {
        use crate::exit::Exit;
        let Some(devices) = self.devices.as_mut() else {
            return Ok(None);
        };
        match *exit {
            // The xenpmu transport's port is served in boot mode too (the run loop's).
            Exit::In { port, .. } | Exit::Out { port, .. } if port == crate::port::HYPERCALL => {
                Ok(None)
            }
            Exit::Out { port, size, value } => self.device_out(port, size, value, result).map(Some),
            Exit::In { port, data, len } => {
                let bytes = devices.input(port, len).to_le_bytes();
                // SAFETY: `data` points at `len` bytes of the kvm_run page (the I/O data area
                // KVM named in the exit), alive while the vCPU fd lives.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, len.min(4)) };
                Ok(Some(false))
            }
            Exit::MmioRead { data, len, .. } => {
                // Nothing is there: reads float high, as on an unclaimed bus.
                // SAFETY: `data` points at `len` (at most 8) bytes of the kvm_run page's MMIO
                // data area, alive while the vCPU fd lives.
                unsafe { std::ptr::write_bytes(data, 0xff, len.min(8)) };
                Ok(Some(false))
            }
            Exit::MmioWrite { .. } => Ok(Some(false)),
            Exit::Kicked => {
                // A guest without ACPI powers off by halting with interrupts off (Linux's
                // `poweroff -f`: `machine_power_off` → `stop_this_cpu`); nothing but an NMI
                // would wake it.
                let halted = self
                    .vcpu
                    .fd
                    .get_mp_state()
                    .is_ok_and(|s| s.mp_state == kvm_bindings::KVM_MP_STATE_HALTED);
                let off = halted && self.sync.regs.rflags & RFLAGS_IF == 0;
                let Some(devices) = self.devices.as_mut() else {
                    return Ok(None);
                };
                devices.halted_off = if off { devices.halted_off + 1 } else { 0 };
                if devices.halted_off >= POWERED_OFF_LOOKS {
                    result.powered_off = true;
                    return Ok(Some(true));
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// A port write in boot mode, to the PC devices; true if it ended the run (isa-debug-exit,
    /// the keyboard controller's reset).
    pub(crate) fn device_out(
        &mut self,
        port: u16,
        size: usize,
        value: u32,
        result: &mut RunResult,
    ) -> Result<bool> {
        let Some(devices) = self.devices.as_mut() else {
            return Ok(false);
        };
        match devices.out(port, size, value, &mut result.console) {
            PortEffect::None => Ok(false),
            PortEffect::Exit(code) => {
                result.status = Some(code);
                Ok(true)
            }
            PortEffect::Reset => {
                result.reset = true;
                Ok(true)
            }
            PortEffect::Interrupt(line) => {
                // An edge on the in-kernel PIC and IOAPIC.
                for level in [true, false] {
                    self.vm
                        .vm
                        .set_irq_line(line, level)
                        .map_err(MachineError::kvm("KVM_IRQ_LINE"))?;
                }
                Ok(false)
            }
        }
    }
}

/// The process exit status for a boot image's isa-debug-exit code: 0 for code 0; otherwise
/// QEMU's `(code << 1) | 1` cut to 8 bits (so kvm-unit-tests' failure code 1 gives 3 and its
/// "everything skipped" code 38 gives 77, the status its scripts read as SKIP).
pub fn exit_status(code: u32) -> u8 {
    if code == 0 {
        0
    } else {
        ((code << 1) | 1) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_info_block_has_memory_and_command_line() {
        let mem = GuestMem::new(16 << 20).expect("memory");
        let options = BootOptions {
            mem_size: 16 << 20,
            cmdline: "pmu.elf -v".into(),
            echo: false,
        };
        assert_eq!(write_info(&mem, &options).expect("fits"), INFO_GPA as u32);
        let word = |i: u64| {
            let b = mem.to_vec(INFO_GPA + 4 * i, 4).expect("in RAM");
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        assert_eq!(word(0), INFO_MEM | INFO_CMDLINE);
        assert_eq!((word(1), word(2)), (640, 15 * 1024));
        assert_eq!(u64::from(word(4)), CMDLINE_GPA);
        assert_eq!(mem.to_vec(CMDLINE_GPA, 11), Some(b"pmu.elf -v\0".to_vec()));
        let long = BootOptions {
            cmdline: "x".repeat(MAX_CMDLINE + 1),
            ..options
        };
        assert!(write_info(&mem, &long).is_err());
    }

    #[test]
    fn the_serial_port_is_always_ready_and_honours_dlab() {
        let mut d = PcDevices::new(1 << 28, false);
        let mut console = String::new();
        assert_eq!(d.input(0x3fd, 1), 0x60);
        d.out(0x3fb, 1, 0x83, &mut console); // DLAB
        d.out(0x3f8, 1, 0x01, &mut console); // divisor, not output
        assert_eq!(d.input(0x3fb, 1), 0x83);
        d.out(0x3fb, 1, 0x03, &mut console);
        d.out(0x3f8, 1, u32::from(b'o'), &mut console);
        d.out(0x3f8, 1, u32::from(b'k'), &mut console);
        assert_eq!(console, "ok");
        assert_eq!(d.input(0x3fa, 1), 1);
        assert!(d.unclaimed.is_empty());
    }

    #[test]
    fn the_transmitter_interrupt_follows_a_16550() {
        let mut d = PcDevices::new(1 << 28, false);
        let mut console = String::new();
        // No interrupt while IER.THRI is clear; IIR says none (and FIFOs once enabled).
        assert_eq!(
            d.out(0x3f8, 1, u32::from(b'a'), &mut console),
            PortEffect::None
        );
        assert_eq!(d.input(0x3fa, 1), 0x01);
        d.out(0x3fa, 1, 0x07, &mut console);
        assert_eq!(d.input(0x3fa, 1), 0xc1);
        // Enabling it with the register empty raises it; reading IIR reports and clears it.
        assert_eq!(
            d.out(0x3f9, 1, 0x02, &mut console),
            PortEffect::Interrupt(4)
        );
        assert_eq!(d.input(0x3fa, 1), 0xc2);
        assert_eq!(d.input(0x3fa, 1), 0xc1);
        // Each byte written raises it again.
        assert_eq!(
            d.out(0x3f8, 1, u32::from(b'b'), &mut console),
            PortEffect::Interrupt(4)
        );
        assert_eq!(d.input(0x3fa, 1), 0xc2);
        // Disabling it drops a pending one.
        d.out(0x3f8, 1, u32::from(b'c'), &mut console);
        d.out(0x3f9, 1, 0x00, &mut console);
        assert_eq!(d.input(0x3fa, 1), 0xc1);
        assert_eq!(console, "abc");
    }

    #[test]
    fn the_keyboard_controller_resets_the_machine() {
        let mut d = PcDevices::new(1 << 28, false);
        let mut console = String::new();
        assert_eq!(
            d.input(0x64, 1),
            0,
            "buffers empty: Linux's kb_wait does not spin"
        );
        assert_eq!(d.out(0x64, 1, 0xfe, &mut console), PortEffect::Reset);
        assert_eq!(d.out(0x64, 1, 0xad, &mut console), PortEffect::None);
        assert!(d.unclaimed.is_empty());
    }

    #[test]
    fn fw_cfg_answers_cpus_and_ram() {
        let mut d = PcDevices::new(256 << 20, false);
        let mut console = String::new();
        let read = |d: &mut PcDevices, key: u32, n: usize| {
            d.out(0x510, 2, key, &mut String::new());
            (0..n).fold(0u64, |v, i| v | u64::from(d.input(0x511, 1)) << (8 * i))
        };
        assert_eq!(read(&mut d, 0x05, 2), 1);
        assert_eq!(read(&mut d, 0x03, 8), 256 << 20);
        assert_eq!(
            read(&mut d, 0x00, 4),
            u64::from(u32::from_le_bytes(*b"QEMU"))
        );
        // An item QEMU would not have (kvm-unit-tests' MAX_RAM, 0x11): zeros.
        assert_eq!(read(&mut d, 0x11, 8), 0);
        assert_eq!(
            d.out(0xf4, 4, 0x1_0000, &mut console),
            PortEffect::Exit(0x1_0000)
        );
        assert_eq!(d.out(0xf4, 1, 0x1ff, &mut console), PortEffect::Exit(0xff));
        assert_eq!(d.out(0x8900, 1, 0x53, &mut console), PortEffect::None);
        assert_eq!(d.input(0x21, 1), 0xff);
        assert!(d.unclaimed.contains(&0x8900) && d.unclaimed.contains(&0x21));
    }

    #[test]
    fn exit_status_follows_qemu_except_for_success() {
        assert_eq!(exit_status(0), 0);
        assert_eq!(exit_status(1), 3);
        assert_eq!(exit_status(38), 77);
    }
}
