/*
 * Two pCPUs, three vCPUs, two domains: the vPMU from a C hypervisor's side, the scenario of
 * the Rust worked example (examples/examples/two_pcpus.rs) with the same checks, on each of
 * the four test shapes, the vendor learnt from the machine's CPUID:
 *
 * 1. guest 1.0 counts its instructions on counter 0 (WRMSR intercepts), reads them with RDPMC
 *    and RDMSR; a reserved bit and an absent counter fault (#GP);
 * 2. guest 1.1 does the same on the other pCPU, with the same counter index;
 * 3. pCPU 0 switches to dom0's vCPU and back: each guest counts only its own instructions;
 * 4. guest 1.0 migrates from pCPU 0 to pCPU 1 and counts on there;
 * 5. guest 1.1 registers its shared page and samples: the PMI arrives at the exact
 *    instruction that overflowed the counter, the sample in its page names it, the PMU VIRQ
 *    is raised, and after the guest's flush the counters run again;
 * 5b. (beyond the Rust example) guest 1.0, now on pCPU 1, samples through the ABI 1.4 ring
 *    (the ring callbacks): three PMIs, each re-armed by the hypervisor, give three records at
 *    the exact instructions, while counter 0 goes on counting;
 * 6. domain 1 is destroyed from pCPU 0 while guest 1.0 runs on pCPU 1: the teardown is a
 *    cross-CPU request, completed on pCPU 1 before its next job;
 * 7. teardown: both pCPUs detach, and no counter is left counting.
 *
 * Besides, the C API's own error model: typed refusals of misuse, never a crash.
 * Exits 0 when every check passed; prints one line per shape.
 */
#include <string.h>

#include "toy.h"

#define KERNEL_TEXT 0xffffffff81000000ull
#define SAMPLED_FUNCTION 0xffffffff81234000ull
#define PERIOD 250ull

/* The guest's perf driver: only the register numbers differ between the vendors. */
static struct {
    bool intel, global_ctrl;
} DRIVER;

static uint32_t control_msr(uint32_t i) { return DRIVER.intel ? 0x186 + i : 0xc0010000u + i; }
static uint32_t counter_msr(uint32_t i) { return DRIVER.intel ? 0xc1 + i : 0xc0010004u + i; }
static uint32_t global_ctrl_msr(void) { return DRIVER.intel ? 0x38f : 0xc0000301u; }
/* EN | OS | USR | instructions retired (0xC0), and INT when interrupting. */
static uint64_t count_instructions(bool interrupt)
{
    return (1ull << 22) | (1ull << 17) | (1ull << 16) | 0xc0 | (interrupt ? 1ull << 20 : 0);
}

static uint64_t rdpmc(struct pcpu *cpu, uint32_t selector)
{
    uint64_t value = 0;
    CHECK(guest_rdpmc(cpu, selector, &value) == VPMU_MSR_HANDLED);
    return value;
}

/* The guest programs counter `i` from `start` to count instructions and enables it. */
static void program(struct pcpu *cpu, uint32_t i, uint64_t start, bool interrupt)
{
    CHECK(guest_wrmsr(cpu, counter_msr(i), start) == VPMU_MSR_HANDLED);
    CHECK(guest_wrmsr(cpu, control_msr(i), count_instructions(interrupt)) == VPMU_MSR_HANDLED);
    if (DRIVER.global_ctrl) {
        uint64_t enabled;
        CHECK(guest_rdmsr(cpu, global_ctrl_msr(), &enabled) == VPMU_MSR_HANDLED);
        CHECK(guest_wrmsr(cpu, global_ctrl_msr(), enabled | 1ull << i) == VPMU_MSR_HANDLED);
    }
}

