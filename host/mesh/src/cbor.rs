//! The one part of the payload encoding (`wit/ENCODING.md`, a subset of
//! CBOR) that the host reads: the numbers of the scalar reducers (RD-1).
//!
//! Replies are CBOR values. The `i64` reducers read an integer and write
//! one with the shortest head; the `f64` ones read a float of 16, 32 or 64
//! bits, or an integer, and write a 64-bit float. Everything else about a
//! payload is left to the SDKs.

/// A number read from a reply.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// A CBOR integer, -2^64 .. 2^64-1.
    Int(i128),
    /// A CBOR float, widened to 64 bits.
    Float(f64),
}

/// Reads `bytes` as one CBOR number and nothing after it. The error says
/// what the bytes hold instead (`"text"`, `"an array"`, `"null"`...).
pub fn read_number(bytes: &[u8]) -> Result<Number, String> {
    let Some((&initial, rest)) = bytes.split_first() else {
        return Err("no bytes".into());
    };
    let (major, info) = (initial >> 5, initial & 0x1f);
    let what = match (major, info) {
        (0 | 1, _) => None,
        (7, 25..=27) => None,
        (2, _) => Some("bytes"),
        (3, _) => Some("text"),
        (4, _) => Some("an array"),
        (5, _) => Some("a map"),
        (6, _) => Some("a tagged value"),
        (7, 20 | 21) => Some("a boolean"),
        (7, 22) => Some("null"),
        _ => Some("a CBOR simple value"),
    };
    if let Some(what) = what {
        return Err(what.into());
    }
    let width = match info {
        0..=23 => 0,
        24 => 1,
        25 => 2,
        26 => 4,
        27 => 8,
        _ => {
            return Err(format!(
                "bytes that are not CBOR (initial byte {initial:#04x})"
            ));
        }
    };
    let Some((argument, trailing)) = rest.split_at_checked(width) else {
        return Err(format!("{} bytes that end inside a number", bytes.len()));
    };
    if !trailing.is_empty() {
        return Err(format!(
            "a number followed by {} more bytes",
            trailing.len()
        ));
    }
    let mut be = [0u8; 8];
    be[8 - width..].copy_from_slice(argument);
    let arg = if width == 0 {
        u64::from(info)
    } else {
        u64::from_be_bytes(be)
    };
    Ok(match (major, width) {
        (0, _) => Number::Int(arg.into()),
        (1, _) => Number::Int(-1 - i128::from(arg)),
        (_, 2) => Number::Float(f16_to_f64(arg as u16)),
        (_, 4) => Number::Float(f32::from_bits(arg as u32).into()),
        _ => Number::Float(f64::from_bits(arg)),
    })
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

/// `n` as a CBOR integer with the shortest head.
pub fn int(n: i64) -> Vec<u8> {
    // Major type 0 holds n >= 0; major type 1 holds -1 - n below zero.
    let (major, arg) = if n >= 0 {
        (0u8, n as u64)
    } else {
        (1, !(n as u64))
    };
    let major = major << 5;
    let mut out = Vec::with_capacity(9);
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
    out
}

/// `x` as a 64-bit CBOR float.
pub fn float(x: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    out.push(0xfb);
    out.extend(x.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn integers_are_written_with_the_shortest_head() {
        let cases: [(i64, &str); 14] = [
            (0, "00"),
            (23, "17"),
            (24, "1818"),
            (255, "18ff"),
            (256, "190100"),
            (65535, "19ffff"),
            (65536, "1a00010000"),
            (4294967295, "1affffffff"),
            (4294967296, "1b0000000100000000"),
            (i64::MAX, "1b7fffffffffffffff"),
            (-1, "20"),
            (-24, "37"),
            (-25, "3818"),
            (i64::MIN, "3b7fffffffffffffff"),
        ];
        for (n, expected) in cases {
            assert_eq!(int(n), hex(expected), "{n}");
            assert_eq!(read_number(&int(n)), Ok(Number::Int(n.into())), "{n}");
        }
        assert_eq!(float(1.5), hex("fb3ff8000000000000"));
    }

    #[test]
    fn every_head_and_float_width_reads() {
        assert_eq!(
            read_number(&hex("1bffffffffffffffff")),
            Ok(Number::Int(u64::MAX.into()))
        );
        assert_eq!(
            read_number(&hex("3bffffffffffffffff")),
            Ok(Number::Int(-(1 << 64)))
        );
        assert_eq!(
            read_number(&hex("190017")),
            Ok(Number::Int(23)),
            "not the shortest"
        );
        assert_eq!(read_number(&hex("f93e00")), Ok(Number::Float(1.5)));
        assert_eq!(
            read_number(&hex("f90001")),
            Ok(Number::Float(2f64.powi(-24)))
        );
        assert_eq!(
            read_number(&hex("f9fc00")),
            Ok(Number::Float(f64::NEG_INFINITY))
        );
        assert_eq!(read_number(&hex("fa3fc00000")), Ok(Number::Float(1.5)));
        assert_eq!(
            read_number(&hex("fbc010000000000000")),
            Ok(Number::Float(-4.0))
        );
        assert!(matches!(read_number(&hex("f97e00")), Ok(Number::Float(x)) if x.is_nan()));
    }

    #[test]
    fn anything_else_says_what_it_is() {
        let cases = [
            ("", "no bytes"),
            ("6161", "text"),
            ("4101", "bytes"),
            ("8101", "an array"),
            ("a0", "a map"),
            ("d99ca44100", "a tagged value"),
            ("f5", "a boolean"),
            ("f6", "null"),
            ("f7", "a CBOR simple value"),
            ("1c", "bytes that are not CBOR (initial byte 0x1c)"),
            ("1901", "2 bytes that end inside a number"),
            ("fb3ff8", "3 bytes that end inside a number"),
            ("0101", "a number followed by 1 more bytes"),
            ("0100000000000000", "a number followed by 7 more bytes"),
        ];
        for (bytes, found) in cases {
            assert_eq!(read_number(&hex(bytes)), Err(found.into()), "{bytes}");
        }
    }
}
