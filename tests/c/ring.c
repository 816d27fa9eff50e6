/*
 * The C consumer's reading of each ring image of the shared corpus (tests/corpus/rings), built
 * by the vpmu-tests crate at -m32 and -m64 and compared line by line with what Rust's
 * vpmu_abi::next_record() reads from the same bytes (tests/tests/c_ring.rs prints the same
 * lines).
 *
 *   ring FILE...   for each image (a control page, then the data area): "== FILE", then
 *
 *   info CODE ERRNO DATA     xenpmu_ring_info_check(), its errno, whether xenpmu_ring_data()
 *                            gave the area (1) or NULL (0)
 *   walk SIZE MAX TAIL HEAD  the walk's inputs: info.data_size and info.record_max (taken even
 *                            from a refused info, to reach the reader's own checks), the
 *                            consumer's tail and the head from xenpmu_ring_head_acquire();
 *                            "walk -" when info.data_size exceeds the bytes in the file
 *   one line per record xenpmu_ring_next() returned, every field printed, then
 *   end RC ERRNO TAIL        the walk's last return (XENPMU_RING_EMPTY or a XENPMU_CHECK_*
 *                            code), its errno, and the tail after the last record read;
 *                            the tail is then stored with xenpmu_ring_tail_release() and
 *                            read back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xenpmu.h"

#define MAX_DATA (64u * 1024u)
#define IMAGE_SIZE (XENPMU_RING_CONTROL_SIZE + MAX_DATA)

/* The image lives in allocated memory, as a ring area does in a consumer (no declared type: the
 * helpers' copies and the record pointer's reads are both plain C). */
static unsigned char *image;

static unsigned long long u(uint64_t v)
{
    return (unsigned long long)v;
}

/* FNV-1a over bytes. */
static uint64_t fnv(const void *data, size_t len)
{
    const unsigned char *bytes = (const unsigned char *)data;
    uint64_t hash = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < len; i++) {
        hash ^= bytes[i];
        hash *= 0x100000001b3ull;
    }
    return hash;
}

static int print_sample(const xenpmu_record_header *rec, uint32_t offset)
{
    xenpmu_ring_sample sample;
    xenpmu_ring_lost lost;
    uint64_t chain[XENPMU_CALLCHAIN_MAX], few[3];
    int copied = xenpmu_ring_sample_get(rec, &sample, chain, XENPMU_CALLCHAIN_MAX);
    int copied_few = xenpmu_ring_sample_get(rec, &sample, few, 3);
    if (copied < 0 || copied_few < 0) {
        fprintf(stderr, "xenpmu_ring_sample_get refused a record xenpmu_ring_next accepted\n");
        return 1;
    }
    if ((uint32_t)copied != sample.chain_len || copied_few != (copied < 3 ? copied : 3) ||
        (copied_few > 0 && memcmp(few, chain, 8 * (size_t)copied_few) != 0)) {
        fprintf(stderr, "xenpmu_ring_sample_get copied %d/%d of %u entries\n", copied, copied_few,
                (unsigned)sample.chain_len);
        return 1;
    }
    printf("sample %u %u %u %llu %llu %u %u %u %llu %u %u %llu %llu %u %llu %llu %d\n",
           (unsigned)offset, (unsigned)sample.header.size, (unsigned)sample.header.misc,
           u(sample.sequence), u(sample.tsc), (unsigned)sample.identity.domain_id,
           (unsigned)sample.identity.vcpu_id, (unsigned)sample.identity.pcpu_id,
           u(sample.overflowed), (unsigned)sample.chain_len, (unsigned)sample.chain_end,
           u(sample.regs.rip), u(sample.regs.rsp), (unsigned)sample.regs.mode,
           u(fnv(&sample, sizeof(sample))), u(fnv(chain, 8 * (size_t)copied)),
           xenpmu_ring_lost_get(rec, &lost));
    return 0;
}

