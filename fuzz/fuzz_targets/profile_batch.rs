//! `vpmu profile`'s sample-batch decoder (`vmm/src/profile/protocol.rs`): a guest (perhaps a
//! user's ELF) ships batches over the batch port; whatever their bytes, decoding returns the
//! samples or an error and never panics. The input is split into batches at 0xff 0xfe markers
//! so that sequences of several batches are explored too.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "vmm_profile.rs"]
mod profile;
#[allow(dead_code)]
#[path = "vmm_coverage.rs"]
mod coverage;

fuzz_target!(|data: &[u8]| {
    let batches: Vec<Vec<u8>> = data
        .split(|&b| b == 0xfe)
        .map(<[u8]>::to_vec)
        .take(8)
        .collect();
    if let Ok(shipment) = profile::protocol::decode(1, &batches) {
        assert!(shipment.samples.len() <= batches.len() * profile::protocol::BATCH_CAPACITY);
        assert_eq!(shipment.batches as usize, batches.len());
    }
});
