
/*
 * The sample ring (version 1.4, docs/abi.md "The sample ring"). A consumer checks the ring's
 * description once with xenpmu_ring_info_check(), then, at each wakeup:
 *
 *     uint64_t head = xenpmu_ring_head_acquire(ctl), tail = <its own copy of the tail>;
 *     const xenpmu_record_header *rec;
 *     int rc;
 *     while ((rc = xenpmu_ring_next(data, info.data_size, info.record_max, tail, head, &rec)) == 0) {
 *         ... xenpmu_ring_sample_get(rec, ...) or xenpmu_ring_lost_get(rec, ...) by rec->kind ...
 *         tail += rec->size;
 *     }
 *     if (rc != XENPMU_RING_EMPTY) tail = head;  (a corrupt ring: resynchronize, count it)
 *     xenpmu_ring_tail_release(ctl, tail);
 *
 * xenpmu_ring_next() refuses exactly what Rust's vpmu_abi::next_record() refuses, with the same
 * XENPMU_CHECK_* code; the record bytes are read with copies, never through casts to structs.
 */

/* 0 or the XENPMU_CHECK_RING_* code of the first rule ctl->info breaks, in this order: magic,
 * version (this major, minor 4 or later), data_offset (4096), data_size (a power of two from
 * one page to XENPMU_RING_MAX_DATA_PAGES pages), record_max (a multiple of 8 from
 * XENPMU_RING_RECORD_MAX_MIN to XENPMU_RING_RECORD_MAX_MAX, at most data_size), wakeup_bytes
 * (1 to data_size). xenpmu_verdict_errno() turns the code into an errno. */
static inline int xenpmu_ring_info_check(const xenpmu_ring_control *ctl)
{
    xenpmu_ring_info info;
    XENPMU_MEMCPY(&info, &ctl->info, sizeof(info));
    if (info.magic != XENPMU_RING_MAGIC)
        return XENPMU_CHECK_RING_BAD_MAGIC;
    if (info.version_major != XENPMU_VERSION_MAJOR || info.version_minor < 4)
        return XENPMU_CHECK_RING_VERSION;
    if (info.data_offset != XENPMU_RING_CONTROL_SIZE)
        return XENPMU_CHECK_RING_DATA_OFFSET;
    if (info.data_size < XENPMU_RING_PAGE_SIZE ||
        info.data_size > XENPMU_RING_MAX_DATA_PAGES * XENPMU_RING_PAGE_SIZE ||
        (info.data_size & (info.data_size - 1)) != 0)
        return XENPMU_CHECK_RING_DATA_SIZE;
    if ((info.record_max % 8) != 0 || info.record_max < XENPMU_RING_RECORD_MAX_MIN ||
        info.record_max > XENPMU_RING_RECORD_MAX_MAX || info.record_max > info.data_size)
        return XENPMU_CHECK_RING_RECORD_MAX;
    if (info.wakeup_bytes == 0 || info.wakeup_bytes > info.data_size)
        return XENPMU_CHECK_RING_WAKEUP;
    return 0;
}

/* The data area of a ring whose info passed xenpmu_ring_info_check() (info.data_offset bytes
 * from the control page), or a null pointer if it does not pass. */
static inline const void *xenpmu_ring_data(const xenpmu_ring_control *ctl)
{
    if (xenpmu_ring_info_check(ctl) != 0)
        return NULL;
    return (const char *)ctl + XENPMU_RING_CONTROL_SIZE;
}

/*
 * head and tail are single-copy-atomic 64-bit accesses at both widths (docs/abi.md "Memory
 * ordering", the ring). x86-64: one aligned 8-byte load or store. i386: `lock cmpxchg8b`, as
 * Linux's atomic64_read()/atomic64_set() do on 32-bit x86 (gcc's __atomic builtins would use
 * the x87 there, which a kernel built with -msoft-float has not, and fall back to a libatomic
 * call). The load compares with and stores back 0 only when the word is 0, which leaves it
 * unchanged; the word must be in writable memory (the control page is). Other compilers for
 * 32-bit x86 get neither helper: they cannot make one 8-byte access portably.
 */
#if defined(__x86_64__) || defined(_M_X64)
#define XENPMU_RING_ATOMIC64 1
static inline uint64_t xenpmu_load64_acquire(const volatile uint64_t *word)
{
    uint64_t value = *word;
    XENPMU_COMPILER_BARRIER();
    return value;
}

