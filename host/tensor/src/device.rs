//! Where a tensor's storage lives.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The device that holds a tensor's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory.
    #[default]
    Cpu,
    /// Memory of the CUDA device with this ordinal (needs the `cuda` feature).
    Cuda(usize),
}

impl Device {
    /// Whether this is [`Device::Cpu`].
    pub fn is_cpu(self) -> bool {
        self == Device::Cpu
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    /// Parses `cpu`, `cuda` (ordinal 0) and `cuda:N`.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => t
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(Device::Cuda)
                .ok_or_else(|| Error::ParseDevice(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(7)] {
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        }
        assert_eq!("CUDA".parse::<Device>().unwrap(), Device::Cuda(0));
        assert!(matches!(
            "cuda:x".parse::<Device>(),
            Err(Error::ParseDevice(_))
        ));
        assert!(matches!(
            "gpu".parse::<Device>(),
            Err(Error::ParseDevice(_))
        ));
        assert!(Device::default().is_cpu());
    }
}
