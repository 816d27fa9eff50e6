//! Errors of the page helpers. None of them panics; every check returns one of these.

/// Why a page, or an access into it, was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbiError {
    /// The byte slice is not exactly one page, or not 8-byte aligned.
    NotAPage {
        /// Length of the slice given.
        len: usize,
    },
    /// `Header::magic` is not `XENPMU_MAGIC` (the page was never initialised by this ABI).
    BadMagic {
        /// The magic found.
        found: u32,
    },
    /// `Header::version_major` differs from `XENPMU_VERSION_MAJOR`.
    MajorMismatch {
        /// The major found.
        found: u16,
    },
    /// `Header::defined_size` is smaller than major 1 requires, larger than the page, or not a
    /// multiple of 8.
    DefinedSizeInvalid {
        /// The size found.
        found: u32,
    },
    /// The page holds another vendor's context than the one asked for (or none).
    WrongVendor {
        /// The `XENPMU_VENDOR_*` value asked for.
        expected: u32,
        /// The `XENPMU_VENDOR_*` value in the page.
        found: u32,
    },
    /// A bank offset/count points outside the vendor area, into its fixed part, or is
    /// misaligned.
    BankOutOfBounds {
        /// Which bank.
        bank: &'static str,
        /// Its byte offset from the vendor area start.
        offset: usize,
        /// Its entry count.
        count: usize,
    },
    /// Two banks of one context overlap.
    BanksOverlap,
    /// A counter index at or beyond the bank's count.
    IndexOutOfRange {
        /// Which bank.
        bank: &'static str,
        /// The index asked for.
        index: usize,
        /// The bank's count.
        count: usize,
    },
}

impl core::fmt::Display for AbiError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AbiError::NotAPage { len } => {
                write!(f, "expected one aligned 4096-byte page, got {len} bytes")
            }
            AbiError::BadMagic { found } => write!(f, "bad magic {found:#010x}: not a xenpmu page"),
            AbiError::MajorMismatch { found } => write!(
                f,
                "page has ABI major version {found}, this consumer speaks {}",
                crate::XENPMU_VERSION_MAJOR
            ),
            AbiError::DefinedSizeInvalid { found } => write!(f, "invalid defined size {found}"),
            AbiError::WrongVendor { expected, found } => {
                write!(f, "page holds vendor context {found}, not {expected}")
            }
            AbiError::BankOutOfBounds {
                bank,
                offset,
                count,
            } => write!(
                f,
                "{bank} bank ({count} entries at offset {offset}) lies outside the vendor area"
            ),
            AbiError::BanksOverlap => f.write_str("counter banks overlap"),
            AbiError::IndexOutOfRange { bank, index, count } => {
                write!(f, "{bank} index {index} out of range (bank has {count})")
            }
        }
    }
}

impl core::error::Error for AbiError {}
