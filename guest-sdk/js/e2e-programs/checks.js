// Checks for the test programs (a module of the program's own, imported by
// relative path, which build.mjs bundles too).

/** Prints `ok - what`, or throws (which fails the run). */
export function check(what, cond, detail = "") {
  if (!cond) throw new Error(`check failed: ${what}${detail ? ` (${detail})` : ""}`);
  console.log(`ok - ${what}`);
}

/** Checks that `fn` throws an error that `test` accepts; returns it. */
export function expectError(what, fn, test) {
  let caught = null;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  check(what, caught !== null && test(caught), caught ? `${caught.name}: ${caught.message}` : "nothing was thrown");
  return caught;
}
