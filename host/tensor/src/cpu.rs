//! The CPU backend: storage in a `Vec` per dtype, kernels as plain loops.
//!
//! Elementwise loops are written so the compiler vectorizes them (one pass,
//! no per-element dispatch). Matrix multiplication of floats goes to
//! `matrixmultiply`'s sgemm/dgemm; i64 matmul is a cache-friendly `i-k-j` loop.
//! The tensor layer checks shapes, dtypes and devices before calling in here;
//! these functions still return errors instead of panicking when handed
//! mismatched storages.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::{BinaryOp, UnaryOp};

/// Contiguous row-major host storage of one dtype.
///
/// `pub` only so that the sealed [`Element`] trait may name it; the module is
/// private, so no code outside the crate can reach it.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
}

/// A `Vec` with room for `n` elements, or [`Error::OutOfMemory`] instead of an abort.
pub(crate) fn try_alloc<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })?;
    Ok(v)
}

fn try_filled<T: Copy>(n: usize, value: T) -> Result<Vec<T>> {
    let mut v = try_alloc(n)?;
    v.resize(n, value);
    Ok(v)
}

fn bytes_of<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: f32, f64 and i64 have no padding and no invalid bytes; the
    // returned slice covers exactly the same memory and borrows `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_of_mut<T: Element>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; in addition every bit pattern is a valid f32,
    // f64 or i64, so writing arbitrary bytes cannot create an invalid value.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Arithmetic the kernels need, per element type.
