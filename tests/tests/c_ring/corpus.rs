//! The ring-image corpus of `c_ring.rs`, generated deterministically with `vpmu_abi`'s
//! encoder: valid rings, one ring per refusal of the info check and of the reader, and
//! pseudo-random rings with a record broken.

use vpmu_abi::{
    Identity, RecordHeader, Regs, RingControl, RingInfo, RingRecords, RingSample,
    XENPMU_RECORD_MAX, XENPMU_RECORD_MISC_USER, XENPMU_RING_CONTROL_SIZE, XENPMU_RING_MAGIC,
    XENPMU_RING_PAGE_SIZE, append_record, encode_lost, encode_pad, encode_sample,
};
use zerocopy::IntoBytes;

fn info(data_size: u32) -> RingInfo {
    RingInfo {
        magic: XENPMU_RING_MAGIC,
        version_major: 1,
        version_minor: 4,
        data_offset: XENPMU_RING_CONTROL_SIZE as u32,
        data_size,
        record_max: XENPMU_RECORD_MAX as u32,
        wakeup_bytes: data_size / 2,
        tsc_khz: 2_400_000,
        _reserved0: [0; 4],
    }
}

/// A ring image under construction: the control page and the data area.
#[derive(Clone)]
pub struct Image {
    pub control: RingControl,
    pub data: Vec<u8>,
}

impl Image {
    /// A valid, empty ring of `pages` data pages with both positions at `start`.
    fn new(pages: usize, start: u64) -> Self {
        let mut control = RingControl::default();
        control.config.data_pages = pages as u32;
        control.info = info((pages * XENPMU_RING_PAGE_SIZE) as u32);
        control.producer.head = start;
        control.consumer.tail = start;
        Self {
            control,
            data: vec![0; pages * XENPMU_RING_PAGE_SIZE],
        }
    }

    /// Appends one encoded record as a producer does (PAD on wrap), panicking if it does not
    /// fit: the generator chooses what it writes.
    fn push(&mut self, record: &[u8]) -> &mut Self {
        let (tail, head) = (self.control.consumer.tail, self.control.producer.head);
        self.control.producer.head =
            append_record(&mut self.data, tail, head, record).expect("the generator's record fits");
        self
    }

    /// Appends one encoded record; while it does not fit, the consumer reads the oldest record
    /// (with the Rust reader, whose reading the C side must then reproduce).
    fn push_making_room(&mut self, record: &[u8]) {
        loop {
            let (tail, head) = (self.control.consumer.tail, self.control.producer.head);
            match append_record(&mut self.data, tail, head, record) {
                Ok(new_head) => {
                    self.control.producer.head = new_head;
                    return;
                }
                Err(vpmu_abi::EncodeError::Full { .. }) => {
                    let entry =
                        vpmu_abi::next_record(&self.data, XENPMU_RECORD_MAX as u32, tail, head)
                            .expect("the generator's ring is valid")
                            .expect("a full ring is not empty");
                    self.control.consumer.tail = entry.next_tail;
                }
                Err(e) => panic!("the generator's record cannot be appended: {e}"),
            }
        }
    }

    fn sample(&mut self, sequence: u64, chain_len: usize) -> &mut Self {
        self.push(&sample_record(sequence, chain_len))
    }

    fn lost(&mut self, lost: u64, sequence: u64) -> &mut Self {
        self.push(&lost_record(lost, sequence))
    }

    /// The consumer has read everything so far.
    fn consume(&mut self) -> &mut Self {
        self.control.consumer.tail = self.control.producer.head;
        self
    }

    /// Offset in the data area of the next record to be read.
    fn tail_offset(&self) -> usize {
        (self.control.consumer.tail % self.data.len() as u64) as usize
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = self.control.as_bytes().to_vec();
        out.extend_from_slice(&self.data);
        out
    }
}

