//! The MMIO port window (`vpmu_guest_protocol::mmio`): a page of guest-physical addresses
//! outside RAM in every domain, where a 4-byte write of `value` at `PORTS_BASE + 4 * port`
//! is taken as `outl(port, value)` by the writing vCPU. It exists because on this host port
//! I/O from guest CPL3 mostly never reaches the VMM, while an MMIO write from CPL3 (KVM's
//! emulator decodes it) does: a Linux user-space program maps the page through `/dev/mem`
//! and rings the profiler's doorbell there.
//!
//! A window write goes to the project's ports exactly as an `outl` of an ELF guest does (the
//! machine's own, then the consumer's `GuestPorts`), never to a Linux domain's PC devices:
//! the window is the project's port space. Reads of the window return 0. A write of another
//! width, or at an offset that is not a port's slot, ends an ELF guest's run with an error
//! (its program is the project's, and wrong); in a Linux domain it is ignored with one line
//! on stderr (a user-space program's mistake must not take the kernel down with it).

use vpmu_guest_protocol::mmio;

use crate::error::{MachineError, Result};
use crate::exit::Exit;
use crate::personality::Personality;
use crate::runner::Runner;

/// What an exit is once the window has seen it.
pub(crate) enum Routed {
    /// An exit to handle as usual: the one KVM gave, or (`true`) a window write turned into
    /// the `outl` it stands for.
    Exit(Exit, bool),
    /// A window access answered here (a read, or an ignored write of a Linux domain).
    Handled,
}

/// The port and value of a `len`-byte write of `value` at `addr` inside the window, or why
/// the window refuses it.
pub(crate) fn port_write(addr: u64, len: usize, value: u64) -> Result<(u16, u32), String> {
    match mmio::port_at(addr) {
        Some(port) if len == 4 => Ok((port, value as u32)),
        Some(port) => Err(format!(
            "a {len}-byte write of {value:#x} at {addr:#x} (port {port:#x}'s slot): the \
             window takes 4-byte writes only"
        )),
        None => Err(format!(
            "a {len}-byte write of {value:#x} at {addr:#x}: not a port's slot (the window \
             takes 4-byte writes at {:#x} + 4 * port)",
            mmio::PORTS_BASE
        )),
    }
}