static void step_1(struct pcpu *cpu, void *arg)
{
    (void)arg;
    switch_to(cpu, GUEST_0);
    program(cpu, 0, 0, false);
    CHECK(retire(cpu, KERNEL_TEXT, 1000, NULL, 0) == 0);
    CHECK(rdpmc(cpu, 0) == 1000);
    uint64_t value = 0;
    CHECK(guest_rdmsr(cpu, counter_msr(0), &value) == VPMU_MSR_HANDLED && value == 1000);
    /* Guest mistakes are answered with #GP: a reserved control bit, an absent counter. */
    CHECK(guest_wrmsr(cpu, control_msr(0), count_instructions(false) | 1ull << 63) == VPMU_MSR_GP);
    CHECK(guest_rdpmc(cpu, 31, &value) == VPMU_MSR_GP);
    /* An MSR that is not the PMU's is left to the hypervisor. */
    CHECK(guest_rdmsr(cpu, 0x10 /* TSC */, &value) == VPMU_MSR_NOT_PMU);

    /* Integration mistakes are typed errors, never a crash. */
    vpmu_error err;
    uint32_t result;
    CHECK(vpmu_rdmsr(cpu->handle, NULL, counter_msr(0), &value, &result, &err) == -VPMU_EINVAL);
    CHECK(err.errno == -VPMU_EINVAL && err.reason == VPMU_REASON_NULL_ARGUMENT);
    vpmu_request bogus = {.kind = 77};
    CHECK(vpmu_complete_request(cpu->handle, &bogus, &err) == -VPMU_EINVAL);
    CHECK(err.reason == VPMU_REASON_BAD_ARGUMENT);
    /* A refused hypercall returns its own -errno: INIT of a frame outside the domain. */
    CHECK(hypercall(cpu, XENPMU_OP_INIT, 0x99999, 0, &err) == -VPMU_EINVAL);
    CHECK(err.reason == VPMU_REASON_OP_REFUSED);
}

static void step_2(struct pcpu *cpu, void *arg)
{
    (void)arg;
    switch_to(cpu, GUEST_1);
    program(cpu, 0, 0, false);
    retire(cpu, KERNEL_TEXT, 500, NULL, 0);
    CHECK(rdpmc(cpu, 0) == 500);
}

static void step_3(struct pcpu *cpu, void *arg)
{
    (void)arg;
    switch_to(cpu, DOM0);
    program(cpu, 0, 0, false);
    retire(cpu, KERNEL_TEXT, 300, NULL, 0);
    CHECK(rdpmc(cpu, 0) == 300);
    switch_to(cpu, GUEST_0);
    retire(cpu, KERNEL_TEXT, 200, NULL, 0);
    CHECK(rdpmc(cpu, 0) == 1200);
}

static void run_dom0(struct pcpu *cpu, void *arg)
{
    (void)arg;
    switch_to(cpu, DOM0);
}

static void step_4(struct pcpu *cpu, void *arg)
{
    (void)arg;
    switch_to(cpu, GUEST_0);
    retire(cpu, KERNEL_TEXT, 100, NULL, 0);
    CHECK(rdpmc(cpu, 0) == 1300);
}

struct sampled {
    struct taken_pmi pmis[4];
    unsigned count;
};

static void step_5_sample(struct pcpu *cpu, void *arg)
{
    struct sampled *out = arg;
    vpmu_error err;
    switch_to(cpu, GUEST_1);
    CHECK(hypercall(cpu, XENPMU_OP_INIT, GUEST_FRAME(1, 1), 1, &err) == 0);
    /* The guest clears the LVTPC mask bit in its page (its own memory), then tells the
     * hypervisor. */
    pthread_mutex_lock(&HOST.lock);
    HOST.memory[1][1].lapic_lvtpc &= ~(uint32_t)XENPMU_LVTPC_MASKED;
    pthread_mutex_unlock(&HOST.lock);
    CHECK(hypercall(cpu, XENPMU_OP_LVTPC_SET, 0, 0, &err) == 0);
    program(cpu, 1, (1ull << 48) - PERIOD, true);
    out->count = retire(cpu, SAMPLED_FUNCTION, 2 * PERIOD, out->pmis, 4);
}

