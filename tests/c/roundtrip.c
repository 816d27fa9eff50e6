/*
 * Cross-language round trip for the xenpmu ABI, built by the vpmu-tests crate at -m32 and -m64.
 *
 *   roundtrip fill-intel|fill-amd|fill-params   writes a page (or params block) to stdout
 *   roundtrip check-intel|check-amd|check-params reads one from stdin and checks every field
 *
 * The values come from xp_pattern(), which the Rust side (tests/tests/c_bindings.rs) computes
 * identically; every 64-bit value has bits set in both halves, so a 32-bit consumer that
 * truncated or misplaced a field would be caught.
 */
#include <stdio.h>
#include <string.h>

#include "xenpmu.h"

#define INTEL_FIXED 4
#define INTEL_GP 8
#define AMD_COUNTERS 6

static uint64_t xp_pattern(uint32_t k)
{
    return 0x8000000000000000ull | ((uint64_t)k << 40) | ((uint64_t)(k * 7u + 3u) << 16) | k;
}

static int failures;

static void expect(const char *what, uint64_t got, uint64_t want)
{
    if (got != want) {
        fprintf(stderr, "mismatch %s: got %#llx want %#llx\n", what, (unsigned long long)got,
                (unsigned long long)want);
        failures++;
    }
}

static uint64_t *reg_slot(xenpmu_regs *r, int i)
{
    uint64_t *regs[18] = { &r->rax, &r->rbx, &r->rcx, &r->rdx, &r->rsi, &r->rdi,
                           &r->rbp, &r->rsp, &r->r8,  &r->r9,  &r->r10, &r->r11,
                           &r->r12, &r->r13, &r->r14, &r->r15, &r->rip, &r->rflags };
    return regs[i];
}

static void fill_common(xenpmu_page *p, uint32_t vendor)
{
    int i;
    memset(p, 0, sizeof(*p));
    p->header.magic = XENPMU_MAGIC;
    p->header.version_major = XENPMU_VERSION_MAJOR;
    p->header.version_minor = XENPMU_VERSION_MINOR;
    p->header.defined_size = XENPMU_DEFINED_SIZE_1_2;
    p->header.vendor = vendor;
    p->identity.domain_id = 42;
    p->identity.vcpu_id = 3;
    p->identity.pcpu_id = 1;
    p->pmu_flags = XENPMU_FLAG_CACHED | XENPMU_FLAG_SAMPLE_USER;
    p->lapic_lvtpc = XENPMU_LVTPC_MASKED;
    p->dropped_samples = xp_pattern(50);
    for (i = 0; i < 18; i++)
        *reg_slot(&p->regs, i) = xp_pattern((uint32_t)i);
    p->regs.cs = 0x33;
    p->regs.ss = 0x2b;
    p->regs.ds = 0x2b;
    p->regs.es = 0x2b;
    p->regs.fs = 0x53;
    p->regs.gs = 0x63;
    p->regs.cpl = 3;
    p->regs.mode = XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_USER;
    p->sample.tsc = xp_pattern(60);
    p->sample.tsc_khz = xp_pattern(61);
    p->sample.sequence = xp_pattern(62);
    p->sample.overflowed = xp_pattern(63);
    p->sample.chain_len = 3;
    p->sample.chain_end = XENPMU_CHAIN_COMPLETE;
    for (i = 0; i < 3; i++)
        p->sample.callchain[i] = xp_pattern(400 + (uint32_t)i);
}

static void check_common(xenpmu_page *p, uint32_t vendor)
{
    int i;
    char name[32];
    expect("page_check", (uint64_t)(int64_t)xenpmu_page_check(p), 0);
    expect("vendor", p->header.vendor, vendor);
    expect("minor", p->header.version_minor, XENPMU_VERSION_MINOR);
    expect("domain_id", p->identity.domain_id, 42);
    expect("vcpu_id", p->identity.vcpu_id, 3);
    expect("pcpu_id", p->identity.pcpu_id, 1);
    expect("pmu_flags", p->pmu_flags, XENPMU_FLAG_CACHED | XENPMU_FLAG_SAMPLE_USER);
    expect("lapic_lvtpc", p->lapic_lvtpc, XENPMU_LVTPC_MASKED);
    expect("dropped_samples", p->dropped_samples, xp_pattern(50));
    for (i = 0; i < 18; i++) {
        snprintf(name, sizeof(name), "reg %d", i);
        expect(name, *reg_slot(&p->regs, i), xp_pattern((uint32_t)i));
    }
    expect("cs", p->regs.cs, 0x33);
    expect("ss", p->regs.ss, 0x2b);
    expect("ds", p->regs.ds, 0x2b);
    expect("es", p->regs.es, 0x2b);
    expect("fs", p->regs.fs, 0x53);
    expect("gs", p->regs.gs, 0x63);
    expect("cpl", p->regs.cpl, 3);
    expect("mode", p->regs.mode, XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_USER);
    /* Version 1.2's sample details, which a 32-bit consumer reads at the same offsets. */
    expect("defined_size", p->header.defined_size, XENPMU_DEFINED_SIZE_1_2);
    expect("tsc", p->sample.tsc, xp_pattern(60));
    expect("tsc_khz", p->sample.tsc_khz, xp_pattern(61));
    expect("sequence", p->sample.sequence, xp_pattern(62));
    expect("overflowed", p->sample.overflowed, xp_pattern(63));
    expect("chain_len", p->sample.chain_len, 3);
    expect("chain_end", p->sample.chain_end, XENPMU_CHAIN_COMPLETE);
    for (i = 0; i < XENPMU_CALLCHAIN_MAX; i++) {
        snprintf(name, sizeof(name), "callchain %d", i);
        expect(name, p->sample.callchain[i], i < 3 ? xp_pattern(400 + (uint32_t)i) : 0);
    }
}

