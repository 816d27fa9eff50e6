//! Aggregation of profile samples per domain and function, and the output formats: a text
//! table, folded stacks, a flamegraph SVG and JSON.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

use serde::Serialize;

use super::sample::{ChainEnd, Origin, ProfileSample};
use super::stacks::{self, StackRow};
use vpmu_machine::symbols::Symbols;

/// What the report knows about one profiled domain (or the hypervisor) before counting.
#[derive(Debug)]
pub struct DomainInfo {
    /// Whose samples these are.
    pub origin: Origin,
    /// A human name, typically the guest image (`work.elf`).
    pub name: String,
    /// The symbols of the program it ran.
    pub symbols: Symbols,
    /// Samples lost before they reached the VMM (ring overflow), reported as is.
    pub dropped: u64,
}

/// How the run was set up, for the report header and the flamegraph title.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    /// Profiling mode (`self`, `all`, `hv`).
    pub mode: String,
    /// The PMU vendor personality (`intel`, `amd`).
    pub vendor: String,
    /// Requested sampling frequency.
    pub frequency_hz: u64,
    /// Wall-clock duration of the run.
    pub duration_s: f64,
    /// The guest TSC frequency.
    pub tsc_khz: u64,
    /// pCPUs (host threads) of the run.
    pub pcpus: u32,
    /// vCPUs of each workload domain.
    pub vcpus: u32,
}

/// The sampled event, for people and tools: what the counters count and how often a sample
/// is taken.
#[derive(Clone, Debug, Serialize)]
pub struct EventInfo {
    /// The event (perf's name; `PERF_TYPE_HARDWARE`/`PERF_COUNT_HW_CPU_CYCLES` in perf.data).
    pub name: String,
    /// What it counts.
    pub counts: String,
    /// Mean events between samples (the counter's period; each sample's period varies by
    /// `jitter`).
    pub period: u64,
    /// The period varies by -jitter/2..+jitter/2.
    pub jitter: u64,
    /// Samples per second of sampled CPU time asked for.
    pub frequency_hz: u64,
    /// The unit of `period` and of the `cycles` values in profile.pb.gz and perf.data.
    pub unit: String,
}

impl EventInfo {
    /// The event of a run set up as `run` (every run samples cycles).
    pub fn of(run: &RunInfo) -> EventInfo {
        let (period, jitter) = super::run::period_for(run.frequency_hz, run.tsc_khz);
        EventInfo {
            name: super::outputs::EVENT.into(),
            counts: "guest CPU cycles (the timed event source: TSC ticks the vCPU spends in \
                     KVM_RUN, plus the VMM's time in hv mode)"
                .into(),
            period,
            jitter,
            frequency_hz: run.frequency_hz,
            unit: "cycles".into(),
        }
    }
}

/// A sanity check on the run, printed with the report.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// Not checked (too few samples, nothing to compare): `passed` is false, and the run does
    /// not fail for it (shown as SKIP).
    pub skipped: bool,
    /// The numbers behind the verdict.
    pub detail: String,
}

/// Samples of one function in one domain.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionRow {
    /// The symbol, or `[unknown]` when the IP matched none.
    pub name: String,
    /// Samples in this function.
    pub samples: u64,
    /// Share of the domain's samples, in percent.
    pub percent: f64,
    /// Of `samples`, taken at CPL3.
    pub user: u64,
    /// Of `samples`, taken in the kernel (CPL0).
    pub kernel: u64,
}

/// Samples of one domain (or the hypervisor).
#[derive(Clone, Debug, Serialize)]
pub struct DomainReport {
    /// Whose samples these are.
    pub origin: Origin,
    /// From [`DomainInfo::name`]; empty or `(no image)` for an origin nobody described.
    pub name: String,
    /// All samples of this domain.
    pub samples: u64,
    /// Of `samples`, taken at CPL3.
    pub user: u64,
    /// Of `samples`, taken in the kernel.
    pub kernel: u64,
    /// Samples lost before they reached the VMM.
    pub dropped: u64,
    /// Samples per vCPU of the domain (for the hypervisor: the vCPU it served), by vCPU.
    pub vcpus: std::collections::BTreeMap<u32, u64>,
    /// Samples by why their call chain ends (`complete`, `none`, `bad_frame`, ...), user and
    /// kernel apart.
    pub chains: ChainCounts,
    /// Every function sampled, most samples first (ties by name).
    pub functions: Vec<FunctionRow>,
}

