//! How fast one core computes while T cores compute at once: each of T
//! threads runs the same fixed loop (no memory traffic: registers only),
//! all started together, and the per-thread rate is printed. A lower rate
//! at 16 threads than at 2 is the clock falling as more cores are busy
//! (the all-core turbo, a wider vector unit's lower clock), which no change
//! to the forward's parallel structure can win back: its tasks run that
//! much longer on 16 threads than on 2 for the same work.
//!
//! `taskset -c 0-$((T-1)) cargo run --release -p kernels --example cpu_clock -- T [SECONDS]`
//!
//! Two loops, each a fixed number of cycles an iteration on a given core
//! (so that rates compare clocks; they are not converted to GHz): a
//! dependent chain of f64 multiplies and adds (not reassociated: float),
//! and, where the CPU has AVX-512 (else AVX2), eight independent chains of
//! vector FMAs (the dot loops' instructions).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Iterations between looks at the clock.
const BATCH: u64 = 1 << 20;

/// The multiply-add chain until `secs` have passed; iterations per second.
fn scalar(secs: f64) -> f64 {
    let (a, b) = std::hint::black_box((0.999_999_9f64, 1e-9f64));
    let (mut x, mut n, t) = (std::hint::black_box(1f64), 0u64, Instant::now());
    while t.elapsed().as_secs_f64() < secs {
        for _ in 0..BATCH {
            x = x * a + b;
        }
        n += BATCH;
    }
    std::hint::black_box(x);
    n as f64 / t.elapsed().as_secs_f64()
}

/// Eight chains of vector FMAs until `secs` have passed; iterations (eight
/// FMAs each) per second, or `None` without AVX2 and FMA.
fn vector(secs: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, checked just above.
            return Some(unsafe { fma512(secs) });
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA, checked just above.
            return Some(unsafe { fma256(secs) });
        }
    }
    let _ = secs;
    None
}

macro_rules! fma_loop {
    ($name:ident, $feature:literal, $ty:ty, $set1:ident, $fma:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(secs: f64) -> f64 {
            use std::arch::x86_64::*;
            let (a, b) = ($set1(0.999_9), $set1(1e-7));
            let mut acc: [$ty; 8] = [$set1(1.0); 8];
            let (mut n, t) = (0u64, Instant::now());
            while t.elapsed().as_secs_f64() < secs {
                for _ in 0..BATCH / 8 {
                    for v in acc.iter_mut() {
                        *v = $fma(*v, a, b);
                    }
                }
                n += BATCH / 8;
            }
            std::hint::black_box(acc);
            n as f64 / t.elapsed().as_secs_f64()
        }
    };
}
fma_loop!(fma512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps);
fma_loop!(fma256, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps);

/// Runs `f` on `threads` threads started together; their rates, sorted.
fn on_threads(threads: usize, f: impl Fn() -> f64 + Send + Sync + 'static) -> Vec<f64> {
    let (f, go) = (Arc::new(f), Arc::new(Barrier::new(threads)));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (f, go) = (Arc::clone(&f), Arc::clone(&go));
            std::thread::spawn(move || {
                go.wait();
                f()
            })
        })
        .collect();
    let mut rates: Vec<f64> = handles
        .into_iter()
        .map(|h| h.join().expect("a probe thread"))
        .collect();
    rates.sort_by(f64::total_cmp);
    rates
}

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or_else(|| {
            eprintln!("usage: cpu_clock THREADS [SECONDS]");
            std::process::exit(2)
        });
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.0);
    // A short warm-up on every thread, so the first figure is not a cold core's.
    on_threads(threads, || scalar(0.1));
    std::thread::sleep(Duration::from_millis(10));
    let s = on_threads(threads, move || scalar(secs));
    let median = |v: &[f64]| v[v.len() / 2];
    println!(
        "{threads} threads: multiply-add chain {:.4} G iterations/s per thread (median; \
         min {:.4}, max {:.4})",
        median(&s) / 1e9,
        s[0] / 1e9,
        s[s.len() - 1] / 1e9
    );
    if vector(0.01).is_some() {
        let v = on_threads(threads, move || vector(secs).unwrap_or(0.0));
        println!(
            "{threads} threads: vector FMAs {:.4} G iterations/s per thread (median; min {:.4}, max {:.4})",
            median(&v) / 1e9,
            v[0] / 1e9,
            v[v.len() - 1] / 1e9
        );
    }
}
