//! Matmul throughput, measured the same way by `monarch-bench dataplane`
//! and the `matmul_gflops` example (which the GPU script runs without
//! building the whole benchmark binary). GFLOP/s counts `2 n^3`
//! floating-point operations per product.

use std::time::Instant;

use crate::{DType, Device, Tensor};

/// GFLOP/s of `reps` timed samples, each `products` products of two random
/// `n x n` tensors, after one untimed sample. A sample ends when one element
/// of the last product is read back, which waits for a device's queued work
/// (and costs nothing on the CPU); an element that is not finite is an error.
pub fn matmul_gflops(
    n: usize,
    reps: usize,
    products: usize,
    dtype: DType,
    device: Device,
) -> Result<Vec<f64>, String> {
    let random = |seed| {
        Tensor::rand_uniform(&[n, n], -1.0, 1.0, seed, dtype, device).map_err(|e| e.to_string())
    };
    let (a, b) = (random(1)?, random(2)?);
    let flops = 2.0 * (n as f64).powi(3) * products.max(1) as f64;
    let sample = || -> Result<f64, String> {
        let started = Instant::now();
        let mut last = a.matmul(&b).map_err(|e| e.to_string())?;
        for _ in 1..products {
            last = a.matmul(&b).map_err(|e| e.to_string())?;
        }
        let corner = last
            .narrow(0, 0, 1)
            .and_then(|r| r.narrow(1, 0, 1))
            .and_then(|e| e.to_scalar())
            .map_err(|e| e.to_string())?;
        let took = started.elapsed();
        if !corner.is_finite() {
            return Err(format!("the product holds {corner}"));
        }
        Ok(flops / took.as_secs_f64() / 1e9)
    };
    sample()?;
    (0..reps).map(|_| sample()).collect()
}

/// GFLOP/s of the obvious `i-k-j` loop on f32 at `n`, `reps` runs after
/// one: the floor the matmul figures are read against.
pub fn naive_matmul_gflops(n: usize, reps: usize) -> Vec<f64> {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let flops = 2.0 * (n as f64).powi(3);
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let started = Instant::now();
        let mut c = vec![0.0f32; n * n];
        for i in 0..n {
            for p in 0..n {
                let aip = a[i * n + p];
                let (c_row, b_row) = (&mut c[i * n..(i + 1) * n], &b[p * n..(p + 1) * n]);
                for (c_ij, &b_pj) in c_row.iter_mut().zip(b_row) {
                    *c_ij += aip * b_pj;
                }
            }
        }
        std::hint::black_box(&c);
        if rep > 0 {
            samples.push(flops / started.elapsed().as_secs_f64() / 1e9);
        }
    }
    samples
}
