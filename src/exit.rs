//! Exit codes, documented in `taptree --help` and docs/GUIDE.md.
//!
//! A tool failure must never read as a model defect (1) nor as agreement (0).
//! Shared by both binaries (src/front.rs, src/main.rs), with how a command's
//! end is reported.

use std::io::{self, Write};
use std::process::ExitCode;

/// Identical, or within tolerance; a command that did its job.
pub const OK: u8 = 0;
/// The trees diverge (diff, verify A B), or a bisect found its answer red.
pub const DIVERGED: u8 = 1;
/// Could not compare: missing or incomplete tree, corrupt file, bad input,
/// a failed control, an unsupported model. Never a verdict on the model.
pub const COULD_NOT_COMPARE: u8 = 2;

/// The exit code of a diff's outcome: 0 agreement, 1 diverged, 2 anything
/// that is not a verdict (inconclusive, a failed control, an unreadable tap).
pub fn of_outcome(outcome: diff::DiffOutcome) -> u8 {
    use diff::DiffOutcome::*;
    match outcome {
        Identical | WithinTolerance => OK,
        Diverged => DIVERGED,
        Inconclusive | ControlFailed | Unreadable => COULD_NOT_COMPARE,
    }
}

/// The exit of a command that ran: its code, or its error printed as
/// `taptree: ...` with exit 2. (A reader of stdout that went away is
/// settled where stdout is written: [`report`], [`on_failed_print`]; a
/// broken pipe anywhere else, a `--html` into a FIFO whose reader left, is
/// an error like any other.)
pub fn end(result: anyhow::Result<u8>) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("taptree: {}", message(&err));
            ExitCode::from(COULD_NOT_COMPARE)
        }
    }
}

/// Writes a command's report on stdout and returns its verdict's exit
/// `code`. A reader that went away before reading it all (`taptree diff A
/// B | head`) does not change the code: a divergence still exits 1, which
/// `set -o pipefail` sees. Any other failure to write is an error (exit 2).
pub fn report(
    code: u8,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> anyhow::Result<u8> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    match write(&mut out).and_then(|()| out.flush()) {
        Ok(()) => Ok(code),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(code),
        Err(e) => Err(anyhow::Error::new(e).context("writing the report to stdout")),
    }
}

/// A report as pretty JSON and a newline (the `--json` of every command).
pub fn json(out: &mut dyn Write, value: &impl serde::Serialize) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
}

/// The error and its causes, `: `-separated, leaving out a cause whose text the
/// message already carries (library errors embed their io cause as
/// `path: cause`, and also expose it as their source).
fn message(err: &anyhow::Error) -> String {
    let mut out = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !out.contains(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
    }
    out
}

/// What a failed `println!` ends as (it reports a failed write by
/// panicking; the hook turns exactly that panic into an exit): a reader of
/// stdout that went away (`taptree capture ... | head`) is not a failure of
/// ours, exit 0, quietly; any other failure (a full disk) is `taptree:
/// writing to stdout: ...`, exit 2, never a panic's 101. Commands with a
/// verdict write through [`report`] instead, which keeps its code.
pub fn on_failed_print() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = text.strip_prefix("failed printing to stdout: ") {
            if why.contains("Broken pipe") {
                std::process::exit(i32::from(OK));
            }
            eprintln!("taptree: writing to stdout: {why}");
            std::process::exit(i32::from(COULD_NOT_COMPARE));
        }
        default(info)
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use diff::DiffOutcome;

    #[test]
    fn only_agreement_is_0_and_only_divergence_is_1() {
        assert_eq!(of_outcome(DiffOutcome::Identical), OK);
        assert_eq!(of_outcome(DiffOutcome::WithinTolerance), OK);
        assert_eq!(of_outcome(DiffOutcome::Diverged), DIVERGED);
        for not_a_verdict in [
            DiffOutcome::Inconclusive,
            DiffOutcome::ControlFailed,
            DiffOutcome::Unreadable,
        ] {
            assert_eq!(of_outcome(not_a_verdict), COULD_NOT_COMPARE);
        }
    }
}
