//! The CUDA backend against the CPU backend (cargo feature `cuda`).
//!
//! Every test that needs a GPU asks [`gpu`] first. Without a usable CUDA
//! device it prints why and returns early, so `cargo test --features cuda`
//! passes on machines without one; with `MONARCH_REQUIRE_GPU=1` (set by
//! `tests/gpu/run.sh`) the same situation fails the test instead.
//!
//! Results are compared with the CPU backend on the same inputs: exactly for
//! copies, layout operations and i64, within a tolerance for float
//! arithmetic (FMA contraction and reduction order differ).

#![cfg(feature = "cuda")]

use monarch_tensor::{DType, Device, Error, Tensor};

const CPU: Device = Device::Cpu;

fn require_gpu() -> bool {
    std::env::var("MONARCH_REQUIRE_GPU").as_deref() == Ok("1")
}

/// The first CUDA device, or `None` (after printing why) to skip the test.
fn gpu(test: &str) -> Option<Device> {
    match monarch_tensor::cuda_device_count() {
        Ok(n) if n > 0 => Some(Device::Cuda(0)),
        other => {
            let why = match other {
                Ok(_) => "the driver reports no CUDA device".to_string(),
                Err(e) => e.to_string(),
            };
            if require_gpu() {
                panic!("{test}: MONARCH_REQUIRE_GPU=1 but no GPU is usable: {why}");
            }
            eprintln!("SKIP {test}: {why}");
            None
        }
    }
}

/// Runs `f` on CPU copies and on GPU copies of `inputs` and compares.
fn same_on_both(
    what: &str,
    gpu: Device,
    inputs: &[&Tensor],
    tol: f64,
    f: impl Fn(&[&Tensor]) -> Result<Tensor, Error>,
) {
    let on_gpu: Vec<Tensor> = inputs.iter().map(|t| t.to_device(gpu).unwrap()).collect();
    let gpu_refs: Vec<&Tensor> = on_gpu.iter().collect();
    let want = f(inputs).unwrap_or_else(|e| panic!("{what} on cpu: {e}"));
    let got = f(&gpu_refs).unwrap_or_else(|e| panic!("{what} on gpu: {e}"));
    assert_eq!(got.device(), gpu, "{what}: result left the device");
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let diff = got.max_abs_diff(&want).unwrap();
    assert!(
        diff <= tol,
        "{what}: gpu differs from cpu by {diff} (tolerance {tol})"
    );
}

fn tol(dtype: DType, scale: f64) -> f64 {
    match dtype {
        DType::F32 => 1e-5 * scale,
        DType::F64 => 1e-12 * scale,
        DType::I64 => 0.0,
    }
}

fn random(dims: &[usize], seed: u64, dtype: DType) -> Tensor {
    Tensor::rand_uniform(dims, -4.0, 4.0, seed, dtype, CPU).unwrap()
}

/// Runs here too: without a driver, CUDA tensors are errors, never panics.
#[test]
fn no_driver_is_an_error_not_a_panic() {
    if monarch_tensor::cuda_device_count().is_ok_and(|n| n > 0) {
        return; // Covered by every other test on a GPU machine.
    }
    let err = Tensor::zeros(&[2], DType::F32, Device::Cuda(0)).unwrap_err();
    assert!(matches!(err, Error::CudaUnavailable(_)), "{err}");
    let cpu = Tensor::ones(&[2], DType::F32, CPU).unwrap();
    assert!(matches!(
        cpu.to_device(Device::Cuda(0)),
        Err(Error::CudaUnavailable(_))
    ));
}

