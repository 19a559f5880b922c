//! What a call gives back (one value, `num_returns` values or a stream):
//! the refs the caller gets and the code that stores the results.

use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{ReturnType, Type};

use crate::options::NumReturns;
use crate::types::{borrowed_part, iterator_item, result_ok, return_info};

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
pub(crate) struct Returns {
    /// The type inside the `Result` that `remote` or a handle method
    /// returns: `ObjectRef<T>`, a tuple of `ObjectRef`s, or an
    /// `ObjectRefGenerator<T>`.
    pub(crate) refs: Tokens,
    /// How many values (1 for a stream: its count).
    pub(crate) count: usize,
    /// `num_returns = "streaming"`.
    pub(crate) streaming: bool,
    /// Turns `__prism_ret` into a `CallResult`.
    pub(crate) convert: Tokens,
    /// Compile-time checks for the caller's side.
    pub(crate) check: Tokens,
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

pub(crate) fn returns(
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
pub(crate) fn typed_refs(r: &Returns, submitted: Tokens) -> Tokens {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::NumReturns;

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
}