static void fill_intel(xenpmu_page *p)
{
    xenpmu_intel_ctxt c;
    uint32_t i;
    fill_common(p, XENPMU_VENDOR_INTEL);
    memset(&c, 0, sizeof(c));
    c.fixed_counters = XENPMU_VENDOR_CTXT_SIZE;
    c.fixed_count = INTEL_FIXED;
    c.arch_counters = XENPMU_VENDOR_CTXT_SIZE + 8 * INTEL_FIXED;
    c.arch_count = INTEL_GP;
    c.global_ctrl = xp_pattern(100);
    c.global_status = xp_pattern(101);
    c.global_ovf_ctrl = xp_pattern(102);
    c.fixed_ctrl = xp_pattern(103);
    c.ds_area = xp_pattern(104);
    c.pebs_enable = xp_pattern(105);
    /* Playing the hypervisor here: it alone writes the bank geometry. */
    memcpy(p->vendor.words, &c, sizeof(c));
    for (i = 0; i < INTEL_FIXED; i++)
        expect("fixed set", (uint64_t)(int64_t)xenpmu_intel_fixed_set(p, i, xp_pattern(200 + i)), 0);
    for (i = 0; i < INTEL_GP; i++) {
        xenpmu_counter_pair pair;
        pair.counter = xp_pattern(300 + 2 * i);
        pair.control = xp_pattern(301 + 2 * i);
        expect("pair set", (uint64_t)(int64_t)xenpmu_intel_pair_set(p, i, &pair), 0);
    }
}

static void check_intel(xenpmu_page *p)
{
    xenpmu_intel_ctxt ctxt;
    const xenpmu_intel_ctxt *c = &ctxt;
    uint64_t value;
    uint32_t i;
    check_common(p, XENPMU_VENDOR_INTEL);
    expect("intel_ctxt_get", (uint64_t)(int64_t)xenpmu_intel_ctxt_get(p, &ctxt), 0);
    expect("fixed_count", c->fixed_count, INTEL_FIXED);
    expect("arch_count", c->arch_count, INTEL_GP);
    expect("global_ctrl", c->global_ctrl, xp_pattern(100));
    expect("global_status", c->global_status, xp_pattern(101));
    expect("global_ovf_ctrl", c->global_ovf_ctrl, xp_pattern(102));
    expect("fixed_ctrl", c->fixed_ctrl, xp_pattern(103));
    expect("ds_area", c->ds_area, xp_pattern(104));
    expect("pebs_enable", c->pebs_enable, xp_pattern(105));
    for (i = 0; i < INTEL_FIXED; i++) {
        value = 0;
        expect("fixed get", (uint64_t)(int64_t)xenpmu_intel_fixed_get(p, i, &value), 0);
        expect("fixed counter", value, xp_pattern(200 + i));
    }
    expect("fixed beyond count is refused", (uint64_t)(int64_t)xenpmu_intel_fixed_get(p, INTEL_FIXED, &value),
           (uint64_t)(int64_t)-XENPMU_EINVAL);
    for (i = 0; i < INTEL_GP; i++) {
        xenpmu_counter_pair pair = { 0, 0 };
        expect("pair get", (uint64_t)(int64_t)xenpmu_intel_pair_get(p, i, &pair), 0);
        expect("gp counter", pair.counter, xp_pattern(300 + 2 * i));
        expect("gp control", pair.control, xp_pattern(301 + 2 * i));
    }
    {
        xenpmu_counter_pair pair;
        expect("pair beyond count is refused", (uint64_t)(int64_t)xenpmu_intel_pair_get(p, INTEL_GP, &pair),
               (uint64_t)(int64_t)-XENPMU_EINVAL);
    }
    expect("amd accessor on an intel page is refused", (uint64_t)(int64_t)xenpmu_amd_counter_get(p, 0, &value),
           (uint64_t)(int64_t)-XENPMU_EINVAL);
}

