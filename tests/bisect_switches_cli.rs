//! `taptree bisect switches`, end to end: its capture command is the
//! helper mode of this test binary (`bisect_cli::capture_helper`), which
//! perturbs taps according to `SW_*` variables, so a divergence that only a
//! pair of switches causes can be planted on demand.

use crate::bisect_cli::{helper_command, reference, runs_logged, taptree, text};
use serde_json::Value;

fn switch_args<'a>(reference: &'a str, cmd: &'a str, switches: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "bisect",
        "switches",
        "--reference",
        reference,
        "--capture",
        cmd,
    ];
    for s in switches {
        args.push("--switch");
        args.push(s);
    }
    args
}

#[test]
fn bisect_switches_names_a_pair_that_only_diverges_together() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    let log = tmp.path().join("captures.log");
    let cmd = helper_command(&log);
    let cache = tmp.path().join("arms");
    let mut args = switch_args(
        reference.to_str().unwrap(),
        &cmd,
        &["SW_C=0,1", "SW_A=0,1", "SW_D=0,1", "SW_B=0,1"],
    );
    args.extend(["--cache", cache.to_str().unwrap()]);

    let out = taptree(tmp.path(), &args);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    // The arms table: all off and every single switch green, all on red.
    let row = |label: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{label} ")))
            .unwrap_or_else(|| panic!("no arm {label:?} in\n{stdout}"))
            .to_string()
    };
    for label in ["all off", "SW_C=1", "SW_A=1", "SW_D=1", "SW_B=1"] {
        assert!(row(label).contains(" green "), "{}", row(label));
    }
    assert!(row("all on").contains(" red "), "{stdout}");
    assert!(row("all on").contains("L1/ffn_up@"), "{stdout}");
    // SW_C's nudge is the first change, but within tolerance.
    assert!(row("all on").contains(" L0/attn "), "{stdout}");
    assert!(row("SW_C=1").contains(" L0/attn "), "{stdout}");
    assert!(row("SW_D=1").contains(" green "), "{stdout}");
    assert!(
        stdout.contains("no single switch diverges alone"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "minimal culprit set (delta debugging): SW_A=1 SW_B=1 (first diverging op: L1/ffn_up@"
        ),
        "{stdout}"
    );

    // JSON, from the cache: nothing is captured again.
    let runs = runs_logged(&log);
    args.push("--json");
    let out = taptree(tmp.path(), &args);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(runs_logged(&log), runs);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["captures_run"], 0);
    assert_eq!(report["answer"]["kind"], "set");
    assert_eq!(
        report["answer"]["culprit"]["switches"],
        serde_json::json!(["SW_A=1", "SW_B=1"])
    );
    assert_eq!(report["answer"]["culprit"]["first_op"]["op"], "L1/ffn_up");
    let singles: Vec<&Value> = report["arms"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "single")
        .collect();
    assert_eq!(singles.len(), 4);
    assert!(singles.iter().all(|a| a["verdict"] == "green"));
}

#[test]
fn bisect_switches_names_a_single_culprit_without_ddmin() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    let cmd = helper_command(&tmp.path().join("captures.log"));
    let args = switch_args(
        reference.to_str().unwrap(),
        &cmd,
        &["SW_C=0,1", "SW_E=0,1", "SW_A=0,1"],
    );
    let out = taptree(tmp.path(), &args);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("culprit: SW_E=1 alone (first diverging op: L0/q_proj@"),
        "{stdout}"
    );
    assert!(!stdout.contains("delta debugging"), "{stdout}");
    // SW_C moves a tap by 3e-7: within tolerance, green; under --bitwise, red.
    let mut bitwise = args.clone();
    bitwise.push("--bitwise");
    bitwise.push("--json");
    let out = taptree(tmp.path(), &bitwise);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let culprits: Vec<&str> = report["answer"]["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["switches"][0].as_str().unwrap())
        .collect();
    // Earliest first divergence first: L0/q_proj comes before L0/attn.
    assert_eq!(culprits, ["SW_E=1", "SW_C=1"], "{report:#}");
}

#[test]
fn bisect_switches_says_when_nothing_diverges_and_when_all_off_already_does() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    let cmd = helper_command(&tmp.path().join("captures.log"));
    let out = taptree(
        tmp.path(),
        &switch_args(reference.to_str().unwrap(), &cmd, &["SW_C=0,1", "SW_D=0,1"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("no arm diverges from the reference"));

    // SW_E's "off" value is 1 here: the baseline itself is red.
    let out = taptree(
        tmp.path(),
        &switch_args(reference.to_str().unwrap(), &cmd, &["SW_E=1,0"]),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("all off already diverges from the reference"));
}

#[test]
fn bisect_switches_rejects_a_malformed_switch() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    let out = taptree(
        tmp.path(),
        &switch_args(reference.to_str().unwrap(), "true", &["SW_A=1"]),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--switch \"SW_A=1\": expected NAME=OFF,ON"));
}
