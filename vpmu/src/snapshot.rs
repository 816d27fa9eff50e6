//! A vCPU's PMU state as data: a versioned, self-describing snapshot, taken on a quiesced vCPU
//! and restored on another host or pCPU ([`VcpuSnapshot`]; docs/snapshot.md specifies the byte
//! layout and the rules).
//!
//! A snapshot is untrusted input wherever it comes from. Restoring one copies it (the decoder
//! reads the bytes once into a [`VcpuSnapshot`]), verifies all of it, and only then applies it:
//! every register through the vendor backend's own WRMSR validators
//! ([`SnapshotBackend::context_from_registers`], the one owner of each register's rules), the
//! ring's configuration through the checks of `XENPMU_OP_RING_INIT`, and the frames through the
//! platform's mapping and the same in-use checks as a registration. A refusal names its reason
//! ([`RestoreError`]) and changes nothing.
//!
//! The vendor part is behind [`SnapshotBackend`]: a backend lists the guest-visible registers
//! of a context as (MSR number, value) pairs in its own canonical order, plus any state a
//! guest can observe that no MSR holds ([`RegisterKind::State`]), and rebuilds a context from
//! such a list.

mod apply;
mod codec;

use crate::backend::{ContextError, CounterSet, GuestPolicy, PmuBackend, PmuCapabilities};
use crate::core::Mode;
use crate::platform::MapError;

pub use apply::RESTORED_SAMPLE_PCPU;
pub use codec::{DecodeError, EncodeError, FORMAT_MAJOR, FORMAT_MINOR, MAGIC, reseal};

/// The most registers one snapshot holds: Intel v5 has 24, AMD PerfMonV2 15.
pub const MAX_REGISTERS: usize = 32;

/// What a register entry of a snapshot names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegisterKind {
    /// An architectural PMU register: `number` is the MSR a guest WRMSR of it names (the
    /// backend's canonical alias), `value` what the guest reads back from it.
    Msr,
    /// State a guest can observe that no MSR holds, numbered by the backend (e.g. AMD's
    /// record of which counters were armed for overflow detection before PerfMonV2).
    State,
}

impl RegisterKind {
    /// The kind's number in the byte layout.
    pub const fn to_u16(self) -> u16 {
        match self {
            RegisterKind::Msr => 0,
            RegisterKind::State => 1,
        }
    }

    /// The kind of a layout number; `None` for an unknown one.
    pub const fn from_u16(value: u16) -> Option<Self> {
        match value {
            0 => Some(RegisterKind::Msr),
            1 => Some(RegisterKind::State),
            _ => None,
        }
    }
}

/// One register of a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SnapshotRegister {
    /// What `number` names.
    pub kind: RegisterKind,
    /// The MSR number, or the backend's state number.
    pub number: u32,
    /// Its value.
    pub value: u64,
}

impl SnapshotRegister {
    /// An MSR entry.
    pub const fn msr(number: u32, value: u64) -> Self {
        SnapshotRegister {
            kind: RegisterKind::Msr,
            number,
            value,
        }
    }

    /// A state entry.
    pub const fn state(number: u32, value: u64) -> Self {
        SnapshotRegister {
            kind: RegisterKind::State,
            number,
            value,
        }
    }
}

/// The registers of a snapshot, in the backend's canonical order (at most [`MAX_REGISTERS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registers {
    entries: [SnapshotRegister; MAX_REGISTERS],
    len: usize,
    /// A push found the list full (what `Vpmu::take_snapshot` refuses).
    overflowed: bool,
}

impl Default for Registers {
    fn default() -> Self {
        Self::new()
    }
}

/// The list is full: a backend listed more than [`MAX_REGISTERS`] registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistersFull;

impl Registers {
    /// An empty list.
    pub const fn new() -> Self {
        Registers {
            entries: [SnapshotRegister::msr(0, 0); MAX_REGISTERS],
            len: 0,
            overflowed: false,
        }
    }

    /// Appends `register`; on a full list nothing is appended and the list remembers it
    /// ([`Registers::overflowed`]).
    pub fn push(&mut self, register: SnapshotRegister) -> Result<(), RegistersFull> {
        let Some(slot) = self.entries.get_mut(self.len) else {
            self.overflowed = true;
            return Err(RegistersFull);
        };
        *slot = register;
        self.len += 1;
        Ok(())
    }

