/*
 * The 32-bit consumer (gcc -m32, run in compatibility mode under the 64-bit harness of
 * compat64.c): reads the sample the hypervisor wrote for a 64-bit context through the ABI
 * header's structs and helpers (abi/include/xenpmu.h), checks every 64-bit GPR value,
 * acknowledges the overflow in the page and flushes. Reports each check as a result record
 * (struct guest_result, numbered on from the 64-bit part's) and a PASS/FAIL line on the
 * console; main32's result (the failures of both parts) is the exit status.
 */
#include "compat.h"
#include "guest_protocol.h"
#include "xenpmu.h"

_Static_assert(sizeof(void *) == 4, "compat32.c is the -m32 consumer");

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(uint16_t port, uint32_t v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }

void *memcpy(void *d, const void *s, size_t n) {
    uint8_t *p = d;
    const uint8_t *q = s;
    while (n--) *p++ = *q++;
    return d;
}

void *memset(void *d, int c, size_t n) {
    uint8_t *p = d;
    while (n--) *p++ = (uint8_t)c;
    return d;
}

static void puts32(const char *s) {
    while (*s) outb(PORT_CONSOLE, (uint8_t)*s++);
}

static void put_hex64(uint64_t v) {
    char b[19];
    b[0] = '0';
    b[1] = 'x';
    for (int i = 0; i < 16; i++) b[2 + i] = "0123456789abcdef"[(v >> (60 - 4 * i)) & 15];
    b[18] = 0;
    puts32(b);
}

static uint32_t failures, checks;
static struct guest_result record;

/* One result record (case 0 of the compat image); interrupts are off in this part. */
static void send_record(uint32_t kind, const char *name) {
    uint32_t n = 0;
    record.magic = RESULT_MAGIC;
    record.kind = kind;
    record.case_id = 0;
    record.check = kind == RESULT_DONE ? checks : ++checks;
    memset(record.message, 0, sizeof(record.message));
    while (name[n] && n < RESULT_MESSAGE_SIZE - 1) {
        record.message[n] = name[n];
        n++;
    }
    outl(PORT_RESULT, (uint32_t)(uintptr_t)&record);
}

static void report(const char *name, int ok) {
    puts32(ok ? "PASS " : "FAIL ");
    puts32(name);
    puts32("\n");
    send_record(ok ? RESULT_PASS : RESULT_FAIL, name);
    if (!ok) failures++;
}

static void report_hex(const char *name, int ok, uint64_t got, uint64_t want) {
    puts32(ok ? "PASS " : "FAIL ");
    puts32(name);
    puts32(" (got ");
    put_hex64(got);
    puts32(", want ");
    put_hex64(want);
    puts32(")\n");
    send_record(ok ? RESULT_PASS : RESULT_FAIL, name);
    if (!ok) failures++;
}

/* The xenpmu transport as a 32-bit driver finds it (docs/abi.md "Transport"): the CPUID
 * range scanned for the signature; returns the I/O port, or 0 without one. */
static uint32_t discover_port32(void) {
    uint32_t a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1u), "c"(0u));
    if (!(c & (1u << 31))) return 0;
    for (uint32_t base = XENPMU_CPUID_FIRST; base < XENPMU_CPUID_END; base += XENPMU_CPUID_STRIDE) {
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(base), "c"(0u));
        if (b != XENPMU_CPUID_SIGNATURE || c != XENPMU_CPUID_SIGNATURE || d != XENPMU_CPUID_SIGNATURE ||
            a < base + XENPMU_CPUID_LEAVES)
            continue;
        __asm__ volatile("cpuid"
                         : "=a"(a), "=b"(b), "=c"(c), "=d"(d)
                         : "a"(base + XENPMU_CPUID_LEAF_TRANSPORT), "c"(0u));
        return (a & XENPMU_TRANSPORT_IO_PORT) ? (b & 0xffff) : 0;
    }
    return 0;
}

/* The parameter block: aligned, so it never crosses a page (the transport's rule). */
static xenpmu_params block32 __attribute__((aligned(32)));

/* The control-operation call from compatibility mode: EAX = XENPMU_HYPERCALL_NR, op in EDI,
 * the parameter block's (guest-physical = linear here) address in ESI, the result in EAX. */