fn sample_record(sequence: u64, chain_len: usize) -> Vec<u8> {
    let fixed = RingSample {
        header: RecordHeader {
            kind: 0,
            size: 0,
            misc: if sequence % 3 == 0 {
                XENPMU_RECORD_MISC_USER
            } else {
                0
            },
        },
        sequence,
        tsc: 0x5_0000_0000 + 977 * sequence,
        identity: Identity {
            domain_id: (sequence % 4) as u32,
            vcpu_id: 1,
            pcpu_id: (sequence % 2) as u32,
            _pad0: 0,
        },
        overflowed: 1 << (sequence % 40),
        chain_len: 0,
        chain_end: (sequence % 5) as u32,
        regs: Regs {
            rax: sequence.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            rip: 0xffff_ffff_8100_0000 + 16 * sequence,
            rsp: 0xffff_c900_0000_8000 - 8 * sequence,
            rflags: 0x246,
            cs: 0x10,
            ss: 0x18,
            cpl: 0,
            mode: 1,
            ..Regs::default()
        },
    };
    let chain: Vec<u64> = (0..chain_len as u64)
        .map(|i| 0xffff_ffff_8120_0000 + (sequence << 12) + 8 * i)
        .collect();
    let mut out = vec![0u8; XENPMU_RECORD_MAX];
    let size = encode_sample(&mut out, &fixed, &chain).expect("a chain of at most 64");
    out.truncate(size);
    out
}

fn lost_record(lost: u64, sequence: u64) -> Vec<u8> {
    let mut out = vec![0u8; 32];
    encode_lost(&mut out, lost, sequence, 0x1_0000 + sequence).expect("32 bytes");
    out
}

/// Overwrites the record header at `offset` of the data area.
fn set_header(image: &mut Image, offset: usize, kind: u16, size: u16) {
    let header = RecordHeader {
        kind,
        size,
        misc: 0,
    };
    image.data[offset..offset + 8].copy_from_slice(header.as_bytes());
}

