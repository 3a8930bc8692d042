//! Writing the encoding: a serde [`Serializer`] that appends one value to a
//! byte vector.

use serde::ser::{self, Serialize};

use super::{BUFFER_REF, Error, MESH_REF, TAGGED_BUFFER, TAGGED_MESH};

/// Appends the head of an item of major type `major` with argument `arg`,
/// in its shortest form.
pub(crate) fn head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let major = major << 5;
    match arg {
        0..=23 => out.push(major | arg as u8),
        24..=0xff => out.extend([major | 24, arg as u8]),
        0x100..=0xffff => {
            out.push(major | 25);
            out.extend((arg as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(major | 26);
            out.extend((arg as u32).to_be_bytes());
        }
        _ => {
            out.push(major | 27);
            out.extend(arg.to_be_bytes());
        }
    }
}

/// Appends an integer: major type 0 for `n >= 0`, 1 below.
pub(crate) fn integer(out: &mut Vec<u8>, n: i128) -> Result<(), Error> {
    match (u64::try_from(n), u64::try_from(-1 - n)) {
        (Ok(n), _) => head(out, 0, n),
        (_, Ok(n)) => head(out, 1, n),
        _ => {
            return Err(Error::new(format!(
                "the integer {n} is outside the encoding's range (-2^64 .. 2^64-1)"
            )));
        }
    }
    Ok(())
}

/// Appends a float, always as 64 bits.
pub(crate) fn float(out: &mut Vec<u8>, f: f64) {
    out.push(0xfb);
    out.extend(f.to_be_bytes());
}

/// A serde serializer appending to `out`.
pub(crate) struct Serializer {
    pub(crate) out: Vec<u8>,
}

/// An array or map being written. Its head is written first with the
/// length serde gave, and rewritten at the end if the count differs (a
/// length serde did not know, a field skipped).
pub(crate) struct Compound<'a> {
    ser: &'a mut Serializer,
    major: u8,
    head_at: usize,
    head_len: usize,
    count: u64,
}

impl Serializer {
    fn compound(&mut self, major: u8, len: Option<usize>) -> Compound<'_> {
        let head_at = self.out.len();
        head(&mut self.out, major, len.unwrap_or(0) as u64);
        Compound {
            head_len: self.out.len() - head_at,
            ser: self,
            major,
            head_at,
            count: 0,
        }
    }

    /// Starts the map of one entry that holds a variant other than a unit
    /// one: its name, then the content.
    fn variant(&mut self, name: &str) {
        head(&mut self.out, 5, 1);
        head(&mut self.out, 3, name.len() as u64);
        self.out.extend(name.as_bytes());
    }
}

impl Compound<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.count += 1;
        value.serialize(&mut *self.ser)
    }

    fn end(self) -> Result<(), Error> {
        let mut fixed = Vec::new();
        head(&mut fixed, self.major, self.count);
        let at = self.head_at;
        if fixed[..] != self.ser.out[at..at + self.head_len] {
            self.ser.out.splice(at..at + self.head_len, fixed);
        }
        Ok(())
    }
}

impl<'a> ser::Serializer for &'a mut Serializer {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push(if v { 0xf5 } else { 0xf4 });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        integer(&mut self.out, v.into())
    }

    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        integer(&mut self.out, v.into())
    }

    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        integer(&mut self.out, v.into())
    }

    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        integer(&mut self.out, v.into())
    }

    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        integer(&mut self.out, v)
    }

    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        head(&mut self.out, 0, v.into());
        Ok(())
    }

    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        head(&mut self.out, 0, v.into());
        Ok(())
    }

    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        head(&mut self.out, 0, v.into());
        Ok(())
    }

    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        head(&mut self.out, 0, v);
        Ok(())
    }

    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        match i128::try_from(v) {
            Ok(v) => integer(&mut self.out, v),
            Err(_) => Err(Error::new(format!(
                "the integer {v} is outside the encoding's range (-2^64 .. 2^64-1)"
            ))),
        }
    }

    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        float(&mut self.out, v.into());
        Ok(())
    }

    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        float(&mut self.out, v);
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        head(&mut self.out, 3, v.len() as u64);
        self.out.extend(v.as_bytes());
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        head(&mut self.out, 2, v.len() as u64);
        self.out.extend(v);
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push(0xf6);
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }

    /// Transparent, except for the references that travel tagged.
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        match name {
            TAGGED_MESH => head(&mut self.out, 6, MESH_REF),
            TAGGED_BUFFER => head(&mut self.out, 6, BUFFER_REF),
            _ => {}
        }
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.variant(variant);
        value.serialize(self)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'a>, Error> {
        Ok(self.compound(4, len))
    }

    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, Error> {
        Ok(self.compound(4, Some(len)))
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Error> {
        Ok(self.compound(4, Some(len)))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.variant(variant);
        Ok(self.compound(4, Some(len)))
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Compound<'a>, Error> {
        Ok(self.compound(5, len))
    }

    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Compound<'a>, Error> {
        Ok(self.compound(5, Some(len)))
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Error> {
        self.variant(variant);
        Ok(self.compound(5, Some(len)))
    }

    fn is_human_readable(&self) -> bool {
        false
    }
}

/// The arrays: every element counts.
macro_rules! array {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Error;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }

            fn end(self) -> Result<(), Error> {
                Compound::end(self)
            }
        }
    )*};
}

array!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// A map counts its keys; the value follows each.
impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.element(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(&mut *self.ser)
    }

    fn end(self) -> Result<(), Error> {
        Compound::end(self)
    }
}

/// The structs: a map from field names.
macro_rules! record {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Error;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.element(key)?;
                value.serialize(&mut *self.ser)
            }

            fn end(self) -> Result<(), Error> {
                Compound::end(self)
            }
        }
    )*};
}

record!(SerializeStruct, SerializeStructVariant);
