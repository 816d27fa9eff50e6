/* A hostile workload domain for `vpmu profile --guest FILE` (and the machine-level test of
 * vmm/cli/tests/profile_hostile.rs): an unprivileged guest that spends its whole run attacking
 * the xenpmu interface from inside what a guest may do (docs/abi.md: the check order, the
 * transport's checks, the page, the ring), on every vCPU, in a loop, with some CPL3 work in
 * every round so that it gets sampled. It has no `profile_config`: `vpmu profile` profiles it
 * passively (all mode), where it has no vPMU at all.
 *
 * Every outcome is counted per class in `hostile_stats` (one entry per vCPU). An outcome the
 * specification says is impossible (a privileged operation succeeding, a reserved bit or an
 * absent counter accepted, a PMU register reachable in all mode, a record written while the
 * tail was impossible, a malformed record below the head, a failed operation that changed
 * the ring's control page) is a VIOLATION: the vCPU prints it on its console and writes exit
 * status HOSTILE_VIOLATION, so the run that hosted it fails (`vpmu profile`: "domain D vCPU V
 * exited with status ..." and exit 1).
 *
 * In self mode (the machine's first) it waits, working at CPL3, until the mode changes: in
 * `vpmu profile` the profiler's MODE_SET(all) must come first (a vPMU in use would make it
 * fail with -EBUSY, which the specification allows: that race is not the attack).
 *
 * Entry: RSI = the domain, RDI = the run: bits 31-0 the rounds per vCPU (0: until the machine
 * stops it, as `vpmu profile` does), bits 39-32 a mode (XENPMU_MODE_*) for the machine test:
 * domain 0, the privileged one there, sets it and exits 0; the other domains wait until
 * MODE_GET reports it before they attack. In `vpmu profile` this program is never domain 0. */
#include "hostile.h"

struct hostile_stats hostile_stats[MAX_CPUS];
struct pmu_shape hostile_pmu;
/* Per vCPU: #GPs seen by this program's handler, and whether a CPL3 #GP is expected. */
volatile u64 hostile_faults[MAX_CPUS];
volatile u64 hostile_user_expect[MAX_CPUS];

static u8 hostile_stack[MAX_CPUS][16384] __attribute__((aligned(16)));

__attribute__((noreturn)) void violation(u32 cpu, const char *what, u64 got, u64 want) {
    hostile_stats[cpu].violations++;
    puts("hostile: VIOLATION cpu ");
    put_dec(cpu);
    puts(": ");
    puts(what);
    puts(" (got ");
    put_hex(got);
    puts(", want ");
    put_hex(want);
    puts(")\n");
    outl(PORT_EXIT, HOSTILE_VIOLATION);
    for (;;) __asm__ volatile("cli; hlt");
}

/* #GP: counted per vCPU; the faulting RDMSR/WRMSR/RDPMC (2 bytes) is skipped. At CPL3 only
 * while the CPL3 part expects one (its RDPMCs); any other #GP there ends the run. */
__attribute__((interrupt)) static void hostile_gp(struct iframe *f, u64 err) {
    (void)err;
    u32 cpu = cpu_id();
    if ((f->cs & 3) == 3 && !hostile_user_expect[cpu]) {
        puts("hostile: unexpected #GP at CPL3 at ");
        put_hex(f->ip);
        puts("\n");
        outl(PORT_EXIT, FATAL_STATUS);
    }
    hostile_faults[cpu]++;
    f->ip += 2;
}

/* Every vCPU runs rt_init, which writes every gate with the runtime's handlers: a vCPU that
 * starts late may briefly put the runtime's #GP handler back under another vCPU's attack. So
 * the gate is set again before each attack, and an access counts as faulted if either
 * handler saw a fault (the runtime's counts into the shared gp_faults). A fault is a
 * violation only if this program's handler saw it on this vCPU, and a missing fault only if
 * no handler saw any: a fault taken by the other handler is never misread. */
void own_gate(void) { set_gate(13, (void *)hostile_gp); }

