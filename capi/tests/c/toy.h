/*
 * A toy hypervisor in C over the vPMU's C API (vpmu.h): the C twin of the Rust worked example
 * (examples/). host.c is the hypervisor: guest memory, virtual LAPICs, the platform callback
 * table, pCPUs as pthreads with job queues and request inboxes. toy_hypervisor.c is the
 * scenario and its checks.
 */
#ifndef TOY_H
#define TOY_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "vpmu.h"

/* A failed check ends the process with the check's text: the Rust test reports it. */
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);     \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

enum { PCPUS = 2, VCPUS = 3, DOMAINS = 2, FRAMES_PER_DOMAIN = 4, MAX_SLOTS = 8, QUEUE = 64 };

/* Guest frame `index` of `domain`. */
#define GUEST_FRAME(domain, index) (0x1000ull * ((domain) + 1) + (index))

struct vcpu_id {
    uint32_t domain, vcpu;
};

/* vCPU i of the machine: dom0's one vCPU, then domain 1's two. */
extern const struct vcpu_id VCPU_IDS[VCPUS];
enum { DOM0 = 0, GUEST_0 = 1, GUEST_1 = 2, IDLE = -1 };

struct pcpu;
typedef void (*job_fn)(struct pcpu *cpu, void *arg);

/* A physical CPU: a thread owning its vpmu_pcpu and its (software) PMU. */
struct pcpu {
    uint32_t index;
    pthread_t thread;
    vpmu_pcpu *handle;
    vpmu_testing_pmu *pmu;
    /* What a PMI interrupts: the guest instruction executing, if a guest runs. */
    int in_guest;
    xenpmu_regs guest_regs;
    int current; /* vCPU index or IDLE */
    bool lvtpc_masked;
    unsigned requests_sent, requests_completed;
    /* Jobs and the inbox, under `lock`. */
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    job_fn job;
    void *job_arg;
    bool job_done, power_off;
    vpmu_request inbox[QUEUE];
    unsigned inbox_head, inbox_len;
};

struct lapic {
    bool lvtpc_masked;
    unsigned pmis;
};

/* The state every pCPU shares. */
struct host {
    const vpmu *vpmu;
    const vpmu_vcpu *vcpus[VCPUS];
    struct pcpu cpus[PCPUS];
    pthread_mutex_t lock; /* memory, mappings, LAPICs, VIRQs, resume registers, diagnostics */
    xenpmu_page memory[DOMAINS][FRAMES_PER_DOMAIN];
    /* Mapped shared pages and ring areas: `frames` contiguous frames from `index`. */
    struct {
        bool used;
        uint32_t domain, index, frames;
    } slots[MAX_SLOTS];
    struct lapic lapics[VCPUS];
    int virqs[QUEUE];
    unsigned virq_count;
    xenpmu_regs resume_regs[VCPUS];
    unsigned diagnostics;
};

extern struct host HOST;
extern const vpmu_platform_ops PLATFORM;
extern const vpmu_msr_ops MSR_BUS;

/* Boots the host on test shape `shape` (the vendor from its CPUID) and starts the pCPUs. */
void host_boot(uint32_t shape);
/* Runs `fn(cpu, arg)` on pCPU `index`'s thread, after it completed its inbox; waits. */
void run_on(uint32_t index, job_fn fn, void *arg);
/* Powers the pCPUs off (each switches to idle and detaches) and joins them. */
void host_power_off(void);
/* Destroys the vCPUs and the vPMU and frees the PMUs. */
void host_free(void);

/* On a pCPU's thread: the scheduler and the VM exits. */
void switch_to(struct pcpu *cpu, int vcpu);
uint32_t guest_wrmsr(struct pcpu *cpu, uint32_t msr, uint64_t value);
uint32_t guest_rdmsr(struct pcpu *cpu, uint32_t msr, uint64_t *value);
uint32_t guest_rdpmc(struct pcpu *cpu, uint32_t selector, uint64_t *value);
int hypercall(struct pcpu *cpu, uint32_t op, uint64_t val, uint32_t vcpu, vpmu_error *err);
uint32_t teardown(struct pcpu *cpu, int vcpu);

struct taken_pmi {
    uint64_t rip;
    vpmu_pmi_outcome outcome;
};
/* The running guest retires `count` kernel instructions 4 bytes apart from `rip`; a PMI is
 * handled at the instruction that raised it. Returns the PMIs taken (at most `max` kept). */
unsigned retire(struct pcpu *cpu, uint64_t rip, uint64_t count, struct taken_pmi *pmis,
                unsigned max);

#endif