#[test]
fn constructors_and_random_match_cpu_exactly() {
    let Some(g) = gpu("constructors_and_random_match_cpu_exactly") else {
        return;
    };
    for dtype in DType::ALL {
        for (cpu, dev) in [
            (
                Tensor::zeros(&[3, 5], dtype, CPU),
                Tensor::zeros(&[3, 5], dtype, g),
            ),
            (
                Tensor::ones(&[1000], dtype, CPU),
                Tensor::ones(&[1000], dtype, g),
            ),
            (
                Tensor::full(&[7], -3.0, dtype, CPU),
                Tensor::full(&[7], -3.0, dtype, g),
            ),
            (Tensor::arange(33, dtype, CPU), Tensor::arange(33, dtype, g)),
            (
                Tensor::rand_uniform(&[4, 9], -2.0, 2.0, 11, dtype, CPU),
                Tensor::rand_uniform(&[4, 9], -2.0, 2.0, 11, dtype, g),
            ),
        ] {
            let (cpu, dev) = (cpu.unwrap(), dev.unwrap());
            assert_eq!(dev.device(), g);
            // T-7: the same bytes on every device.
            assert_eq!(
                dev.to_le_bytes().unwrap(),
                cpu.to_le_bytes().unwrap(),
                "{dtype}"
            );
        }
    }
    let a = Tensor::rand_normal(&[65], 1.0, 2.0, 3, DType::F32, CPU).unwrap();
    let b = Tensor::rand_normal(&[65], 1.0, 2.0, 3, DType::F32, g).unwrap();
    assert_eq!(a.to_le_bytes().unwrap(), b.to_le_bytes().unwrap());
}

#[test]
fn copies_round_trip() {
    let Some(g) = gpu("copies_round_trip") else {
        return;
    };
    for dtype in DType::ALL {
        let t = random(&[17, 3], 5, dtype);
        let bytes = t.to_le_bytes().unwrap();
        let d = Tensor::from_le_bytes(&bytes, &[17, 3], dtype, g).unwrap();
        assert_eq!(d.to_le_bytes().unwrap(), bytes);
        let d2 = d.try_clone().unwrap();
        let d3 = d2.to_device(g).unwrap();
        let back = d3.to_device(CPU).unwrap();
        assert_eq!(back.to_le_bytes().unwrap(), bytes);
    }
    let v = Tensor::from_slice(&[1.5f64, -2.0], &[2], g).unwrap();
    assert_eq!(v.to_vec::<f64>().unwrap(), vec![1.5, -2.0]);
    assert_eq!(v.narrow(0, 1, 1).unwrap().to_scalar().unwrap(), -2.0);
    assert_eq!(v.into_vec::<f64>().unwrap(), vec![1.5, -2.0]);
}

#[test]
fn elementwise_matches_cpu() {
    let Some(g) = gpu("elementwise_matches_cpu") else {
        return;
    };
    for dtype in DType::ALL {
        // Large enough for several blocks and a grid-stride remainder.
        let a = random(&[1000, 37], 1, dtype);
        let mut b = random(&[1000, 37], 2, dtype);
        if dtype == DType::I64 {
            // Divisors without zeros: shift non-negative values up by one.
            b = b.relu().unwrap().add_scalar(1.0).unwrap();
        }
        let t = tol(dtype, 10.0);
        same_on_both("add", g, &[&a, &b], t, |x| x[0].add(x[1]));
        same_on_both("sub", g, &[&a, &b], t, |x| x[0].sub(x[1]));
        same_on_both("mul", g, &[&a, &b], t, |x| x[0].mul(x[1]));
        same_on_both("div", g, &[&a, &b], t * 100.0, |x| x[0].div(x[1]));
        same_on_both("add_scalar", g, &[&a], t, |x| x[0].add_scalar(3.0));
        same_on_both("sub_scalar", g, &[&a], t, |x| x[0].sub_scalar(-2.0));
        same_on_both("mul_scalar", g, &[&a], t, |x| x[0].mul_scalar(-7.0));
        same_on_both("div_scalar", g, &[&a], t, |x| x[0].div_scalar(3.0));
        same_on_both("neg", g, &[&a], 0.0, |x| x[0].neg());
        same_on_both("relu", g, &[&a], 0.0, |x| x[0].relu());
        if dtype.is_float() {
            same_on_both("exp", g, &[&a], tol(dtype, 100.0), |x| x[0].exp());
        }
        same_on_both("axpy", g, &[&a, &b], t, |x| {
            let mut y = x[0].try_clone()?;
            y.axpy(-3.0, x[1])?;
            y.add_assign(x[1])?;
            y.scale_assign(2.0)?;
            Ok(y)
        });
    }
}

