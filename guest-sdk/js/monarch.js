// monarch: the JavaScript SDK of monarch-host. Programs import it as
// `import { Actor, thisHost } from "monarch"`; `build.mjs` bundles it with
// the program and builds one component of the WIT world
// `monarch:host/program` with jco's QuickJS backend.
//
// One component holds the controller and every actor class. The host runs
// the controller's `run` export, which calls the program's exported `main`,
// in one instance, and each actor in an instance of its own, made by the
// `actor-class.create` export from the class's name. Module top-level code
// runs once, at build time (the runtime is snapshotted after it), so every
// instance starts from the same state.

import mesh from "monarch:host/mesh@0.2.0";
import logging from "monarch:host/logging@0.2.0";
import debug from "monarch:host/debug@0.2.0";

import {
  CodecError,
  ENCODE,
  TAG_ACTOR_MESH,
  TAG_BUFFER,
  Tagged,
  decode,
  decodeArgs,
  decodeSequence,
  encode,
  encodeArgs,
  float,
  Float,
  kwargs,
  Kwargs,
} from "./cbor.js";
import {
  ActorError,
  CallError,
  Extent,
  Failure,
  Future,
  Point,
  Reactor,
  SupervisionError,
  ValueMesh,
  callError,
  endpointError,
  formatLine,
  inspect,
} from "./core.js";

export { ActorError, CallError, CodecError, Extent, Failure, Float, Future, Kwargs, Point, SupervisionError, Tagged, ValueMesh, float, kwargs, inspect };
export { encode, decode, encodeArgs, decodeArgs } from "./cbor.js";

const reactor = new Reactor((max, timeoutMs) => mesh.nextEvents(max, timeoutMs));

// ---------------------------------------------------------------- console

function logAt(level) {
  return (...args) => logging.log(level, formatLine(args));
}

/**
 * `console` for programs: each call becomes one line of the host's log
 * (`logging.log`), which the host prints with the mesh and rank that wrote
 * it (`[controller]`, `[counters[2]]`).
 */
globalThis.console = {
  log: logAt("info"),
  info: logAt("info"),
  debug: logAt("debug"),
  trace: logAt("trace"),
  warn: logAt("warn"),
  error: logAt("error"),
};

// ------------------------------------------------------------- breakpoints

/**
 * Pauses this actor (or the controller) for `monarch-host debug`, showing
 * `values` (`breakpoint({ lr, step })`), when the run has debugging on
 * (`run --debug-listen`); does nothing otherwise, so a stray one never
 * hangs a run. At its `(monarch)` prompt: `p NAME`, `locals`, `where`, `c`.
 * Returns whether it paused.
 */
export function breakpoint(values = {}) {
  if (!debug.enabled()) return false;
  // The caller's frame: QuickJS writes `    at NAME (FILE:LINE)`.
  const frames = String(new Error().stack || "")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line.startsWith("at "));
  const caller = /^at (?:(\S+) )?\(?([^()]*?)\)?$/.exec(frames[1] || "") || [];
  const shown = Object.entries(values).map(([name, value]) => [name, inspect(value)]);
  debug.breakpoint(caller[1] || "<anonymous>", caller[2] || "<unknown>", shown);
  return true;
}

// ------------------------------------------------------------------ random

/**
 * Math.random, reseeded in every instance when it starts. QuickJS's own
 * generator is part of the snapshot taken at build time, so without this
 * every actor, and every run, would draw the same numbers. Not
 * cryptographic (sfc32 seeded from the clocks, the rank and the class).
 */
function reseedRandom(salt) {
  let h = 0x9e3779b9 ^ salt.length;
  const mix = (x) => {
    h = Math.imul(h ^ (x >>> 0), 0x85ebca6b);
    h ^= h >>> 13;
    h = Math.imul(h, 0xc2b2ae35);
    h ^= h >>> 16;
    return h >>> 0;
  };
  const t = performance.now();
  const d = Date.now();
  for (const x of [d % 4294967296, d / 4294967296, t * 1000000, t * 1000, t]) mix(Math.floor(x));
  for (let i = 0; i < salt.length; i++) mix(salt.charCodeAt(i));
  let a = mix(1), b = mix(2), c = mix(3), n = mix(4);
  Math.random = function random() {
    const r = (((a + b) >>> 0) + n) >>> 0;
    n = (n + 1) >>> 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) >>> 0;
    c = ((c << 21) | (c >>> 11)) >>> 0;
    c = (c + r) >>> 0;
    return r / 4294967296;
  };
  for (let i = 0; i < 12; i++) Math.random();
}