/// Samples by why their call chain ends, user and kernel apart.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChainCounts {
    /// User samples by end reason.
    pub user: std::collections::BTreeMap<ChainEnd, u64>,
    /// Kernel samples by end reason.
    pub kernel: std::collections::BTreeMap<ChainEnd, u64>,
}

/// A whole profile: the run, per-domain results, and the checks.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// How the run was set up.
    pub run: RunInfo,
    /// The sampled event and its period.
    pub event: EventInfo,
    /// One entry per described domain in the order given, then any origin seen in samples
    /// but not described.
    pub domains: Vec<DomainReport>,
    /// Every distinct call stack and its samples, per domain (`stacks::count`).
    pub stacks: Vec<StackRow>,
    /// Sanity checks; empty after [`Report::build`], for the caller to fill.
    pub checks: Vec<Check>,
}

/// Function name for IPs no symbol covers.
const UNKNOWN: &str = stacks::UNKNOWN;

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

impl DomainReport {
    /// Short tag for the origin: `dom<n>` or `hypervisor`.
    fn tag(&self) -> String {
        self.origin.tag()
    }

    /// The origin tag followed by the name, e.g. `dom1 work.elf`, or just `hypervisor`.
    pub fn label(&self) -> String {
        let tag = self.tag();
        if self.name.is_empty() || self.name == tag {
            tag
        } else {
            format!("{tag} {}", self.name)
        }
    }

    /// The share of this domain's samples in `function`, in percent (0 if never sampled).
    #[cfg(test)]
    pub fn percent_of(&self, function: &str) -> f64 {
        self.functions
            .iter()
            .find(|f| f.name == function)
            .map_or(0.0, |f| f.percent)
    }

    /// The most sampled function, if any sample was taken.
    #[cfg(test)]
    pub fn top(&self) -> Option<&FunctionRow> {
        self.functions.first()
    }
}

/// Per-function (user, kernel) counts while aggregating.
#[derive(Default)]
struct Tally {
    functions: HashMap<String, (u64, u64)>,
    vcpus: std::collections::BTreeMap<u32, u64>,
    chains: ChainCounts,
}

impl Report {
    /// Counts `samples` per domain and function. Samples of an origin without a
    /// [`DomainInfo`] get a domain of their own, so none is silently lost.
    pub fn build(run: RunInfo, samples: &[ProfileSample], domains: &[DomainInfo]) -> Report {
        let mut order: Vec<Origin> = Vec::new();
        let mut index: HashMap<Origin, usize> = HashMap::new();
        for d in domains {
            // A duplicate description would split one origin's samples: the first one wins.
            if let std::collections::hash_map::Entry::Vacant(e) = index.entry(d.origin) {
                e.insert(order.len());
                order.push(d.origin);
            }
        }
        let described = order.len();
        let mut tallies: Vec<Tally> = (0..described).map(|_| Tally::default()).collect();
        let symbols: Vec<Option<&Symbols>> = order
            .iter()
            .map(|o| domains.iter().find(|d| d.origin == *o).map(|d| &d.symbols))
            .collect();

        for s in samples {
            let i = *index.entry(s.origin).or_insert_with(|| {
                order.push(s.origin);
                tallies.push(Tally::default());
                order.len() - 1
            });
            let name = symbols
                .get(i)
                .copied()
                .flatten()
                .and_then(|sym| sym.lookup(s.rip))
                .unwrap_or(UNKNOWN);
            *tallies[i].vcpus.entry(s.vcpu).or_default() += 1;
            let ends = if s.user {
                &mut tallies[i].chains.user
            } else {
                &mut tallies[i].chains.kernel
            };
            *ends.entry(s.details.chain.end()).or_default() += 1;
            let counts = tallies[i].functions.entry(name.to_string()).or_default();
            if s.user {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }

        let reports = order
            .iter()
            .zip(tallies)
            .enumerate()
            .map(|(i, (&origin, tally))| {
                let info = (i < described)
                    .then(|| domains.iter().find(|d| d.origin == origin))
                    .flatten();
                let name = match (info, origin) {
                    (Some(d), _) => d.name.clone(),
                    (None, Origin::Domain(_)) => "(no image)".to_string(),
                    (None, Origin::Hypervisor) => String::new(),
                };
                let user: u64 = tally.functions.values().map(|c| c.0).sum();
                let kernel: u64 = tally.functions.values().map(|c| c.1).sum();
                let total = user + kernel;
                let mut functions: Vec<FunctionRow> = tally
                    .functions
                    .into_iter()
                    .map(|(name, (user, kernel))| FunctionRow {
                        name,
                        samples: user + kernel,
                        percent: percent(user + kernel, total),
                        user,
                        kernel,
                    })
                    .collect();
                functions
                    .sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.name.cmp(&b.name)));
                DomainReport {
                    origin,
                    name,
                    samples: total,
                    user,
                    kernel,
                    dropped: info.map_or(0, |d| d.dropped),
                    vcpus: tally.vcpus,
                    chains: tally.chains,
                    functions,
                }
            })
            .collect();

