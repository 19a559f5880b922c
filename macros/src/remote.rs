//! `#[remote]`: a function callable as a task, through the module of the
//! same name that the attribute adds beside it.

use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::spanned::Spanned;
use syn::ItemFn;

use crate::options::{parse_options, resource_calls, Options};
use crate::params::{arg_list, params, take_args, typed_inputs};
use crate::returns::{returns, typed_refs};

/// `#[remote]`: the options in `attr`, the function in `item`.
pub(crate) fn expand(attr: Tokens, item: Tokens) -> Tokens {
    let options = match parse_options(attr, false) {
        Ok(o) => o,
        Err(e) => return e.to_compile_error(),
    };
    let func = match syn::parse2::<ItemFn>(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    expand_remote(options, func).unwrap_or_else(|e| e.to_compile_error())
}

fn expand_remote(options: Options, func: ItemFn) -> syn::Result<Tokens> {
    let sig = &func.sig;
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "remote functions cannot be generic: each is registered once, by name",
        ));
    }
    let vis = &func.vis;
    let fn_name = &sig.ident;
    let params = params(sig)?;
    let returns = returns(
        &sig.output,
        options.num_returns.as_ref(),
        sig.asyncness.is_some(),
    )?;
    let convert = &returns.convert;
    let takes = take_args(&params);
    let idents: Vec<_> = params.iter().map(|p| &p.ident).collect();
    let inputs = typed_inputs(&params);
    let args = arg_list(&params);
    let refs = &returns.refs;
    let check = &returns.check;
    let count = returns.count;
    let submit = typed_refs(
        &returns,
        if returns.streaming {
            quote! { ::prism::__private::submit_stream(NAME, options.or(self::options()), #args) }
        } else if count == 1 {
            quote! { ::prism::__private::submit_task(NAME, options.or(self::options()), #args) }
        } else {
            quote! { ::prism::__private::submit_task_n::<#count>(NAME, options.or(self::options()), #args) }
        },
    );
    let mut resources = resource_calls(&options);
    if let Some(n) = &options.max_retries {
        resources.extend(quote! { .max_retries((#n) as i64) });
    }
    if let Some(yes) = &options.retry_exceptions {
        resources.extend(quote! { .retry_exceptions(#yes) });
    }
    let name = match &options.name {
        Some(n) => quote! { #n },
        None => quote! { ::core::module_path!() },
    };
    let invocation = if sig.asyncness.is_some() {
        quote! {
            ::prism::__private::Invocation::Async(::std::boxed::Box::pin(async move {
                #takes
                let __prism_ret = super::#fn_name(#(#idents),*).await;
                #convert
            }))
        }
    } else {
        quote! {
            ::prism::__private::Invocation::Blocking(::std::boxed::Box::new(move || {
                #takes
                let __prism_ret = super::#fn_name(#(#idents),*);
                #convert
            }))
        }
    };
    let doc = format!("Remote calls of [`{fn_name}`](fn@{fn_name}).");
    Ok(quote! {
        #func

        #[doc = #doc]
        #[allow(non_snake_case, unused_imports, unused_mut, clippy::too_many_arguments)]
        #vis mod #fn_name {
            use super::*;

            /// The name this function is registered under.
            pub const NAME: &str = #name;

            /// The default options from the attribute.
            pub fn options() -> ::prism::TaskOptions {
                ::prism::TaskOptions::new() #resources
            }

            /// Submits a call; the result arrives in the returned `ObjectRef`
            /// (one per value with `num_returns`).
            pub fn remote(#inputs) -> ::prism::Result<#refs> {
                remote_with(options(), #(#idents),*)
            }

            /// Submits a call with the given options; what they leave
            /// unset comes from the attribute ([`options`]).
            pub fn remote_with(options: ::prism::TaskOptions, #inputs) -> ::prism::Result<#refs> {
                #check
                #submit
            }

            fn invoke(mut __prism_args: ::prism::__private::Args) -> ::prism::__private::Invocation {
                #invocation
            }

            #[::prism::__private::linkme::distributed_slice(::prism::__private::REMOTE_FUNCTIONS)]
            #[linkme(crate = ::prism::__private::linkme)]
            static REGISTRATION: ::prism::__private::RemoteFunction =
                ::prism::__private::RemoteFunction { name: NAME, invoke };
        }
    })
}
