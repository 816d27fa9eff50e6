//! libFuzzer entry point of `flush_verify`: see `vpmu_fuzz::targets::flush_verify`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::flush_verify::run(data));
