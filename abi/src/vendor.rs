//! The vendor counter context inside the page, and the counter banks located by offsets.
//!
//! The vendor area starts with a fixed part (`IntelCtxt` or `AmdCtxt`, 64 bytes each) whose
//! first words say where the counter banks are, as byte offsets from the start of the vendor
//! area, and how many entries they have. The hypervisor writes those words at init and never
//! reads them back: it addresses the banks through the layout it computed itself. A consumer
//! validates them once (`IntelBanks::from_ctxt`, `AmdBanks::from_ctxt`) and every bank access is
//! bounds-checked again.

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::error::AbiError;

/// Size of the vendor area in bytes.
pub const XENPMU_VENDOR_AREA_SIZE: usize = 1024;
/// Size of the fixed part (`IntelCtxt` / `AmdCtxt`) at the start of the vendor area; banks
/// start at or after it.
pub const XENPMU_VENDOR_CTXT_SIZE: usize = 64;

/// The vendor area: `XENPMU_VENDOR_AREA_SIZE` bytes, kept as 64-bit words so that every bank
/// entry is naturally aligned.
#[repr(C)]
#[derive(Clone, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct VendorArea {
    /// The area's contents as 64-bit words; interpret through `IntelCtxt`/`AmdCtxt` and banks.
    pub words: [u64; 128],
}

impl Default for VendorArea {
    fn default() -> Self {
        <Self as FromZeros>::new_zeroed()
    }
}

/// One general-purpose counter and its event-select (Intel GP bank entry).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct CounterPair {
    /// Counter value (IA32_PMCx).
    pub counter: u64,
    /// Event select (IA32_PERFEVTSELx).
    pub control: u64,
}

/// Fixed part of the Intel context, at the start of the vendor area.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct IntelCtxt {
    /// Byte offset of the fixed-counter bank (`fixed_count` × u64) from the vendor area start.
    /// Hypervisor-written; read-only for the guest.
    pub fixed_counters: u32,
    /// Byte offset of the GP bank (`arch_count` × `CounterPair`) from the vendor area start.
    /// Hypervisor-written; read-only for the guest.
    pub arch_counters: u32,
    /// Number of fixed counters in the bank. Hypervisor-written; read-only for the guest.
    pub fixed_count: u32,
    /// Number of GP counter/control pairs in the bank. Hypervisor-written; read-only for the guest.
    pub arch_count: u32,
    /// IA32_PERF_GLOBAL_CTRL.
    pub global_ctrl: u64,
    /// IA32_PERF_GLOBAL_STATUS (the virtual status: overflows not yet acknowledged).
    pub global_status: u64,
    /// IA32_PERF_GLOBAL_OVF_CTRL: bits the guest asks to clear from `global_status` at flush.
    pub global_ovf_ctrl: u64,
    /// IA32_FIXED_CTR_CTRL.
    pub fixed_ctrl: u64,
    /// IA32_DS_AREA.
    pub ds_area: u64,
    /// IA32_PEBS_ENABLE.
    pub pebs_enable: u64,
}

/// Fixed part of the AMD context, at the start of the vendor area.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct AmdCtxt {
    /// Byte offset of the counter bank (`counter_count` × u64, PERF_CTRn) from the vendor area
    /// start. Hypervisor-written; read-only for the guest.
    pub counters: u32,
    /// Byte offset of the control bank (`counter_count` × u64, PERF_CTLn) from the vendor area
    /// start. Hypervisor-written; read-only for the guest.
    pub ctrls: u32,
    /// Number of core counters (4 legacy K7, 6 with PerfCtrExtCore, or PerfMonV2's count).
    /// Hypervisor-written; read-only for the guest.
    pub counter_count: u32,
    /// Reserved, zero.
    pub _pad0: u32,
    /// PerfMonV2 PerfCntrGlobalCtl (zero without PerfMonV2).
    pub global_ctrl: u64,
    /// PerfMonV2 PerfCntrGlobalStatus (zero without PerfMonV2).
    pub global_status: u64,
    /// Reserved, zero; a later minor version may define it.
    pub _reserved0: [u64; 4],
}

