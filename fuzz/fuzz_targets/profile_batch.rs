//! `vpmu profile`'s sample-batch decoder (`vpmu_profile::protocol`, vmm/profile): a guest (perhaps a
//! user's ELF) ships batches over the batch port; whatever their bytes, decoding returns the
//! samples or an error and never panics. The input is split into batches at 0xff 0xfe markers
//! so that sequences of several batches are explored too.
#![no_main]

use libfuzzer_sys::fuzz_target;

use vpmu_profile as profile;

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
