//! The attributes of Prism: `#[remote]`, `#[actor]` and `#[main]`.
//!
//! Use them through the `prism` crate (`#[prism::remote]`, ...); they
//! expand to code that names `::prism`.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{
    parse_macro_input, FnArg, GenericArgument, ImplItem, ItemFn, ItemImpl, ItemStruct, LitStr, Pat,
    PathArguments, ReturnType, Signature, Type,
};

/// Options given on an attribute.
#[derive(Default)]
struct Options {
    name: Option<LitStr>,
    namespace: Option<LitStr>,
    max_concurrency: Option<syn::Expr>,
    max_restarts: Option<syn::Expr>,
    max_task_retries: Option<syn::Expr>,
    /// Tasks only.
    max_retries: Option<syn::Expr>,
    retry_exceptions: Option<syn::Expr>,
    checkpoint: bool,
    num_cpus: Option<syn::Expr>,
    num_gpus: Option<syn::Expr>,
    resources: Vec<(LitStr, syn::Expr)>,
    /// Tasks only (methods take `#[method(num_returns = N)]`).
    num_returns: Option<NumReturns>,
}

/// `num_returns = N`, or Ray's `num_returns = "streaming"`.
enum NumReturns {
    Count(syn::LitInt),
    Streaming(Span),
}

impl NumReturns {
    fn span(&self) -> Span {
        match self {
            NumReturns::Count(n) => n.span(),
            NumReturns::Streaming(span) => *span,
        }
    }
}

impl syn::parse::Parse for NumReturns {
    fn parse(input: syn::parse::ParseStream) -> syn::Result<Self> {
        if input.peek(LitStr) {
            let s: LitStr = input.parse()?;
            if s.value() == "streaming" {
                return Ok(NumReturns::Streaming(s.span()));
            }
            return Err(syn::Error::new(
                s.span(),
                "num_returns takes a count (num_returns = 2) or \"streaming\"",
            ));
        }
        Ok(NumReturns::Count(input.parse()?))
    }
}

fn parse_options(attr: TokenStream, allow_actor: bool) -> syn::Result<Options> {
    let mut o = Options::default();
    let parser = syn::meta::parser(|meta| {
        let key = meta
            .path
            .get_ident()
            .map(|i| i.to_string())
            .unwrap_or_default();
        match key.as_str() {
            "name" => o.name = Some(meta.value()?.parse()?),
            "num_cpus" => o.num_cpus = Some(meta.value()?.parse()?),
            "num_gpus" => o.num_gpus = Some(meta.value()?.parse()?),
            "namespace" if allow_actor => o.namespace = Some(meta.value()?.parse()?),
            "max_concurrency" if allow_actor => o.max_concurrency = Some(meta.value()?.parse()?),
            "checkpoint" if allow_actor => o.checkpoint = true,
            "max_restarts" if allow_actor => o.max_restarts = Some(meta.value()?.parse()?),
            "max_task_retries" if allow_actor => o.max_task_retries = Some(meta.value()?.parse()?),
            "max_retries" if !allow_actor => o.max_retries = Some(meta.value()?.parse()?),
            "retry_exceptions" if !allow_actor => o.retry_exceptions = Some(meta.value()?.parse()?),
            "num_returns" if !allow_actor => o.num_returns = Some(meta.value()?.parse()?),
            "resource" => {
                let content;
                syn::parenthesized!(content in meta.input);
                let name: LitStr = content.parse()?;
                content.parse::<syn::Token![,]>()?;
                let amount: syn::Expr = content.parse()?;
                o.resources.push((name, amount));
            }
            _ => {
                let known = if allow_actor {
                    "name, namespace, max_concurrency, max_restarts, max_task_retries, checkpoint, num_cpus, num_gpus, resource(\"name\", amount)"
                } else {
                    "name, num_cpus, num_gpus, resource(\"name\", amount), max_retries, retry_exceptions, num_returns"
                };
                return Err(meta.error(format!("unknown option; expected one of: {known}")));
            }
        }
        Ok(())
    });
    parser.parse(attr)?;
    Ok(o)
}

