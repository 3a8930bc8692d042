#!/usr/bin/env node
// Builds a JavaScript program into a monarch-host component:
//
//   node build.mjs APP.js -o OUT.wasm [--wit WIT_DIR] [--keep]
//
// The program imports the SDK as `import { Actor, thisHost } from "monarch"`
// and may import its own modules by relative path. This script copies the
// program's modules and the SDK (the files next to it: monarch.js, core.js,
// cbor.js) into a build folder, points the "monarch" imports at the SDK,
// writes an entry module that registers the program's exported `main` and
// the actor classes its modules export, checks the syntax with Node, and runs jco's QuickJS
// backend (`jco` on PATH, or the command in $JCO) against the WIT world
// `program`. Errors name the program's own files and lines.
//
// It needs Node 18+ and jco (`npm install -g @bytecodealliance/jco`), and
// nothing else: no bundler.

import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const SDK_DIR = dirname(fileURLToPath(import.meta.url));
/** The SDK's modules, copied into every build (guest-sdk/js/FILES lists them with this script). */
const SDK_FILES = ["monarch.js", "core.js", "cbor.js"];
/** Where the SDK goes in the build folder (a name no program is likely to use). */
const SDK_FOLDER = "__monarch__";
const ENTRY = "__monarch_entry__.js";

class BuildError extends Error {}

function usage() {
  return [
    "usage: node build.mjs APP.js [-o OUT.wasm] [--wit WIT_DIR] [--keep]",
    "",
    "  -o, --out OUT.wasm   the component to write (default: APP.wasm next to APP.js)",
    "  --wit WIT_DIR        the folder of monarch.wit (default: the wit/ folder next to",
    "                       this script, else the repository's wit/)",
    "  --keep               keep the build folder and print where it is",
    "",
    "jco comes from $JCO (a command) or `jco` on PATH.",
  ].join("\n");
}

function parseArgs(argv) {
  const opts = { app: null, out: null, wit: null, keep: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new BuildError(`${a} needs a value\n${usage()}`);
      return argv[++i];
    };
    if (a === "-o" || a === "--out") opts.out = value();
    else if (a === "--wit") opts.wit = value();
    else if (a === "--keep") opts.keep = true;
    else if (a === "-h" || a === "--help") {
      console.log(usage());
      process.exit(0);
    } else if (a.startsWith("-")) throw new BuildError(`unknown option ${a}\n${usage()}`);
    else if (opts.app === null) opts.app = a;
    else throw new BuildError(`one program at a time (got ${opts.app} and ${a})\n${usage()}`);
  }
  if (opts.app === null) throw new BuildError(usage());
  opts.app = resolve(opts.app);
  if (!existsSync(opts.app)) throw new BuildError(`${opts.app}: no such file`);
  opts.out = resolve(opts.out ?? opts.app.replace(/\.[cm]?js$/, "") + ".wasm");
  if (opts.wit === null) {
    opts.wit = [join(SDK_DIR, "wit"), join(SDK_DIR, "..", "..", "wit")].find((d) => existsSync(join(d, "monarch.wit")));
    if (!opts.wit) throw new BuildError("no WIT folder found next to build.mjs; pass --wit WIT_DIR (the folder of monarch.wit)");
  }
  opts.wit = resolve(opts.wit);
  if (!existsSync(opts.wit)) throw new BuildError(`--wit ${opts.wit}: no such folder`);
  return opts;
}

