// The payload encoding of wit/ENCODING.md: a subset of CBOR (RFC 8949) that
// every SDK writes and reads, so that a program in one language can call
// actors written in another.
//
// Plain JavaScript with no imports: it runs under QuickJS inside a
// component (which has no TextEncoder or TextDecoder) and under Node for
// the tests.
//
// Writing (`encode`):
//   null, undefined          -> null (f6)
//   true, false              -> f5, f4
//   an integral Number       -> an integer, shortest head (-0 is 0)
//   other Numbers, float(x)  -> a 64-bit float (fb)
//   BigInt                   -> an integer (-2^64 .. 2^64-1, else an error)
//   string                   -> text
//   Uint8Array, ArrayBuffer  -> bytes
//   Array, other typed arrays, Set -> an array
//   Map                      -> a map (keys as written)
//   other objects            -> a map of their own enumerable string keys,
//                               in the order JavaScript lists them
//   Tagged                   -> the tag over its value
//   an object with a [ENCODE] method -> what that method returns, encoded
// Reading (`decode`):
//   integers                 -> Number when safe (|n| <= 2^53-1), else BigInt
//   floats (16, 32, 64 bits) -> Number
//   text, bytes              -> string, Uint8Array
//   arrays                   -> Array
//   maps with text keys only -> a plain object; other maps -> Map
//   tags 40100, 40101, 40102 -> Tagged (or what options.tags makes of them)
//   tag 40103 (Python pickle), other tags, indefinite lengths, simple
//   values other than false/true/null, invalid UTF-8, trailing bytes and a
//   payload cut short -> CodecError, saying why.

/** An actor mesh reference: bytes of `actor-mesh.to-ref`. */
export const TAG_ACTOR_MESH = 40100;
/** An RDMA buffer reference: bytes of `buffer.to-ref`. */
export const TAG_BUFFER = 40101;
/** Call arguments with keywords: [positional array, keyword map]. */
export const TAG_KWARGS = 40102;
/** A Python object as pickle bytes; only Python reads it. */
export const TAG_PICKLE = 40103;

/** The method an object defines to say how it is encoded. */
export const ENCODE = Symbol.for("monarch.encode");

/** The deepest nesting of arrays, maps and tags read or written. */
export const MAX_DEPTH = 256;

/** A payload that cannot be encoded or decoded; the message says why. */
export class CodecError extends Error {
  constructor(message) {
    super(message);
    this.name = "CodecError";
  }
}

/** A CBOR tag over a value. */
export class Tagged {
  constructor(tag, value) {
    this.tag = tag;
    this.value = value;
  }
}

/** A Number always written as a float (`2` alone is written as an integer). */
export class Float {
  constructor(value) {
    this.value = Number(value);
  }
}

/** `value` written as a 64-bit float even when it is integral: float(2) is 2.0. */
export function float(value) {
  return new Float(value);
}

/** Keyword arguments for a call or a spawn: pass `kwargs({...})` last. */
export class Kwargs {
  constructor(keywords) {
    this.keywords = keywords;
  }
}

/** Marks `keywords` (an object) as keyword arguments. */
export function kwargs(keywords) {
  return new Kwargs(keywords);
}

// ---------------------------------------------------------------- writing

const TWO_32 = 4294967296;
const MAX_U64 = 18446744073709551615n;

class Writer {
  constructor() {
    this.buf = new Uint8Array(64);
    this.len = 0;
  }

  reserve(n) {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const grown = new Uint8Array(size);
    grown.set(this.buf.subarray(0, this.len));
    this.buf = grown;
  }

  byte(b) {
    this.reserve(1);
    this.buf[this.len++] = b;
  }

  bytes(src) {
    this.reserve(src.length);
    this.buf.set(src, this.len);
    this.len += src.length;
  }

  /** A head: major type and argument (a Number up to 2^53 or a BigInt). */
  head(major, n) {
    const m = major << 5;
    if (typeof n === "bigint") {
      if (n < 9007199254740992n) return this.head(major, Number(n));
      this.byte(m | 27);
      this.reserve(8);
      for (let shift = 56n; shift >= 0n; shift -= 8n) {
        this.buf[this.len++] = Number((n >> shift) & 0xffn);
      }
      return;
    }
    if (n < 24) {
      this.byte(m | n);
    } else if (n < 0x100) {
      this.byte(m | 24);
      this.byte(n);
    } else if (n < 0x10000) {
      this.byte(m | 25);
      this.byte(n >>> 8);
      this.byte(n & 0xff);
    } else if (n < TWO_32) {
      this.byte(m | 26);
      this.u32(n);
    } else {
      this.byte(m | 27);
      this.u32(Math.floor(n / TWO_32));
      this.u32(n % TWO_32);
    }
  }

