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
//
// One buffer for every encode (QuickJS pays for each allocation and each
// method call, so the writer is plain functions over module state); a
// nested encode (from an object's own encode hook) gets a buffer of its own.

const TWO_32 = 4294967296;
const MAX_U64 = 18446744073709551615n;
const F64 = new Float64Array(1);
const F64_BYTES = new Uint8Array(F64.buffer);
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

let out = new Uint8Array(256);
let pos = 0;
let busy = false;

function grow(n) {
  if (pos + n <= out.length) return;
  let size = out.length * 2;
  while (size < pos + n) size *= 2;
  const grown = new Uint8Array(size);
  grown.set(out.subarray(0, pos));
  out = grown;
}

/** A head: major type and argument (a Number below 2^53, or a BigInt). */
function head(major, n) {
  grow(9);
  const m = major << 5;
  if (typeof n === "bigint") {
    if (n < 9007199254740992n) return head(major, Number(n));
    out[pos++] = m | 27;
    for (let shift = 56n; shift >= 0n; shift -= 8n) out[pos++] = Number((n >> shift) & 0xffn);
  } else if (n < 24) {
    out[pos++] = m | n;
  } else if (n < 0x100) {
    out[pos++] = m | 24;
    out[pos++] = n;
  } else if (n < 0x10000) {
    out[pos++] = m | 25;
    out[pos++] = n >>> 8;
    out[pos++] = n & 0xff;
  } else if (n < TWO_32) {
    out[pos++] = m | 26;
    writeU32(n);
  } else {
    out[pos++] = m | 27;
    writeU32(Math.floor(n / TWO_32));
    writeU32(n % TWO_32);
  }
}

function writeU32(n) {
  out[pos++] = n >>> 24;
  out[pos++] = (n >>> 16) & 0xff;
  out[pos++] = (n >>> 8) & 0xff;
  out[pos++] = n & 0xff;
}

function writeFloat(x) {
  grow(9);
  out[pos++] = 0xfb;
  F64[0] = x;
  if (LITTLE_ENDIAN) for (let i = 7; i >= 0; i--) out[pos++] = F64_BYTES[i];
  else for (let i = 0; i < 8; i++) out[pos++] = F64_BYTES[i];
}

function writeInteger(n) {
  if (typeof n === "number") return n >= 0 ? head(0, n) : head(1, -1 - n);
  if (n > MAX_U64 || n < -MAX_U64 - 1n) {
    throw new CodecError(`the integer ${n} is outside -2^64 .. 2^64-1, which CBOR cannot carry`);
  }
  return n >= 0n ? head(0, n) : head(1, -1n - n);
}

function writeText(s) {
  const n = s.length;
  // Optimistically ASCII: the length in bytes is the length in chars.
  const start = pos;
  head(3, n);
  grow(n);
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i);
    if (c > 0x7f) {
      pos = start;
      const bytes = utf8Encode(s);
      head(3, bytes.length);
      writeBytes(bytes);
      return;
    }
    out[pos++] = c;
  }
}

function writeBytes(bytes) {
  grow(bytes.length);
  out.set(bytes, pos);
  pos += bytes.length;
}

function writeValue(v, depth) {
  if (depth > MAX_DEPTH) {
    throw new CodecError(`a value nested deeper than ${MAX_DEPTH} levels (is it a cycle?)`);
  }
  switch (typeof v) {
    case "number":
      if (Number.isSafeInteger(v)) return writeInteger(v === 0 ? 0 : v);
      if (Number.isInteger(v) && Math.abs(v) <= 18446744073709551616) {
        const big = BigInt(v);
        if (big <= MAX_U64 && big >= -MAX_U64 - 1n) return writeInteger(big);
      }
      return writeFloat(v);
    case "string":
      return writeText(v);
    case "object":
      return writeObject(v, depth);
    case "boolean":
      grow(1);
      out[pos++] = v ? 0xf5 : 0xf4;
      return;
    case "undefined":
      grow(1);
      out[pos++] = 0xf6;
      return;
    case "bigint":
      return writeInteger(v);
    default:
      throw new CodecError(`a ${typeof v} cannot be encoded (only data: null, booleans, numbers, strings, bytes, arrays, maps and objects)`);
  }
}

