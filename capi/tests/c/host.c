/*
 * The toy hypervisor's host side: the platform callbacks the vPMU calls, the MSR bus of each
 * pCPU (its software PMU), and the pCPUs as pthreads that run jobs and complete the requests
 * other pCPUs send them before every job (a hypervisor does so before every guest entry).
 */
#include <string.h>

#include "toy.h"

const struct vcpu_id VCPU_IDS[VCPUS] = {{0, 0}, {1, 0}, {1, 1}};
struct host HOST;
static uint32_t SHAPE;

static int vcpu_index(uint32_t domain, uint32_t vcpu)
{
    for (int i = 0; i < VCPUS; i++)
        if (VCPU_IDS[i].domain == domain && VCPU_IDS[i].vcpu == vcpu)
            return i;
    fprintf(stderr, "no vCPU %u.%u\n", domain, vcpu);
    exit(1);
}

static struct pcpu *self(void *ctx)
{
    struct pcpu *cpu = ctx;
    /* The core's rule: a pCPU's callbacks run on that pCPU (its thread) only. */
    CHECK(pthread_equal(pthread_self(), cpu->thread));
    return cpu;
}

/* ---- The MSR bus: the pCPU's software PMU. ---- */

static int32_t bus_rdmsr(void *ctx, uint32_t msr, uint64_t *value)
{
    return vpmu_testing_pmu_rdmsr(self(ctx)->pmu, msr, value);
}

static int32_t bus_wrmsr(void *ctx, uint32_t msr, uint64_t value)
{
    return vpmu_testing_pmu_wrmsr(self(ctx)->pmu, msr, value);
}

const vpmu_msr_ops MSR_BUS = {bus_rdmsr, bus_wrmsr};

/* ---- CPUID: the machine's, from which the vPMU picks its vendor. ---- */

static void cpuid(void *ctx, uint32_t leaf, uint32_t subleaf, uint32_t *out)
{
    CHECK(vpmu_testing_cpuid(*(const uint32_t *)ctx, leaf, subleaf, out) == 0);
}

static int32_t perf_capabilities(void *ctx, uint64_t *value)
{
    return vpmu_testing_perf_capabilities(*(const uint32_t *)ctx, value);
}

/* ---- The platform. ---- */

/* Maps `frames` frames of `domain` from `gfn` into a free slot: 0, -EINVAL or -ENOMEM. */
static int32_t map_frames(uint32_t domain, uint64_t gfn, uint32_t frames, uint64_t *slot)
{
    if (domain >= DOMAINS || frames == 0 || gfn < GUEST_FRAME(domain, 0) ||
        gfn + frames > GUEST_FRAME(domain, FRAMES_PER_DOMAIN))
        return -VPMU_EINVAL;
    int32_t status = -VPMU_ENOMEM;
    pthread_mutex_lock(&HOST.lock);
    for (uint64_t s = 0; s < MAX_SLOTS; s++) {
        if (!HOST.slots[s].used) {
            HOST.slots[s].used = true;
            HOST.slots[s].domain = domain;
            HOST.slots[s].index = (uint32_t)(gfn - GUEST_FRAME(domain, 0));
            HOST.slots[s].frames = frames;
            *slot = s;
            status = 0;
            break;
        }
    }
    pthread_mutex_unlock(&HOST.lock);
    return status;
}

static int32_t map_page(void *ctx, uint32_t domain, uint64_t gfn, uint64_t *slot)
{
    (void)self(ctx);
    return map_frames(domain, gfn, 1, slot);
}

static void unmap_page(void *ctx, uint64_t slot)
{
    (void)self(ctx);
    pthread_mutex_lock(&HOST.lock);
    CHECK(slot < MAX_SLOTS && HOST.slots[slot].used);
    HOST.slots[slot].used = false;
    pthread_mutex_unlock(&HOST.lock);
}

/* The first frame behind a mapped slot, and its size in bytes; HOST.lock held. */
static uint8_t *frame_of(uint64_t slot, uint32_t *bytes)
{
    if (slot >= MAX_SLOTS || !HOST.slots[slot].used)
        return NULL;
    *bytes = HOST.slots[slot].frames * (uint32_t)sizeof(xenpmu_page);
    return (uint8_t *)&HOST.memory[HOST.slots[slot].domain][HOST.slots[slot].index];
}