// ------------------------------------------------------------------ actors

/** The base class of actor classes. List endpoints in `static endpoints`. */
export class Actor {
  /**
   * A mesh this actor spawned has a failed actor. Return true if handled;
   * false (the default) fails this actor too, and its owner is told.
   */
  supervise(failure) {
    void failure;
    return false;
  }
}

/** The endpoints of an actor class: its `static endpoints` and its ancestors'. */
function endpointsOf(cls) {
  const names = [];
  for (let c = cls; c && c !== Actor && c !== Function.prototype; c = Object.getPrototypeOf(c)) {
    if (Object.prototype.hasOwnProperty.call(c, "endpoints")) {
      const own = c.endpoints;
      if (!Array.isArray(own) || own.some((n) => typeof n !== "string")) {
        throw new TypeError(`${c.name}.endpoints must be an array of method names`);
      }
      for (const n of own) if (!names.includes(n)) names.push(n);
    }
  }
  for (const n of names) {
    if (typeof cls.prototype[n] !== "function") {
      throw new TypeError(`${cls.name} lists the endpoint \`${n}\` but has no method of that name`);
    }
  }
  return names;
}

const classes = new Map();
let programMain = null;

/**
 * Makes `cls` (a subclass of Actor) spawnable by `name` (its class name by
 * default). Exported classes are registered for you; call this for a class
 * the program does not export. Call it at the top level of a module.
 */
export function register(cls, name = cls.name) {
  if (typeof cls !== "function" || !(cls.prototype instanceof Actor)) {
    throw new TypeError(`register: ${inspect(cls)} is not a subclass of Actor`);
  }
  const known = classes.get(name);
  if (known && known !== cls) {
    throw new TypeError(`two actor classes are named \`${name}\`; register one under another name: register(cls, "OtherName")`);
  }
  endpointsOf(cls);
  classes.set(name, cls);
  return cls;
}

function classNameOf(cls) {
  for (const [name, c] of classes) if (c === cls) return name;
  return null;
}

/**
 * Called by the entry module that build.mjs writes, once per module of the
 * program: registers the actor classes it exports and, for the program's
 * own module (`isMain`), its exported `main`.
 */
export function __install(module, isMain) {
  for (const [key, value] of Object.entries(module)) {
    if (typeof value === "function" && value.prototype instanceof Actor) register(value);
    else if (isMain && key === "main" && typeof value === "function") programMain = value;
  }
}

// ------------------------------------------------------------------ context

let context = null; // { rank, extent, className } inside an actor

/** This actor's rank in its mesh (0 in the controller). */
export function currentRank() {
  return context ? context.rank : 0;
}

/** How many actors this actor's mesh has (1 in the controller). */
export function currentSize() {
  return context ? context.extent.size : 1;
}

/** This actor's point in its mesh (rank and coordinates). */
export function currentPoint() {
  return context ? context.extent.point(context.rank) : new Extent([]).point(0);
}

/** The extent of this actor's mesh (empty in the controller). */
export function currentExtent() {
  return context ? context.extent : new Extent([]);
}

// -------------------------------------------------------------- the event loop

/** Waits `ms` milliseconds while the program's requests progress. */
export function sleep(ms) {
  reactor.sleep(ms);
}

/**
 * The controller's supervisor: `fn(failure)` is called for each failed
 * actor of the meshes the controller owns; returning true handles it.
 * Unhandled, a failure is thrown by the program's next wait (a `get()`).
 * Inside an actor, override the actor's `supervise` method instead.
 */
export function supervise(fn) {
  reactor.supervisor = fn;
}

/** The failures reported so far (handled or not); the list is emptied. */
export function takeFailures() {
  return reactor.failures.splice(0);
}

/** The call timeout of requests made from now on (ms); null restores the host's default. */
export function setCallTimeout(ms) {
  mesh.setCallTimeout(ms ?? null);
}

/** The handler deadline of requests made from now on (ms); null: each mesh's own. */
export function setHandlerTimeout(ms) {
  mesh.setHandlerTimeout(ms ?? null);
}

