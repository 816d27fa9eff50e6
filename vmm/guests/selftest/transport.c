/*
 * The case `transport` (docs/abi.md "Transport"): what a guest driver sees of the reference
 * transport. Discovery through the CPUID leaves (signature, highest leaf, the ABI version of
 * xenpmu.h, the operation count, the port and the PMU VIRQ's vector, reserved registers zero,
 * KVM's own leaves left where Linux looks for them); an operation through the raw register
 * convention, with every register but RAX preserved; and each malformed call getting the
 * specified answer with nothing done: RAX not XENPMU_HYPERCALL_NR (-ENOSYS), an op above 32
 * bits or unknown (-EOPNOTSUPP, before the block is looked at), a block outside RAM or across
 * a page (-EFAULT), an 8- or 16-bit IN (no call, all ones), CPL3 with the port closed (#GP,
 * the CPU's own I/O protection) and CPL3 with the port opened in the TSS's I/O bitmap
 * (-EPERM).
 */
#include "rt.h"

/* What the VMM documents (vmm/machine/src/transport.rs): its leaves at the second base. */
#define VMM_CPUID_BASE 0x40000100u

static xenpmu_params blk __attribute__((aligned(32)));
static u8 two_pages[8192] __attribute__((aligned(4096)));
static u8 user_stack[4096] __attribute__((aligned(16)));
static u16 user_port;

/* A block whose every field is a recognizable value (a call that was refused leaves it so). */
static void fill(xenpmu_params *p, u64 val) {
    p->version.major = XENPMU_VERSION_MAJOR;
    p->version.minor = XENPMU_VERSION_MINOR;
    p->val = val;
    p->vcpu = 0;
    p->_pad0 = 0;
}

static int untouched(const xenpmu_params *p, u64 val) {
    return p->version.major == XENPMU_VERSION_MAJOR && p->version.minor == XENPMU_VERSION_MINOR &&
           p->val == val && p->vcpu == 0 && p->_pad0 == 0;
}

/* -errno as the 32-bit IN leaves it in RAX: EAX, zero-extended. */
static u64 eax_of(int err) { return (u64)(u32)(-err); }

/* MODE_GET with patterns in every general register the asm can name; returns how many of
 * them (RBX, RCX, RDX, RDI, RSI, R8-R15: 13) came back unchanged, and RAX in *rax. */
static int call_preserving(u16 port, xenpmu_params *p, u64 *rax_out) {
    u64 rax = XENPMU_HYPERCALL_NR, rbx = 0xb0b0b0b0b0b0b0b0ul, rcx = 0xc0c0c0c0c0c0c0c0ul;
    u64 rdx = 0xd0d0d0d0d0d00000ul | port, rdi = XENPMU_OP_MODE_GET, rsi = (u64)p;
    register u64 r8 __asm__("r8") = 0x0808080808080808ul;
    register u64 r9 __asm__("r9") = 0x0909090909090909ul;
    register u64 r10 __asm__("r10") = 0x1010101010101010ul;
    register u64 r11 __asm__("r11") = 0x1111111111111111ul;
    register u64 r12 __asm__("r12") = 0x1212121212121212ul;
    register u64 r13 __asm__("r13") = 0x1313131313131313ul;
    register u64 r14 __asm__("r14") = 0x1414141414141414ul;
    register u64 r15 __asm__("r15") = 0x1515151515151515ul;
    __asm__ volatile("inl %%dx, %%eax"
                     : "+a"(rax), "+b"(rbx), "+c"(rcx), "+d"(rdx), "+D"(rdi), "+S"(rsi), "+r"(r8), "+r"(r9),
                       "+r"(r10), "+r"(r11), "+r"(r12), "+r"(r13), "+r"(r14), "+r"(r15)
                     :
                     : "memory");
    *rax_out = rax;
    return (rbx == 0xb0b0b0b0b0b0b0b0ul) + (rcx == 0xc0c0c0c0c0c0c0c0ul) + (rdx == (0xd0d0d0d0d0d00000ul | port)) +
           (rdi == XENPMU_OP_MODE_GET) + (rsi == (u64)p) + (r8 == 0x0808080808080808ul) +
           (r9 == 0x0909090909090909ul) + (r10 == 0x1010101010101010ul) + (r11 == 0x1111111111111111ul) +
           (r12 == 0x1212121212121212ul) + (r13 == 0x1313131313131313ul) + (r14 == 0x1414141414141414ul) +
           (r15 == 0x1515151515151515ul);
}