int msr_access(u32 cpu, int write, u32 msr, u64 value, int *sure) {
    u64 mine = hostile_faults[cpu], theirs = gp_faults;
    u32 lo = (u32)value, hi = (u32)(value >> 32);
    if (write)
        __asm__ volatile("wrmsr" ::"a"(lo), "d"(hi), "c"(msr) : "memory");
    else
        __asm__ volatile("rdmsr" : "+a"(lo), "+d"(hi) : "c"(msr) : "memory");
    *sure = hostile_faults[cpu] != mine;
    return *sure || gp_faults != theirs;
}

/* A PMU register access that must fault. */
void must_fault(u32 cpu, const char *what, int write, u32 msr, u64 value) {
    int sure;
    if (!msr_access(cpu, write, msr, value, &sure)) violation(cpu, what, msr, value);
    hostile_stats[cpu].msr_gp++;
}

/* A PMU register access the mode allows: must not fault in self/hv mode, must in all mode
 * (an unprivileged domain has no vPMU there). */
void by_mode(u32 cpu, const char *what, int write, u32 msr, u64 value) {
    if (hostile_pmu.mode == XENPMU_MODE_ALL) {
        must_fault(cpu, what, write, msr, value);
        return;
    }
    int sure;
    int faulted = msr_access(cpu, write, msr, value, &sure);
    if (sure) violation(cpu, what, msr, value);
    if (faulted)
        hostile_stats[cpu].msr_ambiguous++;
    else
        hostile_stats[cpu].msr_ok++;
}

i64 op(u32 nr, u64 val, u32 vcpu, u32 major, u32 pad) {
    xenpmu_params p = {{major, 4}, val, vcpu, pad};
    return hypercall(nr, &p);
}

/* One operation whose answer must be one of `want` (a 0-terminated list of errnos,
 * positive; XENPMU_OK for 0). */
void expect(u32 cpu, const char *what, i64 got, const i64 *want) {
    for (; *want; want++)
        if (got == (*want == XENPMU_OK ? 0 : -*want)) {
            hostile_stats[cpu].op_expected++;
            return;
        }
    violation(cpu, what, (u64)got, want[-1] == XENPMU_OK ? 0 : (u64)-want[-1]);
}


/* A raw call through the transport with the registers as given (RAX, RDI, RSI). */
static i64 raw(u64 rax, u64 rdi, u64 rsi) {
    u64 flags;
    __asm__ volatile("pushfq; popq %0; cli" : "=r"(flags)::"memory");
    u64 r = xenpmu_call_raw((u16)xenpmu_transport.port, rax, rdi, rsi);
    __asm__ volatile("pushq %0; popfq" ::"r"(flags) : "memory", "cc");
    return (i64)(int)(u32)r;
}

/* A block that crosses a page boundary (the transport's check 5). */
static u8 straddle[2][4096] __attribute__((aligned(4096)));

