//! Result reporting: check names, the checks, and the console, through the C runtime.

use core::fmt::Write as _;
use core::sync::atomic::{AtomicU32, Ordering::SeqCst};

use crate::PCPUS;
use crate::hw::without_interrupts;

// ---------------------------------------------------------------------------------------------
// The C runtime (vmm/guests/runtime/rt.c) and the harness (ring0.c).

unsafe extern "C" {
    fn report(name: *const u8, ok: i32);
    fn report_val(name: *const u8, ok: i32, got: u64, want: u64);
    fn puts(s: *const u8);
}

// ---------------------------------------------------------------------------------------------
// Reporting.

/// A check's name, NUL-terminated, formatted into a fixed buffer (truncated).
pub(crate) struct Name {
    buf: [u8; 112],
    len: usize,
}

impl Name {
    pub(crate) fn new() -> Self {
        Name {
            buf: [0; 112],
            len: 0,
        }
    }

    fn ptr(&mut self) -> *const u8 {
        let end = self.len.min(self.buf.len() - 1);
        self.buf[end] = 0;
        self.buf.as_ptr()
    }
}

impl core::fmt::Write for Name {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for &b in s.as_bytes() {
            if self.len + 1 < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
        Ok(())
    }
}

macro_rules! name {
    ($($arg:tt)*) => {{
        let mut n = Name::new();
        let _ = write!(n, $($arg)*);
        n
    }};
}
pub(crate) use name;

/// Failed checks per CPU (the exit status of each vCPU).
pub(crate) static FAILED: [AtomicU32; PCPUS] = [const { AtomicU32::new(0) }; PCPUS];

pub(crate) fn check(cpu: u32, mut name: Name, ok: bool) -> bool {
    // SAFETY: the runtime's reporter reads the NUL-terminated string and copies it.
    without_interrupts(|| unsafe { report(name.ptr(), i32::from(ok)) });
    if !ok {
        FAILED[cpu as usize].fetch_add(1, SeqCst);
    }
    ok
}

pub(crate) fn check_val(cpu: u32, mut name: Name, got: u64, want: u64) -> bool {
    let ok = got == want;
    // SAFETY: as in `check`.
    without_interrupts(|| unsafe { report_val(name.ptr(), i32::from(ok), got, want) });
    if !ok {
        FAILED[cpu as usize].fetch_add(1, SeqCst);
    }
    ok
}

pub(crate) fn say(mut line: Name) {
    let _ = line.write_str("\n");
    // SAFETY: the runtime's console writer reads the NUL-terminated string.
    without_interrupts(|| unsafe { puts(line.ptr()) });
}