/* The vPMU works on a private copy of the page, and writes back only what it changed. */
static int32_t read_page(void *ctx, uint64_t slot, uint8_t *page)
{
    (void)self(ctx);
    uint32_t size = 0;
    pthread_mutex_lock(&HOST.lock);
    uint8_t *frame = frame_of(slot, &size);
    if (frame)
        memcpy(page, frame, sizeof(xenpmu_page));
    pthread_mutex_unlock(&HOST.lock);
    return frame ? 0 : -1;
}

static void write_page(void *ctx, uint64_t slot, uint32_t offset, const uint8_t *bytes,
                       uint32_t len)
{
    (void)self(ctx);
    CHECK((uint64_t)offset + len <= sizeof(xenpmu_page));
    uint32_t size = 0;
    pthread_mutex_lock(&HOST.lock);
    uint8_t *frame = frame_of(slot, &size);
    CHECK(frame != NULL);
    memcpy(frame + offset, bytes, len);
    pthread_mutex_unlock(&HOST.lock);
}

static uint32_t deliver_lvtpc_pmi(void *ctx, uint32_t domain, uint32_t vcpu, bool mask)
{
    (void)self(ctx);
    pthread_mutex_lock(&HOST.lock);
    struct lapic *lapic = &HOST.lapics[vcpu_index(domain, vcpu)];
    uint32_t answer = VPMU_LVTPC_MASKED;
    if (!lapic->lvtpc_masked) {
        lapic->pmis++;
        lapic->lvtpc_masked = mask;
        answer = VPMU_LVTPC_DELIVERED;
    }
    pthread_mutex_unlock(&HOST.lock);
    return answer;
}

static void raise_pmu_virq(void *ctx, uint32_t domain, uint32_t vcpu)
{
    (void)self(ctx);
    pthread_mutex_lock(&HOST.lock);
    CHECK(HOST.virq_count < QUEUE);
    HOST.virqs[HOST.virq_count++] = vcpu_index(domain, vcpu);
    pthread_mutex_unlock(&HOST.lock);
}

/* Queued for the target, which is woken (the IPI of a ring-0 hypervisor). */
static void send_request(void *ctx, uint32_t target, const vpmu_request *request)
{
    struct pcpu *cpu = self(ctx);
    CHECK(target < PCPUS && target != cpu->index);
    struct pcpu *to = &HOST.cpus[target];
    pthread_mutex_lock(&to->lock);
    CHECK(to->inbox_len < QUEUE);
    to->inbox[(to->inbox_head + to->inbox_len++) % QUEUE] = *request;
    pthread_cond_broadcast(&to->work);
    pthread_mutex_unlock(&to->lock);
    cpu->requests_sent++;
}

static void set_physical_lvtpc_masked(void *ctx, uint32_t pcpu, bool masked)
{
    struct pcpu *cpu = self(ctx);
    CHECK(pcpu == cpu->index);
    cpu->lvtpc_masked = masked;
}

static void interrupted(void *ctx, uint32_t pcpu, vpmu_interrupted *out)
{
    struct pcpu *cpu = self(ctx);
    CHECK(pcpu == cpu->index);
    if (cpu->in_guest != IDLE) {
        out->kind = VPMU_INTERRUPTED_GUEST;
        out->domain = VCPU_IDS[cpu->in_guest].domain;
        out->vcpu = VCPU_IDS[cpu->in_guest].vcpu;
        out->regs = cpu->guest_regs;
    } else {
        out->kind = VPMU_INTERRUPTED_HYPERVISOR;
        out->regs.mode = XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_HYPERVISOR;
    }
}

static bool resume_regs(void *ctx, uint32_t domain, uint32_t vcpu, xenpmu_regs *regs)
{
    (void)self(ctx);
    pthread_mutex_lock(&HOST.lock);
    *regs = HOST.resume_regs[vcpu_index(domain, vcpu)];
    pthread_mutex_unlock(&HOST.lock);
    return true;
}

