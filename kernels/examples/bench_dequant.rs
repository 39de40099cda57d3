//! Dequantizing every tensor of a GGUF to f32: ours (rayon over rows) against
//! the `gguf` Python package (numpy), in one run; prints medians and the ratio.
//!
//! `cargo run --release -p kernels --example bench_dequant [smollm2|FILE.gguf] [REPEATS]`

use std::time::Instant;

use model::gguf::GgufFile;
use model::load::load_model;
use model::QTensor;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = std::env::args().nth(1).unwrap_or_else(|| "smollm2".into());
    let repeats: usize = std::env::args().nth(2).map_or(Ok(7), |s| s.parse())?;
    let path = fetch::resolve(&spec)?;

    let gguf = GgufFile::open(&path)?;
    let tensors: Vec<QTensor> = gguf
        .tensors()
        .iter()
        .map(|i| QTensor {
            name: i.name.clone(),
            ggml_type: i.ggml_type,
            shape: i.shape(),
            data: gguf.tensor_data(i).to_vec().into(),
        })
        .collect();
    let params: usize = tensors.iter().map(QTensor::numel).sum();

    let mut ours = Vec::new();
    for _ in 0..repeats {
        let start = Instant::now();
        for t in &tensors {
            std::hint::black_box(t.to_f32()?);
        }
        ours.push(start.elapsed().as_secs_f64());
    }
    let mut loads = Vec::new();
    for _ in 0..repeats {
        let start = Instant::now();
        std::hint::black_box(load_model(&path)?);
        loads.push(start.elapsed().as_secs_f64());
    }
    let ours = median(ours);
    println!(
        "{}: {} tensors, {params} parameters, {} threads",
        path.display(),
        tensors.len(),
        rayon::current_num_threads()
    );
    println!(
        "load_model (parse, copy, tokenizer, blake3): median {:.1} ms",
        median(loads) * 1e3
    );
    println!(
        "taptree dequantize all:      median {:.1} ms ({:.0} M params/s)",
        ours * 1e3,
        params as f64 / ours / 1e6
    );

    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf_dequant.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(["--bench", &repeats.to_string()])
        .arg(&path)
        .output()?;
    if !out.status.success() {
        println!(
            "gguf-py peer skipped: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return Ok(());
    }
    let peer: f64 = String::from_utf8(out.stdout)?.trim().parse()?;
    println!("gguf-py dequantize all:      median {:.1} ms", peer * 1e3);
    println!("ratio (gguf-py / taptree):   {:.1}x", peer / ours);
    Ok(())
}
