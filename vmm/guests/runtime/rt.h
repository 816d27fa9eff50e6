/* Tiny freestanding runtime for the vpmu conformance guests (64-bit; CPL0 kernel, CPL3 code
 * through user_call). */
#ifndef RT_H
#define RT_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;
typedef long i64;

#define PORT_CONSOLE 0xE9
#define PORT_EXIT 0x10
#define PORT_HYPERCALL 0x11
#define PORT_CONTROL 0x12
#define PORT_MIGRATE 0x13
#define PORT_SLICES 0x14
#define PORT_PMI_CONTEXT 0x15
#define PMI_VECTOR 0x40
#define VIRQ_VECTOR 0x41

#define LAPIC_BASE 0xFEE00000UL
#define LAPIC_SVR 0xF0
#define LAPIC_EOI 0xB0
#define LAPIC_LVTPC 0x340
#define LVT_MASKED (1u << 16)
#define LVT_NMI (4u << 8)

struct iframe {
    u64 ip, cs, flags, sp, ss;
};

/* User mode (the VMM's GDT and TSSes, src/kvm.rs): user data 0x20 and 64-bit code 0x28 (DPL3),
 * the 104-byte TSS of vCPU i (= its LAPIC ID) at TSS_BASE + i * TSS_STRIDE, RSP0 at offset 4. */
#define USER_CS 0x2b
#define USER_SS 0x23
#define TSS_BASE 0x600UL
#define TSS_STRIDE 0x80UL
#define MAX_CPUS 8

/* State shared with the interrupt handlers. */
extern volatile u64 gp_faults;
extern volatile u64 last_gp_rip;
extern volatile u64 pmi_count;
extern volatile u64 pmi_tsc; /* TSC at the last PMI handler entry */
extern volatile u64 nmi_count;
extern volatile u32 lvtpc_in_handler;
extern volatile u64 virq_count;
/* PMIs per CPU (by LAPIC ID, < 8). */
extern volatile u64 pmi_per_cpu[8];
/* Called by the VIRQ handler (vector VIRQ_VECTOR), if set. */
extern void (*volatile virq_hook)(void);
/* Per CPU (LAPIC ID): 1 while user_call's function runs at CPL3 (cleared by the #UD return). */
extern volatile u64 user_active[MAX_CPUS];

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline u32 inl(u16 port) {
    u32 v;
    __asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline void cpuid(u32 leaf, u32 sub, u32 *a, u32 *b, u32 *c, u32 *d) {
    __asm__ volatile("cpuid" : "=a"(*a), "=b"(*b), "=c"(*c), "=d"(*d) : "a"(leaf), "c"(sub));
}
static inline u64 rdtsc(void) {
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return (u64)hi << 32 | lo;
}
static inline u32 apic_read(u32 reg) { return *(volatile u32 *)(LAPIC_BASE + reg); }
static inline void apic_write(u32 reg, u32 v) { *(volatile u32 *)(LAPIC_BASE + reg) = v; }

/* RDMSR/WRMSR that survive a #GP: the handler skips the 2-byte instruction. Return 1 on #GP. */
int rdmsr_safe(u32 msr, u64 *val);
int wrmsr_safe(u32 msr, u64 val);
u64 rdmsr(u32 msr);
void wrmsr(u32 msr, u64 val);

void putc(char c);
void puts(const char *s);
void put_hex(u64 v);
void put_dec(u64 v);
void rt_init(void);
/* Points IDT vector `vec` at an `__attribute__((interrupt))` handler (interrupt gate, DPL0). */
void set_gate(int vec, void *handler);
u32 cpu_id(void); /* this CPU's LAPIC ID */
/* Runs fn(arg) at CPL3 (IF set) on the user stack that ends at stack_top (16-byte aligned) and
 * returns its result. Interrupts and exceptions at CPL3 run on the caller's stack (TSS.RSP0);
 * fn's return lands on a `ud2` that the #UD handler turns into the return to the caller (`int n`
 * from CPL3 raises #UD on this host's KVM). Returns with IF set. No port I/O from fn. */
u64 user_call(u64 (*fn)(u64), u64 arg, void *stack_top);
void *memset(void *d, int c, unsigned long n);
void *memcpy(void *d, const void *s, unsigned long n);

/* The control-operation hypercall: op in EDI, parameter block address in RSI, result in EAX. */
static inline i64 hypercall(u32 op, void *params) {
    u32 r;
    __asm__ volatile("inl %%dx, %%eax" : "=a"(r) : "d"(PORT_HYPERCALL), "D"(op), "S"(params) : "memory");
    return (i64)(int)r;
}

/* Result reporting: one PASS/FAIL line per check, parsed by the VMM. */
extern int failures, passes;
void report(const char *name, int ok);
void report_val(const char *name, int ok, u64 got, u64 want);

#endif
