//! The global vPMU: the backend, and the policy (mode and features) every pCPU reads.
//!
//! Shared by every physical CPU at once and reached through `&self`. The hot entry points
//! (intercepts, context switch, PMI, cross-CPU requests) read the policy with one atomic load
//! and touch only the local pCPU's [`PcpuPmu`] and the vCPUs at hand. Policy changes are
//! serialized by one small lock, held for a few instructions and never across a request (see
//! `transition`). The entry points live in sibling modules as further `impl Vpmu` blocks.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use vpmu_abi::{
    XENPMU_DOMID_FIRST_RESERVED, XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF,
};

use crate::backend::{GuestPolicy, PmuBackend};
use crate::msr::{MsrBus, MsrFault};
use crate::platform::{Platform, VcpuId};
use crate::state::{PcpuPmu, VcpuPmu};

/// The vPMU mode, decoded once from the ABI's `XENPMU_MODE_*` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// No vPMU for anyone.
    Off,
    /// Every guest profiles itself (`XENPMU_MODE_SELF`).
    SelfProfiling,
    /// As self, and the privileged domain's samples of hypervisor context are delivered to it
    /// (`XENPMU_MODE_HV`).
    Hypervisor,
    /// The privileged domain profiles the whole machine; nobody else has a vPMU
    /// (`XENPMU_MODE_ALL`).
    All,
}

impl Mode {
    /// Decodes an ABI mode value; `None` for anything that is not exactly one mode.
    pub fn from_abi(value: u64) -> Option<Mode> {
        match value {
            XENPMU_MODE_OFF => Some(Mode::Off),
            XENPMU_MODE_SELF => Some(Mode::SelfProfiling),
            XENPMU_MODE_HV => Some(Mode::Hypervisor),
            XENPMU_MODE_ALL => Some(Mode::All),
            _ => None,
        }
    }

    /// The ABI value.
    pub fn to_abi(self) -> u64 {
        match self {
            Mode::Off => XENPMU_MODE_OFF,
            Mode::SelfProfiling => XENPMU_MODE_SELF,
            Mode::Hypervisor => XENPMU_MODE_HV,
            Mode::All => XENPMU_MODE_ALL,
        }
    }

    /// Whether contexts follow their vCPUs (self and hv modes).
    #[inline]
    pub fn switches_contexts(self) -> bool {
        matches!(self, Mode::SelfProfiling | Mode::Hypervisor)
    }
}

/// The policy in force, as one consistent snapshot: every policy change makes a new epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicySnapshot {
    /// The mode.
    pub mode: Mode,
    /// `XENPMU_FEATURE_*` bits.
    pub features: u64,
    /// Incremented by every change of mode, features, or any domain's event filter.
    pub epoch: u64,
}

impl PolicySnapshot {
    // The word: epoch in bits 63:16, features in 15:8, the ABI mode value in 7:0.
    pub(crate) fn pack(self) -> u64 {
        self.epoch << 16 | (self.features & 0xff) << 8 | self.mode.to_abi()
    }

    /// The epoch of a packed word (what most checks compare), without unpacking the rest.
    #[inline(always)]
    pub(crate) const fn epoch_of(word: u64) -> u64 {
        word >> 16
    }

    /// `unpack(word).mode.switches_contexts()`, by one test of the packed word: of the modes
    /// `pack` stores (the ABI's 0, 1, 2 and 4) self and hv are the ones with bit 0 or 1.
    #[inline(always)]
    pub(crate) const fn switches_contexts_of(word: u64) -> bool {
        word & (XENPMU_MODE_SELF | XENPMU_MODE_HV) != 0
    }

    pub(crate) fn unpack(word: u64) -> Self {
        PolicySnapshot {
            mode: MODE_OF_ABI[(word & 7) as usize],
            features: (word >> 8) & 0xff,
            epoch: word >> 16,
        }
    }
}

/// `Mode::from_abi` for the values `pack` stores, as one table load (every hot entry point
/// unpacks the policy): the ABI's modes are 0, 1, 2 and 4.
const MODE_OF_ABI: [Mode; 8] = {
    let mut table = [Mode::Off; 8];
    table[XENPMU_MODE_SELF as usize] = Mode::SelfProfiling;
    table[XENPMU_MODE_HV as usize] = Mode::Hypervisor;
    table[XENPMU_MODE_ALL as usize] = Mode::All;
    table
};

// Every feature bit fits the packed word.
const _: () = assert!(vpmu_abi::XENPMU_FEATURE_MASK <= 0xff);