/// A parameter: its generated name and its type.
struct Param {
    ident: syn::Ident,
    ty: Type,
}

/// The first borrowed type (`&T`, `&str`, ...) inside `ty`, however deep
/// (`Vec<&str>`, `(u8, &[u8])`): a value holding one cannot be decoded in
/// another process, which owns nothing it could point into.
fn borrowed_part(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Reference(_) => Some(ty),
        Type::Paren(t) => borrowed_part(&t.elem),
        Type::Group(t) => borrowed_part(&t.elem),
        Type::Array(t) => borrowed_part(&t.elem),
        Type::Slice(t) => borrowed_part(&t.elem),
        Type::Tuple(t) => t.elems.iter().find_map(borrowed_part),
        Type::Path(t) => {
            let qself = t.qself.as_ref().and_then(|q| borrowed_part(&q.ty));
            qself.or_else(|| {
                t.path.segments.iter().find_map(|seg| match &seg.arguments {
                    PathArguments::AngleBracketed(args) => args.args.iter().find_map(|a| match a {
                        GenericArgument::Type(t) => borrowed_part(t),
                        _ => None,
                    }),
                    _ => None,
                })
            })
        }
        _ => None,
    }
}

fn params(sig: &Signature) -> syn::Result<Vec<Param>> {
    let mut out = Vec::new();
    for (i, input) in sig.inputs.iter().enumerate() {
        if let FnArg::Typed(pt) = input {
            if let Some(borrowed) = borrowed_part(&pt.ty) {
                return Err(syn::Error::new(
                    borrowed.span(),
                    "parameters of remote functions and actor methods must be owned types (use String, Vec<T>, ... or prism::View<T>)",
                ));
            }
            if let Type::ImplTrait(_) = &*pt.ty {
                return Err(syn::Error::new(
                    pt.ty.span(),
                    "`impl Trait` parameters cannot be sent to another process",
                ));
            }
            let _ = matches!(&*pt.pat, Pat::Ident(_));
            out.push(Param {
                ident: format_ident!("__prism_arg{}", i),
                ty: (*pt.ty).clone(),
            });
        }
    }
    Ok(out)
}

/// The value type of the `ObjectRef` a call returns, and whether the
/// function returns a `Result` whose `Err` is a task failure.
fn return_info(output: &ReturnType) -> (Type, bool) {
    match output {
        ReturnType::Default => (syn::parse_quote!(()), false),
        ReturnType::Type(_, ty) => {
            if let Type::Path(tp) = &**ty {
                if let Some(last) = tp.path.segments.last() {
                    if last.ident == "Result" {
                        if let PathArguments::AngleBracketed(args) = &last.arguments {
                            if let Some(GenericArgument::Type(ok)) = args.args.first() {
                                return (ok.clone(), true);
                            }
                        }
                    }
                }
            }
            ((**ty).clone(), false)
        }
    }
}

fn convert_return(is_result: bool) -> Tokens {
    if is_result {
        quote! {
            match __prism_ret {
                ::core::result::Result::Ok(v) => ::prism::__private::encode_return(v),
                ::core::result::Result::Err(e) => ::core::result::Result::Err(::prism::__private::app_error(e)),
            }
        }
    } else {
        quote! { ::prism::__private::encode_return(__prism_ret) }
    }
}

/// What a call gives back: one value, `num_returns` values (a tuple of
/// that many, each stored as its own object), or a stream of values.
struct Returns {
    /// The type inside the `Result` that `remote` or a handle method
    /// returns: `ObjectRef<T>`, a tuple of `ObjectRef`s, or an
    /// `ObjectRefGenerator<T>`.
    refs: Tokens,
    /// How many values (1 for a stream: its count).
    count: usize,
    /// `num_returns = "streaming"`.
    streaming: bool,
    /// Turns `__prism_ret` into a `CallResult`.
    convert: Tokens,
    /// Compile-time checks for the caller's side.
    check: Tokens,
}

