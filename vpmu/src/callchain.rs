//! The call chain of a sample: return addresses walked at PMI time through the sampled
//! context's frame-pointer chain, read through the platform in that context's own address
//! space (`Platform::read_sampled`).
//!
//! A frame built by `push rbp; mov rbp, rsp` holds the caller's frame pointer at `[rbp]` and
//! the return address at `[rbp + w]` (w = 8 in 64-bit code, 4 in 32-bit code). The walk starts
//! at the interrupted RBP and follows saved frame pointers outwards. It is bounded by
//! `XENPMU_CALLCHAIN_MAX` reads, allocates nothing, never faults (the platform answers
//! `false` for memory it cannot read) and stops, saying why, at the first frame that cannot be
//! one: non-canonical, misaligned, below the stack pointer, or not above the previous frame
//! (so a corrupt or hostile chain cannot make it loop or read backwards). Perf's kernel
//! unwinder for frame pointers (`perf_callchain_user`) applies the same kind of checks.
//!
//! Every range the walk hands the platform is checked whole before the read: it does not wrap
//! past 2^64, both its ends are canonical and in the same half of the address space, and in
//! 32-bit code it does not cross 4 GiB. A user-mode sample's chain stays in user space, as
//! `perf_callchain_user` keeps it (Linux, arch/x86/events/core.c, `valid_user_frame`): in
//! 64-bit code a frame in the upper (kernel) half of the address space, or a return address
//! there, ends the chain with `XENPMU_CHAIN_BAD_FRAME`, so no kernel-half word is ever read
//! or published for it. In 32-bit code the user/kernel split is the guest's choice (3 GiB for
//! Linux i386, 2 GiB for 32-bit Windows, all 4 GiB for a compat task under a 64-bit kernel):
//! there only the 4 GiB bound is the walk's to enforce.
//!
//! 16-bit and real-mode code has no such convention here: no chain. A PMI inside a function's
//! prologue (before `mov rbp, rsp`) or in code built without frame pointers yields a chain
//! that misses frames or stops with `XENPMU_CHAIN_BAD_FRAME`: the documented limits of
//! frame-pointer unwinding.

use vpmu_abi::{
    Regs, XENPMU_CALLCHAIN_MAX, XENPMU_CHAIN_BAD_FRAME, XENPMU_CHAIN_COMPLETE, XENPMU_CHAIN_NONE,
    XENPMU_CHAIN_TRUNCATED, XENPMU_CHAIN_UNREADABLE, XENPMU_REGS_MODE_32, XENPMU_REGS_MODE_64,
    XENPMU_REGS_MODE_USER,
};

/// Which half of the canonical address space `address` lies in, for 5-level paging (bits
/// 63:56 copies of bit 56): the widest linear address space x86-64 has. A 4-level address
/// space's holes are caught by the read failing. `None`: not canonical.
fn half(address: u64) -> Option<Half> {
    match (address as i64) >> 56 {
        0 => Some(Half::Lower),
        -1 => Some(Half::Upper),
        _ => None,
    }
}

/// A half of the canonical address space: the upper one is the kernel's in every x86-64 OS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half {
    Lower,
    Upper,
}

/// Whether the `len` bytes at `start` may be handed to the platform: the range does not wrap
/// past 2^64, and in 64-bit code (`width` 8) both its ends are canonical and in the same half
/// (the lower one for a user-mode sample, `user`); in 32-bit code it ends at or below 4 GiB.
fn readable_range(start: u64, len: u64, width: u64, user: bool) -> bool {
    let Some(last) = start.checked_add(len - 1) else {
        return false;
    };
    if width == 4 {
        return last <= u64::from(u32::MAX);
    }
    match (half(start), half(last)) {
        (Some(Half::Lower), Some(Half::Lower)) => true,
        (Some(Half::Upper), Some(Half::Upper)) => !user,
        _ => false,
    }
}

