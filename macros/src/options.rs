//! The arguments of the attributes: `#[remote(...)]` and `#[actor(...)]`
//! options, and the `#[method(...)]` marker of an actor's methods.

use proc_macro2::{Span, TokenStream as Tokens};
use quote::quote;
use syn::parse::Parser;
use syn::LitStr;

/// Options given on an attribute.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) name: Option<LitStr>,
    pub(crate) namespace: Option<LitStr>,
    pub(crate) max_concurrency: Option<syn::Expr>,
    pub(crate) max_restarts: Option<syn::Expr>,
    pub(crate) max_task_retries: Option<syn::Expr>,
    /// Tasks only.
    pub(crate) max_retries: Option<syn::Expr>,
    pub(crate) retry_exceptions: Option<syn::Expr>,
    pub(crate) checkpoint: bool,
    pub(crate) num_cpus: Option<syn::Expr>,
    pub(crate) num_gpus: Option<syn::Expr>,
    pub(crate) resources: Vec<(LitStr, syn::Expr)>,
    /// Tasks only (methods take `#[method(num_returns = N)]`).
    pub(crate) num_returns: Option<NumReturns>,
}

/// `num_returns = N`, or Ray's `num_returns = "streaming"`.
pub(crate) enum NumReturns {
    Count(syn::LitInt),
    Streaming(Span),
}

impl NumReturns {
    pub(crate) fn span(&self) -> Span {
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

pub(crate) fn parse_options(attr: Tokens, allow_actor: bool) -> syn::Result<Options> {
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
    parser.parse2(attr)?;
    Ok(o)
}

pub(crate) fn resource_calls(o: &Options) -> Tokens {
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

/// Takes a `#[method(num_returns = N)]` marker off a method: its
/// `num_returns`, if it had one.
pub(crate) fn take_method_options(f: &mut syn::ImplItemFn) -> syn::Result<Option<NumReturns>> {
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