/* At CPL3: MODE_GET through the port, as a user program that tried would. */
static u64 user_mode_get(u64 block) {
    return xenpmu_call_raw(user_port, XENPMU_HYPERCALL_NR, XENPMU_OP_MODE_GET, block);
}

static void discovery(struct xenpmu_transport *t) {
    u32 a, b, c, d;
    cpuid(1, 0, &a, &b, &c, &d);
    report_val("CPUID.1:ECX[31]: a hypervisor is present", (c >> 31) & 1, (c >> 31) & 1, 1);
    cpuid(0x40000000, 0, &a, &b, &c, &d);
    report_val("KVM's signature stays at 0x40000000 (Linux guests find KVM as before)",
               b == 0x4b4d564b && c == 0x564b4d56 && d == 0x4d, b, 0x4b4d564b);
    int found = xenpmu_discover(t);
    report_val("the scan finds the signature XPMUXPMUXPMU", found == 0, (u64)(i64)found, 0);
    report_val("at the VMM's base, 0x40000100", t->base == VMM_CPUID_BASE, t->base, VMM_CPUID_BASE);
    report_val("base EAX: the highest leaf = base + XENPMU_CPUID_LEAVES", t->max_leaf == t->base + XENPMU_CPUID_LEAVES,
               t->max_leaf, t->base + XENPMU_CPUID_LEAVES);
    u32 version = (u32)XENPMU_VERSION_MAJOR << 16 | XENPMU_VERSION_MINOR;
    report_val("version leaf EAX = major << 16 | minor of xenpmu.h", t->version == version, t->version, version);
    report_val("version leaf EBX = XENPMU_OP_COUNT", t->op_count == XENPMU_OP_COUNT, t->op_count, XENPMU_OP_COUNT);
    u32 flags = XENPMU_TRANSPORT_IO_PORT | XENPMU_TRANSPORT_VIRQ_VECTOR;
    report_val("transport leaf EAX: the I/O port call and the VIRQ vector", t->flags == flags, t->flags, flags);
    report_val("transport leaf EBX: the port", t->port == PORT_HYPERCALL, t->port, PORT_HYPERCALL);
    report_val("transport leaf ECX: the PMU VIRQ's vector", t->vector == VIRQ_VECTOR, t->vector, VIRQ_VECTOR);
    u32 reserved = 0;
    cpuid(t->base + XENPMU_CPUID_LEAF_VERSION, 0, &a, &b, &c, &d);
    reserved |= c | d;
    cpuid(t->base + XENPMU_CPUID_LEAF_TRANSPORT, 0, &a, &b, &c, &d);
    reserved |= d | (b >> 16) | (c >> 8);
    report_val("reserved registers and bits of the leaves are zero", reserved == 0, reserved, 0);
}

