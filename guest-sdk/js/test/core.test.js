// Shapes, value meshes, errors and the event loop, with a scripted mailbox
// in place of the host's `next-events`.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  ActorError,
  CallError,
  Extent,
  Failure,
  Future,
  Reactor,
  SupervisionError,
  ValueMesh,
  callError,
  endpointError,
  formatLine,
  inspect,
} from "../core.js";
import { CodecError, encode } from "../cbor.js";

test("an extent names its dimensions and numbers its points row-major", () => {
  const e = new Extent({ hosts: 2, gpus: 3 });
  assert.equal(e.size, 6);
  assert.deepEqual(e.names, ["hosts", "gpus"]);
  assert.deepEqual(e.sizes, [2, 3]);
  assert.equal(String(e), "hosts=2, gpus=3");
  assert.deepEqual(e.point(4).coords, { hosts: 1, gpus: 1 });
  assert.equal(String(e.point(5)), "{hosts=1, gpus=2}");
  assert.equal(e.rankOf({ hosts: 1, gpus: 2 }), 5);
  assert.deepEqual(e.points().map((p) => p.rank), [0, 1, 2, 3, 4, 5]);
  assert.deepEqual(new Extent([{ name: "procs", size: 4 }]).toObject(), { procs: 4 });
  assert.equal(new Extent([]).size, 1);
  assert.throws(() => e.point(6), RangeError);
  assert.throws(() => e.rankOf({ hosts: 2, gpus: 0 }), /hosts=2 is outside/);
  assert.throws(() => new Extent({ gpus: -1 }), TypeError);
});

test("a value mesh is array-like, iterable, and pairs values with points", () => {
  const vm = new ValueMesh([{ name: "hosts", size: 2 }, { name: "gpus", size: 2 }], ["a", "b", "c", "d"]);
  assert.equal(vm.length, 4);
  assert.equal(vm[2], "c");
  assert.deepEqual([...vm], ["a", "b", "c", "d"]);
  assert.deepEqual(Array.from(vm), ["a", "b", "c", "d"]);
  assert.deepEqual(vm.values(), ["a", "b", "c", "d"]);
  assert.deepEqual(vm.map((v) => v.toUpperCase()), ["A", "B", "C", "D"]);
  const items = vm.items();
  assert.equal(items[3][0].rank, 3);
  assert.deepEqual(items[3][0].coords, { hosts: 1, gpus: 1 });
  assert.equal(items[3][1], "d");
  assert.equal(vm.get({ hosts: 1, gpus: 0 }), "c");
  assert.equal(vm.get(1), "b");
  assert.equal(String(vm.extent), "hosts=2, gpus=2");
  assert.equal(String(vm), 'ValueMesh(hosts=2, gpus=2) ["a", "b", "c", "d"]');
  assert.deepEqual(Object.keys(vm), ["0", "1", "2", "3"]);
  assert.throws(() => new ValueMesh({ gpus: 2 }, [1]), /needs 2 values/);
  assert.throws(() => {
    "use strict";
    vm[0] = "z";
  }, TypeError);
  // It travels as the array of its values.
  assert.deepEqual(encode(vm), encode(["a", "b", "c", "d"]));
});

test("call errors become ActorError, SupervisionError or CallError by kind", () => {
  const origin = { mesh: "counters", rank: 1, endpoint: "add" };
  const endpoint = callError({ kind: "endpoint", origin, message: "cannot add -1", typeName: "ValueError", backtrace: "tb" });
  assert.ok(endpoint instanceof ActorError && endpoint instanceof CallError && endpoint instanceof Error);
  assert.equal(endpoint.name, "ActorError");
  assert.equal(endpoint.message, "the endpoint `add` at counters[1] raised ValueError: cannot add -1");
  assert.deepEqual(
    [endpoint.kind, endpoint.mesh, endpoint.rank, endpoint.endpoint, endpoint.reason, endpoint.typeName, endpoint.backtrace],
    ["endpoint", "counters", 1, "add", "cannot add -1", "ValueError", "tb"],
  );
  for (const kind of ["trap", "deadline", "out-of-memory", "proc-lost", "supervision"]) {
    const e = callError({ kind, origin, message: "why", typeName: null, backtrace: null });
    assert.ok(e instanceof SupervisionError, kind);
    assert.equal(e.message, `actor counters[1] failed in \`add\`: ${kind}: why`);
  }
  for (const kind of ["stopped", "timeout", "invalid"]) {
    const e = callError({ kind, origin: null, message: "why", typeName: null, backtrace: null });
    assert.ok(e instanceof CallError && !(e instanceof ActorError) && !(e instanceof SupervisionError), kind);
    assert.equal(e.mesh, null);
  }
  assert.match(callError({ kind: "invalid", origin: null, message: "empty mesh" }).message, /^the request was not valid: empty mesh$/);
});

