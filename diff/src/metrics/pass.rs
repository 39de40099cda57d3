//! The one pass over two tensors' elements that fills an [`Acc`]: blocks of
//! lanes, a vectorised path where the CPU has one, the portable reference
//! beside it.

use super::*;

/// Elements per block of the fast path.
const BLOCK: usize = 64;
/// Independent accumulator lanes: sums in lanes vectorize (f64 addition is
/// not associative, so one running sum cannot).
const LANES: usize = 8;

/// Running state of one pass.
struct Pass {
    sab: [f64; LANES],
    saa: [f64; LANES],
    sbb: [f64; LANES],
    sdd: [f64; LANES],
    max_abs: [f64; LANES],
    max_ulp: [u64; LANES],
    eq: [u64; LANES],
    za: [u64; LANES],
    zb: [u64; LANES],
    sa: [u64; LANES],
    sb: [u64; LANES],
    max_rel: f64,
    best_a: f64,
    best_b: f64,
    arg_a: Option<u64>,
    arg_b: Option<u64>,
    nfa: u64,
    nfb: u64,
    nfm: u64,
    finite: u64,
    first_a: f64,
    first_b: f64,
}

#[inline(always)]
fn fmax(x: f64, y: f64) -> f64 {
    // Both finite here: a plain compare vectorizes, f64::max's NaN care does not.
    if x > y {
        x
    } else {
        y
    }
}

impl Pass {
    fn new(first_a: f64, first_b: f64) -> Pass {
        Pass {
            sab: [0.0; LANES],
            saa: [0.0; LANES],
            sbb: [0.0; LANES],
            sdd: [0.0; LANES],
            max_abs: [0.0; LANES],
            max_ulp: [0; LANES],
            eq: [0; LANES],
            za: [0; LANES],
            zb: [0; LANES],
            sa: [0; LANES],
            sb: [0; LANES],
            max_rel: 0.0,
            best_a: f64::NEG_INFINITY,
            best_b: f64::NEG_INFINITY,
            arg_a: None,
            arg_b: None,
            nfa: 0,
            nfb: 0,
            nfm: 0,
            finite: 0,
            first_a,
            first_b,
        }
    }

    /// One element pair, any values. Branches that are almost never taken
    /// (nonfinite values, a new maximum) keep it short; `max_rel` divides only
    /// when the running maximum is beaten.
    #[inline(always)]
    fn scalar<A: Elem, B: Elem, const SAME: bool>(&mut self, i: usize, ea: A, eb: B) {
        let (x, y) = (ea.to_f64(), eb.to_f64());
        self.eq[0] += (SAME && ea.bits() == eb.bits()) as u64;
        self.za[0] += (x == 0.0) as u64;
        self.zb[0] += (y == 0.0) as u64;
        self.sa[0] += (x == self.first_a) as u64;
        self.sb[0] += (y == self.first_b) as u64;
        if x.is_finite() && y.is_finite() {
            self.finite += 1;
            let d = x - y;
            self.sab[0] += x * y;
            self.saa[0] += x * x;
            self.sbb[0] += y * y;
            self.sdd[0] += d * d;
            let ad = d.abs();
            self.max_abs[0] = fmax(self.max_abs[0], ad);
            let m = fmax(x.abs(), y.abs());
            if ad > self.max_rel * m {
                self.max_rel = ad / m;
            }
            if SAME {
                self.max_ulp[0] = self.max_ulp[0].max(A::ulp(ea.bits(), eb.bits()));
            }
            if x > self.best_a {
                self.best_a = x;
                self.arg_a = Some(i as u64);
            }
            if y > self.best_b {
                self.best_b = y;
                self.arg_b = Some(i as u64);
            }
        } else {
            self.nfa += (!x.is_finite()) as u64;
            self.nfb += (!y.is_finite()) as u64;
            // Same kind of nonfinite on both sides (NaN/NaN, +Inf/+Inf) agrees.
            let same_kind = (x.is_nan() && y.is_nan()) || (x.is_infinite() && x == y);
            self.nfm += (!same_kind) as u64;
        }
    }