  u32(n) {
    this.reserve(4);
    this.buf[this.len++] = n >>> 24;
    this.buf[this.len++] = (n >>> 16) & 0xff;
    this.buf[this.len++] = (n >>> 8) & 0xff;
    this.buf[this.len++] = n & 0xff;
  }

  float(x) {
    this.byte(0xfb);
    this.reserve(8);
    new DataView(this.buf.buffer, this.buf.byteOffset + this.len, 8).setFloat64(0, x, false);
    this.len += 8;
  }

  integer(n) {
    if (typeof n === "number") {
      if (n >= 0) return this.head(0, n);
      return this.head(1, -1 - n);
    }
    if (n > MAX_U64 || n < -MAX_U64 - 1n) {
      throw new CodecError(`the integer ${n} is outside -2^64 .. 2^64-1, which CBOR cannot carry`);
    }
    if (n >= 0n) return this.head(0, n);
    return this.head(1, -1n - n);
  }

  text(s) {
    const bytes = utf8Encode(s);
    this.head(3, bytes.length);
    this.bytes(bytes);
  }

  value(v, depth) {
    if (depth > MAX_DEPTH) {
      throw new CodecError(`a value nested deeper than ${MAX_DEPTH} levels (is it a cycle?)`);
    }
    switch (typeof v) {
      case "undefined":
        return this.byte(0xf6);
      case "boolean":
        return this.byte(v ? 0xf5 : 0xf4);
      case "number":
        if (Number.isSafeInteger(v)) return this.integer(v === 0 ? 0 : v);
        if (Number.isInteger(v) && Math.abs(v) <= 18446744073709551616) {
          const big = BigInt(v);
          if (big <= MAX_U64 && big >= -MAX_U64 - 1n) return this.integer(big);
        }
        return this.float(v);
      case "bigint":
        return this.integer(v);
      case "string":
        return this.text(v);
      case "object":
        return this.object(v, depth);
      default:
        throw new CodecError(`a ${typeof v} cannot be encoded (only data: null, booleans, numbers, strings, bytes, arrays, maps and objects)`);
    }
  }

  object(v, depth) {
    if (v === null) return this.byte(0xf6);
    if (v instanceof Float) return this.float(v.value);
    if (v instanceof Uint8Array) {
      this.head(2, v.length);
      return this.bytes(v);
    }
    if (v instanceof ArrayBuffer) return this.object(new Uint8Array(v), depth);
    if (Array.isArray(v) || ArrayBuffer.isView(v) || v instanceof Set) {
      const items = Array.isArray(v) ? v : Array.from(v);
      this.head(4, items.length);
      for (const item of items) this.value(item, depth + 1);
      return;
    }
    if (v instanceof Tagged) {
      if (v.tag !== TAG_ACTOR_MESH && v.tag !== TAG_BUFFER && v.tag !== TAG_KWARGS) {
        throw new CodecError(`tag ${v.tag} cannot be written from JavaScript (only ${TAG_ACTOR_MESH}, ${TAG_BUFFER} and ${TAG_KWARGS})`);
      }
      this.head(6, v.tag);
      return this.value(v.value, depth + 1);
    }
    if (typeof v[ENCODE] === "function") return this.value(v[ENCODE](), depth + 1);
    if (v instanceof Kwargs) {
      throw new CodecError("kwargs(...) is only valid as the last argument of a call or a spawn");
    }
    if (v instanceof Map) {
      this.head(5, v.size);
      for (const [key, item] of v) {
        this.value(key, depth + 1);
        this.value(item, depth + 1);
      }
      return;
    }
    const keys = Object.keys(v);
    this.head(5, keys.length);
    for (const key of keys) {
      this.text(key);
      this.value(v[key], depth + 1);
    }
  }

  finish() {
    return this.buf.slice(0, this.len);
  }
}

