//! The full `taptree` command (`taptree-full`, started by the `taptree`
//! front, src/front.rs): parse, dispatch, map the outcome to an exit code.

#![forbid(unsafe_code)]

mod bisect;
mod cli;
mod drift;
mod exit;
mod start;
mod trusted;

use std::process::ExitCode;

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    let args = start::parse();
    match cli::run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) if is_broken_pipe(&err) => ExitCode::from(exit::OK),
        Err(err) => {
            eprintln!("taptree: {}", message(&err));
            ExitCode::from(exit::COULD_NOT_COMPARE)
        }
    }
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

/// The reader of stdout went away (`taptree ls | head`): not a failure of
/// ours, so the command ends quietly with 0. `println!` reports a failed
/// write by panicking; the hook turns exactly that panic into the exit.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(i32::from(exit::OK));
        }
        default(info)
    }));
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
