/* Runtime: console, IDT with #GP/NMI/PMI handlers, LAPIC enable, MSR helpers, reporting. */
#include "rt.h"

volatile u64 gp_faults;
volatile u64 last_gp_rip;
volatile u64 pmi_count;
volatile u64 pmi_tsc;
volatile u64 nmi_count;
volatile u32 lvtpc_in_handler;
volatile u64 virq_count;
volatile u64 pmi_per_cpu[8];
void (*volatile virq_hook)(void);
volatile u64 user_active[MAX_CPUS];
volatile u64 user_gp_skip;
struct xenpmu_transport xenpmu_transport;
static volatile u64 user_saved_rsp[MAX_CPUS];
/* user.S */
extern char user_return[], user_resume[];
void virq_entry(void); /* user.S: the VIRQ gate, which calls virq_body */
void virq_body(void);
u64 user_enter(u64 (*fn)(u64), u64 arg, u64 user_rsp, volatile u64 *saved_rsp, u64 *tss_rsp0,
               volatile u64 *active);
int failures, passes;

struct gate {
    u16 off0, sel;
    u8 ist, type;
    u16 off1;
    u32 off2, zero;
} __attribute__((packed));

static struct gate idt[256] __attribute__((aligned(16)));

/* One string instruction each: CPL0 code is emulated at ~1.7 M instructions/s on this host's
 * KVM, where a byte loop over a 168-byte register block costs a millisecond. */
void *memset(void *d, int c, unsigned long n) {
    void *p = d;
    __asm__ volatile("rep stosb" : "+D"(p), "+c"(n) : "a"(c) : "memory");
    return d;
}

void *memcpy(void *d, const void *s, unsigned long n) {
    void *p = d;
    __asm__ volatile("rep movsb" : "+D"(p), "+S"(s), "+c"(n) : : "memory");
    return d;
}

