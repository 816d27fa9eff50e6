//! `vpmu profile`'s sample-batch decoder (`vpmu_profile::protocol`, vmm/profile): a guest
//! (perhaps a user's ELF) ships batches over the batch port; whatever their bytes, decoding
//! returns the samples or an error and never panics, and a decoded shipment holds exactly the
//! samples its batches' headers count.
//!
//! Input: the shipping domain (one byte), then up to [`MAX_BATCHES`] batches, each a 16-bit
//! little-endian length and that many bytes (the last one cut short at the end of the input).
//! A length prefix rather than a separator byte, so that a batch can hold any bytes and reach
//! the [`SAMPLE_SIZE`] bytes of a sample.

use vpmu_profile::protocol::{
    self, BATCH_CAPACITY, BATCH_HEADER, BATCH_MAGIC, BatchHeader, SAMPLE_SIZE,
};
use zerocopy::FromBytes;

/// Milestone: a shipment with at least one sample decoded.
pub const DECODED: &str = "profile_batch: a sample decoded";

/// Milestone: a ring shipment (`struct ring_batch`, ring mode) with a sample record decoded.
pub const RING_DECODED: &str = "profile_batch: a ring record decoded";

/// Batches per input at most.
pub const MAX_BATCHES: usize = 8;

/// The batches an input holds after its shipper byte.
pub fn split(mut data: &[u8]) -> Vec<Vec<u8>> {
    let mut batches = Vec::new();
    while batches.len() < MAX_BATCHES {
        let [lo, hi, rest @ ..] = data else { break };
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
        batches.push(rest[..len].to_vec());
        data = &rest[len..];
    }
    batches
}

/// An input shipping `batches` from `shipper`.
pub fn join(shipper: u8, batches: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![shipper];
    for batch in batches {
        let len = u16::try_from(batch.len()).expect("a batch fits a 16-bit length");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(batch);
    }
    out
}

/// The target.
pub fn run(data: &[u8]) {
    let [shipper, rest @ ..] = data else {
        return;
    };
    let batches = split(rest);
    let Ok(shipment) = protocol::decode(u32::from(*shipper), &batches) else {
        return;
    };
    assert_eq!(shipment.batches as usize, batches.len());
    // Page batches (`struct sample_batch`) and ring shipments (`struct ring_batch`, told apart
    // by their magic): every sample a page batch counts, and every sample record of a ring
    // shipment, is decoded, and nothing else.
    let headers: Vec<BatchHeader> = batches
        .iter()
        .map(|b| BatchHeader::read_from_prefix(b).expect("decoded").0)
        .filter(|h| h.magic == BATCH_MAGIC)
        .collect();
    let ring_samples = shipment.ring.map_or(0, |r| r.samples);
    assert!(
        shipment.samples.len() as u64
            <= headers.len() as u64 * BATCH_CAPACITY as u64 + ring_samples
    );
    let counted: usize = headers.iter().map(|h| h.count as usize).sum();
    assert_eq!(
        shipment.samples.len() as u64,
        counted as u64 + ring_samples,
        "every counted sample decoded"
    );
    for (batch, header) in batches
        .iter()
        .filter(|b| b.get(..4) == Some(&BATCH_MAGIC.to_le_bytes()[..]))
        .zip(&headers)
    {
        assert_eq!(
            batch.len(),
            BATCH_HEADER + header.count as usize * SAMPLE_SIZE
        );
    }
    if let Some(last) = headers.last() {
        assert_eq!((shipment.dropped, shipment.lost), (last.dropped, last.lost));
    }
    if let Some(ring) = shipment.ring {
        assert_eq!(headers.len() as u64 + ring.shipments, batches.len() as u64);
        assert!(
            ring.bytes <= ring.shipments * (1 << 20),
            "at most a ring's worth each"
        );
        if ring.samples > 0 {
            crate::reached(RING_DECODED);
        }
    }
    if !shipment.samples.is_empty() {
        crate::reached(DECODED);
    }
}
