//! Fetches the real model into the cache (once) and prints its path.
//!
//! `cargo run --release -p fetch --example fetch_model [smollm2|gemma3-270m|PATH]`

fn main() -> std::process::ExitCode {
    let spec = std::env::args().nth(1).unwrap_or_else(|| "smollm2".into());
    match fetch::resolve(&spec) {
        Ok(path) => {
            println!("{}", path.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("taptree: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
