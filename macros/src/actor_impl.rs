//! `#[actor]` on an `impl` block: the handle's methods, the functions
//! that start the actor, and the class registered for its workers.
//!
//! `expand_actor_impl` runs the steps in order: take the markers off the
//! methods (`take_markers`), check the block and name the class
//! (`class_name`), sort its functions into the constructor and the methods
//! called through the handle (`collect_methods`), then generate the handle
//! type's methods (`handle_impl`), the functions that start the actor
//! (`start_functions`) and the class's registration (`registration`, with
//! its dispatch table made of one `dispatch_arm` per method).

use std::collections::{HashMap, HashSet};

use proc_macro2::{Ident, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{FnArg, ImplItem, ItemImpl, Type};

use crate::options::{take_method_options, NumReturns};
use crate::params::{arg_list, params, take_args, typed_inputs, Param};
use crate::returns::{returns, typed_refs, Returns};
use crate::types::return_info;

enum Receiver {
    Ref,
    Mut,
}

/// Names of `ActorHandle`'s own methods: a remote method of the same name
/// would never be reached through the handle.
const HANDLE_OWN_METHODS: [&str; 3] = ["id", "actor_ref", "from_ref"];

/// Takes a `#[local]` marker off a method: whether it had one.
fn take_local_marker(f: &mut syn::ImplItemFn) -> bool {
    let before = f.attrs.len();
    f.attrs.retain(|a| !a.path().is_ident("local"));
    f.attrs.len() != before
}

/// What the markers on the block's methods said (the markers themselves
/// are taken off, so the block compiles as written).
struct Markers {
    /// Methods marked `#[local]`: they stay plain methods of the struct.
    local: HashSet<String>,
    /// `#[method(num_returns = ...)]`, by method name.
    num_returns: HashMap<String, NumReturns>,
}

/// The constructor: the associated function `new`.
struct Constructor {
    params: Vec<Param>,
    /// It returns a `Result`, whose `Err` fails the actor's creation.
    is_result: bool,
}

/// A method called through the handle (it takes `&self` or `&mut self`).
struct RemoteMethod {
    ident: Ident,
    receiver: Receiver,
    is_async: bool,
    params: Vec<Param>,
    returns: Returns,
}

pub(crate) fn expand_actor_impl(mut imp: ItemImpl) -> syn::Result<Tokens> {
    let markers = take_markers(&mut imp)?;
    let imp = imp;
    let self_ty = &imp.self_ty;
    let class = class_name(&imp)?;
    let handle = format_ident!("{}Handle", class);
    let (constructor, methods) = collect_methods(&imp, &markers)?;
    let Some(constructor) = constructor else {
        return Err(syn::Error::new(
            imp.span(),
            "an actor needs a constructor: an associated function `fn new(...) -> Self` in this impl block",
        ));
    };
    // Any async method makes it an async actor (see `ActorOptions::max_concurrency`).
    let async_methods = methods.iter().any(|m| m.is_async);
    let handle_impl = handle_impl(&handle, &methods);
    let start = start_functions(self_ty, &constructor, async_methods);
    let registration = registration(self_ty, class, &constructor, &methods);
    Ok(quote! {
        #imp

        #handle_impl

        #start

        #registration
    })
}

/// Takes the `#[local]` and `#[method(...)]` markers off the methods,
/// refusing `num_returns` on a method the handle does not call.
fn take_markers(imp: &mut ItemImpl) -> syn::Result<Markers> {
    // Methods marked `#[local]` stay plain methods of the struct.
    let mut local = HashSet::new();
    let mut num_returns = HashMap::new();
    for item in &mut imp.items {
        if let ImplItem::Fn(f) = item {
            if take_local_marker(f) {
                local.insert(f.sig.ident.to_string());
            }
            if let Some(n) = take_method_options(f)? {
                let remote = matches!(f.sig.inputs.first(), Some(FnArg::Receiver(r)) if r.reference.is_some());
                if !remote || local.contains(&f.sig.ident.to_string()) {
                    return Err(syn::Error::new(
                        n.span(),
                        "num_returns applies to methods called through the handle (taking \
                         &self or &mut self, not #[local]); remove it here",
                    ));
                }
                num_returns.insert(f.sig.ident.to_string(), n);
            }
        }
    }
    Ok(Markers { local, num_returns })
}

/// The actor's type name, once the block is known to be an inherent,
/// non-generic `impl` of a named type.
fn class_name(imp: &ItemImpl) -> syn::Result<&Ident> {
    let self_ty = &imp.self_ty;
    let Type::Path(tp) = &**self_ty else {
        return Err(syn::Error::new(
            self_ty.span(),
            "#[prism::actor] goes on `impl MyActor { ... }`",
        ));
    };
    let Some(last) = tp.path.segments.last() else {
        return Err(syn::Error::new(self_ty.span(), "expected a type name"));
    };
    if imp.trait_.is_some() || !imp.generics.params.is_empty() {
        return Err(syn::Error::new(
            imp.span(),
            "#[prism::actor] goes on an inherent, non-generic impl block",
        ));
    }
    Ok(&last.ident)
}

/// The constructor (if the block has one) and, in the block's order, the
/// methods called through the handle; other associated functions and
/// `#[local]` methods stay plain helpers.
fn collect_methods(
    imp: &ItemImpl,
    markers: &Markers,
) -> syn::Result<(Option<Constructor>, Vec<RemoteMethod>)> {
    let mut constructor = None;
    let mut methods = Vec::new();
    for item in &imp.items {
        let ImplItem::Fn(f) = item else { continue };
        let sig = &f.sig;
        if markers.local.contains(&sig.ident.to_string()) {
            continue;
        }
        let receiver = sig.inputs.first().and_then(|a| match a {
            FnArg::Receiver(r) if r.reference.is_some() => Some(if r.mutability.is_some() {
                Receiver::Mut
            } else {
                Receiver::Ref
            }),
            _ => None,
        });
        let Some(receiver) = receiver else {
            // Other associated functions stay plain helpers.
            if sig.ident == "new" {
                constructor = Some(Constructor {
                    params: params(sig)?,
                    is_result: return_info(&sig.output).1,
                });
            }
            continue;
        };
        let params = params(sig)?;
        let method = &sig.ident;
        let method_name = method.to_string();
        if HANDLE_OWN_METHODS.contains(&method_name.as_str()) {
            return Err(syn::Error::new(
                method.span(),
                format!(
                    "`{method_name}` is a method of every actor handle, so this one could not be \
                     called through it: rename it, or mark it #[local] to keep it a plain method"
                ),
            ));
        }
        let returns = returns(
            &sig.output,
            markers.num_returns.get(&method_name),
            sig.asyncness.is_some(),
        )?;
        methods.push(RemoteMethod {
            ident: method.clone(),
            receiver,
            is_async: sig.asyncness.is_some(),
            params,
            returns,
        });
    }
    Ok((constructor, methods))
}

/// The handle type's methods: for each method called through the handle,
/// one of the same name that submits the call to the actor and gives back
/// its refs.
fn handle_impl(handle: &Ident, methods: &[RemoteMethod]) -> Tokens {
    let handle_methods = methods.iter().map(|m| {
        let method = &m.ident;
        let method_name = method.to_string();
        let returns = &m.returns;
        let inputs = typed_inputs(&m.params);
        let args = arg_list(&m.params);
        let doc = format!("Calls `{method_name}` on the actor.");
        let refs = &returns.refs;
        let check = &returns.check;
        let count = returns.count;
        let call = typed_refs(
            returns,
            if returns.streaming {
                quote! { self.actor.call_stream(#method_name, #args) }
            } else if count == 1 {
                quote! { self.actor.call(#method_name, #args) }
            } else {
                quote! { self.actor.call_n::<#count>(#method_name, #args) }
            },
        );
        quote! {
            #[doc = #doc]
            #[allow(clippy::too_many_arguments)]
            pub fn #method(&self, #inputs) -> ::prism::Result<#refs> {
                #check
                #call
            }
        }
    });
    quote! {
        impl #handle {
            #(#handle_methods)*
        }
    }
}

/// The arm of the class's `dispatch` that runs `m` in the worker: it
/// takes the arguments, calls the method on the actor's state (blocking
/// or async, `&self` or `&mut self`) and stores what it returns.
fn dispatch_arm(self_ty: &Type, m: &RemoteMethod) -> Tokens {
    let method = &m.ident;
    let method_name = method.to_string();
    let convert = &m.returns.convert;
    let takes = take_args(&m.params);
    let idents: Vec<_> = m.params.iter().map(|p| &p.ident).collect();
    let arm = match (m.is_async, &m.receiver) {
        (false, Receiver::Ref) => quote! {
            ::prism::__private::call_ref::<#self_ty, _>(__prism_cell, move |this| {
                let mut __prism_args = __prism_args;
                #takes
                let __prism_ret = this.#method(#(#idents),*);
                #convert
            })
        },
        (false, Receiver::Mut) => quote! {
            ::prism::__private::call_mut::<#self_ty, _>(__prism_cell, move |this| {
                let mut __prism_args = __prism_args;
                #takes
                let __prism_ret = this.#method(#(#idents),*);
                #convert
            })
        },
        (true, Receiver::Ref) => quote! {
            ::prism::__private::Invocation::Async(::std::boxed::Box::pin(async move {
                #takes
                let guard = __prism_cell.read().await;
                let this = ::prism::__private::actor_ref::<#self_ty>(&**guard)?;
                let __prism_ret = this.#method(#(#idents),*).await;
                #convert
            }))
        },
        (true, Receiver::Mut) => quote! {
            ::prism::__private::Invocation::Async(::std::boxed::Box::pin(async move {
                #takes
                let mut guard = __prism_cell.write().await;
                let this = ::prism::__private::actor_mut::<#self_ty>(&mut **guard)?;
                let __prism_ret = this.#method(#(#idents),*).await;
                #convert
            }))
        },
    };
    quote! {
        #method_name => ::core::option::Option::Some(#arm),
    }
}

