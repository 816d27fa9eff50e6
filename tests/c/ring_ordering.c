/* docs/abi.md "Memory ordering" (the ring), as a consumer meets it: a producer thread plays
 * the hypervisor, appending records to a one-page ring (a PAD at each wrap) and publishing
 * each with a release store of head after loading tail with an acquire, as the hypervisor
 * does; the main thread plays the owner with the header's helpers only:
 * xenpmu_ring_head_acquire(), xenpmu_ring_next(), xenpmu_ring_sample_get() /
 * xenpmu_ring_lost_get(), xenpmu_ring_tail_release().
 *
 * Every record's words are derived from its sequence number, so a record read before its
 * bytes were all written (or after the producer reused them) fails the check: the consumer
 * verifies every field and chain entry of every record, that sequence numbers arrive in order
 * with none missing, and that xenpmu_ring_next() never reports a corrupt ring.
 *
 * The run is bounded by records, not time: ROUNDS rounds of RECORDS_PER_ROUND records, each
 * round starting its positions 128 KiB before a multiple of 2^32 (round 0 at 0, the last
 * below 2^64) so that head and tail cross the boundary mid-round; at -m32 a torn 64-bit
 * access there would read as a tail ahead of or far behind head. Between rounds the threads
 * meet (the consumer drained everything) and the producer moves both positions.
 *
 * Prints "RECORDS records, LOST lost records, WRAPS wraps, EMPTY empty polls" and exits 0, or
 * describes the first bad record and exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xenpmu.h"

#define DATA_SIZE 4096u
#define ROUNDS 8u
#define RECORDS_PER_ROUND 150000u
#define LOST_EVERY 11u

static xenpmu_ring_control *ctl;
static unsigned char *data;

/* Round handshake: the producer announces the end of round r (done_round = r + 1) after its
 * last record; the consumer, once drained, acknowledges (ack_round = r + 1); the producer then
 * moves the positions and starts round r + 1 (go_round = r + 1). */
static unsigned done_round, ack_round, go_round;

static uint64_t round_start(unsigned round)
{
    if (round == 0)
        return 0;
    if (round == ROUNDS - 1)
        return (uint64_t)0 - 128 * 1024;
    return ((uint64_t)round << 32) - 128 * 1024;
}

static uint32_t chain_len_of(uint64_t sequence)
{
    return (uint32_t)(sequence * 7 % (XENPMU_CALLCHAIN_MAX + 1));
}

static uint64_t chain_entry(uint64_t sequence, uint32_t i)
{
    return (sequence << 20) ^ 0xffffffff81000000ull ^ i;
}

/* The record for `sequence` in `out`: its size. */
static uint32_t build(uint64_t sequence, unsigned char *out)
{
    if (sequence % LOST_EVERY == 0) {
        xenpmu_ring_lost lost;
        memset(&lost, 0, sizeof(lost));
        lost.header.kind = XENPMU_RECORD_LOST;
        lost.header.size = sizeof(lost);
        lost.lost = sequence;
        lost.sequence = sequence;
        lost.tsc = ~sequence;
        memcpy(out, &lost, sizeof(lost));
        return sizeof(lost);
    } else {
        xenpmu_ring_sample sample;
        uint32_t len = chain_len_of(sequence), i;
        memset(&sample, 0, sizeof(sample));
        sample.header.kind = XENPMU_RECORD_SAMPLE;
        sample.header.size = (uint16_t)(XENPMU_RING_SAMPLE_SIZE + 8 * len);
        sample.header.misc = (uint32_t)(sequence & XENPMU_RECORD_MISC_USER);
        sample.sequence = sequence;
        sample.tsc = ~sequence;
        sample.identity.vcpu_id = (uint32_t)sequence;
        sample.identity.pcpu_id = (uint32_t)(sequence >> 32);
        sample.overflowed = sequence * 3;
        sample.chain_len = len;
        sample.regs.rip = sequence ^ 0x5555555555555555ull;
        sample.regs.rsp = sequence + 0x7ffe00000000ull;
        sample.regs.r15 = sequence * 0x9e3779b97f4a7c15ull;
        memcpy(out, &sample, sizeof(sample));
        for (i = 0; i < len; i++) {
            uint64_t entry = chain_entry(sequence, i);
            memcpy(out + XENPMU_RING_SAMPLE_SIZE + 8 * i, &entry, 8);
        }
        return sample.header.size;
    }
}

