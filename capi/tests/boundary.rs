//! The C API's boundary, driven from Rust through the same `extern "C"` functions a C caller
//! links: refusals with their errno and reason, a reentrant call from a callback refused
//! rather than aliasing the pCPU's state, a panic caught and the vPMU poisoned, and the event
//! filter reaching the counters through `vpmu_set_event_filter` + `vpmu_event_filter_changed`.
//! The MSR bus is a software PMU of the testing entry points, so every count is the core's.

use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;

use vpmu_capi::*;

/// One pCPU's context: its software PMU, its handle once attached, and what a reentrant call
/// from inside its MSR callback answered.
struct Cpu {
    pmu: *mut TestingPmu,
    handle: Cell<*const PcpuHandle>,
    reenter: Cell<bool>,
    reentrant: Cell<Option<(i32, VpmuReason)>>,
}

unsafe extern "C" fn bus_rdmsr(ctx: *mut c_void, msr: u32, value: *mut u64) -> i32 {
    // SAFETY: `ctx` is the test's live `Cpu` (given at attach); `value` the library's local.
    unsafe { vpmu_testing_pmu_rdmsr((*ctx.cast::<Cpu>()).pmu, msr, value) }
}

unsafe extern "C" fn bus_wrmsr(ctx: *mut c_void, msr: u32, value: u64) -> i32 {
    // SAFETY: `ctx` is the test's live `Cpu`.
    let cpu = unsafe { &*ctx.cast::<Cpu>() };
    if cpu.reenter.get() && !cpu.handle.get().is_null() {
        let mut pmi = std::mem::MaybeUninit::<VpmuPmiOutcome>::uninit();
        let mut err = VpmuError::NONE;
        // A callback calling back into its own pCPU: refused, never run on aliased state.
        // SAFETY: the live handle of this pCPU; `pmi` and `err` are locals.
        let rc = unsafe { vpmu_handle_pmi(cpu.handle.get(), pmi.as_mut_ptr(), &mut err) };
        cpu.reentrant.set(Some((rc, err.reason)));
    }
    // SAFETY: the test's live software PMU.
    unsafe { vpmu_testing_pmu_wrmsr(cpu.pmu, msr, value) }
}

const BUS: VpmuMsrOps = VpmuMsrOps {
    rdmsr: Some(bus_rdmsr),
    wrmsr: Some(bus_wrmsr),
};

unsafe extern "C" fn cpuid_of_shape(ctx: *mut c_void, leaf: u32, subleaf: u32, out: *mut u32) {
    // SAFETY: `ctx` is the test's shape index; `out` four words of the library's.
    unsafe { vpmu_testing_cpuid(*ctx.cast::<u32>(), leaf, subleaf, out) };
}

/// A CPU that says "CentaurHauls": no backend for it.
unsafe extern "C" fn cpuid_centaur(_: *mut c_void, leaf: u32, _: u32, out: *mut u32) {
    let words = match leaf {
        0 => [0x10, 0x746e_6543, 0x736c_7561, 0x4872_7561],
        _ => [0; 4],
    };
    // SAFETY: `out` is four writable words (the callback's contract).
    unsafe { ptr::copy_nonoverlapping(words.as_ptr(), out, 4) };
}

unsafe extern "C" fn map_page(_: *mut c_void, _: u32, _: u64, _: *mut u64) -> i32 {
    -VPMU_EINVAL
}
unsafe extern "C" fn unmap_page(_: *mut c_void, _: u64) {}
unsafe extern "C" fn read_page(_: *mut c_void, _: u64, _: *mut u8) -> i32 {
    -1
}
unsafe extern "C" fn write_page(_: *mut c_void, _: u64, _: u32, _: *const u8, _: u32) {}
unsafe extern "C" fn deliver(_: *mut c_void, _: u32, _: u32, _: bool) -> u32 {
    VPMU_LVTPC_MASKED
}
unsafe extern "C" fn virq(_: *mut c_void, _: u32, _: u32) {}
unsafe extern "C" fn send(_: *mut c_void, _: u32, _: *const VpmuRequest) {}
unsafe extern "C" fn lvtpc(_: *mut c_void, _: u32, _: bool) {}
unsafe extern "C" fn interrupted(_: *mut c_void, _: u32, out: *mut VpmuInterrupted) {
    // SAFETY: `out` is the library's zeroed local.
    unsafe { (*out).kind = VPMU_INTERRUPTED_HYPERVISOR };
}
unsafe extern "C" fn diagnostic(_: *mut c_void, _: *const VpmuDiagnostic) {}