static void diagnostic(void *ctx, const vpmu_diagnostic *d)
{
    (void)self(ctx);
    fprintf(stderr, "diagnostic %u on vCPU %u.%u (%s)\n", d->kind, d->domain, d->vcpu,
            (const char *)d->register_name);
    pthread_mutex_lock(&HOST.lock);
    HOST.diagnostics++;
    pthread_mutex_unlock(&HOST.lock);
}

/* ---- The sample ring (ABI 1.4): guest RAM reads, ring areas, their reads and writes. ---- */

static bool read_guest(void *ctx, uint32_t domain, uint64_t address, uint8_t *out, uint32_t len)
{
    (void)self(ctx);
    uint64_t base = GUEST_FRAME(domain, 0) * sizeof(xenpmu_page);
    uint64_t end = base + FRAMES_PER_DOMAIN * sizeof(xenpmu_page);
    if (domain >= DOMAINS || address < base || address > end || len > end - address)
        return false;
    pthread_mutex_lock(&HOST.lock);
    memcpy(out, (const uint8_t *)HOST.memory[domain] + (address - base), len);
    pthread_mutex_unlock(&HOST.lock);
    return true;
}

static int32_t map_ring(void *ctx, uint32_t domain, uint64_t gfn, uint32_t frames, uint64_t *slot)
{
    (void)self(ctx);
    return map_frames(domain, gfn, frames, slot);
}

/* The bytes [offset, offset + len) of the ring area behind `slot`, or NULL; HOST.lock held. */
static uint8_t *ring_bytes(uint64_t slot, uint32_t offset, uint32_t len)
{
    uint32_t size = 0;
    uint8_t *area = frame_of(slot, &size);
    if (!area || offset > size || len > size - offset)
        return NULL;
    return area + offset;
}

/* Under HOST.lock, which the consumer also takes: each write is visible before the next. */
static bool ring_read(void *ctx, uint64_t slot, uint32_t offset, uint8_t *out, uint32_t len)
{
    (void)self(ctx);
    pthread_mutex_lock(&HOST.lock);
    uint8_t *bytes = ring_bytes(slot, offset, len);
    if (bytes)
        memcpy(out, bytes, len);
    pthread_mutex_unlock(&HOST.lock);
    return bytes != NULL;
}

static bool ring_write(void *ctx, uint64_t slot, uint32_t offset, const uint8_t *data,
                       uint32_t len)
{
    (void)self(ctx);
    pthread_mutex_lock(&HOST.lock);
    uint8_t *bytes = ring_bytes(slot, offset, len);
    if (bytes)
        memcpy(bytes, data, len);
    pthread_mutex_unlock(&HOST.lock);
    return bytes != NULL;
}

const vpmu_platform_ops PLATFORM = {
    .map_page = map_page,
    .unmap_page = unmap_page,
    .read_page = read_page,
    .write_page = write_page,
    .deliver_lvtpc_pmi = deliver_lvtpc_pmi,
    .raise_pmu_virq = raise_pmu_virq,
    .send_request = send_request,
    .set_physical_lvtpc_masked = set_physical_lvtpc_masked,
    .interrupted = interrupted,
    .diagnostic = diagnostic,
    .resume_regs = resume_regs,
    .read_guest = read_guest,
    .map_ring = map_ring,
    .unmap_ring = unmap_page,
    .ring_read = ring_read,
    .ring_write = ring_write,
};

/* ---- pCPUs. ---- */

/* Completes, in order, the requests other pCPUs sent this one. The inbox lock is not held
 * across the vPMU's call: completing one may send others. */
static void complete_requests(struct pcpu *cpu)
{
    for (;;) {
        pthread_mutex_lock(&cpu->lock);
        if (cpu->inbox_len == 0) {
            pthread_mutex_unlock(&cpu->lock);
            return;
        }
        vpmu_request request = cpu->inbox[cpu->inbox_head];
        cpu->inbox_head = (cpu->inbox_head + 1) % QUEUE;
        cpu->inbox_len--;
        pthread_mutex_unlock(&cpu->lock);
        vpmu_error err;
        CHECK(vpmu_complete_request(cpu->handle, &request, &err) == 0);
        cpu->requests_completed++;
    }
}