static void bad_calls(u16 port) {
    u64 nr = XENPMU_HYPERCALL_NR, get = XENPMU_OP_MODE_GET;
    fill(&blk, 0x77);
    u64 r = xenpmu_call_raw(port, nr + 1, get, (u64)&blk);
    report_val("RAX 41: -ENOSYS", r == eax_of(XENPMU_ENOSYS), r, eax_of(XENPMU_ENOSYS));
    r = xenpmu_call_raw(port, nr | 1ul << 32, get, (u64)&blk);
    report_val("RAX 40 + 2^32 (all 64 bits count): -ENOSYS", r == eax_of(XENPMU_ENOSYS), r, eax_of(XENPMU_ENOSYS));
    r = xenpmu_call_raw(port, nr, 1ul << 32 | get, (u64)&blk);
    report_val("RDI above 32 bits (not cut to MODE_GET): -EOPNOTSUPP", r == eax_of(XENPMU_EOPNOTSUPP), r,
               eax_of(XENPMU_EOPNOTSUPP));
    report("... and the block is untouched", untouched(&blk, 0x77));
    r = xenpmu_call_raw(port, nr, XENPMU_OP_COUNT, 0xfffffffffffff000ul);
    report_val("an unknown op with an unreadable block: -EOPNOTSUPP (the op is checked first)",
               r == eax_of(XENPMU_EOPNOTSUPP), r, eax_of(XENPMU_EOPNOTSUPP));
    r = xenpmu_call_raw(port, nr, get, 0x40000000ul);
    report_val("a block outside RAM (1 GiB): -EFAULT", r == eax_of(XENPMU_EFAULT), r, eax_of(XENPMU_EFAULT));
    xenpmu_params *across = (xenpmu_params *)(two_pages + 4096 - 8);
    fill(across, 0x99);
    r = xenpmu_call_raw(port, nr, get, (u64)across);
    report_val("a block across a page boundary: -EFAULT", r == eax_of(XENPMU_EFAULT), r, eax_of(XENPMU_EFAULT));
    report("... and it is untouched", untouched(across, 0x99));

    /* An 8- or 16-bit IN is no call: it reads all ones and does nothing. */
    u64 rax = nr;
    __asm__ volatile("inb %%dx, %%al" : "+a"(rax) : "d"(port), "D"(get), "S"(&blk) : "memory");
    report_val("inb from the port: no call, reads 0xff", (rax & 0xff) == 0xff, rax & 0xff, 0xff);
    rax = nr;
    __asm__ volatile("inw %%dx, %%ax" : "+a"(rax) : "d"(port), "D"(get), "S"(&blk) : "memory");
    report_val("inw from the port: no call, reads 0xffff", (rax & 0xffff) == 0xffff, rax & 0xffff, 0xffff);
    report("... and the block is untouched", untouched(&blk, 0x77));

    /* CPL3. With IOPL 0 and the port's bit set in the TSS's bitmap, the CPU refuses the IN
     * itself: #GP, the VMM never sees it. The handler resumes fn after the 1-byte `in %dx, %eax`; RAX is left as set. */
    user_port = port;
    u64 gp_before = gp_faults;
    user_gp_skip = 1;
    r = user_call(user_mode_get, (u64)&blk, user_stack + sizeof(user_stack));
    user_gp_skip = 0;
    report_val("CPL3, port closed: #GP in the guest", gp_faults == gp_before + 1, gp_faults - gp_before, 1);
    report_val("... RAX unchanged", r == nr, r, nr);
    /* With the port opened in the TSS's I/O bitmap the IN reaches the VMM, which refuses any
     * CPL but 0 (IOPL 3 would do the same where the host honours it; this host's CPL3 does
     * not take IOPL from an IRET). */
    /* A 4-byte IN touches ports port..port+3: all four bits must be clear. */
    volatile u16 *iopb = (volatile u16 *)(TSS_BASE + TSS_STRIDE * cpu_id() + TSS_IOPB + port / 8);
    u16 closed = *iopb, open = (u16)(closed & ~(0xfu << (port % 8)));
    *iopb = open;
    r = user_call(user_mode_get, (u64)&blk, user_stack + sizeof(user_stack));
    *iopb = closed;
    report_val("CPL3 with the port opened to it: -EPERM", r == eax_of(XENPMU_EPERM), r, eax_of(XENPMU_EPERM));
    report_val("... no #GP", gp_faults == gp_before + 1, gp_faults - gp_before, 1);
    report("... and the block is untouched", untouched(&blk, 0x77));
}

void case_transport(void) {
    struct xenpmu_transport t;
    discovery(&t);
    if (!(t.flags & XENPMU_TRANSPORT_IO_PORT)) return;
    u16 port = (u16)t.port;

    fill(&blk, 0x5555);
    u64 rax;
    int kept = call_preserving(port, &blk, &rax);
    report_val("MODE_GET through the transport: EAX 0, upper RAX 0", rax == 0, rax, 0);
    report_val("... every register but RAX preserved", kept == 13, (u64)kept, 13);
    report_val("... OUT val = self mode", blk.val == XENPMU_MODE_SELF, blk.val, XENPMU_MODE_SELF);
    report("... OUT version = xenpmu.h's", blk.version.major == XENPMU_VERSION_MAJOR &&
                                                  blk.version.minor == XENPMU_VERSION_MINOR);
    fill(&blk, 0);
    i64 via_runtime = hypercall(XENPMU_OP_FEATURE_GET, &blk);
    report_val("FEATURE_GET through the runtime's call", via_runtime == 0, (u64)via_runtime, 0);
    bad_calls(port);
}