#[test]
fn integer_semantics_match_cpu() {
    let Some(g) = gpu("integer_semantics_match_cpu") else {
        return;
    };
    let a = Tensor::from_vec(vec![7i64, -7, i64::MAX, i64::MIN, 0], &[5]).unwrap();
    let b = Tensor::from_vec(vec![2i64, 2, 1, -1, 5], &[5]).unwrap();
    same_on_both("i64 add wraps", g, &[&a, &b], 0.0, |x| x[0].add(x[1]));
    same_on_both("i64 div truncates", g, &[&a, &b], 0.0, |x| x[0].div(x[1]));
    same_on_both("i64 neg wraps", g, &[&a], 0.0, |x| x[0].neg());
    let zero = Tensor::from_vec(vec![1i64, 0, 1, 1, 1], &[5]).unwrap();
    let (ad, zd) = (a.to_device(g).unwrap(), zero.to_device(g).unwrap());
    assert_eq!(
        ad.div(&zd).unwrap_err(),
        Error::DivisionByZero { op: "div" }
    );
    assert!(matches!(
        ad.div_scalar(0.0),
        Err(Error::DivisionByZero { .. })
    ));
    assert!(matches!(ad.exp(), Err(Error::UnsupportedDType { .. })));
}

#[test]
fn matmul_matches_cpu() {
    let Some(g) = gpu("matmul_matches_cpu") else {
        return;
    };
    // Non-square shapes catch a row-major/column-major mix-up in the cuBLAS call.
    for &(m, k, n) in &[
        (1, 1, 1),
        (2, 3, 4),
        (3, 5, 2),
        (17, 33, 9),
        (128, 64, 96),
        (256, 256, 256),
    ] {
        for dtype in DType::ALL {
            let a = random(&[m, k], 10, dtype);
            let b = random(&[k, n], 20, dtype);
            let what = format!("matmul {dtype} {m}x{k}x{n}");
            same_on_both(&what, g, &[&a, &b], tol(dtype, 16.0 * k as f64), |x| {
                x[0].matmul(x[1])
            });
        }
    }
    let a = Tensor::ones(&[2, 0], DType::F32, g).unwrap();
    let b = Tensor::ones(&[0, 3], DType::F32, g).unwrap();
    assert_eq!(a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
}

#[test]
fn reductions_match_cpu() {
    let Some(g) = gpu("reductions_match_cpu") else {
        return;
    };
    for dtype in DType::ALL {
        // One element, one partial block, many blocks, more than SUM_BLOCKS blocks.
        for n in [1usize, 255, 257, 70_000, 1 << 20] {
            let t = random(&[n], n as u64, dtype);
            let what = format!("sum {dtype} n={n}");
            same_on_both(&what, g, &[&t], tol(dtype, 4.0 * n as f64), |x| x[0].sum());
            if dtype.is_float() {
                same_on_both("mean", g, &[&t], tol(dtype, 4.0), |x| x[0].mean());
            }
        }
        let cube = random(&[6, 7, 8], 3, dtype);
        for dim in 0..3 {
            same_on_both("sum_dim", g, &[&cube], tol(dtype, 40.0), |x| {
                x[0].sum_dim(dim)
            });
            if dtype.is_float() {
                same_on_both("mean_dim", g, &[&cube], tol(dtype, 4.0), |x| {
                    x[0].mean_dim(dim)
                });
            }
        }
    }
    let e = Tensor::zeros(&[0, 4], DType::F64, g).unwrap();
    assert_eq!(e.sum().unwrap().to_scalar().unwrap(), 0.0);
    assert!(e.mean().unwrap().to_scalar().unwrap().is_nan());
    assert_eq!(e.sum_dim(0).unwrap().to_vec::<f64>().unwrap(), vec![0.0; 4]);
}

#[test]
fn layout_matches_cpu_exactly() {
    let Some(g) = gpu("layout_matches_cpu_exactly") else {
        return;
    };
    for dtype in DType::ALL {
        let t = random(&[4, 5, 6], 7, dtype);
        for dim in 0..3 {
            let size = t.dims()[dim];
            same_on_both("narrow", g, &[&t], 0.0, |x| x[0].narrow(dim, 1, size - 2));
            same_on_both("narrow to empty", g, &[&t], 0.0, |x| x[0].narrow(dim, 2, 0));
            same_on_both("narrow + cat", g, &[&t], 0.0, |x| {
                let a = x[0].narrow(dim, 0, 1)?;
                let b = x[0].narrow(dim, 1, size - 1)?;
                Tensor::cat(&[&a, &b, &a], dim)
            });
        }
        let m = random(&[37, 53], 8, dtype);
        same_on_both("transpose", g, &[&m], 0.0, |x| x[0].transpose());
        same_on_both("reshape", g, &[&m], 0.0, |x| x[0].reshape(&[53, 37]));
    }
}

#[test]
fn device_rules_are_enforced() {
    let Some(g) = gpu("device_rules_are_enforced") else {
        return;
    };
    let c = Tensor::ones(&[2], DType::F32, CPU).unwrap();
    let mut d = Tensor::ones(&[2], DType::F32, g).unwrap();
    assert_eq!(
        c.add(&d).unwrap_err(),
        Error::DeviceMismatch {
            op: "add",
            lhs: CPU,
            rhs: g
        }
    );
    assert!(matches!(d.axpy(1.0, &c), Err(Error::DeviceMismatch { .. })));
    assert!(matches!(
        Tensor::cat(&[&c, &d], 0),
        Err(Error::DeviceMismatch { .. })
    ));
    assert!(matches!(
        d.as_bytes(),
        Err(Error::NotOnCpu { op: "as_bytes", .. })
    ));
    assert!(matches!(
        d.as_mut_slice::<f32>(),
        Err(Error::NotOnCpu { .. })
    ));
    let count = monarch_tensor::cuda_device_count().unwrap();
    assert!(matches!(
        Tensor::zeros(&[1], DType::F32, Device::Cuda(count)),
        Err(Error::CudaUnavailable(_))
    ));
}

/// A data-parallel gradient step in miniature: the same update on the GPU and
/// on the CPU gives the same weights.
#[test]
fn linear_regression_step_matches_cpu() {
    let Some(g) = gpu("linear_regression_step_matches_cpu") else {
        return;
    };
    let step = |device: Device| -> Tensor {
        let x = Tensor::rand_normal(&[64, 8], 0.0, 1.0, 1, DType::F32, device).unwrap();
        let true_w = Tensor::rand_normal(&[8, 1], 0.0, 1.0, 2, DType::F32, device).unwrap();
        let y = x.matmul(&true_w).unwrap();
        let mut w = Tensor::zeros(&[8, 1], DType::F32, device).unwrap();
        for _ in 0..20 {
            let err = x.matmul(&w).unwrap().sub(&y).unwrap();
            let grad = x
                .transpose()
                .unwrap()
                .matmul(&err)
                .unwrap()
                .mul_scalar(2.0 / 64.0)
                .unwrap();
            w.axpy(-0.1, &grad).unwrap();
        }
        w
    };
    let (cpu_w, gpu_w) = (step(CPU), step(g));
    assert!(cpu_w.max_abs_diff(&gpu_w).unwrap() < 1e-4);
}
