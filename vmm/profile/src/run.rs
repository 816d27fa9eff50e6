//! One profiling run: the profiler domain and the workload domains on one shared pCPU (the
//! timed event source), configured through their `profile_config`, run for the duration, and
//! what they shipped decoded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use vpmu::abi::{XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_SELF};
use zerocopy::IntoBytes;

use super::protocol::{
    BatchPort, CONFIG_MAGIC, CONFIG_SYMBOL, ProfileConfig, ROLE_PROFILER, ROLE_WORKLOAD, Shipment,
    decode,
};
use super::workloads::Workload;
use crate::ProfileError;
use crate::linux::LinuxProfiler;
use vpmu::VcpuId;
use vpmu_machine::symbols::Symbols;

use vpmu_machine::personality::Personality;
use vpmu_machine::{GuestPorts, Layout, Machine, PRIVILEGED_DOMAIN, PortAccess, RunResult};

/// The symbol of the workloads' progress counters (`work_stats` in `profile/work.c`).
const WORK_STATS_SYMBOL: &str = "work_stats";

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The privileged profiler samples every domain on the pCPU (passive domains).
    All,
    /// Every domain samples itself; the profiler also samples the hypervisor (the VMM).
    Hv,
    /// Every domain samples itself.
    SelfOnly,
}

impl Mode {
    /// `XENPMU_MODE_*`.
    pub fn xenpmu(self) -> u64 {
        match self {
            Self::All => XENPMU_MODE_ALL,
            Self::Hv => XENPMU_MODE_HV,
            Self::SelfOnly => XENPMU_MODE_SELF,
        }
    }

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Hv => "hv",
            Self::SelfOnly => "self",
        }
    }

    /// Whether the workload domains sample themselves.
    pub fn workloads_sample(self) -> bool {
        self != Self::All
    }
}

/// How samples reach the sampling guests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryPath {
    /// Through the xenpmu page: one VIRQ, one guest handler and one flush per sample, the
    /// counters stopped while a sample waits (the cached window).
    Page,
    /// Through a sample ring (ABI 1.4): records written and counters re-armed by the
    /// hypervisor, a VIRQ per batch; the page if the hypervisor has no ring.
    Ring,
}

impl DeliveryPath {
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Page => "page",
            Self::Ring => "ring",
        }
    }

    /// `profile_config.delivery`.
    pub fn wire(self) -> u32 {
        match self {
            Self::Page => vpmu_guest_protocol::profile::DELIVERY_PAGE,
            Self::Ring => vpmu_guest_protocol::profile::DELIVERY_RING,
        }
    }

    /// Ring mode: the ring's `max_latency_us` for a guest of `role`. The profiler ships at
    /// each wakeup, so its batches come at most 3 ms apart; a workload ships between its
    /// 20 ms chunks whatever the VIRQ says, so its wakeups only need to keep the ring from
    /// filling (the watermark does) and the latency bound is long.
    pub fn latency_us(self, role: u32) -> u32 {
        match (self, role) {
            (Self::Page, _) => 0,
            (Self::Ring, super::protocol::ROLE_PROFILER) => 3_000,
            (Self::Ring, _) => 20_000,
        }
    }
}

/// One workload domain of a run.
#[derive(Clone, Debug)]
pub struct DomainPlan {
    /// The image's name for reports (`work.elf`, or the user's file name).
    pub name: String,
    /// The guest ELF.
    pub image: Vec<u8>,
    /// The built-in workload it runs, if it is one (its shares are known).
    pub workload: Option<Workload>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What is measured.
    pub mode: Mode,
    /// Samples per second of CPU time (0: none, the baseline for the slowdown).
    pub frequency: u64,
    /// How samples reach the samplers.
    pub delivery: DeliveryPath,
    /// How long the samplers sample.
    pub duration: Duration,
    /// The workload domains (domains 1..; domain 0 is the profiler).
    pub workloads: Vec<DomainPlan>,
    /// vCPUs of each workload domain.
    pub vcpus: u32,
    /// pCPUs (host threads); the profiler has one vCPU per pCPU.
    pub pcpus: u32,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
    /// Set (by a SIGINT handler) to end the run early and keep what was collected
    /// (`StopPort`).
    pub interrupt: Option<Arc<AtomicBool>>,
    /// Domain 0: the Linux guest (`--profiler linux`), or None for `profile/profiler.c`.
    pub linux: Option<Arc<LinuxProfiler>>,
}

