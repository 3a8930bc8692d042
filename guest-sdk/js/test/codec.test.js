// The codec against the shared vectors of wit/encoding-vectors.json (when
// the file is there) and against cases of its own: what JavaScript values
// become, argument lists, and the errors a reader must give.

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  CodecError,
  Float,
  Kwargs,
  TAG_KWARGS,
  TAG_PICKLE,
  Tagged,
  decode,
  decodeArgs,
  decodeSequence,
  encode,
  encodeArgs,
  float,
  kwargs,
  utf8Decode,
  utf8Encode,
} from "../cbor.js";

const hex = (bytes) => Buffer.from(bytes).toString("hex");
const unhex = (s) => new Uint8Array(Buffer.from(s, "hex"));

// ------------------------------------------------------------ the vectors

const VECTORS = fileURLToPath(new URL("../../../wit/encoding-vectors.json", import.meta.url));

/** The JavaScript value a typed JSON value of the vectors is written from. */
function fromTyped(t) {
  const [kind] = Object.keys(t);
  const v = t[kind];
  switch (kind) {
    case "null":
      return null;
    case "bool":
      return v;
    case "int": {
      const big = BigInt(v);
      return big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
    }
    case "float":
      // A Number that is integral would be written as an integer: say float.
      return new Float(v === "nan" ? NaN : v === "inf" ? Infinity : v === "-inf" ? -Infinity : v);
    case "text":
      return v;
    case "bytes":
      return unhex(v);
    case "array":
      return v.map(fromTyped);
    case "map":
      return new Map(v.map(([k, x]) => [fromTyped(k), fromTyped(x)]));
    case "tag":
      return new Tagged(t.tag, fromTyped(t.value));
    default:
      throw new Error(`unknown typed value ${JSON.stringify(t)}`);
  }
}

/** Asserts that a decoded value is the typed JSON value `t`. */
function assertTyped(actual, t, path = "value") {
  const [kind] = Object.keys(t);
  const v = t[kind];
  switch (kind) {
    case "null":
      return assert.equal(actual, null, path);
    case "bool":
      return assert.equal(actual, v, path);
    case "int": {
      const big = BigInt(v);
      const safe = big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER);
      return assert.equal(actual, safe ? Number(big) : big, `${path}: a safe integer is a Number, a larger one a BigInt`);
    }
    case "float": {
      const want = v === "nan" ? NaN : v === "inf" ? Infinity : v === "-inf" ? -Infinity : v;
      assert.equal(typeof actual, "number", path);
      return assert.ok(Object.is(actual, want), `${path}: ${actual} is not ${want}`);
    }
    case "text":
      return assert.equal(actual, v, path);
    case "bytes":
      assert.ok(actual instanceof Uint8Array, `${path}: bytes are a Uint8Array`);
      return assert.equal(hex(actual), v, path);
    case "array":
      assert.ok(Array.isArray(actual), `${path}: an array`);
      assert.equal(actual.length, v.length, `${path}: length`);
      return v.forEach((x, i) => assertTyped(actual[i], x, `${path}[${i}]`));
    case "map": {
      const entries = actual instanceof Map ? [...actual] : Object.entries(actual);
      assert.ok(actual !== null && typeof actual === "object" && !Array.isArray(actual), `${path}: a map`);
      assert.equal(entries.length, v.length, `${path}: size`);
      if (v.every(([k]) => "text" in k)) assert.ok(!(actual instanceof Map), `${path}: text keys make an object`);
      return v.forEach(([k, x], i) => {
        assertTyped(entries[i][0], k, `${path} key ${i}`);
        assertTyped(entries[i][1], x, `${path}[${JSON.stringify(entries[i][0])}]`);
      });
    }
    case "tag":
      assert.ok(actual instanceof Tagged, `${path}: a Tagged`);
      assert.equal(actual.tag, t.tag, path);
      return assertTyped(actual.value, t.value, `${path}.value`);
    default:
      throw new Error(`unknown typed value ${JSON.stringify(t)}`);
  }
}

/** The error words the vectors name, as the codec's messages say them. */
const ERROR_WORDS = {
  truncated: /truncated/,
  "trailing bytes": /trailing bytes/,
  "indefinite length": /indefinite length/,
  "invalid UTF-8": /invalid UTF-8/,
  "unknown tag": /unknown tag/,
  "not well-formed": /not well-formed/,
};

const vectors = existsSync(VECTORS) ? JSON.parse(readFileSync(VECTORS, "utf8")) : [];

test("the shared vectors file is there", { skip: vectors.length ? false : `no ${VECTORS} yet` }, () => {
  assert.ok(vectors.length > 0);
});

