//! libFuzzer entry point of `guest_msr`: see `vpmu_fuzz::targets::guest_msr`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::guest_msr::run(data));