/** Encodes one value (see the table at the top of this file). */
export function encode(value) {
  const w = new Writer();
  w.value(value, 0);
  return w.finish();
}

/**
 * Encodes an argument list (a message or an init): an array of the
 * positional arguments, or tag 40102 over [positional, keywords] when the
 * last argument is `kwargs({...})`.
 */
export function encodeArgs(args) {
  const last = args.length > 0 ? args[args.length - 1] : undefined;
  if (last instanceof Kwargs) {
    const keywords = last.keywords instanceof Map ? last.keywords : new Map(Object.entries(last.keywords ?? {}));
    for (const key of keywords.keys()) {
      if (typeof key !== "string") throw new CodecError("keyword argument names must be strings");
    }
    return encode(new Tagged(TAG_KWARGS, [args.slice(0, -1), keywords]));
  }
  return encode(args);
}

// ---------------------------------------------------------------- reading

class Reader {
  constructor(bytes, options) {
    if (!(bytes instanceof Uint8Array)) {
      if (bytes instanceof ArrayBuffer) bytes = new Uint8Array(bytes);
      else if (Array.isArray(bytes)) bytes = Uint8Array.from(bytes);
      else throw new CodecError("a payload must be a Uint8Array");
    }
    this.bytes = bytes;
    this.pos = 0;
    this.tags = (options && options.tags) || {};
  }

  need(n, what) {
    if (this.pos + n > this.bytes.length) {
      throw new CodecError(`truncated payload: ${what} at byte ${this.pos} needs ${n} more bytes, ${this.bytes.length - this.pos} remain`);
    }
  }

  u8() {
    this.need(1, "a value");
    return this.bytes[this.pos++];
  }

  /** Reads a head's argument: a Number, or a BigInt beyond 2^53-1. */
  argument(info, start) {
    if (info < 24) return info;
    if (info === 24) {
      this.need(1, "a 1-byte argument");
      return this.bytes[this.pos++];
    }
    if (info === 25) {
      this.need(2, "a 2-byte argument");
      const b = this.bytes;
      const n = (b[this.pos] << 8) | b[this.pos + 1];
      this.pos += 2;
      return n;
    }
    if (info === 26) {
      this.need(4, "a 4-byte argument");
      const n = this.u32At(this.pos);
      this.pos += 4;
      return n;
    }
    if (info === 27) {
      this.need(8, "an 8-byte argument");
      const hi = this.u32At(this.pos);
      const lo = this.u32At(this.pos + 4);
      this.pos += 8;
      if (hi < 0x200000) return hi * TWO_32 + lo;
      return (BigInt(hi) << 32n) | BigInt(lo);
    }
    if (info === 31) {
      throw new CodecError(`indefinite lengths are not part of the encoding (byte ${start})`);
    }
    throw new CodecError(`not well-formed: reserved additional information ${info} at byte ${start}`);
  }

  u32At(i) {
    const b = this.bytes;
    return ((b[i] << 24) >>> 0) + (b[i + 1] << 16) + (b[i + 2] << 8) + b[i + 3];
  }

  /** A length: at most what is left of the payload, as a Number. */
  length(info, start, what, unit) {
    const n = this.argument(info, start);
    const left = this.bytes.length - this.pos;
    if (typeof n === "bigint" || n * unit > left) {
      throw new CodecError(`truncated payload: ${what} at byte ${start} declares ${n} items, only ${left} bytes remain`);
    }
    return n;
  }

  value(depth) {
    if (depth > MAX_DEPTH) {
      throw new CodecError(`values nested deeper than ${MAX_DEPTH} levels`);
    }
    const start = this.pos;
    const initial = this.u8();
    const major = initial >> 5;
    const info = initial & 31;
    switch (major) {
      case 0:
        return this.argument(info, start);
      case 1: {
        const n = this.argument(info, start);
        if (typeof n === "number") return n < 9007199254740991 ? -1 - n : -9007199254740992n;
        const v = -1n - n;
        return v >= -9007199254740991n ? Number(v) : v;
      }
      case 2: {
        const n = this.length(info, start, "bytes", 1);
        const out = this.bytes.slice(this.pos, this.pos + n);
        this.pos += n;
        return out;
      }
      case 3: {
        const n = this.length(info, start, "text", 1);
        const s = utf8Decode(this.bytes, this.pos, this.pos + n, start);
        this.pos += n;
        return s;
      }
      case 4: {
        const n = this.length(info, start, "an array", 1);
        const out = new Array(n);
        for (let i = 0; i < n; i++) out[i] = this.value(depth + 1);
        return out;
      }
      case 5:
        return this.map(this.length(info, start, "a map", 2), depth);
      case 6:
        return this.tag(this.argument(info, start), start, depth);
      default:
        return this.simple(info, start);
    }
  }

