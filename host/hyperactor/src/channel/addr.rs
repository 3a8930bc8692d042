//! Channel addresses: where a proc listens and how to reach it.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Why a text is not a channel address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrParseError {
    /// The text does not start with a known transport.
    #[error("`{0}` is not a channel address: use local:NAME, unix:PATH or tcp:IP:PORT")]
    UnknownTransport(String),
    /// The part after `tcp:` is not `IP:PORT`.
    #[error("`{0}` is not a TCP address: use tcp:IP:PORT, e.g. tcp:127.0.0.1:0")]
    BadTcp(String),
    /// The part after the transport is empty.
    #[error("`{0}` names no endpoint")]
    Empty(String),
}

/// The address of a channel; the prefix picks the transport.
///
/// - `local:NAME`: a proc in this OS process, reached without a socket file or port;
/// - `unix:PATH`: a Unix domain socket;
/// - `tcp:IP:PORT`: TCP; port 0 binds any free port.
#[derive(
    Clone, PartialEq, Eq, Hash, PartialOrd, Ord, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub enum ChannelAddr {
    /// An in-process channel, by name.
    Local(String),
    /// A Unix domain socket at a path (kept as text so that it travels as one).
    Unix(String),
    /// A TCP socket.
    Tcp(SocketAddr),
}

impl ChannelAddr {
    /// The path of a Unix address.
    pub fn unix_path(&self) -> Option<PathBuf> {
        match self {
            ChannelAddr::Unix(path) => Some(PathBuf::from(path)),
            _ => None,
        }
    }
}

impl ChannelAddr {
    /// Whether an archived address is this one, without decoding it.
    pub(crate) fn matches_archived(&self, archived: &ArchivedChannelAddr) -> bool {
        match (self, archived) {
            (ChannelAddr::Local(name), ArchivedChannelAddr::Local(other)) => other == name.as_str(),
            (ChannelAddr::Unix(path), ArchivedChannelAddr::Unix(other)) => other == path.as_str(),
            (ChannelAddr::Tcp(addr), ArchivedChannelAddr::Tcp(other)) => other == addr,
            _ => false,
        }
    }
}

impl ArchivedChannelAddr {
    /// Feeds what tells this address apart to `h` (the id caches' keys).
    pub(crate) fn key(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash as _;
        match self {
            ArchivedChannelAddr::Local(name) => (0u8, name.as_str()).hash(h),
            ArchivedChannelAddr::Unix(path) => (1u8, path.as_str()).hash(h),
            ArchivedChannelAddr::Tcp(addr) => (2u8, addr).hash(h),
        }
    }
}

impl fmt::Display for ChannelAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelAddr::Local(name) => write!(f, "local:{name}"),
            ChannelAddr::Unix(path) => write!(f, "unix:{path}"),
            ChannelAddr::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

impl fmt::Debug for ChannelAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl FromStr for ChannelAddr {
    type Err = AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (transport, rest) = s
            .split_once(':')
            .ok_or_else(|| AddrParseError::UnknownTransport(s.to_string()))?;
        if rest.is_empty() {
            return Err(AddrParseError::Empty(s.to_string()));
        }
        match transport {
            "local" => Ok(ChannelAddr::Local(rest.to_string())),
            "unix" => Ok(ChannelAddr::Unix(rest.to_string())),
            "tcp" => rest
                .parse()
                .map(ChannelAddr::Tcp)
                .map_err(|_| AddrParseError::BadTcp(s.to_string())),
            _ => Err(AddrParseError::UnknownTransport(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip() {
        for text in [
            "local:a",
            "unix:/tmp/x.sock",
            "tcp:127.0.0.1:0",
            "tcp:[::1]:4000",
        ] {
            let addr: ChannelAddr = text.parse().unwrap();
            assert_eq!(addr.to_string(), text);
        }
    }

    #[test]
    fn bad_addresses_say_what_is_expected() {
        let err = "udp:1.2.3.4:5".parse::<ChannelAddr>().unwrap_err();
        assert!(err.to_string().contains("tcp:IP:PORT"), "{err}");
        assert!(matches!(
            "tcp:localhost".parse::<ChannelAddr>(),
            Err(AddrParseError::BadTcp(_))
        ));
        assert!(matches!(
            "unix:".parse::<ChannelAddr>(),
            Err(AddrParseError::Empty(_))
        ));
        assert!(matches!(
            "nothing".parse::<ChannelAddr>(),
            Err(AddrParseError::UnknownTransport(_))
        ));
    }
}
