//! The tensor API on the CPU backend: hand-checked values for every
//! operation, property checks against naive reference code, and the error
//! for every kind of mismatch. Tests named `t1_..` to `t8_..` check the crate's
//! invariants T-1 .. T-8.

use monarch_tensor::{DType, Device, Error, Shape, Tensor};

const CPU: Device = Device::Cpu;

fn f32s(values: &[f32], dims: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), dims).unwrap()
}

fn f64s(values: &[f64], dims: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), dims).unwrap()
}

fn i64s(values: &[i64], dims: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), dims).unwrap()
}

fn v32(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn v64(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn vi(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

/// [2, 3, 4] holding 0..24 as f64.
fn cube() -> Tensor {
    Tensor::arange(24, DType::F64, CPU)
        .unwrap()
        .into_reshape(&[2, 3, 4])
        .unwrap()
}

// Construction.

#[test]
fn zeros_ones_full_arange() {
    let z = Tensor::zeros(&[2, 3], DType::F32, CPU).unwrap();
    assert_eq!(z.dims(), &[2, 3]);
    assert_eq!(z.numel(), 6);
    assert_eq!(z.rank(), 2);
    assert_eq!(z.dtype(), DType::F32);
    assert_eq!(z.device(), CPU);
    assert_eq!(z.byte_len(), 24);
    assert_eq!(v32(&z), vec![0.0; 6]);
    assert_eq!(
        vi(&Tensor::ones(&[3], DType::I64, CPU).unwrap()),
        vec![1, 1, 1]
    );
    assert_eq!(
        v64(&Tensor::full(&[2], -2.5, DType::F64, CPU).unwrap()),
        vec![-2.5, -2.5]
    );
    assert_eq!(
        v32(&Tensor::arange(4, DType::F32, CPU).unwrap()),
        vec![0.0, 1.0, 2.0, 3.0]
    );
    let s = Tensor::full(&[], 7.0, DType::I64, CPU).unwrap();
    assert_eq!(s.rank(), 0);
    assert_eq!(s.to_scalar().unwrap(), 7.0);
}

#[test]
fn full_i64_needs_a_whole_number() {
    let err = Tensor::full(&[2], 1.5, DType::I64, CPU).unwrap_err();
    assert!(
        matches!(err, Error::InvalidScalar { op: "full", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("whole number"));
    assert!(Tensor::full(&[2], 1e19, DType::I64, CPU).is_err());
}

#[test]
fn t6_huge_shapes_are_errors_not_aborts() {
    let err = Tensor::zeros(&[usize::MAX, 2], DType::F32, CPU).unwrap_err();
    assert!(matches!(err, Error::ShapeOverflow { .. }));
    let err = Tensor::zeros(&[usize::MAX / 2], DType::F64, CPU).unwrap_err();
    assert!(matches!(err, Error::ShapeOverflow { .. }));
    // Fits in the address space but not in memory: an error, not an abort.
    let err = Tensor::zeros(&[1 << 60], DType::F32, CPU).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_device_without_the_feature_is_an_error() {
    let err = Tensor::zeros(&[2], DType::F32, Device::Cuda(0)).unwrap_err();
    assert_eq!(err, Error::CudaNotCompiled);
    assert!(err.to_string().contains("`cuda` feature"));
    assert_eq!(
        monarch_tensor::cuda_device_count(),
        Err(Error::CudaNotCompiled)
    );
    let t = Tensor::ones(&[2], DType::F32, CPU).unwrap();
    assert_eq!(
        t.to_device(Device::Cuda(0)).unwrap_err(),
        Error::CudaNotCompiled
    );
}

// Randomness.

#[test]
fn t7_random_is_reproducible_from_the_seed() {
    for dtype in [DType::F32, DType::F64] {
        let a = Tensor::rand_uniform(&[5, 7], -1.0, 1.0, 42, dtype, CPU).unwrap();
        let b = Tensor::rand_uniform(&[5, 7], -1.0, 1.0, 42, dtype, CPU).unwrap();
        let c = Tensor::rand_uniform(&[5, 7], -1.0, 1.0, 43, dtype, CPU).unwrap();
        assert_eq!(a.to_le_bytes().unwrap(), b.to_le_bytes().unwrap());
        assert_ne!(a.to_le_bytes().unwrap(), c.to_le_bytes().unwrap());
        let n1 = Tensor::rand_normal(&[9], 0.0, 1.0, 5, dtype, CPU).unwrap();
        let n2 = Tensor::rand_normal(&[9], 0.0, 1.0, 5, dtype, CPU).unwrap();
        assert_eq!(n1.to_le_bytes().unwrap(), n2.to_le_bytes().unwrap());
    }
    let a = Tensor::rand_uniform(&[100], 0.0, 10.0, 1, DType::I64, CPU).unwrap();
    let b = Tensor::rand_uniform(&[100], 0.0, 10.0, 1, DType::I64, CPU).unwrap();
    assert_eq!(vi(&a), vi(&b));
    // A prefix of a longer draw is the shorter draw: element i is draw i.
    let long = Tensor::rand_uniform(&[10], 0.0, 1.0, 9, DType::F64, CPU).unwrap();
    let short = Tensor::rand_uniform(&[4], 0.0, 1.0, 9, DType::F64, CPU).unwrap();
    assert_eq!(v64(&long)[..4], v64(&short)[..]);
}

#[test]
fn uniform_values_are_in_range_and_spread() {
    let t = Tensor::rand_uniform(&[10_000], 2.0, 3.0, 7, DType::F32, CPU).unwrap();
    let v = v32(&t);
    assert!(v.iter().all(|&x| (2.0..3.0).contains(&x)));
    let mean = t.mean().unwrap().to_scalar().unwrap();
    assert!((mean - 2.5).abs() < 0.02, "mean {mean}");

    let t = Tensor::rand_uniform(&[10_000], -5.0, 5.0, 7, DType::F64, CPU).unwrap();
    assert!(v64(&t).iter().all(|&x| (-5.0..5.0).contains(&x)));

    let t = Tensor::rand_uniform(&[2_000], -3.0, 4.0, 8, DType::I64, CPU).unwrap();
    let v = vi(&t);
    assert!(v.iter().all(|&x| (-3..4).contains(&x)));
    for want in -3..4 {
        assert!(v.contains(&want), "value {want} never drawn");
    }
    // The full i64 range works too (range 2^64 - 1).
    let wide = Tensor::rand_uniform(&[4], -9.2e18, 9.2e18, 1, DType::I64, CPU).unwrap();
    assert_eq!(wide.numel(), 4);
}

#[test]
fn normal_has_the_asked_mean_and_std() {
    let t = Tensor::rand_normal(&[20_000], 3.0, 2.0, 99, DType::F64, CPU).unwrap();
    let mean = t.mean().unwrap().to_scalar().unwrap();
    let centered = t.sub_scalar(mean).unwrap();
    let var = centered
        .mul(&centered)
        .unwrap()
        .mean()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert!((mean - 3.0).abs() < 0.05, "mean {mean}");
    assert!((var.sqrt() - 2.0).abs() < 0.05, "std {}", var.sqrt());
    let odd = Tensor::rand_normal(&[3], 0.0, 1.0, 1, DType::F32, CPU).unwrap();
    assert_eq!(odd.numel(), 3);
    let flat = Tensor::rand_normal(&[4], 1.5, 0.0, 1, DType::F32, CPU).unwrap();
    assert_eq!(v32(&flat), vec![1.5; 4]);
}

#[test]
fn bad_random_parameters_are_errors() {
    let cases = [
        Tensor::rand_uniform(&[2], 1.0, 1.0, 0, DType::F32, CPU),
        Tensor::rand_uniform(&[2], 2.0, 1.0, 0, DType::F64, CPU),
        Tensor::rand_uniform(&[2], f64::NAN, 1.0, 0, DType::F64, CPU),
        Tensor::rand_uniform(&[2], -3e38, 3e38, 0, DType::F32, CPU),
        Tensor::rand_uniform(&[2], 3.0, 3.0, 0, DType::I64, CPU),
        Tensor::rand_normal(&[2], 0.0, -1.0, 0, DType::F32, CPU),
        Tensor::rand_normal(&[2], f64::INFINITY, 1.0, 0, DType::F32, CPU),
    ];
    for (i, r) in cases.into_iter().enumerate() {
        assert!(
            matches!(r, Err(Error::InvalidRandom { .. })),
            "case {i}: {r:?}"
        );
    }
    assert!(matches!(
        Tensor::rand_uniform(&[2], 0.5, 3.0, 0, DType::I64, CPU),
        Err(Error::InvalidScalar { .. })
    ));
    assert!(matches!(
        Tensor::rand_normal(&[2], 0.0, 1.0, 0, DType::I64, CPU),
        Err(Error::UnsupportedDType { .. })
    ));
}

// Bytes and raw storage.

#[test]
fn from_le_bytes_hand_checked() {
    let bytes = [0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0]; // 1.0f32, -2.0f32
    let t = Tensor::from_le_bytes(&bytes, &[2], DType::F32, CPU).unwrap();
    assert_eq!(v32(&t), vec![1.0, -2.0]);
    let t = Tensor::from_le_bytes(&[0xff; 8], &[1], DType::I64, CPU).unwrap();
    assert_eq!(vi(&t), vec![-1]);
    let t = Tensor::from_le_bytes(&1.0f64.to_le_bytes(), &[], DType::F64, CPU).unwrap();
    assert_eq!(t.to_scalar().unwrap(), 1.0);
}

#[test]
fn bytes_round_trip_every_dtype() {
    for dtype in DType::ALL {
        let t = Tensor::rand_uniform(&[3, 5], -100.0, 100.0, 3, dtype, CPU).unwrap();
        let bytes = t.to_le_bytes().unwrap();
        assert_eq!(bytes.len(), 15 * dtype.size_of());
        let back = Tensor::from_le_bytes(&bytes, &[3, 5], dtype, CPU).unwrap();
        assert_eq!(back.to_le_bytes().unwrap(), bytes);
        assert_eq!(back.max_abs_diff(&t).unwrap(), 0.0);
    }
}

#[test]
fn wrong_byte_length_is_an_error() {
    let err = Tensor::from_le_bytes(&[0u8; 7], &[2], DType::F32, CPU).unwrap_err();
    assert_eq!(
        err,
        Error::ByteLength {
            len: 7,
            expected: 8,
            shape: Shape::new(&[2]).unwrap(),
            dtype: DType::F32,
        }
    );
    assert_eq!(
        err.to_string(),
        "7 bytes do not hold a f32 tensor of shape [2]: expected 8 bytes"
    );
    assert!(Tensor::from_le_bytes(&[0u8; 16], &[3], DType::I64, CPU).is_err());
    let err = Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).unwrap_err();
    assert!(matches!(err, Error::ByteLength { .. }));
}

#[test]
fn t1_t2_storage_is_contiguous_little_endian() {
    let t = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    assert_eq!(t.shape().strides(), vec![3, 1]);
    let raw = t.as_bytes().unwrap();
    assert_eq!(raw.len(), t.byte_len());
    assert_eq!(raw, &t.to_le_bytes().unwrap()[..]);
    assert_eq!(&raw[4..8], &2.0f32.to_le_bytes());
}

#[test]
fn t3_storage_address_is_stable_across_in_place_ops() {
    let mut t = Tensor::zeros(&[4, 4], DType::F64, CPU).unwrap();
    let (ptr, len) = {
        let b = t.as_bytes_mut().unwrap();
        (b.as_ptr(), b.len())
    };
    let ones = Tensor::ones(&[4, 4], DType::F64, CPU).unwrap();
    t.add_assign(&ones).unwrap();
    t.axpy(2.0, &ones).unwrap();
    t.scale_assign(0.5).unwrap();
    t.as_mut_slice::<f64>().unwrap()[0] = 9.0;
    let t = t.into_reshape(&[16]).unwrap();
    let b = t.as_bytes().unwrap();
    assert_eq!((b.as_ptr(), b.len()), (ptr, len));
    assert_eq!(v64(&t)[..2], [9.0, 1.5]);
}

#[test]
fn t4_storage_is_aligned_to_the_dtype() {
    for dtype in DType::ALL {
        let t = Tensor::zeros(&[3], dtype, CPU).unwrap();
        assert_eq!(t.as_bytes().unwrap().as_ptr() as usize % dtype.size_of(), 0);
    }
}

#[test]
fn writes_through_raw_bytes_are_seen() {
    let mut t = Tensor::zeros(&[2], DType::I64, CPU).unwrap();
    t.as_bytes_mut().unwrap()[8..].copy_from_slice(&(-5i64).to_le_bytes());
    assert_eq!(vi(&t), vec![0, -5]);
}

#[test]
fn typed_access_checks_the_element_type() {
    let mut t = f32s(&[1.0, 2.0], &[2]);
    assert_eq!(t.as_slice::<f32>().unwrap(), &[1.0, 2.0]);
    let err = t.to_vec::<f64>().unwrap_err();
    assert_eq!(
        err,
        Error::WrongElementType {
            op: "to_vec",
            requested: DType::F64,
            actual: DType::F32
        }
    );
    assert!(t.as_slice::<i64>().is_err());
    assert!(t.as_mut_slice::<f64>().is_err());
    assert_eq!(t.into_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

// Elementwise operations.

#[test]
fn elementwise_f32_hand_checked() {
    let a = f32s(&[1.0, -2.0, 3.0, 4.0], &[2, 2]);
    let b = f32s(&[2.0, 4.0, -1.0, 0.5], &[2, 2]);
    assert_eq!(v32(&a.add(&b).unwrap()), vec![3.0, 2.0, 2.0, 4.5]);
    assert_eq!(v32(&a.sub(&b).unwrap()), vec![-1.0, -6.0, 4.0, 3.5]);
    assert_eq!(v32(&a.mul(&b).unwrap()), vec![2.0, -8.0, -3.0, 2.0]);
    assert_eq!(v32(&a.div(&b).unwrap()), vec![0.5, -0.5, -3.0, 8.0]);
    assert_eq!(v32(&a.add_scalar(1.0).unwrap()), vec![2.0, -1.0, 4.0, 5.0]);
    assert_eq!(v32(&a.sub_scalar(1.0).unwrap()), vec![0.0, -3.0, 2.0, 3.0]);
    assert_eq!(
        v32(&a.mul_scalar(-2.0).unwrap()),
        vec![-2.0, 4.0, -6.0, -8.0]
    );
    assert_eq!(v32(&a.div_scalar(2.0).unwrap()), vec![0.5, -1.0, 1.5, 2.0]);
    assert_eq!(v32(&a.neg().unwrap()), vec![-1.0, 2.0, -3.0, -4.0]);
    assert_eq!(v32(&a.relu().unwrap()), vec![1.0, 0.0, 3.0, 4.0]);
    let e = v32(&f32s(&[0.0, 1.0, -1.0], &[3]).exp().unwrap());
    assert_eq!(e[0], 1.0);
    assert!((e[1] - std::f32::consts::E).abs() < 1e-6);
    assert!((e[2] - 1.0 / std::f32::consts::E).abs() < 1e-6);
}

#[test]
fn elementwise_f64_hand_checked() {
    let a = f64s(&[1.5, -2.0], &[2]);
    let b = f64s(&[0.5, 8.0], &[2]);
    assert_eq!(v64(&a.add(&b).unwrap()), vec![2.0, 6.0]);
    assert_eq!(v64(&a.div(&b).unwrap()), vec![3.0, -0.25]);
    assert_eq!(v64(&a.exp().unwrap())[0], 1.5f64.exp());
    // IEEE division by zero.
    let z = a.div_scalar(0.0).unwrap();
    assert_eq!(v64(&z), vec![f64::INFINITY, f64::NEG_INFINITY]);
}

#[test]
fn elementwise_i64_hand_checked() {
    let a = i64s(&[7, -7, 9, i64::MAX], &[4]);
    let b = i64s(&[2, 2, -3, 1], &[4]);
    assert_eq!(vi(&a.add(&b).unwrap()), vec![9, -5, 6, i64::MIN]); // wraps
    assert_eq!(vi(&a.sub(&b).unwrap()), vec![5, -9, 12, i64::MAX - 1]);
    assert_eq!(vi(&a.mul(&b).unwrap()), vec![14, -14, -27, i64::MAX]);
    assert_eq!(vi(&a.div(&b).unwrap()), vec![3, -3, -3, i64::MAX]); // truncates
    assert_eq!(
        vi(&a.div_scalar(-2.0).unwrap()),
        vec![-3, 3, -4, -(i64::MAX / 2)]
    );
    assert_eq!(vi(&a.neg().unwrap()), vec![-7, 7, -9, -i64::MAX]);
    assert_eq!(vi(&a.relu().unwrap()), vec![7, 0, 9, i64::MAX]);
    assert_eq!(vi(&a.mul_scalar(3.0).unwrap())[..3], [21, -21, 27]);
    let min = i64s(&[i64::MIN], &[1]);
    assert_eq!(vi(&min.div_scalar(-1.0).unwrap()), vec![i64::MIN]);
    assert_eq!(vi(&min.neg().unwrap()), vec![i64::MIN]);
}

#[test]
fn integer_division_by_zero_is_an_error() {
    let a = i64s(&[1, 2], &[2]);
    let b = i64s(&[1, 0], &[2]);
    assert_eq!(a.div(&b).unwrap_err(), Error::DivisionByZero { op: "div" });
    assert_eq!(
        a.div_scalar(0.0).unwrap_err(),
        Error::DivisionByZero { op: "div_scalar" }
    );
}

#[test]
fn scalar_must_fit_an_integer_tensor() {
    let a = i64s(&[1, 2], &[2]);
    for r in [
        a.add_scalar(0.5),
        a.mul_scalar(f64::NAN),
        a.sub_scalar(1e300),
    ] {
        assert!(matches!(r, Err(Error::InvalidScalar { .. })), "{r:?}");
    }
    let mut a = a;
    assert!(matches!(
        a.scale_assign(0.5),
        Err(Error::InvalidScalar { .. })
    ));
    let ones = i64s(&[1, 1], &[2]);
    assert!(matches!(
        a.axpy(0.1, &ones),
        Err(Error::InvalidScalar { op: "axpy", .. })
    ));
}

#[test]
fn exp_of_integers_is_unsupported() {
    let err = i64s(&[1], &[1]).exp().unwrap_err();
    assert_eq!(
        err,
        Error::UnsupportedDType {
            op: "exp",
            dtype: DType::I64,
            needs: "a float dtype (f32 or f64)"
        }
    );
}

#[test]
fn shape_and_dtype_mismatches_are_errors() {
    let a = f32s(&[1.0, 2.0], &[2]);
    let b = f32s(&[1.0, 2.0], &[1, 2]);
    let err = a.add(&b).unwrap_err();
    assert_eq!(
        err.to_string(),
        "add: shapes differ ([2] vs [1, 2]); elementwise operations need equal shapes"
    );
    let c = f64s(&[1.0, 2.0], &[2]);
    let err = a.mul(&c).unwrap_err();
    assert_eq!(
        err,
        Error::DTypeMismatch {
            op: "mul",
            lhs: DType::F32,
            rhs: DType::F64
        }
    );
    let mut a = a;
    assert!(matches!(
        a.add_assign(&b),
        Err(Error::ShapeMismatch {
            op: "add_assign",
            ..
        })
    ));
    assert!(matches!(a.axpy(1.0, &c), Err(Error::DTypeMismatch { .. })));
    assert!(a.max_abs_diff(&c).is_err());
}

#[test]
fn in_place_updates_hand_checked() {
    let mut w = f32s(&[1.0, 2.0, 3.0], &[3]);
    let g = f32s(&[10.0, 20.0, 30.0], &[3]);
    w.axpy(-0.1, &g).unwrap();
    assert_eq!(v32(&w), vec![0.0, 0.0, 0.0]);
    w.add_assign(&g).unwrap();
    assert_eq!(v32(&w), vec![10.0, 20.0, 30.0]);
    w.scale_assign(0.25).unwrap();
    assert_eq!(v32(&w), vec![2.5, 5.0, 7.5]);
    let mut k = i64s(&[1, 2], &[2]);
    k.axpy(3.0, &i64s(&[1, -1], &[2])).unwrap();
    assert_eq!(vi(&k), vec![4, -1]);
}

// Matrix multiplication.

#[test]
fn matmul_hand_checked() {
    // [[1, 2, 3], [4, 5, 6]] x [[7, 8], [9, 10], [11, 12]] = [[58, 64], [139, 154]]
    let a = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [7.0f64, 8.0, 9.0, 10.0, 11.0, 12.0];
    let (a32, b32) = (a.map(|x| x as f32), b.map(|x| x as f32));
    let c = f32s(&a32, &[2, 3]).matmul(&f32s(&b32, &[3, 2])).unwrap();
    assert_eq!(c.dims(), &[2, 2]);
    assert_eq!(v32(&c), vec![58.0, 64.0, 139.0, 154.0]);
    let c = f64s(&a, &[2, 3]).matmul(&f64s(&b, &[3, 2])).unwrap();
    assert_eq!(v64(&c), vec![58.0, 64.0, 139.0, 154.0]);
    let ai: Vec<i64> = a.iter().map(|&x| x as i64).collect();
    let bi: Vec<i64> = b.iter().map(|&x| x as i64).collect();
    let c = i64s(&ai, &[2, 3]).matmul(&i64s(&bi, &[3, 2])).unwrap();
    assert_eq!(vi(&c), vec![58, 64, 139, 154]);
    // Row vector times column vector, and the other way round.
    let r = f64s(&[1.0, 2.0], &[1, 2]);
    let col = f64s(&[3.0, 4.0], &[2, 1]);
    assert_eq!(v64(&r.matmul(&col).unwrap()), vec![11.0]);
    assert_eq!(v64(&col.matmul(&r).unwrap()), vec![3.0, 6.0, 4.0, 8.0]);
}

fn naive_matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

#[test]
fn matmul_matches_a_naive_triple_loop() {
    for (seed, &(m, k, n)) in [
        (1, 1, 1),
        (17, 33, 9),
        (64, 64, 64),
        (5, 128, 3),
        (100, 7, 70),
    ]
    .iter()
    .enumerate()
    {
        let seed = seed as u64;
        for dtype in [DType::F32, DType::F64] {
            let a = Tensor::rand_uniform(&[m, k], -1.0, 1.0, seed, dtype, CPU).unwrap();
            let b = Tensor::rand_uniform(&[k, n], -1.0, 1.0, seed + 100, dtype, CPU).unwrap();
            let c = a.matmul(&b).unwrap();
            assert_eq!(c.dims(), &[m, n]);
            let to64 = |t: &Tensor| -> Vec<f64> {
                match dtype {
                    DType::F32 => v32(t).into_iter().map(f64::from).collect(),
                    _ => v64(t),
                }
            };
            let want = naive_matmul(&to64(&a), &to64(&b), m, k, n);
            let want = Tensor::from_vec(want, &[m, n]).unwrap();
            let got = Tensor::from_vec(to64(&c), &[m, n]).unwrap();
            let tol = if dtype == DType::F32 {
                1e-4 * k as f64
            } else {
                1e-12 * k as f64
            };
            let diff = got.max_abs_diff(&want).unwrap();
            assert!(diff <= tol, "{dtype} {m}x{k}x{n}: diff {diff}");
        }
        let a = Tensor::rand_uniform(&[m, k], -50.0, 50.0, seed, DType::I64, CPU).unwrap();
        let b = Tensor::rand_uniform(&[k, n], -50.0, 50.0, seed + 1, DType::I64, CPU).unwrap();
        let (av, bv) = (vi(&a), vi(&b));
        let mut want = vec![0i64; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    want[i * n + j] += av[i * k + p] * bv[p * n + j];
                }
            }
        }
        assert_eq!(vi(&a.matmul(&b).unwrap()), want, "i64 {m}x{k}x{n}");
    }
}

#[test]
fn matmul_with_empty_dimensions() {
    let a = Tensor::zeros(&[0, 3], DType::F32, CPU).unwrap();
    let b = Tensor::ones(&[3, 2], DType::F32, CPU).unwrap();
    assert_eq!(a.matmul(&b).unwrap().dims(), &[0, 2]);
    // k = 0: a sum of nothing is zero.
    let a = Tensor::ones(&[2, 0], DType::F64, CPU).unwrap();
    let b = Tensor::ones(&[0, 3], DType::F64, CPU).unwrap();
    assert_eq!(v64(&a.matmul(&b).unwrap()), vec![0.0; 6]);
}

#[test]
fn matmul_mismatches_are_errors() {
    let a = Tensor::ones(&[2, 3], DType::F32, CPU).unwrap();
    let b = Tensor::ones(&[2, 3], DType::F32, CPU).unwrap();
    let err = a.matmul(&b).unwrap_err();
    assert_eq!(
        err.to_string(),
        "matmul: inner dimensions differ ([2, 3] x [2, 3]); need [m, k] x [k, n]"
    );
    let v = Tensor::ones(&[3], DType::F32, CPU).unwrap();
    assert!(matches!(
        a.matmul(&v),
        Err(Error::RankMismatch {
            op: "matmul",
            expected: 2,
            ..
        })
    ));
    let d = Tensor::ones(&[3, 2], DType::F64, CPU).unwrap();
    assert!(matches!(a.matmul(&d), Err(Error::DTypeMismatch { .. })));
}

// Reductions.

#[test]
fn sum_and_mean_hand_checked() {
    let t = cube();
    assert_eq!(t.sum().unwrap().dims(), &[] as &[usize]);
    assert_eq!(t.sum().unwrap().to_scalar().unwrap(), 276.0);
    assert_eq!(t.mean().unwrap().to_scalar().unwrap(), 11.5);
    let s0 = t.sum_dim(0).unwrap();
    assert_eq!(s0.dims(), &[3, 4]);
    assert_eq!(
        v64(&s0),
        (0..12).map(|i| (2 * i + 12) as f64).collect::<Vec<_>>()
    );
    let s1 = t.sum_dim(1).unwrap();
    assert_eq!(s1.dims(), &[2, 4]);
    assert_eq!(
        v64(&s1),
        vec![12.0, 15.0, 18.0, 21.0, 48.0, 51.0, 54.0, 57.0]
    );
    let s2 = t.sum_dim(2).unwrap();
    assert_eq!(s2.dims(), &[2, 3]);
    assert_eq!(v64(&s2), vec![6.0, 22.0, 38.0, 54.0, 70.0, 86.0]);
    let m2 = t.mean_dim(2).unwrap();
    assert_eq!(v64(&m2), vec![1.5, 5.5, 9.5, 13.5, 17.5, 21.5]);
    let i = i64s(&[1, 2, 3, 4], &[2, 2]);
    assert_eq!(vi(&i.sum().unwrap()), vec![10]);
    assert_eq!(vi(&i.sum_dim(1).unwrap()), vec![3, 7]);
}

#[test]
fn f32_sums_accumulate_in_f64() {
    // 2^25 ones: an f32 accumulator would stall at 2^24 (1 + 2^24 rounds back
    // to 2^24), giving a sum of 2^24 and a mean of 0.5.
    let n = 1 << 25;
    let t = Tensor::ones(&[n], DType::F32, CPU).unwrap();
    assert_eq!(t.sum().unwrap().to_scalar().unwrap(), n as f64);
    assert_eq!(t.mean().unwrap().to_scalar().unwrap(), 1.0);
}

#[test]
fn reductions_of_empty_tensors() {
    let e = Tensor::zeros(&[0, 3], DType::F32, CPU).unwrap();
    assert_eq!(e.sum().unwrap().to_scalar().unwrap(), 0.0);
    assert!(e.mean().unwrap().to_scalar().unwrap().is_nan());
    assert_eq!(v32(&e.sum_dim(0).unwrap()), vec![0.0; 3]);
    assert_eq!(e.sum_dim(1).unwrap().dims(), &[0]);
}

#[test]
fn reduction_errors() {
    let i = i64s(&[1, 2], &[2]);
    assert!(matches!(
        i.mean(),
        Err(Error::UnsupportedDType { op: "mean", .. })
    ));
    assert!(matches!(i.mean_dim(0), Err(Error::UnsupportedDType { .. })));
    assert_eq!(
        cube().sum_dim(3).unwrap_err(),
        Error::DimOutOfRange {
            op: "sum_dim",
            dim: 3,
            rank: 3
        }
    );
}

// Layout.

#[test]
fn narrow_hand_checked() {
    let t = cube();
    let n0 = t.narrow(0, 1, 1).unwrap();
    assert_eq!(n0.dims(), &[1, 3, 4]);
    assert_eq!(v64(&n0), (12..24).map(|x| x as f64).collect::<Vec<_>>());
    let n1 = t.narrow(1, 1, 2).unwrap();
    assert_eq!(n1.dims(), &[2, 2, 4]);
    assert_eq!(
        v64(&n1),
        [4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23]
            .iter()
            .map(|&x| x as f64)
            .collect::<Vec<_>>()
    );
    let n2 = t.narrow(2, 3, 1).unwrap();
    assert_eq!(n2.dims(), &[2, 3, 1]);
    assert_eq!(v64(&n2), vec![3.0, 7.0, 11.0, 15.0, 19.0, 23.0]);
    let empty = t.narrow(1, 3, 0).unwrap();
    assert_eq!(empty.dims(), &[2, 0, 4]);
    assert_eq!(empty.numel(), 0);
}

#[test]
fn narrow_out_of_range_is_an_error() {
    let t = cube();
    assert_eq!(
        t.narrow(1, 2, 2).unwrap_err(),
        Error::NarrowOutOfRange {
            dim: 1,
            start: 2,
            len: 2,
            size: 3
        }
    );
    assert!(matches!(
        t.narrow(1, usize::MAX, 2),
        Err(Error::NarrowOutOfRange { .. })
    ));
    assert!(matches!(
        t.narrow(3, 0, 1),
        Err(Error::DimOutOfRange { op: "narrow", .. })
    ));
}

#[test]
fn cat_hand_checked() {
    let a = i64s(&[1, 2, 3, 4], &[2, 2]);
    let b = i64s(&[5, 6], &[2, 1]);
    let c = Tensor::cat(&[&a, &b], 1).unwrap();
    assert_eq!(c.dims(), &[2, 3]);
    assert_eq!(vi(&c), vec![1, 2, 5, 3, 4, 6]);
    let d = i64s(&[7, 8], &[1, 2]);
    let r = Tensor::cat(&[&a, &d], 0).unwrap();
    assert_eq!(vi(&r), vec![1, 2, 3, 4, 7, 8]);
    let single = Tensor::cat(&[&a], 0).unwrap();
    assert_eq!(vi(&single), vi(&a));
}

#[test]
fn narrow_then_cat_round_trips() {
    // Split every dim of random tensors into uneven shards (including empty
    // ones) and put them back together.
    for (seed, dims) in [vec![7], vec![4, 5], vec![3, 1, 6], vec![2, 3, 4, 5]]
        .into_iter()
        .enumerate()
    {
        for dtype in DType::ALL {
            let t = Tensor::rand_uniform(&dims, -9.0, 9.0, seed as u64, dtype, CPU).unwrap();
            for dim in 0..dims.len() {
                let size = dims[dim];
                let cuts = [0, size / 3, size / 3, size];
                let shards: Vec<Tensor> = cuts
                    .windows(2)
                    .map(|w| t.narrow(dim, w[0], w[1] - w[0]).unwrap())
                    .collect();
                let refs: Vec<&Tensor> = shards.iter().collect();
                let back = Tensor::cat(&refs, dim).unwrap();
                assert_eq!(back.dims(), t.dims());
                assert_eq!(
                    back.to_le_bytes().unwrap(),
                    t.to_le_bytes().unwrap(),
                    "{dtype} {dims:?} dim {dim}"
                );
            }
        }
    }
}

#[test]
fn cat_errors() {
    assert_eq!(Tensor::cat(&[], 0).unwrap_err(), Error::EmptyCat);
    let a = Tensor::ones(&[2, 2], DType::F32, CPU).unwrap();
    let b = Tensor::ones(&[3, 3], DType::F32, CPU).unwrap();
    let err = Tensor::cat(&[&a, &b], 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cat: shape [3, 3] of tensor 1 does not match [2, 2] outside dimension 0"
    );
    let c = Tensor::ones(&[2, 2, 1], DType::F32, CPU).unwrap();
    assert!(matches!(
        Tensor::cat(&[&a, &c], 0),
        Err(Error::CatShape { .. })
    ));
    let d = Tensor::ones(&[2, 2], DType::I64, CPU).unwrap();
    assert!(matches!(
        Tensor::cat(&[&a, &d], 0),
        Err(Error::DTypeMismatch { op: "cat", .. })
    ));
    assert!(matches!(
        Tensor::cat(&[&a, &a], 2),
        Err(Error::DimOutOfRange { op: "cat", .. })
    ));
}

#[test]
fn reshape_and_transpose() {
    let t = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let r = t.reshape(&[3, 2]).unwrap();
    assert_eq!(r.dims(), &[3, 2]);
    assert_eq!(v32(&r), v32(&t));
    let tt = t.transpose().unwrap();
    assert_eq!(tt.dims(), &[3, 2]);
    assert_eq!(v32(&tt), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert_eq!(v32(&tt.transpose().unwrap()), v32(&t));
    // A larger transpose crosses the 32-element tiles.
    let big = Tensor::arange(70 * 45, DType::I64, CPU)
        .unwrap()
        .into_reshape(&[70, 45])
        .unwrap();
    let bt = vi(&big.transpose().unwrap());
    assert_eq!(bt[1], 45);
    assert_eq!(bt[70], 1);
    assert_eq!(bt[44 * 70 + 69], 69 * 45 + 44);
    let err = t.reshape(&[4, 2]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "reshape: cannot view [2, 3] (6 elements) as [4, 2] (8 elements)"
    );
    assert!(matches!(
        cube().transpose(),
        Err(Error::RankMismatch {
            op: "transpose",
            ..
        })
    ));
}

// Everything else.

#[test]
fn to_scalar_needs_one_element() {
    assert_eq!(f32s(&[2.5], &[1, 1]).to_scalar().unwrap(), 2.5);
    assert!(matches!(
        f32s(&[1.0, 2.0], &[2]).to_scalar(),
        Err(Error::NotAScalar { numel: 2, .. })
    ));
}

#[test]
fn max_abs_diff_treats_nan_carefully() {
    let a = f64s(&[1.0, f64::NAN, 3.0], &[3]);
    let b = f64s(&[1.5, f64::NAN, 3.0], &[3]);
    assert_eq!(a.max_abs_diff(&b).unwrap(), 0.5);
    let c = f64s(&[1.0, 2.0, 3.0], &[3]);
    assert_eq!(a.max_abs_diff(&c).unwrap(), f64::INFINITY);
}

#[test]
fn t5_to_device_cpu_is_a_copy() {
    let t = f32s(&[1.0, 2.0], &[2]);
    let mut u = t.to_device(CPU).unwrap();
    u.scale_assign(2.0).unwrap();
    assert_eq!(v32(&t), vec![1.0, 2.0]);
    assert_eq!(v32(&u), vec![2.0, 4.0]);
    let c = t.try_clone().unwrap();
    assert_eq!(v32(&c), v32(&t));
    let s = Tensor::from_slice(&[1i64, 2, 3], &[3], CPU).unwrap();
    assert_eq!(vi(&s), vec![1, 2, 3]);
}

#[test]
fn t8_zero_sized_tensors_work_everywhere() {
    let e = Tensor::zeros(&[0], DType::F32, CPU).unwrap();
    assert_eq!(e.numel(), 0);
    assert_eq!(e.to_le_bytes().unwrap(), Vec::<u8>::new());
    assert_eq!(e.add(&e).unwrap().numel(), 0);
    assert_eq!(e.exp().unwrap().numel(), 0);
    let e2 = Tensor::from_le_bytes(&[], &[2, 0], DType::I64, CPU).unwrap();
    assert_eq!(e2.transpose().unwrap().dims(), &[0, 2]);
    let r = Tensor::rand_normal(&[0, 5], 0.0, 1.0, 1, DType::F64, CPU).unwrap();
    assert_eq!(r.dims(), &[0, 5]);
}

#[test]
fn debug_shows_metadata() {
    let t = Tensor::zeros(&[2, 3], DType::I64, CPU).unwrap();
    assert_eq!(
        format!("{t:?}"),
        "Tensor { shape: [2, 3], dtype: I64, device: Cpu }"
    );
}

#[test]
fn tensors_can_cross_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tensor>();
    assert_send_sync::<Error>();
}