/// `GuestPolicy::may_count_host` under `mode` of a domain that is (`privileged`) or is not the
/// privileged one: only the privileged profiler, in hv and all mode.
#[inline(always)]
pub(crate) fn may_count_host(mode: Mode, privileged: bool) -> bool {
    privileged && matches!(mode, Mode::Hypervisor | Mode::All)
}

/// An error of an entry point that is not the guest's doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreError {
    /// A hardware access faulted: a hypervisor or backend bug.
    Fault(MsrFault),
    /// The integrator passed a vCPU whose context is loaded on another pCPU than the one the
    /// call was made on (it must be switched out there first).
    WrongPcpu {
        /// The pCPU of the call.
        here: u32,
        /// The pCPU holding the vCPU's context.
        loaded_on: u32,
    },
    /// `attach_pcpu` with an index at or beyond the pCPU count the vPMU was made for (or
    /// beyond [`Vpmu::MAX_PCPUS`]).
    NoSuchPcpu(u32),
    /// `attach_pcpu` of a pCPU that is attached already (and not detached since): a second
    /// `PcpuPmu` for one CPU would clean the PMU under the first one's contexts.
    PcpuAlreadyAttached(u32),
    /// `detach_pcpu` of a pCPU that still runs a vCPU (switch it to none first): its
    /// context would stay `Loaded` on a pCPU that no longer exists.
    PcpuRunsVcpu {
        /// The pCPU.
        pcpu: u32,
        /// The vCPU it runs.
        vcpu: VcpuId,
    },
    /// `context_switch` to a vCPU the `VcpuTable` does not hold. The previous vCPU was
    /// switched out; the pCPU runs none.
    NoSuchVcpu(VcpuId),
    /// `new_vcpu` for a domain id in the reserved range (`XENPMU_DOMID_FIRST_RESERVED` and
    /// up: the page's special identities `XENPMU_DOMID_SELF`, `XENPMU_DOMID_HYPERVISOR`).
    ReservedDomain(u32),
}

/// `detach_pcpu` refused: why, and the pCPU's state handed back, still attached.
pub struct DetachRefused<C, H> {
    /// Why.
    pub error: CoreError,
    /// The pCPU's state, as it was left (still attached: detach it again once the cause is
    /// gone).
    pub pcpu: PcpuPmu<C, H>,
}

impl<C, H> core::fmt::Debug for DetachRefused<C, H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DetachRefused")
            .field("error", &self.error)
            .field("pcpu", &self.pcpu.index)
            .finish_non_exhaustive()
    }
}

impl From<MsrFault> for CoreError {
    fn from(fault: MsrFault) -> Self {
        CoreError::Fault(fault)
    }
}

/// The integrator's table of vCPU states, for the vCPUs a call needs besides the one at hand
/// (the profiler at an all-mode PMI, the target of init and finish, the two vCPUs of a
/// context switch). It takes `&self` so that every pCPU can share one table: an SMP
/// integrator locks each vCPU individually inside `with_vcpu`. The core never calls it while
/// it holds another vCPU of the table, so a per-vCPU lock cannot deadlock against the core.
pub trait VcpuTable<C> {
    /// Runs `visit` on `id`'s state; false if there is no such vCPU.
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) -> bool;
    /// Runs `visit` on every vCPU of `domain`, one at a time.
    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>));

    /// Runs `visit` on `id`'s state and returns what it returned; `None` if there is no such
    /// vCPU. What the context switch calls. The default goes through
    /// [`VcpuTable::with_vcpu`]; a table that overrides it with the same locking lets the
    /// compiler inline the visit (no `dyn` call, no result passed through the closure's
    /// captures), which is a good part of a switch's cost.
    #[inline]
    fn visit<R, F>(&self, id: VcpuId, visit: F) -> Option<R>
    where
        Self: Sized,
        F: FnOnce(&mut VcpuPmu<C>) -> R,
    {
        let mut visit = Some(visit);
        let mut out = None;
        self.with_vcpu(id, &mut |v| {
            if let Some(f) = visit.take() {
                out = Some(f(v));
            }
        });
        out
    }
}

