//! The codec against the shared test vectors (`wit/encoding-vectors.json`)
//! and the serde data model.

use std::collections::BTreeMap;
use std::fmt;

use serde::de;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize};

use super::read::{Item, Reader};
use super::*;
use crate::rdma::BufferRef;

/// Any value of the encoding, as the vectors describe them.
#[derive(Debug, Clone)]
enum Value {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Tag(u64, Box<Value>),
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        use Value::*;
        match (self, other) {
            (Null, Null) => true,
            (Bool(a), Bool(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            // -0.0 is not 0.0, and NaN is NaN.
            (Float(a), Float(b)) => a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            (Text(a), Text(b)) => a == b,
            (Bytes(a), Bytes(b)) => a == b,
            (Array(a), Array(b)) => a == b,
            (Map(a), Map(b)) => a == b,
            (Tag(t, a), Tag(u, b)) => t == u && a == b,
            _ => false,
        }
    }
}

impl Value {
    /// A vector's typed JSON (`{"int": "123"}`, `{"array": [...]}`...).
    fn from_json(json: &serde_json::Value) -> Value {
        let object = json.as_object().expect("a value is an object");
        if let Some(tag) = object.get("tag") {
            return Value::Tag(
                tag.as_u64().unwrap(),
                Box::new(Value::from_json(&object["value"])),
            );
        }
        let (kind, v) = object.iter().next().expect("one entry");
        match kind.as_str() {
            "null" => Value::Null,
            "bool" => Value::Bool(v.as_bool().unwrap()),
            "int" => Value::Int(v.as_str().unwrap().parse().unwrap()),
            "float" => Value::Float(match v.as_str() {
                Some("nan") => f64::NAN,
                Some("inf") => f64::INFINITY,
                Some("-inf") => f64::NEG_INFINITY,
                Some(other) => panic!("float {other}"),
                None => v.as_f64().unwrap(),
            }),
            "text" => Value::Text(v.as_str().unwrap().into()),
            "bytes" => Value::Bytes(unhex(v.as_str().unwrap())),
            "array" => Value::Array(v.as_array().unwrap().iter().map(Value::from_json).collect()),
            "map" => Value::Map(
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|pair| (Value::from_json(&pair[0]), Value::from_json(&pair[1])))
                    .collect(),
            ),
            other => panic!("no value kind {other}"),
        }
    }

    /// Reads one value item by item, tags included.
    fn read(reader: &mut Reader) -> Result<Value, Error> {
        Ok(match reader.item()? {
            Item::Unsigned(n) => Value::Int(n.into()),
            Item::Negative(n) => Value::Int(-1 - i128::from(n)),
            Item::Bytes(b) => Value::Bytes(b.to_vec()),
            Item::Text(s) => Value::Text(s.into()),
            Item::Array(n) => Value::Array(
                (0..n)
                    .map(|_| Value::read(reader))
                    .collect::<Result<_, _>>()?,
            ),
            Item::Map(n) => Value::Map(
                (0..n)
                    .map(|_| Ok((Value::read(reader)?, Value::read(reader)?)))
                    .collect::<Result<_, Error>>()?,
            ),
            Item::Tag(t) => Value::Tag(t, Box::new(Value::read(reader)?)),
            Item::Bool(b) => Value::Bool(b),
            Item::Null => Value::Null,
            Item::Float(f) => Value::Float(f),
        })
    }

    /// A whole payload, item by item.
    fn read_all(bytes: &[u8]) -> Result<Value, Error> {
        let mut reader = Reader::new(bytes);
        let value = Value::read(&mut reader)?;
        match reader.at_end() {
            true => Ok(value),
            false => Err(Error::new("trailing bytes")),
        }
    }