/* The operations an unprivileged domain may not make, or makes wrongly, in any mode. */
static void attack_operations(u32 cpu) {
    int all = hostile_pmu.mode == XENPMU_MODE_ALL;
    EXPECT(cpu, "MODE_SET to the current mode", op(XENPMU_OP_MODE_SET, hostile_pmu.mode, 0, 1, 0),
           XENPMU_EPERM);
    EXPECT(cpu, "MODE_SET all", op(XENPMU_OP_MODE_SET, XENPMU_MODE_ALL, 0, 1, 0), XENPMU_EPERM);
    EXPECT(cpu, "MODE_SET two modes", op(XENPMU_OP_MODE_SET, 3, 0, 1, 0), XENPMU_EPERM);
    EXPECT(cpu, "MODE_SET off", op(XENPMU_OP_MODE_SET, XENPMU_MODE_OFF, 0, 1, 0), XENPMU_EPERM);
    EXPECT(cpu, "MODE_SET major 2", op(XENPMU_OP_MODE_SET, XENPMU_MODE_ALL, 0, 2, 0),
           XENPMU_EPROTONOSUPPORT);
    EXPECT(cpu, "FEATURE_SET 0", op(XENPMU_OP_FEATURE_SET, 0, 0, 1, 0), XENPMU_EPERM);
    EXPECT(cpu, "FEATURE_SET all bits", op(XENPMU_OP_FEATURE_SET, ~0ul, 0, 1, 0), XENPMU_EPERM);
    /* Not built in (-EOPNOTSUPP, step 1) or not allowed (-EPERM, step 3). */
    EXPECT(cpu, "COVERAGE", op(XENPMU_OP_COVERAGE, 0, 0, 1, 0), XENPMU_EPERM, XENPMU_EOPNOTSUPP);
    EXPECT(cpu, "operation 11", op(XENPMU_OP_COUNT, 0, 0, 1, 0), XENPMU_EOPNOTSUPP);
    EXPECT(cpu, "operation 2^32-1", op(0xffffffffu, 0, 0, 1, 0), XENPMU_EOPNOTSUPP);
    u32 port_ok = xenpmu_transport.flags & XENPMU_TRANSPORT_IO_PORT;
    if (port_ok) {
        xenpmu_params *block = (xenpmu_params *)&straddle[1][0];
        *block = (xenpmu_params){{1, 4}, XENPMU_MODE_ALL, 0, 0};
        /* RDI above 2^32 - 1 is not cut to MODE_GET; RAX's upper half counts. */
        EXPECT(cpu, "RDI 2^32", raw(XENPMU_HYPERCALL_NR, 1ul << 32, (u64)block), XENPMU_EOPNOTSUPP);
        EXPECT(cpu, "RAX 41", raw(XENPMU_HYPERCALL_NR + 1, XENPMU_OP_MODE_GET, (u64)block),
               XENPMU_ENOSYS);
        EXPECT(cpu, "RAX 2^32 + 40", raw((1ul << 32) | XENPMU_HYPERCALL_NR, 0, (u64)block),
               XENPMU_ENOSYS);
        /* The block outside RAM (4 MiB), at the LAPIC, wrapping, across a page: -EFAULT
         * before the privilege check. */
        static const u64 outside[] = {0x400000ul, 0xfee00000ul, ~0ul - 7, 0x3ffff0ul,
                                      (u64)&straddle[1][0] - 8};
        for (u32 i = 0; i < sizeof(outside) / sizeof(outside[0]); i++)
            EXPECT(cpu, "block outside RAM or across a page",
                   raw(XENPMU_HYPERCALL_NR, XENPMU_OP_MODE_SET, outside[i]), XENPMU_EFAULT);
    }
    EXPECT(cpu, "MODE_GET vcpu 1", op(XENPMU_OP_MODE_GET, 0, 1, 1, 0), XENPMU_EINVAL);
    EXPECT(cpu, "MODE_GET pad", op(XENPMU_OP_MODE_GET, 0, 0, 1, 1), XENPMU_EINVAL);
    EXPECT(cpu, "FLUSH val 1", op(XENPMU_OP_FLUSH, 1, 0, 1, 0), XENPMU_EINVAL);
    EXPECT(cpu, "LVTPC_SET val 1", op(XENPMU_OP_LVTPC_SET, 1, 0, 1, 0), XENPMU_EINVAL);
    EXPECT(cpu, "RING_FINISH val 1", op(XENPMU_OP_RING_FINISH, 1, cpu, 1, 0), XENPMU_EINVAL);
    /* Without a page (none yet this round; in all mode none ever). */
    EXPECT(cpu, "FINISH without INIT", op(XENPMU_OP_FINISH, 0, cpu, 1, 0), XENPMU_ENOENT);
    EXPECT(cpu, "RING_FINISH without RING_INIT", op(XENPMU_OP_RING_FINISH, 0, cpu, 1, 0),
           XENPMU_ENOENT);
    EXPECT(cpu, "LVTPC_SET without INIT", op(XENPMU_OP_LVTPC_SET, 0, 0, 1, 0), XENPMU_ENOENT);
    EXPECT(cpu, "FLUSH without INIT", op(XENPMU_OP_FLUSH, 0, 0, 1, 0), XENPMU_ENOENT);
    /* Bad frames and vCPUs: -EINVAL (arguments); in all mode the missing vPMU may answer
     * first (-ENOENT). */
    static const u64 frames[] = {0x400, 0xfee00, 1ul << 52, ~0ul};
    for (u32 i = 0; i < sizeof(frames) / sizeof(frames[0]); i++) {
        if (all) {
            EXPECT(cpu, "INIT frame outside RAM", op(XENPMU_OP_INIT, frames[i], cpu, 1, 0),
                   XENPMU_EINVAL, XENPMU_ENOENT);
            EXPECT(cpu, "RING_INIT frame outside RAM",
                   op(XENPMU_OP_RING_INIT, frames[i], cpu, 1, 0), XENPMU_EINVAL, XENPMU_ENOENT);
        } else {
            EXPECT(cpu, "INIT frame outside RAM", op(XENPMU_OP_INIT, frames[i], cpu, 1, 0),
                   XENPMU_EINVAL);
            EXPECT(cpu, "RING_INIT frame outside RAM",
                   op(XENPMU_OP_RING_INIT, frames[i], cpu, 1, 0), XENPMU_EINVAL, XENPMU_ENOENT);
        }
    }
    if (all)
        EXPECT(cpu, "INIT vcpu 200", op(XENPMU_OP_INIT, hostile_page_frame(cpu), 200, 1, 0),
               XENPMU_EINVAL, XENPMU_ENOENT);
    else
        EXPECT(cpu, "INIT vcpu 200", op(XENPMU_OP_INIT, hostile_page_frame(cpu), 200, 1, 0),
               XENPMU_EINVAL);
    /* In all mode an unprivileged domain has no vPMU: a good INIT is refused too. */
    if (all)
        EXPECT(cpu, "INIT in all mode", op(XENPMU_OP_INIT, hostile_page_frame(cpu), cpu, 1, 0),
               XENPMU_ENOENT);
}