static void fill_amd(xenpmu_page *p)
{
    xenpmu_amd_ctxt c;
    uint32_t i;
    fill_common(p, XENPMU_VENDOR_AMD);
    memset(&c, 0, sizeof(c));
    c.counters = XENPMU_VENDOR_CTXT_SIZE;
    c.ctrls = XENPMU_VENDOR_CTXT_SIZE + 8 * AMD_COUNTERS;
    c.counter_count = AMD_COUNTERS;
    c.global_ctrl = xp_pattern(100);
    c.global_status = xp_pattern(101);
    /* Playing the hypervisor here: it alone writes the bank geometry. */
    memcpy(p->vendor.words, &c, sizeof(c));
    for (i = 0; i < AMD_COUNTERS; i++) {
        expect("counter set", (uint64_t)(int64_t)xenpmu_amd_counter_set(p, i, xp_pattern(200 + i)), 0);
        expect("ctrl set", (uint64_t)(int64_t)xenpmu_amd_ctrl_set(p, i, xp_pattern(300 + i)), 0);
    }
}

static void check_amd(xenpmu_page *p)
{
    xenpmu_amd_ctxt ctxt;
    const xenpmu_amd_ctxt *c = &ctxt;
    uint64_t value;
    uint32_t i;
    check_common(p, XENPMU_VENDOR_AMD);
    expect("amd_ctxt_get", (uint64_t)(int64_t)xenpmu_amd_ctxt_get(p, &ctxt), 0);
    expect("counter_count", c->counter_count, AMD_COUNTERS);
    expect("global_ctrl", c->global_ctrl, xp_pattern(100));
    expect("global_status", c->global_status, xp_pattern(101));
    for (i = 0; i < AMD_COUNTERS; i++) {
        value = 0;
        expect("counter get", (uint64_t)(int64_t)xenpmu_amd_counter_get(p, i, &value), 0);
        expect("counter", value, xp_pattern(200 + i));
        value = 0;
        expect("ctrl get", (uint64_t)(int64_t)xenpmu_amd_ctrl_get(p, i, &value), 0);
        expect("ctrl", value, xp_pattern(300 + i));
    }
    expect("counter beyond count is refused", (uint64_t)(int64_t)xenpmu_amd_counter_get(p, AMD_COUNTERS, &value),
           (uint64_t)(int64_t)-XENPMU_EINVAL);
    expect("intel accessor on an amd page is refused", (uint64_t)(int64_t)xenpmu_intel_fixed_get(p, 0, &value),
           (uint64_t)(int64_t)-XENPMU_EINVAL);
}

static int write_all(const void *buf, size_t len)
{
    return fwrite(buf, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
}

static int read_all(void *buf, size_t len)
{
    return fread(buf, 1, len, stdin) == len ? 0 : 1;
}

int main(int argc, char **argv)
{
    static xenpmu_page page;
    xenpmu_params params;
    const char *mode = argc > 1 ? argv[1] : "";

    if (!strcmp(mode, "fill-intel")) {
        fill_intel(&page);
        return write_all(&page, sizeof(page));
    }
    if (!strcmp(mode, "fill-amd")) {
        fill_amd(&page);
        return write_all(&page, sizeof(page));
    }
    if (!strcmp(mode, "fill-params")) {
        memset(&params, 0, sizeof(params));
        params.version.major = XENPMU_VERSION_MAJOR;
        params.version.minor = XENPMU_VERSION_MINOR;
        params.val = xp_pattern(7);
        params.vcpu = 5;
        return write_all(&params, sizeof(params));
    }
    if (!strcmp(mode, "check-intel") || !strcmp(mode, "check-amd")) {
        if (read_all(&page, sizeof(page))) {
            fprintf(stderr, "short page on stdin\n");
            return 2;
        }
        if (!strcmp(mode, "check-intel"))
            check_intel(&page);
        else
            check_amd(&page);
    } else if (!strcmp(mode, "check-params")) {
        if (read_all(&params, sizeof(params))) {
            fprintf(stderr, "short params on stdin\n");
            return 2;
        }
        expect("params.major", params.version.major, XENPMU_VERSION_MAJOR);
        expect("params.minor", params.version.minor, XENPMU_VERSION_MINOR);
        expect("params.val", params.val, xp_pattern(7));
        expect("params.vcpu", params.vcpu, 5);
        expect("params._pad0", params._pad0, 0);
    } else {
        fprintf(stderr, "usage: roundtrip fill-intel|fill-amd|fill-params|check-intel|check-amd|check-params\n");
        return 2;
    }
    if (failures) {
        fprintf(stderr, "%d mismatches\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