static void step_5_flush(struct pcpu *cpu, void *arg)
{
    (void)arg;
    vpmu_error err;
    /* Between the sample and the flush the counters are stopped. */
    CHECK(rdpmc(cpu, 0) == 500 + PERIOD);
    CHECK(rdpmc(cpu, 1) == 0);
    CHECK(hypercall(cpu, XENPMU_OP_FLUSH, 0, 0, &err) == 0);
    /* The flush put the context back on the hardware: both count again. */
    retire(cpu, KERNEL_TEXT, 50, NULL, 0);
    CHECK(rdpmc(cpu, 0) == 550 + PERIOD);
    CHECK(rdpmc(cpu, 1) == 50);
}

/* Guest 1.0's ring: its page at frame 0, the control page at frame 2, one data page at 3. */
#define RING_CONTROL 2

static void step_5b_ring(struct pcpu *cpu, void *arg)
{
    struct sampled *out = arg;
    vpmu_error err;
    CHECK(cpu->current == GUEST_0);
    CHECK(hypercall(cpu, XENPMU_OP_INIT, GUEST_FRAME(1, 0), 0, &err) == 0);
    pthread_mutex_lock(&HOST.lock);
    HOST.memory[1][0].lapic_lvtpc &= ~(uint32_t)XENPMU_LVTPC_MASKED;
    xenpmu_ring_control *ctl = (xenpmu_ring_control *)&HOST.memory[1][RING_CONTROL];
    memset(ctl, 0, 2 * sizeof(xenpmu_page));
    ctl->config.data_pages = 1;
    ctl->config.period_gp[1] = PERIOD; /* the hypervisor re-arms counter 1 */
    pthread_mutex_unlock(&HOST.lock);
    CHECK(hypercall(cpu, XENPMU_OP_LVTPC_SET, 0, 0, &err) == 0);
    CHECK(hypercall(cpu, XENPMU_OP_RING_INIT, GUEST_FRAME(1, RING_CONTROL), 0, &err) == 0);
    program(cpu, 1, (1ull << 48) - PERIOD, true);
    out->count = retire(cpu, SAMPLED_FUNCTION, 3 * PERIOD, out->pmis, 4);
    /* Never stopped for a ring sample: counter 0 has every instruction since step 4. */
    CHECK(rdpmc(cpu, 0) == 1300 + 3 * PERIOD);
}

/* The owner consumes its ring: the records of `count` samples at the overflowing instructions. */
static void consume_ring(unsigned count)
{
    pthread_mutex_lock(&HOST.lock);
    xenpmu_ring_control *ctl = (xenpmu_ring_control *)&HOST.memory[1][RING_CONTROL];
    const void *data = xenpmu_ring_data(ctl);
    CHECK(data != NULL);
    uint64_t tail = ctl->consumer.tail, head = xenpmu_ring_head_acquire(ctl);
    unsigned samples = 0;
    const xenpmu_record_header *rec;
    while (xenpmu_ring_next(data, ctl->info.data_size, ctl->info.record_max, tail, head, &rec) == 0) {
        xenpmu_ring_sample sample;
        CHECK(xenpmu_ring_sample_get(rec, &sample, NULL, 0) >= 0);
        samples++;
        /* The first sample since the page's init is number 1; no gap: nothing lost. */
        CHECK(sample.sequence == samples);
        CHECK(sample.identity.domain_id == XENPMU_DOMID_SELF && sample.identity.vcpu_id == 0);
        CHECK(sample.regs.rip == SAMPLED_FUNCTION + 4 * (samples * PERIOD - 1));
        CHECK(sample.overflowed == 1u << 1);
        tail += rec->size;
    }
    CHECK(tail == head && samples == count);
    xenpmu_ring_tail_release(ctl, tail);
    pthread_mutex_unlock(&HOST.lock);
}

static void step_6_destroy(struct pcpu *cpu, void *arg)
{
    uint32_t *first_try = arg;
    switch_to(cpu, DOM0);
    CHECK(teardown(cpu, GUEST_1) == VPMU_DONE);
    *first_try = teardown(cpu, GUEST_0);
}

static void step_6_target(struct pcpu *cpu, void *arg)
{
    (void)arg;
    /* This job runs after the request was completed on this pCPU. */
    CHECK(cpu->requests_completed == 1);
    CHECK(!vpmu_testing_pmu_anything_can_count(cpu->pmu));
}

