//! Breakpoints: [`breakpoint!`](crate::breakpoint!) pauses the calling
//! actor (or the controller) for a debugger, `monarch-host debug`, showing
//! the values it names.
//!
//! A breakpoint does nothing unless the run has debugging on (`run
//! --debug-listen ADDR`, or a server job's `"debug": true`), so one left in
//! a program never hangs it. While an actor is paused the rest of the run
//! goes on, and neither its handler deadline nor the calls waiting on it
//! time out. At the `(monarch)` prompt: `p NAME` prints a value the
//! breakpoint shows, `locals` all of them, `where` the location, `c`
//! continues.

/// Whether this run has debugging on: a breakpoint would pause.
pub fn enabled() -> bool {
    #[cfg(target_arch = "wasm32")]
    return crate::bindings::monarch::host::debug::enabled();
    #[cfg(not(target_arch = "wasm32"))]
    false
}

/// Pauses at `location` in `function` showing `values`; what
/// [`breakpoint!`](crate::breakpoint!) calls.
pub fn pause_here(function: &str, location: &str, values: &[(String, String)]) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::monarch::host::debug::breakpoint(function, location, values);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = (function, location, values);
}

/// The name of the function that holds a `breakpoint!`, from the type
/// name of a function item defined inside it.
#[doc(hidden)]
pub fn enclosing_function(inner: &'static str) -> &'static str {
    let name = inner.strip_suffix("::__here").unwrap_or(inner);
    // Closures and async blocks add `{{closure}}` segments.
    let mut name = name;
    while let Some(outer) = name.strip_suffix("::{{closure}}") {
        name = outer;
    }
    name
}

/// Pauses here for the run's debugger, showing the values named:
/// `breakpoint!()`, `breakpoint!(lr = self.lr, step)`. Each value is shown
/// with `{:?}`. Does nothing (and evaluates nothing) unless the run has
/// debugging on.
///
/// ```
/// # fn step(lr: f64, loss: f64) {
/// monarch_guest::breakpoint!(lr, loss, ratio = loss / lr);
/// # }
/// ```
#[macro_export]
macro_rules! breakpoint {
    ($($name:ident $(= $value:expr)?),* $(,)?) => {
        if $crate::debug::enabled() {
            fn __here() {}
            let function = $crate::debug::enclosing_function(::std::any::type_name_of_val(&__here));
            let location = ::std::format!("{}:{}", ::std::file!(), ::std::line!());
            let values: ::std::vec::Vec<(::std::string::String, ::std::string::String)> = ::std::vec![
                $((
                    ::std::string::String::from(::std::stringify!($name)),
                    ::std::format!("{:?}", $crate::__breakpoint_value!($name $(= $value)?)),
                )),*
            ];
            $crate::debug::pause_here(function, &location, &values);
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __breakpoint_value {
    ($name:ident = $value:expr) => {
        &$value
    };
    ($name:ident) => {
        &$name
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_enclosing_function_is_named() {
        fn outer() -> &'static str {
            fn __here() {}
            super::enclosing_function(std::any::type_name_of_val(&__here))
        }
        assert!(
            outer().ends_with("tests::the_enclosing_function_is_named::outer"),
            "{}",
            outer()
        );
        // Outside Wasm a breakpoint is off and does nothing.
        let lr = 0.5;
        crate::breakpoint!(lr, twice = lr * 2.0);
    }
}
