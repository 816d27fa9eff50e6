//! libFuzzer entry point of `snapshot_decode`: see `vpmu_fuzz::targets::snapshot_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::snapshot_decode::run(data));
