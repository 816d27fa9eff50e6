//! The options of `vpmu profile` (`Options`), their limits and the combinations refused
//! before anything runs; which program is domain 0 (`Profiler`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::ProfileError;
use crate::linux;
use crate::protocol;
use crate::run::{DeliveryPath, DomainPlan, Mode};
use crate::workloads::BUILT_IN;
use vpmu_machine::symbols::Symbols;

/// The PMU personality the guests see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// Intel architectural PMU v5 (8 GP counters, full-width writes).
    Intel,
    /// AMD PerfMonV2 (6 counters).
    Amd,
}

/// Which program is domain 0, the privileged profiling domain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Profiler {
    /// `profile/profiler.c`, a freestanding guest (the default).
    #[default]
    BuiltIn,
    /// The project's Linux guest, with the xenpmu driver and its recorder, from this
    /// directory (`linux`: `vmlinux` and `initramfs-xenpmu.cpio`).
    Linux(PathBuf),
}

/// The options of `vpmu profile` (`Options::default()` is the command's defaults; the CLI
/// checks every field against the limits below before anything runs).
#[derive(Clone, Debug)]
pub struct Options {
    /// How long to sample (`MIN_DURATION..=MAX_DURATION`).
    pub duration: Duration,
    /// Samples per second of CPU time (`MIN_FREQUENCY..=MAX_FREQUENCY`).
    pub frequency: u64,
    /// What to measure.
    pub mode: Mode,
    /// The PMU the guests see.
    pub vendor: Vendor,
    /// User guests instead of the built-in workloads (at most `MAX_GUESTS`).
    pub guests: Vec<PathBuf>,
    /// vCPUs of each workload domain (`1..=MAX_VCPUS`).
    pub vcpus: u32,
    /// pCPUs (host threads) (`1..=MAX_PCPUS`).
    pub pcpus: u32,
    /// Where the outputs go.
    pub out: PathBuf,
    /// Functions per domain in the text report (at least 1).
    pub top: usize,
    /// Run the self-mode comparison (all mode, built-in workloads).
    pub compare: bool,
    /// How samples reach the samplers (`--ring`, `--page`).
    pub delivery: DeliveryPath,
    /// Measure the frequency sweep instead.
    pub sweep: bool,
    /// Draw a progress bar.
    pub progress: bool,
    /// Set by the caller (the CLI's SIGINT handler) to stop sampling early: the samplers stop
    /// and ship what they hold, the self-mode comparison is skipped, and the outputs are
    /// written of what was collected, as `perf record` does (`run::StopPort`). Not for the
    /// sweep, which measures complete runs.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// Domain 0.
    pub profiler: Profiler,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(5),
            frequency: 2000,
            mode: Mode::All,
            vendor: Vendor::Intel,
            guests: Vec::new(),
            vcpus: 2,
            pcpus: 2,
            out: PathBuf::from("profile-out"),
            top: 10,
            compare: true,
            delivery: DeliveryPath::Ring,
            sweep: false,
            progress: true,
            interrupt: None,
            profiler: Profiler::BuiltIn,
        }
    }
}

/// The shortest `--duration`, seconds.
pub const MIN_DURATION_S: f64 = 0.2;
/// The longest `--duration`, seconds.
pub const MAX_DURATION_S: f64 = 600.0;
/// The lowest `--frequency`, Hz.
pub const MIN_FREQUENCY: u64 = 1;
/// The highest `--frequency`, Hz.
pub const MAX_FREQUENCY: u64 = 20_000;
/// The most workload domains (the profiler is one more).
pub const MAX_GUESTS: usize = 7;
/// The most vCPUs per workload domain (the guests' per-vCPU state and the VMM's TSSes).
pub const MAX_VCPUS: u32 = 8;
/// The most pCPUs (host threads); the profiling domain has one vCPU per pCPU.
pub const MAX_PCPUS: u32 = 8;

/// Whether `image` takes part in the profile protocol (has a `profile_config`): a guest without
/// one cannot sample itself and is profiled passively.
fn takes_part(image: &[u8]) -> bool {
    matches!(
        Symbols::address_of(image, protocol::CONFIG_SYMBOL),
        Ok(Some(_))
    )
}

impl Options {
    /// The combinations of options that cannot work, refused before anything runs: one line
    /// each, naming the options. An unreadable `--guest` is not refused here (the run reports
    /// it).
    pub fn conflicts(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.sweep && !self.guests.is_empty() {
            out.push(
                "--sweep measures the built-in workloads' slowdown from their own progress \
                 counters: it takes no --guest"
                    .to_string(),
            );
        }
        if let Profiler::Linux(_) = self.profiler {
            out.extend(self.linux_conflicts());
        }
        if self.mode != Mode::All {
            for path in &self.guests {
                let passive = std::fs::read(path).is_ok_and(|image| !takes_part(&image));
                if passive {
                    out.push(format!(
                        "--guest {} has no profile_config: it can only be profiled passively \
                         (--mode all), not sample itself in --mode {}",
                        path.display(),
                        self.mode.name()
                    ));
                }
            }
        }
        out
    }