pub(crate) trait Num: Element {
    /// Type that sums are accumulated in: f64 for floats (f32 sums lose far
    /// less precision that way), wrapping i64 for i64.
    type Acc: Copy;
    const ZERO: Self;
    const ONE: Self;
    fn add(a: Self, b: Self) -> Self;
    fn sub(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    /// Integer division by zero must be ruled out before calling.
    fn div(a: Self, b: Self) -> Self;
    fn is_zero(self) -> bool;
    fn neg(a: Self) -> Self;
    fn relu(a: Self) -> Self;
    /// The scalar `value` as this type, or [`Error::InvalidScalar`].
    fn from_scalar(op: &'static str, value: f64) -> Result<Self>;
    fn acc_zero() -> Self::Acc;
    fn acc_add(acc: Self::Acc, x: Self) -> Self::Acc;
    fn acc_finish(acc: Self::Acc) -> Self;
    /// `c = a * b` for row-major `a: [m, k]`, `b: [k, n]`, `c: [m, n]` (zeroed), all dims nonzero.
    fn matmul(m: usize, k: usize, n: usize, a: &[Self], b: &[Self], c: &mut [Self]);
}

/// Operations defined for floats only.
pub(crate) trait Float: Num {
    fn exp(a: Self) -> Self;
    fn acc_mean(acc: Self::Acc, count: usize) -> Self;
}

macro_rules! float_num {
    ($t:ty, $gemm:path) => {
        impl Num for $t {
            type Acc = f64;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            fn sub(a: Self, b: Self) -> Self {
                a - b
            }
            fn mul(a: Self, b: Self) -> Self {
                a * b
            }
            fn div(a: Self, b: Self) -> Self {
                a / b
            }
            fn is_zero(self) -> bool {
                self == 0.0
            }
            fn neg(a: Self) -> Self {
                -a
            }
            fn relu(a: Self) -> Self {
                // NaN stays NaN, as in PyTorch.
                if a < 0.0 { 0.0 } else { a }
            }
            fn from_scalar(_op: &'static str, value: f64) -> Result<Self> {
                Ok(value as $t)
            }
            fn acc_zero() -> f64 {
                0.0
            }
            fn acc_add(acc: f64, x: Self) -> f64 {
                acc + x as f64
            }
            fn acc_finish(acc: f64) -> Self {
                acc as $t
            }
            fn matmul(m: usize, k: usize, n: usize, a: &[Self], b: &[Self], c: &mut [Self]) {
                // Guard the unsafe call's contract here, not only in the caller.
                let fits = a.len() >= m * k && b.len() >= k * n && c.len() >= m * n;
                if !fits {
                    return;
                }
                // SAFETY: the slices hold at least m*k, k*n and m*n elements
                // (checked above), the strides describe row-major matrices of
                // those sizes, and `c` does not alias `a` or `b` (&mut).
                unsafe {
                    $gemm(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        k as isize,
                        1,
                        b.as_ptr(),
                        n as isize,
                        1,
                        0.0,
                        c.as_mut_ptr(),
                        n as isize,
                        1,
                    );
                }
            }
        }
        impl Float for $t {
            fn exp(a: Self) -> Self {
                a.exp()
            }
            fn acc_mean(acc: f64, count: usize) -> Self {
                (acc / count as f64) as $t
            }
        }
    };
}

float_num!(f32, matrixmultiply::sgemm);
float_num!(f64, matrixmultiply::dgemm);

impl Num for i64 {
    type Acc = i64;
    const ZERO: Self = 0;
    const ONE: Self = 1;
    fn add(a: Self, b: Self) -> Self {
        a.wrapping_add(b)
    }
    fn sub(a: Self, b: Self) -> Self {
        a.wrapping_sub(b)
    }
    fn mul(a: Self, b: Self) -> Self {
        a.wrapping_mul(b)
    }
    fn div(a: Self, b: Self) -> Self {
        // `checked_div` is None only for b == 0 (ruled out by the caller) and
        // MIN / -1, whose wrapped result is MIN.
        a.checked_div(b).unwrap_or(a.wrapping_neg())
    }
    fn is_zero(self) -> bool {
        self == 0
    }
    fn neg(a: Self) -> Self {
        a.wrapping_neg()
    }
    fn relu(a: Self) -> Self {
        a.max(0)
    }
    fn from_scalar(op: &'static str, value: f64) -> Result<Self> {
        // 2^63 is exactly representable; i64 covers [-2^63, 2^63).
        const LIMIT: f64 = 9_223_372_036_854_775_808.0;
        if value.fract() == 0.0 && (-LIMIT..LIMIT).contains(&value) {
            Ok(value as i64)
        } else {
            Err(Error::InvalidScalar {
                op,
                value,
                dtype: DType::I64,
            })
        }
    }
    fn acc_zero() -> i64 {
        0
    }
    fn acc_add(acc: i64, x: Self) -> i64 {
        acc.wrapping_add(x)
    }
    fn acc_finish(acc: i64) -> Self {
        acc
    }
    fn matmul(m: usize, k: usize, n: usize, a: &[Self], b: &[Self], c: &mut [Self]) {
        for (a_row, c_row) in a.chunks_exact(k).zip(c.chunks_exact_mut(n)).take(m) {
            for (&a_ip, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
                for (c_ij, &b_pj) in c_row.iter_mut().zip(b_row) {
                    *c_ij = c_ij.wrapping_add(a_ip.wrapping_mul(b_pj));
                }
            }
        }
    }
}

/// Runs `$body` with `$v` bound to the typed vector of `$s`, wrapping the
/// resulting vector back into the same variant.
macro_rules! map_storage {
    ($s:expr, |$v:ident| $body:expr) => {
        match $s {
            CpuStorage::F32($v) => CpuStorage::F32($body),
            CpuStorage::F64($v) => CpuStorage::F64($body),
            CpuStorage::I64($v) => CpuStorage::I64($body),
        }
    };
}

/// Like `map_storage!` for two storages that must share a dtype.
macro_rules! map_pair {
    ($op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            (CpuStorage::F32($x), CpuStorage::F32($y)) => CpuStorage::F32($body),
            (CpuStorage::F64($x), CpuStorage::F64($y)) => CpuStorage::F64($body),
            (CpuStorage::I64($x), CpuStorage::I64($y)) => CpuStorage::I64($body),
            (x, y) => {
                return Err(Error::DTypeMismatch {
                    op: $op,
                    lhs: x.dtype(),
                    rhs: y.dtype(),
                });
            }
        }
    };
}

fn float_only(op: &'static str, dtype: DType) -> Error {
    Error::UnsupportedDType {
        op,
        dtype,
        needs: "a float dtype (f32 or f64)",
    }
}

impl CpuStorage {
    pub(crate) fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::I64(_) => DType::I64,
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            CpuStorage::F32(v) => bytes_of(v),
            CpuStorage::F64(v) => bytes_of(v),
            CpuStorage::I64(v) => bytes_of(v),
        }
    }

    pub(crate) fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            CpuStorage::F32(v) => bytes_of_mut(v),
            CpuStorage::F64(v) => bytes_of_mut(v),
            CpuStorage::I64(v) => bytes_of_mut(v),
        }
    }

    pub(crate) fn try_clone(&self) -> Result<CpuStorage> {
        Ok(map_storage!(self, |v| {
            let mut out = try_alloc(v.len())?;
            out.extend_from_slice(v);
            out
        }))
    }

    pub(crate) fn zeros(dtype: DType, n: usize) -> Result<CpuStorage> {
        CpuStorage::full(dtype, n, 0.0)
    }

    /// `n` copies of `value`; for i64 the value must be a whole number in range.
    pub(crate) fn full(dtype: DType, n: usize, value: f64) -> Result<CpuStorage> {
        Ok(match dtype {
            DType::F32 => CpuStorage::F32(try_filled(n, f32::from_scalar("full", value)?)?),
            DType::F64 => CpuStorage::F64(try_filled(n, f64::from_scalar("full", value)?)?),
            DType::I64 => CpuStorage::I64(try_filled(n, i64::from_scalar("full", value)?)?),
        })
    }

    /// Storage whose bytes are `bytes`; the caller checked the length is a
    /// multiple of the dtype size. Storage is little-endian (see lib.rs), so
    /// this is one copy.
    pub(crate) fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Result<CpuStorage> {
        let mut s = CpuStorage::zeros(dtype, bytes.len() / dtype.size_of())?;
        let dst = s.as_bytes_mut();
        if dst.len() != bytes.len() {
            return Err(Error::ByteLength {
                len: bytes.len(),
                expected: dst.len(),
                shape: crate::Shape::scalar(),
                dtype,
            });
        }
        dst.copy_from_slice(bytes);
        Ok(s)
    }

    pub(crate) fn to_le_bytes(&self) -> Result<Vec<u8>> {
        let src = self.as_bytes();
        let mut out = try_alloc(src.len())?;
        out.extend_from_slice(src);
        Ok(out)
    }

    /// Element `i` as f64 (i64 beyond 2^53 rounds).
    pub(crate) fn get_f64(&self, i: usize) -> Option<f64> {
        match self {
            CpuStorage::F32(v) => v.get(i).map(|&x| x as f64),
            CpuStorage::F64(v) => v.get(i).copied(),
            CpuStorage::I64(v) => v.get(i).map(|&x| x as f64),
        }
    }
}

