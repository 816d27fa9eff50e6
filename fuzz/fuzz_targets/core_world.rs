//! libFuzzer entry point of `core_world`: see `vpmu_fuzz::targets::core_world`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::core_world::run(data));