const WORD: usize = core::mem::size_of::<u64>();
const PAIR: usize = core::mem::size_of::<CounterPair>();

/// Where the Intel banks are: a validated layout. Built by the hypervisor from its enumerated
/// counts (`IntelBanks::new`) or by a consumer from the page (`IntelBanks::from_ctxt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntelBanks {
    fixed_offset: usize,
    fixed_count: usize,
    arch_offset: usize,
    arch_count: usize,
}

/// Where the AMD banks are: a validated layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmdBanks {
    counters_offset: usize,
    ctrls_offset: usize,
    count: usize,
}

/// Checks that a bank of `count` entries of `entry` bytes at `offset` lies inside the vendor
/// area after the fixed part and is 8-byte aligned. Returns the end offset.
fn check_bank(
    bank: &'static str,
    offset: usize,
    count: usize,
    entry: usize,
) -> Result<usize, AbiError> {
    let out_of_bounds = AbiError::BankOutOfBounds {
        bank,
        offset,
        count,
    };
    if offset % WORD != 0 || offset < XENPMU_VENDOR_CTXT_SIZE {
        return Err(out_of_bounds);
    }
    let end = count
        .checked_mul(entry)
        .and_then(|len| offset.checked_add(len))
        .ok_or(out_of_bounds)?;
    if end > XENPMU_VENDOR_AREA_SIZE {
        return Err(out_of_bounds);
    }
    Ok(end)
}

fn check_disjoint(first: (usize, usize), second: (usize, usize)) -> Result<(), AbiError> {
    let (a_start, a_end) = first;
    let (b_start, b_end) = second;
    if a_start < a_end && b_start < b_end && a_start < b_end && b_start < a_end {
        return Err(AbiError::BanksOverlap);
    }
    Ok(())
}

impl VendorArea {
    fn word(&self, byte_offset: usize) -> Result<u64, AbiError> {
        self.words
            .get(byte_offset / WORD)
            .copied()
            .ok_or(AbiError::BankOutOfBounds {
                bank: "vendor area",
                offset: byte_offset,
                count: 1,
            })
    }

    /// The `count` words from `byte_offset`, if they are inside the area.
    fn words_mut(&mut self, byte_offset: usize, count: usize) -> Option<&mut [u64]> {
        let first = byte_offset / WORD;
        self.words.get_mut(first..first.checked_add(count)?)
    }

    fn word_mut(&mut self, byte_offset: usize) -> Result<&mut u64, AbiError> {
        self.words
            .get_mut(byte_offset / WORD)
            .ok_or(AbiError::BankOutOfBounds {
                bank: "vendor area",
                offset: byte_offset,
                count: 1,
            })
    }

    /// `count` consecutive words from `byte_offset` (a multiple of 8: every validated bank
    /// starts at one), bounds-checked once for the whole bank.
    fn bank_words(
        &self,
        bank: &'static str,
        byte_offset: usize,
        count: usize,
    ) -> Result<&[u64], AbiError> {
        let start = byte_offset / WORD;
        start
            .checked_add(count)
            .and_then(|end| self.words.get(start..end))
            .ok_or(AbiError::BankOutOfBounds {
                bank,
                offset: byte_offset,
                count,
            })
    }

    /// The Intel fixed part at the start of the area (a copy).
    pub fn intel_ctxt(&self) -> IntelCtxt {
        let (ctxt, _) = IntelCtxt::read_from_prefix(self.as_bytes())
            .unwrap_or_else(|_| (IntelCtxt::default(), &[]));
        ctxt
    }

    /// Replaces the Intel fixed part at the start of the area.
    #[inline]
    pub fn set_intel_ctxt(&mut self, ctxt: &IntelCtxt) {
        if let Some(prefix) = self.as_mut_bytes().get_mut(..XENPMU_VENDOR_CTXT_SIZE) {
            prefix.copy_from_slice(ctxt.as_bytes());
        }
    }

    /// The AMD fixed part at the start of the area (a copy).
    pub fn amd_ctxt(&self) -> AmdCtxt {
        let (ctxt, _) = AmdCtxt::read_from_prefix(self.as_bytes())
            .unwrap_or_else(|_| (AmdCtxt::default(), &[]));
        ctxt
    }

