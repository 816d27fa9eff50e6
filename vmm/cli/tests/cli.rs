//! The command line behaves alike in every subcommand: a bad path is exit status 2 (before
//! /dev/kvm is looked at), a missing /dev/kvm is status 77 with the same two lines, and a
//! mistyped option or subcommand gets clap's suggestion. None of these needs /dev/kvm.

use std::process::{Command, Output};

fn vpmu(args: &[&str], kvm: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vpmu"));
    command.args(args);
    if let Some(device) = kvm {
        command.env("VPMU_KVM_DEVICE", device);
    }
    command.output().expect("run the vpmu binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every path a subcommand reads or creates, missing or impossible: status 2, the path named,
/// and /dev/kvm never opened (it is missing here, which would be 77).
#[test]
fn a_bad_path_is_status_2_in_every_subcommand() {
    let missing = "/nonexistent/vpmu-input";
    let dir = std::env::temp_dir().join(format!("vpmu-cli-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A file where a directory must go.
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").expect("write");
    let not_a_dir = file.join("out");
    let not_a_dir = not_a_dir.to_str().expect("UTF-8");
    let guest = dir.join("guest.elf");
    std::fs::write(&guest, vpmu_guests::EXAMPLE).expect("write the example guest");
    let guest = guest.to_str().expect("UTF-8");
    let file = file.to_str().expect("UTF-8");
    for (args, names) in [
        (vec!["boot", missing], missing),
        (vec!["boot", "--initrd", missing, guest], missing),
        (vec!["profile", "--guest", missing], missing),
        (vec!["profile", "--out", not_a_dir], not_a_dir),
        (vec!["coverage", "--out", not_a_dir], not_a_dir),
        (vec!["coverage", "report", missing], missing),
        (
            vec!["coverage", "report", file, "--binary", missing],
            missing,
        ),
        (
            vec!["coverage", "report", file, "--out", not_a_dir],
            not_a_dir,
        ),
    ] {
        let out = vpmu(&args, Some("/nonexistent/kvm"));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(names), "{args:?}: {stderr}");
        assert!(!stderr.contains("/dev/kvm"), "{args:?}: {stderr}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Without /dev/kvm every subcommand that needs it says the same thing: the reason on stderr,
/// `SKIPPED: ...` on stdout, status 77.
#[test]
fn no_kvm_is_the_same_message_and_status_everywhere() {
    let dir = std::env::temp_dir().join(format!("vpmu-cli-nokvm-{}", std::process::id()));
    let out_dir = dir.join("out");
    let out_dir = out_dir.to_str().expect("UTF-8");
    let boot_image = dir.join("kernel");
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A multiboot header (magic, flags 0, checksum) makes the file a bootable image.
    let mut image = Vec::new();
    for word in [0x1bad_b002u32, 0, 0u32.wrapping_sub(0x1bad_b002)] {
        image.extend_from_slice(&word.to_le_bytes());
    }
    std::fs::write(&boot_image, &image).expect("write");
    let boot_image = boot_image.to_str().expect("UTF-8");
    for command in [
        vec!["profile", "--out", out_dir],
        vec!["selftest"],
        vec!["bench"],
        vec!["coverage", "--out", out_dir],
        vec!["boot", boot_image],
    ] {
        let out = vpmu(&command, Some("/nonexistent/kvm"));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(77), "{command:?}: {stderr}");
        let expected = format!(
            "vpmu {}: cannot run: /dev/kvm is not available (cannot open /nonexistent/kvm: ",
            command[0]
        );
        assert!(stderr.starts_with(&expected), "{command:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{command:?}: {stderr}");
        assert!(
            stdout.starts_with("SKIPPED: /dev/kvm not available (cannot open /nonexistent/kvm: "),
            "{command:?}: {stdout}"
        );
        assert_eq!(stdout.lines().count(), 1, "{command:?}: {stdout}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A mistyped option, value or subcommand: clap's "did you mean", status 2.
#[test]
fn mistakes_get_suggestions() {
    for (args, tip) in [
        (
            &["profile", "--mod", "all"][..],
            "tip: a similar argument exists: '--mode'",
        ),
        (&["profle"], "tip: a similar subcommand exists: 'profile'"),
        (
            &["profile", "--vendor", "intl"],
            "tip: a similar value exists: 'intel'",
        ),
        (
            &["boot", "--pmu", "amd-k8", "x"],
            "tip: a similar value exists: 'amd-k7'",
        ),
    ] {
        let out = vpmu(args, None);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            stderr
                .lines()
                .next()
                .is_some_and(|l| l.starts_with("error: ")),
            "{stderr}"
        );
        assert!(stderr.contains(tip), "{args:?}: {stderr}");
        assert!(!stderr.contains("Usage:"), "{stderr}");
    }
}