// The import and export-from specifiers of a module: `import x from "s"`,
// `import "s"`, `export * from "s"`, `export { a } from "s"`. A regular
// expression, not a parser: good enough for the specifiers a program
// writes, and `node --check` reports syntax errors before anything else.
const SPECIFIER = /(\bimport\s*(?:[\w$*{}\s,]+?\s*from\s*)?|\bexport\s*(?:\*(?:\s*as\s+[\w$]+)?|\{[^}]*\})\s*from\s*)(["'])([^"'\n]+)\2/g;
const DYNAMIC_IMPORT = /\bimport\s*\(/;

function isWitImport(spec) {
  return /^[a-z][a-z0-9-]*:[a-z][a-z0-9-]*\/[a-z0-9-]+(@[0-9][\w.+-]*)?$/.test(spec);
}

/** Finds the program's modules: the entry and every module it imports by relative path. */
function collectModules(entry) {
  const modules = new Map(); // absolute path -> source
  const pending = [entry];
  while (pending.length) {
    const file = pending.pop();
    if (modules.has(file)) continue;
    const source = readFileSync(file, "utf8");
    modules.set(file, source);
    const lines = source.split("\n");
    for (const [n, line] of lines.entries()) {
      if (DYNAMIC_IMPORT.test(line) && !/^\s*(\/\/|\*)/.test(line)) {
        throw new BuildError(`${file}:${n + 1}: dynamic import() is not supported; import modules statically`);
      }
    }
    for (const m of source.matchAll(SPECIFIER)) {
      const spec = m[3];
      const line = source.slice(0, m.index).split("\n").length;
      if (spec === "monarch" || isWitImport(spec)) continue;
      if (spec.startsWith("./") || spec.startsWith("../")) {
        const target = resolve(dirname(file), spec);
        if (!existsSync(target) || !statSync(target).isFile()) {
          throw new BuildError(`${file}:${line}: cannot find the module "${spec}" (${target})`);
        }
        pending.push(target);
        continue;
      }
      throw new BuildError(
        `${file}:${line}: cannot import "${spec}": a program imports "monarch", WIT interfaces ("monarch:host/mesh@0.2.0") and its own modules by relative path ("./util.js"); npm packages are not bundled`,
      );
    }
  }
  return modules;
}

/** The deepest folder that holds every file. */
function commonRoot(files) {
  let root = dirname(files[0]);
  for (const f of files) {
    while (!(f === root || f.startsWith(root.endsWith(sep) ? root : root + sep))) root = dirname(root);
  }
  return root;
}

function toPosix(p) {
  return p.split(sep).join("/");
}

/** Lays the program and the SDK out in `dir`; returns the map from build paths back to the user's files. */
function layOut(dir, opts) {
  const modules = collectModules(opts.app);
  const root = commonRoot([...modules.keys()]);
  const places = new Map(); // path inside the build folder (posix, from "/") -> user's file
  for (const [file, source] of modules) {
    const rel = toPosix(relative(root, file));
    if (rel === ENTRY || rel.split("/")[0] === SDK_FOLDER || rel === "package.json") {
      throw new BuildError(`${file}: the build reserves the name ${rel}; rename the file`);
    }
    const target = join(dir, rel);
    mkdirSync(dirname(target), { recursive: true });
    const sdk = toPosix(relative(dirname(target), join(dir, SDK_FOLDER, "monarch.js")));
    // Same length of lines: only the specifier changes, so lines and columns stay.
    const rewritten = source.replace(SPECIFIER, (all, head, quote, spec) =>
      spec === "monarch" ? `${head}${quote}${sdk.startsWith(".") ? sdk : "./" + sdk}${quote}` : all,
    );
    writeFileSync(target, rewritten);
    places.set("/" + rel, file);
  }
  mkdirSync(join(dir, SDK_FOLDER));
  for (const f of SDK_FILES) {
    copyFileSync(join(SDK_DIR, f), join(dir, SDK_FOLDER, f));
    places.set(`/${SDK_FOLDER}/${f}`, join(SDK_DIR, f));
  }
  // The entry: the program's module first (its main), then every other
  // module of the program, so that an actor class exported from any of
  // them is registered.
  const app = toPosix(relative(root, opts.app));
  const others = [...modules.keys()].filter((f) => f !== opts.app).map((f) => toPosix(relative(root, f)));
  writeFileSync(
    join(dir, ENTRY),
    [
      `import { __install } from "./${SDK_FOLDER}/monarch.js";`,
      `import * as app from "./${app}";`,
      ...others.map((rel, i) => `import * as module${i} from "./${rel}";`),
      `__install(app, true);`,
      ...others.map((_, i) => `__install(module${i}, false);`),
      `export { run, actorClass } from "./${SDK_FOLDER}/monarch.js";`,
      "",
    ].join("\n"),
  );
  // So that `node --check` reads the modules as ES modules.
  writeFileSync(join(dir, "package.json"), '{ "type": "module" }\n');
  return places;
}

/** Rewrites build-folder paths in a message to the user's files. */
function mapPaths(text, dir, places) {
  let out = text.split(dir + sep).join("/").split(toPosix(dir) + "/").join("/");
  // Longest first, so that "/a/b.js" is not read as "/b.js".
  for (const [inBuild, file] of [...places].sort((a, b) => b[0].length - a[0].length)) {
    out = out.split(`(${inBuild}:`).join(`(${file}:`).split(` ${inBuild}:`).join(` ${file}:`).split(`\n${inBuild}:`).join(`\n${file}:`);
    if (out.startsWith(`${inBuild}:`)) out = file + out.slice(inBuild.length);
    out = out.split(`'${inBuild}'`).join(`'${file}'`);
  }
  return out;
}

function checkSyntax(dir, places) {
  for (const [inBuild, file] of places) {
    if (inBuild.startsWith(`/${SDK_FOLDER}/`)) continue;
    const r = spawnSync(process.execPath, ["--check", join(dir, inBuild.slice(1))], { encoding: "utf8" });
    if (r.status !== 0) {
      const why = (r.stderr || r.stdout)
        .split("\n")
        .filter((line) => !/^\s*at .*\(node:internal\//.test(line) && !/^Node\.js v/.test(line))
        .join("\n");
      throw new BuildError(`syntax error in ${file}:\n${tidy(mapPaths(why, dir, places))}`);
    }
  }
}

/** Trims a tool's output and squeezes its runs of blank lines. */
function tidy(text) {
  return text.replace(/\n\s*\n(\s*\n)+/g, "\n\n").trim();
}

/** The jco command: $JCO (words split on spaces; relative paths are the caller's) or `jco`. */
function jcoCommand() {
  const cmd = process.env.JCO;
  if (!cmd || !cmd.trim()) return ["jco"];
  // jco runs in the build folder: make paths relative to where we were called absolute.
  return cmd
    .trim()
    .split(/\s+/)
    .map((word) => (word.startsWith("./") || word.startsWith("../") ? resolve(word) : word));
}

function componentize(dir, places, opts) {
  const [cmd, ...pre] = jcoCommand();
  const args = [...pre, "componentize", ENTRY, "--wit", opts.wit, "-n", "program", "--backend", "qjs", "--backend-qjs-disable-async", "-o", opts.out];
  const r = spawnSync(cmd, args, { cwd: dir, encoding: "utf8" });
  if (r.error) {
    if (r.error.code === "ENOENT") {
      throw new BuildError(`cannot run ${cmd}: install jco (npm install -g @bytecodealliance/jco) or set JCO to its command`);
    }
    throw new BuildError(`cannot run ${cmd}: ${r.error.message}`);
  }
  if (r.status !== 0 || !existsSync(opts.out)) {
    let why = mapPaths(`${r.stderr}\n${r.stdout}`.trim(), dir, places);
    why = why
      .replace(/\(jco componentize\)/g, "")
      .replace(/\[Error: (: )?/g, "")
      .replace(/\]\s*\{\s*code: '\w+'\s*\}/g, "");
    if (/Failed to finish JavaScript module evaluation/.test(why)) {
      why += "\n(a module's top-level code threw; top-level code runs once, at build time)";
    }
    throw new BuildError(`jco could not build ${opts.app}:\n${tidy(why)}`);
  }
}

function main() {
  let opts;
  let dir = null;
  try {
    opts = parseArgs(process.argv.slice(2));
    dir = mkdtempSync(join(tmpdir(), "monarch-js-"));
    const places = layOut(dir, opts);
    checkSyntax(dir, places);
    mkdirSync(dirname(opts.out), { recursive: true });
    if (existsSync(opts.out)) rmSync(opts.out);
    componentize(dir, places, opts);
    const size = statSync(opts.out).size;
    console.log(`built ${relative(process.cwd(), opts.out) || basename(opts.out)} (${(size / 1048576).toFixed(2)} MiB)`);
  } catch (e) {
    console.error(`build.mjs: ${e instanceof BuildError ? e.message : e.stack}`);
    process.exitCode = 1;
  } finally {
    if (dir && opts && opts.keep) console.error(`build folder kept: ${dir}`);
    else if (dir) rmSync(dir, { recursive: true, force: true });
  }
}

main();