// ------------------------------------------------------------------ meshes

/** The error a failed import throws, as an Error with its text. */
function hostError(e, what) {
  if (e && e.payload !== undefined) {
    if (typeof e.payload === "string") return new Error(`${what}: ${e.payload}`);
    if (e.payload && typeof e.payload === "object" && "kind" in e.payload) return callError(e.payload);
  }
  return e;
}

function toWitExtent(extent) {
  return extent instanceof Extent ? extent.dims.map((d) => ({ ...d })) : new Extent(extent).dims.map((d) => ({ ...d }));
}

/** Slicing by name: {dim: index} keeps one index (and drops the dimension), {dim: [start, end, step]} a range. */
function toWitSlice(dims) {
  return Object.entries(dims).map(([dim, sel]) => {
    if (Number.isInteger(sel)) return { dim, select: { tag: "index", val: sel } };
    if (Array.isArray(sel) && sel.length >= 2 && sel.length <= 3 && sel.every(Number.isInteger)) {
      return { dim, select: { tag: "range", val: [sel[0], sel[1], sel[2] ?? 1] } };
    }
    throw new TypeError(`slice({${dim}: ...}) takes an index or [start, end] or [start, end, step], not ${inspect(sel)}`);
  });
}

/** The host this program runs on: spawns procs. */
class HostMesh {
  /**
   * Procs in the shape `perHost` ({name: size}, outermost first), such as
   * `{procs: 4}` or `{hosts: 1, gpus: 8}`.
   */
  spawnProcs(perHost = { procs: 1 }) {
    let resource;
    try {
      resource = mesh.spawnProcs(toWitExtent(perHost));
    } catch (e) {
      throw hostError(e, `spawnProcs(${inspect(perHost)})`);
    }
    return new ProcMesh(resource);
  }
}

const host = new HostMesh();

/**
 * The persistent actor mesh `name` (`spawnPersistent`), spawned by an
 * earlier job or session of this server; `cls`, if given, names its
 * endpoints as a spawned mesh's. Throws when there is none, or no server.
 */
export function lookupActorMesh(name, cls = null) {
  let resource;
  try {
    resource = mesh.lookupActorMesh(name);
  } catch (e) {
    throw hostError(e, `lookupActorMesh("${name}")`);
  }
  const className = cls === null ? null : typeof cls === "string" ? cls : classNameOf(cls);
  const known = className === null ? null : classes.get(className);
  return ActorMesh._wrap(resource, known ? endpointsOf(known) : null, className);
}

/** The host: `thisHost().spawnProcs({procs: 4})`. */
export function thisHost() {
  return host;
}

/** Procs arranged in an extent; actors are spawned on them. */
export class ProcMesh {
  constructor(resource) {
    this._resource = resource;
  }

  /** The mesh's shape. */
  get extent() {
    return new Extent(this._resource.extent());
  }

  /** How many procs. */
  get size() {
    return this.extent.size;
  }

  /** A sub-mesh: `procs.slice({procs: 0})`, `procs.slice({gpus: [0, 4]})`. */
  slice(dims) {
    try {
      return new ProcMesh(this._resource.slice(toWitSlice(dims)));
    } catch (e) {
      throw hostError(e, `slice(${inspect(dims)})`);
    }
  }

  /**
   * Spawns one actor of class `cls` on every proc, named `name`, each made
   * by `new cls(...args)` in its own instance. Returns the ActorMesh once
   * all have started; throws if one could not.
   */
  spawn(name, cls, ...args) {
    return this.spawnWith(name, cls, {}, ...args);
  }

  /**
   * `spawn` with options: `perProc` ({name: size}: several actors per proc,
   * the actor mesh's extent being this mesh's followed by these
   * dimensions), `handlerTimeoutMs` (each handler's deadline).
   */
  spawnWith(name, cls, options, ...args) {
    return this._spawn(name, cls, options, args, null);
  }

  /**
   * Spawns a persistent actor mesh: the server's (`monarch-host serve`),
   * not this job's or session's. It outlives them; later ones find it with
   * `lookupActorMesh(name)`, and `DELETE /v1/meshes/NAME` stops it. Its
   * failures are the server's (logged, shown by `GET /v1/meshes`) and fail
   * no job. Its procs must be a persistent mesh's (`submit --mesh NAME`).
   * A name in use throws, naming `respawn`. `options` as for `spawnWith`.
   */
  spawnPersistent(name, cls, options, ...args) {
    return this._spawn(name, cls, options, args, false);
  }

