/*
 * Shared by the 64-bit harness (compat64.c, -m64) and the 32-bit consumer (compat32.c, -m32,
 * run in compatibility mode): the fixed-address block they exchange data through, and the
 * register patterns. i386 aligns uint64_t struct members to 4, so every uint64_t here sits at
 * an 8-aligned offset with explicit padding, and both compilations assert the layout.
 */
#ifndef COMPAT_H
#define COMPAT_H

#include <stddef.h>
#include <stdint.h>

/* Where the 32-bit image is linked and entered (link32.ld), and its stack top. */
#define COMPAT32_BASE 0x200000u
#define COMPAT32_STACK 0x3f0000u
/* The shared block (guest RAM above the 32-bit stack, below 4 MiB). */
#define COMPAT_SHARED_ADDR 0x3f8000u
/* The code segment selector of the 32-bit (compatibility-mode) code descriptor (VMM GDT). */
#define COMPAT32_CS 0x18

struct compat_shared {
    uint32_t page;       /* address of the registered xenpmu page */
    uint32_t failures;   /* failures of the 64-bit part (the 32-bit part adds its own) */
    uint64_t virqs;      /* VIRQs the 64-bit handler saw */
    uint64_t window_lo;  /* RIP range of the pattern window (the sample's RIP is inside) */
    uint64_t window_hi;
    uint32_t intel;      /* vendor */
    uint32_t _pad0;
};
_Static_assert(offsetof(struct compat_shared, virqs) == 8, "compat_shared.virqs");
_Static_assert(offsetof(struct compat_shared, window_lo) == 16, "compat_shared.window_lo");
_Static_assert(offsetof(struct compat_shared, window_hi) == 24, "compat_shared.window_hi");
_Static_assert(offsetof(struct compat_shared, intel) == 32, "compat_shared.intel");
_Static_assert(sizeof(struct compat_shared) == 40, "sizeof(compat_shared)");

#define COMPAT_SHARED ((volatile struct compat_shared *)(uintptr_t)COMPAT_SHARED_ADDR)

/*
 * The value GPR `i` (0 = RAX, 1 = RBX, 2 = RCX, 3 = RDX, 4 = RSI, 5 = RDI, 6 = RBP, 7 = RSP,
 * 8..15 = R8..R15, the xenpmu_regs order) holds when the sample is taken: distinct per
 * register, the top bit set in both halves, so that truncation, sign extension or swapped
 * halves all show.
 */
#define COMPAT_PATTERN(i)                                                                  \
    (((uint64_t)(0xA5000000u | ((uint32_t)(i) << 16) | 0x5A5Au) << 32) |                   \
     (uint64_t)(0xC3000000u | ((uint32_t)(i) << 16) | 0x3C3Cu))

#endif
