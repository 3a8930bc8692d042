//! Reading the encoding: one data item's head at a time ([`Reader`]), and a
//! serde [`Deserializer`] over it.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use super::{BUFFER_REF, Error, KWARGS, MESH_REF, PICKLE, TAGGED_BUFFER, TAGGED_MESH};

/// Arrays, maps and tags nested deeper than this are refused rather than
/// read, so that a hostile payload cannot overflow the stack.
const MAX_DEPTH: usize = 256;

/// The start of one data item: its head, and for bytes and text their
/// content.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Item<'de> {
    /// Major type 0.
    Unsigned(u64),
    /// Major type 1: the value is `-1 - n`.
    Negative(u64),
    /// Major type 2.
    Bytes(&'de [u8]),
    /// Major type 3.
    Text(&'de str),
    /// Major type 4, with its number of elements.
    Array(u64),
    /// Major type 5, with its number of entries.
    Map(u64),
    /// Major type 6: one of the tags of the encoding (others are refused).
    Tag(u64),
    /// Simple values 20 and 21.
    Bool(bool),
    /// Simple value 22.
    Null,
    /// A float of 16, 32 or 64 bits.
    Float(f64),
}

impl Item<'_> {
    /// What the item is, for error messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Item::Unsigned(n) => format!("the integer {n}"),
            Item::Negative(n) => format!("the integer {}", -1 - i128::from(*n)),
            Item::Bytes(b) => format!("{} bytes", b.len()),
            Item::Text(s) => format!("the text {s:?}"),
            Item::Array(n) => format!("an array of {n}"),
            Item::Map(n) => format!("a map of {n}"),
            Item::Tag(MESH_REF) => "an actor mesh reference (tag 40100)".into(),
            Item::Tag(BUFFER_REF) => "an RDMA buffer reference (tag 40101)".into(),
            Item::Tag(KWARGS) => "call arguments with keywords (tag 40102)".into(),
            Item::Tag(PICKLE) => "a Python object (tag 40103)".into(),
            Item::Tag(n) => format!("tag {n}"),
            Item::Bool(b) => b.to_string(),
            Item::Null => "null".into(),
            Item::Float(f) => format!("the float {f:?}"),
        }
    }
}

/// Reads data items from the front of a payload.
#[derive(Clone)]
pub(crate) struct Reader<'de> {
    bytes: &'de [u8],
    pos: usize,
}

