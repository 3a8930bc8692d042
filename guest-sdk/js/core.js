// The parts of the SDK that do not touch the host: shapes (Extent, Point,
// ValueMesh), errors (CallError and its kinds, Failure), the event router
// (Reactor) and the futures it completes. `monarch.js` binds them to the
// WIT imports; the tests drive them with a scripted event source.

import { CodecError, ENCODE } from "./cbor.js";

// ----------------------------------------------------------------- shapes

/** A mesh's shape: named dimensions, outermost first; ranks are row-major. */
export class Extent {
  /** `dims`: [{name, size}] (the WIT record), or an object {name: size}. */
  constructor(dims) {
    if (!Array.isArray(dims)) {
      dims = Object.entries(dims ?? {}).map(([name, size]) => ({ name, size }));
    }
    for (const d of dims) {
      if (typeof d.name !== "string" || !Number.isInteger(d.size) || d.size < 0) {
        throw new TypeError(`an extent's dimensions are {name: size} with sizes >= 0, not ${JSON.stringify(d)}`);
      }
    }
    this.dims = dims.map((d) => ({ name: d.name, size: d.size }));
    Object.freeze(this.dims);
  }

  /** The dimensions' names, outermost first. */
  get names() {
    return this.dims.map((d) => d.name);
  }

  /** The dimensions' sizes, outermost first. */
  get sizes() {
    return this.dims.map((d) => d.size);
  }

  /** How many ranks (points) the extent has. */
  get size() {
    return this.dims.reduce((n, d) => n * d.size, 1);
  }

  /** The point of `rank` (row-major). */
  point(rank) {
    if (!Number.isInteger(rank) || rank < 0 || rank >= this.size) {
      throw new RangeError(`rank ${rank} is outside an extent of ${this.size} ranks (${this})`);
    }
    const coords = {};
    let rest = rank;
    for (let i = this.dims.length - 1; i >= 0; i--) {
      const { name, size } = this.dims[i];
      coords[name] = rest % size;
      rest = Math.floor(rest / size);
    }
    const ordered = {};
    for (const d of this.dims) ordered[d.name] = coords[d.name];
    return new Point(rank, ordered);
  }

  /** The rank of the point with these coordinates ({name: index}, every dimension). */
  rankOf(coords) {
    let rank = 0;
    for (const { name, size } of this.dims) {
      const i = coords[name];
      if (!Number.isInteger(i) || i < 0 || i >= size) {
        throw new RangeError(`coordinate ${name}=${i} is outside ${this}`);
      }
      rank = rank * size + i;
    }
    return rank;
  }

  /** Each point, in rank order. */
  points() {
    const out = [];
    for (let r = 0; r < this.size; r++) out.push(this.point(r));
    return out;
  }

  /** The dimensions as an object {name: size}. */
  toObject() {
    return Object.fromEntries(this.dims.map((d) => [d.name, d.size]));
  }

  toString() {
    return this.dims.length ? this.dims.map((d) => `${d.name}=${d.size}`).join(", ") : "(a single point)";
  }
}

/** One point of an extent: its rank and its coordinate in each dimension. */
export class Point {
  constructor(rank, coords) {
    this.rank = rank;
    this.coords = coords;
  }

  toString() {
    const parts = Object.entries(this.coords).map(([k, v]) => `${k}=${v}`);
    return `{${parts.join(", ")}}`;
  }
}

/**
 * One value per rank of a mesh, in rank order, shaped like the mesh that
 * was called: `mesh[i]`, `mesh.length`, `for (const v of mesh)`,
 * `mesh.values()`, `mesh.items()` ([point, value] pairs), `mesh.extent`.
 */
export class ValueMesh {
  constructor(extent, values) {
    if (!(extent instanceof Extent)) extent = new Extent(extent);
    if (values.length !== extent.size) {
      throw new RangeError(`a value mesh shaped ${extent} needs ${extent.size} values, got ${values.length}`);
    }
    Object.defineProperty(this, "extent", { value: extent, enumerable: false });
    Object.defineProperty(this, "_values", { value: values.slice(), enumerable: false });
    for (let i = 0; i < values.length; i++) {
      Object.defineProperty(this, i, { value: values[i], enumerable: true });
    }
    Object.freeze(this);
  }

  get length() {
    return this._values.length;
  }

  /** The values, in rank order (a new array). */
  values() {
    return this._values.slice();
  }

  /** [point, value] for each rank, in rank order. */
  items() {
    return this._values.map((v, rank) => [this.extent.point(rank), v]);
  }

