// An actor class in a module of its own: build.mjs registers the actor
// classes that any module of the program exports.

import { Actor, currentRank, thisHost } from "monarch";
import { Echo } from "./semantics.js";

/** Calls the mesh it is given: a wait for replies inside a handler. */
export class Relay extends Actor {
  static endpoints = ["relay", "spawnAndCrash", "seen"];

  relay(target, value) {
    const replies = target.echo.call(value).get();
    return replies.values().map((v) => `${currentRank()}<-${v}`);
  }

  /** Spawns children and breaks one; `supervise` below decides what that means for this actor. */
  spawnAndCrash(handle) {
    this.handles = handle;
    const procs = thisHost().spawnProcs({ kids: 2 });
    const kids = procs.spawn("kids", Echo, "kid");
    kids.slice({ kids: 1 }).fail.broadcast();
    return "spawned";
  }

  seen() {
    return this.lastFailure ?? null;
  }

  supervise(failure) {
    this.lastFailure = `${failure.mesh}[${failure.rank}] ${failure.kind}`;
    return this.handles;
  }
}
