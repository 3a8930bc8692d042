//! The CUDA C source of the elementwise, reduction and layout kernels.
//!
//! The source is generated here, once per process, from one template per
//! kernel family instantiated for each dtype, so kernel names on both sides
//! come from [`kernel_name`] and cannot drift apart. NVRTC compiles it (see `super::nvrtc`, whose test compiles it
//! without a GPU wherever libnvrtc is found).
//!
//! Conventions shared by every kernel:
//! - element counts and indices are `u64` (`unsigned long long`); Rust passes `u64`;
//! - every elementwise kernel is a grid-stride loop, so any grid size is correct;
//! - the reduction kernels assume `blockDim.x == BLOCK` (256);
//! - i64 arithmetic wraps, computed through `u64` because signed overflow is
//!   undefined in C++, matching the CPU backend's `wrapping_*`;
//! - float sums accumulate in double, matching the CPU backend.

use crate::DType;
use crate::ops::{BinaryOp, UnaryOp};

/// Threads per block for every launch; the reduction kernels rely on it.
pub(crate) const BLOCK: u32 = 256;

/// The C type of each dtype's elements and of its sums.
fn c_types(dtype: DType) -> (&'static str, &'static str) {
    match dtype {
        DType::F32 => ("float", "double"),
        DType::F64 => ("double", "double"),
        DType::I64 => ("i64", "i64"),
    }
}

/// The name of the kernel `stem` for `dtype`, for example `binary_add_f32`.
pub(crate) fn kernel_name(stem: &str, dtype: DType) -> String {
    format!("{stem}_{}", dtype.name())
}

const PRELUDE: &str = r#"
typedef unsigned long long u64;
typedef long long i64;

#define BLOCK 256
#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)blockDim.x * gridDim.x)

template <typename T> __device__ __forceinline__ T op_add(T a, T b) { return a + b; }
template <typename T> __device__ __forceinline__ T op_sub(T a, T b) { return a - b; }
template <typename T> __device__ __forceinline__ T op_mul(T a, T b) { return a * b; }
template <typename T> __device__ __forceinline__ T op_div(T a, T b) { return a / b; }
template <typename T> __device__ __forceinline__ T op_neg(T a) { return -a; }
/* NaN < 0 is false, so relu keeps NaN, as on the CPU. */
template <typename T> __device__ __forceinline__ T op_relu(T a) { return a < (T)0 ? (T)0 : a; }

