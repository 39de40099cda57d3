//! The CPU forward on SmolLM2 (the tiny-q fixture when the model is not
//! cached): prefill and decode tokens/s in each precision, and the cost of
//! capture — disarmed taps here; compiled-out taps by building this bench
//! with `--features capture/compile-out`; a full armed capture to disk.
//!
//! ```text
//! cargo bench -p kernels --bench forward -- --save-baseline disarmed
//! cargo bench -p kernels --bench forward --features capture/compile-out -- --baseline disarmed
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kernels::cpu::CpuForward;
use kernels::switches::Switches;
use kernels::{stages, Forward, Precision};
use model::ModelWeights;

/// Tokens of the prompt: the chat turn "What is the capital of France?" as
/// SmolLM2 tokenizes it, or a byte prompt for the fixture.
fn prompt(weights: &ModelWeights, tokenizer: Option<&model::tokenizer::Tokenizer>) -> Vec<u32> {
    match tokenizer {
        Some(t) if weights.config.vocab_size > 1000 => {
            t.encode_chat("What is the capital of France?").unwrap()
        }
        _ => (0..32).map(|i| (i * 7 % 250) as u32 + 3).collect(),
    }
}

const DECODE_STEPS: usize = 8;

fn bench(c: &mut Criterion) {
    let path = std::env::var("TAPTREE_BENCH_MODEL")
        .ok()
        .map(std::path::PathBuf::from)
        .or_else(fetch::cached_smollm2);
    let (weights, tokenizer, name) = match path {
        Some(p) => {
            let m = model::load::load_model(&p).unwrap();
            (
                m.weights,
                m.tokenizer,
                p.file_name().unwrap().to_string_lossy().into_owned(),
            )
        }
        None => {
            eprintln!("SmolLM2 is not cached: benchmarking the tiny-q fixture");
            (fixtures::weights("tiny-q").unwrap(), None, "tiny-q".into())
        }
    };
    let tokens = prompt(&weights, tokenizer.as_ref());
    eprintln!(
        "{name}: prompt of {} tokens, {DECODE_STEPS} decode steps",
        tokens.len()
    );
    let base = CpuForward::new(&weights, Precision::F32, &Switches::none()).unwrap();
    let dense = base.weights();
    let open = |p: Precision| {
        CpuForward::with_weights(
            weights.config.clone(),
            Arc::clone(&dense),
            p,
            &Switches::none(),
        )
        .unwrap()
    };

    let mut g = c.benchmark_group("forward");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    for p in [Precision::F32, Precision::Q8, Precision::F64] {
        let mut f = open(p);
        g.throughput(Throughput::Elements(tokens.len() as u64));
        g.bench_function(format!("prefill/{p}"), |b| {
            b.iter(|| {
                f.reset();
                f.forward(None, &tokens, 0).unwrap()
            })
        });
        g.throughput(Throughput::Elements(DECODE_STEPS as u64));
        g.bench_function(format!("decode/{p}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    f.reset();
                    f.forward(None, &tokens, 0).unwrap();
                    let t = Instant::now();
                    for s in 0..DECODE_STEPS {
                        f.forward(None, &[tokens[s % tokens.len()]], tokens.len() + s)
                            .unwrap();
                    }
                    total += t.elapsed();
                }
                total
            })
        });
    }

    // A full capture of the prefill (every tap, written, hashed, manifest).
    let dir = tempfile::tempdir().unwrap();
    let mut f = open(Precision::F32);
    g.throughput(Throughput::Elements(tokens.len() as u64));
    g.bench_function("prefill/f32/armed", |b| {
        b.iter(|| {
            let cap = capture::Capture::start(capture::CaptureOptions {
                out: dir.path().join("tree"),
                selection: capture::Selection::all(),
                force: true,
                stages: stages::llama(),
                run: capture::RunInfo::default(),
            })
            .unwrap();
            f.reset();
            f.forward(None, &tokens, 0).unwrap();
            cap.finish().unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
