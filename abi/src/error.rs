//! Errors of the page helpers. None of them panics; every check returns one of these.

/// `AbiError::code`: the page is not one aligned page (Rust's `PageView::from_bytes` only).
pub const XENPMU_CHECK_NOT_A_PAGE: u32 = 1;
/// `AbiError::code`: `magic` is not `XENPMU_MAGIC`.
pub const XENPMU_CHECK_BAD_MAGIC: u32 = 2;
/// `AbiError::code`: `version_major` is not `XENPMU_VERSION_MAJOR`.
pub const XENPMU_CHECK_MAJOR_MISMATCH: u32 = 3;
/// `AbiError::code`: `defined_size` below 1280, above 4096 or not a multiple of 8.
pub const XENPMU_CHECK_DEFINED_SIZE: u32 = 4;
/// `AbiError::code`: the page holds another vendor's context (or none).
pub const XENPMU_CHECK_WRONG_VENDOR: u32 = 5;
/// `AbiError::code`: a bank lies outside the vendor area, inside its fixed part, or is
/// misaligned.
pub const XENPMU_CHECK_BANK_OUT_OF_BOUNDS: u32 = 6;
/// `AbiError::code`: the two banks of a context overlap.
pub const XENPMU_CHECK_BANKS_OVERLAP: u32 = 7;
/// `AbiError::code`: a bank index at or beyond the bank's count.
pub const XENPMU_CHECK_INDEX_OUT_OF_RANGE: u32 = 8;

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

impl AbiError {
    /// The `XENPMU_CHECK_*` code of this error: the value the C helpers'
    /// `xenpmu_*_verdict()` functions return for the same page.
    pub fn code(&self) -> u32 {
        match self {
            AbiError::NotAPage { .. } => XENPMU_CHECK_NOT_A_PAGE,
            AbiError::BadMagic { .. } => XENPMU_CHECK_BAD_MAGIC,
            AbiError::MajorMismatch { .. } => XENPMU_CHECK_MAJOR_MISMATCH,
            AbiError::DefinedSizeInvalid { .. } => XENPMU_CHECK_DEFINED_SIZE,
            AbiError::WrongVendor { .. } => XENPMU_CHECK_WRONG_VENDOR,
            AbiError::BankOutOfBounds { .. } => XENPMU_CHECK_BANK_OUT_OF_BOUNDS,
            AbiError::BanksOverlap => XENPMU_CHECK_BANKS_OVERLAP,
            AbiError::IndexOutOfRange { .. } => XENPMU_CHECK_INDEX_OUT_OF_RANGE,
        }
    }
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