fn zip_map<T: Copy>(a: &[T], b: &[T], f: impl Fn(T, T) -> T) -> Result<Vec<T>> {
    let mut out = try_alloc(a.len())?;
    out.extend(a.iter().zip(b).map(|(&x, &y)| f(x, y)));
    Ok(out)
}

fn map<T: Copy>(a: &[T], f: impl Fn(T) -> T) -> Result<Vec<T>> {
    let mut out = try_alloc(a.len())?;
    out.extend(a.iter().map(|&x| f(x)));
    Ok(out)
}

fn binary_typed<T: Num>(op: BinaryOp, a: &[T], b: &[T]) -> Result<Vec<T>> {
    match op {
        BinaryOp::Add => zip_map(a, b, T::add),
        BinaryOp::Sub => zip_map(a, b, T::sub),
        BinaryOp::Mul => zip_map(a, b, T::mul),
        BinaryOp::Div => {
            if T::DTYPE == DType::I64 && b.iter().any(|&y| y.is_zero()) {
                return Err(Error::DivisionByZero { op: "div" });
            }
            zip_map(a, b, T::div)
        }
    }
}

fn binary_scalar_typed<T: Num>(op: BinaryOp, a: &[T], scalar: f64) -> Result<Vec<T>> {
    let s = T::from_scalar(op.scalar_name(), scalar)?;
    match op {
        BinaryOp::Add => map(a, |x| T::add(x, s)),
        BinaryOp::Sub => map(a, |x| T::sub(x, s)),
        BinaryOp::Mul => map(a, |x| T::mul(x, s)),
        BinaryOp::Div => {
            if T::DTYPE == DType::I64 && s.is_zero() {
                return Err(Error::DivisionByZero { op: "div_scalar" });
            }
            map(a, |x| T::div(x, s))
        }
    }
}