  /** The value at a rank, or at the point with these coordinates. */
  get(at) {
    const rank = typeof at === "number" ? at : this.extent.rankOf(at);
    if (!(rank >= 0 && rank < this._values.length)) {
      throw new RangeError(`rank ${rank} is outside a value mesh of ${this._values.length}`);
    }
    return this._values[rank];
  }

  map(fn) {
    return this._values.map(fn);
  }

  forEach(fn) {
    this._values.forEach(fn);
  }

  [Symbol.iterator]() {
    return this._values[Symbol.iterator]();
  }

  [ENCODE]() {
    return this._values;
  }

  toString() {
    return `ValueMesh(${this.extent}) ${inspect(this._values, 1)}`;
  }
}

// ----------------------------------------------------------------- errors

const ENDPOINT_KINDS = new Set(["endpoint"]);
const SUPERVISION_KINDS = new Set(["trap", "deadline", "out-of-memory", "proc-lost", "supervision"]);

/** "mesh[rank]", the way the host names an actor. */
function actorName(mesh, rank) {
  return `${mesh}[${rank}]`;
}

/**
 * Why a call did not return a value. `kind` is the WIT error kind
 * (`endpoint`, `trap`, `deadline`, `out-of-memory`, `proc-lost`,
 * `stopped`, `timeout`, `invalid`, `supervision`); `mesh`, `rank` and
 * `endpoint` name the actor where known; `reason` is the error in the
 * actor's or the host's words; `typeName` and `backtrace` come from the
 * actor. Endpoint errors are `ActorError`s and failed actors
 * `SupervisionError`s; the other kinds are plain `CallError`s.
 */
export class CallError extends Error {
  constructor(fields) {
    super(describeError(fields));
    this.name = "CallError";
    this.kind = fields.kind;
    this.mesh = fields.mesh ?? null;
    this.rank = fields.rank ?? null;
    this.endpoint = fields.endpoint ?? null;
    this.reason = fields.reason ?? "";
    this.typeName = fields.typeName ?? null;
    this.backtrace = fields.backtrace ?? null;
  }
}

/** An endpoint threw: `typeName` is the remote error's type (`RangeError`, `ValueError`...). */
export class ActorError extends CallError {
  constructor(fields) {
    super(fields);
    this.name = "ActorError";
  }
}

/** An actor failed: it trapped, ran past its deadline or out of memory, lost its proc, or failed a supervision. */
export class SupervisionError extends CallError {
  constructor(fields) {
    super(fields);
    this.name = "SupervisionError";
  }
}