/// The global vPMU state.
#[derive(Debug)]
pub struct Vpmu<B: PmuBackend> {
    pub(crate) backend: B,
    pub(crate) available: bool,
    pub(crate) pcpu_count: u32,
    policy: AtomicU64,
    /// Unprivileged vCPUs whose vPMU is in use (`VcpuPmu::in_use`): a change of mode or
    /// features that needs none is refused while there are any.
    unprivileged_in_use: AtomicU32,
    /// Held (for a few instructions) by a policy change that checks `unprivileged_in_use`:
    /// a vCPU's first use waits for it, so the check and the new policy are atomic for it.
    gate: AtomicBool,
    /// pCPUs that have not caught up with the newest epoch; a new change waits for 0.
    pub(crate) lagging: AtomicU32,
    /// Attached pCPUs: the ones a change waits for.
    online: AtomicU32,
    /// One bit per attached pCPU index, so that no index is attached twice.
    attached: [AtomicU64; ATTACHED_WORDS],
    /// The epoch at which all mode was last entered (system-wide instance counts of older
    /// all-mode periods are void).
    pub(crate) all_since: AtomicU64,
    /// Serializes policy changes, init (the frame-in-use check), attach and detach.
    pub(crate) control: spin::Mutex<()>,
}

/// `Vpmu::MAX_PCPUS`.
const MAX_PCPUS: u32 = 8192;
/// Words of `Vpmu::attached`.
const ATTACHED_WORDS: usize = (MAX_PCPUS / 64) as usize;

impl<B: PmuBackend> Vpmu<B> {
    /// The most physical CPUs one vPMU serves (Linux's largest `NR_CPUS`): `attach_pcpu`
    /// refuses indices from there up with `CoreError::NoSuchPcpu`.
    pub const MAX_PCPUS: u32 = MAX_PCPUS;

    /// A vPMU over `backend` for a host of `pcpus` physical CPUs (at most
    /// [`Vpmu::MAX_PCPUS`] of them can be attached), starting in `mode`.
    pub fn new(backend: B, mode: Mode, pcpus: u32) -> Self {
        Self::with_availability(backend, mode, pcpus, true)
    }

    /// A hypervisor built or booted without a vPMU: every operation is `-EOPNOTSUPP` and every
    /// PMU MSR faults.
    pub fn unavailable(backend: B, pcpus: u32) -> Self {
        Self::with_availability(backend, Mode::Off, pcpus, false)
    }

    fn with_availability(backend: B, mode: Mode, pcpus: u32, available: bool) -> Self {
        let policy = PolicySnapshot {
            mode,
            features: 0,
            epoch: 0,
        };
        Self {
            backend,
            available,
            pcpu_count: pcpus,
            policy: AtomicU64::new(policy.pack()),
            unprivileged_in_use: AtomicU32::new(0),
            gate: AtomicBool::new(false),
            lagging: AtomicU32::new(0),
            online: AtomicU32::new(0),
            attached: [const { AtomicU64::new(0) }; ATTACHED_WORDS],
            all_since: AtomicU64::new(0),
            control: spin::Mutex::new(()),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The policy in force.
    #[inline]
    pub fn policy(&self) -> PolicySnapshot {
        PolicySnapshot::unpack(self.policy_word())
    }

    /// The policy in force, packed: equal words are the same snapshot.
    #[inline(always)]
    pub(crate) fn policy_word(&self) -> u64 {
        self.policy.load(Ordering::Acquire)
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.policy().mode
    }

    /// The current features.
    pub fn features(&self) -> u64 {
        self.policy().features
    }

    /// Unprivileged vCPUs with a vPMU in use.
    pub fn unprivileged_in_use(&self) -> u32 {
        self.unprivileged_in_use.load(Ordering::Acquire)
    }

    /// Whether a policy change is still being applied on some pCPU.
    pub fn change_in_progress(&self) -> bool {
        self.lagging.load(Ordering::Acquire) > 0
    }

    /// The number of physical CPUs the vPMU was made for.
    pub fn pcpu_count(&self) -> u32 {
        self.pcpu_count
    }

    /// Takes over physical CPU `index`'s PMU hardware: cleans it (see
    /// `PmuBackend::init_hardware`) and returns the per-pCPU state to embed. Call it on that
    /// CPU, once, before its first guest entry.
    pub fn attach_pcpu<H: MsrBus>(
        &self,
        index: u32,
        mut hw: H,
    ) -> Result<PcpuPmu<B::Context, H>, CoreError> {
        if index >= self.pcpu_count || index >= MAX_PCPUS {
            return Err(CoreError::NoSuchPcpu(index));
        }
        let (word, bit) = Self::attached_bit(index);
        if self.attached[word].fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            // Its hardware is another `PcpuPmu`'s: not to be touched.
            return Err(CoreError::PcpuAlreadyAttached(index));
        }
        if let Err(fault) = self.backend.init_hardware(&mut hw) {
            self.attached[word].fetch_and(!bit, Ordering::AcqRel);
            return Err(fault.into());
        }
        let _control = self.control.lock();
        let policy = self.policy();
        self.online.fetch_add(1, Ordering::AcqRel);
        let words = self.backend.page_layout().used_words();
        let mut pcpu = PcpuPmu::new(index, hw, policy, words, self.backend.new_context());
        // `init_hardware` leaves every control 0 (its contract); nothing else is known.
        pcpu.record.controls_cleared();
        Ok(pcpu)
    }

    /// Takes physical CPU `pcpu` out of service (CPU offline, or the end of a VMM run): it
    /// must run no vCPU (`context_switch` it to `None` first; else `CoreError::PcpuRunsVcpu`);
    /// catches it up with a change in progress, drops its system-wide context (its profiler no
    /// longer counts it as an instance, so the profiler's finish does not wait for this pCPU),
    /// and returns the hardware. Later changes do not wait for it, and its index may be
    /// attached again. A refusal hands the state back, still attached ([`DetachRefused`]).
    // The refusal hands back the `PcpuPmu` the call took by value (no heap to box it in): as
    // large as the argument, on a cold path.
    #[allow(clippy::result_large_err)]
    pub fn detach_pcpu<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        mut pcpu: PcpuPmu<B::Context, H>,
        vcpus: &T,
    ) -> Result<H, DetachRefused<B::Context, H>> {
        if let Some(vcpu) = pcpu.current {
            let error = CoreError::PcpuRunsVcpu {
                pcpu: pcpu.index,
                vcpu,
            };
            return Err(DetachRefused { error, pcpu });
        }
        let _control = self.control.lock();
        if let Err(error) = self.catch_up(platform, &mut pcpu, None) {
            return Err(DetachRefused { error, pcpu });
        }
        let owner = match &pcpu.system {
            crate::state::SystemContext::Loaded { profiler, .. }
            | crate::state::SystemContext::Cached { profiler, .. } => Some(*profiler),
            crate::state::SystemContext::Absent => None,
        };
        if let Err(error) = self.drop_system_context(platform, &mut pcpu) {
            return Err(DetachRefused { error, pcpu });
        }
        if let Some(profiler) = owner {
            vcpus.with_vcpu(profiler, &mut |p| self.count_instance(p, false));
        }
        self.online.fetch_sub(1, Ordering::AcqRel);
        let (word, bit) = Self::attached_bit(pcpu.index);
        self.attached[word].fetch_and(!bit, Ordering::AcqRel);
        Ok(pcpu.hw)
    }