  /**
   * `spawnPersistent` that replaces the persistent actor mesh `name` if
   * there is one: it is stopped first, and its actors' state is lost.
   */
  respawn(name, cls, options, ...args) {
    return this._spawn(name, cls, options, args, true);
  }

  /** Spawns; `replace` null: not persistent, else persistent (replacing or not). */
  _spawn(name, cls, options, args, replace) {
    const className = typeof cls === "string" ? cls : classNameOf(cls);
    if (className === null) {
      throw new TypeError(
        `spawn: ${inspect(cls)} is not a registered actor class; export it from the program's module (or call register(${cls && cls.name}))`,
      );
    }
    const opts = options ?? {};
    const spawnOptions = {
      perProc: opts.perProc ? toWitExtent(opts.perProc) : [],
      handlerTimeoutMs: opts.handlerTimeoutMs ?? null,
    };
    let resource;
    try {
      resource =
        replace === null
          ? this._resource.spawnWith(name, className, encodeArgs(args), spawnOptions)
          : this._resource.spawnPersistent(name, className, encodeArgs(args), spawnOptions, replace);
    } catch (e) {
      const verb = replace === null ? "spawn" : replace ? "respawn" : "spawnPersistent";
      throw hostError(e, `${verb}("${name}", ${className})`);
    }
    const known = classes.get(className);
    return ActorMesh._wrap(resource, known ? endpointsOf(known) : null, className);
  }

  /** Each proc: {rank, id, host, pid, state ("running", "stopped", "failed"), reason}. */
  info() {
    return this._resource.info().map((p) => ({
      rank: p.rank,
      id: p.id,
      host: p.host,
      pid: p.pid,
      state: p.state.tag,
      reason: p.state.tag === "failed" ? p.state.val : null,
    }));
  }

  /** Sends `signal` (9 by default) to the process of the proc at `rank`. */
  kill(rank, signal = 9) {
    try {
      this._resource.kill(rank, signal);
    } catch (e) {
      throw hostError(e, `kill(${rank}, ${signal})`);
    }
  }

  /** Stops the procs and every actor on them. */
  stop() {
    this._resource.stop();
  }

  toString() {
    return `ProcMesh(${this.extent})`;
  }
}

const REDUCERS = ["sum-i64", "min-i64", "max-i64", "sum-f64", "min-f64", "max-f64", "concat"];

function decodeValue(bytes, what) {
  try {
    return decode(bytes, { tags: VALUE_TAGS });
  } catch (e) {
    if (e instanceof CodecError) {
      e.message = `${what}: ${e.message}`;
    }
    throw e;
  }
}

/** One endpoint of an actor mesh: `mesh.greet.call(...)`. */
export class Endpoint {
  constructor(actorMesh, name) {
    this.mesh = actorMesh;
    this.name = name;
  }

  _res() {
    return this.mesh._resource;
  }

  _what() {
    return `the reply of \`${this.name}\` from ${this.mesh.name}`;
  }

  _single(id, post = (bytes) => decodeValue(bytes, this._what())) {
    return new Future(reactor, id, (kind) => {
      const result = kind.val;
      if (result.tag === "err") throw callError(result.val);
      return post(result.val.val);
    });
  }

  /** Every actor's reply: a Future of a ValueMesh, in rank order. */
  call(...args) {
    const id = this._res().call(this.name, encodeArgs(args), null);
    return new Future(reactor, id, (kind) => {
      const result = kind.val;
      if (result.tag === "err") throw callError(result.val);
      const { extent, values } = result.val.val;
      return new ValueMesh(extent, values.map((v, i) => decodeValue(v, `${this._what()}[${i}]`)));
    });
  }

  /** The reply of the mesh's only actor (a mesh of one, such as a slice to one rank). */
  callOne(...args) {
    return this._single(this._res().callOne(this.name, encodeArgs(args)));
  }

  /** The reply of one actor, the least busy. */
  choose(...args) {
    return this._single(this._res().choose(this.name, encodeArgs(args)));
  }