/* PMU registers: reserved bits and absent counters fault in every mode; in all mode every
 * PMU register faults (no vPMU); DEBUGCTL's branch bits are counted, whatever the answer. */
static void attack_msrs(u32 cpu) {
    struct pmu_shape *s = &hostile_pmu;
    u64 cycles = s->intel ? 0x3c : 0x76;
    u64 sel = cycles | USR | OS | INT | EN;
    if (s->gp) {
        must_fault(cpu, "event select bit 63", 1, pmu_ctl(0), sel | 1ul << 63);
        must_fault(cpu, "event select bit 50", 1, pmu_ctl(0), sel | 1ul << 50);
        if (s->intel) must_fault(cpu, "event select AnyThread", 1, pmu_ctl(0), sel | 1ul << 21);
        by_mode(cpu, "event select read", 0, pmu_ctl(0), 0);
    }
    if (s->gp < s->max_gp) {
        must_fault(cpu, "absent counter's event select", 1, pmu_ctl(s->gp), sel);
        must_fault(cpu, "absent counter", 1, pmu_ctr(s->gp), 1);
        must_fault(cpu, "absent counter read", 0, pmu_ctr(s->gp), 0);
    }
    if (s->global) {
        u32 ctrl = s->intel ? INTEL_GLOBAL_CTRL : AMD_GLOBAL_CTL;
        must_fault(cpu, "global ctrl bit 63", 1, ctrl, 1ul << 63);
        if (s->gp < 31) must_fault(cpu, "global ctrl above the counters", 1, ctrl, 1ul << 31);
        if (s->intel && s->fixed < 16)
            must_fault(cpu, "global ctrl above the fixed counters", 1, ctrl,
                       1ul << (32 + s->fixed));
        u32 status = s->intel ? INTEL_GLOBAL_STATUS : AMD_GLOBAL_STATUS;
        must_fault(cpu, "global status write", 1, status, 1);
        by_mode(cpu, "global ctrl off", 1, ctrl, 0);
    }
    if (s->intel && s->fixed) {
        must_fault(cpu, "fixed ctrl AnyThread", 1, INTEL_FIXED_CTR_CTRL, 1ul << 2);
        if (s->fixed < 16)
            must_fault(cpu, "fixed ctrl above the fixed counters", 1, INTEL_FIXED_CTR_CTRL,
                       1ul << (4 * s->fixed));
        must_fault(cpu, "fixed ctrl bit 63", 1, INTEL_FIXED_CTR_CTRL, 1ul << 63);
    }
    /* IA32_DEBUGCTL: LBR (bit 0), BTF (1), TR (6), BTS (7): not the vPMU's; whatever the VMM
     * does, it must survive it. Restored to 0 when a write was taken. */
    for (u32 bit = 0; bit < 8; bit++) {
        if (bit >= 2 && bit < 6) continue;
        int sure;
        if (msr_access(cpu, 1, IA32_DEBUGCTL, 1ul << bit, &sure)) {
            hostile_stats[cpu].debugctl_gp++;
        } else {
            hostile_stats[cpu].debugctl_ok++;
            msr_access(cpu, 1, IA32_DEBUGCTL, 0, &sure);
        }
    }
    /* CPL0 RDPMC: an absent counter faults; a present one only where there is no vPMU. */
    u64 mine = hostile_faults[cpu], theirs = gp_faults;
    u32 lo, hi;
    __asm__ volatile("rdpmc" : "=a"(lo), "=d"(hi) : "c"(s->intel ? s->gp : 0x12345u) : "memory");
    if (hostile_faults[cpu] == mine && gp_faults == theirs)
        violation(cpu, "CPL0 RDPMC of an absent counter", (u64)hi << 32 | lo, 0);
    hostile_stats[cpu].rdpmc_gp++;
}

