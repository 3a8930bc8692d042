//! The attribute macros of `monarch-guest`; use them through that crate,
//! as `#[monarch_guest::test]`.
//!
//! `#[monarch_guest::test]` keeps the function it marks as it is and
//! registers it, by name, in the registry that the SDK's `tests` export
//! reads (`list-tests` and `run-test`, which `monarch-host test` calls).
//! The registration is a static entry collected at link time (the
//! `inventory` crate), so a test needs no list of its own in `program!`.

#![warn(missing_docs)]

use proc_macro::TokenStream;
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Error, ItemFn, ReturnType, Safety, Type};

/// What a test function must look like, said by every error about one.
const SIGNATURE: &str =
    "#[monarch_guest::test] needs a fn with no arguments returning () or Result<(), String>";

/// Marks a test of a monarch-host program: `monarch-host test APP.wasm`
/// runs it as the controller, on a cluster of its own.
///
/// ```text
/// #[monarch_guest::test]
/// async fn greets_every_rank() -> Result<(), String> {
///     let procs = spawn_procs(&extent!(gpus = 3))?;
///     ...
///     Ok(())
/// }
/// ```
///
/// The function takes no arguments and returns `()` or
/// `Result<(), String>`; it may be `async` or not. Its name is the test's
/// name. It passes when it returns (`Ok`), fails with the text of its
/// `Err`, and fails with the message and line of a panic (an `assert!`).
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    match expand(args.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(err) => err.to_compile_error().into(),
    }
}

/// The test function, unchanged, and its registration.
fn expand(
    args: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
) -> syn::Result<proc_macro2::TokenStream> {
    if !args.is_empty() {
        return Err(Error::new_spanned(
            args,
            "#[monarch_guest::test] takes no arguments",
        ));
    }
    let function: ItemFn = syn::parse2(item.clone())
        .map_err(|e| Error::new(e.span(), format!("{SIGNATURE}; this is not a fn ({e})")))?;
    check_signature(&function)?;

    let name = &function.sig.ident;
    let output_span = match &function.sig.output {
        ReturnType::Default => name.span(),
        ReturnType::Type(_, ty) => ty.span(),
    };
    let call = if function.sig.asyncness.is_some() {
        quote! { #name().await }
    } else {
        quote! { #name() }
    };
    // The output's trait bound carries the span of the return type, so
    // that a wrong one (`Result<(), i32>`) is reported there.
    let into_result = quote_spanned! {output_span=>
        ::monarch_guest::__private::TestOutput::into_test_result(#call)
    };
    let runner = format_ident!("__monarch_guest_run_{}", name);
    Ok(quote! {
        #function

        #[doc(hidden)]
        const _: () = {
            fn #runner() -> ::monarch_guest::__private::TestFuture {
                ::std::boxed::Box::pin(async { #into_result })
            }
            ::monarch_guest::__private::inventory::submit! {
                ::monarch_guest::__private::TestCase::new(
                    ::core::stringify!(#name),
                    ::core::module_path!(),
                    #runner,
                )
            }
        };
    })
}

/// Refuses a test function that the registry could not call: one with
/// arguments, generics, `self`, a C ABI, `unsafe`, or a return type other
/// than `()` or a `Result`.
fn check_signature(function: &ItemFn) -> syn::Result<()> {
    let sig = &function.sig;
    let wrong = |tokens: &dyn ToTokens, why: &str| {
        Err(Error::new_spanned(
            tokens.to_token_stream(),
            format!("{SIGNATURE}; {why}"),
        ))
    };
    if !sig.inputs.is_empty() {
        return wrong(&sig.inputs, "this one takes arguments");
    }
    if let Some(variadic) = &sig.variadic {
        return wrong(variadic, "this one takes arguments");
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return wrong(&sig.generics, "this one is generic");
    }
    if let Safety::Unsafe(token) = &sig.safety {
        return wrong(token, "this one is `unsafe`");
    }
    if let Some(abi) = &sig.abi {
        return wrong(abi, "this one has an `extern` ABI");
    }
    match &sig.output {
        ReturnType::Default => Ok(()),
        ReturnType::Type(_, ty) if returns_unit_or_result(ty) => Ok(()),
        ReturnType::Type(_, ty) => wrong(ty, "this one returns something else"),
    }
}

/// `()` or a path ending in `Result` (whose arguments the trait bound of
/// the expansion checks).
fn returns_unit_or_result(ty: &Type) -> bool {
    match ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Paren(inner) => returns_unit_or_result(&inner.elem),
        Type::Group(inner) => returns_unit_or_result(&inner.elem),
        Type::Path(path) => {
            path.qself.is_none()
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|segment| segment.ident == "Result")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    // Not a glob: this crate's `test` would hide Rust's `#[test]`.
    use super::{SIGNATURE, expand};

    fn expand_str(args: &str, item: &str) -> Result<String, String> {
        let args: proc_macro2::TokenStream = args.parse().unwrap();
        let item: proc_macro2::TokenStream = item.parse().unwrap();
        expand(args, item)
            .map(|tokens| tokens.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn an_async_test_is_kept_and_registered_by_its_name() {
        let out = expand_str("", "async fn greets() -> Result<(), String> { Ok(()) }").unwrap();
        assert!(out.contains("async fn greets ()"), "{out}");
        assert!(out.contains("stringify ! (greets)"), "{out}");
        assert!(out.contains("greets () . await"), "{out}");
        assert!(out.contains("inventory :: submit !"), "{out}");
    }

    #[test]
    fn a_plain_fn_returning_unit_is_called_without_await() {
        let out = expand_str("", "fn adds() { assert_eq!(1 + 1, 2); }").unwrap();
        assert!(out.contains("into_test_result (adds ())"), "{out}");
        assert!(!out.contains("await"), "{out}");
    }

    #[test]
    fn a_wrong_signature_is_a_clear_error() {
        for (item, why) in [
            ("async fn takes(x: u32) {}", "this one takes arguments"),
            ("async fn generic<T>() {}", "this one is generic"),
            (
                "async fn returns() -> u32 { 1 }",
                "this one returns something else",
            ),
            ("unsafe fn risky() {}", "this one is `unsafe`"),
            ("struct NotAFn;", "this is not a fn"),
        ] {
            let err = expand_str("", item).unwrap_err();
            assert!(err.starts_with(SIGNATURE), "{item}: {err}");
            assert!(err.contains(why), "{item}: {err}");
        }
        let err = expand_str("timeout = 5", "async fn t() {}").unwrap_err();
        assert_eq!(err, "#[monarch_guest::test] takes no arguments");
    }
}