    /// Whether a push found the list full: registers were left out.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The registers, in order.
    pub fn as_slice(&self) -> &[SnapshotRegister] {
        self.entries.get(..self.len).unwrap_or(&[])
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of the entry of `kind` and `number`, if listed.
    pub fn value(&self, kind: RegisterKind, number: u32) -> Option<u64> {
        self.as_slice()
            .iter()
            .find(|r| r.kind == kind && r.number == number)
            .map(|r| r.value)
    }
}

/// The vendor part of snapshots: implemented by each vendor backend (and by the run-time
/// vendor choice), it is the one place that knows which registers a context has and what
/// each may hold.
pub trait SnapshotBackend: PmuBackend {
    /// Lists every guest-visible register of `ctx` (a saved context: not loaded on any
    /// hardware) into `out`, emptied first, in the backend's canonical order: exactly the
    /// registers of the enumerated PMU, each once. The list of a reset context names the
    /// same registers in the same order (a restore checks a snapshot's list against it).
    fn context_registers(&self, ctx: &Self::Context, out: &mut Registers);

    /// Rebuilds a context from `registers` (already checked to name exactly the registers
    /// [`SnapshotBackend::context_registers`] lists, in its order), judging every value with
    /// the validator a guest WRMSR of that register goes through under `policy` (and state
    /// entries with their own consistency rules). Anything refused is an error naming the
    /// register and the reason, never fixed up; on success `out` holds the context with its
    /// hardware images computed under `policy`, on failure it is unchanged.
    fn context_from_registers(
        &self,
        registers: &Registers,
        policy: &GuestPolicy<'_>,
        out: &mut Self::Context,
    ) -> Result<(), ContextError>;
}

/// Where a snapshotted vCPU's context was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SnapshotState {
    /// The guest never touched the PMU (`VcpuState::Allocated`): the registers are the reset
    /// ones.
    Unused,
    /// The context was saved (`VcpuState::Saved`; a vCPU switched out with its context
    /// loaded is saved by the switch).
    Saved,
    /// A sample of its own counters was cached in its page and not yet flushed
    /// (`VcpuState::Cached` from `SampleSource::Own`): the registers are the context the page
    /// was published from, which the flush verifies the page against.
    SampleCached,
}

/// The shared page's registration (guest addresses and the hypervisor's own counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRegistration {
    /// The page's guest frame.
    pub gfn: u64,
    /// The sequence number of the last sample generated for the page.
    pub samples: u64,
    /// Call-chain entries the last published sample wrote (at most `XENPMU_CALLCHAIN_MAX`).
    pub chain_written: u32,
}

/// Samples lost and not yet reported by a lost record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLostRecord {
    /// How many (at least 1).
    pub count: u64,
    /// The last one's sequence number.
    pub sequence: u64,
    /// The last one's time (`Platform::timestamp`).
    pub tsc: u64,
}

/// The sample ring's registration (ABI 1.4) and its producer's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingRegistration {
    /// The control page's guest frame (the data pages follow it).
    pub gfn: u64,
    /// Data pages.
    pub data_pages: u32,
    /// The wakeup watermark in force, in bytes.
    pub wakeup_bytes: u32,
    /// The latency bound as configured, in microseconds (the destination converts it with
    /// its own clock rate).
    pub max_latency_us: u32,
    /// Re-arm periods of the general-purpose counters.
    pub period_gp: [u64; vpmu_abi::XENPMU_RING_GP_PERIODS],
    /// Re-arm periods of the fixed counters.
    pub period_fixed: [u64; vpmu_abi::XENPMU_RING_FIXED_PERIODS],
    /// The producer's head.
    pub head: u64,
    /// The producer's counters.
    pub counters: crate::ring::ProducerCounters,
    /// Lost samples not yet reported.
    pub pending_lost: Option<RingLostRecord>,
    /// Bytes published since the last wakeup.
    pub unsignalled_bytes: u64,
    /// The time of the oldest record published since the last wakeup.
    pub unsignalled_since: Option<u64>,
    /// Whether the current episode of losses was signalled.
    pub loss_signalled: bool,
}

/// One vCPU's PMU state as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VcpuSnapshot {
    /// The PMU the context belongs to, as the source backend enumerated it (what the guest
    /// was shown).
    pub shape: PmuCapabilities,
    /// The mode in force at the source.
    pub mode: Mode,
    /// The `XENPMU_FEATURE_*` bits in force at the source.
    pub features: u64,
    /// Where the context was.
    pub state: SnapshotState,
    /// Every guest-visible register, in the backend's canonical order.
    pub registers: Registers,
    /// An overflow saved with the context whose PMI is still to be delivered: its counters
    /// (non-empty; its interrupt was enabled).
    pub pending_pmi: Option<CounterSet>,
    /// The page path's virtual LVTPC mask.
    pub page_lvtpc_masked: bool,
    /// The shared page, if registered.
    pub page: Option<PageRegistration>,
    /// The sample ring, if registered.
    pub ring: Option<RingRegistration>,
}