impl<P: Personality> Runner<'_, P> {
    /// Routes an MMIO exit that falls in the port window (module docs); every other exit
    /// passes unchanged.
    pub(crate) fn window_exit(&mut self, exit: Exit) -> Result<Routed> {
        match exit {
            Exit::MmioRead { addr, data, len } if mmio::contains(addr) => {
                // SAFETY: `data` points at `len` (at most 8) bytes of the kvm_run page's MMIO
                // data area, alive while the vCPU fd lives.
                unsafe { std::ptr::write_bytes(data, 0, len.min(8)) };
                Ok(Routed::Handled)
            }
            Exit::MmioWrite { addr, value, len } if mmio::contains(addr) => {
                match port_write(addr, len, value) {
                    Ok((port, value)) => Ok(Routed::Exit(
                        Exit::Out {
                            port,
                            size: 4,
                            value,
                        },
                        true,
                    )),
                    Err(why) if self.devices.is_some() => {
                        eprintln!(
                            "vpmu: domain {} vCPU {}: MMIO port window: {why}: ignored",
                            self.me.domain, self.me.vcpu
                        );
                        Ok(Routed::Handled)
                    }
                    Err(why) => Err(MachineError::Window(why)),
                }
            }
            other => Ok(Routed::Exit(other, false)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use vpmu::VcpuId;
    use vpmu_guest_protocol::{mmio::PORTS_BASE, port};

    use crate::personality::{Intel, Source};
    use crate::{GuestPorts, Layout, Machine, PortAccess};

    /// Where the test programs are loaded.
    const LOAD: u64 = 0x20_0000;
    /// Bytes of the ELF header and its one program header, before the code.
    const HEADERS: u64 = 64 + 56;

    /// A static ELF64 x86-64 executable of `code` (64-bit CPL0, entered at its first byte).
    fn program(code: &[u8]) -> Vec<u8> {
        let mut elf = vec![0u8; HEADERS as usize];
        elf[..4].copy_from_slice(b"\x7fELF");
        (elf[4], elf[5], elf[6]) = (2, 1, 1);
        elf[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
        elf[20..24].copy_from_slice(&1u32.to_le_bytes());
        elf[24..32].copy_from_slice(&(LOAD + HEADERS).to_le_bytes());
        elf[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        elf[52..54].copy_from_slice(&64u16.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        let size = (HEADERS as usize + code.len()) as u64;
        let ph = &mut elf[64..];
        ph[..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        ph[4..8].copy_from_slice(&7u32.to_le_bytes()); // RWX
        ph[16..24].copy_from_slice(&LOAD.to_le_bytes()); // vaddr
        ph[24..32].copy_from_slice(&LOAD.to_le_bytes()); // paddr
        ph[32..40].copy_from_slice(&size.to_le_bytes());
        ph[40..48].copy_from_slice(&size.to_le_bytes());
        elf.extend(code);
        elf
    }

    /// `mov eax, slot of port` (zero-extended into RAX: a 32-bit displacement would be
    /// sign-extended past 4 GiB).
    fn slot(port: u16) -> Vec<u8> {
        let mut code = vec![0xb8];
        code.extend(((PORTS_BASE + 4 * u64::from(port)) as u32).to_le_bytes());
        code
    }

    /// `mov dword [rax], value`.
    fn store(value: u32) -> Vec<u8> {
        let mut code = vec![0xc7, 0x00];
        code.extend(value.to_le_bytes());
        code
    }

    /// An `out` the extension saw: writer, port, value, the writer's code bytes.
    type Out = (VcpuId, u16, u32, Option<Vec<u8>>);

    #[derive(Default)]
    struct Recorder {
        outs: Mutex<Vec<Out>>,
    }

    impl GuestPorts for Recorder {
        fn out(&self, access: PortAccess<'_>, port: u16, value: u32) -> Result<(), String> {
            // The writer's own memory: the program's first bytes.
            let code = access.memory.to_vec(LOAD + HEADERS, 5);
            self.outs
                .lock()
                .map_err(|_| "poisoned")?
                .push((access.vcpu, port, value, code));
            Ok(())
        }
    }

    #[test]
    fn a_guest_rings_ports_through_the_window() {
        let Ok(kvm) = crate::kvm::usable() else {
            eprintln!("SKIPPED: /dev/kvm not available (MMIO port window test)");
            println!("SKIPPED: /dev/kvm not available (MMIO port window test)");
            return;
        };
        let cpuid = crate::kvm::supported_cpuid(&kvm).expect("cpuid");
        // BATCH <- 0x12345678; read the TRACE slot (0) into EBX; TRACE <- EBX; the console
        // gets 'W'; EXIT <- 7.
        let mut code = slot(port::BATCH);
        code.extend(store(0x1234_5678));
        code.extend(slot(port::TRACE));
        code.extend([0x8b, 0x18, 0x89, 0x18]); // mov ebx, [rax]; mov [rax], ebx
        code.extend(slot(port::CONSOLE));
        code.extend(store(u32::from(b'W')));
        code.extend(slot(port::EXIT));
        code.extend(store(7));
        code.push(0xf4);
        let image = program(&code);
        // Two domains on one pCPU: each write is its own domain's.
        let mut machine = Machine::with_images(
            &kvm,
            Intel::v5(Source::Timed),
            &cpuid,
            &|_| image.as_slice(),
            0,
            Layout::SharedPcpu(2),
        )
        .expect("VM");
        let recorder = Arc::new(Recorder::default());
        machine.extend(recorder.clone());
        let results = machine.run(Duration::from_secs(20));
        for r in &results {
            assert_eq!(r.error, None, "{r:?}");
            assert_eq!(r.status, Some(7));
            assert_eq!(r.console, "W");
        }
        let outs = recorder.outs.lock().expect("lock").clone();
        for domain in 0..2 {
            let id = VcpuId { domain, vcpu: 0 };
            let mine: Vec<_> = outs.iter().filter(|o| o.0 == id).collect();
            let ports: Vec<(u16, u32)> = mine.iter().map(|o| (o.1, o.2)).collect();
            assert_eq!(ports, [(port::BATCH, 0x1234_5678), (port::TRACE, 0)]);
            assert!(mine.iter().all(|o| o.3.as_deref() == Some(&code[..5])));
        }
    }

    #[test]
    fn an_elf_guest_that_writes_the_window_wrong_fails() {
        let Ok(kvm) = crate::kvm::usable() else {
            eprintln!("SKIPPED: /dev/kvm not available (MMIO port window test)");
            println!("SKIPPED: /dev/kvm not available (MMIO port window test)");
            return;
        };
        let cpuid = crate::kvm::supported_cpuid(&kvm).expect("cpuid");
        // A 2-byte write to BATCH's slot, then a write outside RAM and the window.
        let mut code = slot(port::BATCH);
        code.extend([0x66, 0xc7, 0x00, 0x01, 0x00]); // mov word [rax], 1
        code.push(0xf4);
        let outside = {
            let mut c = vec![0xb8];
            c.extend(0xC800_0000u32.to_le_bytes());
            c.extend(store(1));
            c.push(0xf4);
            c
        };
        for (code, want) in [(code, "2-byte write"), (outside, "0xc8000000")] {
            let image = program(&code);
            let machine =
                Machine::new(&kvm, Intel::v5(Source::Timed), &cpuid, &image, 0, 1).expect("VM");
            let results = machine.run(Duration::from_secs(20));
            let error = results[0].error.as_deref().unwrap_or("");
            assert!(error.contains(want), "{error}");
        }
    }

    #[test]
    fn aligned_four_byte_writes_are_ports_and_the_rest_refused() {
        assert_eq!(
            port_write(PORTS_BASE + 4 * u64::from(port::BATCH), 4, 0x1234_5678),
            Ok((port::BATCH, 0x1234_5678))
        );
        // The upper half of an 8-byte value is not the port's: only 4-byte writes count.
        let wide = port_write(PORTS_BASE + 4 * u64::from(port::BATCH), 8, 1 << 40);
        assert!(wide.is_err_and(|e| e.contains("8-byte") && e.contains("4-byte writes only")));
        assert!(port_write(PORTS_BASE + 4, 2, 1).is_err());
        assert!(port_write(PORTS_BASE + 4, 1, 1).is_err());
        let unaligned = port_write(PORTS_BASE + 6, 4, 1);
        assert!(unaligned.is_err_and(|e| e.contains("not a port's slot")));
        assert_eq!(
            port_write(PORTS_BASE + 0xffc, 4, 7),
            Ok((1023, 7)),
            "the last slot"
        );
    }
}