static int print_lost(const xenpmu_record_header *rec, uint32_t offset)
{
    xenpmu_ring_lost lost;
    xenpmu_ring_sample sample;
    uint64_t chain[1];
    if (xenpmu_ring_lost_get(rec, &lost) != 0) {
        fprintf(stderr, "xenpmu_ring_lost_get refused a record xenpmu_ring_next accepted\n");
        return 1;
    }
    printf("lost %u %u %u %llu %llu %llu %d\n", (unsigned)offset, (unsigned)lost.header.size,
           (unsigned)lost.header.misc, u(lost.lost), u(lost.sequence), u(lost.tsc),
           xenpmu_ring_sample_get(rec, &sample, chain, 1));
    return 0;
}

static int walk(size_t data_len)
{
    xenpmu_ring_control *ctl = (xenpmu_ring_control *)(void *)image;
    const void *area = xenpmu_ring_data(ctl);
    const unsigned char *data = image + XENPMU_RING_CONTROL_SIZE;
    const xenpmu_record_header *rec;
    uint32_t data_size = ctl->info.data_size, record_max = ctl->info.record_max;
    uint64_t tail = ctl->consumer.tail, head = xenpmu_ring_head_acquire(ctl);
    int code = xenpmu_ring_info_check(ctl), rc;
    printf("info %d %d %d\n", code, xenpmu_verdict_errno((uint32_t)code), area != NULL);
    if (area != NULL && area != (const void *)data) {
        fprintf(stderr, "xenpmu_ring_data: wrong address\n");
        return 1;
    }
    if (data_size > data_len) {
        printf("walk -\n");
        return 0;
    }
    printf("walk %u %u %llu %llu\n", (unsigned)data_size, (unsigned)record_max, u(tail), u(head));
    while ((rc = xenpmu_ring_next(data, data_size, record_max, tail, head, &rec)) == 0) {
        uint32_t offset = (uint32_t)((const unsigned char *)rec - data);
        int failed = 0;
        if (rec->kind == XENPMU_RECORD_SAMPLE)
            failed = print_sample(rec, offset);
        else if (rec->kind == XENPMU_RECORD_LOST)
            failed = print_lost(rec, offset);
        else if (rec->kind == XENPMU_RECORD_PAD)
            printf("pad %u %u\n", (unsigned)offset, (unsigned)rec->size);
        else
            printf("unknown %u %u %u\n", (unsigned)offset, (unsigned)rec->kind, (unsigned)rec->size);
        if (failed)
            return 1;
        tail += rec->size;
    }
    if (rec != NULL) {
        fprintf(stderr, "xenpmu_ring_next returned %d with a record\n", rc);
        return 1;
    }
    printf("end %d %d %llu\n", rc, rc == XENPMU_RING_EMPTY ? 0 : xenpmu_verdict_errno((uint32_t)rc),
           u(tail));
    xenpmu_ring_tail_release(ctl, tail);
    if (ctl->consumer.tail != tail) {
        fprintf(stderr, "xenpmu_ring_tail_release did not store the tail\n");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int i;
    image = (unsigned char *)aligned_alloc(4096, IMAGE_SIZE);
    if (image == NULL) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    for (i = 1; i < argc; i++) {
        FILE *file = fopen(argv[i], "rb");
        size_t got;
        if (file == NULL) {
            fprintf(stderr, "cannot open %s\n", argv[i]);
            return 2;
        }
        memset(image, 0, IMAGE_SIZE);
        got = fread(image, 1, IMAGE_SIZE, file);
        fclose(file);
        if (got <= XENPMU_RING_CONTROL_SIZE || got == IMAGE_SIZE) {
            fprintf(stderr, "%s: %u bytes, not a control page and a data area below %u\n",
                    argv[i], (unsigned)got, MAX_DATA);
            return 2;
        }
        printf("== %s\n", argv[i]);
        if (walk(got - XENPMU_RING_CONTROL_SIZE) != 0)
            return 1;
    }
    free(image);
    return 0;
}