/// Walks the frame-pointer chain of the context `regs` describes into `chain`, reading its
/// memory with `read` (linear address, bytes to fill; false if not readable); returns the
/// entries written and the `XENPMU_CHAIN_*` reason the walk ended.
pub(crate) fn walk(
    regs: &Regs,
    chain: &mut [u64; XENPMU_CALLCHAIN_MAX],
    mut read: impl FnMut(u64, &mut [u8]) -> bool,
) -> (u32, u32) {
    let width: u64 = if regs.mode & XENPMU_REGS_MODE_64 != 0 {
        8
    } else if regs.mode & XENPMU_REGS_MODE_32 != 0 {
        4
    } else {
        return (0, XENPMU_CHAIN_NONE);
    };
    let narrow = |value: u64| {
        if width == 4 {
            value & 0xffff_ffff
        } else {
            value
        }
    };
    // A user-mode sample's chain stays in user space (see the module's documentation).
    let user = regs.mode & XENPMU_REGS_MODE_USER != 0;
    let mut frame = narrow(regs.rbp);
    // The first frame must lie at or above the stack pointer; each next one above the last.
    let mut lowest = narrow(regs.rsp);
    let mut len = 0;
    loop {
        if frame == 0 {
            return (len as u32, XENPMU_CHAIN_COMPLETE);
        }
        if len == XENPMU_CALLCHAIN_MAX {
            return (len as u32, XENPMU_CHAIN_TRUNCATED);
        }
        if frame % width != 0 || frame < lowest || !readable_range(frame, 2 * width, width, user) {
            return (len as u32, XENPMU_CHAIN_BAD_FRAME);
        }
        let mut words = [0u8; 16];
        let bytes = &mut words[..2 * width as usize];
        if !read(frame, bytes) {
            return (len as u32, XENPMU_CHAIN_UNREADABLE);
        }
        let (saved_frame, return_address) = if width == 8 {
            (
                u64::from_le_bytes(words[..8].try_into().unwrap_or_default()),
                u64::from_le_bytes(words[8..].try_into().unwrap_or_default()),
            )
        } else {
            (
                u64::from(u32::from_le_bytes(
                    words[..4].try_into().unwrap_or_default(),
                )),
                u64::from(u32::from_le_bytes(
                    words[4..8].try_into().unwrap_or_default(),
                )),
            )
        };
        if return_address == 0 {
            return (len as u32, XENPMU_CHAIN_COMPLETE);
        }
        if user && width == 8 && half(return_address) != Some(Half::Lower) {
            // No user code runs there: not a frame of this chain, and not to be published.
            return (len as u32, XENPMU_CHAIN_BAD_FRAME);
        }
        chain[len] = return_address;
        len += 1;
        let Some(above) = frame.checked_add(2 * width) else {
            return (len as u32, XENPMU_CHAIN_BAD_FRAME);
        };
        lowest = above;
        frame = saved_frame;
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec::Vec;

    use super::*;
    use vpmu_abi::XENPMU_REGS_MODE_16;

    /// Sampled memory: a byte array at `base`.
    struct Stack {
        base: u64,
        bytes: Vec<u8>,
        reads: u32,
    }

    impl Stack {
        fn new(base: u64, len: usize) -> Self {
            Stack {
                base,
                bytes: std::vec![0; len],
                reads: 0,
            }
        }

        fn put(&mut self, address: u64, value: u64, width: usize) {
            let at = (address - self.base) as usize;
            self.bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        }

        fn read(&mut self, address: u64, out: &mut [u8]) -> bool {
            self.reads += 1;
            let Some(at) = address.checked_sub(self.base) else {
                return false;
            };
            let at = at as usize;
            match self.bytes.get(at..at + out.len()) {
                Some(bytes) => {
                    out.copy_from_slice(bytes);
                    true
                }
                None => false,
            }
        }
    }

    fn regs64(rbp: u64, rsp: u64) -> Regs {
        Regs {
            rbp,
            rsp,
            mode: XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_USER,
            ..Regs::default()
        }
    }

    fn run(stack: &mut Stack, regs: &Regs) -> (Vec<u64>, u32) {
        let mut chain = [0; XENPMU_CALLCHAIN_MAX];
        let (len, end) = walk(regs, &mut chain, |address, out| stack.read(address, out));
        assert!(chain[len as usize..].iter().all(|&a| a == 0));
        (chain[..len as usize].to_vec(), end)
    }

    #[test]
    fn a_three_frame_chain_ends_at_a_zero_frame_pointer() {
        let mut stack = Stack::new(0x7000, 0x1000);
        // main's frame at 0x7f00 (outermost: saved rbp 0), f at 0x7e00, g at 0x7d00.
        stack.put(0x7f00, 0, 8);
        stack.put(0x7f08, 0x40_1000, 8);
        stack.put(0x7e00, 0x7f00, 8);
        stack.put(0x7e08, 0x40_2000, 8);
        stack.put(0x7d00, 0x7e00, 8);
        stack.put(0x7d08, 0x40_3000, 8);
        let (chain, end) = run(&mut stack, &regs64(0x7d00, 0x7cf0));
        assert_eq!(chain, [0x40_3000, 0x40_2000, 0x40_1000]);
        assert_eq!(end, XENPMU_CHAIN_COMPLETE);
    }

    #[test]
    fn a_32_bit_chain_uses_4_byte_slots() {
        let mut stack = Stack::new(0x7000, 0x1000);
        stack.put(0x7e00, 0, 4);
        stack.put(0x7e04, 0x0804_8000, 4);
        stack.put(0x7d00, 0x7e00, 4);
        stack.put(0x7d04, 0x0804_9000, 4);
        let regs = Regs {
            // Upper halves as the CPU had them: ignored in 32-bit code.
            rbp: 0xdead_0000_0000_7d00,
            rsp: 0x7c00,
            mode: XENPMU_REGS_MODE_32,
            ..Regs::default()
        };
        let (chain, end) = run(&mut stack, &regs);
        assert_eq!(chain, [0x0804_9000, 0x0804_8000]);
        assert_eq!(end, XENPMU_CHAIN_COMPLETE);
    }

    #[test]
    fn bad_frames_stop_the_walk() {
        let mut stack = Stack::new(0x7000, 0x1000);
        // A frame pointing back at itself: not above the previous frame.
        stack.put(0x7d00, 0x7d00, 8);
        stack.put(0x7d08, 0x40_3000, 8);
        let (chain, end) = run(&mut stack, &regs64(0x7d00, 0x7cf0));
        assert_eq!(
            (chain.as_slice(), end),
            (&[0x40_3000][..], XENPMU_CHAIN_BAD_FRAME)
        );
        // Misaligned, non-canonical, and below the stack pointer.
        for (rbp, rsp) in [
            (0x7d04, 0x7c00),
            (0x8000_0000_0000_7d00, 0),
            (0x7d00, 0x7e00),
        ] {
            let (chain, end) = run(&mut stack, &regs64(rbp, rsp));
            assert_eq!((chain.len(), end), (0, XENPMU_CHAIN_BAD_FRAME), "{rbp:#x}");
        }
    }

    #[test]
    fn an_unreadable_frame_ends_the_chain_and_a_long_one_is_truncated() {
        let mut stack = Stack::new(0x7000, 0x1000);
        stack.put(0x7d00, 0x9_0000, 8);
        stack.put(0x7d08, 0x40_3000, 8);
        let (chain, end) = run(&mut stack, &regs64(0x7d00, 0x7cf0));
        assert_eq!(
            (chain.as_slice(), end),
            (&[0x40_3000][..], XENPMU_CHAIN_UNREADABLE)
        );

        let frames = XENPMU_CALLCHAIN_MAX as u64 + 10;
        let mut deep = Stack::new(0x10_0000, (frames as usize + 1) * 16);
        for k in 0..frames {
            let frame = 0x10_0000 + 16 * k;
            deep.put(frame, frame + 16, 8);
            deep.put(frame + 8, 0x50_0000 + k, 8);
        }
        let (chain, end) = run(&mut deep, &regs64(0x10_0000, 0x10_0000));
        assert_eq!(chain.len(), XENPMU_CALLCHAIN_MAX);
        assert_eq!(end, XENPMU_CHAIN_TRUNCATED);
        assert_eq!(
            deep.reads, XENPMU_CALLCHAIN_MAX as u32,
            "one read per frame, bounded"
        );
    }

    /// Walks `regs` over memory that reads as zeros everywhere, recording every range asked.
    fn ranges_asked(regs: &Regs) -> (Vec<(u64, usize)>, u32) {
        let mut asked = Vec::new();
        let mut chain = [0; XENPMU_CALLCHAIN_MAX];
        let (_, end) = walk(regs, &mut chain, |address, out| {
            asked.push((address, out.len()));
            out.fill(0);
            true
        });
        (asked, end)
    }

    #[test]
    fn no_range_asked_wraps_leaves_canonical_space_or_crosses_4_gib() {
        let kernel64 = |rbp: u64| Regs {
            rbp,
            rsp: rbp,
            mode: XENPMU_REGS_MODE_64,
            ..Regs::default()
        };
        let cases = [
            // 16 bytes from 2^64 - 8: the second word would be at address 0.
            kernel64(0xffff_ffff_ffff_fff8),
            // The last canonical word of the lower half (5-level): the return address slot
            // is past it, in the non-canonical hole.
            kernel64(0x00ff_ffff_ffff_fff8),
            // 32-bit code, 4 bytes below 4 GiB: the return address slot is above it.
            Regs {
                rbp: 0xffff_fffc,
                rsp: 0x1000,
                mode: XENPMU_REGS_MODE_32,
                ..Regs::default()
            },
        ];
        for regs in cases {
            let (asked, end) = ranges_asked(&regs);
            assert_eq!(
                (asked.as_slice(), end),
                (&[][..], XENPMU_CHAIN_BAD_FRAME),
                "{:#x}",
                regs.rbp
            );
        }
        // The same checks hold for a saved frame pointer, not only the first one.
        let mut stack = Stack::new(0x7000, 0x1000);
        stack.put(0x7d00, 0x00ff_ffff_ffff_fff8, 8);
        stack.put(0x7d08, 0x40_3000, 8);
        let (chain, end) = run(&mut stack, &regs64(0x7d00, 0x7cf0));
        assert_eq!(
            (chain.as_slice(), end, stack.reads),
            (&[0x40_3000][..], XENPMU_CHAIN_BAD_FRAME, 1)
        );
        // Ranges that end exactly at the top of a half, or at 4 GiB, are fine.
        let (asked, _) = ranges_asked(&kernel64(0xffff_ffff_ffff_fff0));
        assert_eq!(asked, [(0xffff_ffff_ffff_fff0, 16)]);
        let (asked, _) = ranges_asked(&Regs {
            rbp: 0xffff_fff8,
            rsp: 0x1000,
            mode: XENPMU_REGS_MODE_32,
            ..Regs::default()
        });
        assert_eq!(asked, [(0xffff_fff8, 8)]);
    }

    #[test]
    fn a_user_sample_never_reads_or_publishes_the_kernel_half() {
        // A user frame pointer into the kernel half: nothing read.
        let (asked, end) = ranges_asked(&regs64(0xffff_8000_0000_1000, 0x7000));
        assert_eq!((asked.as_slice(), end), (&[][..], XENPMU_CHAIN_BAD_FRAME));
        // A user frame whose saved frame pointer leads into the kernel half: the chain ends
        // there, after the one user frame.
        let kernel = 0xffff_8000_0000_0000;
        let mut stack = Stack::new(kernel, 0x1000);
        stack.put(kernel + 0x100, 0, 8);
        stack.put(kernel + 0x108, 0xffff_ffff_8100_0000, 8);
        let mut user = Stack::new(0x7000, 0x1000);
        user.put(0x7d00, kernel + 0x100, 8);
        user.put(0x7d08, 0x40_3000, 8);
        let mut chain = [0; XENPMU_CALLCHAIN_MAX];
        let (len, end) = walk(&regs64(0x7d00, 0x7cf0), &mut chain, |address, out| {
            if address >= kernel {
                stack.read(address, out)
            } else {
                user.read(address, out)
            }
        });
        assert_eq!(
            (&chain[..len as usize], end, stack.reads, user.reads),
            (&[0x40_3000][..], XENPMU_CHAIN_BAD_FRAME, 0, 1)
        );
        // A kernel-half return address in a user frame is not published.
        let mut user = Stack::new(0x7000, 0x1000);
        user.put(0x7e00, 0, 8);
        user.put(0x7e08, 0x40_1000, 8);
        user.put(0x7d00, 0x7e00, 8);
        user.put(0x7d08, 0xffff_ffff_8100_0000, 8);
        let (chain, end) = run(&mut user, &regs64(0x7d00, 0x7cf0));
        assert_eq!((chain.len(), end), (0, XENPMU_CHAIN_BAD_FRAME));
        // The same frames walked for a kernel sample are a kernel chain.
        let regs = Regs {
            mode: XENPMU_REGS_MODE_64,
            ..regs64(kernel + 0x100, kernel)
        };
        let (chain, end) = run(&mut stack, &regs);
        assert_eq!(
            (chain.as_slice(), end),
            (&[0xffff_ffff_8100_0000][..], XENPMU_CHAIN_COMPLETE)
        );
    }

    #[test]
    fn sixteen_bit_code_has_no_chain() {
        let mut stack = Stack::new(0x7000, 0x100);
        let regs = Regs {
            mode: XENPMU_REGS_MODE_16,
            ..Regs::default()
        };
        assert_eq!(run(&mut stack, &regs), (Vec::new(), XENPMU_CHAIN_NONE));
        assert_eq!(stack.reads, 0);
    }
}