impl<'de> Reader<'de> {
    pub(crate) fn new(bytes: &'de [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    /// How far the reader is into the payload.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// Whether the whole payload has been read.
    pub(crate) fn at_end(&self) -> bool {
        self.pos == self.bytes.len()
    }

    fn take(&mut self, n: u64) -> Result<&'de [u8], Error> {
        let left = self.bytes.len() - self.pos;
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let taken = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(taken)
            }
            _ => Err(Error::new(format!(
                "the payload is cut short: {n} more bytes expected, {left} left"
            ))),
        }
    }

    fn argument<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        Ok(self.take(N as u64)?.try_into().expect("took N bytes"))
    }

    /// The next item, refusing what the encoding does not allow:
    /// indefinite lengths, unknown tags, text that is not UTF-8, simple
    /// values other than false, true and null.
    pub(crate) fn item(&mut self) -> Result<Item<'de>, Error> {
        let [initial] = self.argument::<1>()?;
        let (major, info) = (initial >> 5, initial & 0x1f);
        if major == 7 {
            return match info {
                20 => Ok(Item::Bool(false)),
                21 => Ok(Item::Bool(true)),
                22 => Ok(Item::Null),
                25 => Ok(Item::Float(f16_to_f64(u16::from_be_bytes(
                    self.argument()?,
                )))),
                26 => Ok(Item::Float(f32::from_be_bytes(self.argument()?).into())),
                27 => Ok(Item::Float(f64::from_be_bytes(self.argument()?))),
                31 => Err(Error::new("a break (0xff) outside an indefinite length")),
                28..=30 => Err(Error::new(format!(
                    "the initial byte {initial:#04x} is not well-formed CBOR"
                ))),
                _ => Err(Error::new(format!(
                    "the simple value {initial:#04x} is not in the encoding (only false, true and null are)"
                ))),
            };
        }
        let arg = match info {
            0..=23 => u64::from(info),
            24 => u64::from(self.argument::<1>()?[0]),
            25 => u64::from(u16::from_be_bytes(self.argument()?)),
            26 => u64::from(u32::from_be_bytes(self.argument()?)),
            27 => u64::from_be_bytes(self.argument()?),
            31 if (2..=5).contains(&major) => {
                return Err(Error::new(
                    "an indefinite length, which the encoding does not allow",
                ));
            }
            _ => {
                return Err(Error::new(format!(
                    "the initial byte {initial:#04x} is not well-formed CBOR"
                )));
            }
        };
        Ok(match major {
            0 => Item::Unsigned(arg),
            1 => Item::Negative(arg),
            2 => Item::Bytes(self.take(arg)?),
            3 => Item::Text(
                std::str::from_utf8(self.take(arg)?)
                    .map_err(|e| Error::new(format!("text that is not UTF-8 ({e})")))?,
            ),
            4 | 5 => {
                // Every element takes at least a byte (two per map entry):
                // a length past that is a payload cut short, found before
                // anything is allocated for it.
                let per = if major == 4 { 1 } else { 2 };
                let left = (self.bytes.len() - self.pos) as u64;
                if arg > left / per {
                    return Err(Error::new(format!(
                        "the payload is cut short: {} of {arg} entries but {left} bytes left",
                        if major == 4 { "an array" } else { "a map" }
                    )));
                }
                if major == 4 {
                    Item::Array(arg)
                } else {
                    Item::Map(arg)
                }
            }
            _ => match arg {
                MESH_REF | BUFFER_REF | KWARGS | PICKLE => Item::Tag(arg),
                _ => return Err(Error::new(format!("tag {arg} is not in the encoding"))),
            },
        })
    }

    /// The next item, without moving past it.
    pub(crate) fn peek(&self) -> Result<Item<'de>, Error> {
        self.clone().item()
    }
}

/// A half-precision float, widened exactly.
fn f16_to_f64(half: u16) -> f64 {
    let sign = if half & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((half >> 10) & 0x1f);
    let mantissa = f64::from(half & 0x3ff);
    sign * match exponent {
        0 => mantissa * 2f64.powi(-24),
        31 if mantissa == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        _ => (1.0 + mantissa / 1024.0) * 2f64.powi(exponent - 15),
    }
}

/// A serde deserializer over one payload.
pub(crate) struct Deserializer<'de> {
    pub(crate) reader: Reader<'de>,
    depth: usize,
}

impl<'de> Deserializer<'de> {
    pub(crate) fn new(bytes: &'de [u8]) -> Self {
        Self {
            reader: Reader::new(bytes),
            depth: 0,
        }
    }

    /// Runs `f` one level deeper, refusing to go past [`MAX_DEPTH`].
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, Error>) -> Result<T, Error> {
        if self.depth == MAX_DEPTH {
            return Err(Error::new(format!(
                "arrays, maps and tags nested more than {MAX_DEPTH} deep"
            )));
        }
        self.depth += 1;
        let result = f(self);
        self.depth -= 1;
        result
    }

    /// Hands an array of `len` (whose head was read) to `visitor`; every
    /// element must be read.
    fn visit_array<V: Visitor<'de>>(&mut self, len: u64, visitor: V) -> Result<V::Value, Error> {
        self.nested(|de| {
            let mut seq = Seq { de, left: len };
            let value = visitor.visit_seq(&mut seq)?;
            match seq.left {
                0 => Ok(value),
                left => Err(Error::new(format!(
                    "an array of {len} has {left} elements more than the type reads"
                ))),
            }
        })
    }

    fn visit_map<V: Visitor<'de>>(&mut self, len: u64, visitor: V) -> Result<V::Value, Error> {
        self.nested(|de| {
            let mut map = Map { de, left: len };
            let value = visitor.visit_map(&mut map)?;
            match map.left {
                0 => Ok(value),
                left => Err(Error::new(format!(
                    "a map of {len} has {left} entries more than the type reads"
                ))),
            }
        })
    }

    /// Hands `item` (whose head was read) to `visitor` as what it is.
    fn visit_item<V: Visitor<'de>>(
        &mut self,
        item: Item<'de>,
        visitor: V,
    ) -> Result<V::Value, Error> {
        match item {
            Item::Unsigned(n) => visitor.visit_u64(n),
            Item::Negative(n) => match i64::try_from(n) {
                Ok(n) => visitor.visit_i64(-1 - n),
                Err(_) => visitor.visit_i128(-1 - i128::from(n)),
            },
            Item::Bytes(b) => visitor.visit_borrowed_bytes(b),
            Item::Text(s) => visitor.visit_borrowed_str(s),
            Item::Array(len) => self.visit_array(len, visitor),
            Item::Map(len) => self.visit_map(len, visitor),
            // A reference read as a plain value is its bytes (a type that
            // wants the reference itself asks for it by name).
            Item::Tag(MESH_REF | BUFFER_REF) => {
                self.nested(|de| de::Deserializer::deserialize_any(de, visitor))
            }
            Item::Tag(tag) => Err(Error::new(format!(
                "{} where a value was expected",
                Item::Tag(tag).describe()
            ))),
            Item::Bool(b) => visitor.visit_bool(b),
            Item::Null => visitor.visit_unit(),
            Item::Float(f) => visitor.visit_f64(f),
        }
    }
}

