use super::*;
use half::f16;

fn f16b(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn deq(ty: GgmlType, data: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; data.len() / ty.type_size() * ty.block_size()];
    dequantize(ty, data, &mut out).unwrap();
    out
}

#[test]
fn q8_0_is_scale_times_signed_byte() {
    let mut b = f16b(0.5).to_vec();
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let y = deq(GgmlType::Q8_0, &b);
    assert_eq!(y[0], -8.0);
    assert_eq!(y[16], 0.0);
    assert_eq!(y[31], 7.5);
}

#[test]
fn q4_0_and_q4_1_put_low_nibbles_first() {
    let mut b = f16b(2.0).to_vec();
    b.extend([0x9Fu8; 16]); // low nibble 15, high nibble 9
    let y = deq(GgmlType::Q4_0, &b);
    assert_eq!((y[0], y[15], y[16], y[31]), (14.0, 14.0, 2.0, 2.0));

    let mut b = f16b(0.25).to_vec();
    b.extend(f16b(-1.0));
    b.extend([0x40u8; 16]);
    let y = deq(GgmlType::Q4_1, &b);
    assert_eq!((y[0], y[16]), (-1.0, 0.0));
}

#[test]
fn q5_0_takes_the_fifth_bit_from_qh() {
    let mut b = f16b(1.0).to_vec();
    // bit 0 (element 0) and bit 16 (element 16) set
    b.extend(0x0001_0001u32.to_le_bytes());
    b.extend([0x00u8; 16]);
    let y = deq(GgmlType::Q5_0, &b);
    assert_eq!((y[0], y[1], y[16], y[17]), (0.0, -16.0, 0.0, -16.0));
}

#[test]
fn q4_k_uses_six_bit_scales_and_mins() {
    let mut b = f16b(1.0).to_vec();
    b.extend(f16b(0.5));
    // sub-block 0: scale 3, min 2; sub-block 4 (upper encoding): scale
    // 0x15 | (1 << 4) from byte 0's top bits.
    let mut scales = [0u8; 12];
    scales[0] = 3 | (1 << 6);
    scales[4] = 2;
    scales[8] = 0x05;
    b.extend(scales);
    b.extend([0x21u8; 128]); // low nibble 1, high nibble 2
    let y = deq(GgmlType::Q4_K, &b);
    assert_eq!(y[0], 3.0 * 1.0 - 0.5 * 2.0);
    // sub-block 1 (high nibbles of the first 32 bytes): scale 0, min 0
    assert_eq!(y[32], 0.0);
    // sub-block 4: scale 5 | 16 = 21, min 0 | (0 << 4) = 0
    assert_eq!(y[128], 21.0);
}

#[test]
fn q6_k_centres_six_bit_values_at_32() {
    let mut b = vec![0u8; 210];
    b[192..208].fill(1); // every sub-block scale 1
    b[208..210].copy_from_slice(&f16b(0.5));
    let y = deq(GgmlType::Q6_K, &b);
    assert!(y.iter().all(|&v| v == -16.0));
    b[0] = 0x0F;
    b[128] = 0x03; // high two bits of element 0
    assert_eq!(deq(GgmlType::Q6_K, &b)[0], (63.0 - 32.0) * 0.5);
}

#[test]
fn float_types_convert_exactly() {
    assert_eq!(
        deq(GgmlType::F16, &f16b(-0.333)),
        [f16::from_f32(-0.333).to_f32()]
    );
    // smallest f16 subnormal
    assert_eq!(deq(GgmlType::F16, &[1, 0]), [2f32.powi(-24)]);
    assert_eq!(deq(GgmlType::BF16, &[0x80, 0x3F]), [1.0]);
    assert_eq!(deq(GgmlType::F32, &1.5f32.to_le_bytes()), [1.5]);
}

#[test]
fn partial_blocks_and_wrong_lengths_are_errors() {
    let mut out = vec![0f32; 31];
    let e = dequantize(GgmlType::Q8_0, &[0; 34], &mut out).unwrap_err();
    assert!(e.to_string().contains("31 elements"), "{e}");
    let mut out = vec![0f32; 32];
    let e = dequantize(GgmlType::Q8_0, &[0; 33], &mut out).unwrap_err();
    assert!(e.to_string().contains("need 34 bytes, got 33"), "{e}");
}

#[test]
fn parallel_rows_equal_serial() {
    let cols = 64;
    let rows = 300;
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 37) % 101) as f32 - 50.0)
        .collect();
    let q = quantize_q4_1(&x).unwrap();
    let mut serial = vec![0f32; rows * cols];
    dequantize(GgmlType::Q4_1, &q, &mut serial).unwrap();
    let mut par = vec![0f32; rows * cols];
    dequantize_rows(GgmlType::Q4_1, &q, cols, &mut par).unwrap();
    assert_eq!(serial, par);
}

#[test]
fn quantizers_round_trip_within_half_a_step() {
    let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
    for (ty, q) in [
        (GgmlType::Q8_0, quantize_q8_0(&x).unwrap()),
        (GgmlType::Q4_1, quantize_q4_1(&x).unwrap()),
    ] {
        let y = deq(ty, &q);
        let step = if ty == GgmlType::Q8_0 {
            3.0 / 127.0
        } else {
            6.0 / 15.0
        };
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= step * 0.5 + 1e-2, "{ty}: {a} vs {b}");
        }
    }
    // an all-equal block has a zero scale and still decodes
    let y = deq(GgmlType::Q4_1, &quantize_q4_1(&[2.0; 32]).unwrap());
    assert!(y.iter().all(|&v| v == 2.0));
}