const PLATFORM: VpmuPlatformOps = VpmuPlatformOps {
    map_page: Some(map_page),
    unmap_page: Some(unmap_page),
    read_page: Some(read_page),
    write_page: Some(write_page),
    deliver_lvtpc_pmi: Some(deliver),
    raise_pmu_virq: Some(virq),
    send_request: Some(send),
    set_physical_lvtpc_masked: Some(lvtpc),
    interrupted: Some(interrupted),
    diagnostic: Some(diagnostic),
    resume_regs: None,
    timestamp: None,
    tsc_khz: None,
    read_sampled: None,
    read_guest: None,
    map_ring: None,
    unmap_ring: None,
    ring_read: None,
    ring_write: None,
    write_guest: None,
};

const CONFIG: VpmuConfig = VpmuConfig {
    pcpus: 1,
    mode: 1, // XENPMU_MODE_SELF
    privileged_domain: 0,
};

/// `vpmu_create` on test shape `shape` with `platform`: its return value and error.
fn create(
    shape: u32,
    cpuid: VpmuCpuidOps,
    platform: &VpmuPlatformOps,
) -> (i32, VpmuError, *const VpmuHandle) {
    let (mut out, mut err, mut shape) = (ptr::null(), VpmuError::NONE, shape);
    let ctx = (&raw mut shape).cast();
    // SAFETY: valid tables and locals; the CPUID context is used during the call only.
    let rc = unsafe { vpmu_create(&CONFIG, &cpuid, ctx, platform, &mut out, &mut err) };
    (rc, err, out)
}

const CPUID: VpmuCpuidOps = VpmuCpuidOps {
    cpuid: Some(cpuid_of_shape),
    read_perf_capabilities: None,
};

/// A booted vPMU on shape `shape` with one attached pCPU and vCPU 1.0 running on it.
struct Booted {
    vpmu: *const VpmuHandle,
    pcpu: *mut PcpuHandle,
    vcpu: *const VcpuHandle,
    cpu: Box<Cpu>,
}

fn boot(shape: u32) -> Booted {
    let booted = boot_idle(shape);
    booted.switch_to(booted.vcpu);
    booted
}

/// As `boot`, with vCPU 1.0 made but never run.
fn boot_idle(shape: u32) -> Booted {
    let (rc, err, vpmu) = create(shape, CPUID, &PLATFORM);
    assert_eq!((rc, err.reason), (0, VpmuReason::None));
    let mut pmu = ptr::null_mut();
    // SAFETY: a local to write to.
    assert_eq!(unsafe { vpmu_testing_pmu_new(shape, &mut pmu) }, 0);
    let cpu = Box::new(Cpu {
        pmu,
        handle: Cell::new(ptr::null()),
        reenter: Cell::new(false),
        reentrant: Cell::new(None),
    });
    let (mut pcpu, mut vcpu, mut err) = (ptr::null_mut(), ptr::null(), VpmuError::NONE);
    let ctx = ptr::from_ref::<Cpu>(&cpu).cast_mut().cast();
    // SAFETY: live handles, tables and locals; `cpu` outlives the pCPU.
    unsafe {
        assert_eq!(vpmu_pcpu_attach(vpmu, 0, &BUS, ctx, &mut pcpu, &mut err), 0);
        assert_eq!(vpmu_vcpu_create(vpmu, 1, 0, &mut vcpu, &mut err), 0);
    }
    cpu.handle.set(pcpu);
    Booted {
        vpmu,
        pcpu,
        vcpu,
        cpu,
    }
}

impl Booted {
    fn switch_to(&self, next: *const VcpuHandle) {
        let mut err = VpmuError::NONE;
        // SAFETY: live handles (`next` may be NULL: idle) and a local.
        let rc = unsafe { vpmu_context_switch(self.pcpu, next, &mut err) };
        assert_eq!((rc, err.reason), (0, VpmuReason::None));
    }