static void step_6_retry(struct pcpu *cpu, void *arg)
{
    (void)arg;
    CHECK(teardown(cpu, GUEST_0) == VPMU_DONE);
    CHECK(cpu->requests_sent == 1);
}

static void idle(struct pcpu *cpu, void *arg)
{
    (void)arg;
    switch_to(cpu, IDLE);
}

static void idle_and_teardown_dom0(struct pcpu *cpu, void *arg)
{
    (void)arg;
    switch_to(cpu, IDLE);
    CHECK(teardown(cpu, DOM0) == VPMU_DONE);
}

static vpmu_vcpu_report report(int vcpu)
{
    vpmu_vcpu_report out;
    vpmu_error err;
    CHECK(vpmu_vcpu_info(HOST.vcpus[vcpu], &out, &err) == 0);
    return out;
}

/* Misuse from the scheduler's thread, refused with a reason and without touching hardware. */
static void check_refusals(void)
{
    vpmu_error err;
    vpmu_pcpu *again = NULL;
    CHECK(vpmu_pcpu_attach(HOST.vpmu, 0, &MSR_BUS, &HOST.cpus[0], &again, &err) == -VPMU_EBUSY);
    CHECK(err.reason == VPMU_REASON_PCPU_ALREADY_ATTACHED && again == NULL);
    CHECK(vpmu_pcpu_attach(HOST.vpmu, PCPUS, &MSR_BUS, NULL, &again, &err) == -VPMU_ENODEV);
    CHECK(err.reason == VPMU_REASON_NO_SUCH_PCPU && err.pcpu == PCPUS);
    const vpmu_vcpu *twin = NULL;
    CHECK(vpmu_vcpu_create(HOST.vpmu, 1, 0, &twin, &err) == -VPMU_EEXIST);
    CHECK(err.reason == VPMU_REASON_VCPU_EXISTS && err.domain == 1 && twin == NULL);
    CHECK(vpmu_vcpu_create(HOST.vpmu, XENPMU_DOMID_SELF, 0, &twin, &err) == -VPMU_EINVAL);
    CHECK(err.reason == VPMU_REASON_RESERVED_DOMAIN);
    CHECK(vpmu_vcpu_destroy(HOST.vpmu, HOST.vcpus[GUEST_0], &err) == -VPMU_EBUSY);
    CHECK(err.reason == VPMU_REASON_VCPU_IN_USE);
    CHECK(vpmu_destroy(HOST.vpmu, &err) == -VPMU_EBUSY);
    CHECK(err.reason == VPMU_REASON_STILL_IN_USE);
    CHECK(strcmp(vpmu_reason_name(VPMU_REASON_STILL_IN_USE), "still in use") == 0);
    CHECK(strcmp(vpmu_reason_name(1000), "unknown reason") == 0);
}