    /// Replaces the AMD fixed part at the start of the area.
    #[inline]
    pub fn set_amd_ctxt(&mut self, ctxt: &AmdCtxt) {
        if let Some(prefix) = self.as_mut_bytes().get_mut(..XENPMU_VENDOR_CTXT_SIZE) {
            prefix.copy_from_slice(ctxt.as_bytes());
        }
    }
}

impl IntelBanks {
    /// The canonical layout for `fixed_count` fixed and `arch_count` GP counters: the fixed bank
    /// right after the fixed part, the GP bank right after it. Fails with
    /// `AbiError::BankOutOfBounds` when the counters do not fit in the vendor area.
    pub fn new(fixed_count: u32, arch_count: u32) -> Result<Self, AbiError> {
        let fixed_count = fixed_count as usize;
        let fixed_offset = XENPMU_VENDOR_CTXT_SIZE;
        let arch_offset = check_bank("intel fixed", fixed_offset, fixed_count, WORD)?;
        Self::validated(fixed_offset, fixed_count, arch_offset, arch_count as usize)
    }

    /// Validates the layout a page's `IntelCtxt` describes.
    pub fn from_ctxt(ctxt: &IntelCtxt) -> Result<Self, AbiError> {
        Self::validated(
            ctxt.fixed_counters as usize,
            ctxt.fixed_count as usize,
            ctxt.arch_counters as usize,
            ctxt.arch_count as usize,
        )
    }

    fn validated(
        fixed_offset: usize,
        fixed_count: usize,
        arch_offset: usize,
        arch_count: usize,
    ) -> Result<Self, AbiError> {
        let fixed_end = check_bank("intel fixed", fixed_offset, fixed_count, WORD)?;
        let arch_end = check_bank("intel arch", arch_offset, arch_count, PAIR)?;
        check_disjoint((fixed_offset, fixed_end), (arch_offset, arch_end))?;
        Ok(Self {
            fixed_offset,
            fixed_count,
            arch_offset,
            arch_count,
        })
    }

    /// Number of fixed counters.
    pub fn fixed_count(&self) -> u32 {
        self.fixed_count as u32
    }

    /// Number of GP counter/control pairs.
    pub fn arch_count(&self) -> u32 {
        self.arch_count as u32
    }

    /// Byte offset just past the fixed part and both banks: the part of the vendor area this
    /// layout uses.
    pub fn end(&self) -> usize {
        let fixed_end = self.fixed_offset + self.fixed_count * WORD;
        let arch_end = self.arch_offset + self.arch_count * PAIR;
        fixed_end.max(arch_end).max(XENPMU_VENDOR_CTXT_SIZE)
    }

