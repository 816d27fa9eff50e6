/*
 * The compat32 case, 64-bit part (the harness of compat32.c): in self mode it registers the
 * shared page and arms GP counter 0 (instructions, INT) to overflow inside the pattern window
 * (compat_window.S), where every GPR holds a distinctive 64-bit value; once the VIRQ has
 * arrived it enters the -m32 consumer in compatibility mode by a far return to the 32-bit
 * code segment. The consumer reads and checks the sample, flushes, and writes the exit status.
 */
#include "compat.h"
#include "pmu.h"

/* Counted instructions up to the overflow: the enabling WRMSR, 16 MOVs, 3 NOPs. */
#define OVERFLOW_AT 20

void pattern_window(u32 msr, u32 lo, u32 hi);
extern const char window_lo[], window_hi[];

static u8 page[4096] __attribute__((aligned(4096)));
static volatile u64 virqs;

static void on_virq(void) { virqs++; }

int main(u64 which, u64 cpu) {
    (void)cpu;
    rt_case = (u32)which;
    if (which != 0) {
        puts("NOCASE\n");
        return NO_CASE_STATUS;
    }
    rt_init();
    puts("CASE compat32_reads_64bit_sample\n");
    begin_records("compat32_reads_64bit_sample");
    detect();
    volatile struct compat_shared *sh = COMPAT_SHARED;
    sh->page = (u32)(u64)page;
    sh->intel = (u32)intel;
    sh->window_lo = (u64)window_lo;
    sh->window_hi = (u64)window_hi;
    struct params p = {1, 0, (u64)page >> 12, 0, 0};
    report("INIT (64-bit part)", hypercall(4, &p) == 0);
    *(volatile u32 *)(page + 40) = PMI_VECTOR; /* lapic_lvtpc: unmasked */
    struct params q = {1, 0, 0, 0, 0};
    report("LVTPC_SET (64-bit part)", hypercall(6, &q) == 0);
    virq_hook = on_virq;
    /* Legacy writes to PMC0 sign-extend bit 31 on Intel. */
    u64 preset = (0 - (u64)OVERFLOW_AT) & (intel ? 0xfffffffful : mask48());
    u64 sel = ev_instructions() | OS | EN | INT;
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctr_msr(0), preset);
        wrmsr(ctl_msr(0), sel);
        pattern_window(global_ctrl_msr(), 1, 0);
    } else {
        wrmsr(ctr_msr(0), preset);
        pattern_window(ctl_msr(0), (u32)sel, (u32)(sel >> 32));
    }
    for (int i = 0; i < 1000 && !virqs; i++)
        __asm__ volatile("pause");
    sh->virqs = virqs;
    report_val("one VIRQ (64-bit part)", virqs == 1, virqs, 1);
    /* The counter stays as the sample left it: the consumer disables it in the page and
     * flushes. Enter the consumer: compatibility mode, its own stack, EDI = our failures, ESI =
     * our checks (it numbers its result records on from there). */
    sh->failures = (u32)failures;
    __asm__ volatile("mov %0, %%rsp\n\t"
                     "pushq %1\n\t"
                     "pushq %2\n\t"
                     "lretq"
                     :
                     : "r"((u64)COMPAT32_STACK), "r"((u64)COMPAT32_CS), "r"((u64)COMPAT32_BASE),
                       "D"((u64)(u32)failures), "S"((u64)(u32)(passes + failures))
                     : "memory");
    __builtin_unreachable();
}
