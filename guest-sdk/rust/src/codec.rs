//! The payload encoding: how messages, replies and init values become the
//! bytes that cross the host.
//!
//! The WIT leaves payloads to the guest; every SDK (Rust, Python,
//! JavaScript) encodes them the same way, so that a program in one language
//! can call actors written in another. The encoding is a subset of
//! [CBOR](https://www.rfc-editor.org/rfc/rfc8949), specified in
//! `wit/ENCODING.md` of the repository; the shared test vectors in
//! `wit/encoding-vectors.json` are checked by this module's tests. For
//! serde's data model:
//!
//! | Rust | written as |
//! | --- | --- |
//! | `()`, unit structs, `None` | null (`f6`) |
//! | `bool` | `f4`, `f5` |
//! | integers (`u8` .. `u64`, `i8` .. `i64`, `i128` and `u128` in -2^64 .. 2^64-1) | the shortest CBOR integer head |
//! | `f32`, `f64` | a 64-bit float (`fb`) |
//! | `String`, `&str`, `char` | text |
//! | bytes (`serde_bytes`) | bytes |
//! | `Vec`, slices, tuples, tuple structs | arrays |
//! | structs (by field name), maps | maps, in order |
//! | `Some(x)`, newtype structs | `x` |
//! | enums | a unit variant as its name; others as a map of one entry, name to content |
//! | [`MeshRef`](crate::MeshRef), [`BufferRef`](crate::rdma::BufferRef) | tags 40100 and 40101 over the host's reference bytes |
//!
//! Reading accepts every integer head, floats of 16, 32 and 64 bits (and
//! an integer where a float is wanted), and bytes where a `Vec<u8>` is
//! wanted. It refuses indefinite lengths, tags the encoding does not list,
//! text that is not UTF-8, and bytes left over after the value, so that a
//! reply of the wrong type is reported rather than half-read.
//!
//! How payloads are laid out:
//!
//! - A *message* and an *init* value are an argument list. This SDK writes
//!   its one typed value as an array of one element ([`encode_args`]), and
//!   reads an argument list from any SDK ([`decode_args`]): one element is
//!   that element, none is null (a unit struct, `()`), several are read as
//!   the type itself (a tuple struct, or a struct from its fields in
//!   order); keyword arguments are an error that names them.
//! - A *reply* is one value ([`encode`], [`decode`]). A reply of type `i64`
//!   or `f64` is what the host's numeric reducers read; `concat` joins the
//!   replies into a CBOR sequence, read back by [`decode_concat`].
//!
//! Programs written against the typed API never call these functions; they
//! are public for code that talks to the raw [`bindings`](crate::bindings).

mod read;
#[cfg(test)]
mod tests;
mod write;

use std::fmt;

use serde::de::{self, DeserializeOwned};
use serde::{Deserialize, Serialize};

use read::{Deserializer, Item};

/// Tag 40100: an actor mesh reference.
pub(crate) const MESH_REF: u64 = 40100;
/// Tag 40101: an RDMA buffer reference.
pub(crate) const BUFFER_REF: u64 = 40101;
/// Tag 40102: call arguments with keywords.
pub(crate) const KWARGS: u64 = 40102;
/// Tag 40103: a Python object, which only Python reads.
pub(crate) const PICKLE: u64 = 40103;

/// The newtype-struct names by which a type asks for its value to travel
/// under tag 40100 or 40101 (see [`serialize_tagged`]).
pub(crate) const TAGGED_MESH: &str = "$monarch::MeshRef";
pub(crate) const TAGGED_BUFFER: &str = "$monarch::BufferRef";

/// A payload that could not be encoded or decoded as the type expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    type_name: &'static str,
    reason: String,
}