/* CPL3 (arg = the vCPU): the work that gets sampled, and RDPMCs, each of which must fault
 * (CR4.PCE is clear: no counter is readable at CPL3, present or absent). */
__attribute__((noinline)) void hostile_spin(u64 n) {
    __asm__ volatile("1: dec %0; jnz 1b" : "+r"(n));
}

__attribute__((noinline)) void hostile_churn(u64 n) {
    __asm__ volatile("1: dec %0; jnz 1b" : "+r"(n));
}

static u64 hostile_user(u64 cpu) {
    static const u32 selectors[] = {0, 1, 31, 0x40000000u, 0x40000003u, 0x12345u, ~0u};
    u64 missed = 0;
    for (u32 i = 0; i < sizeof(selectors) / sizeof(selectors[0]); i++) {
        u64 mine = hostile_faults[cpu], theirs = gp_faults;
        u32 lo, hi;
        __asm__ volatile("rdpmc" : "=a"(lo), "=d"(hi) : "c"(selectors[i]) : "memory");
        if (hostile_faults[cpu] == mine && gp_faults == theirs) missed |= 1ul << i;
    }
    hostile_spin(60000);
    hostile_churn(20000);
    return missed;
}

/* Runs the CPL3 part; `work` spins once more after it (the flood's window). */
void user_part(u32 cpu) {
    hostile_user_expect[cpu] = 1;
    u64 missed = user_call(hostile_user, cpu, hostile_stack[cpu] + sizeof(hostile_stack[0]));
    hostile_user_expect[cpu] = 0;
    if (missed) violation(cpu, "CPL3 RDPMC did not fault (selector bit set)", missed, 0);
    hostile_stats[cpu].rdpmc_gp += 7;
    hostile_stats[cpu].work_rounds++;
}

static void detect_pmu(void) {
    struct pmu_shape *s = &hostile_pmu;
    u32 a, b, c, d;
    cpuid(0, 0, &a, &b, &c, &d);
    s->intel = b == 0x756e6547; /* "Genu" */
    if (s->intel) {
        cpuid(0xa, 0, &a, &b, &c, &d);
        s->gp = (a >> 8) & 0xff;
        s->width = (a >> 16) & 0xff;
        s->fixed = d & 0x1f;
        s->global = (a & 0xff) >= 2;
        s->max_gp = 8;
    } else {
        cpuid(0x80000001, 0, &a, &b, &c, &d);
        int ext = (c >> 23) & 1;
        cpuid(0x80000000, 0, &a, &b, &c, &d);
        if (a >= 0x80000022) {
            cpuid(0x80000022, 0, &a, &b, &c, &d);
            s->global = a & 1;
            if (s->global) s->gp = b & 0xf;
        }
        if (!s->global) s->gp = ext ? 6 : 4;
        s->amd_ext = ext || s->global;
        s->max_gp = s->amd_ext ? 6 : 4;
        s->width = 48;
    }
}

