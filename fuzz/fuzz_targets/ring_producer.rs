//! libFuzzer entry point of `ring_producer`: see `vpmu_fuzz::targets::ring_producer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::ring_producer::run(data));