        let stacks = stacks::count(samples, |origin| {
            domains
                .iter()
                .find(|d| d.origin == origin)
                .map(|d| &d.symbols)
        });
        Report {
            event: EventInfo::of(&run),
            run,
            domains: reports,
            stacks,
            checks: Vec::new(),
        }
    }

    /// Total samples over all domains.
    #[cfg(test)]
    pub fn total_samples(&self) -> u64 {
        self.domains.iter().map(|d| d.samples).sum()
    }

    /// The report as a table: a run line, per domain a header and up to `top` functions, then
    /// the checks.
    pub fn to_text(&self, top: usize) -> String {
        let mut out = String::new();
        let r = &self.run;
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "vpmu profile: {} mode, {}, {} Hz, {:.1} s, TSC {} kHz, {} pCPUs, {} vCPUs per workload domain",
            r.mode, r.vendor, r.frequency_hz, r.duration_s, r.tsc_khz, r.pcpus, r.vcpus
        );
        let e = &self.event;
        let _ = writeln!(
            out,
            "event: {} ({}); a sample every {} {} on average (±{}), {} Hz of sampled CPU time; \
             counts below are samples",
            e.name,
            e.counts,
            e.period,
            e.unit,
            e.jitter / 2,
            e.frequency_hz
        );
        for d in &self.domains {
            let vcpus: Vec<String> = d
                .vcpus
                .iter()
                .map(|(v, n)| format!("vCPU {v}: {n}"))
                .collect();
            let _ = writeln!(
                out,
                "== {}: {} samples (user {}, kernel {}{}{}), dropped {}",
                d.label(),
                d.samples,
                d.user,
                d.kernel,
                if vcpus.len() > 1 { "; " } else { "" },
                if vcpus.len() > 1 {
                    vcpus.join(", ")
                } else {
                    String::new()
                },
                d.dropped
            );
            for f in d.functions.iter().take(top) {
                let _ = writeln!(
                    out,
                    "{:>6.1} % {:>5}  (user {}, kernel {})  {}",
                    f.percent, f.samples, f.user, f.kernel, f.name
                );
            }
            if d.functions.len() > top {
                let rest = &d.functions[top..];
                let samples: u64 = rest.iter().map(|f| f.samples).sum();
                let _ = writeln!(
                    out,
                    "  ... {} more functions, {} samples",
                    rest.len(),
                    samples
                );
            }
        }
        for c in &self.checks {
            let verdict = match (c.passed, c.skipped) {
                (true, _) => "PASS",
                (false, true) => "SKIP",
                (false, false) => "FAIL",
            };
            let _ = writeln!(out, "{verdict} {} — {}", c.name, c.detail);
        }
        out
    }

    /// Folded stacks for flamegraph tools (FlameGraph, inferno, speedscope): one line per
    /// distinct stack, `<domain>;<outermost caller>;...;<sampled function> <count>`, kernel
    /// frames marked `_[k]`.
    pub fn folded(&self) -> Vec<String> {
        self.stacks.iter().map(StackRow::folded).collect()
    }

    /// The flamegraph title.
    fn title(&self) -> String {
        format!(
            "vpmu profile: {} mode, {} Hz, {:.1} s",
            self.run.mode, self.run.frequency_hz, self.run.duration_s
        )
    }

    /// Renders the flamegraph of [`Report::folded`] as SVG into `path`; without samples, an
    /// SVG that says so.
    pub fn write_svg(&self, path: &Path) -> io::Result<()> {
        let lines = self.folded();
        let title = self.title();
        let svg = if lines.is_empty() {
            // inferno refuses empty input; a viewer should still get a readable file.
            empty_svg(&title)
        } else {
            let mut options = inferno::flamegraph::Options::default();
            options.title = title;
            options.count_name = "samples".to_string();
            let mut buf = Vec::new();
            inferno::flamegraph::from_lines(
                &mut options,
                lines.iter().map(String::as_str),
                &mut buf,
            )
            .map_err(|e| io::Error::other(format!("flamegraph: {e}")))?;
            buf
        };
        std::fs::write(path, svg)
    }

    /// Writes the report as pretty JSON into `path`.
    #[cfg(test)]
    pub fn write_json(&self, path: &Path) -> io::Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(io::Error::other)?;
        std::fs::write(path, json + "\n")
    }
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

