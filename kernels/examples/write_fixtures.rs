//! Writes every tiny fixture model, as GGUF and as an HF checkpoint.
//!
//! `cargo run -p kernels --example write_fixtures [DIR]` (default
//! `target/fixtures`, inside the ignored build directory).

fn main() -> std::process::ExitCode {
    let dir = std::path::PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/fixtures".into()),
    );
    for name in kernels::fixtures::NAMES {
        let written = kernels::fixtures::write(name, &dir)
            .and_then(|g| Ok((g, kernels::fixtures::write_hf(name, &dir)?)));
        match written {
            Ok((gguf, hf)) => println!("{name}: {} {}", gguf.display(), hf.display()),
            Err(e) => {
                eprintln!("taptree: {e}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    std::process::ExitCode::SUCCESS
}
