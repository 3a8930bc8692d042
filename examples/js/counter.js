// counter: a mesh of counters, and errors as values. Three `Counter`
// actors; the controller
//
// 1. broadcasts increments to all of them (fire and forget) and calls
//    `value` on the whole mesh: a value mesh, one total per rank,
// 2. calls one counter through a slice (`callOne`),
// 3. sends one a negative amount, which its endpoint refuses by throwing a
//    RangeError: the call throws an ActorError naming the remote type, and
//    the actor lives on,
// 4. broadcasts a negative amount to one counter: nobody waits for that
//    reply, so the error fails the actor (as in Monarch) and the
//    controller's supervisor hears of it; later calls to it fail at once,
//    and a stream reports each rank on its own.
//
// Build and run:
//   node guest-sdk/js/build.mjs examples/js/counter.js -o counter-js.wasm
//   monarch-host run counter-js.wasm

import { Actor, ActorError, CallError, supervise, takeFailures, thisHost } from "monarch";

export class Counter extends Actor {
  static endpoints = ["increment", "value"];

  constructor(start) {
    super();
    this.total = start;
  }

  /** Adds a non-negative amount; replies with the new total. */
  increment(by = 1) {
    if (by < 0) throw new RangeError(`cannot add ${by}: counters only count up`);
    this.total += by;
    return this.total;
  }

  value() {
    return this.total;
  }
}

export function main() {
  const procs = thisHost().spawnProcs({ procs: 3 });
  const counters = procs.spawn("counters", Counter, 0);

  console.log("step 1: broadcast 3 increments, then call value on every counter");
  for (let i = 0; i < 3; i++) counters.increment.broadcast();
  const totals = counters.value.call().get();
  for (const [point, total] of totals.items()) console.log(`  counter ${point.rank}: ${total}`);
  console.log(`  sum ${totals.values().reduce((a, b) => a + b, 0)}`);

  console.log("step 2: callOne on a slice: add 10 to counter 1");
  const one = counters.slice({ procs: 1 });
  console.log(`  counter 1: ${one.increment.callOne(10).get()}`);

  console.log("step 3: add -1 to counter 2");
  const two = counters.slice({ procs: 2 });
  try {
    two.increment.callOne(-1).get();
    throw new Error("expected an ActorError");
  } catch (err) {
    if (!(err instanceof ActorError)) throw err;
    console.log(`  ${err.name} (kind ${err.kind}) from ${err.mesh}[${err.rank}] in \`${err.endpoint}\``);
    console.log(`  type ${err.typeName}, message: ${err.reason}`);
  }
  console.log(`  counter 2 lives on, still at ${two.value.callOne().get()}`);

  console.log("step 4: broadcast -5 to counter 0, whose error nobody waits for");
  supervise((failure) => {
    console.log(`  supervisor: ${failure}; carrying on`);
    return true;
  });
  counters.slice({ procs: 0 }).increment.broadcast(-5);
  // The next wait routes the failure to the supervisor.
  console.log(`  counter 1 still counts: ${one.increment.callOne(1).get()}`);
  try {
    counters.value.call().get();
  } catch (err) {
    if (!(err instanceof CallError)) throw err;
    console.log(`  a call to the whole mesh fails: ${err.message}`);
  }
  const replies = [...counters.value.stream()].sort((a, b) => a.rank - b.rank);
  for (const { rank, value, error } of replies) {
    console.log(error ? `  stream: counter ${rank}: ${error.name} (kind ${error.kind})` : `  stream: counter ${rank} at ${value}`);
  }
  console.log(`  failures reported: ${takeFailures().length}`);
  procs.stop();
}
