//! Runs `vpmu profile` end to end on KVM: the default (all mode with the self-mode
//! comparison, Intel) and hv mode (AMD), and checks the exit status, the report, the
//! validation results in the JSON and the flamegraph. Without a usable /dev/kvm the binary
//! exits with 77 and this test says so loudly and passes.

use std::path::{Path, PathBuf};
use std::process::Command;

const SKIP: i32 = 77;

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vpmu-profile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `vpmu profile ARGS --out DIR --quiet`, which must pass; None if KVM is missing (said
/// loudly).
fn profile(args: &[&str], out: &Path) -> Option<(serde_json::Value, String)> {
    profile_run(args, out, true)
}

/// As `profile`; with `must_pass` false a run whose checks failed (exit 1, profile.json
/// written) is returned too.
fn profile_run(args: &[&str], out: &Path, must_pass: bool) -> Option<(serde_json::Value, String)> {
    let result = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .arg("profile")
        .args(args)
        .arg("--out")
        .arg(out)
        .arg("--quiet")
        .output()
        .expect("run the vpmu binary");
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&result.stderr);
    if result.status.code() == Some(SKIP) {
        let line = format!(
            "SKIPPED: /dev/kvm not available: vpmu profile {} did not run ({})",
            args.join(" "),
            stderr.trim()
        );
        eprintln!("{line}");
        println!("{line}");
        return None;
    }
    println!("{stdout}");
    assert!(
        result.status.success() || (!must_pass && result.status.code() == Some(1)),
        "vpmu profile {} failed ({}):\n{stdout}\n{stderr}",
        args.join(" "),
        result.status
    );
    let json = std::fs::read_to_string(out.join("profile.json")).expect("profile.json written");
    let doc = serde_json::from_str(&json).expect("profile.json is JSON");
    Some((doc, stdout))
}

fn check_names(doc: &serde_json::Value) -> Vec<(String, bool)> {
    doc["report"]["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().expect("name").to_string(),
                c["passed"].as_bool().expect("passed"),
            )
        })
        .collect()
}

/// The JSON shape of domain `d`'s origin.
fn origin(d: u32) -> serde_json::Value {
    serde_json::json!({ "kind": "domain", "domain": d })
}

fn domain<'a>(doc: &'a serde_json::Value, origin: &serde_json::Value) -> &'a serde_json::Value {
    doc["report"]["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .find(|d| &d["origin"] == origin)
        .expect("the domain is in the report")
}

