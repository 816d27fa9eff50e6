//! libFuzzer entry point of `ring_reader`: see `vpmu_fuzz::targets::ring_reader`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::ring_reader::run(data));
