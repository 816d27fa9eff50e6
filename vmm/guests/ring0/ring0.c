/* The ring-0 guest: an inner hypervisor built from the vpmu crates (hv/, a Rust staticlib)
 * runs at CPL0 on each vCPU, which is one of its two inner pCPUs. This file is its firmware:
 * the runtime's IDT, then the LAPIC in x2APIC mode (IPIs through the ICR MSR), the PMI and
 * IPI vectors routed to the inner hypervisor's handlers, and the entry into it. Checks are
 * reported by the inner hypervisor through the runtime's result records; the exit status is
 * this vCPU's failed checks. */
#include "rt.h"

u32 ring0_main(u32 cpu);
void ring0_pmi(void);
void ring0_ipi(void);

/* Not every libcall the Rust code may emit is in the runtime. */
void *memmove(void *d, const void *s, unsigned long n) {
    unsigned char *dp = d;
    const unsigned char *sp = s;
    if (dp <= sp || dp >= sp + n) return memcpy(d, s, n);
    while (n--) dp[n] = sp[n];
    return d;
}

int memcmp(const void *a, const void *b, unsigned long n) {
    const unsigned char *x = a, *y = b;
    for (unsigned long i = 0; i < n; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

int bcmp(const void *a, const void *b, unsigned long n) { return memcmp(a, b, n); }

static inline u64 rdmsr_raw(u32 msr) {
    u32 lo, hi;
    __asm__ volatile("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
    return (u64)hi << 32 | lo;
}

static inline void wrmsr_raw(u32 msr, u64 v) {
    __asm__ volatile("wrmsr" ::"a"((u32)v), "d"((u32)(v >> 32)), "c"(msr) : "memory");
}

__attribute__((interrupt)) static void pmi_entry(struct iframe *f) {
    (void)f;
    ring0_pmi();
}

__attribute__((interrupt)) static void ipi_entry(struct iframe *f) {
    (void)f;
    ring0_ipi();
}

static volatile u32 arrived;

int main(u64 arg, u64 cpu) {
    u32 a, b, c, d;
    rt_case = (u32)arg;
    if (arg != RING0_CASE) return NO_CASE_STATUS;
    rt_init();
    __asm__ volatile("cli");
    cpuid(1, 0, &a, &b, &c, &d);
    if (!(c & (1u << 21))) {
        begin_records("ring0_inner_hypervisor");
        report("x2APIC in CPUID", 0);
        end_records();
        return 1;
    }
    /* x2APIC mode (IA32_APIC_BASE EN | EXTD); from here on the runtime reads the APIC ID by
     * MSR (rt_x2apic), and the LVTPC and EOI are MSRs too. */
    wrmsr_raw(0x1b, rdmsr_raw(0x1b) | (1ul << 10) | (1ul << 11));
    rt_x2apic = 1;
    wrmsr_raw(0x834, PMI_VECTOR); /* LVTPC: fixed, vector 0x40 */
    /* Every CPU's rt_init wrote the runtime's PMI gate: replace it once all have. */
    __atomic_fetch_add(&arrived, 1, __ATOMIC_SEQ_CST);
    while (arrived < 2) __asm__ volatile("pause");
    set_gate(PMI_VECTOR, pmi_entry);
    set_gate(RING0_IPI_VECTOR, ipi_entry);
    begin_records("ring0_inner_hypervisor");
    u32 failed = ring0_main((u32)cpu);
    end_records();
    return (int)failed;
}