    /// What `--profiler linux` cannot be combined with.
    fn linux_conflicts(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.sweep {
            out.push("--sweep measures the built-in profiler: it takes no --profiler linux".into());
        }
        if self.mode == Mode::SelfOnly {
            out.push(
                "--profiler linux makes the Linux guest the privileged profiling domain: \
                 --mode all or hv, not self (where domain 0 only idles)"
                    .into(),
            );
        }
        if self.delivery == DeliveryPath::Page {
            out.push(
                "--profiler linux: the xenpmu driver's recorder reads the sample ring: it \
                 takes no --page"
                    .into(),
            );
        }
        if self.pcpus != 1 {
            out.push(format!(
                "--profiler linux: the Linux guest is uniprocessor, so the run has one pCPU \
                 (--pcpus {} given)",
                self.pcpus
            ));
        }
        out
    }

    /// The Linux profiling domain's files, read (None: the built-in profiler).
    pub(crate) fn linux(&self) -> Result<Option<Arc<linux::LinuxProfiler>>, ProfileError> {
        match &self.profiler {
            Profiler::BuiltIn => Ok(None),
            Profiler::Linux(dir) => Ok(Some(Arc::new(linux::LinuxProfiler::load(dir)?))),
        }
    }

    /// The workload domains: the built-in ones, or the user's images.
    pub(crate) fn workloads(&self) -> Result<Vec<DomainPlan>, ProfileError> {
        if self.guests.is_empty() {
            return Ok(BUILT_IN
                .iter()
                .map(|w| DomainPlan {
                    name: format!("work.elf ({})", w.label),
                    image: vpmu_guests::WORK.to_vec(),
                    workload: Some(*w),
                })
                .collect());
        }
        self.guests
            .iter()
            .map(|path| {
                let image =
                    std::fs::read(path).map_err(|source| ProfileError::GuestUnreadable {
                        path: path.clone(),
                        source,
                    })?;
                // Refuse what cannot be symbolized before booting anything.
                Symbols::from_elf(&image).map_err(|source| ProfileError::GuestSymbols {
                    path: path.clone(),
                    source,
                })?;
                let name = path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into(),
                );
                Ok(DomainPlan {
                    name,
                    image,
                    workload: None,
                })
            })
            .collect()
    }
}

impl Options {
    /// Reads every `--guest` (refusing an unreadable one or one without symbols) and creates
    /// the output directory: what a run would fail on because of a path, before anything runs.
    pub fn check_paths(&self) -> Result<(), ProfileError> {
        self.workloads()?;
        self.linux()?;
        std::fs::create_dir_all(&self.out).map_err(|source| ProfileError::OutDir {
            path: self.out.clone(),
            source,
        })
    }

    pub(crate) fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|i| i.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones_and_within_the_limits() {
        let o = Options::default();
        assert_eq!(
            (o.mode, o.vendor, o.frequency, o.top, o.vcpus, o.pcpus),
            (Mode::All, Vendor::Intel, 2000, 10, 2, 2)
        );
        assert_eq!(o.duration, Duration::from_secs(5));
        assert_eq!(o.out, PathBuf::from("profile-out"));
        assert!(o.compare && !o.sweep && o.progress && o.guests.is_empty());
        assert!((MIN_DURATION_S..=MAX_DURATION_S).contains(&o.duration.as_secs_f64()));
        assert!((MIN_FREQUENCY..=MAX_FREQUENCY).contains(&o.frequency));
        assert!(o.vcpus <= MAX_VCPUS && o.pcpus <= MAX_PCPUS);
    }

    #[test]
    fn a_user_guest_must_be_a_readable_elf_with_symbols() {
        let o = Options {
            guests: vec![PathBuf::from("/nonexistent/guest.elf")],
            ..Options::default()
        };
        let e = o.workloads().expect_err("unreadable");
        assert!(matches!(e, ProfileError::GuestUnreadable { .. }), "{e:?}");
        assert!(e.to_string().contains("/nonexistent/guest.elf"), "{e}");
        let path = std::env::temp_dir().join(format!("vpmu-guest-{}", std::process::id()));
        std::fs::write(&path, b"not an elf").expect("temp file");
        let o = Options {
            guests: vec![path.clone()],
            ..Options::default()
        };
        let e = o.workloads().expect_err("not an ELF");
        assert!(matches!(e, ProfileError::GuestSymbols { .. }), "{e:?}");
        assert!(e.to_string().contains("not an ELF"), "{e}");
        std::fs::remove_file(&path).ok();
        let w = Options::default().workloads().expect("built-in");
        assert_eq!(w.len(), 3);
        assert!(w.iter().all(|d| d.workload.is_some()));
    }
}