static inline void xenpmu_store64_release(volatile uint64_t *word, uint64_t value)
{
    XENPMU_COMPILER_BARRIER();
    *word = value;
}
#elif defined(__i386__) && (defined(__GNUC__) || defined(__clang__))
#define XENPMU_RING_ATOMIC64 1
static inline uint64_t xenpmu_load64_acquire(const volatile uint64_t *word)
{
    uint64_t value;
    /* edx:eax = ecx:ebx = 0: if the word is 0 it is "replaced" by 0, else it is loaded into
     * edx:eax; either way edx:eax holds it, read in one locked 8-byte access. */
    __asm__ __volatile__("lock; cmpxchg8b %1"
                         : "=A"(value)
                         : "m"(*word), "0"((uint64_t)0), "b"(0u), "c"(0u)
                         : "memory", "cc");
    return value;
}

static inline void xenpmu_store64_release(volatile uint64_t *word, uint64_t value)
{
    /* Any first guess of the old value will do (even a torn one): a failed cmpxchg8b loads the
     * current value into edx:eax and the loop retries with it. */
    uint64_t old = *word;
    __asm__ __volatile__("1: lock; cmpxchg8b %0\n\tjne 1b"
                         : "+m"(*word), "+A"(old)
                         : "b"((uint32_t)value), "c"((uint32_t)(value >> 32))
                         : "memory", "cc");
}
#endif

#ifdef XENPMU_RING_ATOMIC64
/* producer.head with acquire semantics, in one 8-byte access: read the records below it only
 * after this. */
static inline uint64_t xenpmu_ring_head_acquire(const xenpmu_ring_control *ctl)
{
    return xenpmu_load64_acquire(&ctl->producer.head);
}

/* Stores consumer.tail with release semantics, in one 8-byte access: every read of the records
 * below `tail` happens before the hypervisor can see the store and reuse their bytes. */
static inline void xenpmu_ring_tail_release(xenpmu_ring_control *ctl, uint64_t tail)
{
    xenpmu_store64_release(&ctl->consumer.tail, tail);
}
#endif

/* The record at `tail` of the data area `data` (data_size bytes, record_max from the ring's
 * info; tail and head as the consumer holds them): 0 with *record pointing at it (its
 * header.size bytes are inside the data area and below head, and it passed every check of its
 * kind), XENPMU_RING_EMPTY when tail == head, or the XENPMU_CHECK_* code of the first rule
 * broken (*record is then NULL). The checks and their order are Rust's next_record()'s: the
 * data size (a power of two, 8 bytes to XENPMU_RING_MAX_DATA_PAGES pages), tail and head
 * multiples of 8, empty, tail ahead of head, tail more than data_size behind, then the record:
 * kind 0, size not a multiple of 8, below 8, above record_max, past the end of the area, past
 * head; a sample's size against 224 + 8 * chain_len and chain_len against
 * XENPMU_CALLCHAIN_MAX; a lost record's size (32); a PAD that stops before the end. Kinds
 * above XENPMU_RECORD_PAD are returned (skip them by size). */
