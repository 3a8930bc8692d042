//! Element types.
//!
//! A [`DType`] names what one element of a tensor is; [`Element`] is the Rust
//! type behind each dtype (`f32`, `f64`, `i64`). The trait is sealed: the
//! backends have a kernel for every dtype, so the set is closed.

use std::fmt;
use std::str::FromStr;

use crate::cpu::CpuStorage;
use crate::error::{Error, Result};

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE 754 float.
    F32,
    /// 64-bit IEEE 754 float.
    F64,
    /// 64-bit two's complement integer; arithmetic wraps on overflow.
    I64,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 3] = [DType::F32, DType::F64, DType::I64];

    /// Bytes per element.
    pub const fn size_of(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// The lower-case name used in strings and on the wire: `f32`, `f64`, `i64`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I64 => "i64",
        }
    }

    /// Whether the dtype is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Parses `f32`, `f64`, `i64` and the aliases `float32`, `float64`,
    /// `int64` (also `float`, `double`, `long`), case-insensitively.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Ok(DType::F32),
            "f64" | "float64" | "double" => Ok(DType::F64),
            "i64" | "int64" | "long" => Ok(DType::I64),
            _ => Err(Error::ParseDType(s.to_string())),
        }
    }
}

pub(crate) mod sealed {
    use crate::cpu::CpuStorage;

    /// The crate-internal half of [`super::Element`].
    pub trait Sealed: Sized {
        fn into_storage(values: Vec<Self>) -> CpuStorage;
        fn slice(storage: &CpuStorage) -> Option<&[Self]>;
        fn slice_mut(storage: &mut CpuStorage) -> Option<&mut [Self]>;
        fn from_storage(storage: CpuStorage) -> Option<Vec<Self>>;
    }
}

/// A Rust type that is the element of some [`DType`]: `f32`, `f64` or `i64`.
pub trait Element:
    sealed::Sealed + Copy + Send + Sync + fmt::Debug + PartialEq + PartialOrd + 'static
{
    /// The dtype of this element type.
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl sealed::Sealed for $t {
            fn into_storage(values: Vec<Self>) -> CpuStorage {
                CpuStorage::$variant(values)
            }
            fn slice(storage: &CpuStorage) -> Option<&[Self]> {
                match storage {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(storage: &mut CpuStorage) -> Option<&mut [Self]> {
                match storage {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn from_storage(storage: CpuStorage) -> Option<Vec<Self>> {
                match storage {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
        }
    };
}

element!(f32, F32);
element!(f64, F64);
element!(i64, I64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(DType::F32.size_of(), 4);
        assert_eq!(DType::F64.size_of(), 8);
        assert_eq!(DType::I64.size_of(), 8);
        for dtype in DType::ALL {
            assert_eq!(dtype.name().parse::<DType>().unwrap(), dtype);
            assert_eq!(dtype.to_string(), dtype.name());
        }
        assert_eq!(f32::DTYPE, DType::F32);
        assert_eq!(i64::DTYPE, DType::I64);
    }

    #[test]
    fn parse_aliases_and_errors() {
        assert_eq!(" Float32 ".parse::<DType>().unwrap(), DType::F32);
        assert_eq!("double".parse::<DType>().unwrap(), DType::F64);
        assert_eq!("INT64".parse::<DType>().unwrap(), DType::I64);
        let err = "f16".parse::<DType>().unwrap_err();
        assert_eq!(err, Error::ParseDType("f16".into()));
        assert!(err.to_string().contains("expected one of f32, f64, i64"));
    }
}