template <> __device__ __forceinline__ i64 op_add<i64>(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
template <> __device__ __forceinline__ i64 op_sub<i64>(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
template <> __device__ __forceinline__ i64 op_mul<i64>(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
/* Truncating; MIN / -1 wraps to MIN. Callers rule out b == 0. */
template <> __device__ __forceinline__ i64 op_div<i64>(i64 a, i64 b) { return b == -1 ? (i64)(0ull - (u64)a) : a / b; }
template <> __device__ __forceinline__ i64 op_neg<i64>(i64 a) { return (i64)(0ull - (u64)a); }

__device__ __forceinline__ float op_exp(float a) { return expf(a); }
__device__ __forceinline__ double op_exp(double a) { return exp(a); }

__device__ __forceinline__ double acc_add(double s, float x) { return s + (double)x; }
__device__ __forceinline__ double acc_add(double s, double x) { return s + x; }
__device__ __forceinline__ i64 acc_add(i64 s, i64 x) { return op_add<i64>(s, x); }

__device__ __forceinline__ float acc_finish(double s, double divisor, float) { return (float)(s / divisor); }
__device__ __forceinline__ double acc_finish(double s, double divisor, double) { return s / divisor; }
__device__ __forceinline__ i64 acc_finish(i64 s, double, i64) { return s; }

/* Sum of v over the block; every thread gets the result. blockDim.x == BLOCK. */
template <typename A> __device__ A block_sum(A v) {
    __shared__ A buf[BLOCK];
    buf[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] = acc_add(buf[threadIdx.x], buf[threadIdx.x + s]);
        __syncthreads();
    }
    A r = buf[0];
    __syncthreads();
    return r;
}
"#;

/// Instantiates `template` for one dtype: `$T` is the element type, `$A` the
/// sum type, `$t` the dtype name.
fn instantiate(template: &str, dtype: DType) -> String {
    let (t, a) = c_types(dtype);
    template
        .replace("$T", t)
        .replace("$A", a)
        .replace("$t", dtype.name())
}

/// Kernels every dtype has. `@` stands for the op name where a template is
/// stamped once per op.
const BINARY: &str = r#"
extern "C" __global__ void binary_@_$t(const $T* a, const $T* b, $T* out, u64 n) {
    GRID_STRIDE(i, n) out[i] = op_@<$T>(a[i], b[i]);
}
extern "C" __global__ void scalar_@_$t(const $T* a, $T s, $T* out, u64 n) {
    GRID_STRIDE(i, n) out[i] = op_@<$T>(a[i], s);
}
"#;

const FLOAT_DIV: &str = r#"
extern "C" __global__ void binary_div_$t(const $T* a, const $T* b, $T* out, u64 n) {
    GRID_STRIDE(i, n) out[i] = a[i] / b[i];
}
extern "C" __global__ void scalar_div_$t(const $T* a, $T s, $T* out, u64 n) {
    GRID_STRIDE(i, n) out[i] = a[i] / s;
}
"#;

/// Integer division reports a zero divisor through `err` instead of
/// computing garbage; the host checks the flag after the launch.
const INT_DIV: &str = r#"
extern "C" __global__ void binary_div_$t(const $T* a, const $T* b, $T* out, u64 n, int* err) {
    GRID_STRIDE(i, n) {
        if (b[i] == 0) { *err = 1; out[i] = 0; }
        else out[i] = op_div<$T>(a[i], b[i]);
    }
}
extern "C" __global__ void scalar_div_$t(const $T* a, $T s, $T* out, u64 n) {
    GRID_STRIDE(i, n) out[i] = op_div<$T>(a[i], s);
}
"#;

const UNARY: &str = r#"
extern "C" __global__ void unary_@_$t(const $T* a, $T* out, u64 n) {
    GRID_STRIDE(i, n) out[i] = op_@(a[i]);
}
"#;

const COMMON: &str = r#"
extern "C" __global__ void fill_$t($T* out, $T v, u64 n) {
    GRID_STRIDE(i, n) out[i] = v;
}
extern "C" __global__ void axpy_$t($T* y, const $T* x, $T alpha, u64 n) {
    GRID_STRIDE(i, n) y[i] = op_add<$T>(y[i], op_mul<$T>(alpha, x[i]));
}
extern "C" __global__ void scale_$t($T* y, $T alpha, u64 n) {
    GRID_STRIDE(i, n) y[i] = op_mul<$T>(y[i], alpha);
}
/* Pass 1 of a full sum: one partial sum per block. */
extern "C" __global__ void sum_partial_$t(const $T* in, $A* partial, u64 n) {
    $A s = 0;
    GRID_STRIDE(i, n) s = acc_add(s, in[i]);
    s = block_sum<$A>(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
/* Pass 2, one block: out[0] = sum(partial) / divisor (divisor ignored for i64). */
extern "C" __global__ void sum_final_$t(const $A* partial, $T* out, u64 n, double divisor) {
    $A s = 0;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) s = acc_add(s, partial[i]);
    s = block_sum<$A>(s);
    if (threadIdx.x == 0) out[0] = acc_finish(s, divisor, ($T)0);
}
/* in is [outer, d, inner]; out[o, i] = sum_j in[o, j, i] / divisor. */
extern "C" __global__ void reduce_dim_$t(const $T* in, $T* out, u64 outer, u64 d, u64 inner, double divisor) {
    GRID_STRIDE(idx, outer * inner) {
        u64 o = idx / inner, i = idx % inner;
        $A s = 0;
        for (u64 j = 0; j < d; ++j) s = acc_add(s, in[(o * d + j) * inner + i]);
        out[idx] = acc_finish(s, divisor, ($T)0);
    }
}
/* in is [outer, d, inner]; out is [outer, len, inner] = in[:, start:start+len, :]. */
extern "C" __global__ void narrow_$t(const $T* in, $T* out, u64 outer, u64 d, u64 start, u64 len, u64 inner) {
    u64 chunk = len * inner;
    GRID_STRIDE(idx, outer * chunk) {
        u64 o = idx / chunk, r = idx % chunk;
        out[idx] = in[(o * d + start) * inner + r];
    }
}
/* in is [outer, len, inner]; writes it to out[:, offset:offset+len, :] of out [outer, d_out, inner]. */
extern "C" __global__ void place_$t(const $T* in, $T* out, u64 outer, u64 len, u64 d_out, u64 offset, u64 inner) {
    u64 chunk = len * inner;
    GRID_STRIDE(idx, outer * chunk) {
        u64 o = idx / chunk, r = idx % chunk;
        out[(o * d_out + offset) * inner + r] = in[idx];
    }
}
/* in is [rows, cols]; out is [cols, rows]. */
extern "C" __global__ void transpose_$t(const $T* in, $T* out, u64 rows, u64 cols) {
    GRID_STRIDE(idx, rows * cols) {
        u64 j = idx / rows, i = idx % rows;
        out[idx] = in[i * cols + j];
    }
}
"#;

/// i64 has no cuBLAS routine: one thread per output element.
const MATMUL_I64: &str = r#"
extern "C" __global__ void matmul_i64(const i64* a, const i64* b, i64* c, u64 m, u64 k, u64 n) {
    GRID_STRIDE(idx, m * n) {
        u64 row = idx / n, col = idx % n;
        i64 s = 0;
        for (u64 p = 0; p < k; ++p) s = op_add<i64>(s, op_mul<i64>(a[row * k + p], b[p * n + col]));
        c[idx] = s;
    }
}
"#;

/// The whole module's source and the names of every kernel in it.
pub(crate) fn source() -> (String, Vec<String>) {
    let mut src = String::from(PRELUDE);
    let mut names = Vec::new();
    for dtype in DType::ALL {
        for op in BinaryOp::ALL {
            if op != BinaryOp::Div {
                src.push_str(&instantiate(&BINARY.replace('@', op.name()), dtype));
            }
            names.push(kernel_name(&format!("binary_{}", op.name()), dtype));
            names.push(kernel_name(&format!("scalar_{}", op.name()), dtype));
        }
        let div = if dtype.is_float() { FLOAT_DIV } else { INT_DIV };
        src.push_str(&instantiate(div, dtype));
        for op in UnaryOp::ALL {
            if op.float_only() && !dtype.is_float() {
                continue;
            }
            src.push_str(&instantiate(&UNARY.replace('@', op.name()), dtype));
            names.push(kernel_name(&format!("unary_{}", op.name()), dtype));
        }
        src.push_str(&instantiate(COMMON, dtype));
        for stem in [
            "fill",
            "axpy",
            "scale",
            "sum_partial",
            "sum_final",
            "reduce_dim",
            "narrow",
            "place",
            "transpose",
        ] {
            names.push(kernel_name(stem, dtype));
        }
    }
    src.push_str(MATMUL_I64);
    names.push(kernel_name("matmul", DType::I64));
    (src, names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_kernel_is_defined_once() {
        let (src, names) = source();
        for name in &names {
            let decl = format!("void {name}(");
            assert_eq!(src.matches(&decl).count(), 1, "kernel {name}");
        }
        // And nothing is defined that the host does not know about.
        assert_eq!(src.matches("__global__").count(), names.len());
        assert!(!src.contains('$') && !src.contains('@'));
    }
}
