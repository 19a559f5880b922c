//! The parameters of a remote function or actor method: refused when
//! borrowed, and the code that passes them as arguments and takes them
//! back out on the worker.

use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{FnArg, Signature, Type};

use crate::types::borrowed_part;

/// A parameter: its generated name and its type.
pub(crate) struct Param {
    pub(crate) ident: syn::Ident,
    pub(crate) ty: Type,
}

pub(crate) fn params(sig: &Signature) -> syn::Result<Vec<Param>> {
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
            out.push(Param {
                ident: format_ident!("__prism_arg{}", i),
                ty: (*pt.ty).clone(),
            });
        }
    }
    Ok(out)
}

pub(crate) fn take_args(params: &[Param]) -> Tokens {
    let takes = params.iter().enumerate().map(|(i, p)| {
        let (ident, ty) = (&p.ident, &p.ty);
        quote! { let #ident: #ty = __prism_args.take(#i)?; }
    });
    quote! { #(#takes)* }
}

pub(crate) fn typed_inputs(params: &[Param]) -> Tokens {
    let inputs = params.iter().map(|p| {
        let (ident, ty) = (&p.ident, &p.ty);
        quote! { #ident: impl ::prism::IntoArg<#ty> }
    });
    quote! { #(#inputs),* }
}

pub(crate) fn arg_list(params: &[Param]) -> Tokens {
    let args = params.iter().map(|p| {
        let (ident, ty) = (&p.ident, &p.ty);
        quote! { ::prism::IntoArg::<#ty>::into_arg(#ident) }
    });
    quote! { ::std::vec![#(#args),*] }
}

#[cfg(test)]
mod tests {
    use super::*;

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