static void run_on_shape(uint32_t shape)
{
    const char *name = vpmu_testing_shape_name(shape);
    host_boot(shape);

    /* The backend is the one the machine's CPUID names. */
    vpmu_pmu_caps caps;
    vpmu_error err;
    CHECK(vpmu_capabilities(HOST.vpmu, &caps, &err) == 0);
    bool intel = strncmp(name, "intel", 5) == 0;
    CHECK(caps.vendor == (intel ? VPMU_VENDOR_INTEL : VPMU_VENDOR_AMD));
    DRIVER.intel = intel;
    DRIVER.global_ctrl = caps.global_ctrl;
    vpmu_msr_range ranges[16];
    size_t count = 0;
    CHECK(vpmu_msr_ranges(HOST.vpmu, ranges, 16, &count, &err) == 0 && count > 0 && count <= 16);

    run_on(0, step_1, NULL);
    check_refusals();
    run_on(1, step_2, NULL);
    run_on(0, step_3, NULL);

    /* 4. Migration: switched out where it ran (saved there), then in where it goes. */
    run_on(0, run_dom0, NULL);
    CHECK(report(GUEST_0).state == VPMU_VCPU_STATE_SAVED);
    run_on(1, step_4, NULL);
    vpmu_vcpu_report migrated = report(GUEST_0);
    CHECK(migrated.state == VPMU_VCPU_STATE_LOADED && migrated.pcpu == 1);

    /* 5. The PMI interrupted exactly the instruction that overflowed the counter, and the
     *    sample went to guest 1.1's page. */
    struct sampled sampled;
    memset(&sampled, 0, sizeof sampled);
    run_on(0, step_5_sample, &sampled);
    uint64_t overflowed_at = SAMPLED_FUNCTION + 4 * (PERIOD - 1);
    CHECK(sampled.count == 1);
    CHECK(sampled.pmis[0].rip == overflowed_at);
    CHECK(sampled.pmis[0].outcome.kind == VPMU_PMI_KIND_DELIVERED);
    CHECK(sampled.pmis[0].outcome.domain == 1 && sampled.pmis[0].outcome.vcpu == 1);
    CHECK(sampled.pmis[0].outcome.overflowed == 1u << 1);
    pthread_mutex_lock(&HOST.lock);
    CHECK(HOST.virq_count == 1 && HOST.virqs[0] == GUEST_1);
    const xenpmu_page *page = &HOST.memory[1][1];
    CHECK(xenpmu_page_check(page) == 0);
    CHECK(xenpmu_flags_acquire(page) & XENPMU_FLAG_CACHED);
    CHECK(page->identity.domain_id == XENPMU_DOMID_SELF && page->identity.vcpu_id == 1);
    CHECK(page->regs.rip == overflowed_at);
    pthread_mutex_unlock(&HOST.lock);
    run_on(0, step_5_flush, NULL);
    vpmu_vcpu_report sampler = report(GUEST_1);
    CHECK(sampler.pmis_generated == 1 && sampler.pmis_delivered == 1);

    /* 5b. Guest 1.0 samples through its ring on pCPU 1. */
    memset(&sampled, 0, sizeof sampled);
    run_on(1, step_5b_ring, &sampled);
    CHECK(sampled.count == 3);
    for (unsigned k = 0; k < 3; k++) {
        CHECK(sampled.pmis[k].rip == SAMPLED_FUNCTION + 4 * ((k + 1) * PERIOD - 1));
        CHECK(sampled.pmis[k].outcome.kind == VPMU_PMI_KIND_DELIVERED);
        CHECK(sampled.pmis[k].outcome.domain == 1 && sampled.pmis[k].outcome.vcpu == 0);
    }
    consume_ring(3);

    /* 6. Domain 1 destroyed from pCPU 0 while guest 1.0 runs on pCPU 1. */
    uint32_t first_try = VPMU_DONE;
    run_on(0, step_6_destroy, &first_try);
    CHECK(first_try == VPMU_PENDING);
    run_on(1, step_6_target, NULL);
    run_on(0, step_6_retry, NULL);
    CHECK(report(GUEST_0).state == VPMU_VCPU_STATE_ALLOCATED);
    CHECK(report(GUEST_1).state == VPMU_VCPU_STATE_ALLOCATED);
    run_on(1, idle, NULL);
    run_on(0, idle_and_teardown_dom0, NULL);

    /* 7. Both pCPUs detach; nothing is left counting, mapped, or reported. */
    host_power_off();
    for (int p = 0; p < PCPUS; p++)
        CHECK(!vpmu_testing_pmu_anything_can_count(HOST.cpus[p].pmu));
    for (int s = 0; s < MAX_SLOTS; s++)
        CHECK(!HOST.slots[s].used);
    CHECK(HOST.diagnostics == 0);
    host_free();
    printf("%s: %s backend from CPUID; counts 1000, 500, 300, 1200, 1300 after migration; "
           "sample at %#llx, flushed; 3 ring records; teardown request completed on pCPU 1\n",
           name, intel ? "Intel" : "AMD", (unsigned long long)overflowed_at);
}

int main(void)
{
    uint32_t shapes = vpmu_testing_shape_count();
    CHECK(shapes == 4 && vpmu_testing_shape_name(shapes) == NULL);
    for (uint32_t shape = 0; shape < shapes; shape++)
        run_on_shape(shape);
    return 0;
}