    /// The whole fixed-counter bank (`fixed_count` words), for a reader of every entry: one
    /// bounds check instead of one per entry.
    pub fn fixed_bank<'a>(&self, area: &'a VendorArea) -> Result<&'a [u64], AbiError> {
        area.bank_words("intel fixed", self.fixed_offset, self.fixed_count)
    }

    /// The whole GP bank (`arch_count` pairs), as [`IntelBanks::fixed_bank`].
    pub fn arch_bank<'a>(&self, area: &'a VendorArea) -> Result<&'a [CounterPair], AbiError> {
        let out_of_bounds = AbiError::BankOutOfBounds {
            bank: "intel arch",
            offset: self.arch_offset,
            count: self.arch_count,
        };
        let words = self
            .arch_count
            .checked_mul(PAIR / WORD)
            .ok_or(out_of_bounds)?;
        let bank = area.bank_words("intel arch", self.arch_offset, words)?;
        <[CounterPair]>::ref_from_bytes(bank.as_bytes()).map_err(|_| out_of_bounds)
    }

    /// Writes the offset and count words of this layout into `ctxt` (hypervisor, at init).
    pub fn describe_in(&self, ctxt: &mut IntelCtxt) {
        ctxt.fixed_counters = self.fixed_offset as u32;
        ctxt.fixed_count = self.fixed_count as u32;
        ctxt.arch_counters = self.arch_offset as u32;
        ctxt.arch_count = self.arch_count as u32;
    }

    fn fixed_at(&self, index: usize) -> Result<usize, AbiError> {
        if index >= self.fixed_count {
            return Err(AbiError::IndexOutOfRange {
                bank: "intel fixed",
                index,
                count: self.fixed_count,
            });
        }
        Ok(self.fixed_offset + index * WORD)
    }

    fn pair_at(&self, index: usize) -> Result<usize, AbiError> {
        if index >= self.arch_count {
            return Err(AbiError::IndexOutOfRange {
                bank: "intel arch",
                index,
                count: self.arch_count,
            });
        }
        Ok(self.arch_offset + index * PAIR)
    }

    /// Fixed counter `index`.
    pub fn fixed_counter(&self, area: &VendorArea, index: usize) -> Result<u64, AbiError> {
        area.word(self.fixed_at(index)?)
    }

    /// Sets fixed counter `index`.
    pub fn set_fixed_counter(
        &self,
        area: &mut VendorArea,
        index: usize,
        value: u64,
    ) -> Result<(), AbiError> {
        *area.word_mut(self.fixed_at(index)?)? = value;
        Ok(())
    }

    /// Fills both banks at once (the hypervisor publishing a context): the fixed bank from
    /// `fixed`, the GP bank from `gp_counters` and `gp_controls` paired up, each as far as the
    /// bank and the values both go. One bounds check per bank instead of one per entry; the
    /// GP bank is interleaved by a straight indexed loop over slices cut to one length (no
    /// bounds check inside, no iterator adapters), which, inlined into a backend's publishing
    /// (whose arrays have a fixed size), unrolls to a few moves per pair.
    #[inline]
    pub fn set_banks(
        &self,
        area: &mut VendorArea,
        fixed: &[u64],
        gp_counters: &[u64],
        gp_controls: &[u64],
    ) {
        if let Some(bank) = area.words_mut(self.fixed_offset, self.fixed_count) {
            let n = bank.len().min(fixed.len());
            bank[..n].copy_from_slice(&fixed[..n]);
        }
        if let Some(bank) = area.words_mut(self.arch_offset, 2 * self.arch_count) {
            let n = (bank.len() / 2)
                .min(gp_counters.len())
                .min(gp_controls.len());
            let (bank, counters, controls) =
                (&mut bank[..2 * n], &gp_counters[..n], &gp_controls[..n]);
            for i in 0..n {
                bank[2 * i] = counters[i];
                bank[2 * i + 1] = controls[i];
            }
        }
    }

    /// GP counter/control pair `index`.
    pub fn pair(&self, area: &VendorArea, index: usize) -> Result<CounterPair, AbiError> {
        let at = self.pair_at(index)?;
        Ok(CounterPair {
            counter: area.word(at)?,
            control: area.word(at + WORD)?,
        })
    }

    /// Sets GP counter/control pair `index`.
    pub fn set_pair(
        &self,
        area: &mut VendorArea,
        index: usize,
        pair: CounterPair,
    ) -> Result<(), AbiError> {
        let at = self.pair_at(index)?;
        *area.word_mut(at)? = pair.counter;
        *area.word_mut(at + WORD)? = pair.control;
        Ok(())
    }
}

impl AmdBanks {
    /// The canonical layout for `count` core counters: counters right after the fixed part, then
    /// controls. Fails with `AbiError::BankOutOfBounds` when they do not fit.
    pub fn new(count: u32) -> Result<Self, AbiError> {
        let count = count as usize;
        let counters_offset = XENPMU_VENDOR_CTXT_SIZE;
        let ctrls_offset = check_bank("amd counters", counters_offset, count, WORD)?;
        Self::validated(counters_offset, ctrls_offset, count)
    }

    /// Validates the layout a page's `AmdCtxt` describes.
    pub fn from_ctxt(ctxt: &AmdCtxt) -> Result<Self, AbiError> {
        Self::validated(
            ctxt.counters as usize,
            ctxt.ctrls as usize,
            ctxt.counter_count as usize,
        )
    }