function writeObject(v, depth) {
  if (v === null) {
    grow(1);
    out[pos++] = 0xf6;
    return;
  }
  if (Array.isArray(v)) {
    head(4, v.length);
    for (let i = 0; i < v.length; i++) writeValue(v[i], depth + 1);
    return;
  }
  if (v instanceof Uint8Array) {
    head(2, v.length);
    return writeBytes(v);
  }
  if (v instanceof Float) return writeFloat(v.value);
  if (v instanceof ArrayBuffer) return writeObject(new Uint8Array(v), depth);
  if (ArrayBuffer.isView(v) || v instanceof Set) return writeObject(Array.from(v), depth);
  if (v instanceof Tagged) {
    if (v.tag !== TAG_ACTOR_MESH && v.tag !== TAG_BUFFER && v.tag !== TAG_KWARGS) {
      throw new CodecError(`tag ${v.tag} cannot be written from JavaScript (only ${TAG_ACTOR_MESH}, ${TAG_BUFFER} and ${TAG_KWARGS})`);
    }
    head(6, v.tag);
    return writeValue(v.value, depth + 1);
  }
  if (typeof v[ENCODE] === "function") return writeValue(v[ENCODE](), depth + 1);
  if (typeof v.then === "function") {
    throw new CodecError("a Promise cannot be encoded: async functions never resume here (no promise jobs run under QuickJS's synchronous build); wait with .get() instead");
  }
  if (v instanceof Kwargs) {
    throw new CodecError("kwargs(...) is only valid as the last argument of a call or a spawn");
  }
  if (v instanceof Map) {
    head(5, v.size);
    for (const [key, item] of v) {
      writeValue(key, depth + 1);
      writeValue(item, depth + 1);
    }
    return;
  }
  const keys = Object.keys(v);
  head(5, keys.length);
  for (let i = 0; i < keys.length; i++) {
    writeText(keys[i]);
    writeValue(v[keys[i]], depth + 1);
  }
}