struct Seq<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    left: u64,
}

impl<'de> de::SeqAccess<'de> for Seq<'_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        usize::try_from(self.left).ok()
    }
}

struct Map<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    left: u64,
}

impl<'de> de::MapAccess<'de> for Map<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(&mut *self.de)
    }

    fn size_hint(&self) -> Option<usize> {
        usize::try_from(self.left).ok()
    }
}

/// Bytes read where a sequence was wanted: a `Vec<u8>` from a payload that
/// holds bytes (Python's `bytes`, JavaScript's `Uint8Array`).
struct ByteSeq<'de>(std::slice::Iter<'de, u8>);

impl<'de> de::SeqAccess<'de> for ByteSeq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|&b| seed.deserialize(IntoDeserializer::<Error>::into_deserializer(b)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// An enum written as a map of one entry: the variant's name, then its
/// content.
struct Variant<'a, 'de> {
    de: &'a mut Deserializer<'de>,
}

impl<'de> de::EnumAccess<'de> for Variant<'_, 'de> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let name = seed.deserialize(&mut *self.de)?;
        Ok((name, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_, 'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        <() as de::Deserialize>::deserialize(self.de)
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self.de)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_seq(self.de, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_any(self.de, visitor)
    }
}

impl<'de> de::Deserializer<'de> for &mut Deserializer<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let item = self.reader.item()?;
        self.visit_item(item, visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.reader.peek()? == Item::Null {
            self.reader.item()?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    /// Bytes are also a sequence of `u8`s, so that a `Vec<u8>` reads them.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.reader.item()? {
            Item::Bytes(bytes) => visitor.visit_seq(ByteSeq(bytes.iter())),
            Item::Tag(MESH_REF | BUFFER_REF) => self.nested(|de| de.deserialize_seq(visitor)),
            item => self.visit_item(item, visitor),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        let tag = match name {
            TAGGED_MESH => MESH_REF,
            TAGGED_BUFFER => BUFFER_REF,
            _ => return visitor.visit_newtype_struct(self),
        };
        match self.reader.item()? {
            Item::Tag(found) if found == tag => self.nested(|de| visitor.visit_newtype_struct(de)),
            other => Err(Error::new(format!(
                "expected {}, found {}",
                Item::Tag(tag).describe(),
                other.describe()
            ))),
        }
    }

    /// A unit variant is its name as text; any other variant is a map of
    /// one entry, name to content.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.reader.item()? {
            Item::Text(name) => visitor.visit_enum(BorrowedStrDeserializer::new(name)),
            Item::Map(1) => self.nested(|de| visitor.visit_enum(Variant { de })),
            other => Err(Error::new(format!(
                "expected an enum (a variant's name, or a map of one entry), found {}",
                other.describe()
            ))),
        }
    }

    fn is_human_readable(&self) -> bool {
        false
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct map struct identifier ignored_any
    }
}
