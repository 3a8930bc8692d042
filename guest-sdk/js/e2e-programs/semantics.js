// What the examples do not show, checked inside a real host: actors that
// call actors (a wait nested in a handler), mesh references in messages,
// keyword arguments, choose, streams and the host's reducers, BigInts, errors of
// every origin (an unknown endpoint, a thrown string, an unsendable reply,
// a Python pickle, a failing constructor, an unknown class), an actor that
// supervises what it spawned, sleep and get(timeout), console.log and
// Math.random in actors, and an actor class exported by another module
// (relay.js). Prints one `ok - ...` line per check; any other outcome
// fails the run. `bench N` instead times N callOne round trips.

import mesh from "monarch:host/mesh@0.2.0";
import {
  Actor,
  ActorError,
  ActorMesh,
  CallError,
  CodecError,
  SupervisionError,
  Tagged,
  breakpoint,
  currentPoint,
  currentRank,
  currentSize,
  kwargs,
  sleep,
  supervise,
  thisHost,
} from "monarch";
import { check, expectError } from "./checks.js";
import { Relay } from "./relay.js";

export class Echo extends Actor {
  static endpoints = ["echo", "whoami", "args", "fail", "failText", "unsendable", "later", "slow", "speak", "recurse"];

  constructor(label, options) {
    super();
    this.label = label;
    this.options = options ?? null;
  }

  echo(value) {
    return value;
  }

  whoami() {
    return { label: this.label, rank: currentRank(), size: currentSize(), point: currentPoint().coords, options: this.options, random: Math.random() };
  }

  args(...all) {
    return all;
  }

  fail() {
    throw new TypeError("bad input");
  }

  failText() {
    throw "plain text";
  }

  unsendable() {
    return { f() {} };
  }

  async later() {
    return 1;
  }

  slow(ms) {
    sleep(ms);
    return ms;
  }

  recurse(n) {
    return this.recurse(n + 1) + 1;
  }

  speak(words) {
    console.log(`actor ${currentRank()} says ${words}`);
    return true;
  }
}

export class BadInit extends Actor {
  static endpoints = [];
  constructor() {
    super();
    throw new RangeError("no way");
  }
}

export class Unexported extends Actor {
  static endpoints = ["x"];
  x() {}
}