/// `Actor::remote(args...)` and `Actor::remote_with(options, args...)`,
/// which start the actor with the constructor's arguments.
fn start_functions(self_ty: &Type, ctor: &Constructor, async_methods: bool) -> Tokens {
    let ctor_idents: Vec<_> = ctor.params.iter().map(|p| &p.ident).collect();
    let ctor_inputs = typed_inputs(&ctor.params);
    let ctor_args = arg_list(&ctor.params);
    quote! {
        #[allow(clippy::too_many_arguments)]
        impl #self_ty {
            /// Starts the actor in its own worker process with the
            /// attribute's default options.
            pub fn remote(#ctor_inputs) -> ::prism::Result<::prism::ActorHandle<#self_ty>> {
                Self::remote_with(::prism::ActorOptions::new(), #(#ctor_idents),*)
            }

            /// Starts the actor with `options` (unset fields take the
            /// attribute's defaults).
            pub fn remote_with(options: ::prism::ActorOptions, #ctor_inputs) -> ::prism::Result<::prism::ActorHandle<#self_ty>> {
                let options = options.or(<#self_ty as ::prism::Actor>::default_options());
                ::prism::__private::create_actor::<#self_ty>(options, #async_methods, #ctor_args)
            }
        }
    }
}

/// The `ActorClass` registered in the binary's table of actor classes:
/// how a worker constructs the actor (taking the constructor's arguments
/// and calling `new`) and dispatches a call to a method.
fn registration(
    self_ty: &Type,
    class: &Ident,
    ctor: &Constructor,
    methods: &[RemoteMethod],
) -> Tokens {
    let ctor_takes = take_args(&ctor.params);
    let ctor_idents: Vec<_> = ctor.params.iter().map(|p| &p.ident).collect();
    // `new`'s `Err` fails the creation.
    let build = if ctor.is_result {
        quote! {
            match <#self_ty>::new(#(#ctor_idents),*) {
                ::core::result::Result::Ok(v) => ::core::result::Result::Ok(::std::boxed::Box::new(v)),
                ::core::result::Result::Err(e) => ::core::result::Result::Err(::prism::__private::app_error(e)),
            }
        }
    } else {
        quote! { ::core::result::Result::Ok(::std::boxed::Box::new(<#self_ty>::new(#(#ctor_idents),*))) }
    };
    let dispatch_arms = methods.iter().map(|m| dispatch_arm(self_ty, m));
    let registration = format_ident!("__PRISM_ACTOR_{}", class.to_string().to_uppercase());
    quote! {
        #[::prism::__private::linkme::distributed_slice(::prism::__private::ACTOR_CLASSES)]
        #[linkme(crate = ::prism::__private::linkme)]
        #[allow(non_upper_case_globals)]
        static #registration: ::prism::__private::ActorClass = {
            #[allow(unused_mut)]
            fn construct(
                mut __prism_args: ::prism::__private::Args,
            ) -> ::core::result::Result<::std::boxed::Box<dyn ::core::any::Any + Send + Sync>, ::prism::__private::CallError> {
                #ctor_takes
                #build
            }
            #[allow(unused_mut)]
            fn dispatch(
                __prism_cell: ::std::sync::Arc<::prism::__private::ActorCell>,
                method: &str,
                mut __prism_args: ::prism::__private::Args,
            ) -> ::core::option::Option<::prism::__private::Invocation> {
                match method {
                    #(#dispatch_arms)*
                    _ => ::core::option::Option::None,
                }
            }
            ::prism::__private::ActorClass {
                name: <#self_ty as ::prism::Actor>::CLASS,
                construct,
                dispatch,
                snapshot: <#self_ty as ::prism::Actor>::snapshot,
                restore: <#self_ty as ::prism::Actor>::restore,
            }
        };
    }
}