  /**
   * Every actor's reply reduced by the host: "sum-i64", "min-i64",
   * "max-i64" (integer replies), "sum-f64", "min-f64", "max-f64" (numeric
   * replies), or "concat" (an array of the replies, in rank order).
   */
  reduce(reducer, ...args) {
    if (!REDUCERS.includes(reducer)) {
      throw new TypeError(`reduce: unknown reducer ${inspect(reducer)}; one of ${REDUCERS.join(", ")}`);
    }
    const id = this._res().call(this.name, encodeArgs(args), reducer);
    if (reducer === "concat") {
      return this._single(id, (bytes) => {
        try {
          return decodeSequence(bytes, { tags: VALUE_TAGS });
        } catch (e) {
          if (e instanceof CodecError) e.message = `${this._what()}: ${e.message}`;
          throw e;
        }
      });
    }
    return this._single(id);
  }

  /** Every actor, fire and forget. Throws at once if the mesh is stopped or a rank has failed. */
  broadcast(...args) {
    try {
      this._res().broadcast(this.name, encodeArgs(args));
    } catch (e) {
      throw hostError(e, `broadcast to \`${this.name}\``);
    }
  }

  /**
   * Every actor's reply as it arrives: an iterable of {rank, value} or
   * {rank, error}, one per rank (rank in the mesh as spawned).
   */
  stream(...args) {
    const id = this._res().stream(this.name, encodeArgs(args));
    reactor.register(id);
    const what = this._what();
    return {
      [Symbol.iterator]: function* () {
        let finished = false;
        try {
          for (;;) {
            const kind = reactor.next(id);
            if (kind.tag === "end" || kind.tag === "done") {
              finished = true;
              if (kind.tag === "done" && kind.val.tag === "err") throw callError(kind.val.val);
              return;
            }
            const [rank, result] = kind.val;
            if (result.tag === "err") {
              yield { rank, error: callError(result.val) };
            } else {
              let value;
              try {
                value = decodeValue(result.val, `${what}[${rank}]`);
              } catch (e) {
                yield { rank, error: e };
                continue;
              }
              yield { rank, value };
            }
          }
        } finally {
          // Left early (a break): later items are dropped.
          if (!finished) reactor.cancel(id);
        }
      },
    };
  }
}

const MESH_MEMBERS = new Set(["name", "extent", "size", "className", "slice", "endpoint", "stop", "toRef", "toString", "constructor"]);

/**
 * Actors arranged in an extent. Each endpoint of the class is a property:
 * `mesh.greet.call()`; `mesh.endpoint("greet")` reaches any endpoint by
 * name (one whose name is a member of ActorMesh, or of a mesh received as
 * a reference, whose class is unknown).
 */
export class ActorMesh {
  constructor(resource, endpoints, className) {
    this._resource = resource;
    this._endpoints = endpoints;
    this.className = className;
    if (endpoints) {
      for (const name of endpoints) {
        if (MESH_MEMBERS.has(name) || name.startsWith("_")) continue;
        Object.defineProperty(this, name, { value: new Endpoint(this, name), enumerable: false });
      }
    }
  }

  /** An ActorMesh; a mesh of unknown class answers any property with an Endpoint. */
  static _wrap(resource, endpoints, className) {
    const m = new ActorMesh(resource, endpoints, className);
    if (endpoints) return m;
    return new Proxy(m, {
      get(target, prop, receiver) {
        if (typeof prop !== "string" || prop in target || prop === "then" || prop === "toJSON") {
          return Reflect.get(target, prop, receiver);
        }
        return target.endpoint(prop);
      },
    });
  }

  /** The mesh a reference names (the bytes of `toRef()`). */
  static fromRef(bytes) {
    let resource;
    try {
      resource = mesh.ActorMesh.fromRef(bytes);
    } catch (e) {
      throw hostError(e, "ActorMesh.fromRef");
    }
    return ActorMesh._wrap(resource, null, null);
  }

  /** The mesh's name. */
  get name() {
    return this._resource.name();
  }

  /** The mesh's shape. */
  get extent() {
    return new Extent(this._resource.extent());
  }

  /** How many actors. */
  get size() {
    return this.extent.size;
  }

  /** The endpoint `name`. */
  endpoint(name) {
    if (this._endpoints && !this._endpoints.includes(name)) {
      throw new TypeError(`${this.className} has no endpoint \`${name}\`; its endpoints: ${this._endpoints.join(", ") || "none"}`);
    }
    return new Endpoint(this, name);
  }