u32 pmu_ctl(u32 i) {
    struct pmu_shape *s = &hostile_pmu;
    return s->intel ? INTEL_EVTSEL0 + i : s->amd_ext ? AMD_CTL0 + 2 * i : AMD_K7_CTL0 + i;
}

u32 pmu_ctr(u32 i) {
    struct pmu_shape *s = &hostile_pmu;
    return s->intel ? INTEL_PMC0 + i : s->amd_ext ? AMD_CTL0 + 2 * i + 1 : AMD_K7_CTR0 + i;
}

static u64 mode_get(u32 cpu) {
    xenpmu_params p = {{1, 4}, 0, 0, 0};
    i64 rc = hypercall(XENPMU_OP_MODE_GET, &p);
    if (rc != 0) violation(cpu, "MODE_GET failed", (u64)rc, 0);
    if (p.version.major != 1) violation(cpu, "MODE_GET's major", p.version.major, 1);
    return p.val;
}

static void summary(u32 cpu) {
    struct hostile_stats *h = &hostile_stats[cpu];
    puts("hostile: cpu ");
    put_dec(cpu);
    puts(" mode ");
    put_dec(hostile_pmu.mode);
    puts(" rounds ");
    put_dec(h->rounds);
    puts(" ops ");
    put_dec(h->op_expected);
    puts(" msr_gp ");
    put_dec(h->msr_gp);
    puts(" msr_ok ");
    put_dec(h->msr_ok);
    puts(" msr_ambiguous ");
    put_dec(h->msr_ambiguous);
    puts(" debugctl_gp ");
    put_dec(h->debugctl_gp);
    puts(" debugctl_ok ");
    put_dec(h->debugctl_ok);
    puts(" rdpmc_gp ");
    put_dec(h->rdpmc_gp);
    puts(" rings ");
    put_dec(h->rings);
    puts(" ring_refused ");
    put_dec(h->ring_refused);
    puts(" tail_attacks ");
    put_dec(h->tail_attacks);
    puts(" bad_tail ");
    put_dec(h->bad_tail);
    puts(" records ");
    put_dec(h->records);
    puts(" lost ");
    put_dec(h->lost);
    puts(" withheld ");
    put_dec(h->withheld);
    puts(" violations ");
    put_dec(h->violations);
    puts("\n");
}

int main(u64 arg, u64 domain) {
    user_gp_skip = 2; /* the runtime's handler, until this program's is in place: RDPMC */
    rt_init();
    own_gate();
    u32 cpu = cpu_id();
    u32 rounds = (u32)arg, wanted = (u32)(arg >> 32) & 0xff;
    detect_pmu();
    if (domain == 0) {
        /* Only in the machine test: the privileged domain sets the mode and leaves. */
        if (wanted && cpu == 0) {
            i64 rc;
            do rc = op(XENPMU_OP_MODE_SET, wanted, 0, 1, 0);
            while (rc == -XENPMU_EAGAIN);
            if (rc != 0) violation(cpu, "the privileged MODE_SET failed", (u64)rc, 0);
        }
        return 0;
    }
    /* In `vpmu profile` the profiler sets all mode first: a domain that used its vPMU before
     * (self mode, the machine's initial one) would make that MODE_SET fail (-EBUSY, a
     * refusal the specification allows, not the attack under test). Work at CPL3 meanwhile. */
    while (wanted ? mode_get(cpu) != wanted : mode_get(cpu) == XENPMU_MODE_SELF) user_part(cpu);
    for (u64 round = 0; rounds == 0 || round < rounds; round++) {
        own_gate();
        hostile_pmu.mode = (u32)mode_get(cpu);
        attack_operations(cpu);
        attack_msrs(cpu);
        if (hostile_pmu.mode == XENPMU_MODE_ALL)
            user_part(cpu);
        else
            attack_ring(cpu); /* hostile_ring.c: the page, the ring and its consumer */
        hostile_stats[cpu].rounds++;
        if ((round & 255) == 255) summary(cpu);
    }
    summary(cpu);
    return 0;
}
