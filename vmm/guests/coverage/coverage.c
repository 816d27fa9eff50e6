/* The guest side of `vpmu coverage`: two one-vCPU domains on one pCPU. Domain 0 (privileged)
 * reads the vPMU's code coverage through XENPMU_OP_COVERAGE (ABI 1.1) exactly as a profiling
 * domain would: GET_SIZE, a READ into a buffer one byte short (-ENOBUFS with the size needed),
 * a READ into a big enough buffer (the profile of everything run so far), RESET, and a second
 * READ (the profile right after the reset). Domain 1 (unprivileged) must get -EPERM. Results
 * go to `coverage_result` for the VMM, which takes the profiles out of the two buffers, and to
 * PASS/FAIL lines. In a hypervisor built without the feature, GET_SIZE is -EOPNOTSUPP and
 * that is all this guest reports. */
#include "rt.h"
#include "xenpmu.h"

#define BUFFER_SIZE 0x100000u /* two 1 MiB buffers at 2 MiB and 3 MiB of the 4 MiB of RAM */
#define FIRST_BUFFER 0x200000ul
#define SECOND_BUFFER 0x300000ul

/* Read by the VMM after the run (src/coverage/mod.rs mirrors the layout). */
volatile struct {
    i64 get_size;          /* GET_SIZE's return value */
    u64 size;              /* its OUT size */
    i64 short_read;        /* READ into size - 1 bytes */
    u64 short_needed;      /* its OUT size */
    i64 first_read;        /* READ into BUFFER_SIZE at FIRST_BUFFER */
    u64 first_size;        /* bytes written */
    i64 reset;             /* RESET */
    i64 second_read;       /* READ after the reset, at SECOND_BUFFER */
    u64 second_size;
    i64 unprivileged;      /* GET_SIZE from domain 1 */
    i64 bad_subop;         /* sub-operation 7 */
    u64 done;              /* 1 when domain 0 finished */
} coverage_result;

static i64 coverage(u32 subop, u64 buffer, u32 size, u64 *out_size) {
    xenpmu_coverage_params p = {{XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR}, buffer, size, subop};
    i64 r = hypercall(XENPMU_OP_COVERAGE, &p);
    if (out_size) *out_size = p.size;
    return r;
}

int main(u64 arg, u64 domain) {
    (void)arg;
    rt_init();
    if (domain != 0) {
        coverage_result.unprivileged = coverage(XENPMU_COVERAGE_GET_SIZE, 0, 0, 0);
        report_val("an unprivileged domain gets -EPERM", coverage_result.unprivileged == -XENPMU_EPERM,
                   (u64)-coverage_result.unprivileged, XENPMU_EPERM);
        return failures;
    }
    u64 size = 0;
    coverage_result.get_size = coverage(XENPMU_COVERAGE_GET_SIZE, 0, 0, &size);
    coverage_result.size = size;
    if (coverage_result.get_size == -XENPMU_EOPNOTSUPP) {
        puts("COVERAGE NOT BUILT IN\n");
        coverage_result.done = 1;
        return 0;
    }
    report_val("GET_SIZE succeeds", coverage_result.get_size == 0, (u64)-coverage_result.get_size, 0);
    report_val("the profile fits the buffer", size > 0 && size <= BUFFER_SIZE, size, BUFFER_SIZE);
    u64 needed = 0;
    coverage_result.short_read = coverage(XENPMU_COVERAGE_READ, FIRST_BUFFER, (u32)size - 1, &needed);
    coverage_result.short_needed = needed;
    report_val("a READ one byte short gives -ENOBUFS", coverage_result.short_read == -XENPMU_ENOBUFS,
               (u64)-coverage_result.short_read, XENPMU_ENOBUFS);
    report_val("... with the size needed", needed == size, needed, size);
    u64 written = 0;
    coverage_result.first_read = coverage(XENPMU_COVERAGE_READ, FIRST_BUFFER, BUFFER_SIZE, &written);
    coverage_result.first_size = written;
    report_val("READ succeeds", coverage_result.first_read == 0, (u64)-coverage_result.first_read, 0);
    report_val("READ writes the size GET_SIZE gave", written == size, written, size);
    coverage_result.reset = coverage(XENPMU_COVERAGE_RESET, 0, 0, 0);
    report_val("RESET succeeds", coverage_result.reset == 0, (u64)-coverage_result.reset, 0);
    coverage_result.second_read = coverage(XENPMU_COVERAGE_READ, SECOND_BUFFER, BUFFER_SIZE, &written);
    coverage_result.second_size = written;
    report_val("READ after RESET succeeds", coverage_result.second_read == 0,
               (u64)-coverage_result.second_read, 0);
    coverage_result.bad_subop = coverage(7, 0, 0, 0);
    report_val("an unknown sub-operation gives -EINVAL", coverage_result.bad_subop == -XENPMU_EINVAL,
               (u64)-coverage_result.bad_subop, XENPMU_EINVAL);
    coverage_result.done = 1;
    return failures;
}
