//! The payload encoding: how messages, replies and init values become the
//! bytes that cross the host.
//!
//! The WIT leaves payloads to the guest. This SDK encodes a value with
//! [postcard](https://docs.rs/postcard) (compact, varint integers), with one
//! exception so that the host's reducers can read replies:
//!
//! 1. A value whose type is exactly `i64` is 8 little-endian bytes (postcard
//!    would write a zigzag varint). `f64` is 8 little-endian bytes under
//!    postcard already. This holds only for the top-level value: an `i64`
//!    inside a struct is postcard's varint.
//! 2. Decoding reads the whole payload: trailing bytes are an error, so a
//!    reply of the wrong type is reported rather than half-read.
//! 3. The host's `concat` reducer joins replies; [`decode_concat`] reads
//!    them back one after another, which works because every encoding above
//!    delimits itself.
//!
//! Programs written against the typed API never call these functions; they
//! are public for code that talks to the raw [`bindings`](crate::bindings)
//! or to actors written in another language.

use std::any::{Any, TypeId};
use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A payload that could not be encoded or decoded as the type expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    type_name: &'static str,
    reason: String,
}

impl CodecError {
    fn new<T>(reason: impl Into<String>) -> Self {
        Self {
            type_name: std::any::type_name::<T>(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.type_name, self.reason)
    }
}

impl std::error::Error for CodecError {}

/// Encodes `value` as a payload (see the [module docs](self) for the rules).
pub fn encode<T: Serialize + 'static>(value: &T) -> Result<Vec<u8>, CodecError> {
    if let Some(v) = (value as &dyn Any).downcast_ref::<i64>() {
        return Ok(v.to_le_bytes().to_vec());
    }
    postcard::to_allocvec(value).map_err(|e| CodecError::new::<T>(e.to_string()))
}

/// Decodes a whole payload as a `T` (see the [module docs](self)).
pub fn decode<T: DeserializeOwned + 'static>(bytes: &[u8]) -> Result<T, CodecError> {
    match take::<T>(bytes)? {
        (value, []) => Ok(value),
        (_, rest) => Err(CodecError::new::<T>(format!(
            "{} bytes left over after the value; is the payload of another type?",
            rest.len()
        ))),
    }
}

/// Decodes the host's `concat` of several replies, each a `T`, in order.
pub fn decode_concat<T: DeserializeOwned + 'static>(
    mut bytes: &[u8],
) -> Result<Vec<T>, CodecError> {
    let mut values = Vec::new();
    while !bytes.is_empty() {
        let (value, rest) = take::<T>(bytes)?;
        if rest.len() == bytes.len() {
            return Err(CodecError::new::<T>(
                "the type encodes as no bytes, so its concatenation cannot be split",
            ));
        }
        values.push(value);
        bytes = rest;
    }
    Ok(values)
}

/// Decodes one `T` from the front of `bytes`; returns it and what follows.
fn take<T: DeserializeOwned + 'static>(bytes: &[u8]) -> Result<(T, &[u8]), CodecError> {
    if TypeId::of::<T>() == TypeId::of::<i64>() {
        let Some((head, rest)) = bytes.split_first_chunk::<8>() else {
            return Err(CodecError::new::<T>(format!(
                "expected 8 little-endian bytes, got {}",
                bytes.len()
            )));
        };
        let mut slot: Option<T> = None;
        if let Some(slot) = (&mut slot as &mut dyn Any).downcast_mut::<Option<i64>>() {
            *slot = Some(i64::from_le_bytes(*head));
        }
        return slot
            .map(|v| (v, rest))
            .ok_or_else(|| CodecError::new::<T>("internal: i64 slot mismatch"));
    }
    postcard::take_from_bytes(bytes).map_err(|e| CodecError::new::<T>(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Point {
        x: i64,
        label: String,
    }

    #[test]
    fn i64_is_eight_little_endian_bytes_for_the_host_reducers() {
        assert_eq!(encode(&-2i64).unwrap(), (-2i64).to_le_bytes());
        assert_eq!(decode::<i64>(&7i64.to_le_bytes()).unwrap(), 7);
        assert!(decode::<i64>(&[1, 2, 3]).is_err());
    }

    #[test]
    fn f64_is_eight_little_endian_bytes_for_the_host_reducers() {
        assert_eq!(encode(&1.5f64).unwrap(), 1.5f64.to_le_bytes());
        assert_eq!(decode::<f64>(&(-0.25f64).to_le_bytes()).unwrap(), -0.25);
    }

    #[test]
    fn other_values_round_trip_compactly() {
        let point = Point {
            x: 3,
            label: "a".into(),
        };
        let bytes = encode(&point).unwrap();
        assert_eq!(
            bytes,
            [6, 1, b'a'],
            "zigzag varint 3, then a length-prefixed string"
        );
        assert_eq!(decode::<Point>(&bytes).unwrap(), point);
    }

    #[test]
    fn a_payload_of_another_type_is_an_error_not_a_half_read() {
        let bytes = encode(&(1u8, 2u8)).unwrap();
        let err = decode::<u8>(&bytes).unwrap_err();
        assert!(err.to_string().contains("1 bytes left over"), "{err}");
    }

    #[test]
    fn concat_splits_into_the_ranks_replies() {
        let joined: Vec<u8> = [1i64, -2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(decode_concat::<i64>(&joined).unwrap(), [1, -2, 3]);

        let words = ["ab", "", "cde"];
        let joined: Vec<u8> = words
            .iter()
            .flat_map(|w| encode(&w.to_string()).unwrap())
            .collect();
        assert_eq!(decode_concat::<String>(&joined).unwrap(), words);

        assert!(
            decode_concat::<i64>(&[0; 12]).is_err(),
            "12 bytes is not whole i64s"
        );
        assert_eq!(decode_concat::<()>(&[]).unwrap(), Vec::<()>::new());
    }
}