static void *producer(void *arg)
{
    unsigned char record[XENPMU_RECORD_MAX];
    uint64_t sequence = 1, head = 0;
    unsigned round, n;
    (void)arg;
    for (round = 0; round < ROUNDS; round++) {
        if (round > 0) {
            while (__atomic_load_n(&ack_round, __ATOMIC_ACQUIRE) != round)
                sched_yield();
            head = round_start(round);
            __atomic_store_n(&ctl->consumer.tail, head, __ATOMIC_RELAXED);
            __atomic_store_n(&ctl->producer.head, head, __ATOMIC_RELEASE);
            __atomic_store_n(&go_round, round, __ATOMIC_RELEASE);
        }
        for (n = 0; n < RECORDS_PER_ROUND; n++, sequence++) {
            uint32_t size = build(sequence, record);
            uint32_t offset = (uint32_t)(head % DATA_SIZE), rest = DATA_SIZE - offset;
            uint32_t pad = size > rest ? rest : 0;
            for (;;) {
                uint64_t tail = __atomic_load_n(&ctl->consumer.tail, __ATOMIC_ACQUIRE);
                if (DATA_SIZE - (head - tail) >= pad + size)
                    break;
                sched_yield();
            }
            if (pad != 0) {
                xenpmu_record_header header = { XENPMU_RECORD_PAD, (uint16_t)pad, 0 };
                memcpy(data + offset, &header, sizeof(header));
                head += pad;
                offset = 0;
            }
            memcpy(data + offset, record, size);
            head += size;
            __atomic_store_n(&ctl->producer.head, head, __ATOMIC_RELEASE);
        }
        __atomic_store_n(&done_round, round + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int check_sample(const xenpmu_record_header *rec, uint64_t sequence)
{
    static uint64_t chain[XENPMU_CALLCHAIN_MAX];
    xenpmu_ring_sample sample;
    uint32_t len = chain_len_of(sequence), i;
    int copied = xenpmu_ring_sample_get(rec, &sample, chain, XENPMU_CALLCHAIN_MAX);
    if (copied != (int)len || sample.sequence != sequence || sample.tsc != ~sequence ||
        sample.header.misc != (uint32_t)(sequence & XENPMU_RECORD_MISC_USER) ||
        sample.identity.vcpu_id != (uint32_t)sequence ||
        sample.identity.pcpu_id != (uint32_t)(sequence >> 32) ||
        sample.overflowed != sequence * 3 || sample.regs.rip != (sequence ^ 0x5555555555555555ull) ||
        sample.regs.rsp != sequence + 0x7ffe00000000ull ||
        sample.regs.r15 != sequence * 0x9e3779b97f4a7c15ull) {
        fprintf(stderr, "sample %" PRIu64 " read wrong (copied %d, sequence %" PRIu64 ")\n",
                sequence, copied, sample.sequence);
        return 1;
    }
    for (i = 0; i < len; i++) {
        if (chain[i] != chain_entry(sequence, i)) {
            fprintf(stderr, "sample %" PRIu64 ": chain entry %u torn\n", sequence, (unsigned)i);
            return 1;
        }
    }
    return 0;
}

static int check_lost(const xenpmu_record_header *rec, uint64_t sequence)
{
    xenpmu_ring_lost lost;
    if (xenpmu_ring_lost_get(rec, &lost) != 0 || lost.lost != sequence ||
        lost.sequence != sequence || lost.tsc != ~sequence) {
        fprintf(stderr, "lost record %" PRIu64 " read wrong (sequence %" PRIu64 ")\n", sequence,
                lost.sequence);
        return 1;
    }
    return 0;
}

/* A few microseconds of work the compiler cannot remove. */
static void dawdle(void)
{
    volatile unsigned spin;
    for (spin = 0; spin < 4000; spin++)
        ;
}

int main(void)
{
    pthread_t thread;
    uint64_t tail = 0, expected = 1, records = 0, lost = 0, wraps = 0, empty = 0;
    unsigned round = 0;
    unsigned char *area = (unsigned char *)aligned_alloc(4096, XENPMU_RING_CONTROL_SIZE + DATA_SIZE);
    if (area == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(area, 0, XENPMU_RING_CONTROL_SIZE + DATA_SIZE);
    ctl = (xenpmu_ring_control *)(void *)area;
    data = area + XENPMU_RING_CONTROL_SIZE;
    if (pthread_create(&thread, NULL, producer, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 1;
    }
    for (;;) {
        const xenpmu_record_header *rec;
        uint64_t head = xenpmu_ring_head_acquire(ctl), before = tail;
        int rc;
        while ((rc = xenpmu_ring_next(data, DATA_SIZE, XENPMU_RECORD_MAX, tail, head, &rec)) == 0) {
            if (rec->kind == XENPMU_RECORD_PAD) {
                wraps++;
            } else if (rec->kind == XENPMU_RECORD_LOST && expected % LOST_EVERY == 0) {
                if (check_lost(rec, expected))
                    return 1;
                lost++;
                expected++;
            } else if (rec->kind == XENPMU_RECORD_SAMPLE && expected % LOST_EVERY != 0) {
                if (check_sample(rec, expected))
                    return 1;
                records++;
                expected++;
            } else {
                fprintf(stderr, "record of kind %u where %" PRIu64 " was due\n",
                        (unsigned)rec->kind, expected);
                return 1;
            }
            tail += rec->size;
            /* Odd rounds hand each record back at once, so the producer writes right behind
             * the reader; and now and then the reader dawdles, so the ring fills and the
             * producer waits on the tail. */
            if (round % 2 == 1)
                xenpmu_ring_tail_release(ctl, tail);
            if (expected % 256 == 0)
                dawdle();
        }
        if (rc != XENPMU_RING_EMPTY) {
            fprintf(stderr, "xenpmu_ring_next: %d at tail 0x%016" PRIx64 " head 0x%016" PRIx64
                    " (round %u)\n", rc, tail, head, round);
            return 1;
        }
        xenpmu_ring_tail_release(ctl, tail);
        if (tail == before) {
            empty++;
            sched_yield();
        }
        /* Drained: at the end of a round, meet the producer and take the new positions. */
        if (__atomic_load_n(&done_round, __ATOMIC_ACQUIRE) == round + 1 &&
            xenpmu_ring_head_acquire(ctl) == tail) {
            round++;
            if (round == ROUNDS)
                break;
            __atomic_store_n(&ack_round, round, __ATOMIC_RELEASE);
            while (__atomic_load_n(&go_round, __ATOMIC_ACQUIRE) != round)
                sched_yield();
            tail = round_start(round);
        }
    }
    pthread_join(thread, NULL);
    if (expected != (uint64_t)ROUNDS * RECORDS_PER_ROUND + 1) {
        fprintf(stderr, "read %" PRIu64 " records of %u\n", expected - 1,
                ROUNDS * RECORDS_PER_ROUND);
        return 1;
    }
    printf("%" PRIu64 " records, %" PRIu64 " lost records, %" PRIu64 " wraps, %" PRIu64
           " empty polls\n", records + lost, lost, wraps, empty);
    free(area);
    return 0;
}
