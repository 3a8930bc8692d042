// build.mjs without jco: the build folder it lays out (seen through a fake
// jco that records it) and the errors it reports before jco runs.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

const BUILD = fileURLToPath(new URL("../build.mjs", import.meta.url));
const WIT = fileURLToPath(new URL("../../../wit", import.meta.url));
const work = mkdtempSync(join(tmpdir(), "monarch-js-build-test-"));
after(() => rmSync(work, { recursive: true, force: true }));

// A jco that writes what it was given and the build folder's files (JSON) as the "component".
const fakeJco = join(work, "fake-jco.mjs");
writeFileSync(
  fakeJco,
  `import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
const args = process.argv.slice(2);
const files = {};
const walk = (dir, rel) => {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) walk(p, rel + name + "/");
    else files[rel + name] = readFileSync(p, "utf8");
  }
};
walk(process.cwd(), "");
writeFileSync(args[args.indexOf("-o") + 1], JSON.stringify({ args, files }));
`,
);

function write(rel, text) {
  const p = join(work, rel);
  mkdirSync(join(p, ".."), { recursive: true });
  writeFileSync(p, text);
  return p;
}

function build(app, out, env = {}) {
  return spawnSync(process.execPath, [BUILD, app, "-o", out, "--wit", WIT], {
    encoding: "utf8",
    env: { ...process.env, JCO: `${process.execPath} ${fakeJco}`, ...env },
  });
}

test("the program, its modules and the SDK are laid out, with `monarch` pointed at the SDK", () => {
  const app = write("proj/src/app.js", 'import { Actor } from "monarch";\nimport { helper } from "../lib/util.js";\nexport function main() { helper(); }\n');
  write("proj/lib/util.js", "import * as m from 'monarch';\nexport { Actor } from \"monarch\";\nexport function helper() {}\n");
  const out = join(work, "out", "app.wasm");
  const r = build(app, out);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /built .*app\.wasm/);
  const { args, files } = JSON.parse(readFileSync(out, "utf8"));
  assert.deepEqual(args.slice(0, 2), ["componentize", "__monarch_entry__.js"]);
  for (const flag of ["--backend", "qjs", "--backend-qjs-disable-async", "-n", "program", "--wit"]) assert.ok(args.includes(flag), flag);
  assert.deepEqual(
    Object.keys(files).sort(),
    ["__monarch__/cbor.js", "__monarch__/core.js", "__monarch__/monarch.js", "__monarch_entry__.js", "lib/util.js", "package.json", "src/app.js"],
  );
  assert.equal(files["src/app.js"], 'import { Actor } from "../__monarch__/monarch.js";\nimport { helper } from "../lib/util.js";\nexport function main() { helper(); }\n');
  assert.equal(files["lib/util.js"], "import * as m from '../__monarch__/monarch.js';\nexport { Actor } from \"../__monarch__/monarch.js\";\nexport function helper() {}\n");
  assert.equal(
    files["__monarch_entry__.js"],
    [
      'import { __install } from "./__monarch__/monarch.js";',
      'import * as app from "./src/app.js";',
      'import * as module0 from "./lib/util.js";',
      "__install(app, true);",
      "__install(module0, false);",
      'export { run, actorClass } from "./__monarch__/monarch.js";',
      "",
    ].join("\n"),
  );
});

test("a syntax error names the user's file and line, before jco runs", () => {
  const app = write("syntax/app.js", 'import { Actor } from "monarch";\n\nexport function main() {\n  return 1 +;\n}\n');
  const r = build(app, join(work, "syntax.wasm"), { JCO: "/nonexistent/jco" });
  assert.equal(r.status, 1);
  assert.match(r.stderr, new RegExp(`syntax error in ${app.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}:\\n${app.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&")}:4\\n`));
  assert.match(r.stderr, /SyntaxError: Unexpected token/);
  assert.doesNotMatch(r.stderr, /monarch-js-(?!build-test)|node:internal/, "no build-folder paths");
});

test("imports it cannot bundle are named with their line", () => {
  const npm = write("npm/app.js", 'import { Actor } from "monarch";\nimport _ from "lodash";\n');
  let r = build(npm, join(work, "npm.wasm"));
  assert.equal(r.status, 1);
  assert.match(r.stderr, /npm\/app\.js:2: cannot import "lodash"/);

  const missing = write("missing/app.js", 'export { x } from "./gone.js";\n');
  r = build(missing, join(work, "missing.wasm"));
  assert.match(r.stderr, /missing\/app\.js:1: cannot find the module "\.\/gone\.js"/);

  const dynamic = write("dynamic/app.js", 'export function main() {\n  import("./x.js");\n}\n');
  r = build(dynamic, join(work, "dynamic.wasm"));
  assert.match(r.stderr, /dynamic\/app\.js:2: dynamic import\(\) is not supported/);
});

test("a relative path in $JCO is the caller's, not the build folder's", () => {
  write("relative/app.js", "export function main() {}\n");
  const r = spawnSync(process.execPath, [BUILD, "relative/app.js", "-o", "relative/app.wasm", "--wit", WIT], {
    cwd: work,
    encoding: "utf8",
    env: { ...process.env, JCO: `${process.execPath} ./fake-jco.mjs` },
  });
  assert.equal(r.status, 0, r.stderr);
  assert.ok(JSON.parse(readFileSync(join(work, "relative", "app.wasm"), "utf8")).files["app.js"]);
});

test("a missing jco is reported with how to install it", () => {
  const app = write("nojco/app.js", "export function main() {}\n");
  const r = build(app, join(work, "nojco.wasm"), { JCO: "/nonexistent/jco" });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /cannot run \/nonexistent\/jco: install jco \(npm install -g @bytecodealliance\/jco\) or set JCO/);
});

test("usage errors say what is expected", () => {
  const r = spawnSync(process.execPath, [BUILD], { encoding: "utf8" });
  assert.equal(r.status, 1);
  assert.match(r.stderr, /usage: node build\.mjs APP\.js/);
  const r2 = spawnSync(process.execPath, [BUILD, join(work, "nope.js")], { encoding: "utf8" });
  assert.match(r2.stderr, /nope\.js: no such file/);
});
