//! What the CUDA kernel tests share (`cuda_kernels.rs`, `cuda_kernels_q8.rs`,
//! `cuda_kernels_gemma.rs`): the GPU or a reason to skip, seeded inputs,
//! ulp and relative comparators, weights in every format.
#![allow(dead_code)]

use std::sync::Arc;

use kernels::cpu::matmul::{matmul as cpu_matmul, Act};
use kernels::cpu::qmatrix::Matrix;
use kernels::cuda::device::{driver_present, Device};
use kernels::cuda::ops::{self, DeviceMatrix};
use model::{GgmlType, QTensor};

/// The GPU, or `None` (with the reason printed) where there is none.
pub fn gpu() -> Option<Arc<Device>> {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this host");
        return None;
    }
    Some(Device::open(0).expect("a driver is present but GPU 0 would not open"))
}

/// splitmix64: deterministic inputs without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

/// Distance in units in the last place between two finite floats.
pub fn ulps(a: f32, b: f32) -> u64 {
    let key = |v: f32| {
        let i = v.to_bits() as i32;
        (if i < 0 { i32::MIN - i } else { i }) as i64
    };
    (key(a) - key(b)).unsigned_abs()
}

/// Worst ulp distance of `gpu` from `cpu`, panicking on a length mismatch or
/// a nonfinite value on either side.
pub fn worst_ulps(what: &str, gpu: &[f32], cpu: &[f32]) -> u64 {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths differ");
    let mut worst = 0;
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        assert!(
            g.is_finite() && c.is_finite(),
            "{what}[{i}]: gpu {g}, cpu {c}"
        );
        worst = worst.max(ulps(*g, *c));
    }
    worst
}

pub fn assert_bitwise(what: &str, gpu: &[f32], cpu: &[f32]) {
    let worst = worst_ulps(what, gpu, cpu);
    assert_eq!(worst, 0, "{what}: the GPU is {worst} ulp from the CPU op");
}

/// Largest |gpu - cpu| relative to the largest |cpu|.
pub fn rel_err(gpu: &[f32], cpu: &[f32]) -> f64 {
    assert_eq!(gpu.len(), cpu.len());
    let scale = cpu
        .iter()
        .fold(0f64, |m, v| m.max(v.abs() as f64))
        .max(1e-30);
    gpu.iter()
        .zip(cpu)
        .map(|(g, c)| (*g as f64 - *c as f64).abs())
        .fold(0f64, f64::max)
        / scale
}

/// A `[rows, cols]` weight in `ty`, with values in [-scale, scale).
pub fn weight(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize, scale: f32) -> QTensor {
    let x = rng.vec(rows * cols, scale);
    let data = match ty {
        GgmlType::Q8_0 => model::quant::quantize_q8_0(&x).unwrap(),
        GgmlType::Q4_1 => model::quant::quantize_q4_1(&x).unwrap(),
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            // No quantizer on the CPU side: random quants under a valid
            // f16 scale exercise every nibble and high bit.
            let mut out = Vec::new();
            for _ in 0..rows * cols / 32 {
                let d = half::f16::from_f32(scale / 8.0 * (0.5 + rng.f32().abs()));
                out.extend_from_slice(&d.to_le_bytes());
                let rest = ty.type_size() - 2;
                out.extend((0..rest).map(|_| rng.next() as u8));
            }
            out
        }
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            // Random quants, scales and mins under valid f16 super-block
            // scales (Q4_K/Q5_K: d and dmin first; Q6_K and Q3_K: d last;
            // Q2_K: d and dmin last).
            let mut out = Vec::new();
            let f16 = |r: &mut Rng| {
                half::f16::from_f32(scale / 64.0 * (0.5 + r.f32().abs())).to_le_bytes()
            };
            for _ in 0..rows * cols / 256 {
                if matches!(ty, GgmlType::Q6_K | GgmlType::Q3_K) {
                    out.extend((0..ty.type_size() - 2).map(|_| rng.next() as u8));
                    out.extend_from_slice(&f16(rng));
                } else if ty == GgmlType::Q2_K {
                    out.extend((0..80).map(|_| rng.next() as u8));
                    out.extend_from_slice(&f16(rng));
                    out.extend_from_slice(&f16(rng));
                } else {
                    out.extend_from_slice(&f16(rng));
                    out.extend_from_slice(&f16(rng));
                    out.extend((4..ty.type_size()).map(|_| rng.next() as u8));
                }
            }
            out
        }
        _ => model::quant::encode_float(ty, &x).unwrap(),
    };
    QTensor {
        name: format!("w_{ty}_{rows}x{cols}"),
        ggml_type: ty,
        shape: vec![rows, cols],
        data: data.into(),
    }
}

pub fn dense(t: &QTensor) -> Matrix {
    Matrix {
        rows: t.rows(),
        cols: t.cols(),
        data: t.to_f32().unwrap(),
        block: t.ggml_type.block_size(),
    }
}

/// A Q4_1 weight's block minimums, `[rows, cols / 32]`: what the CPU's q8
/// dot adds llama.cpp's f16 min term with.
pub fn q4_1_mins(t: &QTensor) -> Vec<f32> {
    t.data
        .chunks_exact(20)
        .map(|b| half::f16::from_le_bytes([b[2], b[3]]).to_f32())
        .collect()
}

pub const K_QUANTS: [GgmlType; 5] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

pub const ALL_TYPES: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
];

pub fn check_matmul_f32(
    dev: &Device,
    rng: &mut Rng,
    ty: GgmlType,
    out: usize,
    cols: usize,
    rows: usize,
) {
    let t = weight(rng, ty, out, cols, 0.5);
    let x = rng.vec(rows * cols, 3.0);
    let cpu: Vec<f32> = cpu_matmul(&x, rows, &dense(&t), Act::Float);
    let w = DeviceMatrix::upload(dev, &t).unwrap();
    let xd = ops::upload(dev, &x).unwrap();
    let mut y = dev.stream().alloc_zeros::<f32>(rows * out).unwrap();
    ops::matmul_f32(dev, &w, &xd.as_view(), &mut y.as_view_mut(), rows).unwrap();
    let gpu = ops::download(dev, &y.as_view()).unwrap();
    assert_bitwise(
        &format!("matmul_f32 {ty} [{out}, {cols}] x {rows} rows"),
        &gpu,
        &cpu,
    );
}