test("a failure describes itself and becomes an error", () => {
  const f = new Failure({ mesh: "w", rank: 3, kind: "trap", endpoint: "step", typeName: null, reason: "unreachable", backtrace: "bt" });
  assert.equal(String(f), "actor w[3] failed in `step`: trap: unreachable");
  const e = f.toError();
  assert.ok(e instanceof SupervisionError);
  assert.equal(e.backtrace, "bt");
  const g = new Failure({ mesh: "w", rank: 0, kind: "endpoint", endpoint: null, typeName: "RangeError", reason: "no", backtrace: null });
  assert.equal(String(g), "actor w[0] failed: endpoint: RangeError: no");
  assert.ok(g.toError() instanceof ActorError);
});

test("an endpoint's thrown value becomes an endpoint-error, never a throw", () => {
  function fails() {
    throw new RangeError("too big");
  }
  let thrown;
  try {
    fails();
  } catch (e) {
    thrown = e;
  }
  const err = endpointError(thrown);
  assert.equal(err.message, "too big");
  assert.equal(err.typeName, "RangeError");
  assert.match(err.backtrace, /fails/);

  class Custom extends Error {
    constructor() {
      super("custom");
      this.name = "Custom";
    }
  }
  assert.equal(endpointError(new Custom()).typeName, "Custom");
  assert.deepEqual(endpointError("just text"), { message: "just text", typeName: null, backtrace: null });
  assert.deepEqual(endpointError(undefined), { message: "undefined", typeName: null, backtrace: null });
  assert.equal(endpointError({ a: 1 }).message, "{ a: 1 }");
  const hostile = new Error("x");
  Object.defineProperty(hostile, "message", {
    get() {
      throw new Error("no");
    },
  });
  assert.match(endpointError(hostile).message, /cannot be described/);
  // A remote error passed on keeps the remote type name and backtrace.
  const remote = callError({ kind: "endpoint", origin: { mesh: "m", rank: 0, endpoint: "e" }, message: "m", typeName: "KeyError", backtrace: "remote tb" });
  const passed = endpointError(remote);
  assert.equal(passed.typeName, "KeyError");
  assert.match(passed.backtrace, /remote tb/);
});

/** A scripted mailbox: each call to nextEvents returns the next batch. */
function script(batches) {
  const calls = [];
  const source = (max, timeoutMs) => {
    calls.push(timeoutMs);
    return batches.length ? batches.shift() : [];
  };
  return { source, calls };
}

const done = (id, val) => ({ id, kind: { tag: "done", val: { tag: "ok", val: { tag: "single", val } } } });
const failed = (id, kind, message) => ({ id, kind: { tag: "done", val: { tag: "err", val: { kind, origin: { mesh: "m", rank: 0, endpoint: "e" }, message, typeName: null, backtrace: null } } } });
const failure = (rank) => ({ id: 0, kind: { tag: "failure", val: { mesh: "m", rank, kind: "trap", endpoint: "e", typeName: null, reason: "boom", backtrace: null } } });
const single = (kind) => {
  if (kind.val.tag === "err") throw callError(kind.val.val);
  return kind.val.val.val;
};

test("events reach their own request, whatever the order of issue and wait", () => {
  const { source } = script([[done(2, "two"), done(1, "one")], [done(3, "three")]]);
  const r = new Reactor(source);
  const f1 = new Future(r, 1, single);
  const f2 = new Future(r, 2, single);
  const f3 = new Future(r, 3, single);
  assert.equal(f3.get(), "three");
  assert.equal(f1.get(), "one");
  assert.equal(f2.get(), "two");
  assert.equal(f2.get(), "two", "a result is kept");
  assert.equal(r.slots.size, 0, "finished requests leave no slot");
});

test("an error result is thrown by get(), every time", () => {
  const { source } = script([[failed(1, "endpoint", "bad")]]);
  const r = new Reactor(source);
  const f = new Future(r, 1, single);
  assert.throws(() => f.get(), ActorError);
  assert.throws(() => f.get(), /bad/);
});

test("get(timeout) gives up with a timeout and may wait again", () => {
  const { source } = script([[], [done(1, "late")]]);
  const r = new Reactor(source);
  const f = new Future(r, 1, single);
  assert.throws(() => f.get(0), (e) => e instanceof CallError && e.kind === "timeout" && /still in flight/.test(e.message));
  assert.equal(f.get(), "late");
});

test("get(null) waits as long as get()", () => {
  const { source } = script([[], [done(1, "eventually")]]);
  const r = new Reactor(source);
  assert.equal(new Future(r, 1, single).get(null), "eventually");
});

