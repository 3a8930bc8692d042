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

use monarch_tensor::throughput::{matmul_gflops, naive_matmul_gflops};
use monarch_tensor::{DType, Device};

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
    report(
        "matmul_gflops",
        matmul_gflops(n, reps, 1, DType::F32, Device::Cpu)?,
    );
    report(
        "matmul_f64_gflops",
        matmul_gflops(n, reps, 1, DType::F64, Device::Cpu)?,
    );
    report("matmul_floor_gflops", naive_matmul_gflops(256, reps));
    match monarch_tensor::cuda_device_count() {
        Ok(count) if count > 0 => {
            eprintln!("CUDA matmul on cuda:0, N = 4096");
            report(
                "cuda_matmul_gflops",
                matmul_gflops(4096, reps, 1, DType::F32, Device::Cuda(0))?,
            );
        }
        Ok(_) => eprintln!("no CUDA device: cuda_matmul_gflops not measured"),
        Err(e) => eprintln!("cuda_matmul_gflops not measured: {e}"),
    }
    Ok(())
}
