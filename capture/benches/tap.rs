//! What a tap costs on the forward's hot path when nothing is written:
//! disarmed (one relaxed load), and armed but not selected (the selection is
//! checked, nothing copied). Build with `--features compile-out` for the
//! baseline in which taps do not exist.
//!
//! `cargo bench -p capture --bench tap`

use capture::{Capture, CaptureOptions, RunInfo, Selection};
use criterion::{black_box, criterion_group, criterion_main, Criterion};

fn taps(c: &mut Criterion) {
    let data = vec![0.5f32; 576];
    let mut group = c.benchmark_group("tap");
    group.bench_function("disarmed", |b| {
        b.iter(|| {
            capture::tap(
                black_box("ffn_down"),
                black_box(Some(3)),
                0..1,
                None,
                &[1, 576],
                black_box(&data[..]),
            )
        })
    });
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cap = Capture::start(CaptureOptions {
        out: dir.path().join("t"),
        selection: Selection::parse("stage=logits").expect("a valid selection"),
        force: false,
        stages: Vec::new(),
        run: RunInfo::default(),
    })
    .expect("arming");
    let armed = if cfg!(feature = "compile-out") {
        "armed_unselected (compiled out)"
    } else {
        "armed_unselected"
    };
    group.bench_function(armed, |b| {
        b.iter(|| {
            capture::tap(
                black_box("ffn_down"),
                black_box(Some(3)),
                0..1,
                None,
                &[1, 576],
                black_box(&data[..]),
            )
        })
    });
    group.finish();
    let summary = cap.finish().expect("finishing");
    assert_eq!(summary.taps, 0, "nothing was selected");
}

criterion_group!(benches, taps);
criterion_main!(benches);