static void *pcpu_main(void *arg)
{
    struct pcpu *cpu = arg;
    vpmu_error err;
    /* host_boot holds the lock until `cpu->thread` is set. */
    pthread_mutex_lock(&cpu->lock);
    pthread_mutex_unlock(&cpu->lock);
    /* Attached on its own CPU, before it first enters a guest. */
    CHECK(vpmu_pcpu_attach(HOST.vpmu, cpu->index, &MSR_BUS, cpu, &cpu->handle, &err) == 0);
    for (;;) {
        pthread_mutex_lock(&cpu->lock);
        while (!cpu->job && cpu->inbox_len == 0 && !cpu->power_off)
            pthread_cond_wait(&cpu->work, &cpu->lock);
        pthread_mutex_unlock(&cpu->lock);
        complete_requests(cpu);
        pthread_mutex_lock(&cpu->lock);
        job_fn job = cpu->job;
        void *job_arg = cpu->job_arg;
        bool off = cpu->power_off && !job;
        pthread_mutex_unlock(&cpu->lock);
        if (job) {
            job(cpu, job_arg);
            pthread_mutex_lock(&cpu->lock);
            cpu->job = NULL;
            cpu->job_done = true;
            pthread_cond_broadcast(&cpu->done);
            pthread_mutex_unlock(&cpu->lock);
        }
        if (off)
            break;
    }
    complete_requests(cpu);
    switch_to(cpu, IDLE);
    CHECK(vpmu_pcpu_detach(cpu->handle, &err) == 0);
    cpu->handle = NULL;
    return NULL;
}

void host_boot(uint32_t shape)
{
    memset(&HOST, 0, sizeof HOST);
    SHAPE = shape;
    pthread_mutex_init(&HOST.lock, NULL);
    vpmu_config config = {.pcpus = PCPUS, .mode = XENPMU_MODE_SELF, .privileged_domain = 0};
    vpmu_cpuid_ops cpuid_ops = {cpuid, perf_capabilities};
    vpmu_error err;
    int rc = vpmu_create(&config, &cpuid_ops, &SHAPE, &PLATFORM, &HOST.vpmu, &err);
    if (rc != 0) {
        fprintf(stderr, "vpmu_create: %d (%s)\n", rc, vpmu_reason_name(err.reason));
        exit(1);
    }
    for (int i = 0; i < VCPUS; i++) {
        CHECK(vpmu_vcpu_create(HOST.vpmu, VCPU_IDS[i].domain, VCPU_IDS[i].vcpu, &HOST.vcpus[i],
                               &err) == 0);
        HOST.lapics[i].lvtpc_masked = true; /* a local APIC resets with its LVTPC masked */
    }
    for (uint32_t p = 0; p < PCPUS; p++) {
        struct pcpu *cpu = &HOST.cpus[p];
        cpu->index = p;
        cpu->in_guest = cpu->current = IDLE;
        CHECK(vpmu_testing_pmu_new(shape, &cpu->pmu) == 0);
        pthread_mutex_init(&cpu->lock, NULL);
        pthread_cond_init(&cpu->work, NULL);
        pthread_cond_init(&cpu->done, NULL);
        /* Held so that `thread` is set before the pCPU's first callback checks it. */
        pthread_mutex_lock(&cpu->lock);
        CHECK(pthread_create(&cpu->thread, NULL, pcpu_main, cpu) == 0);
        pthread_mutex_unlock(&cpu->lock);
    }
}

void run_on(uint32_t index, job_fn fn, void *arg)
{
    struct pcpu *cpu = &HOST.cpus[index];
    pthread_mutex_lock(&cpu->lock);
    cpu->job = fn;
    cpu->job_arg = arg;
    cpu->job_done = false;
    pthread_cond_broadcast(&cpu->work);
    while (!cpu->job_done)
        pthread_cond_wait(&cpu->done, &cpu->lock);
    pthread_mutex_unlock(&cpu->lock);
}

void host_power_off(void)
{
    for (int p = 0; p < PCPUS; p++) {
        struct pcpu *cpu = &HOST.cpus[p];
        pthread_mutex_lock(&cpu->lock);
        cpu->power_off = true;
        pthread_cond_broadcast(&cpu->work);
        pthread_mutex_unlock(&cpu->lock);
    }
    for (int p = 0; p < PCPUS; p++)
        CHECK(pthread_join(HOST.cpus[p].thread, NULL) == 0);
}