test("sleep(0) routes what has come without waiting", () => {
  const { source, calls } = script([[done(1, "queued")]]);
  const r = new Reactor(source);
  const f = new Future(r, 1, single);
  r.sleep(0);
  assert.deepEqual(calls, [0]);
  assert.equal(r.slots.get(1).length, 1);
  assert.equal(f.get(), "queued");
});

test("done() polls without waiting", () => {
  const { source, calls } = script([[], [done(1, 7)]]);
  const r = new Reactor(source);
  const f = new Future(r, 1, single);
  assert.equal(f.done(), false);
  assert.equal(f.done(), true);
  assert.deepEqual(calls, [0, 0]);
  assert.equal(f.get(), 7);
  assert.equal(Future.resolved(5).get(), 5);
});

test("events of unknown or cancelled requests are dropped and counted", () => {
  const { source } = script([[done(9, "stray"), done(1, "mine")]]);
  const r = new Reactor(source);
  const f = new Future(r, 1, single);
  new Future(r, 2, single);
  r.cancel(2);
  assert.equal(f.get(), "mine");
  assert.equal(r.dropped, 1);
});

test("a failure the supervisor handles is kept, one it does not is thrown by the next wait", () => {
  const { source } = script([[failure(0)], [failure(1)], [done(1, "ok")], [done(2, "ok2")]]);
  const r = new Reactor(source);
  const seen = [];
  r.supervisor = (f) => {
    seen.push(f.rank);
    return f.rank === 0;
  };
  const f1 = new Future(r, 1, single);
  const f2 = new Future(r, 2, single);
  assert.throws(
    () => f1.get(),
    (e) => e instanceof SupervisionError && /unhandled failure: actor m\[1\] failed in `e`: trap: boom/.test(e.message) && e.failure.rank === 1,
  );
  assert.deepEqual(seen, [0, 1]);
  assert.equal(f1.get(), "ok", "thrown once: the next wait goes on");
  assert.equal(f2.get(), "ok2");
  assert.equal(r.failures.length, 2);
});

test("a request's own result wins over a failure that came with it", () => {
  const { source } = script([[failure(0), failed(1, "trap", "boom")]]);
  const r = new Reactor(source);
  const f = new Future(r, 1, single);
  assert.throws(() => f.get(), (e) => e instanceof SupervisionError && !/unhandled/.test(e.message));
  assert.throws(() => r.raiseUnhandled(), /unhandled failure/);
});

test("a supervisor that throws leaves the failure unhandled, saying so", () => {
  const { source } = script([[failure(2)]]);
  const r = new Reactor(source);
  r.supervisor = () => {
    throw new Error("oops");
  };
  const f = new Future(r, 1, single);
  assert.throws(() => f.get(), /the supervisor threw Error: oops/);
});

test("waits are nested: a request finished by an inner wait is there for the outer", () => {
  const { source } = script([[done(2, "inner")], [done(1, "outer")]]);
  const r = new Reactor(source);
  const outer = new Future(r, 1, single);
  const inner = new Future(r, 2, (kind) => `${single(kind)} then ${outer.get()}`);
  assert.equal(inner.get(), "inner then outer");
  assert.equal(outer.get(), "outer");
});

test("sleep waits on the mailbox, routing what comes", () => {
  const { source, calls } = script([[done(1, "during sleep")]]);
  const r = new Reactor(source);
  const f = new Future(r, 1, single);
  const t0 = performance.now();
  r.sleep(5);
  assert.ok(performance.now() - t0 >= 0, "returns");
  assert.ok(calls.length >= 1 && calls.every((ms) => ms >= 0 && ms <= 5));
  assert.equal(f.done(), true);
});

test("a future cannot be sent", () => {
  const r = new Reactor(() => []);
  assert.throws(() => encode([new Future(r, 1, single)]), (e) => e instanceof CodecError && /call \.get\(\)/.test(e.message));
});

test("console lines read like Node's", () => {
  assert.equal(formatLine(["a", 1, 2n, null, undefined, [1, "x"], { k: { n: true } }]), 'a 1 2n null undefined [1, "x"] { k: { n: true } }');
  assert.equal(inspect(new Map([["a", 1]])), 'Map(1) {"a" => 1}');
  assert.equal(inspect(new Uint8Array([1, 255])), "Uint8Array(2) [01 ff]");
  assert.match(inspect(new TypeError("t")), /^TypeError: t\n/);
  assert.equal(inspect(new Extent({ gpus: 2 })), "gpus=2");
  assert.equal(inspect(class Foo {}), "[class Foo]");
  assert.equal(inspect(function bar() {}), "[Function bar]");
});