    fn wrmsr(&self, msr: u32, value: u64) -> (i32, u32) {
        let (mut result, mut err) = (u32::MAX, VpmuError::NONE);
        // SAFETY: live handles and locals.
        let rc = unsafe { vpmu_wrmsr(self.pcpu, self.vcpu, msr, value, &mut result, &mut err) };
        (rc, result)
    }

    fn rdpmc(&self, selector: u32) -> u64 {
        let (mut value, mut result, mut err) = (0, u32::MAX, VpmuError::NONE);
        // SAFETY: live handles and locals.
        let rc = unsafe {
            vpmu_rdpmc(
                self.pcpu,
                self.vcpu,
                selector,
                0,
                false,
                &mut value,
                &mut result,
                &mut err,
            )
        };
        assert_eq!((rc, result), (0, VPMU_MSR_HANDLED));
        value
    }

    fn retire(&self, n: u32) {
        for _ in 0..n {
            // SAFETY: the live software PMU.
            let rc = unsafe { vpmu_testing_pmu_retire_instruction(self.cpu.pmu) };
            assert_eq!(rc, 0);
        }
    }

    /// Switches to idle, tears the vCPU down, detaches, destroys and frees everything.
    fn shut_down(self) {
        let mut err = VpmuError::NONE;
        let mut done = u32::MAX;
        // SAFETY: live handles, each freed once, in the order the API asks.
        unsafe {
            assert_eq!(vpmu_context_switch(self.pcpu, ptr::null(), &mut err), 0);
            assert_eq!(
                vpmu_teardown_vcpu(self.pcpu, self.vcpu, &mut done, &mut err),
                0
            );
            assert_eq!(done, VPMU_DONE);
            assert_eq!(vpmu_pcpu_detach(self.pcpu, &mut err), 0);
            assert_eq!(vpmu_vcpu_destroy(self.vpmu, self.vcpu, &mut err), 0);
            assert_eq!(vpmu_destroy(self.vpmu, &mut err), 0);
            vpmu_testing_pmu_free(self.cpu.pmu);
        }
    }
}

/// Intel v5 (shape 0): PERFEVTSEL0, PMC0 and the global control.
const EVTSEL0: u32 = 0x186;
const PMC0: u32 = 0xc1;
const GLOBAL_CTRL: u32 = 0x38f;
const COUNT_INSTRUCTIONS: u64 = 1 << 22 | 1 << 17 | 1 << 16 | 0xc0;

#[test]
fn create_refuses_with_a_reason() {
    let (mut out, mut err) = (ptr::null(), VpmuError::NONE);
    // SAFETY: NULL tables are what is tested; the rest are locals.
    let rc = unsafe {
        vpmu_create(
            ptr::null(),
            &CPUID,
            ptr::null_mut(),
            &PLATFORM,
            &mut out,
            &mut err,
        )
    };
    assert_eq!(
        (rc, err.errno, err.reason),
        (-VPMU_EINVAL, -VPMU_EINVAL, VpmuReason::NullArgument)
    );
    let incomplete = VpmuPlatformOps {
        send_request: None,
        ..PLATFORM
    };
    let (rc, err, _) = create(0, CPUID, &incomplete);
    assert_eq!(
        (rc, err.reason),
        (-VPMU_EINVAL, VpmuReason::MissingCallback)
    );
    let centaur = VpmuCpuidOps {
        cpuid: Some(cpuid_centaur),
        read_perf_capabilities: None,
    };
    let (rc, err, _) = create(0, centaur, &PLATFORM);
    assert_eq!((rc, err.reason), (-VPMU_ENODEV, VpmuReason::UnknownVendor));
    assert!(out.is_null());
}

#[test]
fn a_callback_calling_back_into_its_pcpu_is_refused() {
    let booted = boot(0);
    booted.cpu.reenter.set(true);
    // The first WRMSR of a control loads the context: a hardware write, whose callback calls
    // `vpmu_handle_pmi` on the same pCPU.
    assert_eq!(
        booted.wrmsr(EVTSEL0, COUNT_INSTRUCTIONS),
        (0, VPMU_MSR_HANDLED)
    );
    assert_eq!(
        booted.cpu.reentrant.get(),
        Some((-VPMU_EBUSY, VpmuReason::PcpuBusy))
    );
    booted.cpu.reenter.set(false);
    booted.shut_down();
}