/// Progress counters of one workload vCPU (`work_stats[vCPU]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkStats {
    /// Rounds of its loop completed.
    pub rounds: u64,
    /// TSC ticks they took.
    pub ticks: u64,
}

impl WorkStats {
    /// Rounds per second at `tsc_khz` (0 when nothing ran).
    pub fn rate(&self, tsc_khz: u64) -> f64 {
        if self.ticks == 0 {
            0.0
        } else {
            self.rounds as f64 * tsc_khz as f64 * 1000.0 / self.ticks as f64
        }
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct RunData {
    /// The plan's mode.
    pub mode: Mode,
    /// The plan's frequency.
    pub frequency: u64,
    /// The plan's delivery path.
    pub delivery: DeliveryPath,
    /// Guest TSC kHz (cycles: the timed source counts TSC ticks).
    pub tsc_khz: u64,
    /// The counter period the samplers were given (cycles).
    pub period: u64,
    /// The plan's pCPUs.
    pub pcpus: u32,
    /// The plan's vCPUs per workload domain.
    pub vcpus: u32,
    /// Each vCPU's result, by domain, then vCPU (the first is the profiler's; its `pmi_log` is
    /// the VMM's record of every PMI).
    pub results: Vec<RunResult>,
    /// What each vCPU that shipped samples shipped, in the same order.
    pub shipments: Vec<(VcpuId, Shipment)>,
    /// Each workload domain's progress per vCPU, by domain index (empty: no `work_stats` in
    /// its image; the profiler's is always empty).
    pub work: Vec<Vec<WorkStats>>,
    /// Wall time of the run.
    pub wall: Duration,
    /// Domain 0 was this Linux guest (None: `profile/profiler.c`).
    pub linux: Option<Arc<LinuxProfiler>>,
}

impl RunData {
    /// Every sample shipped, by shipping vCPU in domain and vCPU order.
    pub fn samples(&self) -> impl Iterator<Item = &super::sample::ProfileSample> {
        self.shipments.iter().flat_map(|(_, s)| &s.samples)
    }

    /// A workload domain's progress: the sum of its vCPUs' rounds per second.
    pub fn work_rate(&self, domain: usize) -> Option<f64> {
        let vcpus = self.work.get(domain).filter(|w| !w.is_empty())?;
        Some(vcpus.iter().map(|w| w.rate(self.tsc_khz)).sum())
    }
}

/// The counter period for `frequency` samples per second of `tsc_khz` cycles, and its jitter
/// mask (the largest `2^k - 1` not above half the period: a fixed period aliases with periodic
/// workloads).
pub fn period_for(frequency: u64, tsc_khz: u64) -> (u64, u64) {
    if frequency == 0 {
        return (0, 0);
    }
    let period = (tsc_khz * 1000 / frequency).max(1);
    let half = (period / 2).max(1);
    let jitter = (1u64 << (63 - half.leading_zeros())) - 1;
    (period, jitter)
}

/// Writes `config` at `image`'s `profile_config` in `domain`'s memory and returns its address;
/// Ok(None) if the image has no such symbol (a user's guest that does not take part in the
/// protocol).
fn configure<P: Personality>(
    machine: &Machine<P>,
    domain: u32,
    image: &[u8],
    config: &ProfileConfig,
) -> Result<Option<u64>, ProfileError> {
    let symbols = |source| ProfileError::Symbols { domain, source };
    let Some((gpa, size)) = Symbols::address_of(image, CONFIG_SYMBOL).map_err(symbols)? else {
        return Ok(None);
    };
    if size != 0 && size as usize != size_of::<ProfileConfig>() {
        return Err(ProfileError::ConfigSize {
            domain,
            size,
            want: size_of::<ProfileConfig>(),
        });
    }
    let mem = machine
        .memory(domain)
        .ok_or(ProfileError::NoSuchDomain(domain))?;
    mem.write(gpa, config.as_bytes())
        .map_err(|_| ProfileError::SymbolOutsideRam {
            domain,
            symbol: CONFIG_SYMBOL,
            gpa,
        })?;
    Ok(Some(gpa))
}

/// The batch port, and the way a run is interrupted as `perf record` is: once `interrupt` is
/// set, the next batch a domain ships sets that domain's `profile_config.duration` to 0 (each
/// sampler reads it at every turn of its loop), so its samplers stop, ship what they hold and
/// exit as at the end of the duration. Every domain whose exit ends the run samples and
/// ships within ~40 ms of holding a sample (`sampler_ship_due`), so the run ends within a
/// few tenths of a second with everything the samplers collected.
#[derive(Debug)]
pub struct StopPort {
    /// The protocol's port.
    pub batches: Arc<BatchPort>,
    /// The stop request.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// Each domain's `profile_config` address (None: no such symbol).
    pub configs: Vec<Option<u64>>,
    /// The domains already told to stop, a bit each.
    stopped: AtomicU64,
}

impl StopPort {
    /// A port over `batches` that stops the domains configured at `configs` once `interrupt`
    /// is set.
    pub fn new(
        batches: Arc<BatchPort>,
        interrupt: Option<Arc<AtomicBool>>,
        configs: Vec<Option<u64>>,
    ) -> Self {
        StopPort {
            batches,
            interrupt,
            configs,
            stopped: AtomicU64::new(0),
        }
    }
}

impl GuestPorts for StopPort {
    fn out(&self, access: PortAccess<'_>, port: u16, value: u32) -> Result<(), String> {
        self.batches.out(access, port, value)?;
        let domain = access.vcpu.domain;
        let asked = self
            .interrupt
            .as_ref()
            .is_some_and(|i| i.load(Ordering::Relaxed));
        let bit = 1u64.checked_shl(domain).unwrap_or(0);
        if !asked || self.stopped.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
            return Ok(());
        }
        if let Some(Some(gpa)) = self.configs.get(domain as usize) {
            let at = gpa + std::mem::offset_of!(ProfileConfig, duration) as u64;
            access
                .memory
                .write_u64(at, 0)
                .map_err(|e| format!("stopping domain {domain}: {e}"))?;
        }
        Ok(())
    }
}

/// Runs `plan` under personality `p` and decodes what the guests shipped.
pub fn run<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    cpuid: &CpuId,
    p: P,
    plan: &Plan,
) -> Result<RunData, ProfileError> {
    let profiler: &[u8] = vpmu_guests::PROFILER;
    let images: Vec<&[u8]> = std::iter::once(profiler)
        .chain(plan.workloads.iter().map(|w| w.image.as_slice()))
        .collect();
    let domains = images.len() as u32;
    let layout = Layout::SharedPcpus {
        pcpus: plan.pcpus,
        domains,
        vcpus: plan.vcpus,
    };
    let mut machine = match &plan.linux {
        None => Machine::with_images(kvm, p, cpuid, &|d| images[d as usize], 0, layout)
            .map_err(ProfileError::Setup)?,
        Some(linux) => crate::linux::machine(kvm, p, cpuid, linux, plan, &images[1..])?,
    };
    let tsc_khz = u64::from(machine.tsc_khz().ok_or(ProfileError::NoTscFrequency)?);
    let (period, jitter) = period_for(plan.frequency, tsc_khz);
    let duration = (plan.duration.as_micros() as u64).saturating_mul(tsc_khz) / 1000;
    let config = |role, workload| ProfileConfig {
        magic: CONFIG_MAGIC,
        role,
        mode: plan.mode.xenpmu() as u32,
        workload,
        period,
        jitter,
        duration,
        delivery: plan.delivery.wire(),
        ring_latency_us: plan.delivery.latency_us(role),
    };
    // A Linux domain 0 takes its orders from its command line (`linux::machine`).
    let profiler_config = match plan.linux {
        Some(_) => None,
        None => Some(
            configure(
                &machine,
                PRIVILEGED_DOMAIN,
                profiler,
                &config(ROLE_PROFILER, 0),
            )?
            .ok_or(ProfileError::NoProfilerConfig)?,
        ),
    };
    let mut configs = vec![profiler_config];
    // The run ends with the samplers: the profiler (except in self mode, where it only
    // idles: it is stopped with the passive domains, so that an interrupted run does not
    // wait for its duration) and, when they sample themselves, the workloads that take part
    // in the protocol; the rest are stopped then.
    let mut finish_with = Vec::new();
    if plan.mode != Mode::SelfOnly || plan.frequency == 0 {
        finish_with.push(PRIVILEGED_DOMAIN);
    }
    for (i, w) in plan.workloads.iter().enumerate() {
        let domain = i as u32 + 1;
        let number = w.workload.map_or(0, |w| w.number);
        let gpa = configure(&machine, domain, &w.image, &config(ROLE_WORKLOAD, number))?;
        configs.push(gpa);
        if gpa.is_some() && plan.mode.workloads_sample() && plan.frequency != 0 {
            finish_with.push(domain);
        }
        let work_stats = Symbols::address_of(&w.image, WORK_STATS_SYMBOL)
            .map_err(|source| ProfileError::Symbols { domain, source })?;
        if let Some((gpa, _)) = work_stats {
            machine
                .peek_after_run(domain, gpa, 16 * plan.vcpus as usize)
                .ok_or(ProfileError::SymbolOutsideRam {
                    domain,
                    symbol: WORK_STATS_SYMBOL,
                    gpa,
                })?;
        }
    }
    if finish_with.is_empty() {
        finish_with.push(PRIVILEGED_DOMAIN);
    }
    machine.finish_with(finish_with);
    let port = Arc::new(BatchPort::default());
    machine.extend(Arc::new(StopPort::new(
        port.clone(),
        plan.interrupt.clone(),
        configs,
    )));
    let timeout = plan.duration
        + Duration::from_secs(if plan.linux.is_some() {
            crate::linux::BOOT_ALLOWANCE_S
        } else {
            60
        });
    let start = Instant::now();
    let done = AtomicBool::new(false);
    let results = std::thread::scope(|s| {
        if plan.progress {
            s.spawn(|| progress(plan, &done, &port));
        }
        let results = machine.run(timeout);
        done.store(true, Ordering::Relaxed);
        results
    });
    let wall = start.elapsed();
    let mut shipments = Vec::new();
    let mut batches = port.take();
    let mut work = vec![Vec::new(); domains as usize];
    for r in &results {
        let id = r.vcpu.ok_or(ProfileError::AnonymousResult)?;
        let who = format!("domain {} vCPU {}", id.domain, id.vcpu);
        if let Some(e) = &r.error {
            return Err(ProfileError::VcpuFailed {
                who,
                error: e.to_string(),
                console: vpmu_machine::indent(&r.console, "  | "),
            });
        }
        if !r.stopped && r.status != Some(0) {
            return Err(ProfileError::VcpuStatus {
                who,
                status: r.status,
                console: vpmu_machine::indent(&r.console, "  | "),
            });
        }
        if let Some(shipped) = batches.remove(&id) {
            shipments.push((id, decode(id.domain, &shipped)?));
        }
        // The domain's first vCPU carries its `work_stats` array, one entry per vCPU.
        if let (Some((_, bytes)), Some(slot)) = (r.peeked.first(), work.get_mut(id.domain as usize))
        {
            let word = |i: usize| {
                bytes
                    .get(i..i + 8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_le_bytes)
            };
            *slot = (0..plan.vcpus as usize)
                .map(|v| WorkStats {
                    rounds: word(16 * v),
                    ticks: word(16 * v + 8),
                })
                .collect();
        }
    }
    Ok(RunData {
        mode: plan.mode,
        frequency: plan.frequency,
        delivery: plan.delivery,
        tsc_khz,
        period,
        pcpus: plan.pcpus,
        vcpus: plan.vcpus,
        results,
        shipments,
        work,
        wall,
        linux: plan.linux.clone(),
    })
}

/// Draws the progress bar until `done`: elapsed time against the duration, and the samples
/// shipped so far (indicatif draws nothing when stderr is not a terminal).
fn progress(plan: &Plan, done: &AtomicBool, port: &BatchPort) {
    let total = plan.duration.as_millis() as u64;
    let bar = ProgressBar::new(total.max(1));
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:40}] {elapsed_precise} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(format!("{} mode, {} Hz", plan.mode.name(), plan.frequency));
    let start = Instant::now();
    while !done.load(Ordering::Relaxed) {
        bar.set_position((start.elapsed().as_millis() as u64).min(total));
        bar.set_message(format!("{} samples shipped", port.shipped()));
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn period_and_jitter() {
        // 1 kHz at a 2 GHz TSC: 2 M cycles, jitter 2^19 - 1 (the largest 2^k - 1 <= 1 M).
        assert_eq!(period_for(1000, 2_000_000), (2_000_000, (1 << 19) - 1));
        assert_eq!(period_for(0, 2_000_000), (0, 0));
        let (p, j) = period_for(10_000, 2_500_000);
        assert_eq!(p, 250_000);
        assert!(j < p / 2 + 1 && (j + 1).is_power_of_two());
    }
}