    /// The word and bit of `index` (below `MAX_PCPUS`) in `attached`.
    fn attached_bit(index: u32) -> (usize, u64) {
        ((index / 64) as usize, 1 << (index % 64))
    }

    /// A fresh per-vCPU state for `id`. Its domain id must lie below
    /// `XENPMU_DOMID_FIRST_RESERVED` (`CoreError::ReservedDomain`): the ids from there up are
    /// the page's special identities, which a sample of the vCPU would be mistaken for.
    pub fn new_vcpu(&self, id: VcpuId) -> Result<VcpuPmu<B::Context>, CoreError> {
        if id.domain >= XENPMU_DOMID_FIRST_RESERVED {
            return Err(CoreError::ReservedDomain(id.domain));
        }
        Ok(VcpuPmu::new(id, self.backend.new_context()))
    }

    /// Whether `vcpu` has a vPMU under `policy`.
    pub(crate) fn has_vpmu(&self, policy: PolicySnapshot, privileged: u32, vcpu: VcpuId) -> bool {
        self.available
            && match policy.mode {
                Mode::SelfProfiling | Mode::Hypervisor => true,
                Mode::All => vcpu.domain == privileged,
                Mode::Off => false,
            }
    }

    /// The guest policy for `domain`'s accesses under `policy`.
    pub(crate) fn guest_policy<'p, P: Platform>(
        &self,
        policy: PolicySnapshot,
        platform: &'p P,
        domain: u32,
    ) -> GuestPolicy<'p> {
        self.guest_policy_of(policy, platform, domain, platform.privileged_domain())
    }

    /// [`Vpmu::guest_policy`] with the platform's privileged domain already asked.
    #[inline]
    pub(crate) fn guest_policy_of<'p, P: Platform>(
        &self,
        policy: PolicySnapshot,
        platform: &'p P,
        domain: u32,
        privileged: u32,
    ) -> GuestPolicy<'p> {
        GuestPolicy {
            features: policy.features,
            filter: platform.event_filter(domain),
            may_count_host: may_count_host(policy.mode, domain == privileged),
        }
    }

    /// Makes `vcpu` count as in use before an operation that may make it so (its first
    /// WRMSR, init). Waits while a change holds the gate (a few instructions), so that a
    /// change that needs no vPMU in use either sees this one or is seen by it.
    pub(crate) fn claim_use(&self) {
        loop {
            self.unprivileged_in_use.fetch_add(1, Ordering::SeqCst);
            if !self.gate.load(Ordering::SeqCst) {
                return;
            }
            self.unprivileged_in_use.fetch_sub(1, Ordering::SeqCst);
            while self.gate.load(Ordering::SeqCst) {
                core::hint::spin_loop();
            }
        }
    }

    /// Undoes a `claim_use` whose vCPU did not become in use, or ends a vCPU's use.
    pub(crate) fn release_use(&self) {
        let _ = self
            .unprivileged_in_use
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// After an operation on an unprivileged vCPU that may have changed whether it is in use:
    /// `claimed` says whether `claim_use` was called for it beforehand.
    pub(crate) fn settle_use<C>(
        &self,
        privileged: u32,
        vcpu: &VcpuPmu<C>,
        was: bool,
        claimed: bool,
    ) {
        if vcpu.id.domain == privileged {
            return;
        }
        // The count must move by (now - was); a claim already added one.
        let wanted = i32::from(vcpu.in_use()) - i32::from(was);
        let mut adjust = wanted - i32::from(claimed);
        while adjust > 0 {
            self.unprivileged_in_use.fetch_add(1, Ordering::SeqCst);
            adjust -= 1;
        }
        while adjust < 0 {
            self.release_use();
            adjust += 1;
        }
    }

    /// Swaps in a new policy once a change has checked it may (under the control lock): the
    /// gate, when `exclusive`, makes the in-use check and the new policy one step for vCPUs
    /// making their first use. Returns the new snapshot, or `None` if vPMUs are in use.
    pub(crate) fn commit_policy(
        &self,
        mode: Mode,
        features: u64,
        exclusive: bool,
    ) -> Option<PolicySnapshot> {
        if exclusive {
            self.gate.store(true, Ordering::SeqCst);
            if self.unprivileged_in_use.load(Ordering::SeqCst) > 0 {
                self.gate.store(false, Ordering::SeqCst);
                return None;
            }
        }
        let old = self.policy();
        let new = PolicySnapshot {
            mode,
            features,
            epoch: old.epoch + 1,
        };
        // Every online pCPU (the caller's included) catches up once with this epoch.
        self.lagging
            .store(self.online.load(Ordering::Acquire), Ordering::SeqCst);
        if mode == Mode::All && old.mode != Mode::All {
            self.all_since.store(new.epoch, Ordering::SeqCst);
        }
        self.policy.store(new.pack(), Ordering::SeqCst);
        if exclusive {
            self.gate.store(false, Ordering::SeqCst);
        }
        Some(new)
    }

    /// In all mode, the privileged vCPU that profiles `pcpu` (pCPU p → vCPU p mod n).
    pub(crate) fn profiler_of<P: Platform>(platform: &P, pcpu: u32) -> Option<VcpuId> {
        let domain = platform.privileged_domain();
        let count = platform.vcpu_count(domain).filter(|&n| n > 0)?;
        Some(VcpuId {
            domain,
            vcpu: pcpu % count,
        })
    }

    /// In all mode, the pCPUs vCPU `vcpu` of `privileged` (the platform's privileged domain,
    /// which the caller asked) profiles (p mod n == vcpu): stepped through, every n-th from
    /// `vcpu`, not found by testing every pCPU (a write of the profiler fans out to its pCPUs
    /// only).
    pub(crate) fn profiled_pcpus<P: Platform>(
        &self,
        platform: &P,
        privileged: u32,
        vcpu: u32,
    ) -> impl Iterator<Item = u32> + use<B, P> {
        let n = platform.vcpu_count(privileged).unwrap_or(0).max(1);
        // A vCPU beyond the count profiles nothing.
        let first = if vcpu < n { vcpu } else { self.pcpu_count };
        (first..self.pcpu_count).step_by(n as usize)
    }
}

impl core::ops::Add for crate::msr::MsrAccessStats {
    type Output = crate::msr::MsrAccessStats;

    fn add(self, other: crate::msr::MsrAccessStats) -> crate::msr::MsrAccessStats {
        crate::msr::MsrAccessStats {
            reads: self.reads + other.reads,
            writes: self.writes + other.writes,
            faults: self.faults + other.faults,
        }
    }
}