#[test]
fn a_panic_is_caught_and_poisons_the_vpmu() {
    let booted = boot(0);
    let mut err = VpmuError::NONE;
    // SAFETY: a live handle and a local.
    let rc = unsafe { vpmu_testing_panic(booted.vpmu, &mut err) };
    assert_eq!((rc, err.reason), (-VPMU_ENOTRECOVERABLE, VpmuReason::Panic));
    // Every later call on it says so, the intercepts included.
    let (rc, _) = booted.wrmsr(EVTSEL0, COUNT_INSTRUCTIONS);
    assert_eq!(rc, -VPMU_ENOTRECOVERABLE);
    let mut vcpu = ptr::null();
    // SAFETY: live handles and locals; then each handle freed once.
    unsafe {
        assert_eq!(
            vpmu_vcpu_create(booted.vpmu, 1, 1, &mut vcpu, &mut err),
            -VPMU_ENOTRECOVERABLE
        );
        assert_eq!(err.reason, VpmuReason::Poisoned);
        // Detach frees the handle without touching the hardware, and says so.
        assert_eq!(
            vpmu_pcpu_detach(booted.pcpu, &mut err),
            -VPMU_ENOTRECOVERABLE
        );
        assert_eq!(vpmu_vcpu_destroy(booted.vpmu, booted.vcpu, &mut err), 0);
        assert_eq!(vpmu_destroy(booted.vpmu, &mut err), 0);
        vpmu_testing_pmu_free(booted.cpu.pmu);
    }
}

#[test]
fn an_event_filter_stops_and_restarts_a_counter() {
    let booted = boot(0);
    assert_eq!(booted.wrmsr(PMC0, 0), (0, VPMU_MSR_HANDLED));
    assert_eq!(
        booted.wrmsr(EVTSEL0, COUNT_INSTRUCTIONS),
        (0, VPMU_MSR_HANDLED)
    );
    assert_eq!(booted.wrmsr(GLOBAL_CTRL, 1), (0, VPMU_MSR_HANDLED));
    booted.retire(100);
    assert_eq!(booted.rdpmc(0), 100);

    let deny = [VpmuEventMatch {
        select: 0xc0,
        ..VpmuEventMatch::default()
    }];
    let (mut err, mut done) = (VpmuError::NONE, u32::MAX);
    // SAFETY: live handles, a one-entry array, locals.
    unsafe {
        let rc = vpmu_set_event_filter(
            booted.vpmu,
            1,
            VPMU_FILTER_DENY,
            0,
            deny.as_ptr(),
            1,
            &mut err,
        );
        assert_eq!(rc, 0);
        assert_eq!(
            vpmu_event_filter_changed(booted.pcpu, &mut done, &mut err),
            0
        );
    }
    assert_eq!(done, VPMU_DONE);
    booted.retire(50);
    assert_eq!(booted.rdpmc(0), 100, "the denied event does not count");

    // SAFETY: as above; `deny` has one entry, and 65 are refused before it is read.
    unsafe {
        let rc = vpmu_set_event_filter(booted.vpmu, 1, 7, 0, ptr::null(), 0, &mut err);
        assert_eq!((rc, err.reason), (-VPMU_EINVAL, VpmuReason::BadArgument));
        let long = [VpmuEventMatch::default(); VPMU_FILTER_MAX_ENTRIES + 1];
        let rc = vpmu_set_event_filter(
            booted.vpmu,
            1,
            VPMU_FILTER_ALLOW,
            0,
            long.as_ptr(),
            long.len(),
            &mut err,
        );
        assert_eq!((rc, err.reason), (-VPMU_ENOSPC, VpmuReason::FilterTooLong));
        let rc = vpmu_set_event_filter(
            booted.vpmu,
            1,
            VPMU_FILTER_NONE,
            0,
            ptr::null(),
            0,
            &mut err,
        );
        assert_eq!(rc, 0);
        assert_eq!(
            vpmu_event_filter_changed(booted.pcpu, &mut done, &mut err),
            0
        );
    }
    booted.retire(25);
    assert_eq!(booted.rdpmc(0), 125, "counting again without the filter");
    booted.shut_down();
}