  map(n, depth) {
    const keys = new Array(n);
    const values = new Array(n);
    let allText = true;
    for (let i = 0; i < n; i++) {
      keys[i] = this.value(depth + 1);
      values[i] = this.value(depth + 1);
      if (typeof keys[i] !== "string") allText = false;
    }
    if (!allText) {
      const m = new Map();
      for (let i = 0; i < n; i++) m.set(keys[i], values[i]);
      return m;
    }
    const obj = {};
    for (let i = 0; i < n; i++) {
      // defineProperty: a key named "__proto__" is data, not the prototype.
      Object.defineProperty(obj, keys[i], { value: values[i], enumerable: true, writable: true, configurable: true });
    }
    return obj;
  }

  tag(tag, start, depth) {
    const content = this.value(depth + 1);
    const wants = (ok, shape) => {
      if (!ok) throw new CodecError(`tag ${tag} at byte ${start} must hold ${shape}`);
    };
    switch (tag) {
      case TAG_ACTOR_MESH:
      case TAG_BUFFER:
        wants(content instanceof Uint8Array, "bytes");
        break;
      case TAG_KWARGS:
        wants(
          Array.isArray(content) && content.length === 2 && Array.isArray(content[0]) &&
            content[1] !== null && typeof content[1] === "object" && !(content[1] instanceof Map) &&
            !Array.isArray(content[1]) && !(content[1] instanceof Uint8Array) && !(content[1] instanceof Tagged),
          "[positional array, map with text keys]",
        );
        break;
      case TAG_PICKLE:
        throw new CodecError(
          `a Python object (pickle, CBOR tag ${TAG_PICKLE} at byte ${start}) cannot be read in JavaScript; ` +
            "send plain values (None, bool, int, float, str, bytes, list, tuple, dict) from Python instead",
        );
      default:
        throw new CodecError(`unknown tag ${tag} at byte ${start} (the encoding has tags ${TAG_ACTOR_MESH}..${TAG_PICKLE} only)`);
    }
    const make = this.tags[tag];
    return make ? make(content) : new Tagged(tag, content);
  }

  simple(info, start) {
    switch (info) {
      case 20:
        return false;
      case 21:
        return true;
      case 22:
        return null;
      case 25: {
        this.need(2, "a 16-bit float");
        const half = (this.bytes[this.pos] << 8) | this.bytes[this.pos + 1];
        this.pos += 2;
        return halfToNumber(half);
      }
      case 26: {
        this.need(4, "a 32-bit float");
        const x = new DataView(this.bytes.buffer, this.bytes.byteOffset + this.pos, 4).getFloat32(0, false);
        this.pos += 4;
        return x;
      }
      case 27: {
        this.need(8, "a 64-bit float");
        const x = new DataView(this.bytes.buffer, this.bytes.byteOffset + this.pos, 8).getFloat64(0, false);
        this.pos += 8;
        return x;
      }
      case 31:
        throw new CodecError(`not well-formed: a "break" at byte ${start} outside an indefinite length`);
      default:
        if (info === 24) this.need(1, "a simple value");
        throw new CodecError(`simple value ${info === 24 ? this.bytes[this.pos] : info} at byte ${start} is not part of the encoding (only false, true and null)`);
    }
  }
}