    /// Writes the value item by item, tags included.
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::Null => out.push(0xf6),
            Value::Bool(b) => out.push(if *b { 0xf5 } else { 0xf4 }),
            Value::Int(n) => write::integer(out, *n).unwrap(),
            Value::Float(f) => write::float(out, *f),
            Value::Text(s) => {
                write::head(out, 3, s.len() as u64);
                out.extend(s.as_bytes());
            }
            Value::Bytes(b) => {
                write::head(out, 2, b.len() as u64);
                out.extend(b);
            }
            Value::Array(values) => {
                write::head(out, 4, values.len() as u64);
                values.iter().for_each(|v| v.write(out));
            }
            Value::Map(entries) => {
                write::head(out, 5, entries.len() as u64);
                for (k, v) in entries {
                    k.write(out);
                    v.write(out);
                }
            }
            Value::Tag(t, v) => {
                write::head(out, 6, *t);
                v.write(out);
            }
        }
    }

    /// Whether the value holds tag 40102 or 40103, which serde's data model
    /// does not read.
    fn holds_argument_or_pickle_tags(&self) -> bool {
        match self {
            Value::Tag(KWARGS | PICKLE, _) => true,
            Value::Tag(_, v) => v.holds_argument_or_pickle_tags(),
            Value::Array(values) => values.iter().any(Value::holds_argument_or_pickle_tags),
            Value::Map(entries) => entries.iter().any(|(k, v)| {
                k.holds_argument_or_pickle_tags() || v.holds_argument_or_pickle_tags()
            }),
            _ => false,
        }
    }

    /// The value as serde reads it: references are their bytes.
    fn without_references(self) -> Value {
        match self {
            Value::Tag(_, v) => v.without_references(),
            Value::Array(values) => {
                Value::Array(values.into_iter().map(Value::without_references).collect())
            }
            Value::Map(entries) => Value::Map(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.without_references(), v.without_references()))
                    .collect(),
            ),
            other => other,
        }
    }
}

