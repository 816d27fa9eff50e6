/* Shared by the conformance case files (pmu.c, timed.c, multi.c, driver.c): MSRs, the guest PMU
 * "driver" (vendor detection, counter MSRs, the measured loop) and the case tables. */
#ifndef PMU_H
#define PMU_H
#include "rt.h"
#include "xenpmu.h"

#define USR (1ul << 16)
#define OS (1ul << 17)
#define INT (1ul << 20)
#define EN (1ul << 22)

#define INTEL_PMC0 0xc1
#define INTEL_EVTSEL0 0x186
#define INTEL_PERF_CAPS 0x345
#define INTEL_FIXED_CTR0 0x309
#define INTEL_FIXED_CTR_CTRL 0x38d
#define INTEL_GLOBAL_STATUS 0x38e
#define INTEL_GLOBAL_CTRL 0x38f
#define INTEL_GLOBAL_OVF_CTRL 0x390
#define INTEL_A_PMC0 0x4c1
#define AMD_K7_CTL0 0xc0010000u
#define AMD_K7_CTR0 0xc0010004u
#define AMD_CTL0 0xc0010200u
#define AMD_GLOBAL_STATUS 0xc0000300u
#define AMD_GLOBAL_CTL 0xc0000301u
#define AMD_GLOBAL_STATUS_CLR 0xc0000302u


extern volatile int intel;
extern volatile u32 gp, fixed, width;
extern volatile int fw_write, amd_ext, amd_v2;

void detect(void);
u32 ctl_msr(u32 i);
u32 ctr_msr(u32 i);
u64 ev_instructions(void);
u64 ev_branches(void);
int has_global(void);
u32 global_ctrl_msr(void);
u32 global_status_msr(void);
u32 ack_msr(void);
u64 mask48(void);
void measured(u32 msr, u64 on, u64 off, u64 n);
/* In a page holding a sample: acknowledge counter 0's overflow and re-arm it with `preset`
 * through the vendor area (or stop it, if `stop`). 0, or non-zero if the page refused an edit. */
int page_rearm_counter0(xenpmu_page *pg, u64 preset, int stop);
u64 count_gp(u32 i, u64 sel, u64 n);

#define N 1000

/* The control-operation parameter block (docs/abi.md). */
struct params {
    u32 major, minor;
    u64 val;
    u32 vcpu, pad;
};

typedef void (*case_fn)(void);
struct case_entry {
    const char *name;
    case_fn fn;
};
typedef void (*cpu_case_fn)(u32 cpu);
struct cpu_case_entry {
    const char *name;
    cpu_case_fn fn;
};
/* timed.c: cases 200.. (timed_user.c: the CPL3 workload case) */
u64 ev_cycles(void);
void timed_user_workload(void);
extern const struct case_entry timed_cases[];
extern const u32 timed_case_count;
/* multi.c: SMP cases 100.. (argument: the vCPU) and domain cases 300.. (the domain) */
extern const struct cpu_case_entry smp_cases[];
extern const u32 smp_case_count;
extern const struct cpu_case_entry domain_cases[];
extern const u32 domain_case_count;
/* all.c: all-mode cases 400.. on three one-vCPU domains sharing one pCPU (timed source) */
extern const struct cpu_case_entry all_cases[];
extern const u32 all_case_count;

#endif
