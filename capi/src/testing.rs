//! Testing only: a software machine for C tests, with no hardware (`vpmu_testing_*`).
//!
//! The machine of the Rust worked example (`vpmu_examples::machine`): a CPUID of one of the
//! four test shapes (`intel-v5`, `intel-v2`, `amd-perfmonv2`, `amd-k7`), from which
//! `vpmu_create` picks the vendor as on a host, and per pCPU a software PMU of
//! `vpmu-models` that counts the events it is fed as the hardware would (overflow, status,
//! PMI line). A C test routes its MSR callbacks to the PMU, so every count it reads back was
//! computed by the core, the vendor backend and the model. A hypervisor uses none of this:
//! its CPUID is the CPU's and its MSR callbacks execute RDMSR/WRMSR.

use std::ffi::c_char;
use std::ptr;

use vpmu_examples::machine::{Machine, MachinePmu};
use vpmu_models::shapes::Shape;
use vpmu_vendor_any::raw_cpuid::CpuIdReader;
use vpmu_vendor_any::vpmu::{Msr, MsrBus};

use crate::error::{
    VPMU_EINVAL, VPMU_EIO, VPMU_ENODEV, VpmuError, VpmuReason, bad_argument, guarded,
};
use crate::handles::{handle, put};

/// A software PMU of one pCPU (C: `vpmu_testing_pmu`). Not thread-safe: used by its pCPU's
/// thread only, like the hardware it stands for.
#[derive(Debug)]
pub struct TestingPmu(MachinePmu);

/// The test shapes `vpmu_testing_*` knows: 0 to `vpmu_testing_shape_count() - 1`.
fn shape(index: u32) -> Result<Shape, VpmuError> {
    Shape::ALL
        .get(index as usize)
        .copied()
        .ok_or_else(bad_argument)
}

/// The number of test shapes (4). Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn vpmu_testing_shape_count() -> u32 {
    Shape::ALL.len() as u32
}

/// The name of test shape `shape`, NUL-terminated and static; NULL if there is no such shape.
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn vpmu_testing_shape_name(shape: u32) -> *const c_char {
    NAMES
        .get(shape as usize)
        .map_or(ptr::null(), |name| name.as_ptr())
}

/// `Shape::ALL`'s names, NUL-terminated (a unit test checks they are `Shape::name`'s).
const NAMES: [&std::ffi::CStr; 4] = [c"intel-v5", c"intel-v2", c"amd-perfmonv2", c"amd-k7"];

/// CPUID of a CPU of test shape `shape`: EAX, EBX, ECX, EDX of (`leaf`, `subleaf`) into
/// `out[0..4]`. Returns 0, or `-EINVAL` (no such shape, NULL `out`). Thread safety: any.
///
/// # Safety
/// `out` is NULL or four writable words.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_cpuid(
    shape: u32,
    leaf: u32,
    subleaf: u32,
    out: *mut u32,
) -> i32 {
    guarded(ptr::null_mut(), || {
        let result = Machine {
            shape: self::shape(shape)?,
        }
        .cpuid()
        .cpuid2(leaf, subleaf);
        let words = [result.eax, result.ebx, result.ecx, result.edx];
        for (i, word) in words.into_iter().enumerate() {
            // SAFETY: `out` is NULL (refused) or four writable words, and `i < 4`.
            unsafe { put(out.wrapping_add(i), word)? };
        }
        Ok(())
    })
}

/// IA32_PERF_CAPABILITIES of test shape `shape` into `*value`: 0, `-ENODEV` if that CPU has
/// no such MSR (a read faults), `-EINVAL` (no such shape, NULL `value`). Thread safety: any.
///
/// # Safety
/// `value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_perf_capabilities(shape: u32, value: *mut u64) -> i32 {
    guarded(ptr::null_mut(), || {
        let machine = Machine {
            shape: self::shape(shape)?,
        };
        let read = machine
            .read_perf_capabilities()
            .ok_or_else(|| VpmuError::new(VPMU_ENODEV, VpmuReason::BadArgument))?;
        // SAFETY: `value` is NULL (refused) or writable.
        unsafe { put(value, read) }
    })
}

/// A software PMU of test shape `shape`, in its power-on state, into `*out`. Returns 0 or
/// `-EINVAL`. Free it with `vpmu_testing_pmu_free`. Thread safety: any thread.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_pmu_new(shape: u32, out: *mut *mut TestingPmu) -> i32 {
    guarded(ptr::null_mut(), || {
        let pmu = Machine {
            shape: self::shape(shape)?,
        }
        .pmu();
        if out.is_null() {
            return Err(VpmuError::new(VPMU_EINVAL, VpmuReason::NullArgument));
        }
        // SAFETY: `out` is not NULL and writable.
        unsafe { put(out, Box::into_raw(Box::new(TestingPmu(pmu)))) }
    })
}

/// Frees a software PMU (NULL: nothing).
///
/// Thread safety: the PMU's own pCPU thread only (it stands for that CPU's hardware).
///
/// # Safety
/// `pmu` is NULL or a live PMU from `vpmu_testing_pmu_new`, no longer used by anything (its
/// pCPU detached).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_pmu_free(pmu: *mut TestingPmu) {
    if !pmu.is_null() {
        // SAFETY: the `Box` `vpmu_testing_pmu_new` gave the caller, given back.
        drop(unsafe { Box::from_raw(pmu) });
    }
}

