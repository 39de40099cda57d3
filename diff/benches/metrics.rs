//! One-pass metric throughput of `metrics::compare` on one core, per dtype.
//! Bytes counted: both sides (what a diff reads).

use capture::DType;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

fn bytes(n: usize, dtype: DType, wobble: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let h = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let v = ((h >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0;
        let v = v * (1.0 + wobble * ((h >> 8) & 0xff) as f64 / 255.0);
        match dtype {
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
            DType::F64 => out.extend(v.to_le_bytes()),
            _ => unreachable!(),
        }
    }
    out
}

fn compare(c: &mut Criterion) {
    let n = 1 << 20;
    let mut g = c.benchmark_group("compare");
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let (a, b) = (bytes(n, dtype, 0.0), bytes(n, dtype, 1e-3));
        g.throughput(Throughput::Bytes((a.len() + b.len()) as u64));
        g.bench_function(dtype.name(), |bench| {
            bench.iter(|| diff::metrics::compare(black_box(&a), dtype, black_box(&b), dtype))
        });
    }
    g.finish();
}

criterion_group!(benches, compare);
criterion_main!(benches);
