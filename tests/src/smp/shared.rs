//! What the pCPU threads share: guest memory and the page mappings, each vCPU's virtual local
//! APIC, the per-pCPU request queues, the per-domain event filters, which pCPU runs which vCPU,
//! and the findings and coverage counts of the run.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use vpmu::abi::{Page, Regs};
use vpmu::{CrossCpuRequest, EventFilter, RawEvent, VcpuId};

/// Guest frames each domain owns: fewer than its vCPUs can ask for, so that registrations
/// collide (`-EADDRINUSE`).
pub const FRAMES_PER_DOMAIN: u64 = 3;

/// The event select every counter of the run counts (instructions retired, on both vendors).
pub const INSTRUCTIONS: u16 = 0xc0;

/// Guest frame `index` of `domain`.
pub fn guest_frame(domain: u32, index: u64) -> u64 {
    0x10_000 * u64::from(domain + 1) + index
}

/// Locks, ignoring poison: a panicking thread sets the abort flag, and its panic is the one
/// reported, not the cascade of poisoned locks behind it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A vCPU's virtual local APIC, as far as PMIs go, and the PMIs its guest has not handled yet.
#[derive(Debug)]
pub struct Vlapic {
    /// The LVTPC mask bit (a local APIC resets masked).
    pub masked: bool,
    /// Deliveries the platform answered `Queued` for: whether to mask on delivery.
    pub queued: VecDeque<bool>,
    /// PMIs delivered through the LVTPC and not yet taken by the guest's handler.
    pub delivered: u64,
    /// PMU VIRQs raised and not yet taken.
    pub virqs: u64,
}

/// A domain's event filter, changed at run time by the privileged domain's integrator.
///
/// `generation` is odd from before the platform answers with a new filter until the core has
/// applied it on every pCPU: only while it is even and unchanged can a guest know exactly what
/// its counters count.
#[derive(Debug, Default)]
pub struct DomainFilter {
    /// Instructions retired does not count.
    pub deny: AtomicBool,
    /// See the type's documentation.
    pub generation: AtomicU64,
    /// Held by the one thread changing this filter.
    pub changing: AtomicBool,
}

/// What a counter of instructions in a domain does right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterView {
    /// It counts, and has done so since the last change completed.
    Allow,
    /// It does not count, and has not since the last change completed.
    Deny,
    /// A change is being applied: either.
    Changing,
}

impl DomainFilter {
    /// The filter as a guest's counters experience it now.
    pub fn view(&self) -> FilterView {
        let before = self.generation.load(Ordering::SeqCst);
        let deny = self.deny.load(Ordering::SeqCst);
        let after = self.generation.load(Ordering::SeqCst);
        if before != after || before % 2 == 1 {
            FilterView::Changing
        } else if deny {
            FilterView::Deny
        } else {
            FilterView::Allow
        }
    }
}

impl EventFilter for DomainFilter {
    fn allows(&self, event: RawEvent) -> bool {
        !(event.select == INSTRUCTIONS && self.deny.load(Ordering::SeqCst))
    }

    fn allows_fixed(&self, _index: u32) -> bool {
        true
    }
}

/// Violations of the properties the run checks, by kind, with the first few occurrences in
/// full (thread, step, seed, the thread's recent actions).
#[derive(Debug, Default)]
pub struct Findings {
    /// Kind → (occurrences, first details).
    pub kinds: BTreeMap<&'static str, (u64, Vec<String>)>,
}

impl Findings {
    /// Details kept per kind.
    pub const KEPT: usize = 3;

    /// Records one occurrence.
    pub fn add(&mut self, kind: &'static str, detail: String) {
        let entry = self.kinds.entry(kind).or_default();
        entry.0 += 1;
        if entry.1.len() < Self::KEPT {
            entry.1.push(detail);
        }
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }
}

impl std::fmt::Display for Findings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (kind, (count, details)) in &self.kinds {
            writeln!(f, "== {kind}: {count} occurrence(s)")?;
            for detail in details {
                writeln!(f, "{detail}")?;
            }
        }
        Ok(())
    }
}

/// How much of the interesting behaviour a run reached (printed; a few are asserted).
#[derive(Debug, Default)]
pub struct Coverage {
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl Coverage {
    /// Counts one `what`.
    pub fn hit(&self, what: &'static str) {
        self.add(what, 1);
    }

    /// Counts `n` more `what`.
    pub fn add(&self, what: &'static str, n: u64) {
        *lock(&self.counts).entry(what).or_default() += n;
    }

    /// How many `what`.
    pub fn get(&self, what: &str) -> u64 {
        lock(&self.counts).get(what).copied().unwrap_or(0)
    }

    /// Every count.
    pub fn all(&self) -> BTreeMap<&'static str, u64> {
        lock(&self.counts).clone()
    }
}

