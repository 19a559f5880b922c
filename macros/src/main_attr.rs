//! `#[main]`: wraps the program's `main`, so that the process serves as a
//! worker when started as one, and the cluster is shut down when `main`
//! returns.

use proc_macro2::{Span, TokenStream as Tokens};
use quote::quote;
use syn::spanned::Spanned;
use syn::ItemFn;

use crate::types::return_info;

/// `#[main]` (which takes no options in `attr`) on the function in `item`.
pub(crate) fn expand(attr: Tokens, item: Tokens) -> Tokens {
    if !attr.is_empty() {
        return syn::Error::new(Span::call_site(), "#[prism::main] takes no options")
            .to_compile_error();
    }
    let func = match syn::parse2::<ItemFn>(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    if func.sig.asyncness.is_some() {
        return syn::Error::new(func.sig.span(), "#[prism::main] goes on a synchronous `fn main`; inside, use prism's async API from your own runtime")
            .to_compile_error();
    }
    let attrs = &func.attrs;
    let vis = &func.vis;
    let output = &func.sig.output;
    let body = &func.block;
    // A `Result` is reported here rather than by Rust, which would print
    // `Error: ` and the error's `Debug` (`HeadUnreachable { message: ".." }`).
    let finish = if return_info(output).1 {
        report_error()
    } else {
        quote! { result }
    };
    quote! {
        #(#attrs)*
        #vis fn main() #output {
            ::prism::__private::enter_worker_mode_if_requested();
            fn __prism_user_main() #output #body
            let result = __prism_user_main();
            ::prism::shutdown();
            #finish
        }
    }
}

/// Ends the process on an `Err(e)` from the user's `main` (after the
/// shutdown): `error: {e}` on stderr, with the error's `Display`, and exit
/// code 1, as Rust's own report of a `main`'s error exits. `Ok` is
/// returned as it was. An error type without `Display` (Rust asks only
/// for `Debug`) is still accepted and printed with its `Debug`: the
/// method call below picks the first of the two impls that applies.
fn report_error() -> Tokens {
    quote! {
        match result {
            ::core::result::Result::Err(__prism_error) => {
                struct __PrismShow<'a, T>(&'a T);
                trait __PrismDisplay {
                    fn __prism_show(&self) -> ::std::string::String;
                }
                impl<T: ::core::fmt::Display> __PrismDisplay for __PrismShow<'_, T> {
                    fn __prism_show(&self) -> ::std::string::String {
                        ::std::format!("{}", self.0)
                    }
                }
                trait __PrismDebug {
                    fn __prism_show(&self) -> ::std::string::String;
                }
                impl<T: ::core::fmt::Debug> __PrismDebug for &__PrismShow<'_, T> {
                    fn __prism_show(&self) -> ::std::string::String {
                        ::std::format!("{:?}", self.0)
                    }
                }
                let __prism_shown = &__PrismShow(&__prism_error);
                ::std::eprintln!("error: {}", __prism_shown.__prism_show());
                ::std::process::exit(1)
            }
            __prism_ok => __prism_ok,
        }
    }
}
