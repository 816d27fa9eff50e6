/* The hostile workload domain (hostile.c, hostile_ring.c): what its two files share. */
#ifndef HOSTILE_H
#define HOSTILE_H
#include "pmu.h"

/* The exit status of a vCPU that saw an outcome the specification rules out. */
#define HOSTILE_VIOLATION 0xbad
/* In an EXPECT list: the operation must succeed (0 ends the list). */
#define XENPMU_OK 1000
#define IA32_DEBUGCTL 0x1d9

/* Outcomes per vCPU (by LAPIC ID), each an expected answer of its class, and the violations
 * (never more than one: the first ends the vCPU's run). */
struct hostile_stats {
    u64 rounds;        /* attack rounds completed */
    u64 work_rounds;   /* CPL3 parts run (the sampled work) */
    u64 op_expected;   /* operations answered as the specification says */
    u64 msr_gp;        /* PMU register accesses that faulted, as they must */
    u64 msr_ok;        /* allowed PMU register accesses taken (self, hv) */
    u64 msr_ambiguous; /* allowed accesses during another vCPU's rt_init: see own_gate */
    u64 debugctl_gp;   /* IA32_DEBUGCTL branch bits refused */
    u64 debugctl_ok;   /* ... and taken (then cleared) */
    u64 rdpmc_gp;      /* RDPMCs that faulted, as they must */
    u64 rings;         /* rings registered (self, hv) */
    u64 ring_refused;  /* bad ring registrations refused with nothing changed */
    u64 tail_attacks;  /* impossible tails survived with nothing written */
    u64 bad_tail;      /* the producer's bad_tail counts over those */
    u64 records;       /* sample records read and checked */
    u64 lost;          /* samples the lost records reported */
    u64 withheld;      /* samples withheld during the masked floods */
    u64 violations;
};
extern struct hostile_stats hostile_stats[MAX_CPUS];

/* The PMU as CPUID describes it, and the mode MODE_GET reported this round. */
struct pmu_shape {
    int intel, global, amd_ext;
    u32 gp, fixed, width, max_gp, mode;
};
extern struct pmu_shape hostile_pmu;
u32 pmu_ctl(u32 i);
u32 pmu_ctr(u32 i);

__attribute__((noreturn)) void violation(u32 cpu, const char *what, u64 got, u64 want);
i64 op(u32 nr, u64 val, u32 vcpu, u32 major, u32 pad);
void expect(u32 cpu, const char *what, i64 got, const i64 *want);
#define EXPECT(cpu, what, got, ...)                                                            \
    do {                                                                                       \
        static const i64 want_[] = {__VA_ARGS__, 0};                                           \
        expect(cpu, what, got, want_);                                                         \
    } while (0)
void must_fault(u32 cpu, const char *what, int write, u32 msr, u64 value);
void by_mode(u32 cpu, const char *what, int write, u32 msr, u64 value);
void own_gate(void);
void user_part(u32 cpu);
/* hostile_ring.c */
u64 hostile_page_frame(u32 cpu);
void attack_ring(u32 cpu);
#endif