/// xorshift64*: the corpus must be the same on every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A valid ring of pseudo-random records (samples with random chains, lost records, kinds of a
/// later minor), then one or two of its unread records broken: the header overwritten with a
/// random value or one shaped like a header (small kind, size a multiple of 8 or not), or the
/// word holding a sample's chain_len with a small count. Walks read records up to the broken
/// one, which may still pass (a changed kind or a chain length that matches).
fn random_image(seed: u64) -> Image {
    let mut state = seed;
    let mut image = Image::new(1, 8 * (next(&mut state) % 100_000));
    for sequence in 1..=(20 + next(&mut state) % 20) {
        let record = match next(&mut state) % 8 {
            0 => lost_record(1 + next(&mut state) % 9, sequence),
            1 => {
                let size = 8 * (1 + next(&mut state) % 12) as u16;
                let mut out = vec![0xa5u8; size.into()];
                let header = RecordHeader {
                    kind: 4 + (next(&mut state) % 100) as u16,
                    size,
                    misc: 0,
                };
                out[..8].copy_from_slice(header.as_bytes());
                out
            }
            _ => sample_record(sequence, (next(&mut state) % 65) as usize),
        };
        image.push_making_room(&record);
    }
    // Where the unread records are, to break one: its header, or a sample's chain_len word.
    let (tail, head) = (image.control.consumer.tail, image.control.producer.head);
    let offsets: Vec<usize> = RingRecords::new(&image.data, XENPMU_RECORD_MAX as u32, tail, head)
        .map(|entry| entry.expect("the generator's ring is valid").offset)
        .collect();
    for _ in 0..=next(&mut state) % 2 {
        let record = offsets[(next(&mut state) % offsets.len() as u64) as usize];
        let (offset, value) = match next(&mut state) % 4 {
            0 => (record, next(&mut state)),
            1 => (
                record,
                (next(&mut state) % 5) | (8 * (next(&mut state) % 100)) << 16,
            ),
            2 => (
                record,
                (next(&mut state) % 5) | (next(&mut state) % 800) << 16,
            ),
            _ => (record + 48, next(&mut state) % 70),
        };
        if offset + 8 <= image.data.len() {
            image.data[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
        }
    }
    image
}

/// `image` with both positions moved by a multiple of the data size (the same records at the
/// same offsets) so that the unread bytes straddle `boundary` (2^32, 2^64 = 0).
fn straddling(mut image: Image, boundary: u64) -> Image {
    let size = image.data.len() as u64;
    let (tail, head) = (image.control.consumer.tail, image.control.producer.head);
    let wrap = head / size * size;
    assert!(
        wrap > tail,
        "the unread records of the image wrap in the data area"
    );
    let shift = boundary.wrapping_sub(wrap);
    image.control.consumer.tail = tail.wrapping_add(shift);
    image.control.producer.head = head.wrapping_add(shift);
    image
}

/// A ring of `pages` whose positions start at `start`, holding a stream of `records` samples
/// (and a lost record every seventh) that wrapped: the consumer reads only what makes room for
/// the next record, so the ring ends (nearly) full of unread records.
fn wrapped(pages: usize, start: u64, records: u64) -> Image {
    let mut image = Image::new(pages, start);
    for sequence in 1..=records {
        let record = if sequence % 7 == 0 {
            lost_record(sequence % 5 + 1, sequence)
        } else {
            sample_record(sequence, (sequence * 13 % 65) as usize)
        };
        image.push_making_room(&record);
    }
    image
}

/// The corpus: named images, in the order their file names sort.
pub fn corpus() -> Vec<(String, Image)> {
    let mut rings: Vec<(&str, Image)> = vec![
        ("empty", Image::new(1, 0)),
        ("one-sample", Image::new(1, 0).sample(1, 0).clone()),
        (
            "full-chains",
            Image::new(1, 0)
                .sample(1, 64)
                .sample(2, 64)
                .sample(3, 63)
                .clone(),
        ),
        (
            "mixed-kinds",
            Image::new(2, 4096)
                .sample(1, 5)
                .lost(3, 4)
                .sample(5, 0)
                .clone(),
        ),
    ];
    let mut unknown = Image::new(1, 0);
    unknown.sample(1, 2);
    let mut later_minor = [0u8; 48];
    later_minor[..8].copy_from_slice(
        RecordHeader {
            kind: 9,
            size: 48,
            misc: 0x77,
        }
        .as_bytes(),
    );
    unknown.push(&later_minor).lost(1, 2);
    rings.push(("unknown-kind-skipped", unknown));
    rings.push(("wrapped-with-pads", wrapped(1, 0, 40)));
    rings.push(("wrapped-two-pages", wrapped(2, 3 << 20, 90)));
    rings.push(("wrap-at-2-64", straddling(wrapped(1, 0, 40), 0)));
    rings.push(("wrap-at-2-32", straddling(wrapped(1, 0, 40), 1 << 32)));
    // Exactly data_size unread: the whole area is records.
    let mut full = Image::new(1, 0);
    for sequence in 1..=5 {
        full.sample(sequence, 64);
    }
    for sequence in 6..=18 {
        full.lost(sequence % 3 + 1, sequence);
    }
    assert_eq!(
        full.control.producer.head, 4096,
        "five full samples and 13 lost records"
    );
    rings.push(("full-area", full));
    // A PAD of 8 bytes: the smallest gap before the end.
    let mut short_pad = Image::new(1, 4096 - 224 - 8);
    short_pad.consume();
    short_pad.control.producer.head = short_pad.control.consumer.tail;
    short_pad.sample(1, 0).sample(2, 0).sample(3, 1);
    rings.push(("pad-of-8", short_pad));
    let mut pad_only = Image::new(1, 4000);
    encode_pad(&mut pad_only.data[4000..]).expect("96 bytes");
    pad_only.control.producer.head = 4096;
    rings.push(("pad-only", pad_only));

    // The info check, in its order.
    let info_edit = |edit: fn(&mut RingInfo)| {
        let mut image = Image::new(1, 0);
        image.sample(1, 3).lost(1, 2);
        edit(&mut image.control.info);
        image
    };
    rings.push(("info-bad-magic", info_edit(|i| i.magic = 0x524d_5059)));
    rings.push(("info-zeroed", info_edit(|i| *i = RingInfo::default())));
    rings.push(("info-major-2", info_edit(|i| i.version_major = 2)));
    rings.push(("info-minor-3", info_edit(|i| i.version_minor = 3)));
    rings.push(("info-minor-9", info_edit(|i| i.version_minor = 9)));
    rings.push(("info-data-offset", info_edit(|i| i.data_offset = 8192)));
    rings.push(("info-data-size-3000", info_edit(|i| i.data_size = 3000)));
    rings.push(("info-data-size-2048", info_edit(|i| i.data_size = 2048)));
    rings.push((
        "info-data-size-too-big",
        info_edit(|i| i.data_size = 1 << 21),
    ));
    rings.push(("info-record-max-24", info_edit(|i| i.record_max = 24)));
    rings.push((
        "info-record-max-unaligned",
        info_edit(|i| i.record_max = 740),
    ));
    rings.push((
        "info-record-max-above-area",
        info_edit(|i| i.record_max = 8192),
    ));
    rings.push(("info-wakeup-0", info_edit(|i| i.wakeup_bytes = 0)));
    rings.push((
        "info-wakeup-above-area",
        info_edit(|i| i.wakeup_bytes = 4104),
    ));
    // A valid info whose record_max is below a sample's size: the reader refuses the sample.
    rings.push(("info-record-max-32", info_edit(|i| i.record_max = 32)));

    // Positions.
    let positions = |tail: u64, head: u64| {
        let mut image = wrapped(1, 0, 12);
        image.control.consumer.tail = tail;
        image.control.producer.head = head;
        image
    };
    rings.push(("tail-misaligned", positions(4, 800)));
    rings.push(("head-misaligned", positions(0, 803)));
    rings.push(("tail-ahead", positions(1600, 800)));
    rings.push(("tail-ahead-by-one-record", positions(232, 0)));
    rings.push(("tail-behind", positions(0, 4104)));
    rings.push(("tail-far-behind", positions(0, 1 << 40)));

    // Records, each broken after a valid one: the first is read, the second refused.
    let broken = |edit: &dyn Fn(&mut Image, usize)| {
        let mut image = Image::new(1, 8192);
        image.sample(1, 4).lost(1, 2).sample(3, 2);
        let second = 224 + 32;
        edit(&mut image, second);
        image
    };
    rings.push(("kind-0", broken(&|i, at| set_header(i, at, 0, 32))));
    rings.push(("zeroed-area", {
        let mut image = Image::new(1, 0);
        image.control.producer.head = 512;
        image
    }));
    rings.push(("size-unaligned", broken(&|i, at| set_header(i, at, 2, 36))));
    rings.push(("size-0", broken(&|i, at| set_header(i, at, 2, 0))));
    rings.push(("size-4", broken(&|i, at| set_header(i, at, 5, 4))));
    rings.push((
        "size-above-record-max",
        broken(&|i, at| set_header(i, at, 1, 744)),
    ));
    rings.push(("size-max", broken(&|i, at| set_header(i, at, 5, 0xfff8))));
    rings.push(("past-head", broken(&|i, _| i.control.producer.head -= 8)));
    rings.push(("chain-65", {
        broken(&|i, at| {
            let at = at + 32;
            i.data[at + 48..at + 52].copy_from_slice(&65u32.to_le_bytes());
        })
    }));
    rings.push(("chain-max", {
        broken(&|i, at| {
            let at = at + 32;
            i.data[at + 48..at + 52].copy_from_slice(&u32::MAX.to_le_bytes());
        })
    }));
    rings.push(("sample-size-disagrees", {
        broken(&|i, at| {
            let at = at + 32;
            i.data[at + 48..at + 52].copy_from_slice(&1u32.to_le_bytes());
        })
    }));
    rings.push((
        "sample-below-fixed-part",
        broken(&|i, at| set_header(i, at, 1, 216)),
    ));
    rings.push(("lost-size-40", broken(&|i, at| set_header(i, at, 2, 40))));
    rings.push(("lost-size-8", broken(&|i, at| set_header(i, at, 2, 8))));
    rings.push(("pad-short", broken(&|i, at| set_header(i, at, 3, 32))));
    let mut past_end = Image::new(1, 4096 - 32);
    past_end.consume();
    past_end.control.producer.head = past_end.control.consumer.tail;
    past_end.lost(1, 1).lost(2, 2);
    let at = past_end.tail_offset();
    set_header(&mut past_end, at, 2, 40);
    rings.push(("past-end", past_end));
    let mut walks_off = wrapped(1, 0, 40);
    walks_off.control.info.data_size = 8192;
    rings.push(("info-data-size-beyond-file", walks_off));

    let mut all: Vec<(String, Image)> = rings
        .into_iter()
        .map(|(name, image)| (name.to_owned(), image))
        .collect();
    for seed in 1..=10u64 {
        all.push((format!("random-{seed}"), random_image(seed)));
    }
    all.into_iter()
        .enumerate()
        .map(|(i, (name, image))| (format!("{i:02}-{name}"), image))
        .collect()
}