fn empty_svg(title: &str) -> Vec<u8> {
    format!(
        "<?xml version=\"1.0\" standalone=\"no\"?>\n\
         <svg version=\"1.1\" width=\"1200\" height=\"80\" xmlns=\"http://www.w3.org/2000/svg\">\n\
         <text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"17\">{}</text>\n\
         <text x=\"600\" y=\"56\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"14\">no samples</text>\n\
         </svg>\n",
        xml_escape(title)
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu::abi::Regs;

    fn run() -> RunInfo {
        RunInfo {
            mode: "all".into(),
            vendor: "intel".into(),
            frequency_hz: 1000,
            duration_s: 2.0,
            tsc_khz: 2_000_000,
            pcpus: 1,
            vcpus: 1,
        }
    }

    fn sample(origin: Origin, rip: u64, user: bool) -> ProfileSample {
        ProfileSample {
            origin,
            vcpu: 0,
            pcpu: 0,
            rip,
            user,
            regs: Regs::default(),
            shipped_by: 0,
            details: Default::default(),
        }
    }

    fn domains() -> Vec<DomainInfo> {
        vec![
            DomainInfo {
                origin: Origin::Domain(1),
                name: "work.elf".into(),
                symbols: Symbols::from_table(vec![
                    (0x1000, 0x100, "w1_deflate".into()),
                    (0x2000, 0x100, "w1;odd name".into()),
                    (0x3000, 0x100, "kentry".into()),
                ]),
                dropped: 5,
            },
            DomainInfo {
                origin: Origin::Domain(2),
                name: "idle.elf".into(),
                symbols: Symbols::default(),
                dropped: 0,
            },
        ]
    }

    fn samples() -> Vec<ProfileSample> {
        let d1 = Origin::Domain(1);
        let mut s = Vec::new();
        s.extend((0..6).map(|i| sample(d1, 0x1000 + i, true)));
        s.extend((0..2).map(|_| sample(d1, 0x2010, true)));
        s.push(sample(d1, 0x3000, false));
        s.push(sample(d1, 0x9999, false));
        s.push(sample(Origin::Domain(7), 0x1000, true));
        s.push(sample(Origin::Hypervisor, 0x1000, false));
        s
    }

    fn report() -> Report {
        let mut r = Report::build(run(), &samples(), &domains());
        r.checks.push(Check {
            name: "samples_seen".into(),
            passed: true,
            skipped: false,
            detail: "12 > 0".into(),
        });
        r.checks.push(Check {
            name: "no_drops".into(),
            passed: false,
            skipped: false,
            detail: "5 dropped".into(),
        });
        r
    }

    #[test]
    fn counts_and_percents() {
        let r = report();
        assert_eq!(r.total_samples(), 12);
        let d1 = &r.domains[0];
        assert_eq!(d1.origin, Origin::Domain(1));
        assert_eq!((d1.samples, d1.user, d1.kernel, d1.dropped), (10, 8, 2, 5));
        assert_eq!(d1.functions.len(), 4);
        let top = d1.top().unwrap();
        assert_eq!(
            (top.name.as_str(), top.samples, top.user, top.kernel),
            ("w1_deflate", 6, 6, 0)
        );
        assert!((d1.percent_of("w1_deflate") - 60.0).abs() < 1e-9);
        assert!((d1.percent_of("[unknown]") - 10.0).abs() < 1e-9);
        assert_eq!(d1.percent_of("absent"), 0.0);
        let sum: f64 = d1.functions.iter().map(|f| f.percent).sum();
        assert!((sum - 100.0).abs() < 1e-9);
        // Ties sorted by name.
        assert_eq!(d1.functions[2].name, "[unknown]");
        assert_eq!(d1.functions[3].name, "kentry");
    }

    #[test]
    fn empty_domain_and_unlisted_origins_appear() {
        let r = report();
        let origins: Vec<Origin> = r.domains.iter().map(|d| d.origin).collect();
        assert_eq!(
            origins,
            [
                Origin::Domain(1),
                Origin::Domain(2),
                Origin::Domain(7),
                Origin::Hypervisor
            ]
        );
        let idle = &r.domains[1];
        assert_eq!(idle.samples, 0);
        assert!(idle.top().is_none());
        assert_eq!(idle.percent_of("[unknown]"), 0.0);
        let d7 = &r.domains[2];
        assert_eq!(d7.label(), "dom7 (no image)");
        assert_eq!(d7.functions[0].name, "[unknown]");
        assert_eq!(d7.percent_of("[unknown]"), 100.0);
        assert_eq!(r.domains[3].label(), "hypervisor");
        assert_eq!(r.domains[3].kernel, 1);
    }

    #[test]
    fn text_table() {
        let text = report().to_text(2);
        assert!(text.contains("== dom1 work.elf: 10 samples (user 8, kernel 2), dropped 5\n"));
        assert!(
            text.contains("  60.0 %     6  (user 6, kernel 0)  w1_deflate\n"),
            "{text}"
        );
        assert!(text.contains("  ... 2 more functions, 2 samples\n"));
        assert!(text.contains("== dom2 idle.elf: 0 samples (user 0, kernel 0), dropped 0\n"));
        assert!(text.contains("PASS samples_seen — 12 > 0\n"));
        assert!(text.contains("FAIL no_drops — 5 dropped\n"));
        assert!(!text.contains("kentry"));
    }

    #[test]
    fn folded_lines() {
        let folded = report().folded();
        // Without call chains every stack is the sampled function alone, under its domain;
        // kernel frames marked `_[k]`.
        assert_eq!(
            folded,
            [
                "dom1;w1_deflate 6",
                "dom1;w1:odd name 2",
                "dom1;[unknown]_[k] 1",
                "dom1;kentry_[k] 1",
                "dom7;[unknown] 1",
                "hypervisor;[unknown]_[k] 1",
            ]
        );
        for line in &folded {
            let (stack, count) = line.rsplit_once(' ').unwrap();
            assert!(count.parse::<u64>().unwrap() > 0);
            assert_eq!(stack.split(';').count(), 2);
        }
    }

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("vpmu-report-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn svg_written() {
        let path = temp("flame.svg");
        report().write_svg(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<?xml") || svg.contains("<svg"));
        assert!(svg.contains("w1_deflate"));
        assert!(svg.contains("vpmu profile: all mode, 1000 Hz, 2.0 s"));
    }

    #[test]
    fn svg_without_samples() {
        let path = temp("empty.svg");
        let r = Report::build(run(), &[], &domains());
        assert_eq!(r.total_samples(), 0);
        assert!(r.folded().is_empty());
        r.write_svg(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<?xml") && svg.contains("<svg") && svg.contains("no samples"));
    }

    #[test]
    fn json_round_trip() {
        let path = temp("report.json");
        report().write_json(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["run"]["mode"], "all");
        assert_eq!(v["run"]["frequency_hz"], 1000);
        assert_eq!(v["domains"].as_array().unwrap().len(), 4);
        let d1 = &v["domains"][0];
        assert_eq!(
            d1["origin"],
            serde_json::json!({"kind": "domain", "domain": 1})
        );
        assert_eq!(d1["name"], "work.elf");
        assert_eq!(d1["samples"], 10);
        assert_eq!(d1["dropped"], 5);
        assert_eq!(d1["functions"][0]["name"], "w1_deflate");
        assert_eq!(d1["functions"][0]["percent"], 60.0);
        assert_eq!(
            v["domains"][3]["origin"],
            serde_json::json!({"kind": "hypervisor", "domain": null})
        );
        assert_eq!(v["checks"][1]["passed"], false);
    }
}