for (const vector of vectors) {
  const bytes = unhex(vector.hex);
  const isPickle = vector.value && vector.value.tag === TAG_PICKLE;
  if (vector.error) {
    test(`vector: ${vector.name} is refused (${vector.error})`, () => {
      assert.throws(
        () => decode(bytes),
        (e) => e instanceof CodecError && (ERROR_WORDS[vector.error] ?? /./).test(e.message),
      );
    });
  } else if (isPickle) {
    test(`vector: ${vector.name} is refused in JavaScript, saying why`, () => {
      assert.throws(() => decode(bytes), (e) => e instanceof CodecError && /pickle/.test(e.message) && /Python/.test(e.message));
      assert.throws(() => encode(fromTyped(vector.value)), CodecError);
    });
  } else {
    test(`vector: ${vector.name} decodes`, () => {
      assertTyped(decode(bytes), vector.value);
    });
    if (!vector.decode_only) {
      test(`vector: ${vector.name} encodes`, () => {
        assert.equal(hex(encode(fromTyped(vector.value))), vector.hex);
      });
    }
  }
}

// --------------------------------------------------------- our own cases

test("integral Numbers are integers with the shortest head, others 64-bit floats", () => {
  const cases = [
    [0, "00"],
    [-0, "00"],
    [23, "17"],
    [24, "1818"],
    [-25, "3818"],
    [65536, "1a00010000"],
    [2 ** 32, "1b0000000100000000"],
    [2 ** 53, "1b0020000000000000"],
    [-(2 ** 63), "3b7fffffffffffffff"],
    [2 ** 64 - 2048, "1bfffffffffffff800"],
    [2 ** 64, "fb43f0000000000000"],
    [1.5, "fb3ff8000000000000"],
    [NaN, "fb7ff8000000000000"],
    [float(2), "fb4000000000000000"],
    [18446744073709551615n, "1bffffffffffffffff"],
    [-18446744073709551616n, "3bffffffffffffffff"],
    [5n, "05"],
  ];
  for (const [value, want] of cases) assert.equal(hex(encode(value)), want, String(value));
  assert.throws(() => encode(18446744073709551616n), /outside -2\^64 \.\. 2\^64-1/);
  assert.throws(() => encode(-18446744073709551617n), CodecError);
});

test("integers decode as Numbers when safe and as BigInts beyond 2^53", () => {
  assert.equal(decode(unhex("1b001fffffffffffff")), Number.MAX_SAFE_INTEGER);
  assert.equal(decode(unhex("1b0020000000000000")), 2n ** 53n);
  assert.equal(decode(unhex("3b001ffffffffffffe")), Number.MIN_SAFE_INTEGER);
  assert.equal(decode(unhex("3b001fffffffffffff")), -(2n ** 53n));
  assert.equal(decode(unhex("3bffffffffffffffff")), -(2n ** 64n));
});

test("JavaScript values: undefined, objects, Maps, Sets, typed arrays", () => {
  assert.equal(hex(encode(undefined)), "f6");
  assert.equal(hex(encode([undefined, null])), "82f6f6");
  assert.equal(hex(encode({ b: 1, a: [true] })), "a2616201616181f5");
  assert.equal(hex(encode(new Map([[1, "x"]]))), "a10161" + "78");
  assert.equal(hex(encode(new Set([1, 2]))), "820102");
  assert.equal(hex(encode(new Uint8Array([1, 2]))), "420102");
  assert.equal(hex(encode(new Uint8Array([1, 2]).buffer)), "420102");
  assert.equal(hex(encode(new Int32Array([1, -1]))), "820120");
  assert.equal(hex(encode(new Float64Array([0.5]))), "81fb3fe0000000000000");
  class Point {
    constructor() {
      this.x = 1;
      this.y = 2;
    }
  }
  assert.equal(hex(encode(new Point())), "a2617801617902", "a class instance is its own fields");
  assert.throws(() => encode(() => 1), /a function cannot be encoded/);
  assert.throws(() => encode(Symbol("s")), CodecError);
  const cycle = [];
  cycle.push(cycle);
  assert.throws(() => encode(cycle), /cycle/);
  assert.throws(() => encode([kwargs({ a: 1 })]), /only valid as the last argument/);
  assert.throws(() => encode({ p: Promise.resolve(1) }), /a Promise cannot be encoded.*\.get\(\)/);
});

test("an object can say how it is encoded", () => {
  const ref = { [Symbol.for("monarch.encode")]: () => new Tagged(40100, new Uint8Array([0x7b, 0x7d])) };
  assert.equal(hex(encode([ref])), "81d99ca4427b7d");
  assert.throws(() => encode(new Tagged(TAG_PICKLE, new Uint8Array())), /cannot be written from JavaScript/);
});