function describeError({ kind, mesh, rank, endpoint, reason, typeName }) {
  const who = mesh != null ? actorName(mesh, rank) : null;
  switch (kind) {
    case "endpoint":
      return `${endpoint ? `the endpoint \`${endpoint}\`` : "an endpoint"}${who ? ` at ${who}` : ""} raised ${typeName ? `${typeName}: ` : ""}${reason}`;
    case "timeout":
      return `no reply${who ? ` from ${who}` : ""}${endpoint ? ` to \`${endpoint}\`` : ""} in time: ${reason}`;
    case "invalid":
      return `the request was not valid: ${reason}`;
    case "stopped":
      return `actor${who ? ` ${who}` : ""} is stopped${endpoint ? ` (in \`${endpoint}\`)` : ""}: ${reason}`;
    default:
      return `actor${who ? ` ${who}` : ""} failed${endpoint ? ` in \`${endpoint}\`` : ""}: ${kind}: ${reason}`;
  }
}

/** The error for a WIT `call-error` record. */
export function callError(record) {
  const fields = {
    kind: record.kind,
    mesh: record.origin ? record.origin.mesh : null,
    rank: record.origin ? record.origin.rank : null,
    endpoint: record.origin ? record.origin.endpoint : null,
    reason: record.message,
    typeName: record.typeName,
    backtrace: record.backtrace,
  };
  if (ENDPOINT_KINDS.has(record.kind)) return new ActorError(fields);
  if (SUPERVISION_KINDS.has(record.kind)) return new SupervisionError(fields);
  return new CallError(fields);
}

/**
 * An actor of a mesh this program (or actor) owns failed; reported once per
 * actor, to `supervise(fn)` in the controller or an actor's `supervise`
 * method. The fields are the WIT `supervision-failure`'s.
 */
export class Failure {
  constructor(record) {
    this.mesh = record.mesh;
    this.rank = record.rank;
    this.kind = record.kind;
    this.endpoint = record.endpoint ?? null;
    this.typeName = record.typeName ?? null;
    this.reason = record.reason;
    this.backtrace = record.backtrace ?? null;
  }

  /** The failure as an error to throw. */
  toError() {
    const fields = { ...this };
    return this.kind === "endpoint" ? new ActorError(fields) : new SupervisionError({ ...fields, kind: this.kind });
  }

  toString() {
    const what = this.typeName ? `${this.typeName}: ${this.reason}` : this.reason;
    return `actor ${actorName(this.mesh, this.rank)} failed${this.endpoint ? ` in \`${this.endpoint}\`` : ""}: ${this.kind}: ${what}`;
  }
}

/**
 * What an endpoint that threw `thrown` returns to the host (the WIT
 * `endpoint-error`): the error's name as its type, its message, and its
 * stack as the backtrace. Never throws.
 */
export function endpointError(thrown) {
  try {
    if (thrown instanceof Error) {
      const stack = typeof thrown.stack === "string" && thrown.stack.trim() ? thrown.stack : null;
      const remote = thrown instanceof CallError && thrown.backtrace ? thrown.backtrace : null;
      return {
        message: String(thrown.message),
        typeName: thrown instanceof CallError && thrown.typeName ? thrown.typeName : String(thrown.name || thrown.constructor.name || "Error"),
        backtrace: remote && stack ? `${stack}\ncaused by a remote error:\n${remote}` : stack ?? remote,
      };
    }
    return { message: inspect(thrown), typeName: null, backtrace: null };
  } catch (e) {
    return { message: "an endpoint threw a value that cannot be described", typeName: null, backtrace: null };
  }
}

// --------------------------------------------------------------- the loop

/** The most events taken from the host at once. */
const MAX_EVENTS = 1024;
/** How long one wait for the host lasts before the loop looks again. */
const WAIT_MS = 60000;

/** Milliseconds from a monotonic clock. */
export function now() {
  return typeof performance !== "undefined" ? performance.now() : Date.now();
}

/**
 * Routes the host's events (`mesh.next-events`) to the requests that wait
 * for them. Every wait (a future's `get`, a stream, `sleep`) runs the same
 * loop, so all requests in flight progress while any one is waited for,
 * and a wait may happen inside an actor's handler (nested in the host's
 * call). Failure events go to the supervisor.
 */
export class Reactor {
  /** `nextEvents(max, timeoutMs)`: the host's mailbox. */
  constructor(nextEvents) {
    this.nextEvents = nextEvents;
    this.slots = new Map();
    this.failures = [];
    this.supervisor = null;
    this.unhandled = [];
    this.dropped = 0;
  }

  /** Starts collecting the events of request `id`. */
  register(id) {
    if (!this.slots.has(id)) this.slots.set(id, []);
  }

  /** Forgets request `id`; its later events are dropped. */
  cancel(id) {
    this.slots.delete(id);
  }

  /** Waits up to `timeoutMs` for events and routes them; returns how many came. */
  pump(timeoutMs) {
    const events = this.nextEvents(MAX_EVENTS, Math.max(0, Math.ceil(timeoutMs)));
    for (const event of events) this.route(event);
    return events.length;
  }

  route(event) {
    if (event.kind.tag === "failure") {
      this.fail(new Failure(event.kind.val));
      return;
    }
    const slot = this.slots.get(event.id);
    if (slot) slot.push(event.kind);
    else this.dropped++;
  }

  /** A failure came: offer it to the supervisor; unhandled, the next wait throws it. */
  fail(failure) {
    this.failures.push(failure);
    let handled = false;
    if (this.supervisor) {
      try {
        handled = this.supervisor(failure) === true;
      } catch (e) {
        failure.supervisorError = e;
      }
    }
    if (!handled) this.unhandled.push(failure);
  }

  /** Throws the first failure nobody handled (once). */
  raiseUnhandled() {
    const failure = this.unhandled.shift();
    if (!failure) return;
    const err = failure.toError();
    err.message =
      `unhandled failure: ${failure}` +
      (failure.supervisorError ? ` (the supervisor threw ${inspect(failure.supervisorError)})` : "") +
      " (handle failures with supervise(fn))";
    err.failure = failure;
    throw err;
  }

  /**
   * The next event of request `id`, waiting up to `timeoutMs` (forever if
   * undefined); undefined if none came in time.
   */
  next(id, timeoutMs) {
    const slot = this.slots.get(id);
    if (!slot) throw new Error(`internal: request ${id} is not registered`);
    const deadline = timeoutMs == null ? Infinity : now() + timeoutMs;
    for (;;) {
      if (slot.length) {
        const kind = slot.shift();
        if (kind.tag === "done" || kind.tag === "end") this.slots.delete(id);
        return kind;
      }
      this.raiseUnhandled();
      const left = deadline - now();
      if (left <= 0) return undefined;
      this.pump(Math.min(left, WAIT_MS));
    }
  }

  /** Waits `ms` milliseconds, routing events meanwhile (0: routes what has come, without waiting). */
  sleep(ms) {
    if (!(ms > 0)) {
      this.pump(0);
      return;
    }
    const deadline = now() + ms;
    for (let left = ms; left > 0; left = deadline - now()) {
      this.pump(Math.min(left, WAIT_MS));
    }
  }
}

/**
 * A request in flight. `get()` waits for its result (routing every other
 * request's events meanwhile) and returns it, or throws its error. There
 * is no `await` under QuickJS here: `get()` is how a program waits.
 */
export class Future {
  /** `finish(eventKind)` turns the request's final event into a value (or throws). */
  constructor(reactor, id, finish) {
    this._reactor = reactor;
    this._id = id;
    this._finish = finish;
    this._state = "pending";
    this._outcome = undefined;
    reactor.register(id);
  }

  /** A future that is already resolved (or failed, if `error`). */
  static resolved(value, error) {
    const f = Object.create(Future.prototype);
    f._state = error ? "failed" : "ok";
    f._outcome = error ?? value;
    return f;
  }

  /**
   * The result. With `timeoutMs`, waits at most that long and then throws
   * a CallError of kind `timeout` (the request stays in flight: get() may
   * be called again).
   */
  get(timeoutMs) {
    if (this._state === "pending") {
      const kind = this._reactor.next(this._id, timeoutMs);
      if (kind === undefined) {
        throw new CallError({ kind: "timeout", reason: `no result within ${timeoutMs} ms; the request is still in flight, get() may wait again` });
      }
      try {
        this._outcome = this._finish(kind);
        this._state = "ok";
      } catch (e) {
        this._outcome = e;
        this._state = "failed";
      }
    }
    if (this._state === "failed") throw this._outcome;
    return this._outcome;
  }

  /** Whether the result is in, without waiting (events already queued are taken). */
  done() {
    if (this._state !== "pending") return true;
    const slot = this._reactor.slots.get(this._id);
    if (slot && slot.length === 0) this._reactor.pump(0);
    return !!slot && slot.length > 0;
  }

  [ENCODE]() {
    throw new CodecError("a Future cannot be sent; call .get() on it and send its value");
  }

  toString() {
    return `Future(${this._state})`;
  }
}

// ---------------------------------------------------------------- inspect

/** A readable one-line rendering of any value, for console output and messages. */
export function inspect(v, depth = 0) {
  switch (typeof v) {
    case "string":
      return depth === 0 ? v : JSON.stringify(v);
    case "bigint":
      return `${v}n`;
    case "function":
      return v.prototype && /^class\b/.test(Function.prototype.toString.call(v)) ? `[class ${v.name}]` : `[Function ${v.name || "(anonymous)"}]`;
    case "symbol":
      return v.toString();
    case "undefined":
      return "undefined";
    case "object":
      break;
    default:
      return String(v);
  }
  if (v === null) return "null";
  if (v instanceof Error) {
    const head = `${v.name}: ${v.message}`;
    return depth === 0 && v.stack ? `${head}\n${String(v.stack).replace(/\s+$/, "")}` : head;
  }
  if (depth > 4) return Array.isArray(v) ? "[Array]" : "[Object]";
  if (v instanceof Uint8Array) {
    const hex = Array.from(v.subarray(0, 32), (b) => b.toString(16).padStart(2, "0")).join(" ");
    return `Uint8Array(${v.length}) [${hex}${v.length > 32 ? " ..." : ""}]`;
  }
  if (Array.isArray(v)) return `[${v.map((x) => inspect(x, depth + 1)).join(", ")}]`;
  if (v instanceof Map) {
    return `Map(${v.size}) {${[...v].map(([k, x]) => `${inspect(k, depth + 1)} => ${inspect(x, depth + 1)}`).join(", ")}}`;
  }
  if (v instanceof Set) return `Set(${v.size}) {${[...v].map((x) => inspect(x, depth + 1)).join(", ")}}`;
  if (typeof v.toString === "function" && v.toString !== Object.prototype.toString) {
    try {
      return String(v.toString());
    } catch (e) {
      // fall through to the fields
    }
  }
  const name = v.constructor && v.constructor !== Object ? `${v.constructor.name} ` : "";
  const fields = Object.keys(v).map((k) => `${/^[A-Za-z_$][\w$]*$/.test(k) ? k : JSON.stringify(k)}: ${inspect(v[k], depth + 1)}`);
  return `${name}{${fields.length ? ` ${fields.join(", ")} ` : ""}}`;
}

/** Several values as one console line, the way console.log joins them. */
export function formatLine(args) {
  return args.map((a) => inspect(a, 0)).join(" ");
}