/// The item type `Item = T` named by an `impl Iterator<...>` or a
/// `dyn Iterator<...>` (boxed or not).
fn iterator_item(ty: &Type) -> Option<Type> {
    let bounds = match ty {
        Type::ImplTrait(t) => &t.bounds,
        Type::TraitObject(t) => &t.bounds,
        Type::Paren(t) => return iterator_item(&t.elem),
        Type::Group(t) => return iterator_item(&t.elem),
        Type::Path(p) => {
            let last = p.path.segments.last()?;
            if last.ident != "Box" {
                return None;
            }
            return match &last.arguments {
                PathArguments::AngleBracketed(args) => match args.args.first()? {
                    GenericArgument::Type(inner) => iterator_item(inner),
                    _ => None,
                },
                _ => None,
            };
        }
        _ => return None,
    };
    bounds.iter().find_map(|b| {
        let syn::TypeParamBound::Trait(t) = b else {
            return None;
        };
        let last = t.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        args.args.iter().find_map(|a| match a {
            GenericArgument::AssocType(assoc) if assoc.ident == "Item" => Some(assoc.ty.clone()),
            _ => None,
        })
    })
}

/// `Result<T, E>` written out: `T`.
fn result_ok(ty: &Type) -> Option<Type> {
    let Type::Path(tp) = ty else {
        return None;
    };
    let last = tp.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    match &last.arguments {
        PathArguments::AngleBracketed(args) => match args.args.first()? {
            GenericArgument::Type(ok) => Some(ok.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// A streaming call: the function returns an iterator (or a `Result` of
/// one); each item is stored as its own object as it is made. An item
/// written as `Result<T, E>` ends the call with its `Err`.
fn streaming_returns(ret_ty: &Type, is_result: bool) -> syn::Result<Returns> {
    let item = match iterator_item(ret_ty) {
        Some(item) => item,
        None if matches!(ret_ty, Type::ImplTrait(_) | Type::TraitObject(_)) => {
            return Err(syn::Error::new(
                ret_ty.span(),
                "num_returns = \"streaming\" needs the item type named here: \
                 `impl Iterator<Item = T>`",
            ))
        }
        // A named type (`Vec<T>`, an iterator struct): its items.
        None => syn::parse_quote!(<#ret_ty as ::core::iter::IntoIterator>::Item),
    };
    if let Some(borrowed) = borrowed_part(&item) {
        return Err(syn::Error::new(
            borrowed.span(),
            "the values of a streaming function must be owned types \
             (use String rather than &str): the caller reads them in another process",
        ));
    }
    if let Type::ImplTrait(_) = &item {
        return Err(syn::Error::new(
            item.span(),
            "the values of a streaming function need a concrete type, which the \
             ObjectRefGenerator names: `impl Iterator<Item = T>`",
        ));
    }
    let (value, each) = match result_ok(&item) {
        Some(ok) => (
            ok,
            quote! {
                match __prism_item {
                    ::core::result::Result::Ok(v) => ::prism::__private::encode_return(v),
                    ::core::result::Result::Err(e) => ::core::result::Result::Err(::prism::__private::app_error(e)),
                }
            },
        ),
        None => (
            item,
            quote! { ::prism::__private::encode_return(__prism_item) },
        ),
    };
    let stream = quote! {
        ::prism::__private::stream_items(
            ::core::iter::IntoIterator::into_iter(__prism_iter).map(|__prism_item| #each)
        )
    };
    let convert = if is_result {
        quote! {
            match __prism_ret {
                ::core::result::Result::Ok(__prism_iter) => #stream,
                ::core::result::Result::Err(e) => ::core::result::Result::Err(::prism::__private::app_error(e)),
            }
        }
    } else {
        quote! {{
            let __prism_iter = __prism_ret;
            #stream
        }}
    };
    // A named iterator type may yield borrowed values (`slice::Iter`):
    // refused where the function is defined, not at the caller's `get`.
    let check = quote::quote_spanned! {ret_ty.span()=>
        ::prism::__private::stream_value::<#value>();
    };
    Ok(Returns {
        refs: quote! { ::prism::ObjectRefGenerator<#value> },
        count: 1,
        streaming: true,
        convert,
        check,
    })
}

fn returns(
    output: &ReturnType,
    num_returns: Option<&NumReturns>,
    is_async: bool,
) -> syn::Result<Returns> {
    let (ret_ty, is_result) = return_info(output);
    let num_returns = match num_returns {
        Some(NumReturns::Streaming(span)) => {
            if is_async {
                return Err(syn::Error::new(
                    *span,
                    "num_returns = \"streaming\" takes a synchronous function returning an \
                     iterator; an async one is not supported yet",
                ));
            }
            return streaming_returns(&ret_ty, is_result);
        }
        Some(NumReturns::Count(n)) => Some(n),
        None => None,
    };
    if let Some(borrowed) = borrowed_part(&ret_ty) {
        return Err(syn::Error::new(
            borrowed.span(),
            "results of remote functions and actor methods must be owned types \
             (use String rather than &str, Vec<T> rather than &[T]): the caller reads \
             them in another process",
        ));
    }
    if let Type::ImplTrait(_) = &ret_ty {
        return Err(syn::Error::new(
            ret_ty.span(),
            "`impl Trait` results cannot be named by the ObjectRef a call returns: \
             return a concrete type",
        ));
    }
    let count = match num_returns {
        Some(n) => n.base10_parse::<usize>()?,
        None => 1,
    };
    if count == 1 {
        return Ok(Returns {
            refs: quote! { ::prism::ObjectRef<#ret_ty> },
            count,
            streaming: false,
            convert: convert_return(is_result),
            check: Tokens::new(),
        });
    }
    let span = num_returns.map_or_else(Span::call_site, |n| n.span());
    if count == 0 {
        return Err(syn::Error::new(
            span,
            "num_returns must be at least 1 (a call with no result returns `()`)",
        ));
    }
    let elems: Vec<Type> = match &ret_ty {
        Type::Tuple(t) if t.elems.len() == count => t.elems.iter().cloned().collect(),
        _ => {
            let example = (0..count)
                .map(|i| format!("T{i}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(syn::Error::new(
                ret_ty.span(),
                format!(
                    "num_returns = {count} needs a tuple of {count} values here, as \
                     `({example})` (or `Result<({example}), E>`): each is stored as its own object"
                ),
            ));
        }
    };
    let vars: Vec<_> = (0..count)
        .map(|i| format_ident!("__prism_r{}", i))
        .collect();
    let encode = quote! {
        ::prism::__private::encode_returns(::std::vec![
            #(::prism::__private::encode_return(#vars)),*
        ])
    };
    let convert = if is_result {
        quote! {
            match __prism_ret {
                ::core::result::Result::Ok((#(#vars),*)) => #encode,
                ::core::result::Result::Err(e) => ::core::result::Result::Err(::prism::__private::app_error(e)),
            }
        }
    } else {
        quote! {{
            let (#(#vars),*) = __prism_ret;
            #encode
        }}
    };
    Ok(Returns {
        refs: quote! { (#(::prism::ObjectRef<#elems>),*) },
        count,
        streaming: false,
        convert,
        check: Tokens::new(),
    })
}

/// Makes the refs a call returns from `submitted`, an expression giving
/// `Result<[ObjectRef<()>; count]>` (several values) or the ref itself.
fn typed_refs(r: &Returns, submitted: Tokens) -> Tokens {
    if r.count == 1 {
        return submitted;
    }
    let vars: Vec<_> = (0..r.count)
        .map(|i| format_ident!("__prism_r{}", i))
        .collect();
    quote! {{
        let [#(#vars),*] = #submitted?;
        ::core::result::Result::Ok((#(::prism::__private::retype(#vars)),*))
    }}
}

fn take_args(params: &[Param]) -> Tokens {
    let takes = params.iter().enumerate().map(|(i, p)| {
        let (ident, ty) = (&p.ident, &p.ty);
        quote! { let #ident: #ty = __prism_args.take(#i)?; }
    });
    quote! { #(#takes)* }
}

fn typed_inputs(params: &[Param]) -> Tokens {
    let inputs = params.iter().map(|p| {
        let (ident, ty) = (&p.ident, &p.ty);
        quote! { #ident: impl ::prism::IntoArg<#ty> }
    });
    quote! { #(#inputs),* }
}

fn arg_list(params: &[Param]) -> Tokens {
    let args = params.iter().map(|p| {
        let (ident, ty) = (&p.ident, &p.ty);
        quote! { ::prism::IntoArg::<#ty>::into_arg(#ident) }
    });
    quote! { ::std::vec![#(#args),*] }
}

fn resource_calls(o: &Options) -> Tokens {
    let mut calls = Vec::new();
    if let Some(n) = &o.num_cpus {
        calls.push(quote! { .num_cpus((#n) as f64) });
    }
    if let Some(n) = &o.num_gpus {
        calls.push(quote! { .num_gpus((#n) as f64) });
    }
    for (name, amount) in &o.resources {
        calls.push(quote! { .resource(#name, (#amount) as f64) });
    }
    quote! { #(#calls)* }
}

/// Makes a function callable as a task: `name::remote(args...)`.
///
/// Options: `name = "stable.name"`, `num_cpus = 2`, `num_gpus = 0.5`,
/// `resource("custom", 1.0)` (repeatable), `max_retries = 5` (-1: no
/// limit), `retry_exceptions = true` (as `TaskOptions`' methods of the
/// same names), and `num_returns = N`: the function returns an `N`-tuple
/// (or a `Result` of one), each value is stored as its own object, and
/// `remote` returns a tuple of `N` `ObjectRef`s. `num_returns =
/// "streaming"` takes a synchronous function returning an iterator
/// (`impl Iterator<Item = T>`, `Box<dyn Iterator<Item = T> + Send>`, a
/// named type such as `Vec<T>`, or a `Result` of one): each item is
/// stored as its own object as it is made, and `remote` returns a
/// `prism::ObjectRefGenerator<T>`. An item written as `Result<T, E>` ends
/// the stream with its `Err`.
#[proc_macro_attribute]
pub fn remote(attr: TokenStream, item: TokenStream) -> TokenStream {
    let options = match parse_options(attr, false) {
        Ok(o) => o,
        Err(e) => return e.to_compile_error().into(),
    };
    let func = parse_macro_input!(item as ItemFn);
    expand_remote(options, func)
        .unwrap_or_else(|e| e.to_compile_error())
        .into()
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

/// Makes a struct an actor class (on the struct) and its methods remote
/// (on its `impl` block).
///
/// On the struct, options set creation defaults: `name = "..."`,
/// `namespace = "..."`, `max_concurrency = 4`, `max_restarts = 3`,
/// `max_task_retries = 1`, `checkpoint` (its state can be checkpointed: the
/// struct must derive `Serialize` and `Deserialize`), `num_cpus = 1`,
/// `num_gpus = 1`, `resource("custom", 1.0)`. On the `impl` block, the
/// associated function `new` is the constructor, and every method taking
/// `&self` or `&mut self` can be called remotely through the handle. A
/// method marked `#[local]` stays a plain method (for helpers that take
/// borrowed arguments, say), and other associated functions are left as
/// they are. A method marked `#[method(num_returns = N)]` returns an
/// `N`-tuple whose values are stored as objects of their own: its handle
/// method returns a tuple of `N` `ObjectRef`s. A synchronous method marked
/// `#[method(num_returns = "streaming")]` returns an iterator (which may
/// borrow the actor) whose items are stored one by one as they are made:
/// its handle method returns a `prism::ObjectRefGenerator<T>`.
///
/// ```ignore
/// #[prism::actor]
/// impl Stats {
///     fn new() -> Self { Stats { seen: Vec::new() } }
///     fn add(&mut self, x: f64) -> f64 { self.seen.push(x); self.mean(&self.seen) }
///     #[local]
///     fn mean(&self, xs: &[f64]) -> f64 { xs.iter().sum::<f64>() / xs.len() as f64 }
/// }
/// ```
#[proc_macro_attribute]
pub fn actor(attr: TokenStream, item: TokenStream) -> TokenStream {
    let options = match parse_options(attr, true) {
        Ok(o) => o,
        Err(e) => return e.to_compile_error().into(),
    };
    let cloned = item.clone();
    if let Ok(s) = syn::parse::<ItemStruct>(cloned) {
        return expand_actor_struct(options, s).into();
    }
    let imp = parse_macro_input!(item as ItemImpl);
    expand_actor_impl(imp)
        .unwrap_or_else(|e| e.to_compile_error())
        .into()
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

enum Receiver {
    Ref,
    Mut,
}

/// Names of `ActorHandle`'s own methods: a remote method of the same name
/// would never be reached through the handle.
const HANDLE_OWN_METHODS: [&str; 3] = ["id", "actor_ref", "from_ref"];

/// Takes a `#[method(num_returns = N)]` marker off a method: its
/// `num_returns`, if it had one.
fn take_method_options(f: &mut syn::ImplItemFn) -> syn::Result<Option<NumReturns>> {
    let mut num_returns = None;
    let mut error = None;
    f.attrs.retain(|a| {
        if !a.path().is_ident("method") {
            return true;
        }
        let parsed = a.parse_nested_meta(|meta| {
            if meta.path.is_ident("num_returns") {
                num_returns = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error(
                    "unknown method option; expected: num_returns = N or num_returns = \"streaming\"",
                ))
            }
        });
        if let Err(e) = parsed {
            error = Some(e);
        }
        false
    });
    match error {
        Some(e) => Err(e),
        None => Ok(num_returns),
    }
}

/// Takes a `#[local]` marker off a method: whether it had one.
fn take_local_marker(f: &mut syn::ImplItemFn) -> bool {
    let before = f.attrs.len();
    f.attrs.retain(|a| !a.path().is_ident("local"));
    f.attrs.len() != before
}

fn expand_actor_impl(mut imp: ItemImpl) -> syn::Result<Tokens> {
    // Methods marked `#[local]` stay plain methods of the struct.
    let mut local = std::collections::HashSet::new();
    let mut num_returns = std::collections::HashMap::new();
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
    let imp = imp;
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
    let handle = format_ident!("{}Handle", last.ident);
    let mut constructor = None;
    // Any async method makes it an async actor (see `ActorOptions::max_concurrency`).
    let mut async_methods = false;
    let mut handle_methods = Vec::new();
    let mut dispatch_arms = Vec::new();
    for item in &imp.items {
        let ImplItem::Fn(f) = item else { continue };
        let sig = &f.sig;
        if local.contains(&sig.ident.to_string()) {
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
                constructor = Some((params(sig)?, return_info(&sig.output).1));
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
            num_returns.get(&method_name),
            sig.asyncness.is_some(),
        )?;
        let convert = &returns.convert;
        let takes = take_args(&params);
        let idents: Vec<_> = params.iter().map(|p| &p.ident).collect();
        let inputs = typed_inputs(&params);
        let args = arg_list(&params);
        let doc = format!("Calls `{method_name}` on the actor.");
        let refs = &returns.refs;
        let check = &returns.check;
        let count = returns.count;
        let call = typed_refs(
            &returns,
            if returns.streaming {
                quote! { self.actor.call_stream(#method_name, #args) }
            } else if count == 1 {
                quote! { self.actor.call(#method_name, #args) }
            } else {
                quote! { self.actor.call_n::<#count>(#method_name, #args) }
            },
        );
        handle_methods.push(quote! {
            #[doc = #doc]
            #[allow(clippy::too_many_arguments)]
            pub fn #method(&self, #inputs) -> ::prism::Result<#refs> {
                #check
                #call
            }
        });
        async_methods |= sig.asyncness.is_some();
        let arm = match (sig.asyncness.is_some(), receiver) {
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
        dispatch_arms.push(quote! {
            #method_name => ::core::option::Option::Some(#arm),
        });
    }
    let Some((ctor_params, ctor_is_result)) = constructor else {
        return Err(syn::Error::new(
            imp.span(),
            "an actor needs a constructor: an associated function `fn new(...) -> Self` in this impl block",
        ));
    };
    let ctor_takes = take_args(&ctor_params);
    let ctor_idents: Vec<_> = ctor_params.iter().map(|p| &p.ident).collect();
    let ctor_inputs = typed_inputs(&ctor_params);
    let ctor_args = arg_list(&ctor_params);
    let build = if ctor_is_result {
        quote! {
            match <#self_ty>::new(#(#ctor_idents),*) {
                ::core::result::Result::Ok(v) => ::core::result::Result::Ok(::std::boxed::Box::new(v)),
                ::core::result::Result::Err(e) => ::core::result::Result::Err(::prism::__private::app_error(e)),
            }
        }
    } else {
        quote! { ::core::result::Result::Ok(::std::boxed::Box::new(<#self_ty>::new(#(#ctor_idents),*))) }
    };
    let registration = format_ident!("__PRISM_ACTOR_{}", last.ident.to_string().to_uppercase());
    let _ = Span::call_site();
    Ok(quote! {
        #imp

        impl #handle {
            #(#handle_methods)*
        }

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
    })
}

/// Wraps `main`: the process serves as a worker when started as one, and
/// the cluster is shut down when `main` returns.
#[proc_macro_attribute]
pub fn main(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(Span::call_site(), "#[prism::main] takes no options")
            .to_compile_error()
            .into();
    }
    let func = parse_macro_input!(item as ItemFn);
    if func.sig.asyncness.is_some() {
        return syn::Error::new(func.sig.span(), "#[prism::main] goes on a synchronous `fn main`; inside, use prism's async API from your own runtime")
            .to_compile_error()
            .into();
    }
    let attrs = &func.attrs;
    let vis = &func.vis;
    let output = &func.sig.output;
    let body = &func.block;
    quote! {
        #(#attrs)*
        #vis fn main() #output {
            ::prism::__private::enter_worker_mode_if_requested();
            fn __prism_user_main() #output #body
            let result = __prism_user_main();
            ::prism::shutdown();
            result
        }
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn returns_of(output: ReturnType, n: &str) -> syn::Result<Returns> {
        let n: NumReturns = syn::parse_str(n).expect("a count");
        returns(&output, Some(&n), false)
    }

    fn error(result: syn::Result<Returns>) -> String {
        match result {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn num_returns_takes_a_tuple_of_that_many_values_or_a_result_of_one() {
        let two = returns_of(syn::parse_quote!(-> (i64, String)), "2").expect("a pair");
        assert_eq!(two.count, 2);
        let refs = two.refs.to_string();
        assert!(refs.contains("ObjectRef < i64 >") && refs.contains("ObjectRef < String >"));
        let result = returns_of(syn::parse_quote!(-> Result<(u8, u8, u8), String>), "3");
        assert_eq!(result.expect("a result of a triple").count, 3);
        let one = returns_of(syn::parse_quote!(-> (i64, String)), "1").expect("one value");
        assert_eq!(one.count, 1, "num_returns = 1 keeps the tuple as one value");
    }

    #[test]
    fn num_returns_that_does_not_match_the_return_type_says_what_to_write() {
        let said = error(returns_of(syn::parse_quote!(-> i64), "2"));
        assert!(
            said.contains("tuple of 2 values") && said.contains("(T0, T1)"),
            "{said}"
        );
        assert!(!said.contains("  "), "one line, single spaces: {said}");
        let said = error(returns_of(syn::parse_quote!(-> (i64, i64, i64)), "2"));
        assert!(said.contains("tuple of 2 values"), "{said}");
        let said = error(returns_of(syn::parse_quote!(-> (i64, i64)), "0"));
        assert!(said.contains("at least 1"), "{said}");
    }

    fn plain(output: ReturnType) -> syn::Result<Returns> {
        returns(&output, None, false)
    }

    #[test]
    fn borrowed_results_are_refused_however_deep_and_owned_ones_pass() {
        for output in [
            syn::parse_quote!(-> &'static str),
            syn::parse_quote!(-> Vec<&'static str>),
            syn::parse_quote!(-> Result<Option<(u8, &'static [u8])>, String>),
            syn::parse_quote!(-> [&'static str; 2]),
        ] {
            let said = error(plain(output));
            assert!(said.contains("must be owned types"), "{said}");
            assert!(!said.contains("  "), "one line, single spaces: {said}");
        }
        let said = error(returns_of(
            syn::parse_quote!(-> (String, &'static str)),
            "2",
        ));
        assert!(said.contains("must be owned types"), "{said}");
        let said = error(plain(syn::parse_quote!(-> impl Clone)));
        assert!(said.contains("concrete type"), "{said}");
        for output in [
            syn::parse_quote!(-> String),
            syn::parse_quote!(-> std::borrow::Cow<'static, str>),
            syn::parse_quote!(-> Result<Vec<(u8, String)>, &'static str>),
        ] {
            assert!(plain(output).is_ok());
        }
    }

    fn streaming(output: ReturnType, is_async: bool) -> syn::Result<Returns> {
        let n: NumReturns = syn::parse_str("\"streaming\"").expect("streaming");
        returns(&output, Some(&n), is_async)
    }

    #[test]
    fn a_streaming_function_gives_a_generator_of_its_items() {
        for (output, item) in [
            (syn::parse_quote!(-> impl Iterator<Item = u64>), "u64"),
            (
                syn::parse_quote!(-> impl Iterator<Item = u64> + Send + '_),
                "u64",
            ),
            (
                syn::parse_quote!(-> Result<impl IntoIterator<Item = Vec<u8>>, String>),
                "Vec < u8 >",
            ),
            (
                syn::parse_quote!(-> Box<dyn Iterator<Item = Result<u8, String>> + Send>),
                "u8",
            ),
            (
                syn::parse_quote!(-> Vec<String>),
                "< Vec < String > as :: core :: iter :: IntoIterator > :: Item",
            ),
        ] {
            let r = streaming(output, false).expect("a stream");
            assert!(r.streaming);
            assert_eq!(
                r.refs.to_string(),
                format!(":: prism :: ObjectRefGenerator < {item} >")
            );
        }
        let said = error(streaming(syn::parse_quote!(-> impl Iterator), false));
        assert!(said.contains("Item = T"), "{said}");
        let said = error(streaming(
            syn::parse_quote!(-> impl Iterator<Item = &'static str>),
            false,
        ));
        assert!(said.contains("must be owned types"), "{said}");
        let said = error(streaming(
            syn::parse_quote!(-> impl Iterator<Item = u8>),
            true,
        ));
        assert!(said.contains("synchronous"), "{said}");
        assert!(!said.contains("  "), "one line, single spaces: {said}");
        let said = match syn::parse_str::<NumReturns>("\"lots\"") {
            Ok(_) => panic!("\"lots\" is no num_returns"),
            Err(e) => e.to_string(),
        };
        assert!(said.contains("\"streaming\""), "{said}");
    }

    #[test]
    fn borrowed_parameters_are_refused_however_deep() {
        let sig: Signature = syn::parse_quote!(fn f(a: u8, b: Vec<&'static str>));
        match params(&sig) {
            Ok(_) => panic!("a Vec<&str> parameter passed"),
            Err(e) => assert!(e.to_string().contains("must be owned types"), "{e}"),
        }
        let sig: Signature = syn::parse_quote!(fn f(a: u8, b: Option<Vec<String>>));
        assert_eq!(params(&sig).expect("owned parameters").len(), 2);
    }
}