void putc(char c) { outb(PORT_CONSOLE, (u8)c); }
void puts(const char *s) {
    while (*s) putc(*s++);
}
void put_hex(u64 v) {
    char b[19];
    int i = 18;
    b[i] = 0;
    do {
        b[--i] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    b[--i] = 'x';
    b[--i] = '0';
    puts(b + i);
}
void put_dec(u64 v) {
    char b[21];
    int i = 20;
    b[i] = 0;
    do {
        b[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    puts(b + i);
}

int rt_x2apic;
u32 cpu_id(void) {
    if (rt_x2apic) {
        u32 lo, hi;
        __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(0x802u));
        return lo & (MAX_CPUS - 1);
    }
    return (apic_read(0x20) >> 24) & (MAX_CPUS - 1);
}

static void send_record(u32 kind, const char *a, const char *b, int with_values, u64 got, u64 want);
static void unexpected_gp(const char *what, u32 msr);

static void fatal(const char *what, struct iframe *f) {
    puts(what);
    puts(" at ");
    put_hex(f->ip);
    puts(" cs ");
    put_hex(f->cs);
    puts("\n");
    send_record(RESULT_FAIL, what, " (fatal)", 0, 0, 0);
    outl(PORT_EXIT, FATAL_STATUS);
}

__attribute__((interrupt)) static void gp_handler(struct iframe *f, u64 err) {
    (void)err;
    if ((f->cs & 3) == 3 && !user_gp_skip) fatal("unexpected #GP at CPL3", f);
    gp_faults++;
    last_gp_rip = f->ip;
    f->ip += (f->cs & 3) == 3 ? user_gp_skip : 2; /* skip the faulting RDMSR/WRMSR (or IN) */
}

__attribute__((interrupt)) static void pmi_handler(struct iframe *f) {
    (void)f;
    pmi_tsc = rdtsc();
    pmi_count++;
    pmi_per_cpu[(apic_read(0x20) >> 24) & 7]++;
    lvtpc_in_handler = apic_read(LAPIC_LVTPC);
    apic_write(LAPIC_EOI, 0);
}

/* #UD: the return from user_call (user.S), or a fatal error. */
__attribute__((interrupt)) static void ud_handler(struct iframe *f) {
    u32 cpu = cpu_id();
    if ((f->cs & 3) != 3 || f->ip != (u64)user_return || !user_active[cpu]) {
        fatal("unexpected #UD", f);
        return;
    }
    user_active[cpu] = 0;
    f->ip = (u64)user_resume;
    f->cs = 0x8;
    f->ss = 0x10;
    f->sp = user_saved_rsp[cpu];
    f->flags = 0x202;
}

u64 user_call(u64 (*fn)(u64), u64 arg, void *stack_top) {
    u32 cpu = cpu_id();
    u64 *rsp0 = (u64 *)(TSS_BASE + TSS_STRIDE * cpu + 4);
    return user_enter(fn, arg, (u64)stack_top & ~15ul, &user_saved_rsp[cpu], rsp0, &user_active[cpu]);
}

/* Called by virq_entry (user.S) with RBP = 0: see there why the VIRQ is not an
 * `__attribute__((interrupt))` handler. */
void virq_body(void) {
    virq_count++;
    if (virq_hook) virq_hook();
    apic_write(LAPIC_EOI, 0);
}

__attribute__((interrupt)) static void nmi_handler(struct iframe *f) {
    (void)f;
    nmi_count++;
    lvtpc_in_handler = apic_read(LAPIC_LVTPC);
}

__attribute__((interrupt)) static void other_handler(struct iframe *f) {
    puts("unexpected exception at ");
    put_hex(f->ip);
    puts("\n");
    send_record(RESULT_FAIL, "unexpected exception", " (fatal)", 0, 0, 0);
    outl(PORT_EXIT, FATAL_STATUS);
}

void set_gate(int vec, void *handler) {
    u64 a = (u64)handler;
    idt[vec].off0 = (u16)a;
    idt[vec].sel = 0x8;
    idt[vec].ist = 0;
    idt[vec].type = 0x8e;
    idt[vec].off1 = (u16)(a >> 16);
    idt[vec].off2 = (u32)(a >> 32);
    idt[vec].zero = 0;
}

void rt_init(void) {
    struct {
        u16 limit;
        u64 base;
    } __attribute__((packed)) idtr = {sizeof(idt) - 1, (u64)idt};
    /* Every vCPU of a domain runs this on the one shared IDT, possibly at the same time as
     * another vCPU that already takes exceptions: write each gate once, with its final
     * handler (never a placeholder first), so a concurrent rewrite stores identical bytes. */
    for (int i = 0; i < 32; i++)
        set_gate(i, i == 2 ? (void *)nmi_handler
                    : i == 6 ? (void *)ud_handler
                    : i == 13 ? (void *)gp_handler
                              : (void *)other_handler);
    set_gate(PMI_VECTOR, pmi_handler);
    /* The PMU VIRQ arrives on the vector the hypervisor names (CPUID transport leaf ECX). */
    xenpmu_transport_ready();
    if ((xenpmu_transport.flags & XENPMU_TRANSPORT_VIRQ_VECTOR) && xenpmu_transport.vector >= 32 &&
        xenpmu_transport.vector != PMI_VECTOR)
        set_gate((int)xenpmu_transport.vector, (void *)virq_entry);
    __asm__ volatile("lidt %0" ::"m"(idtr));
    apic_write(LAPIC_SVR, 0x1ff);
    apic_write(LAPIC_LVTPC, PMI_VECTOR);
    __asm__ volatile("sti");
}

int xenpmu_discover(struct xenpmu_transport *t) {
    u32 a, b, c, d;
    memset(t, 0, sizeof(*t));
    /* CPUID.1:ECX[31]: a hypervisor is present; only then is the range its. */
    cpuid(1, 0, &a, &b, &c, &d);
    if (!(c & (1u << 31))) return -1;
    for (u32 base = XENPMU_CPUID_FIRST; base < XENPMU_CPUID_END; base += XENPMU_CPUID_STRIDE) {
        cpuid(base, 0, &a, &b, &c, &d);
        if (b != XENPMU_CPUID_SIGNATURE || c != XENPMU_CPUID_SIGNATURE || d != XENPMU_CPUID_SIGNATURE ||
            a < base + XENPMU_CPUID_LEAVES || a - base > 0xff)
            continue;
        t->max_leaf = a;
        cpuid(base + XENPMU_CPUID_LEAF_VERSION, 0, &t->version, &t->op_count, &c, &d);
        cpuid(base + XENPMU_CPUID_LEAF_TRANSPORT, 0, &t->flags, &t->port, &t->vector, &d);
        t->port &= 0xffff;
        t->vector &= 0xff;
        t->base = base;
        return 0;
    }
    return -1;
}

static xenpmu_params call_blocks[MAX_CPUS] __attribute__((aligned(32)));

/* The shared discovery, made once per vCPU that finds it not yet made. Several vCPUs may
 * discover at once: each fills a private copy and publishes the fields with `base` last, so a
 * vCPU that sees `base` set sees the rest (discovering into the shared struct directly let one
 * vCPU's clearing of it show another a zero `flags`: a spurious -ENOSYS). Every copy holds
 * the same values, so concurrent publications agree. */
void xenpmu_transport_ready(void) {
    if (__atomic_load_n(&xenpmu_transport.base, __ATOMIC_ACQUIRE) != 0) return;
    struct xenpmu_transport found;
    if (xenpmu_discover(&found) != 0) return;
    xenpmu_transport.max_leaf = found.max_leaf;
    xenpmu_transport.version = found.version;
    xenpmu_transport.op_count = found.op_count;
    xenpmu_transport.flags = found.flags;
    xenpmu_transport.port = found.port;
    xenpmu_transport.vector = found.vector;
    __atomic_store_n(&xenpmu_transport.base, found.base, __ATOMIC_RELEASE);
}

i64 hypercall(u32 op, void *params) {
    xenpmu_transport_ready();
    if (!(xenpmu_transport.flags & XENPMU_TRANSPORT_IO_PORT)) return -XENPMU_ENOSYS;
    u64 flags;
    __asm__ volatile("pushfq; popq %0; cli" : "=r"(flags)::"memory");
    xenpmu_params *block = &call_blocks[cpu_id()];
    memcpy(block, params, sizeof(*block));
    u64 r = xenpmu_call_raw((u16)xenpmu_transport.port, XENPMU_HYPERCALL_NR, op, (u64)block);
    memcpy(params, block, sizeof(*block));
    __asm__ volatile("pushq %0; popfq" ::"r"(flags) : "memory", "cc");
    return (i64)(int)(u32)r;
}

int rdmsr_safe(u32 msr, u64 *val) {
    u32 lo = 0, hi = 0;
    u64 before = gp_faults;
    __asm__ volatile("rdmsr" : "+a"(lo), "+d"(hi) : "c"(msr) : "memory");
    *val = (u64)hi << 32 | lo;
    return gp_faults != before;
}

int wrmsr_safe(u32 msr, u64 val) {
    u64 before = gp_faults;
    __asm__ volatile("wrmsr" ::"a"((u32)val), "d"((u32)(val >> 32)), "c"(msr) : "memory");
    return gp_faults != before;
}

u64 rdmsr(u32 msr) {
    u64 v;
    if (rdmsr_safe(msr, &v)) unexpected_gp("unexpected #GP on rdmsr ", msr);
    return v;
}

void wrmsr(u32 msr, u64 val) {
    if (wrmsr_safe(msr, val)) unexpected_gp("unexpected #GP on wrmsr ", msr);
}

/* The result records: one per CPU (LAPIC ID), filled and sent with interrupts off (a handler
 * that reports cannot interleave with the CPU's own record); the VMM copies it during the
 * outl's exit. */
u32 rt_case;
static struct guest_result records[MAX_CPUS] __attribute__((aligned(64)));
static u32 checks[MAX_CPUS];

/* Appends `s` to the message `m` (length *n), truncating (the NUL always fits). */
static void msg_add(char *m, u32 *n, const char *s) {
    while (*s && *n < RESULT_MESSAGE_SIZE - 1) m[(*n)++] = *s++;
    m[*n] = 0;
}

static void msg_dec(char *m, u32 *n, u64 v) {
    char b[21];
    int i = 20;
    b[i] = 0;
    do {
        b[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    msg_add(m, n, b + i);
}

static void msg_hex(char *m, u32 *n, u64 v) {
    char b[19];
    b[0] = '0';
    b[1] = 'x';
    for (int i = 0; i < 16; i++) b[2 + i] = "0123456789abcdef"[(v >> (60 - 4 * i)) & 15];
    b[18] = 0;
    msg_add(m, n, b);
}

/* Sends a record of `kind` with message parts a, b (b may be 0) and, for a check, the got/want
 * values (with_values). */
static void send_record(u32 kind, const char *a, const char *b, int with_values, u64 got, u64 want) {
    u64 flags;
    __asm__ volatile("pushfq; popq %0; cli" : "=r"(flags)::"memory");
    u32 cpu = cpu_id();
    struct guest_result *r = &records[cpu];
    u32 n = 0;
    r->magic = RESULT_MAGIC;
    r->kind = kind;
    r->case_id = rt_case;
    if (kind == RESULT_PASS || kind == RESULT_FAIL || kind == RESULT_SKIP)
        r->check = ++checks[cpu];
    else
        r->check = kind == RESULT_DONE ? checks[cpu] : 0;
    memset(r->message, 0, RESULT_MESSAGE_SIZE);
    msg_add(r->message, &n, a);
    if (b) msg_add(r->message, &n, b);
    if (with_values) {
        msg_add(r->message, &n, " (got ");
        msg_dec(r->message, &n, got);
        msg_add(r->message, &n, ", want ");
        msg_dec(r->message, &n, want);
        msg_add(r->message, &n, ")");
    }
    outl(PORT_RESULT, (u32)(u64)r);
    if (flags & 0x200) __asm__ volatile("sti" ::: "memory");
}

void begin_records(const char *case_name) { send_record(RESULT_BEGIN, case_name, 0, 0, 0, 0); }

void end_records(void) { send_record(RESULT_DONE, "done", 0, 0, 0, 0); }

void report(const char *name, int ok) {
    puts(ok ? "PASS " : "FAIL ");
    puts(name);
    puts("\n");
    send_record(ok ? RESULT_PASS : RESULT_FAIL, name, 0, 0, 0, 0);
    if (ok)
        passes++;
    else
        failures++;
}

void report_val(const char *name, int ok, u64 got, u64 want) {
    puts(ok ? "PASS " : "FAIL ");
    puts(name);
    puts(" (got ");
    put_dec(got);
    puts(", want ");
    put_dec(want);
    puts(")\n");
    send_record(ok ? RESULT_PASS : RESULT_FAIL, name, 0, 1, got, want);
    if (ok)
        passes++;
    else
        failures++;
}

/* A check that does not apply to this PMU shape: neither passed nor failed. */
void report_skip(const char *name) {
    puts("SKIP ");
    puts(name);
    puts("\n");
    send_record(RESULT_SKIP, name, 0, 0, 0, 0);
}

/* An MSR access that must not fault did: a failed check named after the MSR. */
static void unexpected_gp(const char *what, u32 msr) {
    char m[RESULT_MESSAGE_SIZE];
    u32 n = 0;
    m[0] = 0;
    msg_add(m, &n, what);
    msg_hex(m, &n, msr);
    report(m, 0);
}
