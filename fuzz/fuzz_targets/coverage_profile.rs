//! libFuzzer entry point of `coverage_profile`: see `vpmu_fuzz::targets::coverage_profile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::coverage_profile::run(data));