/// The state every pCPU thread reaches.
#[derive(Debug)]
pub struct Shared {
    /// Physical CPUs.
    pub pcpus: u32,
    /// vCPUs per domain (domain ids are indices; domain 0 is privileged).
    pub vcpu_counts: Vec<u32>,
    /// Guest RAM that can be registered as shared pages: (domain, frame) → page.
    pub memory: BTreeMap<(u32, u64), Mutex<Box<Page>>>,
    /// Mapped shared pages: slot → (domain, frame). Slots are never reused, so a stale slot
    /// cannot reach a newer mapping.
    pub mappings: Mutex<BTreeMap<u64, (u32, u64)>>,
    next_slot: AtomicU64,
    /// Per vCPU (flat index), its virtual local APIC.
    pub vlapics: Vec<Mutex<Vlapic>>,
    /// Per vCPU (flat index), its last guest registers: where it resumes.
    pub last_regs: Vec<Mutex<Regs>>,
    /// Per pCPU, the cross-CPU requests sent to it, in order.
    pub queues: Vec<Mutex<VecDeque<CrossCpuRequest>>>,
    /// Per pCPU, its thread's recent actions.
    pub logs: Vec<Mutex<VecDeque<String>>>,
    /// Per pCPU, how many times it has drained its queue (progress, for the livelock check).
    pub drains: Vec<AtomicU64>,
    /// Per domain, its event filter.
    pub filters: Vec<DomainFilter>,
    /// Per vCPU (flat index), the thread running it or tearing it down, else [`FREE`].
    pub claims: Vec<AtomicU32>,
    /// Unprivileged guests leave their PMU alone (so that all and off mode can be reached).
    pub quiet: AtomicBool,
    /// A thread panicked: everyone stops.
    pub abort: AtomicBool,
    /// Threads arrived at the final barriers.
    pub arrived: AtomicU32,
    /// What the run found.
    pub findings: Mutex<Findings>,
    /// What the run reached.
    pub coverage: Coverage,
    /// The run's seed, for the findings.
    pub seed: u64,
    /// See `Config::avoid_known_bugs`.
    pub avoid_known_bugs: bool,
    /// When known bugs are avoided: held for writing by a policy change while it commits, for
    /// reading by a pCPU from an overflow to its interrupt.
    pub policy_gate: RwLock<()>,
}

/// Actions kept per thread for the findings and for a panic report.
pub const LOG_KEPT: usize = 40;

/// A vCPU nobody runs.
pub const FREE: u32 = u32::MAX;
/// Added to a pCPU index: that thread is tearing the vCPU's domain down.
pub const REBOOTING: u32 = 1 << 16;

impl Shared {
    /// The shared state of a machine of `pcpus` pCPUs and domains of `vcpu_counts` vCPUs.
    pub fn new(pcpus: u32, vcpu_counts: &[u32], seed: u64, avoid_known_bugs: bool) -> Self {
        let mut memory = BTreeMap::new();
        for domain in 0..vcpu_counts.len() as u32 {
            for index in 0..FRAMES_PER_DOMAIN {
                memory.insert(
                    (domain, guest_frame(domain, index)),
                    Mutex::new(Box::new(Page::zeroed())),
                );
            }
        }
        let vcpus: u32 = vcpu_counts.iter().sum();
        Self {
            pcpus,
            vcpu_counts: vcpu_counts.to_vec(),
            memory,
            mappings: Mutex::new(BTreeMap::new()),
            next_slot: AtomicU64::new(1),
            vlapics: (0..vcpus)
                .map(|_| {
                    Mutex::new(Vlapic {
                        masked: true,
                        queued: VecDeque::new(),
                        delivered: 0,
                        virqs: 0,
                    })
                })
                .collect(),
            last_regs: (0..vcpu_counts.len() as u32)
                .flat_map(|domain| {
                    (0..vcpu_counts[domain as usize]).map(move |vcpu| (domain, vcpu))
                })
                .map(|(domain, vcpu)| {
                    Mutex::new(Regs {
                        rax: u64::from(domain) << 32 | u64::from(vcpu),
                        ..Regs::default()
                    })
                })
                .collect(),
            queues: (0..pcpus).map(|_| Mutex::new(VecDeque::new())).collect(),
            logs: (0..pcpus).map(|_| Mutex::new(VecDeque::new())).collect(),
            drains: (0..pcpus).map(|_| AtomicU64::new(0)).collect(),
            filters: vcpu_counts
                .iter()
                .map(|_| DomainFilter::default())
                .collect(),
            claims: (0..vcpus).map(|_| AtomicU32::new(FREE)).collect(),
            quiet: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            arrived: AtomicU32::new(0),
            findings: Mutex::new(Findings::default()),
            coverage: Coverage::default(),
            seed,
            avoid_known_bugs,
            policy_gate: RwLock::new(()),
        }
    }

    /// Every vCPU, in flat-index order.
    pub fn vcpu_ids(&self) -> Vec<VcpuId> {
        (0..self.vcpu_counts.len() as u32)
            .flat_map(|domain| {
                (0..self.vcpu_counts[domain as usize]).map(move |vcpu| VcpuId { domain, vcpu })
            })
            .collect()
    }

    /// `id`'s flat index.
    pub fn flat(&self, id: VcpuId) -> usize {
        self.vcpu_counts[..id.domain as usize].iter().sum::<u32>() as usize + id.vcpu as usize
    }

    /// Records an action of pCPU `pcpu`'s thread.
    pub fn note(&self, pcpu: u32, entry: String) {
        let mut log = lock(&self.logs[pcpu as usize]);
        if log.len() == LOG_KEPT {
            log.pop_front();
        }
        log.push_back(entry);
    }

    /// Every pCPU's recent actions.
    pub fn all_logs(&self) -> String {
        let mut text = String::new();
        for (pcpu, log) in self.logs.iter().enumerate() {
            text += &format!("  pCPU {pcpu}:\n");
            for entry in lock(log).iter() {
                text += &format!("    {entry}\n");
            }
        }
        text
    }

    /// A fresh mapping slot.
    pub fn new_slot(&self) -> u64 {
        self.next_slot.fetch_add(1, Ordering::Relaxed)
    }

    /// Records a finding.
    pub fn finding(&self, kind: &'static str, detail: String) {
        lock(&self.findings).add(kind, detail);
    }

    /// Runs `access` on the frame behind mapping `slot`, if it is mapped.
    pub fn with_mapped<R>(&self, slot: u64, access: impl FnOnce(&mut Page) -> R) -> Option<R> {
        let frame = *lock(&self.mappings).get(&slot)?;
        let page = self.memory.get(&frame)?;
        Some(access(&mut lock(page)))
    }
}
