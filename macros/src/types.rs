//! What the macros read from the types in a signature: borrowed parts
//! (which no other process could decode), `Result`s and iterator items.

use syn::{GenericArgument, PathArguments, ReturnType, Type};

/// The first borrowed type (`&T`, `&str`, ...) inside `ty`, however deep
/// (`Vec<&str>`, `(u8, &[u8])`): a value holding one cannot be decoded in
/// another process, which owns nothing it could point into.
pub(crate) fn borrowed_part(ty: &Type) -> Option<&Type> {
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

/// The value type of the `ObjectRef` a call returns, and whether the
/// function returns a `Result` whose `Err` is a task failure.
pub(crate) fn return_info(output: &ReturnType) -> (Type, bool) {
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

/// The item type `Item = T` named by an `impl Iterator<...>` or a
/// `dyn Iterator<...>` (boxed or not).
pub(crate) fn iterator_item(ty: &Type) -> Option<Type> {
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
pub(crate) fn result_ok(ty: &Type) -> Option<Type> {
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