test("maps: text keys make a plain object whose __proto__ key is data; others a Map", () => {
  const obj = decode(encode(new Map([["__proto__", 1], ["a", 2]])));
  assert.equal(Object.getPrototypeOf(obj), Object.prototype);
  assert.deepEqual(Object.keys(obj), ["__proto__", "a"]);
  assert.equal(obj.a, 2);
  const m = decode(encode(new Map([["a", 1], [2, "b"]])));
  assert.ok(m instanceof Map);
  assert.deepEqual([...m], [["a", 1], [2, "b"]]);
});

test("round trips keep values", () => {
  const values = [
    null,
    true,
    "ü€😀",
    "",
    [1, [2, [3]], { k: "v" }],
    { nested: { deep: [1.25, -7, "x", null, false] } },
    new Uint8Array(300).map((_, i) => i),
    "x".repeat(70000),
  ];
  for (const v of values) assert.deepEqual(decode(encode(v)), v);
});

test("argument lists: positional, with keywords, and what is not one", () => {
  assert.equal(hex(encodeArgs([])), "80");
  assert.equal(hex(encodeArgs([1, 2, 3])), "83010203");
  assert.equal(hex(encodeArgs([1, 2, kwargs({ x: 3, y: "a" })])), "d99ca682820102a261780361796161");
  assert.equal(hex(encodeArgs([kwargs({ x: 1 })])), "d99ca68280a1617801");
  assert.ok(kwargs({}) instanceof Kwargs);

  assert.deepEqual(decodeArgs(unhex("83010203")), { args: [1, 2, 3], kwargs: null });
  assert.deepEqual(decodeArgs(unhex("d99ca682820102a261780361796161")), { args: [1, 2], kwargs: { x: 3, y: "a" } });
  assert.throws(() => decodeArgs(unhex("05")), /an argument list must be an array/);
  assert.throws(() => decodeArgs(unhex("d99ca68201a0")), /tag 40102 at byte 0 must hold/);
  assert.throws(() => decodeArgs(unhex("d99ca6828080")), /must hold/, "keywords must be a map");
  assert.throws(() => decodeArgs(unhex("d99ca68280a10102")), /must hold/, "keyword names are text");
});

test("tags can be turned into values by the caller", () => {
  const ref = unhex("81d99ca4427b7d");
  assert.deepEqual(decode(ref, { tags: { 40100: (bytes) => ({ mesh: hex(bytes) }) } }), [{ mesh: "7b7d" }]);
  assert.throws(() => decode(unhex("d99ca405")), /tag 40100 at byte 0 must hold bytes/);
  // Tag 40102 inside a value is read as a Tagged by decode, and only at the top by decodeArgs.
  assert.ok(decode(unhex("d99ca68280a0")) instanceof Tagged);
  assert.equal(TAG_KWARGS, 40102);
});

test("a pickle names Python and says what to send instead", () => {
  assert.throws(
    () => decodeArgs(unhex("81d99ca74480044e2e")),
    (e) => e instanceof CodecError && /Python object \(pickle, CBOR tag 40103/.test(e.message) && /send plain values/.test(e.message),
  );
});

test("the concat reducer's sequence decodes into every value", () => {
  assert.deepEqual(decodeSequence(unhex("0102f6")), [1, 2, null]);
  assert.deepEqual(decodeSequence(new Uint8Array()), []);
  assert.throws(() => decodeSequence(unhex("0119")), /truncated/);
});

test("readers refuse simple values outside the subset and bad UTF-8", () => {
  assert.throws(() => decode(unhex("f7")), /simple value 23/);
  assert.throws(() => decode(unhex("f820")), /simple value 32/);
  for (const bad of ["c0", "c1", "f5808080", "e08080", "f4908080", "edbfbf", "e282"]) {
    assert.throws(() => utf8Decode(unhex(bad)), /invalid UTF-8/, bad);
  }
  assert.equal(utf8Decode(unhex("f4 8f bf bf".replace(/ /g, ""))), "\u{10ffff}");
});

test("UTF-8 matches the platform's encoder and decoder", () => {
  const samples = ["plain", "é", "€", "😀 and 水", "\u0000\u007f\u0080\u07ff\u0800\uffff", "\ud800 lone", "end \udc00"];
  for (const s of samples) {
    assert.equal(hex(utf8Encode(s)), hex(new TextEncoder().encode(s)), JSON.stringify(s));
    const bytes = new TextEncoder().encode(s);
    assert.equal(utf8Decode(bytes), new TextDecoder().decode(bytes));
  }
  const long = "ab€😀".repeat(5000);
  assert.equal(utf8Decode(utf8Encode(long)), long);
});

test("deep nesting is refused, not a stack overflow", () => {
  const deep = new Uint8Array(100000).fill(0x81);
  assert.throws(() => decode(deep), /nested deeper/);
});