    /// A block of `BLOCK` pairs starting at element `base`, all finite, as
    /// f64 (`x`, `y`) and raw bits (`ba`, `bb`). Three short loops (sums,
    /// maxima, integer counts) each keep their accumulators in registers.
    #[inline(always)]
    fn block<A: Elem, const SAME: bool>(
        &mut self,
        base: usize,
        x: &[f64; BLOCK],
        y: &[f64; BLOCK],
        ba: &[u64; BLOCK],
        bb: &[u64; BLOCK],
    ) {
        let (mut sab, mut saa, mut sbb, mut sdd) = (self.sab, self.saa, self.sbb, self.sdd);
        for c in 0..BLOCK / LANES {
            for l in 0..LANES {
                let (xi, yi) = (x[c * LANES + l], y[c * LANES + l]);
                let d = xi - yi;
                sab[l] += xi * yi;
                saa[l] += xi * xi;
                sbb[l] += yi * yi;
                sdd[l] += d * d;
            }
        }
        (self.sab, self.saa, self.sbb, self.sdd) = (sab, saa, sbb, sdd);

        let rel = self.max_rel;
        let mut max_abs = self.max_abs;
        let mut cand = [f64::NEG_INFINITY; LANES];
        let (mut hi_a, mut hi_b) = ([f64::NEG_INFINITY; LANES], [f64::NEG_INFINITY; LANES]);
        let (mut lo_a, mut lo_b) = ([f64::INFINITY; LANES], [f64::INFINITY; LANES]);
        for c in 0..BLOCK / LANES {
            for l in 0..LANES {
                let (xi, yi) = (x[c * LANES + l], y[c * LANES + l]);
                let ad = (xi - yi).abs();
                max_abs[l] = fmax(max_abs[l], ad);
                cand[l] = fmax(cand[l], ad - rel * fmax(xi.abs(), yi.abs()));
                hi_a[l] = fmax(hi_a[l], xi);
                hi_b[l] = fmax(hi_b[l], yi);
                lo_a[l] = fmin(lo_a[l], xi);
                lo_b[l] = fmin(lo_b[l], yi);
            }
        }
        self.max_abs = max_abs;

        let (mut za, mut zb) = (0u32, 0u32);
        for i in 0..BLOCK {
            za += (x[i] == 0.0) as u32;
            zb += (y[i] == 0.0) as u32;
        }
        self.za[0] += za as u64;
        self.zb[0] += zb as u64;
        if SAME {
            let mut eq = 0u32;
            let mut ulp = 0u64;
            for i in 0..BLOCK {
                eq += (ba[i] == bb[i]) as u32;
                ulp = ulp.max(A::ulp(ba[i], bb[i]));
            }
            self.eq[0] += eq as u64;
            self.max_ulp[0] = self.max_ulp[0].max(ulp);
        }
        self.finite += BLOCK as u64;

        // Rare events, settled exactly outside the loops.
        if cand.iter().any(|&c| c > 0.0) {
            for i in 0..BLOCK {
                let ad = (x[i] - y[i]).abs();
                let m = fmax(x[i].abs(), y[i].abs());
                if ad > self.max_rel * m {
                    self.max_rel = ad / m;
                }
            }
        }
        let fold_hi = |v: [f64; LANES]| v.iter().copied().fold(f64::NEG_INFINITY, fmax);
        let fold_lo = |v: [f64; LANES]| v.iter().copied().fold(f64::INFINITY, fmin);
        let (top_a, top_b) = (fold_hi(hi_a), fold_hi(hi_b));
        if top_a > self.best_a {
            self.best_a = top_a;
            self.arg_a = x
                .iter()
                .position(|&v| v == top_a)
                .map(|i| (base + i) as u64);
        }
        if top_b > self.best_b {
            self.best_b = top_b;
            self.arg_b = y
                .iter()
                .position(|&v| v == top_b)
                .map(|i| (base + i) as u64);
        }
        // `same` counts only while every element equals the first one.
        if top_a == self.first_a && fold_lo(lo_a) == self.first_a {
            self.sa[0] += BLOCK as u64;
        }
        if top_b == self.first_b && fold_lo(lo_b) == self.first_b {
            self.sb[0] += BLOCK as u64;
        }
    }
}