void host_free(void)
{
    vpmu_error err;
    for (int i = 0; i < VCPUS; i++)
        CHECK(vpmu_vcpu_destroy(HOST.vpmu, HOST.vcpus[i], &err) == 0);
    CHECK(vpmu_destroy(HOST.vpmu, &err) == 0);
    for (int p = 0; p < PCPUS; p++) {
        vpmu_testing_pmu_free(HOST.cpus[p].pmu);
        pthread_mutex_destroy(&HOST.cpus[p].lock);
        pthread_cond_destroy(&HOST.cpus[p].work);
        pthread_cond_destroy(&HOST.cpus[p].done);
    }
    pthread_mutex_destroy(&HOST.lock);
}

/* ---- What a pCPU does for the guest it runs (each on its own thread). ---- */

void switch_to(struct pcpu *cpu, int vcpu)
{
    vpmu_error err;
    cpu->in_guest = IDLE;
    CHECK(vpmu_context_switch(cpu->handle, vcpu == IDLE ? NULL : HOST.vcpus[vcpu], &err) == 0);
    cpu->current = vcpu;
}

uint32_t guest_wrmsr(struct pcpu *cpu, uint32_t msr, uint64_t value)
{
    uint32_t result;
    vpmu_error err;
    CHECK(cpu->current != IDLE);
    CHECK(vpmu_wrmsr(cpu->handle, HOST.vcpus[cpu->current], msr, value, &result, &err) == 0);
    return result;
}

uint32_t guest_rdmsr(struct pcpu *cpu, uint32_t msr, uint64_t *value)
{
    uint32_t result;
    vpmu_error err;
    CHECK(cpu->current != IDLE);
    CHECK(vpmu_rdmsr(cpu->handle, HOST.vcpus[cpu->current], msr, value, &result, &err) == 0);
    return result;
}

/* RDPMC in the guest's kernel (CPL 0). */
uint32_t guest_rdpmc(struct pcpu *cpu, uint32_t selector, uint64_t *value)
{
    uint32_t result;
    vpmu_error err;
    CHECK(cpu->current != IDLE);
    CHECK(vpmu_rdpmc(cpu->handle, HOST.vcpus[cpu->current], selector, 0, false, value, &result,
                     &err) == 0);
    return result;
}

int hypercall(struct pcpu *cpu, uint32_t op, uint64_t val, uint32_t vcpu, vpmu_error *err)
{
    xenpmu_params params = {{XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR}, val, vcpu, 0};
    CHECK(cpu->current != IDLE);
    return vpmu_control_op(cpu->handle, HOST.vcpus[cpu->current], op, &params, err);
}

uint32_t teardown(struct pcpu *cpu, int vcpu)
{
    uint32_t done;
    vpmu_error err;
    CHECK(vpmu_teardown_vcpu(cpu->handle, HOST.vcpus[vcpu], &done, &err) == 0);
    return done;
}

unsigned retire(struct pcpu *cpu, uint64_t rip, uint64_t count, struct taken_pmi *pmis,
                unsigned max)
{
    unsigned taken = 0;
    CHECK(cpu->current != IDLE);
    for (uint64_t k = 0; k < count; k++) {
        xenpmu_regs regs;
        memset(&regs, 0, sizeof regs);
        regs.rip = rip + 4 * k;
        regs.mode = XENPMU_REGS_MODE_64;
        cpu->in_guest = cpu->current;
        cpu->guest_regs = regs;
        pthread_mutex_lock(&HOST.lock);
        HOST.resume_regs[cpu->current] = regs;
        pthread_mutex_unlock(&HOST.lock);
        CHECK(vpmu_testing_pmu_retire_instruction(cpu->pmu) == 0);
        /* A masked physical LVTPC holds the interrupt back (the vPMU masks it while a sample
         * waits in a page). */
        if (!cpu->lvtpc_masked && vpmu_testing_pmu_take_pmi(cpu->pmu)) {
            vpmu_pmi_outcome outcome;
            vpmu_error err;
            CHECK(vpmu_handle_pmi(cpu->handle, &outcome, &err) == 0);
            if (taken < max)
                pmis[taken] = (struct taken_pmi){regs.rip, outcome};
            taken++;
        }
    }
    cpu->in_guest = IDLE;
    return taken;
}
