/* docs/abi.md "Memory ordering", as a consumer meets it: a writer thread plays the hypervisor,
 * bumping dropped_samples with one 64-bit atomic store per value across a carry into the high
 * half each time, while the reader plays a consumer in the cached window and reads it with
 * xenpmu_dropped_samples_read(). Every value the reader sees must be one the writer stored and
 * never smaller than the one before: a torn read (new high, old low) is larger than the next
 * value, so the following read goes backwards. Also checks xenpmu_flags_acquire() returns the
 * flags word. Prints the number of reads and exits 0, or names the first torn value. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "xenpmu.h"

static xenpmu_page page __attribute__((aligned(4096)));
static volatile int done;

#define CARRIES 2000000u

static void *writer(void *arg)
{
    uint32_t high;
    (void)arg;
    for (high = 0; high < CARRIES; high++) {
        __atomic_store_n(&page.dropped_samples, ((uint64_t)high << 32) | 0xffffffffu, __ATOMIC_RELEASE);
        __atomic_store_n(&page.dropped_samples, (uint64_t)(high + 1) << 32, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    return NULL;
}

int main(void)
{
    pthread_t thread;
    uint64_t last = 0, reads = 0;
    memset(&page, 0, sizeof(page));
    page.pmu_flags = XENPMU_FLAG_CACHED;
    if (xenpmu_flags_acquire(&page) != XENPMU_FLAG_CACHED) {
        fprintf(stderr, "xenpmu_flags_acquire: wrong value\n");
        return 1;
    }
    if (pthread_create(&thread, NULL, writer, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 1;
    }
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        uint64_t value = xenpmu_dropped_samples_read(&page);
        uint32_t low = (uint32_t)value;
        reads++;
        if ((low != 0 && low != 0xffffffffu) || value < last) {
            fprintf(stderr, "torn read: 0x%016" PRIx64 " after 0x%016" PRIx64 " (read %" PRIu64 ")\n",
                    value, last, reads);
            return 1;
        }
        last = value;
    }
    pthread_join(thread, NULL);
    if (xenpmu_dropped_samples_read(&page) != (uint64_t)CARRIES << 32) {
        fprintf(stderr, "final value wrong\n");
        return 1;
    }
    printf("%" PRIu64 "\n", reads);
    return 0;
}
