//! The full `taptree` command (`taptree-full`, started by the `taptree`
//! front, src/front.rs): parse, dispatch, map the outcome to an exit code.

#![forbid(unsafe_code)]

mod bisect;
mod cli;
mod drift;
mod exit;
mod trusted;

use std::process::ExitCode;

fn main() -> ExitCode {
    quiet_on_broken_pipe();
    if let Err(e) = same_build_as_the_front() {
        eprintln!("taptree: {e}");
        return ExitCode::from(exit::COULD_NOT_COMPARE);
    }
    let args = <cli::Cli as clap::Parser>::parse();
    match cli::run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) if is_broken_pipe(&err) => ExitCode::from(exit::OK),
        Err(err) => {
            eprintln!("taptree: {}", message(&err));
            ExitCode::from(exit::COULD_NOT_COMPARE)
        }
    }
}

/// Started by the `taptree` front (src/front.rs), this binary must be of
/// the front's build: a front rebuilt alone would otherwise hand its
/// commands to an older full command. The variable is removed, so that
/// commands this one starts (a bisect's captures) see a clean environment.
fn same_build_as_the_front() -> Result<(), String> {
    let Some(front) = std::env::var_os("TAPTREE_FRONT_BUILD") else {
        return Ok(());
    };
    std::env::remove_var("TAPTREE_FRONT_BUILD");
    let mine = env!("TAPTREE_BUILD_ID");
    if front.to_str() == Some(mine) {
        return Ok(());
    }
    let me =
        std::env::current_exe().map_or_else(|_| "taptree-full".into(), |p| p.display().to_string());
    Err(format!(
        "{me} is from another build than the `taptree` beside it (build {} against {mine}): \
         build both (`cargo build --release` or `cargo install --path .`)",
        front.to_string_lossy()
    ))
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