/// RDMSR on the software PMU: 0 and `*value`, or `-EIO` where the hardware would #GP
/// (`-EINVAL` for a NULL argument): what an MSR callback of `vpmu_msr_ops` returns.
///
/// Thread safety: the PMU's own pCPU thread only (it stands for that CPU's hardware).
///
/// # Safety
/// `pmu` is NULL or a live PMU, used by no other thread; `value` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_pmu_rdmsr(
    pmu: *mut TestingPmu,
    msr: u32,
    value: *mut u64,
) -> i32 {
    guarded(ptr::null_mut(), || {
        // SAFETY: the caller's contract: NULL or a live PMU no one else uses now.
        let pmu = unsafe { pmu.as_mut() }
            .ok_or_else(|| VpmuError::new(VPMU_EINVAL, VpmuReason::NullArgument))?;
        let read = pmu
            .0
            .read(Msr(msr))
            .map_err(|_| VpmuError::new(VPMU_EIO, VpmuReason::HardwareFault))?;
        // SAFETY: `value` is NULL (refused) or writable.
        unsafe { put(value, read) }
    })
}

/// WRMSR on the software PMU: 0, or `-EIO` where the hardware would #GP.
///
/// Thread safety: the PMU's own pCPU thread only (it stands for that CPU's hardware).
///
/// # Safety
/// `pmu` is NULL or a live PMU, used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_pmu_wrmsr(pmu: *mut TestingPmu, msr: u32, value: u64) -> i32 {
    guarded(ptr::null_mut(), || {
        // SAFETY: the caller's contract: NULL or a live PMU no one else uses now.
        let pmu = unsafe { pmu.as_mut() }
            .ok_or_else(|| VpmuError::new(VPMU_EINVAL, VpmuReason::NullArgument))?;
        pmu.0
            .write(Msr(msr), value)
            .map_err(|_| VpmuError::new(VPMU_EIO, VpmuReason::HardwareFault))
    })
}

/// The CPU retires one instruction in guest kernel mode (CPL 0): enabled counters selecting
/// instructions retired count it, overflowing (and raising the PMI line) exactly when they
/// wrap. Returns 0 or `-EINVAL` (NULL).
///
/// Thread safety: the PMU's own pCPU thread only (it stands for that CPU's hardware).
///
/// # Safety
/// `pmu` is NULL or a live PMU, used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_pmu_retire_instruction(pmu: *mut TestingPmu) -> i32 {
    guarded(ptr::null_mut(), || {
        // SAFETY: the caller's contract: NULL or a live PMU no one else uses now.
        let pmu = unsafe { pmu.as_mut() }
            .ok_or_else(|| VpmuError::new(VPMU_EINVAL, VpmuReason::NullArgument))?;
        pmu.0.retire_guest_instruction();
        Ok(())
    })
}

/// Takes the PMU's interrupt line: true if it was raised (the CPU then takes the PMI: call
/// `vpmu_handle_pmi`). False for NULL.
///
/// Thread safety: the PMU's own pCPU thread only (it stands for that CPU's hardware).
///
/// # Safety
/// `pmu` is NULL or a live PMU, used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_pmu_take_pmi(pmu: *mut TestingPmu) -> bool {
    let mut raised = false;
    guarded(ptr::null_mut(), || {
        // SAFETY: the caller's contract: NULL or a live PMU no one else uses now.
        let pmu = unsafe { pmu.as_mut() }
            .ok_or_else(|| VpmuError::new(VPMU_EINVAL, VpmuReason::NullArgument))?;
        raised = pmu.0.take_pmi();
        Ok(())
    });
    raised
}

/// Whether any counter of the PMU can count (enabled, and globally enabled where there is a
/// global control): what a pCPU's PMU must never be with no vCPU loaded. False for NULL.
///
/// Thread safety: the PMU's own pCPU thread only (it stands for that CPU's hardware).
///
/// # Safety
/// `pmu` is NULL or a live PMU, used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_pmu_anything_can_count(pmu: *const TestingPmu) -> bool {
    let mut counting = false;
    guarded(ptr::null_mut(), || {
        // SAFETY: the caller's contract: NULL or a live PMU no one else uses now.
        let pmu = unsafe { handle(pmu)? };
        counting = pmu.0.anything_can_count();
        Ok(())
    });
    counting
}

/// Panics inside the library, as a bug would, under the same guard as every entry point: for
/// tests that a panic never crosses the boundary. Returns `-ENOTRECOVERABLE`
/// (`VPMU_REASON_PANIC`), and `vpmu` is poisoned from then on. Thread safety: as
/// `vpmu_vcpu_create`.
///
/// # Safety
/// `vpmu` is NULL or a live handle; `err` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_testing_panic(
    vpmu: *const crate::handles::VpmuHandle,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let handle = unsafe { handle(vpmu)? };
        let _poison = crate::error::PoisonOnUnwind(&handle.poisoned);
        panic!("vpmu_testing_panic: a deliberate panic inside the library");
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_the_shapes() {
        for (shape, name) in super::Shape::ALL.iter().zip(super::NAMES) {
            assert_eq!(name.to_str(), Ok(shape.name()));
        }
    }
}