/// Through serde's data model; the references travel tagged.
impl Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(n) => match (u64::try_from(*n), i64::try_from(*n)) {
                (Ok(n), _) => s.serialize_u64(n),
                (_, Ok(n)) => s.serialize_i64(n),
                _ => s.serialize_i128(*n),
            },
            Value::Float(f) => s.serialize_f64(*f),
            Value::Text(t) => s.serialize_str(t),
            Value::Bytes(b) => s.serialize_bytes(b),
            Value::Array(values) => {
                let mut seq = s.serialize_seq(Some(values.len()))?;
                values.iter().try_for_each(|v| seq.serialize_element(v))?;
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                entries
                    .iter()
                    .try_for_each(|(k, v)| map.serialize_entry(k, v))?;
                map.end()
            }
            Value::Tag(MESH_REF, content) => match &**content {
                Value::Bytes(b) => serialize_tagged(TAGGED_MESH, b, s),
                _ => Err(serde::ser::Error::custom("a reference holds bytes")),
            },
            Value::Tag(BUFFER_REF, content) => match &**content {
                Value::Bytes(b) => serialize_tagged(TAGGED_BUFFER, b, s),
                _ => Err(serde::ser::Error::custom("a reference holds bytes")),
            },
            Value::Tag(t, _) => Err(serde::ser::Error::custom(format!("tag {t}"))),
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        struct Any;
        impl<'de> de::Visitor<'de> for Any {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
                Ok(Value::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
                Ok(Value::Int(v.into()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
                Ok(Value::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
                Ok(Value::Int(v.into()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
                Ok(Value::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
                Ok(Value::Text(v.into()))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
                Ok(Value::Bytes(v.into()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
                let mut values = Vec::new();
                while let Some(v) = seq.next_element()? {
                    values.push(v);
                }
                Ok(Value::Array(values))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Value::Map(entries))
            }
        }
        d.deserialize_any(Any)
    }
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn every_shared_vector_reads_and_writes_as_specified() {
    let vectors: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("../../../../wit/encoding-vectors.json")).unwrap();
    assert!(vectors.len() > 100, "{} vectors", vectors.len());
    for vector in &vectors {
        let name = vector["name"].as_str().unwrap();
        let bytes = unhex(vector["hex"].as_str().unwrap());
        if let Some(why) = vector.get("error") {
            let read = Value::read_all(&bytes);
            assert!(
                read.is_err(),
                "{name}: read {read:?}, expected an error ({why})"
            );
            let decoded = decode::<Value>(&bytes);
            assert!(
                decoded.is_err(),
                "{name}: decoded {decoded:?}, expected an error ({why})"
            );
            continue;
        }
        let expected = Value::from_json(&vector["value"]);
        let decode_only = vector.get("decode_only").is_some_and(|v| v == true);

        // Item by item, tags included.
        match Value::read_all(&bytes) {
            Ok(read) => assert_eq!(read, expected, "{name}"),
            Err(e) => panic!("{name}: {e}"),
        }
        if !decode_only {
            let mut written = Vec::new();
            expected.write(&mut written);
            assert_eq!(hex(&written), hex(&bytes), "{name}");
        }

        // Through serde, as a program's types are.
        if expected.holds_argument_or_pickle_tags() {
            assert!(
                decode::<Value>(&bytes).is_err(),
                "{name}: serde read a tag it cannot"
            );
            continue;
        }
        assert_eq!(
            decode::<Value>(&bytes),
            Ok(expected.clone().without_references()),
            "{name}"
        );
        if !decode_only {
            assert_eq!(hex(&encode(&expected).unwrap()), hex(&bytes), "{name}");
        }
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Point {
    x: i64,
    label: String,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum Shape {
    Empty,
    Circle(f64),
    Segment(i32, i32),
    Box { w: u8, h: u8 },
}

#[test]
fn replies_are_one_unwrapped_value() {
    assert_eq!(encode(&-2i64).unwrap(), [0x21]);
    assert_eq!(encode(&1000i64).unwrap(), [0x19, 0x03, 0xe8]);
    assert_eq!(encode(&i64::MIN).unwrap(), unhex("3b7fffffffffffffff"));
    assert_eq!(decode::<i64>(&[0x21]).unwrap(), -2);
    assert_eq!(encode(&1.5f64).unwrap(), unhex("fb3ff8000000000000"));
    assert_eq!(
        encode(&1.5f32).unwrap(),
        unhex("fb3ff8000000000000"),
        "f32 widens"
    );
    assert_eq!(encode(&()).unwrap(), [0xf6]);
    assert_eq!(encode("hi").unwrap(), unhex("626869"));
    assert_eq!(encode(&'é').unwrap(), unhex("62c3a9"));

    let point = Point {
        x: 3,
        label: "a".into(),
    };
    let bytes = encode(&point).unwrap();
    assert_eq!(hex(&bytes), "a2617803656c6162656c6161");
    assert_eq!(decode::<Point>(&bytes).unwrap(), point);
}

#[test]
fn enums_are_externally_tagged() {
    let cases = [
        (Shape::Empty, "65456d707479"),
        (Shape::Circle(0.5), "a166436972636c65fb3fe0000000000000"),
        (Shape::Segment(1, -1), "a1675365676d656e74820120"),
        (Shape::Box { w: 2, h: 3 }, "a163426f78a2617702616803"),
    ];
    for (shape, expected) in cases {
        let bytes = encode(&shape).unwrap();
        assert_eq!(hex(&bytes), expected, "{shape:?}");
        assert_eq!(decode::<Shape>(&bytes).unwrap(), shape);
    }
    let err = decode::<Shape>(&unhex("a201020304")).unwrap_err();
    assert!(err.to_string().contains("expected an enum"), "{err}");
}

#[test]
fn options_maps_tuples_and_wide_integers() {
    assert_eq!(encode(&None::<i64>).unwrap(), [0xf6]);
    assert_eq!(encode(&Some(7u8)).unwrap(), [0x07]);
    assert_eq!(decode::<Option<String>>(&[0xf6]).unwrap(), None);
    assert_eq!(decode::<Option<u8>>(&[0x07]).unwrap(), Some(7));

    let map = BTreeMap::from([(1u32, "a".to_string()), (2, "b".into())]);
    let bytes = encode(&map).unwrap();
    assert_eq!(hex(&bytes), "a2016161026162");
    assert_eq!(decode::<BTreeMap<u32, String>>(&bytes).unwrap(), map);

    let tuple = (1u8, -1i8, true, "x".to_string());
    let bytes = encode(&tuple).unwrap();
    assert_eq!(hex(&bytes), "840120f56178");
    assert_eq!(decode::<(u8, i8, bool, String)>(&bytes).unwrap(), tuple);

    assert_eq!(
        encode(&u128::from(u64::MAX)).unwrap(),
        unhex("1bffffffffffffffff")
    );
    assert_eq!(
        encode(&-(1i128 << 64)).unwrap(),
        unhex("3bffffffffffffffff")
    );
    assert!(encode(&(1u128 << 64)).is_err());
    assert!(encode(&(-(1i128 << 64) - 1)).is_err());
    assert_eq!(
        decode::<i128>(&unhex("3bffffffffffffffff")).unwrap(),
        -(1i128 << 64)
    );
    assert_eq!(
        decode::<u64>(&unhex("1bffffffffffffffff")).unwrap(),
        u64::MAX
    );
}

#[test]
fn readers_want_integers_for_integers_and_take_either_for_floats() {
    let err = decode::<i64>(&unhex("fb3ff8000000000000")).unwrap_err();
    assert!(
        err.to_string().contains("invalid type: floating point"),
        "{err}"
    );
    assert!(
        decode::<i64>(&unhex("1bffffffffffffffff")).is_err(),
        "past i64"
    );
    assert!(decode::<u8>(&unhex("190100")).is_err(), "past u8");
    assert_eq!(decode::<f64>(&[0x05]).unwrap(), 5.0);
    assert_eq!(decode::<f64>(&[0x24]).unwrap(), -5.0);
    assert_eq!(decode::<f64>(&unhex("f93e00")).unwrap(), 1.5);
    assert_eq!(decode::<f32>(&unhex("fa3fc00000")).unwrap(), 1.5);
    assert_eq!(decode::<f32>(&unhex("fb3ff8000000000000")).unwrap(), 1.5);
}

#[test]
fn bytes_and_arrays_both_read_as_a_vec_of_u8() {
    assert_eq!(
        encode(&vec![1u8, 2]).unwrap(),
        [0x82, 1, 2],
        "a Vec is an array"
    );
    assert_eq!(decode::<Vec<u8>>(&[0x82, 1, 2]).unwrap(), [1, 2]);
    assert_eq!(
        decode::<Vec<u8>>(&[0x42, 1, 2]).unwrap(),
        [1, 2],
        "Python bytes"
    );
    assert!(decode::<Vec<u8>>(&[0x42, 1]).is_err());
}

#[test]
fn a_payload_of_another_type_is_an_error_not_a_half_read() {
    let bytes = encode(&(1u8, 2u8)).unwrap();
    let err = decode::<u8>(&bytes).unwrap_err();
    assert!(err.to_string().contains("invalid type: sequence"), "{err}");

    let err = decode::<u8>(&[0x01, 0x02]).unwrap_err();
    assert!(err.to_string().contains("1 bytes left over"), "{err}");

    let err = decode::<(u8, u8)>(&[0x83, 1, 2, 3]).unwrap_err();
    assert!(err.to_string().contains("1 elements more"), "{err}");

    let err = decode::<Point>(&unhex("a1617803")).unwrap_err();
    assert!(err.to_string().contains("missing field `label`"), "{err}");
    assert!(
        err.to_string()
            .starts_with("`monarch_guest::codec::tests::Point`"),
        "{err}"
    );
}

#[test]
fn lengths_serde_does_not_know_are_counted() {
    /// A sequence written without a length, past a one-byte head.
    struct Unsized(usize);
    impl Serialize for Unsized {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(None)?;
            (0..self.0).try_for_each(|i| seq.serialize_element(&(i as u8)))?;
            seq.end()
        }
    }
    let bytes = encode(&Unsized(30)).unwrap();
    assert_eq!(bytes[..2], [0x98, 30]);
    assert_eq!(
        decode::<Vec<u8>>(&bytes).unwrap(),
        (0..30).collect::<Vec<u8>>()
    );
    assert_eq!(encode(&Unsized(0)).unwrap(), [0x80]);

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Sparse {
        a: u8,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        b: Option<u8>,
    }
    let bytes = encode(&Sparse { a: 1, b: None }).unwrap();
    assert_eq!(hex(&bytes), "a1616101");
    assert_eq!(decode::<Sparse>(&bytes).unwrap(), Sparse { a: 1, b: None });
}

#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    let mut bytes = vec![0x81; 100_000];
    bytes.push(0x00);
    let err = decode::<Value>(&bytes).unwrap_err();
    assert!(
        err.to_string().contains("nested more than 256 deep"),
        "{err}"
    );
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Add(i64);

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Where;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Pair(i64, String);

#[test]
fn a_message_is_an_argument_list_of_one() {
    assert_eq!(encode_args(&Add(5)).unwrap(), [0x81, 0x05]);
    // A null value (a unit struct, `()`) is no argument at all.
    assert_eq!(encode_args(&Where).unwrap(), [0x80]);
    assert_eq!(encode_args(&()).unwrap(), [0x80]);
    assert_eq!(decode_args::<Where>(&[0x80]).unwrap(), Where);
    let point = Point {
        x: 1,
        label: "p".into(),
    };
    let bytes = encode_args(&point).unwrap();
    assert_eq!(bytes[0], 0x81);
    assert_eq!(decode_args::<Point>(&bytes).unwrap(), point);
    assert_eq!(decode_args::<Add>(&[0x81, 0x05]).unwrap(), Add(5));
    // A one-element list of a list stays a list.
    assert_eq!(decode_args::<Vec<u8>>(&[0x81, 0x81, 0x07]).unwrap(), [7]);
    assert_eq!(
        decode_args::<Vec<u8>>(&[0x81, 0x80]).unwrap(),
        Vec::<u8>::new()
    );
}

#[test]
fn argument_lists_from_other_languages_read_as_the_message() {
    // f(): a unit struct, (), None.
    assert_eq!(decode_args::<Where>(&[0x80]).unwrap(), Where);
    decode_args::<()>(&[0x80]).unwrap();
    assert_eq!(decode_args::<Option<i64>>(&[0x80]).unwrap(), None);
    // f(1, "a"): a tuple struct, a tuple, a struct from its fields in order.
    let bytes = unhex("82016161");
    assert_eq!(decode_args::<Pair>(&bytes).unwrap(), Pair(1, "a".into()));
    assert_eq!(
        decode_args::<(i64, String)>(&bytes).unwrap(),
        (1, "a".into())
    );
    assert_eq!(
        decode_args::<Point>(&bytes).unwrap(),
        Point {
            x: 1,
            label: "a".into()
        }
    );
    // f(1, 2, 3) for a message of a sequence: the arguments are its items.
    #[derive(Debug, PartialEq, Deserialize)]
    struct Sum(Vec<i64>);
    assert_eq!(
        decode_args::<Sum>(&unhex("83010203")).unwrap(),
        Sum(vec![1, 2, 3])
    );
    // Too many arguments, or too few, are errors.
    assert!(decode_args::<Pair>(&unhex("8301616102")).is_err());
    assert!(decode_args::<Add>(&[0x80]).is_err());
}

#[test]
fn keyword_arguments_are_an_error_that_names_them() {
    let err = decode_args::<Pair>(&unhex("d99ca682820102a261780361796161")).unwrap_err();
    assert!(
        err.to_string().contains("keyword arguments (x, y) given"),
        "{err}"
    );
    let err = decode_args::<Pair>(&unhex("d99ca68280a1617801")).unwrap_err();
    assert!(
        err.to_string().contains("keyword arguments (x) given"),
        "{err}"
    );
    let err = decode_args::<Pair>(&unhex("d99ca601")).unwrap_err();
    assert!(
        err.to_string().contains("malformed call arguments"),
        "{err}"
    );
}

#[test]
fn an_argument_list_is_an_array() {
    let err = decode_args::<Add>(&[0x05]).unwrap_err();
    assert!(
        err.to_string()
            .contains("argument list (an array), found the integer 5"),
        "{err}"
    );
    let err = decode_args::<Add>(&[]).unwrap_err();
    assert!(err.to_string().contains("cut short"), "{err}");
    let err = decode_args::<Add>(&[0x81, 0x05, 0x00]).unwrap_err();
    assert!(err.to_string().contains("1 bytes left over"), "{err}");
}

#[test]
fn references_travel_tagged() {
    let reference = BufferRef(vec![1, 2]);
    let bytes = encode(&reference).unwrap();
    assert_eq!(hex(&bytes), "d99ca5420102");
    assert_eq!(decode::<BufferRef>(&bytes).unwrap(), reference);
    let err = decode::<BufferRef>(&unhex("420102")).unwrap_err();
    assert!(
        err.to_string()
            .contains("expected an RDMA buffer reference (tag 40101), found 2 bytes"),
        "{err}"
    );
    let err = decode::<BufferRef>(&unhex("d99ca4420102")).unwrap_err();
    assert!(
        err.to_string().contains("found an actor mesh reference"),
        "{err}"
    );

    // A mesh reference inside a message, as another SDK writes it.
    #[derive(Serialize, Deserialize)]
    struct Hand {
        partner: crate::MeshRef<()>,
        n: u8,
    }
    let bytes = unhex("82d99ca4427b7d07");
    let hand = decode_args::<Hand>(&bytes).unwrap();
    assert_eq!(hand.n, 7);
    assert_eq!(
        hex(&encode(&hand).unwrap()),
        "a267706172746e6572d99ca4427b7d616e07"
    );
    // Where a plain value is read, a reference is its bytes.
    assert_eq!(decode::<Vec<u8>>(&unhex("d99ca4427b7d")).unwrap(), b"{}");
}

#[test]
fn a_python_object_is_refused_with_its_name() {
    let err = decode::<Vec<u8>>(&unhex("d99ca74480044e2e")).unwrap_err();
    assert!(
        err.to_string().contains("a Python object (tag 40103)"),
        "{err}"
    );
}

#[test]
fn concat_splits_into_the_ranks_replies() {
    let joined: Vec<u8> = [1i64, -2, 300]
        .iter()
        .flat_map(|v| encode(v).unwrap())
        .collect();
    assert_eq!(hex(&joined), "012119012c");
    assert_eq!(decode_concat::<i64>(&joined).unwrap(), [1, -2, 300]);

    let words = ["ab", "", "cde"];
    let joined: Vec<u8> = words.iter().flat_map(|w| encode(*w).unwrap()).collect();
    assert_eq!(decode_concat::<String>(&joined).unwrap(), words);

    // Unit replies are one byte each, so they split too.
    assert_eq!(decode_concat::<()>(&[0xf6; 3]).unwrap(), [(); 3]);
    assert_eq!(decode_concat::<()>(&[]).unwrap(), Vec::<()>::new());
    assert!(
        decode_concat::<i64>(&[0x01, 0x19, 0x01]).is_err(),
        "cut short"
    );
}
