//! libFuzzer entry point of `page_view`: see `vpmu_fuzz::targets::page_view`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vpmu_fuzz::targets::page_view::run(data));