/// Programs counter 0 of an Intel v5 vCPU to count instructions, globally enabled.
fn count_on_counter_0(booted: &Booted) {
    assert_eq!(booted.wrmsr(PMC0, 0), (0, VPMU_MSR_HANDLED));
    assert_eq!(
        booted.wrmsr(EVTSEL0, COUNT_INSTRUCTIONS),
        (0, VPMU_MSR_HANDLED)
    );
    assert_eq!(booted.wrmsr(GLOBAL_CTRL, 1), (0, VPMU_MSR_HANDLED));
}

/// `vpmu_vcpu_snapshot` into a buffer of `capacity` bytes: return value, error, bytes.
fn snapshot(booted: &Booted, capacity: usize) -> (i32, VpmuError, Vec<u8>) {
    let (mut buf, mut len, mut err) = (vec![0u8; capacity], 0, VpmuError::NONE);
    // SAFETY: live handles; `buf` has `capacity` bytes; locals.
    let rc = unsafe {
        vpmu_vcpu_snapshot(
            booted.vpmu,
            booted.vcpu,
            buf.as_mut_ptr(),
            capacity,
            &mut len,
            &mut err,
        )
    };
    buf.truncate(len);
    (rc, err, buf)
}

fn restore(booted: &Booted, bytes: &[u8]) -> (i32, VpmuError) {
    let mut err = VpmuError::NONE;
    // SAFETY: live handles; `bytes` is readable.
    let rc = unsafe {
        vpmu_vcpu_restore(
            booted.pcpu,
            booted.vcpu,
            bytes.as_ptr(),
            bytes.len(),
            &mut err,
        )
    };
    (rc, err)
}

#[test]
fn a_snapshot_moves_a_vcpu_to_another_host_and_counts_continue() {
    let source = boot(0);
    count_on_counter_0(&source);
    source.retire(100);
    assert_eq!(source.rdpmc(0), 100);
    // Not quiesced while it runs.
    let (rc, err, _) = snapshot(&source, vpmu_snapshot_max_bytes());
    assert_eq!(
        (rc, err.reason),
        (-VPMU_EBUSY, VpmuReason::SnapshotNotTaken)
    );
    source.switch_to(ptr::null());
    // Too small a buffer says how much is needed.
    let (rc, err, _) = snapshot(&source, 8);
    assert_eq!((rc, err.reason), (-VPMU_ENOSPC, VpmuReason::BadArgument));
    let needed = err.needed as usize;
    assert!(needed > 8 && needed <= vpmu_snapshot_max_bytes());
    let (rc, _, bytes) = snapshot(&source, needed);
    assert_eq!((rc, bytes.len()), (0, needed));
    source.shut_down();

    // Another host of the same shape: the vCPU counts on from 100, exactly.
    let target = boot_idle(0);
    let mut damaged = bytes.clone();
    damaged[needed / 2] ^= 1;
    assert_eq!(
        restore(&target, &damaged).1.reason,
        VpmuReason::SnapshotInvalid
    );
    assert_eq!(restore(&target, &bytes).0, 0);
    target.switch_to(target.vcpu);
    assert_eq!(target.rdpmc(0), 100);
    target.retire(50);
    assert_eq!(target.rdpmc(0), 150);
    // A vCPU that ran is no restore target.
    target.switch_to(ptr::null());
    let (rc, err) = restore(&target, &bytes);
    assert_eq!((rc, err.reason), (-VPMU_EBUSY, VpmuReason::VcpuInUse));
    target.shut_down();

    // Another vendor's host refuses it, with the reason, and changes nothing.
    let amd = boot_idle(2);
    let (rc, err) = restore(&amd, &bytes);
    assert_eq!(
        (rc, err.reason),
        (-VPMU_EOPNOTSUPP, VpmuReason::SnapshotIncompatible)
    );
    let mut report = std::mem::MaybeUninit::<VpmuVcpuInfo>::uninit();
    let mut err = VpmuError::NONE;
    // SAFETY: a live handle and locals; the report is read only after a 0 return.
    let report = unsafe {
        assert_eq!(vpmu_vcpu_info(amd.vcpu, report.as_mut_ptr(), &mut err), 0);
        report.assume_init()
    };
    assert_eq!(report.state, VpmuVcpuState::Allocated);
    amd.shut_down();
}
