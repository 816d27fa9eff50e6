// A C++11 consumer of abi/include/xenpmu.h, built by tests/tests/header_builds.rs with
// `g++ -std=c++11 -Wall -Wextra -Werror -pedantic` at -m32 and -m64 and run: it fills pages
// the way a hypervisor would and reads them back through every helper, the version 1.2 sample
// details and the 1.4 ring helpers included. Exits 0 and prints "ok" when every check holds.
#include <cstdio>
#include <cstring>

#include "xenpmu.h"
#include "xenpmu.h" // a second include must be harmless

static_assert(sizeof(xenpmu_page) == XENPMU_PAGE_SIZE, "one page");
static_assert(offsetof(xenpmu_page, sample) == XENPMU_DEFINED_SIZE_1_0, "1.2 details follow 1.0's part");
static_assert(offsetof(xenpmu_page, sample) + sizeof(xenpmu_sample_info) == XENPMU_DEFINED_SIZE_1_2,
              "1.2 details end the 1.2 part");
static_assert(sizeof(xenpmu_sample_info().callchain) / sizeof(uint64_t) == XENPMU_CALLCHAIN_MAX,
              "call chain depth");

namespace {

int failures = 0;

void expect(const char *what, unsigned long long got, unsigned long long want)
{
    if (got != want) {
        std::fprintf(stderr, "%s: got %#llx, want %#llx\n", what, got, want);
        failures++;
    }
}

void header(xenpmu_page &page, uint32_t vendor, uint32_t defined_size)
{
    std::memset(&page, 0, sizeof(page));
    page.header.magic = XENPMU_MAGIC;
    page.header.version_major = XENPMU_VERSION_MAJOR;
    page.header.version_minor = XENPMU_VERSION_MINOR;
    page.header.defined_size = defined_size;
    page.header.vendor = vendor;
}

void sample_details()
{
    static xenpmu_page page;
    header(page, XENPMU_VENDOR_NONE, XENPMU_DEFINED_SIZE_1_2);
    page.regs.rip = 0x401234;
    page.sample.tsc = 1000;
    page.sample.tsc_khz = 2596000;
    page.sample.sequence = 9;
    page.sample.overflowed = (1ull << 32) | 1;
    page.sample.chain_len = 2;
    page.sample.chain_end = XENPMU_CHAIN_COMPLETE;
    page.sample.callchain[0] = 0x401100;
    page.sample.callchain[1] = 0x401000;
    expect("page_check 1.2", static_cast<unsigned>(xenpmu_page_check(&page)), 0);

    const xenpmu_sample_info *info = xenpmu_sample_info_get(&page);
    expect("1.2 page has details", info != nullptr, 1);
    if (info) {
        expect("tsc", info->tsc, 1000);
        expect("tsc_khz", info->tsc_khz, 2596000);
        expect("sequence", info->sequence, 9);
        expect("overflowed", info->overflowed, (1ull << 32) | 1);
        expect("chain_end", info->chain_end, XENPMU_CHAIN_COMPLETE);
        expect("chain length", xenpmu_sample_chain_len(info), 2);
        expect("innermost caller", info->callchain[0], 0x401100);
        expect("outer caller", info->callchain[1], 0x401000);
    }
    // A lying chain_len is clamped to the array.
    page.sample.chain_len = 0xFFFFFFFFu;
    expect("clamped chain length", xenpmu_sample_chain_len(&page.sample), XENPMU_CALLCHAIN_MAX);

    // A 1.1 page is valid and has no details.
    page.header.version_minor = 1;
    page.header.defined_size = XENPMU_DEFINED_SIZE_1_0;
    expect("page_check 1.1", static_cast<unsigned>(xenpmu_page_check(&page)), 0);
    expect("1.1 page has no details", xenpmu_sample_info_get(&page) == nullptr, 1);
}

void intel()
{
    static xenpmu_page page;
    header(page, XENPMU_VENDOR_INTEL, XENPMU_DEFINED_SIZE_1_2);
    xenpmu_intel_ctxt ctxt;
    std::memset(&ctxt, 0, sizeof(ctxt));
    ctxt.fixed_counters = XENPMU_VENDOR_CTXT_SIZE;
    ctxt.fixed_count = 3;
    ctxt.arch_counters = XENPMU_VENDOR_CTXT_SIZE + 3 * 8;
    ctxt.arch_count = 4;
    ctxt.global_status = 0x5;
    std::memcpy(page.vendor.words, &ctxt, sizeof(ctxt));

    xenpmu_intel_ctxt got;
    expect("intel_ctxt_get", static_cast<unsigned>(xenpmu_intel_ctxt_get(&page, &got)), 0);
    expect("global_status", got.global_status, 0x5);
    got.global_ovf_ctrl = got.global_status;
    got.fixed_count = 99; // geometry: never written back
    expect("intel_ctxt_set", static_cast<unsigned>(xenpmu_intel_ctxt_set(&page, &got)), 0);
    expect("geometry kept", page.vendor.words[1] & 0xFFFFFFFFu, 3);
    expect("ovf_ctrl written", page.vendor.words[4], 0x5);

    uint64_t value = 0;
    expect("fixed_set", static_cast<unsigned>(xenpmu_intel_fixed_set(&page, 2, 0xABC)), 0);
    expect("fixed_get", static_cast<unsigned>(xenpmu_intel_fixed_get(&page, 2, &value)), 0);
    expect("fixed 2", value, 0xABC);
    expect("fixed 3 is out of range", static_cast<unsigned>(xenpmu_intel_fixed_get(&page, 3, &value)),
           static_cast<unsigned>(-XENPMU_EINVAL));

    xenpmu_counter_pair pair = {0x11, 0x22};
    expect("pair_set", static_cast<unsigned>(xenpmu_intel_pair_set(&page, 3, &pair)), 0);
    xenpmu_counter_pair back = {0, 0};
    expect("pair_get", static_cast<unsigned>(xenpmu_intel_pair_get(&page, 3, &back)), 0);
    expect("pair counter", back.counter, 0x11);
    expect("pair control", back.control, 0x22);
    expect("pair 4 is out of range", static_cast<unsigned>(xenpmu_intel_pair_get(&page, 4, &back)),
           static_cast<unsigned>(-XENPMU_EINVAL));

    xenpmu_amd_ctxt amd;
    expect("not AMD", static_cast<unsigned>(xenpmu_amd_ctxt_get(&page, &amd)),
           static_cast<unsigned>(-XENPMU_EINVAL));
}

void amd()
{
    static xenpmu_page page;
    header(page, XENPMU_VENDOR_AMD, XENPMU_DEFINED_SIZE_1_2);
    xenpmu_amd_ctxt ctxt;
    std::memset(&ctxt, 0, sizeof(ctxt));
    ctxt.counters = XENPMU_VENDOR_CTXT_SIZE;
    ctxt.ctrls = XENPMU_VENDOR_CTXT_SIZE + 6 * 8;
    ctxt.counter_count = 6;
    std::memcpy(page.vendor.words, &ctxt, sizeof(ctxt));

    xenpmu_amd_ctxt got;
    expect("amd_ctxt_get", static_cast<unsigned>(xenpmu_amd_ctxt_get(&page, &got)), 0);
    got.global_ctrl = 0x3F;
    expect("amd_ctxt_set", static_cast<unsigned>(xenpmu_amd_ctxt_set(&page, &got)), 0);
    expect("global_ctrl", page.vendor.words[2], 0x3F);

    uint64_t value = 0;
    expect("counter_set", static_cast<unsigned>(xenpmu_amd_counter_set(&page, 5, 0x77)), 0);
    expect("ctrl_set", static_cast<unsigned>(xenpmu_amd_ctrl_set(&page, 5, 0x430076)), 0);
    expect("counter_get", static_cast<unsigned>(xenpmu_amd_counter_get(&page, 5, &value)), 0);
    expect("counter 5", value, 0x77);
    expect("ctrl_get", static_cast<unsigned>(xenpmu_amd_ctrl_get(&page, 5, &value)), 0);
    expect("ctrl 5", value, 0x430076);
    expect("counter 6 is out of range", static_cast<unsigned>(xenpmu_amd_counter_get(&page, 6, &value)),
           static_cast<unsigned>(-XENPMU_EINVAL));
    expect("bank past the area", static_cast<unsigned>(xenpmu_bank_check(XENPMU_VENDOR_AREA_SIZE - 8, 2, 8)),
           static_cast<unsigned>(-XENPMU_EINVAL));

    // The verdicts of 1.3: overlapping banks are refused, as the Rust view refuses them.
    expect("amd verdict", xenpmu_amd_verdict(&page, &got), 0);
    expect("bank verdict", xenpmu_bank_verdict(XENPMU_VENDOR_AREA_SIZE - 8, 2, 8),
           XENPMU_CHECK_BANK_OUT_OF_BOUNDS);
    expect("disjoint", xenpmu_banks_disjoint(64, 48, 112, 48), 0);
    expect("overlap", xenpmu_banks_disjoint(64, 48, 104, 48), XENPMU_CHECK_BANKS_OVERLAP);
    std::memcpy(&ctxt, page.vendor.words, sizeof(ctxt));
    ctxt.ctrls = ctxt.counters + 8;
    std::memcpy(page.vendor.words, &ctxt, sizeof(ctxt));
    expect("overlapping banks", xenpmu_amd_verdict(&page, &got), XENPMU_CHECK_BANKS_OVERLAP);
    expect("overlapping banks errno", static_cast<unsigned>(xenpmu_amd_counter_get(&page, 0, &value)),
           static_cast<unsigned>(-XENPMU_EINVAL));
}

void flush_refusal()
{
    static xenpmu_page page;
    header(page, XENPMU_VENDOR_INTEL, XENPMU_DEFINED_SIZE_1_2);
    page.flush_refusal.msr = 0x309;
    page.flush_refusal.reason = XENPMU_REFUSED_WIDTH;
    const xenpmu_flush_refusal *refusal = xenpmu_flush_refusal_get(&page);
    expect("1.3 page has the report", refusal != nullptr, 1);
    if (refusal != nullptr)
        expect("refused msr", refusal->msr, 0x309);
    page.header.version_minor = 2;
    expect("1.2 page has no report", xenpmu_flush_refusal_get(&page) == nullptr, 1);
    expect("page verdict", xenpmu_page_verdict(&page), 0);
    page.header.version_major = 2;
    expect("major verdict", xenpmu_page_verdict(&page), XENPMU_CHECK_MAJOR_MISMATCH);
    expect("major errno", static_cast<unsigned>(xenpmu_verdict_errno(XENPMU_CHECK_MAJOR_MISMATCH)),
           static_cast<unsigned>(-XENPMU_EPROTONOSUPPORT));
    xenpmu_intel_ctxt ctxt;
    expect("intel verdict of another major", xenpmu_intel_verdict(&page, &ctxt), XENPMU_CHECK_MAJOR_MISMATCH);
}


// The sample ring (1.4): a one-page ring holding, from offset 3584, a sample with a 3-entry
// chain, a lost record and a PAD to the end, read back through every ring helper.
void ring()
{
    static unsigned char area[XENPMU_RING_CONTROL_SIZE + XENPMU_RING_PAGE_SIZE] alignas(4096);
    std::memset(area, 0, sizeof(area));
    xenpmu_ring_control *ctl = reinterpret_cast<xenpmu_ring_control *>(area);
    unsigned char *data = area + XENPMU_RING_CONTROL_SIZE;
    expect("zeroed ring refused", static_cast<unsigned>(xenpmu_ring_info_check(ctl)),
           XENPMU_CHECK_RING_BAD_MAGIC);
    expect("refused ring: errno", static_cast<unsigned>(xenpmu_verdict_errno(XENPMU_CHECK_RING_BAD_MAGIC)),
           static_cast<unsigned>(-XENPMU_EPROTONOSUPPORT));
    ctl->info.magic = XENPMU_RING_MAGIC;
    ctl->info.version_major = XENPMU_VERSION_MAJOR;
    ctl->info.version_minor = XENPMU_VERSION_MINOR;
    ctl->info.data_offset = XENPMU_RING_CONTROL_SIZE;
    ctl->info.data_size = XENPMU_RING_PAGE_SIZE;
    ctl->info.record_max = XENPMU_RECORD_MAX;
    ctl->info.wakeup_bytes = XENPMU_RING_PAGE_SIZE / 2;
    expect("ring info", static_cast<unsigned>(xenpmu_ring_info_check(ctl)), 0);
    expect("ring data", xenpmu_ring_data(ctl) == data, 1);

    xenpmu_ring_sample sample;
    std::memset(&sample, 0, sizeof(sample));
    sample.header.kind = XENPMU_RECORD_SAMPLE;
    sample.header.size = XENPMU_RING_SAMPLE_SIZE + 3 * 8;
    sample.sequence = 41;
    sample.chain_len = 3;
    sample.regs.rip = 0xffffffff81000000ull;
    std::memcpy(data + 3584, &sample, sizeof(sample));
    for (uint64_t i = 0; i < 3; i++)
        std::memcpy(data + 3584 + XENPMU_RING_SAMPLE_SIZE + 8 * i, &i, 8);
    xenpmu_ring_lost lost;
    std::memset(&lost, 0, sizeof(lost));
    lost.header.kind = XENPMU_RECORD_LOST;
    lost.header.size = sizeof(lost);
    lost.lost = 2;
    lost.sequence = 43;
    std::memcpy(data + 3832, &lost, sizeof(lost));
    xenpmu_record_header pad = { XENPMU_RECORD_PAD, XENPMU_RING_PAGE_SIZE - 3864, 0 };
    std::memcpy(data + 3864, &pad, sizeof(pad));
    ctl->consumer.tail = 3584;
    ctl->producer.head = XENPMU_RING_PAGE_SIZE;

    uint64_t head = xenpmu_ring_head_acquire(ctl), tail = ctl->consumer.tail;
    const xenpmu_record_header *rec = nullptr;
    uint64_t chain[XENPMU_CALLCHAIN_MAX];
    expect("head", head, XENPMU_RING_PAGE_SIZE);
    expect("first record", static_cast<unsigned>(xenpmu_ring_next(data, XENPMU_RING_PAGE_SIZE, XENPMU_RECORD_MAX, tail, head, &rec)), 0);
    expect("a sample", static_cast<unsigned>(xenpmu_ring_sample_get(rec, &sample, chain, 2)), 2);
    expect("its sequence", sample.sequence, 41);
    expect("its chain", chain[1], 1);
    expect("not a lost record", static_cast<unsigned>(xenpmu_ring_lost_get(rec, &lost)),
           static_cast<unsigned>(-XENPMU_EINVAL));
    tail += rec->size;
    expect("second record", static_cast<unsigned>(xenpmu_ring_next(data, XENPMU_RING_PAGE_SIZE, XENPMU_RECORD_MAX, tail, head, &rec)), 0);
    expect("a lost record", static_cast<unsigned>(xenpmu_ring_lost_get(rec, &lost)), 0);
    expect("its count", lost.lost, 2);
    tail += rec->size;
    expect("third record", static_cast<unsigned>(xenpmu_ring_next(data, XENPMU_RING_PAGE_SIZE, XENPMU_RECORD_MAX, tail, head, &rec)), 0);
    expect("a PAD", rec->kind, XENPMU_RECORD_PAD);
    tail += rec->size;
    expect("then empty", static_cast<unsigned>(xenpmu_ring_next(data, XENPMU_RING_PAGE_SIZE, XENPMU_RECORD_MAX, tail, head, &rec)),
           XENPMU_RING_EMPTY);
    xenpmu_ring_tail_release(ctl, tail);
    expect("tail stored", ctl->consumer.tail, XENPMU_RING_PAGE_SIZE);
    expect("tail ahead refused", static_cast<unsigned>(xenpmu_ring_next(data, XENPMU_RING_PAGE_SIZE, XENPMU_RECORD_MAX, tail + 8, head, &rec)),
           XENPMU_CHECK_RING_TAIL_AHEAD);
}

} // namespace

int main()
{
    static xenpmu_page zeroed;
    expect("zeroed page refused", static_cast<unsigned>(xenpmu_page_check(&zeroed)),
           static_cast<unsigned>(-XENPMU_EPROTONOSUPPORT));
    sample_details();
    intel();
    amd();
    flush_refusal();
    ring();
    if (failures != 0)
        return 1;
    std::puts("ok");
    return 0;
}