/// Why a snapshot could not be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeError {
    /// The vCPU runs on a pCPU (or its context is loaded on one): switch it out first.
    NotQuiesced,
    /// The mode does not keep contexts with their vCPUs (off, all): there is no per-vCPU
    /// state to carry.
    Mode(Mode),
    /// The vCPU holds all-mode system-wide state (a profiler's program, a sample of a pCPU's
    /// system-wide counters, a hand-over in flight), which belongs to pCPUs, not to it.
    SystemWide,
    /// A PMI the platform queued for delivery has not been reported done
    /// (`Vpmu::lvtpc_delivery_done`).
    PmiInFlight,
    /// The backend listed more registers than a snapshot holds.
    TooManyRegisters,
}

/// Why a snapshot was refused; nothing was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreError {
    /// The snapshot is of the other vendor's PMU.
    Vendor,
    /// The snapshot's PMU shape differs from this backend's in `field`.
    Shape {
        /// The field of [`PmuCapabilities`].
        field: &'static str,
        /// The snapshot's value.
        snapshot: u32,
        /// This backend's.
        here: u32,
    },
    /// The mode here keeps no per-vCPU contexts (off, all), or the vCPU has no vPMU.
    Mode(Mode),
    /// The features in force here differ from the snapshot's: the guest would find other
    /// events allowed or refused.
    Features {
        /// The snapshot's.
        snapshot: u64,
        /// In force here.
        here: u64,
    },
    /// The register list is not this PMU's: entry `index` should name `expected` and names
    /// `found` (`None`: past the end of that list).
    RegisterSet {
        /// The position in the list.
        index: usize,
        /// What this backend lists there.
        expected: Option<(RegisterKind, u32)>,
        /// What the snapshot has there.
        found: Option<(RegisterKind, u32)>,
    },
    /// A register's value is refused by its validator.
    Register(ContextError),
    /// The core's part is inconsistent: `what` (e.g. a pending PMI of an absent counter, a
    /// cached sample without a page).
    Inconsistent(&'static str),
    /// The ring's configuration is refused by the checks of `XENPMU_OP_RING_INIT`.
    RingConfig,
    /// The platform could not map the page (or the ring's area).
    Map(MapError),
    /// A frame of the page or the ring is used by another vCPU of the domain.
    FrameInUse,
    /// The table has no such vCPU.
    NoSuchVcpu,
    /// The target vCPU is not fresh (it used its PMU, has a page or a ring, or runs): a
    /// snapshot is restored into a vCPU made by `Vpmu::new_vcpu` and not run since.
    TargetNotFresh,
}

impl core::fmt::Display for TakeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TakeError::NotQuiesced => write!(f, "the vCPU is not switched out"),
            TakeError::Mode(mode) => write!(f, "mode {mode:?} keeps no per-vCPU contexts"),
            TakeError::SystemWide => write!(f, "the vCPU holds all-mode system-wide state"),
            TakeError::PmiInFlight => write!(f, "a queued PMI delivery is not reported done"),
            TakeError::TooManyRegisters => write!(f, "more registers than a snapshot holds"),
        }
    }
}

impl core::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RestoreError::Vendor => write!(f, "the snapshot is of the other vendor"),
            RestoreError::Shape {
                field,
                snapshot,
                here,
            } => write!(
                f,
                "PMU shape differs: {field} {snapshot} in the snapshot, {here} here"
            ),
            RestoreError::Mode(mode) => write!(f, "mode {mode:?} here keeps no vCPU contexts"),
            RestoreError::Features { snapshot, here } => {
                write!(f, "features {snapshot:#x} in the snapshot, {here:#x} here")
            }
            RestoreError::RegisterSet {
                index,
                expected,
                found,
            } => write!(
                f,
                "register {index}: expected {expected:x?}, the snapshot has {found:x?}"
            ),
            RestoreError::Register(error) => write!(
                f,
                "register {} (MSR {:#x}) value {:#x} refused (reason {})",
                error.register, error.msr, error.value, error.reason
            ),
            RestoreError::Inconsistent(what) => write!(f, "inconsistent snapshot: {what}"),
            RestoreError::RingConfig => write!(f, "the ring's configuration is refused"),
            RestoreError::Map(error) => write!(f, "mapping refused: {error:?}"),
            RestoreError::FrameInUse => write!(f, "a frame is used by another vCPU"),
            RestoreError::NoSuchVcpu => write!(f, "no such vCPU"),
            RestoreError::TargetNotFresh => write!(f, "the target vCPU is not fresh"),
        }
    }
}

impl core::error::Error for TakeError {}
impl core::error::Error for RestoreError {}

#[cfg(test)]
mod tests;