function halfToNumber(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/**
 * Decodes one whole payload. `options.tags` maps a tag (40100, 40101,
 * 40102) to a function that makes the value from the tag's content.
 */
export function decode(bytes, options) {
  const r = new Reader(bytes, options);
  const value = r.value(0);
  if (r.pos !== r.bytes.length) {
    throw new CodecError(`${r.bytes.length - r.pos} trailing bytes after the value (which ends at byte ${r.pos}); is the payload of another type?`);
  }
  return value;
}

/** Decodes a CBOR sequence (the host's `concat` reducer): every value, in order. */
export function decodeSequence(bytes, options) {
  const r = new Reader(bytes, options);
  const values = [];
  while (r.pos < r.bytes.length) values.push(r.value(0));
  return values;
}

/**
 * Decodes an argument list (a message or an init) into `{ args, kwargs }`:
 * `args` the positional arguments, `kwargs` an object of the keyword
 * arguments, or null when there are none.
 */
export function decodeArgs(bytes, options) {
  const own = (options && options.tags) || {};
  // Tag 40102 is read here, not by options.tags: it is only valid at the top.
  const tags = Object.assign({}, own, { [TAG_KWARGS]: (content) => new Tagged(TAG_KWARGS, content) });
  const value = decode(bytes, { tags });
  if (Array.isArray(value)) return { args: value, kwargs: null };
  if (value instanceof Tagged && value.tag === TAG_KWARGS) {
    return { args: value.value[0], kwargs: value.value[1] };
  }
  throw new CodecError(`an argument list must be an array (or tag ${TAG_KWARGS}), not ${describe(value)}`);
}

function describe(v) {
  if (v === null) return "null";
  if (v instanceof Uint8Array) return "bytes";
  if (v instanceof Map) return "a map";
  if (v instanceof Tagged) return `tag ${v.tag}`;
  return typeof v === "object" ? "a map" : `a ${typeof v}`;
}

// ------------------------------------------------------------------ UTF-8

/** UTF-8 bytes of `s`; a lone surrogate becomes U+FFFD, as TextEncoder does. */
export function utf8Encode(s) {
  let ascii = true;
  for (let i = 0; i < s.length; i++) {
    if (s.charCodeAt(i) > 0x7f) {
      ascii = false;
      break;
    }
  }
  if (ascii) {
    const out = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  const out = new Uint8Array(s.length * 3);
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    let c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdfff) {
      const next = i + 1 < s.length ? s.charCodeAt(i + 1) : 0;
      if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        c = 0x10000 + ((c - 0xd800) << 10) + (next - 0xdc00);
        i++;
      } else {
        c = 0xfffd;
      }
    }
    if (c < 0x80) {
      out[n++] = c;
    } else if (c < 0x800) {
      out[n++] = 0xc0 | (c >> 6);
      out[n++] = 0x80 | (c & 0x3f);
    } else if (c < 0x10000) {
      out[n++] = 0xe0 | (c >> 12);
      out[n++] = 0x80 | ((c >> 6) & 0x3f);
      out[n++] = 0x80 | (c & 0x3f);
    } else {
      out[n++] = 0xf0 | (c >> 18);
      out[n++] = 0x80 | ((c >> 12) & 0x3f);
      out[n++] = 0x80 | ((c >> 6) & 0x3f);
      out[n++] = 0x80 | (c & 0x3f);
    }
  }
  return out.slice(0, n);
}

/** Decodes bytes[from, to) as UTF-8; anything else is a CodecError. */
export function utf8Decode(bytes, from = 0, to = bytes.length, at = from) {
  let s = "";
  let chunk = [];
  const bad = (i) => {
    throw new CodecError(`invalid UTF-8 in the text at byte ${at} (at its byte ${i - from})`);
  };
  for (let i = from; i < to; ) {
    const b = bytes[i];
    let c;
    if (b < 0x80) {
      c = b;
      i += 1;
    } else {
      let n, min;
      if (b >= 0xc2 && b <= 0xdf) {
        n = 1;
        c = b & 0x1f;
        min = 0x80;
      } else if (b >= 0xe0 && b <= 0xef) {
        n = 2;
        c = b & 0x0f;
        min = 0x800;
      } else if (b >= 0xf0 && b <= 0xf4) {
        n = 3;
        c = b & 0x07;
        min = 0x10000;
      } else {
        bad(i);
      }
      if (i + n >= to) bad(i);
      for (let k = 1; k <= n; k++) {
        const cont = bytes[i + k];
        if ((cont & 0xc0) !== 0x80) bad(i);
        c = (c << 6) | (cont & 0x3f);
      }
      if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) bad(i);
      i += n + 1;
    }
    if (c >= 0x10000) {
      c -= 0x10000;
      chunk.push(0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
    } else {
      chunk.push(c);
    }
    if (chunk.length >= 4096) {
      s += String.fromCharCode.apply(null, chunk);
      chunk = [];
    }
  }
  return s + String.fromCharCode.apply(null, chunk);
}