    fn validated(
        counters_offset: usize,
        ctrls_offset: usize,
        count: usize,
    ) -> Result<Self, AbiError> {
        let counters_end = check_bank("amd counters", counters_offset, count, WORD)?;
        let ctrls_end = check_bank("amd ctrls", ctrls_offset, count, WORD)?;
        check_disjoint((counters_offset, counters_end), (ctrls_offset, ctrls_end))?;
        Ok(Self {
            counters_offset,
            ctrls_offset,
            count,
        })
    }

    /// Number of core counters.
    pub fn count(&self) -> u32 {
        self.count as u32
    }

    /// Byte offset just past the fixed part and both banks: the part of the vendor area this
    /// layout uses.
    pub fn end(&self) -> usize {
        let counters_end = self.counters_offset + self.count * WORD;
        let ctrls_end = self.ctrls_offset + self.count * WORD;
        counters_end.max(ctrls_end).max(XENPMU_VENDOR_CTXT_SIZE)
    }

    /// The whole counter bank (`count` words, PERF_CTRn), for a reader of every entry: one
    /// bounds check instead of one per entry.
    pub fn counter_bank<'a>(&self, area: &'a VendorArea) -> Result<&'a [u64], AbiError> {
        area.bank_words("amd counters", self.counters_offset, self.count)
    }

    /// The whole control bank (`count` words, PERF_CTLn), as [`AmdBanks::counter_bank`].
    pub fn ctrl_bank<'a>(&self, area: &'a VendorArea) -> Result<&'a [u64], AbiError> {
        area.bank_words("amd ctrls", self.ctrls_offset, self.count)
    }

    /// Writes the offset and count words of this layout into `ctxt` (hypervisor, at init).
    pub fn describe_in(&self, ctxt: &mut AmdCtxt) {
        ctxt.counters = self.counters_offset as u32;
        ctxt.ctrls = self.ctrls_offset as u32;
        ctxt.counter_count = self.count as u32;
    }

    fn entry_at(&self, bank: &'static str, base: usize, index: usize) -> Result<usize, AbiError> {
        if index >= self.count {
            return Err(AbiError::IndexOutOfRange {
                bank,
                index,
                count: self.count,
            });
        }
        Ok(base + index * WORD)
    }

    /// Counter `index` (PERF_CTRn).
    pub fn counter(&self, area: &VendorArea, index: usize) -> Result<u64, AbiError> {
        area.word(self.entry_at("amd counters", self.counters_offset, index)?)
    }

    /// Sets counter `index`.
    pub fn set_counter(
        &self,
        area: &mut VendorArea,
        index: usize,
        value: u64,
    ) -> Result<(), AbiError> {
        *area.word_mut(self.entry_at("amd counters", self.counters_offset, index)?)? = value;
        Ok(())
    }

    /// Fills both banks at once (the hypervisor publishing a context) from `counters` and
    /// `ctrls`, each as far as the bank and the values both go. One bounds check per bank
    /// instead of one per entry; inlined into a backend's publishing, as
    /// [`IntelBanks::set_banks`].
    #[inline]
    pub fn set_banks(&self, area: &mut VendorArea, counters: &[u64], ctrls: &[u64]) {
        for (offset, values) in [(self.counters_offset, counters), (self.ctrls_offset, ctrls)] {
            if let Some(bank) = area.words_mut(offset, self.count) {
                let n = bank.len().min(values.len());
                bank[..n].copy_from_slice(&values[..n]);
            }
        }
    }

    /// Control `index` (PERF_CTLn).
    pub fn ctrl(&self, area: &VendorArea, index: usize) -> Result<u64, AbiError> {
        area.word(self.entry_at("amd ctrls", self.ctrls_offset, index)?)
    }

    /// Sets control `index`.
    pub fn set_ctrl(
        &self,
        area: &mut VendorArea,
        index: usize,
        value: u64,
    ) -> Result<(), AbiError> {
        *area.word_mut(self.entry_at("amd ctrls", self.ctrls_offset, index)?)? = value;
        Ok(())
    }
}