impl CodecError {
    fn new<T: ?Sized>(reason: impl Into<String>) -> Self {
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

/// The serializer's and deserializer's own error.
#[derive(Debug, PartialEq)]
pub(crate) struct Error(String);

impl Error {
    pub(crate) fn new(reason: impl Into<String>) -> Self {
        Self(reason.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl serde::ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

/// Encodes `value` as one value: a reply.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    encode_after::<T>(Vec::new(), value)
}

/// Encodes `value` as an argument list of one element: a message or an
/// init value.
pub fn encode_args<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let args = encode_after::<T>(vec![0x81], value)?;
    // A value that is null (a unit struct, `()`) is no argument at all, so
    // that an endpoint in another language that takes none (a Python
    // `def get(self)`) can be called with it; `decode_args` reads `[]` back
    // as null.
    if args == [0x81, 0xf6] {
        return Ok(vec![0x80]);
    }
    Ok(args)
}

fn encode_after<T: Serialize + ?Sized>(out: Vec<u8>, value: &T) -> Result<Vec<u8>, CodecError> {
    let mut ser = write::Serializer { out };
    value
        .serialize(&mut ser)
        .map_err(|e| CodecError::new::<T>(e.0))?;
    Ok(ser.out)
}

/// Decodes a whole payload as one `T`: a reply.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    decode_with(bytes, |de| T::deserialize(de))
}

/// Decodes an argument list as a `T`: a message or an init value, from
/// this SDK or another (see the [module docs](self)).
pub fn decode_args<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    decode_with(bytes, |de| match de.reader.peek()? {
        Item::Array(0) => {
            de.reader.item()?;
            T::deserialize(de::value::UnitDeserializer::new())
        }
        Item::Array(1) => {
            de.reader.item()?;
            T::deserialize(de)
        }
        Item::Array(_) => T::deserialize(de),
        Item::Tag(KWARGS) => Err(keyword_arguments(de)),
        other => Err(Error::new(format!(
            "a message or init value is an argument list (an array), found {}",
            other.describe()
        ))),
    })
}

/// The error for call arguments with keywords (tag 40102 over
/// `[positional, keywords]`), naming them.
fn keyword_arguments(de: &mut Deserializer) -> Error {
    struct Names(Vec<String>);
    impl<'de> de::Visitor<'de> for Names {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of keyword arguments")
        }

        fn visit_map<A: de::MapAccess<'de>>(mut self, mut map: A) -> Result<Vec<String>, A::Error> {
            while let Some(name) = map.next_key::<String>()? {
                map.next_value::<de::IgnoredAny>()?;
                self.0.push(name);
            }
            Ok(self.0)
        }
    }
    let names = (|| {
        de.reader.item()?;
        match de.reader.item()? {
            Item::Array(2) => {}
            other => return Err(Error::new(format!("found {}", other.describe()))),
        }
        de::IgnoredAny::deserialize(&mut *de)?;
        de::Deserializer::deserialize_map(&mut *de, Names(Vec::new()))
    })();
    match names {
        Ok(names) => Error::new(format!(
            "keyword arguments ({}) given; a Rust message or init value takes positional arguments only",
            names.join(", ")
        )),
        Err(e) => Error::new(format!(
            "malformed call arguments with keywords (tag 40102): {e}"
        )),
    }
}

/// Decodes the host's `concat` of several replies, each a `T`, in order
/// (a CBOR sequence).
pub fn decode_concat<T: DeserializeOwned>(bytes: &[u8]) -> Result<Vec<T>, CodecError> {
    let mut de = Deserializer::new(bytes);
    let mut values = Vec::new();
    while !de.reader.at_end() {
        let value = T::deserialize(&mut de).map_err(|e| located::<Vec<T>>(&de, e))?;
        values.push(value);
    }
    Ok(values)
}

/// Runs `read` over the whole of `bytes`.
fn decode_with<'de, T>(
    bytes: &'de [u8],
    read: impl FnOnce(&mut Deserializer<'de>) -> Result<T, Error>,
) -> Result<T, CodecError> {
    let mut de = Deserializer::new(bytes);
    let value = read(&mut de).map_err(|e| located::<T>(&de, e))?;
    match bytes.len() - de.reader.position() {
        0 => Ok(value),
        left => Err(CodecError::new::<T>(format!(
            "{left} bytes left over after the value; is the payload of another type?"
        ))),
    }
}

fn located<T: ?Sized>(de: &Deserializer, e: Error) -> CodecError {
    CodecError::new::<T>(format!("{e} (at byte {})", de.reader.position()))
}

/// Serializes `bytes` under a tag, for a type whose values are references
/// (`name` is [`TAGGED_MESH`] or [`TAGGED_BUFFER`]). Other serializers see
/// a newtype struct over bytes.
pub(crate) fn serialize_tagged<S: serde::Serializer>(
    name: &'static str,
    bytes: &[u8],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    struct Bytes<'a>(&'a [u8]);
    impl Serialize for Bytes<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }
    serializer.serialize_newtype_struct(name, &Bytes(bytes))
}

/// Reads what [`serialize_tagged`] wrote.
pub(crate) fn deserialize_tagged<'de, D: serde::Deserializer<'de>>(
    name: &'static str,
    deserializer: D,
) -> Result<Vec<u8>, D::Error> {
    struct RefBytes;
    impl<'de> de::Visitor<'de> for RefBytes {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a reference's bytes")
        }

        fn visit_newtype_struct<D: serde::Deserializer<'de>>(
            self,
            d: D,
        ) -> Result<Vec<u8>, D::Error> {
            d.deserialize_byte_buf(RefBytes)
        }

        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut bytes = Vec::new();
            while let Some(b) = seq.next_element()? {
                bytes.push(b);
            }
            Ok(bytes)
        }
    }
    deserializer.deserialize_newtype_struct(name, RefBytes)
}