#[inline(always)]
fn fmin(x: f64, y: f64) -> f64 {
    if x < y {
        x
    } else {
        y
    }
}

/// The one pass, compiled twice: for AVX2 where the CPU has it (chosen at
/// run time; the lanes above then use 256-bit registers) and for the
/// baseline.
pub(super) fn run<A: Elem, B: Elem, const SAME: bool>(a: &[u8], b: &[u8]) -> Acc {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { run_avx2::<A, B, SAME>(a, b) };
    }
    run_portable::<A, B, SAME>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_avx2<A: Elem, B: Elem, const SAME: bool>(a: &[u8], b: &[u8]) -> Acc {
    run_portable::<A, B, SAME>(a, b)
}

/// Blocks of finite pairs take the vectorized path; a block holding a NaN or
/// Inf, and the tail, go element by element.
#[inline(always)]
fn run_portable<A: Elem, B: Elem, const SAME: bool>(a: &[u8], b: &[u8]) -> Acc {
    let n = (a.len() / A::SIZE).min(b.len() / B::SIZE);
    let mut acc = Acc {
        n: n as u64,
        rows: 1,
        min_width: n as u64,
        max_ulp: if SAME { Some(0) } else { None },
        ..Acc::default()
    };
    if n == 0 {
        acc.argmax_agree = 1;
        return acc;
    }
    let mut p = Pass::new(A::read(a).to_f64(), B::read(b).to_f64());
    let blocks = n / BLOCK;
    let mut x = [0.0f64; BLOCK];
    let mut y = [0.0f64; BLOCK];
    let mut ba = [0u64; BLOCK];
    let mut bb = [0u64; BLOCK];
    for (k, (ca, cb)) in a
        .chunks_exact(BLOCK * A::SIZE)
        .zip(b.chunks_exact(BLOCK * B::SIZE))
        .take(blocks)
        .enumerate()
    {
        let mut finite = true;
        for (i, (ea, eb)) in ca
            .chunks_exact(A::SIZE)
            .zip(cb.chunks_exact(B::SIZE))
            .enumerate()
        {
            let (ea, eb) = (A::read(ea), B::read(eb));
            x[i] = ea.to_f64();
            y[i] = eb.to_f64();
            ba[i] = ea.bits();
            bb[i] = eb.bits();
            finite &= x[i].is_finite() & y[i].is_finite();
        }
        if finite {
            p.block::<A, SAME>(k * BLOCK, &x, &y, &ba, &bb);
        } else {
            for (i, (ea, eb)) in ca
                .chunks_exact(A::SIZE)
                .zip(cb.chunks_exact(B::SIZE))
                .enumerate()
            {
                p.scalar::<A, B, SAME>(k * BLOCK + i, A::read(ea), B::read(eb));
            }
        }
    }
    for i in blocks * BLOCK..n {
        p.scalar::<A, B, SAME>(i, A::read(&a[i * A::SIZE..]), B::read(&b[i * B::SIZE..]));
    }
    let sum = |v: &[f64; LANES]| v.iter().sum::<f64>();
    let total = |v: &[u64; LANES]| v.iter().sum::<u64>();
    acc.finite = p.finite;
    acc.sum_ab = sum(&p.sab);
    acc.sum_aa = sum(&p.saa);
    acc.sum_bb = sum(&p.sbb);
    acc.sum_dd = sum(&p.sdd);
    acc.max_abs = p.max_abs.iter().copied().fold(0.0, fmax);
    acc.max_rel = p.max_rel;
    if SAME {
        acc.max_ulp = p.max_ulp.iter().copied().max();
    }
    acc.bitwise_equal = total(&p.eq);
    acc.nonfinite_a = p.nfa;
    acc.nonfinite_b = p.nfb;
    acc.nonfinite_mismatch = p.nfm;
    acc.zero_a = total(&p.za);
    acc.zero_b = total(&p.zb);
    acc.same_a = total(&p.sa);
    acc.same_b = total(&p.sb);
    acc.argmax_a = p.arg_a;
    acc.argmax_b = p.arg_b;
    acc.argmax_agree = (p.arg_a == p.arg_b) as u64;
    acc
}