/// The default (all mode, the built-in workloads, the seed-002 comparison), sampling longer
/// than the default 5 s: ~1700 samples per workload domain put the ±5-point share checks at
/// four standard deviations even in a debug build (a flaky test helps nobody).
fn default_all_mode() {
    let out = out_dir("all");
    let Some((doc, stdout)) = profile(&["--duration", "8"], &out) else {
        return;
    };
    let checks = check_names(&doc);
    // Every check made held; attribution and fairness are always made.
    assert!(check_failed(&doc).is_none(), "{:?}", check_failed(&doc));
    for name in ["attribution", "fairness"] {
        assert!(
            checks
                .iter()
                .any(|(n, passed)| n.starts_with(name) && *passed),
            "{name}: {checks:?}"
        );
    }
    let has = |prefix: &str| checks.iter().filter(|(n, _)| n.starts_with(prefix)).count();
    assert_eq!(has("attribution 100 %"), 1, "{checks:?}");
    assert_eq!(has("self-mode run: attribution 100 %"), 1, "{checks:?}");
    assert_eq!(
        checks
            .iter()
            .filter(|(n, _)| n.starts_with("dom") && n.contains("function shares"))
            .count(),
        3,
        "a share check per workload domain: {checks:?}"
    );
    assert_eq!(
        checks
            .iter()
            .filter(|(n, _)| n.starts_with("dom") && n.contains("call-stack shares"))
            .count(),
        3,
        "a stack-share check per workload domain: {checks:?}"
    );
    assert_eq!(
        has("seed 002"),
        3,
        "a seed-002 check per workload domain: {checks:?}"
    );
    // Every workload domain was sampled, its top function is its heaviest by construction.
    for (d, top) in [(1, "w1_deflate"), (2, "w2_lookup"), (3, "w3_merge")] {
        let dom = domain(&doc, &origin(d));
        assert!(dom["samples"].as_u64().expect("samples") > 500, "{dom}");
        assert_eq!(dom["functions"][0]["name"], top, "{dom}");
        // Both vCPUs of the domain (the default is two) were sampled and told apart.
        for v in ["0", "1"] {
            assert!(
                dom["vcpus"][v].as_u64().expect("per-vCPU count") > 200,
                "{dom}"
            );
        }
    }
    let lines = std::fs::read_to_string(out.join("samples.jsonl")).expect("samples.jsonl");
    let samples: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON sample"))
        .collect();
    let first = &samples[0];
    assert!(
        first["regs"]["r15"].is_string() && first["regs"]["rip"].is_string(),
        "{first}"
    );
    // The default machine has two pCPUs, each profiled by its own profiler vCPU; vCPU i of a
    // workload domain runs on pCPU i.
    assert_eq!(doc["report"]["run"]["pcpus"], 2);
    for pcpu in [0, 1] {
        assert!(
            samples.iter().any(|s| s["pcpu"] == pcpu),
            "no sample of pCPU {pcpu}"
        );
    }
    let profiler = origin(0);
    assert!(
        samples
            .iter()
            .all(|s| s["origin"] == profiler || s["pcpu"] == s["vcpu"])
    );
    assert!(doc["delivery"]["delivered"].as_u64().expect("delivered") > 0);
    assert!(doc["comparison"]["report"]["domains"].is_array());
    let svg = std::fs::read_to_string(out.join("flamegraph.svg")).expect("flamegraph.svg");
    assert!(svg.contains("<svg") && svg.contains("w2_lookup"));
    let text = std::fs::read_to_string(out.join("report.txt")).expect("report.txt");
    assert_eq!(
        text,
        stdout
            .lines()
            .take_while(|l| !l.starts_with("wrote "))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// hv mode on the AMD personality: the workloads sample themselves, the profiler samples
/// itself and the VMM, which appears as the hypervisor.
fn hv_mode_amd() {
    let out = out_dir("hv");
    let Some((doc, _)) = profile(
        &["--mode", "hv", "--vendor", "amd", "--duration", "8"],
        &out,
    ) else {
        return;
    };
    assert!(check_failed(&doc).is_none(), "{:?}", check_failed(&doc));
    for name in ["attribution", "fairness"] {
        assert!(
            check_names(&doc)
                .iter()
                .any(|(n, passed)| n.starts_with(name) && *passed),
            "{name}"
        );
    }
    let hv = domain(
        &doc,
        &serde_json::json!({ "kind": "hypervisor", "domain": null }),
    );
    assert!(hv["samples"].as_u64().expect("samples") > 0, "{hv}");
    let top = hv["functions"][0]["name"].as_str().expect("a function");
    assert!(top.starts_with("vmm_"), "{hv}");
    assert!(doc["comparison"].is_null(), "no comparison run in hv mode");
    // perf names every sample, the hypervisor's too (`[k] vmm_*`, not `[H] 0xffffff...`), and
    // pprof keeps it apart under its own name.
    let perf_data = out.join("perf.data");
    let perf_data = perf_data.to_str().expect("a UTF-8 path");
    every_sample_named(perf_data);
    let report = tool(
        "perf",
        &[
            "report",
            "-i",
            perf_data,
            "--stdio",
            "--no-children",
            "--sort",
            "comm,sym",
        ],
    );
    let hv_lines: Vec<&str> = report
        .lines()
        .filter(|l| l.contains('%') && l.contains("hypervisor"))
        .collect();
    assert!(!hv_lines.is_empty(), "no hypervisor line:\n{report}");
    for line in hv_lines {
        assert!(line.contains("[k] vmm_"), "{line}");
    }
    let pb = out.join("profile.pb.gz");
    let top = tool(
        "go",
        &[
            "tool",
            "pprof",
            "-top",
            "-sample_index=samples",
            pb.to_str().expect("UTF-8"),
        ],
    );
    assert!(top.contains("hypervisor:vmm_"), "{top}");
    let _ = std::fs::remove_dir_all(&out);
}

/// User guests: the example guest (`profile/example.c` of the vpmu-guests crate) in two domains,
/// profiled passively and symbolized from its own ELF.
fn user_guests() {
    let out = out_dir("user");
    let dir = out_dir("example-image");
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let example_path = dir.join("example.elf");
    std::fs::write(&example_path, vpmu_guests::EXAMPLE).expect("write example.elf");
    let example = example_path.to_str().expect("a UTF-8 temporary path");
    let args = ["--guest", example, "--guest", example, "--duration", "3"];
    let Some((doc, _)) = profile(&args, &out) else {
        return;
    };
    let checks = check_names(&doc);
    assert_eq!(
        checks.len(),
        3,
        "only attribution, fairness and the ring's loss accounting without the built-in workloads: {checks:?}"
    );
    assert!(
        checks[0].0.starts_with("attribution") && checks[0].1,
        "{checks:?}"
    );
    assert!(checks[1].0.starts_with("fairness"), "{checks:?}");
    assert!(checks[2].0.starts_with("ring losses"), "{checks:?}");
    assert!(check_failed(&doc).is_none(), "{checks:?}");
    for d in [1, 2] {
        let dom = domain(&doc, &origin(d));
        assert_eq!(dom["name"], "example.elf", "{dom}");
        assert_eq!(dom["functions"][0]["name"], "example_sort", "{dom}");
        assert_eq!(dom["functions"][1]["name"], "example_hash", "{dom}");
    }
    assert!(
        doc["comparison"].is_null(),
        "no seed-002 run for user guests"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// The first check of `doc` that failed (made and did not hold), if any.
fn check_failed(doc: &serde_json::Value) -> Option<String> {
    doc["report"]["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["passed"] == false && c["skipped"] != true)
        .map(|c| format!("{} — {}", c["name"], c["detail"]))
}

/// Fairness in every mode at 2 kHz and at the highest frequency: each workload domain's share
/// of the samples within ±5 points of its share of CPU time, both from the same run, so a
/// loaded host slows the run but does not bias the comparison. The check must be made (at
/// least `MIN_FAIRNESS_SAMPLES` samples: the durations leave room for a slow, loaded host) and
/// hold.
fn fairness_in_every_mode() {
    let max = vpmu_profile::MAX_FREQUENCY.to_string();
    for (mode, frequency) in [
        ("all", "2000"),
        ("all", max.as_str()),
        ("hv", "2000"),
        ("hv", max.as_str()),
        ("self", "2000"),
        ("self", max.as_str()),
    ] {
        let out = out_dir(&format!("fair-{mode}-{frequency}"));
        let args = [
            "--mode",
            mode,
            "--frequency",
            frequency,
            "--duration",
            "4",
            "--no-compare",
        ];
        // At 20 kHz other checks may fail (see below), never this one.
        let must_pass = frequency == "2000";
        let Some((doc, _)) = profile_run(&args, &out, must_pass) else {
            return;
        };
        let checks = doc["report"]["checks"].as_array().expect("checks");
        let fairness = checks
            .iter()
            .find(|c| {
                c["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("fairness"))
            })
            .expect("a fairness check");
        eprintln!("{mode} {frequency} Hz: {}", fairness["detail"]);
        assert_eq!(
            fairness["passed"], true,
            "{mode} {frequency} Hz: {fairness}"
        );
        match check_failed(&doc) {
            Some(failed) if !must_pass => {
                // Known (docs/profile.md, Limits): at 20 kHz a workload's own VIRQ handler,
                // emulated at ~0.3 ms here, costs more than a period of its cycles (self and
                // hv mode: it samples itself back to back and its batch fills), and in all mode
                // the 50 µs period aliases with the workloads' ~0.1 ms rounds.
                let line = format!("KNOWN LIMIT: {mode} mode at {frequency} Hz: {failed}");
                eprintln!("{line}");
                println!("{line}");
            }
            failed => assert!(failed.is_none(), "{failed:?}"),
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// A short profile is not a failed one: the checks without enough samples say so (SKIP) and
/// the run exits 0.
fn short_run_skips_what_it_cannot_check() {
    let out = out_dir("short");
    let Some((doc, stdout)) = profile(&["--duration", "0.5"], &out) else {
        return;
    };
    assert!(check_failed(&doc).is_none(), "{:?}", check_failed(&doc));
    assert!(stdout.contains("SKIP "), "{stdout}");
    assert!(stdout.contains("not enough samples ("), "{stdout}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Runs `program args`, expecting success; its stdout.
fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}): scripts/setup.sh installs linux-perf and golang-go")
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {} failed ({}):\n{stdout}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The function a line of perf report's call graph names: `w1_main`, or the branch
/// `--17.87%--w1_main`; `None` for the graph's connecting lines (`|`).
fn graph_name(line: &str) -> Option<&str> {
    let text = line.trim().trim_start_matches('|').trim();
    let name = text.rsplit("--").next().unwrap_or(text).trim();
    (!name.is_empty() && !name.contains('|')).then_some(name)
}

/// `perf script` and `perf report` name every sample of `perf_data`: no `[unknown]` symbol or
/// object, no bare address (a hypervisor sample unnamed is `[H] 0xffffff...`), in the sampled
/// IP and in every frame of its chain.
fn every_sample_named(perf_data: &str) {
    let script = tool("perf", &["script", "-i", perf_data, "-F", "comm,ip,sym"]);
    let mut frames = 0;
    for line in script
        .lines()
        .filter(|l| l.starts_with(char::is_whitespace))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        frames += 1;
        assert!(
            words.len() == 2 && words[1] != "[unknown]",
            "an unnamed frame in perf script: {line:?}"
        );
    }
    assert!(frames > 100, "{frames} frames:\n{script}");
    let report = tool(
        "perf",
        &[
            "report",
            "-i",
            perf_data,
            "--stdio",
            "--no-children",
            "--sort",
            "comm,dso,sym",
        ],
    );
    for line in report
        .lines()
        .filter(|l| l.contains('%') && !l.contains("--"))
    {
        assert!(
            !line.contains("[unknown]") && !line.contains(" 0x"),
            "an unnamed sample in perf report: {line}"
        );
    }
}

/// The frames of one `go tool pprof -traces` trace, innermost first, without the domain
/// prefix pprof's names carry (`dom1:w1_deflate` is `w1_deflate` of dom1); label lines
/// (`domain:  dom1`) are not frames.
fn pprof_frames(trace: &str) -> Vec<&str> {
    trace
        .lines()
        .filter(|l| !l.contains(":  ") && !l.trim_start().starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .filter_map(|f| f.split_once(':').map(|(_, name)| name))
        .collect()
}

/// A short default profile opened with the tools people use: `perf report` and `perf script`
/// read perf.data and find each domain's hot function with its caller; `go tool pprof` reads
/// profile.pb.gz with the same stacks and labels; the collapsed stacks and samples.jsonl
/// carry the call stacks, complete.
fn tool_formats() {
    let out = out_dir("tools");
    let Some((doc, _)) = profile(&["--duration", "3", "--no-compare"], &out) else {
        return;
    };
    assert_eq!(doc["schema_version"], 2);
    assert_eq!(doc["report"]["event"]["name"], "cycles");
    let period = doc["report"]["event"]["period"].as_u64().expect("period");
    assert!(period > 0);
    let perf_data = out.join("perf.data");
    let perf_data = perf_data.to_str().expect("a UTF-8 path");
    let hot = [
        (1, "w1_main", "w1_deflate"),
        (2, "w2_main", "w2_lookup"),
        (3, "w3_main", "w3_merge"),
    ];

    // perf report: the event, each domain as a command with its image, the hot function with
    // its caller under it.
    let report = tool(
        "perf",
        &[
            "report",
            "-i",
            perf_data,
            "--stdio",
            "--no-children",
            "--comm",
            "dom1,dom2,dom3",
        ],
    );
    assert!(report.contains("of event 'cycles'"), "{report}");
    for (d, caller, callee) in hot {
        let line = report
            .lines()
            .find(|l| l.contains(&format!("dom{d}")) && l.ends_with(&format!("[.] {callee}")))
            .unwrap_or_else(|| panic!("no dom{d} {callee} line in perf report:\n{report}"));
        assert!(line.contains(&format!("dom{d}-work.elf")), "{line}");
        let after = &report[report.find(line).expect("the line")..];
        let block: Vec<&str> = after.lines().take(12).collect();
        // perf prints a single caller on the next line, or, when some samples came through
        // another caller too, branches (`|`, `--17.87%--w3_main`) with the heaviest first.
        let first_caller = block
            .iter()
            .position(|l| l.trim() == format!("---{callee}"))
            .and_then(|at| block[at + 1..].iter().find_map(|l| graph_name(l)));
        assert_eq!(
            first_caller,
            Some(caller),
            "{callee} is not called from {caller} in perf report:\n{}",
            block.join("\n")
        );
    }

    // perf script: every sample with its comm, time, period and event; chains symbolized.
    let script = tool(
        "perf",
        &[
            "script",
            "-i",
            perf_data,
            "-F",
            "comm,tid,time,period,event,ip,sym",
        ],
    );
    for (d, caller, callee) in hot {
        let header = format!("dom{d} ");
        let found = script.split("\n\n").any(|s| {
            let mut lines = s.lines();
            let first = lines.next().unwrap_or("");
            let frames: Vec<&str> = lines.filter_map(|l| l.split_whitespace().nth(1)).collect();
            first.trim_start().starts_with(&header)
                && first.contains(&format!("{period} cycles"))
                && frames.len() >= 2
                && frames[0] == callee
                && frames[1] == caller
        });
        assert!(found, "no dom{d} sample {caller} → {callee} in perf script");
    }

    // go tool pprof: the hot functions, and their stacks with the domain label.
    let pb = out.join("profile.pb.gz");
    let pb = pb.to_str().expect("a UTF-8 path");
    let top = tool(
        "go",
        &["tool", "pprof", "-top", "-sample_index=samples", pb],
    );
    for (_, _, callee) in hot {
        assert!(top.contains(callee), "{callee} not in pprof -top:\n{top}");
    }
    for (d, caller, callee) in hot {
        let focus = format!("-tagfocus=domain=dom{d}");
        let traces = tool("go", &["tool", "pprof", "-traces", &focus, pb]);
        let found = traces.split("-----------+").any(|t| {
            let frames = pprof_frames(t);
            t.contains(&format!("domain:  dom{d}"))
                && t.contains("mode:  user")
                && frames.len() >= 2
                && frames[0] == callee
                && frames[1] == caller
        });
        assert!(
            found,
            "no dom{d} trace {caller} → {callee} in pprof:\n{traces}"
        );
    }

    // The collapsed stacks: domain → caller → callee.
    let folded = std::fs::read_to_string(out.join("stacks.folded")).expect("stacks.folded");
    for (d, caller, callee) in hot {
        let stack = format!(";{caller};{callee} ");
        assert!(
            folded
                .lines()
                .any(|l| l.starts_with(&format!("dom{d};")) && l.contains(&stack)),
            "{folded}"
        );
    }
    let svg = std::fs::read_to_string(out.join("flamegraph.svg")).expect("flamegraph.svg");
    assert!(svg.contains("w1_main") && svg.contains("w1_deflate"));

    // Nothing unnamed in perf, in the sampled IPs or the chains, guest kernels included.
    every_sample_named(perf_data);
    // The outermost frame of a workload's stack is the same in perf, pprof and the folded
    // stacks (the entry code, `user_enter`: perf once read `user_return`, the symbol after
    // the call that ends `user_enter`).
    let outermost_folded: Vec<&str> = folded
        .lines()
        .filter(|l| l.starts_with("dom1;") && l.contains(";w1_main;w1_deflate "))
        .filter_map(|l| l.split(';').nth(1))
        .collect();
    assert!(!outermost_folded.is_empty(), "{folded}");
    let outermost_perf: Vec<&str> = script
        .split("\n\n")
        .filter(|s| s.trim_start().starts_with("dom1 "))
        .filter_map(|s| {
            let frames: Vec<&str> = s
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().nth(1))
                .collect();
            (frames.first() == Some(&"w1_deflate")).then(|| frames.last().copied())?
        })
        .collect();
    assert!(!outermost_perf.is_empty());
    let traces = tool(
        "go",
        &["tool", "pprof", "-traces", "-tagfocus=domain=dom1", pb],
    );
    let outermost_pprof: Vec<&str> = traces
        .split("-----------+")
        .map(pprof_frames)
        .filter(|f| f.first() == Some(&"w1_deflate"))
        .filter_map(|f| f.last().copied())
        .collect();
    for outermost in outermost_perf.iter().chain(&outermost_pprof) {
        assert_eq!(
            *outermost, outermost_folded[0],
            "perf, pprof and stacks.folded disagree"
        );
    }
    // pprof: vCPU 0 and pCPU 0 are labels like any other (a label of value 0 was dropped),
    // and the profiler's `main` is not a workload's `main`.
    let vcpu0 = tool("go", &["tool", "pprof", "-traces", "-tagfocus=vcpu=0", pb]);
    assert!(
        vcpu0.contains("vcpu:  0"),
        "-tagfocus=vcpu=0 matched nothing:\n{vcpu0}"
    );
    let tags = tool("go", &["tool", "pprof", "-tags", pb]);
    let pcpus = tags.split("pcpu:").nth(1).expect("a pcpu tag");
    let pcpus = pcpus.split("\n\n").next().unwrap_or("");
    assert!(
        pcpus.contains("): 0") && pcpus.contains("): 1"),
        "both pCPUs in pprof -tags:\n{tags}"
    );
    let all = tool(
        "go",
        &[
            "tool",
            "pprof",
            "-top",
            "-nodefraction=0",
            "-nodecount=100000",
            pb,
        ],
    );
    let mains: Vec<&str> = all
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|f| f.ends_with(":main") || *f == "main")
        .collect();
    assert!(
        mains.len() >= 2 && mains.iter().all(|f| f.starts_with("dom")),
        "each domain's main apart: {mains:?}\n{all}"
    );
    assert!(
        !tool("go", &["tool", "pprof", "-top", pb]).contains("File: dom0"),
        "one domain's image named as the profile's"
    );
    // perf.data's header: build ids of the images, the command line, the CPU.
    let header = tool("perf", &["report", "-i", perf_data, "--header-only"]);
    for feature in [
        "# cmdline : ",
        "# cpudesc : ",
        "# hostname : ",
        "# os release : ",
    ] {
        assert!(header.contains(feature), "{feature} missing:\n{header}");
    }
    assert!(
        !header.contains("BUILD_ID") && !header.contains("CMDLINE"),
        "{header}"
    );
    let ids = tool("perf", &["buildid-list", "-i", perf_data]);
    for d in 0..4 {
        assert!(ids.contains(&format!("images/dom{d}-")), "dom{d}: {ids}");
    }

    // Every workload sample's chain ends cleanly: complete for user code.
    let lines = std::fs::read_to_string(out.join("samples.jsonl")).expect("samples.jsonl");
    let mut workload_samples = 0;
    for line in lines.lines() {
        let s: serde_json::Value = serde_json::from_str(line).expect("a JSON sample");
        assert_eq!(s["schema_version"], 2);
        assert!(s["time_ns"].as_u64().expect("time") > 0, "{s}");
        if s["origin"]["domain"].as_u64().is_some_and(|d| d > 0) {
            workload_samples += 1;
            // User code is built with frame pointers: its chains are whole. A kernel sample
            // in the first instructions of a trap handler still has the user's RBP, below the
            // kernel stack: the walk stops there as a bad frame, cleanly.
            let end = &s["chain_end"];
            if s["user"] == true {
                assert_eq!(end, "complete", "{s}");
            } else {
                assert!(end == "complete" || end == "bad_frame", "{s}");
            }
        }
    }
    assert!(
        workload_samples > 300,
        "{workload_samples} workload samples"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// One after the other: two profiles competing for the host's CPUs would skew both.
#[test]
fn profile_end_to_end() {
    default_all_mode();
    hv_mode_amd();
    user_guests();
    fairness_in_every_mode();
    short_run_skips_what_it_cannot_check();
    tool_formats();
}

#[test]
fn missing_kvm_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["profile", "--quiet"])
        .env("VPMU_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .expect("run the vpmu binary");
    assert_eq!(out.status.code(), Some(SKIP));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/dev/kvm is not available"), "{stderr}");
}

/// Bad usage: exit status 2, the problem on one line (and clap's pointer to `--help`), no
/// usage dump, and nothing run (no /dev/kvm needed: the device is missing here).
#[test]
fn bad_options_exit_2_on_one_line() {
    for args in [
        &["profile", "--mode", "sideways"][..],
        &["profile", "--frequency", "0"],
        &["profile", "--duration", "700"],
        &["profile", "--bogus"],
        &["coverage", "report"],
        &["selftest", "--vendor", "via"],
        &[],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
            .args(args)
            .env("VPMU_KVM_DEVICE", "/nonexistent/kvm")
            .output()
            .expect("run the vpmu binary");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let lines: Vec<_> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            lines.len() <= 2 && lines[0].starts_with("error: "),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("Usage:") && !stderr.contains("/dev/kvm"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["profile", "--mode", "sideways"])
        .output()
        .expect("run the vpmu binary");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("'sideways' for '--mode <MODE>'") && stderr.contains("all, hv, self"),
        "{stderr}"
    );
}

/// `--help` and `--version` print to stdout and exit 0, for the command and each subcommand.
#[test]
fn help_and_version_exit_0_on_stdout() {
    for args in [
        &["--help"][..],
        &["--version"],
        &["profile", "--help"],
        &["selftest", "--help"],
        &["bench", "--help"],
        &["coverage", "--help"],
        &["coverage", "report", "--help"],
        &["profile", "--version"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
            .args(args)
            .output()
            .expect("run the vpmu binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(out.stderr.is_empty(), "{args:?}");
        if args.contains(&"--version") {
            assert!(
                stdout.starts_with("vpmu") && stdout.contains(" 0."),
                "{stdout}"
            );
        } else {
            assert!(stdout.contains("Usage: vpmu"), "{args:?}: {stdout}");
        }
    }
}