/** Encodes one value (see the table at the top of this file). */
export function encode(value) {
  const nested = busy;
  const savedOut = out;
  const savedPos = pos;
  if (nested) out = new Uint8Array(64);
  busy = true;
  pos = 0;
  try {
    writeValue(value, 0);
    return out.slice(0, pos);
  } finally {
    if (nested) {
      out = savedOut;
      pos = savedPos;
    } else {
      busy = false;
      if (out.length > 1048576) out = new Uint8Array(256);
    }
  }
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
//
// Plain functions over module state too; decode saves and restores it, so
// a tag hook may decode on its own.

let src = null;
let at = 0;
let hooks = null;

function toBytes(bytes) {
  if (bytes instanceof Uint8Array) return bytes;
  if (bytes instanceof ArrayBuffer) return new Uint8Array(bytes);
  if (Array.isArray(bytes)) return Uint8Array.from(bytes);
  throw new CodecError("a payload must be a Uint8Array");
}

function need(n, what) {
  if (at + n > src.length) {
    throw new CodecError(`truncated payload: ${what} at byte ${at} needs ${n} more bytes, ${src.length - at} remain`);
  }
}

function readU32(i) {
  return ((src[i] << 24) >>> 0) + (src[i + 1] << 16) + (src[i + 2] << 8) + src[i + 3];
}

/** A head's argument: a Number, or a BigInt from 2^53 on. */
function argument(info, start) {
  if (info < 24) return info;
  if (info === 24) {
    need(1, "a 1-byte argument");
    return src[at++];
  }
  if (info === 25) {
    need(2, "a 2-byte argument");
    const n = (src[at] << 8) | src[at + 1];
    at += 2;
    return n;
  }
  if (info === 26) {
    need(4, "a 4-byte argument");
    const n = readU32(at);
    at += 4;
    return n;
  }
  if (info === 27) {
    need(8, "an 8-byte argument");
    const hi = readU32(at);
    const lo = readU32(at + 4);
    at += 8;
    if (hi < 0x200000) return hi * TWO_32 + lo;
    return (BigInt(hi) << 32n) | BigInt(lo);
  }
  if (info === 31) throw new CodecError(`indefinite lengths are not part of the encoding (byte ${start})`);
  throw new CodecError(`not well-formed: reserved additional information ${info} at byte ${start}`);
}

/** A length: at most what is left of the payload (each item takes `unit` bytes at least). */
function readLength(info, start, what, unit) {
  const n = argument(info, start);
  const left = src.length - at;
  if (typeof n === "bigint" || n * unit > left) {
    throw new CodecError(`truncated payload: ${what} at byte ${start} declares ${n} items, only ${left} bytes remain`);
  }
  return n;
}

function readValue(depth) {
  if (depth > MAX_DEPTH) throw new CodecError(`values nested deeper than ${MAX_DEPTH} levels`);
  const start = at;
  need(1, "a value");
  const initial = src[at++];
  const info = initial & 31;
  switch (initial >> 5) {
    case 0:
      return argument(info, start);
    case 1: {
      const n = argument(info, start);
      if (typeof n === "number") return n < 9007199254740991 ? -1 - n : -9007199254740992n;
      const v = -1n - n;
      return v >= -9007199254740991n ? Number(v) : v;
    }
    case 2: {
      const n = readLength(info, start, "bytes", 1);
      const bytes = src.slice(at, at + n);
      at += n;
      return bytes;
    }
    case 3: {
      const n = readLength(info, start, "text", 1);
      const text = utf8Decode(src, at, at + n, start);
      at += n;
      return text;
    }
    case 4: {
      const n = readLength(info, start, "an array", 1);
      const items = new Array(n);
      for (let i = 0; i < n; i++) items[i] = readValue(depth + 1);
      return items;
    }
    case 5:
      return readMap(readLength(info, start, "a map", 2), depth);
    case 6:
      return readTag(argument(info, start), start, depth);
    default:
      return readSimple(info, start);
  }
}

function readMap(n, depth) {
  const keys = new Array(n);
  const values = new Array(n);
  let allText = true;
  for (let i = 0; i < n; i++) {
    keys[i] = readValue(depth + 1);
    values[i] = readValue(depth + 1);
    if (typeof keys[i] !== "string") allText = false;
  }
  if (!allText) {
    const m = new Map();
    for (let i = 0; i < n; i++) m.set(keys[i], values[i]);
    return m;
  }
  const obj = {};
  for (let i = 0; i < n; i++) {
    if (keys[i] === "__proto__") {
      // Data, not the prototype.
      Object.defineProperty(obj, keys[i], { value: values[i], enumerable: true, writable: true, configurable: true });
    } else {
      obj[keys[i]] = values[i];
    }
  }
  return obj;
}

function readTag(tag, start, depth) {
  const content = readValue(depth + 1);
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
  const make = hooks && hooks[tag];
  if (!make) return new Tagged(tag, content);
  // The hook may decode on its own (decode saves and restores the state).
  return make(content);
}

function readSimple(info, start) {
  switch (info) {
    case 20:
      return false;
    case 21:
      return true;
    case 22:
      return null;
    case 25: {
      need(2, "a 16-bit float");
      const half = (src[at] << 8) | src[at + 1];
      at += 2;
      return halfToNumber(half);
    }
    case 26: {
      need(4, "a 32-bit float");
      const x = new DataView(src.buffer, src.byteOffset + at, 4).getFloat32(0, false);
      at += 4;
      return x;
    }
    case 27: {
      need(8, "a 64-bit float");
      if (LITTLE_ENDIAN) for (let i = 7; i >= 0; i--) F64_BYTES[i] = src[at++];
      else for (let i = 0; i < 8; i++) F64_BYTES[i] = src[at++];
      return F64[0];
    }
    case 31:
      throw new CodecError(`not well-formed: a "break" at byte ${start} outside an indefinite length`);
    default:
      if (info === 24) need(1, "a simple value");
      throw new CodecError(`simple value ${info === 24 ? src[at] : info} at byte ${start} is not part of the encoding (only false, true and null)`);
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

/** Reads `bytes` whole: one value, or (`sequence`) every value in order. */
function readPayload(bytes, options, sequence) {
  const src0 = src;
  const at0 = at;
  const hooks0 = hooks;
  src = toBytes(bytes);
  at = 0;
  hooks = (options && options.tags) || null;
  try {
    if (sequence) {
      const values = [];
      while (at < src.length) values.push(readValue(0));
      return values;
    }
    const value = readValue(0);
    if (at !== src.length) {
      throw new CodecError(`${src.length - at} trailing bytes after the value (which ends at byte ${at}); is the payload of another type?`);
    }
    return value;
  } finally {
    src = src0;
    at = at0;
    hooks = hooks0;
  }
}

/**
 * Decodes one whole payload. `options.tags` maps a tag (40100, 40101,
 * 40102) to a function that makes the value from the tag's content.
 */
export function decode(bytes, options) {
  return readPayload(bytes, options, false);
}

/** Decodes a CBOR sequence (the host's `concat` reducer): every value, in order. */
export function decodeSequence(bytes, options) {
  return readPayload(bytes, options, true);
}

/**
 * Decodes an argument list (a message or an init) into `{ args, kwargs }`:
 * `args` the positional arguments, `kwargs` an object of the keyword
 * arguments, or null when there are none. (Tag 40102 is read here, so
 * `options.tags` should not make anything else of it.)
 */
export function decodeArgs(bytes, options) {
  const value = decode(bytes, options);
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
export function utf8Decode(bytes, from = 0, to = bytes.length, offset = from) {
  let ascii = true;
  for (let i = from; i < to; i++) {
    if (bytes[i] > 0x7f) {
      ascii = false;
      break;
    }
  }
  if (ascii && to - from <= 8192) return String.fromCharCode.apply(null, bytes.subarray(from, to));
  let s = "";
  let chunk = [];
  const bad = (i) => {
    throw new CodecError(`invalid UTF-8 in the text at byte ${offset} (at its byte ${i - from})`);
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