function semantics() {
  const procs = thisHost().spawnProcs({ procs: 2 });
  const echo = procs.spawn("echo", Echo, "e", kwargs({ verbose: true }));

  const who = echo.whoami.call().get();
  check("a breakpoint without debugging on does nothing", breakpoint({ who }) === false);
  check("init args and kwargs reach the constructor", who[1].label === "e" && who[1].options.verbose === true);
  check("currentRank/currentSize/currentPoint in actors", who[1].rank === 1 && who[1].size === 2 && who[1].point.procs === 1);
  check("Math.random differs between actors", who[0].random !== who[1].random && who[0].random >= 0 && who[0].random < 1);

  const big = 2n ** 60n + 1n;
  const value = { n: 1, f: 2.5, s: "ü€😀", b: new Uint8Array([1, 2]), a: [null, true], big, neg: -(2n ** 63n) };
  const back = echo.slice({ procs: 0 }).echo.callOne(value).get();
  check("values round-trip through an actor", JSON.stringify({ ...back, b: [...back.b], big: String(back.big), neg: String(back.neg) }) ===
    JSON.stringify({ ...value, b: [1, 2], big: String(big), neg: String(value.neg) }));
  check("integers beyond 2^53 come back as BigInt", typeof back.big === "bigint" && back.big === big);

  const args = echo.slice({ procs: 0 }).args.callOne(1, "two", kwargs({ three: 3 })).get();
  check("keyword arguments arrive as a last object", JSON.stringify(args) === JSON.stringify([1, "two", { three: 3 }]));

  check("choose answers from one actor", echo.echo.choose("c").get() === "c");
  const streamed = [...echo.echo.stream("s")].sort((a, b) => a.rank - b.rank);
  check("a stream gives each rank's reply", streamed.map((r) => `${r.rank}:${r.value}`).join() === "0:s,1:s");
  for (const first of echo.echo.stream("t")) {
    check("a stream may be left early", first.value === "t");
    break;
  }
  check("and the calls after it still answer", echo.slice({ procs: 0 }).echo.callOne("u").get() === "u");
  check("the host sums integer replies", echo.echo.reduce("sum-i64", 21).get() === 42);
  check("and takes the largest float", echo.echo.reduce("max-f64", 1.5).get() === 1.5);
  const concat = echo.whoami.reduce("concat").get();
  check("the concat reducer gives every reply in rank order", concat.length === 2 && concat[0].rank === 0 && concat[1].rank === 1);

  const relays = procs.spawn("relays", Relay);
  const relayed = relays.relay.call(echo, "hi").get();
  check(
    "an actor calls a mesh it got as a reference, waiting inside its handler",
    JSON.stringify(relayed.values()) === JSON.stringify([["0<-hi", "0<-hi"], ["1<-hi", "1<-hi"]]),
    JSON.stringify(relayed.values()),
  );

  expectError("a thrown Error is an ActorError with its name and stack", () => echo.fail.call().get(), (e) =>
    e instanceof ActorError && e.typeName === "TypeError" && e.reason === "bad input" && /at fail/.test(e.backtrace) && e.endpoint === "fail");
  expectError("a thrown string is an ActorError with its text", () => echo.failText.call().get(), (e) => e instanceof ActorError && e.reason === "plain text");
  expectError("an unknown endpoint of a known class is refused in the caller", () => echo.endpoint("nope"), (e) =>
    e instanceof TypeError && /Echo has no endpoint `nope`; its endpoints: echo, whoami/.test(e.message));
  const untyped = ActorMesh.fromRef(echo.toRef());
  check("a mesh from a reference has its name and shape", untyped.name === "echo" && untyped.size === 2);
  check("and answers any endpoint by name", untyped.echo.call(3).get().values().join() === "3,3");
  expectError("an unknown endpoint is an ActorError from the actor", () => untyped.nope.call().get(), (e) =>
    e instanceof ActorError && /Echo has no endpoint `nope`/.test(e.reason));
  const raw = echo.slice({ procs: 0 });
  expectError(
    "a reply that cannot be encoded is a CodecError from the actor",
    () => raw.unsendable.callOne().get(),
    (e) => e instanceof ActorError && e.typeName === "CodecError" && /function cannot be encoded/.test(e.reason),
  );
  expectError(
    "JavaScript does not write Python pickles",
    () => raw.echo.callOne(new Tagged(40103, new Uint8Array([0x80]))).get(),
    (e) => e instanceof CodecError && /cannot be written from JavaScript/.test(e.message),
  );
  // What a Python caller would send: [pickle bytes], through the raw WIT.
  const id = raw._resource.callOne("echo", Uint8Array.from([0x81, 0xd9, 0x9c, 0xa7, 0x41, 0x80]));
  let event;
  while (!event) event = mesh.nextEvents(16, 10000).find((e) => e.id === id);
  const err = event.kind.val.val;
  check("an actor refuses a Python pickle with a clear error", event.kind.val.tag === "err" && err.typeName === "CodecError" &&
    /Python object \(pickle/.test(err.message), err.message);
  expectError(
    "an async endpoint is refused, saying why",
    () => raw.later.callOne().get(),
    (e) => e instanceof ActorError && e.typeName === "CodecError" && /a Promise cannot be encoded/.test(e.reason),
  );
  check("actors live on after endpoint errors", raw.echo.callOne(5).get() === 5);

  expectError("a constructor that throws fails the spawn with its error", () => procs.spawn("bad", BadInit), (e) =>
    /RangeError: no way/.test(e.message));
  expectError("an unregistered class is named", () => procs.spawn("bad2", class Local extends Actor {}), (e) =>
    e instanceof TypeError && /not a registered actor class/.test(e.message));
  expectError("an unknown class name is refused by the actor", () => procs.spawn("bad3", "Nope"), (e) =>
    /no actor class `Nope`; it has: .*Echo/.test(e.message));

  const t0 = performance.now();
  sleep(200);
  const slept = performance.now() - t0;
  check("sleep waits about as long as asked", slept >= 195 && slept < 2000, `${slept} ms`);
  const slow = raw.slow.callOne(500);
  expectError("get(timeout) gives up while the request goes on", () => slow.get(50), (e) => e instanceof CallError && e.kind === "timeout");
  check("and the same future gets the result later", slow.get() === 500);

  check("console.log in an actor returns", echo.speak.call("hello").get().values().every((v) => v === true));

  const tree = procs.spawn("tree", Relay);
  const t0tree = tree.slice({ procs: 0 });
  t0tree.spawnAndCrash.callOne(true).get();
  let seen = null;
  for (let i = 0; i < 100 && !seen; i++) {
    sleep(50);
    seen = t0tree.seen.callOne().get();
  }
  check("an actor's supervise hears of its children's failures", seen === "kids[1] endpoint", seen);
  check("and returning true, it lives on", t0tree.seen.callOne().get() === seen);
  const failures = [];
  supervise((f) => {
    failures.push(String(f));
    return true;
  });
  tree.slice({ procs: 1 }).spawnAndCrash.callOne(false).get();
  for (let i = 0; i < 100 && !failures.length; i++) sleep(50);
  check("one that returns false fails, and its owner hears of it with kind supervision",
    failures.length === 1 && /^actor tree\[1\] failed.*: supervision: /.test(failures[0]), failures.join("; "));
  expectError("calls to it fail at once", () => tree.slice({ procs: 1 }).seen.callOne().get(), (e) => e instanceof SupervisionError && e.kind === "supervision");

  const more = thisHost().spawnProcs({ procs: 2 });
  const perProc = more.spawnWith("pp", Echo, { perProc: { threads: 2 } }, "pp");
  check("spawnWith puts several actors on each proc", String(perProc.extent) === "procs=2, threads=2" &&
    perProc.whoami.call().get().values().map((w) => w.rank).join() === "0,1,2,3");
  const timed = more.spawnWith("timed", Echo, { handlerTimeoutMs: 300 }, "t");
  expectError("a handler past its deadline is a SupervisionError of kind deadline", () => timed.slice({ procs: 0 }).slow.callOne(5000).get(), (e) =>
    e instanceof SupervisionError && e.kind === "deadline" && e.rank === 0);
  expectError("unbounded recursion exhausts the Wasm stack: a trap, not an endpoint error", () => perProc.slice({ procs: 0, threads: 1 }).recurse.callOne(0).get(), (e) =>
    e instanceof SupervisionError && e.kind === "trap" && /call stack exhausted/.test(e.reason));
  const info = more.info();
  check("info says where each proc runs", info.length === 2 && info.every((p, i) => p.rank === i && p.state === "running"));
  if (info[1].pid !== null) {
    more.kill(1);
    expectError("the actors of a killed proc are lost: SupervisionError of kind proc-lost", () => timed.slice({ procs: 1 }).slow.callOne(5000).get(), (e) =>
      e instanceof SupervisionError && e.kind === "proc-lost");
  }
  more.stop();
  procs.stop();
  expectError("a call to a stopped mesh fails at once with kind stopped", () => raw.echo.callOne(1).get(), (e) => e instanceof CallError && e.kind === "stopped");
}

function bench(n) {
  const procs = thisHost().spawnProcs({ procs: 1 });
  const one = procs.spawn("bench", Echo, "b");
  for (let i = 0; i < 50; i++) one.echo.callOne(i).get();
  const times = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    one.echo.callOne(i).get();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  const median = times[Math.floor(n / 2)];
  const t0 = performance.now();
  const futures = [];
  for (let i = 0; i < n; i++) futures.push(one.echo.callOne(i));
  for (const f of futures) f.get();
  const pipelined = (performance.now() - t0) / n;
  console.log(`callOne round trip: median ${(median * 1000).toFixed(0)} us, p90 ${(times[Math.floor(n * 0.9)] * 1000).toFixed(0)} us over ${n}; ${(pipelined * 1000).toFixed(0)} us each with ${n} in flight`);
  procs.stop();
}

export function main(args) {
  if (args[0] === "bench") return bench(Number(args[1] ?? 1000));
  semantics();
  console.log("all checks passed");
}
