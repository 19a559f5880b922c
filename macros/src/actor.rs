//! `#[actor]` on a struct: its handle type and its `prism::Actor` impl
//! with the creation defaults from the attribute's options. On an `impl`
//! block, see [`crate::actor_impl`].

use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::{ItemImpl, ItemStruct};

use crate::actor_impl::expand_actor_impl;
use crate::options::{parse_options, resource_calls, Options};

/// `#[actor]`: the options in `attr`, the struct or `impl` block in `item`.
pub(crate) fn expand(attr: Tokens, item: Tokens) -> Tokens {
    let options = match parse_options(attr, true) {
        Ok(o) => o,
        Err(e) => return e.to_compile_error(),
    };
    let cloned = item.clone();
    if let Ok(s) = syn::parse2::<ItemStruct>(cloned) {
        return expand_actor_struct(options, s);
    }
    let imp = match syn::parse2::<ItemImpl>(item) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    expand_actor_impl(imp).unwrap_or_else(|e| e.to_compile_error())
}

fn expand_actor_struct(o: Options, s: ItemStruct) -> Tokens {
    let ident = &s.ident;
    let vis = &s.vis;
    let handle = format_ident!("{}Handle", ident);
    let mut calls = vec![resource_calls(&o)];
    if let Some(n) = &o.name {
        calls.push(quote! { .name(#n) });
    }
    if let Some(n) = &o.namespace {
        calls.push(quote! { .namespace(#n) });
    }
    if let Some(n) = &o.max_concurrency {
        calls.push(quote! { .max_concurrency(#n) });
    }
    if let Some(n) = &o.max_restarts {
        calls.push(quote! { .max_restarts(#n) });
    }
    if let Some(n) = &o.max_task_retries {
        calls.push(quote! { .max_task_retries(#n) });
    }
    let class = ident.to_string();
    let doc = format!("A handle on a remote [`{ident}`] actor; its methods call the actor.");
    let checkpoint = if o.checkpoint {
        quote! {
            const CHECKPOINTABLE: bool = true;
            fn snapshot(
                state: &(dyn ::core::any::Any + ::core::marker::Send + ::core::marker::Sync),
            ) -> ::core::option::Option<::core::result::Result<::std::vec::Vec<u8>, ::std::string::String>> {
                ::core::option::Option::Some(::prism::__private::encode_state::<Self>(state))
            }
            fn restore(
                bytes: &[u8],
            ) -> ::core::option::Option<::core::result::Result<
                ::std::boxed::Box<dyn ::core::any::Any + ::core::marker::Send + ::core::marker::Sync>,
                ::std::string::String,
            >> {
                ::core::option::Option::Some(::prism::__private::decode_state::<Self>(bytes))
            }
        }
    } else {
        quote! {}
    };
    quote! {
        #s

        #[doc = #doc]
        #[derive(Clone)]
        #vis struct #handle {
            actor: ::prism::ActorRef,
        }

        impl ::core::convert::From<::prism::ActorRef> for #handle {
            fn from(actor: ::prism::ActorRef) -> Self {
                #handle { actor }
            }
        }

        impl ::core::fmt::Debug for #handle {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                ::core::write!(f, "{}({})", #class, self.actor.id())
            }
        }

        impl ::prism::Actor for #ident {
            const CLASS: &'static str = ::core::concat!(::core::module_path!(), "::", #class);
            type Handle = #handle;
            fn default_options() -> ::prism::ActorOptions {
                ::prism::ActorOptions::new() #(#calls)*
            }
            #checkpoint
        }
    }
}