/// `a op b`, elementwise; equal lengths.
pub(crate) fn binary(op: BinaryOp, a: &CpuStorage, b: &CpuStorage) -> Result<CpuStorage> {
    Ok(map_pair!(op.name(), a, b, |x, y| binary_typed(op, x, y)?))
}

/// `a op scalar`, elementwise.
pub(crate) fn binary_scalar(op: BinaryOp, a: &CpuStorage, scalar: f64) -> Result<CpuStorage> {
    Ok(map_storage!(a, |v| binary_scalar_typed(op, v, scalar)?))
}

pub(crate) fn unary(op: UnaryOp, a: &CpuStorage) -> Result<CpuStorage> {
    Ok(match (op, a) {
        (UnaryOp::Neg, s) => map_storage!(s, |v| map(v, Num::neg)?),
        (UnaryOp::Relu, s) => map_storage!(s, |v| map(v, Num::relu)?),
        (UnaryOp::Exp, CpuStorage::F32(v)) => CpuStorage::F32(map(v, Float::exp)?),
        (UnaryOp::Exp, CpuStorage::F64(v)) => CpuStorage::F64(map(v, Float::exp)?),
        (UnaryOp::Exp, s) => return Err(float_only("exp", s.dtype())),
    })
}

fn axpy_typed<T: Num>(y: &mut [T], alpha: f64, x: &[T]) -> Result<()> {
    let a = T::from_scalar("axpy", alpha)?;
    if a == T::ONE {
        // Exactly `y + x`, and lets the loop skip the multiply.
        y.iter_mut().zip(x).for_each(|(y, &x)| *y = T::add(*y, x));
    } else {
        y.iter_mut()
            .zip(x)
            .for_each(|(y, &x)| *y = T::add(*y, T::mul(a, x)));
    }
    Ok(())
}

/// `y += alpha * x` in place; equal lengths.
pub(crate) fn axpy(y: &mut CpuStorage, alpha: f64, x: &CpuStorage) -> Result<()> {
    match (y, x) {
        (CpuStorage::F32(y), CpuStorage::F32(x)) => axpy_typed(y, alpha, x),
        (CpuStorage::F64(y), CpuStorage::F64(x)) => axpy_typed(y, alpha, x),
        (CpuStorage::I64(y), CpuStorage::I64(x)) => axpy_typed(y, alpha, x),
        (y, x) => Err(Error::DTypeMismatch {
            op: "axpy",
            lhs: y.dtype(),
            rhs: x.dtype(),
        }),
    }
}

fn scale_typed<T: Num>(y: &mut [T], alpha: f64) -> Result<()> {
    let a = T::from_scalar("scale_assign", alpha)?;
    y.iter_mut().for_each(|y| *y = T::mul(*y, a));
    Ok(())
}

