// hello: spawns procs, a Greeter on each, calls `greet` on all of them and
// prints the value mesh of greetings, one line per rank:
//
//   4 greetings from a mesh shaped gpus=4:
//   rank 0: hello from rank 0 of 4
//   ...
//
// Build and run (an argument picks the number of procs):
//   node guest-sdk/js/build.mjs examples/js/hello.js -o hello-js.wasm
//   monarch-host run hello-js.wasm -- 8

import { Actor, currentRank, currentSize, thisHost } from "monarch";

/** Knows where it stands in its mesh, and says so. */
export class Greeter extends Actor {
  static endpoints = ["greet"];

  constructor(greeting = "hello") {
    super();
    this.greeting = greeting;
  }

  greet() {
    return `${this.greeting} from rank ${currentRank()} of ${currentSize()}`;
  }
}

export function main(args) {
  const gpus = args.length ? Number(args[0]) : 4;
  if (!Number.isInteger(gpus) || gpus < 1) {
    throw new Error(`usage: hello [PROCS]; \`${args[0]}\` is not a number of procs`);
  }
  const procs = thisHost().spawnProcs({ gpus });
  const greeters = procs.spawn("greeters", Greeter, "hello");

  const greetings = greeters.greet.call().get();
  console.log(`${greetings.length} greetings from a mesh shaped ${greetings.extent}:`);
  for (const [point, greeting] of greetings.items()) {
    console.log(`rank ${point.rank}: ${greeting}`);
  }

  procs.stop();
}
