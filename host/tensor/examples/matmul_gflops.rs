//! Matrix multiplication throughput: the `matmul_gflops` benchmark.
//!
//! ```sh
//! cargo run --release -p monarch-tensor --example matmul_gflops [N] [REPS]
//! ```
//!
//! Prints one JSON object per line on stdout, as `monarch-bench` suites do
//! (`{"suite":"tensor","metric":"matmul_gflops","value":..,"unit":"GFLOP/s"}`),
//! and the spread of each measurement on stderr. Metrics:
//!
//! - `matmul_gflops`: CPU f32 `[N, N] x [N, N]` (default N = 1024), median of REPS (default 7);
//! - `matmul_f64_gflops`: the same in f64;
//! - `matmul_floor_gflops`: the floor, a plain `i-k-j` triple loop on f32 at
//!   N = 256 (what the compiler makes of the obvious code);
//! - `cuda_matmul_gflops`: with the `cuda` feature and a GPU, cuBLAS f32 at N = 4096.
//!
//! GFLOP/s counts `2 N^3` floating-point operations per product.

use std::time::Instant;

use monarch_tensor::{DType, Device, Tensor};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(metric: &str, samples: Vec<f64>) {
    let (min, max) = (
        samples.iter().copied().fold(f64::INFINITY, f64::min),
        samples.iter().copied().fold(0.0, f64::max),
    );
    let med = median(samples);
    eprintln!("{metric}: median {med:.2} GFLOP/s (min {min:.2}, max {max:.2})");
    println!(
        "{{\"suite\":\"tensor\",\"metric\":\"{metric}\",\"value\":{med:.3},\"unit\":\"GFLOP/s\"}}"
    );
}

/// GFLOP/s of `reps` timed products of random `n x n` matrices after one warm-up.
fn measure(n: usize, reps: usize, dtype: DType, device: Device) -> Result<Vec<f64>, String> {
    let a =
        Tensor::rand_uniform(&[n, n], -1.0, 1.0, 1, dtype, device).map_err(|e| e.to_string())?;
    let b =
        Tensor::rand_uniform(&[n, n], -1.0, 1.0, 2, dtype, device).map_err(|e| e.to_string())?;
    let flops = 2.0 * (n as f64).powi(3);
    let run = || -> Result<f64, String> {
        let start = Instant::now();
        let c = a.matmul(&b).map_err(|e| e.to_string())?;
        // Reading one element waits for a device's queued work; free on the CPU.
        c.narrow(0, 0, 1)
            .and_then(|r| r.narrow(1, 0, 1))
            .and_then(|e| e.to_scalar())
            .map_err(|e| e.to_string())?;
        Ok(flops / start.elapsed().as_secs_f64() / 1e9)
    };
    run()?;
    (0..reps).map(|_| run()).collect()
}

fn naive_floor(n: usize, reps: usize) -> Vec<f64> {
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let flops = 2.0 * (n as f64).powi(3);
    let mut samples = Vec::new();
    for rep in 0..=reps {
        let start = Instant::now();
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
            samples.push(flops / start.elapsed().as_secs_f64() / 1e9);
        }
    }
    samples
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let n: usize = match args.next() {
        Some(s) => s
            .parse()
            .map_err(|_| format!("N must be a number, got {s:?}"))?,
        None => 1024,
    };
    let reps: usize = match args.next() {
        Some(s) => s
            .parse()
            .map_err(|_| format!("REPS must be a number, got {s:?}"))?,
        None => 7,
    };
    if n == 0 || reps == 0 {
        return Err("N and REPS must be positive".into());
    }
    eprintln!("CPU matmul, N = {n}, {reps} repetitions after one warm-up");
    report("matmul_gflops", measure(n, reps, DType::F32, Device::Cpu)?);
    report(
        "matmul_f64_gflops",
        measure(n, reps, DType::F64, Device::Cpu)?,
    );
    report("matmul_floor_gflops", naive_floor(256, reps));
    match monarch_tensor::cuda_device_count() {
        Ok(count) if count > 0 => {
            eprintln!("CUDA matmul on cuda:0, N = 4096");
            report(
                "cuda_matmul_gflops",
                measure(4096, reps, DType::F32, Device::Cuda(0))?,
            );
        }
        Ok(_) => eprintln!("no CUDA device: cuda_matmul_gflops not measured"),
        Err(e) => eprintln!("cuda_matmul_gflops not measured: {e}"),
    }
    Ok(())
}