/// `y *= alpha` in place.
pub(crate) fn scale(y: &mut CpuStorage, alpha: f64) -> Result<()> {
    match y {
        CpuStorage::F32(y) => scale_typed(y, alpha),
        CpuStorage::F64(y) => scale_typed(y, alpha),
        CpuStorage::I64(y) => scale_typed(y, alpha),
    }
}

fn matmul_typed<T: Num>(a: &[T], b: &[T], m: usize, k: usize, n: usize) -> Result<Vec<T>> {
    let mut c = try_filled(m * n, T::ZERO)?;
    if m > 0 && k > 0 && n > 0 {
        T::matmul(m, k, n, a, b, &mut c);
    }
    Ok(c)
}

/// `[m, k] x [k, n] -> [m, n]`, row-major.
pub(crate) fn matmul(
    a: &CpuStorage,
    b: &CpuStorage,
    m: usize,
    k: usize,
    n: usize,
) -> Result<CpuStorage> {
    Ok(map_pair!("matmul", a, b, |x, y| matmul_typed(
        x, y, m, k, n
    )?))
}

fn reduce_dim_typed<T: Num>(
    a: &[T],
    outer: usize,
    d: usize,
    inner: usize,
    finish: impl Fn(T::Acc) -> T,
) -> Result<Vec<T>> {
    let mut acc = try_filled(outer * inner, T::acc_zero())?;
    if inner == 1 && d > 0 {
        // Summing contiguous rows (the last dimension, or everything): one fold each.
        for (s, row) in acc.iter_mut().zip(a.chunks_exact(d)) {
            *s = row.iter().fold(T::acc_zero(), |s, &x| T::acc_add(s, x));
        }
        let mut out = try_alloc(acc.len())?;
        out.extend(acc.into_iter().map(finish));
        return Ok(out);
    }
    for (o, acc_row) in acc.chunks_exact_mut(inner.max(1)).enumerate().take(outer) {
        for j in 0..d {
            let start = (o * d + j) * inner;
            for (s, &x) in acc_row.iter_mut().zip(&a[start..start + inner]) {
                *s = T::acc_add(*s, x);
            }
        }
    }
    let mut out = try_alloc(acc.len())?;
    out.extend(acc.into_iter().map(finish));
    Ok(out)
}

/// Sum over the middle dimension of `a` seen as `[outer, d, inner]`, giving
/// `[outer, inner]`; with `mean`, divided by `d` (floats only). The whole
/// tensor is the case `outer = inner = 1`.
pub(crate) fn reduce_dim(
    a: &CpuStorage,
    outer: usize,
    d: usize,
    inner: usize,
    mean: bool,
) -> Result<CpuStorage> {
    Ok(match (a, mean) {
        (s, false) => map_storage!(s, |v| reduce_dim_typed(
            v,
            outer,
            d,
            inner,
            Num::acc_finish
        )?),
        (CpuStorage::F32(v), true) => CpuStorage::F32(reduce_dim_typed(v, outer, d, inner, |s| {
            f32::acc_mean(s, d)
        })?),
        (CpuStorage::F64(v), true) => CpuStorage::F64(reduce_dim_typed(v, outer, d, inner, |s| {
            f64::acc_mean(s, d)
        })?),
        (s, true) => return Err(float_only("mean", s.dtype())),
    })
}

fn narrow_typed<T: Copy>(
    a: &[T],
    outer: usize,
    d: usize,
    inner: usize,
    start: usize,
    len: usize,
) -> Result<Vec<T>> {
    let mut out = try_alloc(outer * len * inner)?;
    for o in 0..outer {
        let from = (o * d + start) * inner;
        out.extend_from_slice(&a[from..from + len * inner]);
    }
    Ok(out)
}

/// Indices `start..start + len` of the middle dimension of `a` seen as `[outer, d, inner]`.
pub(crate) fn narrow(
    a: &CpuStorage,
    outer: usize,
    d: usize,
    inner: usize,
    start: usize,
    len: usize,
) -> Result<CpuStorage> {
    Ok(map_storage!(a, |v| narrow_typed(
        v, outer, d, inner, start, len
    )?))
}

