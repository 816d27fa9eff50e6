/*
 * The C consumer's verdict on each page of the shared corpus (tests/corpus/pages), built by
 * the vpmu-tests crate at -m32 and -m64 and compared line by line with the Rust view's verdict
 * on the same bytes (tests/tests/c_corpus.rs, which prints the same lines from PageView).
 *
 *   verdict FILE...   for each page file: "== FILE", then one line per helper call
 *
 * Every consumer helper of xenpmu.h is called: the checks (their XENPMU_CHECK_* verdict and
 * their errno), every getter at indices inside, at and past each bank (printing the values it
 * returns), and every setter on a copy of the page, whose bytes are hashed afterwards. Values
 * are printed only where the helper returned 0: a refused helper promises nothing about them.
 */
#include <stdio.h>
#include <string.h>

#include "xenpmu.h"

/* Indices probed in every bank: 0..9 and the largest. */
static const uint32_t INDICES[] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xffffffffu };
#define N_INDICES (sizeof(INDICES) / sizeof(INDICES[0]))

static unsigned long long u(uint64_t v)
{
    return (unsigned long long)v;
}

/* FNV-1a over the page's bytes. */
static uint64_t page_hash(const xenpmu_page *page)
{
    const unsigned char *bytes = (const unsigned char *)page;
    uint64_t hash = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < sizeof(*page); i++) {
        hash ^= bytes[i];
        hash *= 0x100000001b3ull;
    }
    return hash;
}

static void header(const xenpmu_page *page)
{
    const xenpmu_sample_info *info = xenpmu_sample_info_get(page);
    const xenpmu_flush_refusal *refusal = xenpmu_flush_refusal_get(page);
    uint64_t chain = 0;
    uint32_t i, len;
    printf("page %u %d\n", (unsigned)xenpmu_page_verdict(page), xenpmu_page_check(page));
    if (info == NULL) {
        printf("sample -\n");
    } else {
        len = xenpmu_sample_chain_len(info);
        for (i = 0; i < len; i++)
            chain = chain * 31 + info->callchain[i];
        printf("sample %llu %llu %llu %llu %u %u %llu\n", u(info->tsc), u(info->tsc_khz),
               u(info->sequence), u(info->overflowed), (unsigned)len, (unsigned)info->chain_end,
               u(chain));
    }
    if (refusal == NULL)
        printf("refusal -\n");
    else
        printf("refusal %u %u %llu\n", (unsigned)refusal->msr, (unsigned)refusal->reason,
               u(refusal->value));
}

static void intel(const xenpmu_page *page)
{
    xenpmu_intel_ctxt ctxt;
    xenpmu_counter_pair pair;
    uint64_t value;
    uint32_t verdict = xenpmu_intel_verdict(page, &ctxt);
    size_t k;
    int rc;
    printf("intel %u", (unsigned)verdict);
    rc = xenpmu_intel_ctxt_get(page, &ctxt);
    printf(" %d", rc);
    if (rc == 0)
        printf(" %u %u %u %u %llu %llu %llu %llu %llu %llu", (unsigned)ctxt.fixed_counters,
               (unsigned)ctxt.arch_counters, (unsigned)ctxt.fixed_count, (unsigned)ctxt.arch_count,
               u(ctxt.global_ctrl), u(ctxt.global_status), u(ctxt.global_ovf_ctrl),
               u(ctxt.fixed_ctrl), u(ctxt.ds_area), u(ctxt.pebs_enable));
    printf("\n");
    for (k = 0; k < N_INDICES; k++) {
        rc = xenpmu_intel_fixed_get(page, INDICES[k], &value);
        if (rc == 0)
            printf("intel.fixed %u 0 %llu\n", (unsigned)INDICES[k], u(value));
        else
            printf("intel.fixed %u %d\n", (unsigned)INDICES[k], rc);
        rc = xenpmu_intel_pair_get(page, INDICES[k], &pair);
        if (rc == 0)
            printf("intel.pair %u 0 %llu %llu\n", (unsigned)INDICES[k], u(pair.counter),
                   u(pair.control));
        else
            printf("intel.pair %u %d\n", (unsigned)INDICES[k], rc);
    }
}