static int32_t hypercall32(uint32_t op, xenpmu_params *params) {
    uint32_t port = discover_port32();
    if (!port) return -XENPMU_ENOSYS;
    uint32_t r = XENPMU_HYPERCALL_NR;
    memcpy(&block32, params, sizeof(block32));
    __asm__ volatile("inl %%dx, %%eax" : "+a"(r) : "d"((uint16_t)port), "D"(op), "S"(&block32) : "memory");
    memcpy(params, &block32, sizeof(block32));
    return (int32_t)r;
}

static const char *const names[16] = {
    "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
    "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15",
};

uint32_t main32(uint32_t failures64, uint32_t checks64) {
    checks = checks64;
    volatile struct compat_shared *sh = COMPAT_SHARED;
    xenpmu_page *page = (xenpmu_page *)(uintptr_t)sh->page;
    uint16_t cs;
    __asm__ volatile("mov %%cs, %0" : "=r"(cs));
    report("running as -m32 code in compatibility mode (CS = the 32-bit selector)", cs == COMPAT32_CS);
    report("xenpmu_page_check() == 0", xenpmu_page_check(page) == 0);
    report("sample is cached (XENPMU_FLAG_CACHED)", (page->pmu_flags & XENPMU_FLAG_CACHED) != 0);
    report("sample identity is DOMID_SELF", page->identity.domain_id == XENPMU_DOMID_SELF);
    const xenpmu_regs *r = &page->regs;
    report_hex("regs.mode is 64-bit kernel", (r->mode & XENPMU_REGS_MODE_CODE_SIZE) == XENPMU_REGS_MODE_64 &&
                                                 !(r->mode & XENPMU_REGS_MODE_USER) && r->cpl == 0,
               r->mode, XENPMU_REGS_MODE_64);
    const uint64_t got[16] = {r->rax, r->rbx, r->rcx, r->rdx, r->rsi, r->rdi, r->rbp, r->rsp,
                              r->r8,  r->r9,  r->r10, r->r11, r->r12, r->r13, r->r14, r->r15};
    uint32_t intact = 0;
    for (int i = 0; i < 16; i++) {
        int ok = got[i] == COMPAT_PATTERN(i);
        intact += ok;
        if (!ok) report_hex(names[i], 0, got[i], COMPAT_PATTERN(i));
    }
    report_hex("all 16 GPRs hold their 64-bit pattern (both halves)", intact == 16, intact, 16);
    report_hex("sample RIP inside the pattern window", r->rip >= sh->window_lo && r->rip < sh->window_hi, r->rip,
               sh->window_lo);
    report("sample CS is the 64-bit code selector", r->cs == 0x8);
    /* Acknowledge the overflow of counter 0 and stop it, in the page; the flush loads that. */
    int ack;
    if (sh->intel) {
        xenpmu_intel_ctxt c;
        xenpmu_counter_pair pair;
        ack = xenpmu_intel_ctxt_get(page, &c);
        c.global_ovf_ctrl |= 1;
        if (ack == 0) ack = xenpmu_intel_ctxt_set(page, &c);
        if (ack == 0) ack = xenpmu_intel_pair_get(page, 0, &pair);
        pair.control = 0;
        if (ack == 0) ack = xenpmu_intel_pair_set(page, 0, &pair);
    } else {
        xenpmu_amd_ctxt c;
        ack = xenpmu_amd_ctxt_get(page, &c);
        c.global_status &= ~(uint64_t)1;
        if (ack == 0) ack = xenpmu_amd_ctxt_set(page, &c);
        if (ack == 0) ack = xenpmu_amd_ctrl_set(page, 0, 0);
    }
    report("overflow acknowledged and counter 0 stopped through the header's helpers", ack == 0);
    xenpmu_params p;
    memset(&p, 0, sizeof(p));
    p.version.major = XENPMU_VERSION_MAJOR;
    p.version.minor = XENPMU_VERSION_MINOR;
    int32_t fr = hypercall32(XENPMU_OP_FLUSH, &p);
    report_hex("FLUSH from compatibility mode", fr == 0, (uint64_t)(int64_t)fr, 0);
    report("CACHED clear after flush", (page->pmu_flags & XENPMU_FLAG_CACHED) == 0);
    puts32("END\n");
    send_record(RESULT_DONE, "done");
    return failures64 + failures;
}
