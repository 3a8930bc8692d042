//! The program's tests: the registry that
//! [`#[monarch_guest::test]`](crate::test) fills and the WIT export
//! `monarch:host/tests` reads.
//!
//! Each marked function is one static [`TestCase`] (name, module, and a
//! function that starts it), collected at link time by the `inventory`
//! crate: in a Wasm component the linker's constructors
//! (`__wasm_call_ctors`, which the export glue calls before the first
//! export) put every case in the registry, so `list-tests` sees them all
//! without a list in [`program!`](crate::program!).
//!
//! - TS-1: `list-tests` names every registered test by its function's
//!   name, sorted; a program without tests lists none.
//! - TS-2: `run-test(name)` runs that test as `run` runs `main`
//!   ([`run_main`](crate::program::run_main): the SDK's executor, and an
//!   unhandled failure fails it); its `Err` text is the test's failure.
//! - TS-3: `run-test` of a name no test has fails with the names there
//!   are; of a name two tests share, with the modules of both.

use std::future::Future;
use std::pin::Pin;

/// A started test: what its function returns, boxed.
pub type TestFuture = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// Starts a test.
pub type TestFn = fn() -> TestFuture;

/// One test, as `#[monarch_guest::test]` registers it.
pub struct TestCase {
    name: &'static str,
    module: &'static str,
    start: TestFn,
}

impl TestCase {
    /// The test `name` (its function's name) of `module`, started by
    /// `start`.
    pub const fn new(name: &'static str, module: &'static str, start: TestFn) -> Self {
        TestCase {
            name,
            module,
            start,
        }
    }
}

inventory::collect!(TestCase);

/// What a test function may return, turned into its result.
#[diagnostic::on_unimplemented(
    message = "#[monarch_guest::test] needs a fn with no arguments returning () or Result<(), String>; this one returns `{Self}`",
    label = "a test returns () or Result<(), String>"
)]
pub trait TestOutput {
    /// The test's result: `Ok` when it passed, else why it failed.
    fn into_test_result(self) -> Result<(), String>;
}

impl TestOutput for () {
    fn into_test_result(self) -> Result<(), String> {
        Ok(())
    }
}

impl TestOutput for Result<(), String> {
    fn into_test_result(self) -> Result<(), String> {
        self
    }
}

/// Every registered test.
fn registered() -> Vec<&'static TestCase> {
    inventory::iter::<TestCase>.into_iter().collect()
}

/// The names of `cases`, sorted (TS-1).
fn names(cases: &[&TestCase]) -> Vec<String> {
    let mut names: Vec<String> = cases.iter().map(|case| case.name.to_string()).collect();
    names.sort();
    names
}

/// The one case of `cases` named `name` (TS-3).
fn find<'a>(cases: &[&'a TestCase], name: &str) -> Result<&'a TestCase, String> {
    let matching: Vec<&TestCase> = cases
        .iter()
        .copied()
        .filter(|case| case.name == name)
        .collect();
    match matching.as_slice() {
        [case] => Ok(case),
        [] if cases.is_empty() => Err(format!(
            "no test named `{name}`; this program has no tests (mark them with #[monarch_guest::test])"
        )),
        [] => Err(format!(
            "no test named `{name}`; the tests are: {}",
            names(cases).join(", ")
        )),
        several => {
            let mut modules: Vec<&str> = several.iter().map(|case| case.module).collect();
            modules.sort_unstable();
            Err(format!(
                "{} tests are named `{name}` (in {}); rename all but one, since a test is run by its name",
                several.len(),
                modules.join(", ")
            ))
        }
    }
}

/// The `list-tests` export: the program's test names, sorted.
pub fn list_tests() -> Vec<String> {
    names(&registered())
}

/// The `run-test` export: runs the test `name` as the controller.
pub fn run_test(name: &str) -> Result<(), String> {
    let case = find(&registered(), name)?;
    crate::program::run_main((case.start)())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passes() -> TestFuture {
        Box::pin(async { Ok(()) })
    }

    /// Runs a test future that needs no host (it never waits) to its end.
    fn finish(mut future: TestFuture) -> Result<(), String> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(result) => result,
            std::task::Poll::Pending => panic!("this test future waits, with no host to wake it"),
        }
    }

    fn case(name: &'static str, module: &'static str) -> TestCase {
        TestCase::new(name, module, passes)
    }

    #[test]
    fn ts_1_names_are_sorted() {
        let (b, a, c) = (
            case("b_test", "m"),
            case("a_test", "m"),
            case("c_test", "m"),
        );
        assert_eq!(names(&[&b, &c, &a]), ["a_test", "b_test", "c_test"]);
        assert!(names(&[]).is_empty());
    }

    #[test]
    fn ts_3_an_unknown_name_lists_the_tests() {
        let (b, a) = (case("b", "m"), case("a", "m"));
        let err = find(&[&b, &a], "nope").err().unwrap();
        assert_eq!(err, "no test named `nope`; the tests are: a, b");
        let err = find(&[], "nope").err().unwrap();
        assert_eq!(
            err,
            "no test named `nope`; this program has no tests (mark them with #[monarch_guest::test])"
        );
        assert_eq!(find(&[&b, &a], "a").map(|case| case.name), Ok("a"));
    }

    #[test]
    fn ts_3_a_shared_name_names_both_modules() {
        let (one, two) = (case("same", "app::one"), case("same", "app::two"));
        let err = find(&[&two, &one], "same").err().unwrap();
        assert_eq!(
            err,
            "2 tests are named `same` (in app::one, app::two); rename all but one, since a test is run by its name"
        );
    }

    #[test]
    fn test_outputs_become_results() {
        assert_eq!(().into_test_result(), Ok(()));
        assert_eq!(
            Err::<(), _>("7".to_string()).into_test_result(),
            Err("7".into())
        );
    }

    // The attribute itself, registering into the real registry of this
    // test binary (natively, `inventory` collects through `.init_array`).

    #[crate::test]
    async fn registered_async_test() -> Result<(), String> {
        Err("the value was 7, expected 8".into())
    }

    #[crate::test]
    fn registered_plain_test() {}

    #[test]
    fn ts_1_the_attribute_registers_tests_by_name() {
        let listed = list_tests();
        assert_eq!(listed, ["registered_async_test", "registered_plain_test"]);
        let case = find(&registered(), "registered_async_test").unwrap();
        assert_eq!(case.module, "monarch_guest::testing::tests");
        assert_eq!(
            finish((case.start)()),
            Err("the value was 7, expected 8".to_string())
        );
        let case = find(&registered(), "registered_plain_test").unwrap();
        assert_eq!(finish((case.start)()), Ok(()));
    }
}