static inline int xenpmu_ring_next(const void *data, uint32_t data_size, uint32_t record_max,
                                   uint64_t tail, uint64_t head,
                                   const xenpmu_record_header **record)
{
    const unsigned char *bytes = (const unsigned char *)data;
    xenpmu_record_header header;
    uint64_t unread;
    uint32_t offset, chain_len;
    *record = NULL;
    if (data_size < XENPMU_RECORD_ALIGN ||
        data_size > XENPMU_RING_MAX_DATA_PAGES * XENPMU_RING_PAGE_SIZE ||
        (data_size & (data_size - 1)) != 0)
        return XENPMU_CHECK_RING_GEOMETRY;
    if (((tail | head) % XENPMU_RECORD_ALIGN) != 0)
        return XENPMU_CHECK_RING_MISALIGNED;
    if (tail == head)
        return XENPMU_RING_EMPTY;
    unread = head - tail;
    if (unread >= ((uint64_t)1 << 63))
        return XENPMU_CHECK_RING_TAIL_AHEAD;
    if (unread > data_size)
        return XENPMU_CHECK_RING_TAIL_BEHIND;
    offset = (uint32_t)(tail & (data_size - 1));
    XENPMU_MEMCPY(&header, bytes + offset, sizeof(header));
    if (header.kind == 0)
        return XENPMU_CHECK_RECORD_KIND_ZERO;
    if ((header.size % XENPMU_RECORD_ALIGN) != 0)
        return XENPMU_CHECK_RECORD_SIZE_UNALIGNED;
    if (header.size < XENPMU_RECORD_ALIGN)
        return XENPMU_CHECK_RECORD_TOO_SMALL;
    if (header.size > record_max)
        return XENPMU_CHECK_RECORD_TOO_LARGE;
    if (header.size > data_size - offset)
        return XENPMU_CHECK_RECORD_PAST_END;
    if (header.size > unread)
        return XENPMU_CHECK_RECORD_PAST_HEAD;
    if (header.kind == XENPMU_RECORD_SAMPLE) {
        if (header.size < XENPMU_RING_SAMPLE_SIZE)
            return XENPMU_CHECK_SAMPLE_SIZE;
        XENPMU_MEMCPY(&chain_len, bytes + offset + offsetof(xenpmu_ring_sample, chain_len),
                      sizeof(chain_len));
        if (chain_len > XENPMU_CALLCHAIN_MAX)
            return XENPMU_CHECK_SAMPLE_CHAIN_LEN;
        if (header.size != XENPMU_RING_SAMPLE_SIZE + 8 * chain_len)
            return XENPMU_CHECK_SAMPLE_SIZE;
    } else if (header.kind == XENPMU_RECORD_LOST) {
        if (header.size != sizeof(xenpmu_ring_lost))
            return XENPMU_CHECK_LOST_SIZE;
    } else if (header.kind == XENPMU_RECORD_PAD) {
        if (offset + header.size != data_size)
            return XENPMU_CHECK_PAD_SHORT;
    }
    *record = (const xenpmu_record_header *)(const void *)(bytes + offset);
    return 0;
}

/* Copies the sample record `rec` (from xenpmu_ring_next()) out: its fixed part into *out and
 * the first min(chain_len, chain_cap) call-chain entries into chain[]. Returns the number of
 * entries copied, or -XENPMU_EINVAL (and *out zeroed) if the copy is not a valid sample
 * record: another kind, chain_len above XENPMU_CALLCHAIN_MAX, or a size other than
 * 224 + 8 * chain_len. The copy is what is checked, so a record that changed after
 * xenpmu_ring_next() looked at it cannot make this read past it. */
static inline int xenpmu_ring_sample_get(const xenpmu_record_header *rec, xenpmu_ring_sample *out,
                                         uint64_t *chain, uint32_t chain_cap)
{
    xenpmu_record_header header;
    uint32_t copied;
    XENPMU_MEMCPY(&header, rec, sizeof(header));
    XENPMU_MEMSET(out, 0, sizeof(*out));
    if (header.kind != XENPMU_RECORD_SAMPLE || header.size < XENPMU_RING_SAMPLE_SIZE)
        return -XENPMU_EINVAL;
    XENPMU_MEMCPY(out, rec, sizeof(*out));
    if (out->header.kind != header.kind || out->header.size != header.size ||
        out->chain_len > XENPMU_CALLCHAIN_MAX ||
        header.size != XENPMU_RING_SAMPLE_SIZE + 8 * out->chain_len) {
        XENPMU_MEMSET(out, 0, sizeof(*out));
        return -XENPMU_EINVAL;
    }
    copied = out->chain_len < chain_cap ? out->chain_len : chain_cap;
    if (copied != 0)
        XENPMU_MEMCPY(chain, (const unsigned char *)rec + XENPMU_RING_SAMPLE_SIZE, 8 * (size_t)copied);
    return (int)copied;
}

/* Copies the lost record `rec` (from xenpmu_ring_next()) into *out: 0, or -XENPMU_EINVAL (and
 * *out zeroed) if the copy is not a lost record of 32 bytes. */
static inline int xenpmu_ring_lost_get(const xenpmu_record_header *rec, xenpmu_ring_lost *out)
{
    xenpmu_record_header header;
    XENPMU_MEMCPY(&header, rec, sizeof(header));
    XENPMU_MEMSET(out, 0, sizeof(*out));
    if (header.kind != XENPMU_RECORD_LOST || header.size != sizeof(*out))
        return -XENPMU_EINVAL;
    XENPMU_MEMCPY(out, rec, sizeof(*out));
    if (out->header.kind != header.kind || out->header.size != header.size) {
        XENPMU_MEMSET(out, 0, sizeof(*out));
        return -XENPMU_EINVAL;
    }
    return 0;
}