fn cat_typed<T: Element>(
    parts: &[(&CpuStorage, usize)],
    outer: usize,
    inner: usize,
    total: usize,
) -> Result<Vec<T>> {
    let mut out = try_alloc(outer * total * inner)?;
    let mut typed = Vec::with_capacity(parts.len());
    for (s, len) in parts {
        let v = T::slice(s).ok_or(Error::DTypeMismatch {
            op: "cat",
            lhs: T::DTYPE,
            rhs: s.dtype(),
        })?;
        typed.push((v, len * inner));
    }
    for o in 0..outer {
        for (v, chunk) in &typed {
            out.extend_from_slice(&v[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(out)
}

/// Concatenation along the middle dimension: part `p` is `[outer, len_p, inner]`,
/// the result `[outer, total, inner]` with `total = sum(len_p)`.
pub(crate) fn cat(
    parts: &[(&CpuStorage, usize)],
    outer: usize,
    inner: usize,
    total: usize,
) -> Result<CpuStorage> {
    let Some((first, _)) = parts.first() else {
        return Err(Error::EmptyCat);
    };
    Ok(match first.dtype() {
        DType::F32 => CpuStorage::F32(cat_typed(parts, outer, inner, total)?),
        DType::F64 => CpuStorage::F64(cat_typed(parts, outer, inner, total)?),
        DType::I64 => CpuStorage::I64(cat_typed(parts, outer, inner, total)?),
    })
}

fn transpose_typed<T: Num>(a: &[T], rows: usize, cols: usize) -> Result<Vec<T>> {
    const TILE: usize = 32;
    let mut out = try_filled(rows * cols, T::ZERO)?;
    for i0 in (0..rows).step_by(TILE) {
        for j0 in (0..cols).step_by(TILE) {
            for i in i0..(i0 + TILE).min(rows) {
                for j in j0..(j0 + TILE).min(cols) {
                    out[j * rows + i] = a[i * cols + j];
                }
            }
        }
    }
    Ok(out)
}

/// `[rows, cols] -> [cols, rows]`.
pub(crate) fn transpose(a: &CpuStorage, rows: usize, cols: usize) -> Result<CpuStorage> {
    Ok(map_storage!(a, |v| transpose_typed(v, rows, cols)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i64_wrapping_and_division_rules() {
        assert_eq!(i64::div(i64::MIN, -1), i64::MIN);
        assert_eq!(i64::div(-7, 2), -3);
        assert_eq!(i64::add(i64::MAX, 1), i64::MIN);
        assert_eq!(i64::from_scalar("t", 3.0).unwrap(), 3);
        assert!(i64::from_scalar("t", 0.5).is_err());
        assert!(i64::from_scalar("t", 9.3e18).is_err());
        assert!(i64::from_scalar("t", f64::NAN).is_err());
        assert_eq!(
            i64::from_scalar("t", -9_223_372_036_854_775_808.0).unwrap(),
            i64::MIN
        );
    }

    #[test]
    fn mismatched_storages_are_errors_not_panics() {
        let a = CpuStorage::F32(vec![1.0]);
        let b = CpuStorage::I64(vec![1]);
        assert!(matches!(
            binary(BinaryOp::Add, &a, &b),
            Err(Error::DTypeMismatch { .. })
        ));
        let mut y = a.clone();
        assert!(axpy(&mut y, 1.0, &b).is_err());
        assert!(matmul(&a, &b, 1, 1, 1).is_err());
        assert!(cat(&[(&a, 1), (&b, 1)], 1, 1, 2).is_err());
    }

    #[test]
    fn relu_keeps_nan() {
        assert!(f32::relu(f32::NAN).is_nan());
        assert_eq!(f64::relu(-2.0), 0.0);
        assert_eq!(i64::relu(-2), 0);
    }
}
