//! libFuzzer entry point of `profile_batch`: see `vpmu_fuzz::targets::profile_batch`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::profile_batch::run(data));