static void amd(const xenpmu_page *page)
{
    xenpmu_amd_ctxt ctxt;
    uint64_t value;
    uint32_t verdict = xenpmu_amd_verdict(page, &ctxt);
    size_t k;
    int rc;
    printf("amd %u", (unsigned)verdict);
    rc = xenpmu_amd_ctxt_get(page, &ctxt);
    printf(" %d", rc);
    if (rc == 0)
        printf(" %u %u %u %llu %llu", (unsigned)ctxt.counters, (unsigned)ctxt.ctrls,
               (unsigned)ctxt.counter_count, u(ctxt.global_ctrl), u(ctxt.global_status));
    printf("\n");
    for (k = 0; k < N_INDICES; k++) {
        rc = xenpmu_amd_counter_get(page, INDICES[k], &value);
        if (rc == 0)
            printf("amd.counter %u 0 %llu\n", (unsigned)INDICES[k], u(value));
        else
            printf("amd.counter %u %d\n", (unsigned)INDICES[k], rc);
        rc = xenpmu_amd_ctrl_get(page, INDICES[k], &value);
        if (rc == 0)
            printf("amd.ctrl %u 0 %llu\n", (unsigned)INDICES[k], u(value));
        else
            printf("amd.ctrl %u %d\n", (unsigned)INDICES[k], rc);
    }
}

/* Every setter, in this order, on one copy of the page; then the copy's hash. The values are
 * the same constants the Rust side writes. */
static void edits(const xenpmu_page *page)
{
    static xenpmu_page copy;
    xenpmu_intel_ctxt intel_in;
    xenpmu_amd_ctxt amd_in;
    xenpmu_counter_pair pair;
    memcpy(&copy, page, sizeof(copy));
    memset(&intel_in, 0, sizeof(intel_in));
    intel_in.global_ctrl = 0x11;
    intel_in.global_status = 0x22;
    intel_in.global_ovf_ctrl = 0x33;
    intel_in.fixed_ctrl = 0x44;
    intel_in.ds_area = 0x55;
    intel_in.pebs_enable = 0x66;
    memset(&amd_in, 0, sizeof(amd_in));
    amd_in.global_ctrl = 0x77;
    amd_in.global_status = 0x88;
    pair.counter = 0x99;
    pair.control = 0xaa;
    printf("edit %d", xenpmu_intel_ctxt_set(&copy, &intel_in));
    printf(" %d", xenpmu_intel_fixed_set(&copy, 1, 0xbb));
    printf(" %d", xenpmu_intel_fixed_set(&copy, 4, 0xbc));
    printf(" %d", xenpmu_intel_pair_set(&copy, 2, &pair));
    printf(" %d", xenpmu_intel_pair_set(&copy, 8, &pair));
    printf(" %d", xenpmu_amd_ctxt_set(&copy, &amd_in));
    printf(" %d", xenpmu_amd_counter_set(&copy, 3, 0xcc));
    printf(" %d", xenpmu_amd_counter_set(&copy, 6, 0xcd));
    printf(" %d", xenpmu_amd_ctrl_set(&copy, 5, 0xdd));
    printf(" %d", xenpmu_amd_ctrl_set(&copy, 0xffffffffu, 0xde));
    printf(" %016llx\n", u(page_hash(&copy)));
}

int main(int argc, char **argv)
{
    static xenpmu_page page;
    int i;
    for (i = 1; i < argc; i++) {
        FILE *file = fopen(argv[i], "rb");
        size_t got;
        if (file == NULL) {
            fprintf(stderr, "cannot open %s\n", argv[i]);
            return 2;
        }
        got = fread(&page, 1, sizeof(page), file);
        fclose(file);
        if (got != sizeof(page)) {
            fprintf(stderr, "%s: %u bytes, not one page\n", argv[i], (unsigned)got);
            return 2;
        }
        printf("== %s\n", argv[i]);
        header(&page);
        intel(&page);
        amd(&page);
        edits(&page);
    }
    return 0;
}