  /** A sub-mesh: `mesh.slice({procs: 1})`, `mesh.slice({gpus: [0, 2]})`. */
  slice(dims) {
    let resource;
    try {
      resource = this._resource.slice(toWitSlice(dims));
    } catch (e) {
      throw hostError(e, `slice(${inspect(dims)})`);
    }
    return ActorMesh._wrap(resource, this._endpoints, this.className);
  }

  /** Stops the actors; requests to them fail with kind `stopped`. */
  stop() {
    this._resource.stop();
  }

  /** A reference that can travel inside a payload (JSON bytes, see wit/README.md). */
  toRef() {
    return this._resource.toRef();
  }

  [ENCODE]() {
    return new Tagged(TAG_ACTOR_MESH, this.toRef());
  }

  toString() {
    return `ActorMesh(${this.name}: ${this.className ?? "?"}, ${this.extent})`;
  }
}

/** An RDMA buffer reference received in a payload; send it on as it is. */
export class BufferRef {
  constructor(bytes) {
    this.bytes = bytes;
  }

  [ENCODE]() {
    return new Tagged(TAG_BUFFER, this.bytes);
  }
}

const VALUE_TAGS = {
  [TAG_ACTOR_MESH]: (bytes) => ActorMesh.fromRef(bytes),
  [TAG_BUFFER]: (bytes) => new BufferRef(bytes),
};

// ---------------------------------------------------------------- exports

function describeThrown(e) {
  if (e instanceof CallError) return e.backtrace ? `${e.name}: ${e.message}\nremote backtrace:\n${e.backtrace}` : `${e.name}: ${e.message}`;
  return inspect(e);
}

/** The WIT export `run`: the controller calls the program's `main(args)`. */
export function run(args) {
  reseedRandom("controller");
  if (!programMain) {
    throw "this program exports no `main` function (export function main(args) { ... } in the module given to build.mjs)";
  }
  try {
    const result = programMain(args);
    if (result && typeof result.then === "function") {
      throw new TypeError(
        "main returned a Promise: async functions stop at their first await here (QuickJS runs no promise jobs in a synchronous component); write a plain function and wait with .get()",
      );
    }
    reactor.raiseUnhandled();
  } catch (e) {
    throw describeThrown(e);
  }
}

let actor = null;
let actorEndpoints = null;

/** The WIT export `actor-class`: makes and runs this instance's actor. */
export const actorClass = {
  create(className, init, rank, extent) {
    if (actor) throw "this instance already holds an actor; the host calls `create` once";
    const cls = classes.get(className);
    if (!cls) {
      const known = [...classes.keys()];
      throw `this program has no actor class \`${className}\`; it has: ${known.length ? known.join(", ") : "none"} (export actor classes from the program's module, or register them)`;
    }
    context = { rank, extent: new Extent(extent), className };
    reseedRandom(`${className}[${rank}]`);
    try {
      const { args, kwargs: kw } = decodeArgs(init, { tags: VALUE_TAGS });
      if (kw) args.push(kw);
      actorEndpoints = new Set(endpointsOf(cls));
      actor = new cls(...args);
    } catch (e) {
      actor = null;
      throw `\`new ${className}(...)\` threw ${describeThrown(e)}`;
    }
  },

  handle(endpoint, message) {
    if (!actor) {
      throw { message: "this instance holds no actor yet; the host calls `create` first", typeName: "Error", backtrace: null };
    }
    if (!actorEndpoints.has(endpoint)) {
      throw {
        message: `${context.className} has no endpoint \`${endpoint}\`; its endpoints: ${[...actorEndpoints].join(", ") || "none"} (list them in static endpoints)`,
        typeName: "TypeError",
        backtrace: null,
      };
    }
    try {
      const { args, kwargs: kw } = decodeArgs(message, { tags: VALUE_TAGS });
      if (kw) args.push(kw);
      return encode(actor[endpoint](...args));
    } catch (e) {
      throw endpointError(e);
    }
  },

  supervise(failure) {
    if (!actor) return false;
    try {
      return actor.supervise(new Failure(failure)) === true;
    } catch (e) {
      logging.log("error", `${context.className}.supervise threw ${inspect(e)}`);
      return false;
    }
  },
};
