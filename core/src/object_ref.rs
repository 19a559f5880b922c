//! Typed references to objects, and how arguments are passed.

use crate::codec::KeepAlive;
use crate::codec::{self, Arg, Element};
use crate::runtime::local_ref::{LocalRef, RefOwner};
use crate::runtime::{self, Objects};
use crate::view::View;
use crate::Result;
use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{Address, ObjectRefInfo};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

/// A reference to an immutable object that is, or will be, somewhere in the
/// cluster: the result of a task, or a value given to [`put`](crate::put).
///
/// Cloning is cheap. The object is freed once no `ObjectRef` to it remains
/// in any process and no task in flight needs it. An `ObjectRef` can be
/// passed to a task (it arrives as its value), stored inside other values,
/// sent to actors, and awaited:
///
/// ```no_run
/// async fn twice(r: prism::ObjectRef<i64>) -> prism::Result<i64> {
///     let value: i64 = r.await?;
///     Ok(value * 2)
/// }
/// # fn main() { let _ = twice; }
/// ```
pub struct ObjectRef<T> {
    inner: Arc<LocalRef>,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for ObjectRef<T> {
    fn clone(&self) -> Self {
        ObjectRef {
            inner: self.inner.clone(),
            _type: PhantomData,
        }
    }
}

impl<T> fmt::Debug for ObjectRef<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectRef({})", self.inner.info.id)
    }
}

impl<T> PartialEq for ObjectRef<T> {
    fn eq(&self, other: &Self) -> bool {
        self.inner.info.id == other.inner.info.id
    }
}

impl<T> Eq for ObjectRef<T> {}

impl<T> std::hash::Hash for ObjectRef<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.info.id.hash(state)
    }
}

impl<T> ObjectRef<T> {
    /// Wraps a reference whose count was already taken in `objects`.
    pub(crate) fn from_counted(info: ObjectRefInfo, objects: &Arc<Objects>) -> Self {
        let owner: Weak<dyn RefOwner> = Arc::downgrade(objects) as Weak<dyn RefOwner>;
        Self::from_local(LocalRef::counted(info, owner))
    }

    /// Wraps a counted local handle the runtime kept.
    pub(crate) fn from_local(inner: Arc<LocalRef>) -> Self {
        ObjectRef {
            inner,
            _type: PhantomData,
        }
    }

    /// Keeps this handle's count alive, untyped, as long as the result is.
    pub(crate) fn keep_alive(&self) -> KeepAlive {
        self.inner.clone()
    }

    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.inner.info.id
    }

    /// The address of the process that owns the object.
    pub fn owner(&self) -> &Address {
        &self.inner.info.owner
    }

    pub(crate) fn info(&self) -> &ObjectRefInfo {
        &self.inner.info
    }

    /// The same reference with another value type.
    pub(crate) fn retype<U>(self) -> ObjectRef<U> {
        ObjectRef {
            inner: self.inner,
            _type: PhantomData,
        }
    }

    /// Forgets the value type (for mixed lists given to [`wait`](crate::wait)).
    pub fn untyped(&self) -> ObjectRef<()> {
        ObjectRef {
            inner: self.inner.clone(),
            _type: PhantomData,
        }
    }
}

impl<T> Serialize for ObjectRef<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        codec::note_serialized_ref(&self.inner.info, self.inner.clone());
        (self.inner.info.id, &self.inner.info.owner).serialize(serializer)
    }
}

impl<'de, T> Deserialize<'de> for ObjectRef<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let (id, owner) = <(ObjectId, Address)>::deserialize(deserializer)?;
        let info = ObjectRefInfo { id, owner };
        let objects = runtime::current_objects();
        if let Some(objects) = objects.upgrade() {
            objects.refs.add_local(&info);
        }
        let owner: Weak<dyn RefOwner> = objects;
        Ok(Self::from_local(LocalRef::counted(info, owner)))
    }
}

/// Something that can be passed where a remote function expects a `P`: a
/// `P` itself, or an [`ObjectRef<P>`] (by value or reference), whose value
/// the executor receives. A `&ObjectRef<Vec<T>>` can also be passed for a
/// [`View<T>`] parameter, read in place from shared memory. A borrowed
/// value passes for its type (`&P` for `P`, sent as a copy), and so do a
/// `&str` for a `String` and a slice `&[T]` for a `Vec<T>`.
///
/// ```no_run
/// #[prism::remote]
/// fn greet(name: String) -> String {
///     format!("hello, {name}")
/// }
///
/// #[prism::remote]
/// fn sum(values: Vec<f64>) -> f64 {
///     values.iter().sum()
/// }
///
/// fn main() -> prism::Result<()> {
///     prism::init(prism::Config::default())?;
///     let owned = String::from("you");
///     let a = greet::remote("world")?;
///     let b = greet::remote(&owned)?;
///     assert_eq!(prism::get(&a)?, "hello, world");
///     assert_eq!(prism::get(&b)?, "hello, you");
///     let values = vec![1.0, 2.0, 3.0];
///     let total = sum::remote(&values)?;
///     let head = sum::remote(&values[..2])?;
///     assert_eq!(prism::get(&total)?, 6.0);
///     assert_eq!(prism::get(&head)?, 3.0);
///     Ok(())
/// }
/// ```
pub trait IntoArg<P> {
    /// Converts into a wire argument.
    fn into_arg(self) -> Result<Arg>;
}

impl<P: Serialize + 'static> IntoArg<P> for P {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Value(codec::encode(&self)?))
    }
}

impl IntoArg<String> for &str {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Value(codec::encode(&self.to_owned())?))
    }
}

impl<P: Serialize + 'static> IntoArg<P> for &P {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Value(codec::encode(self)?))
    }
}

impl<T: Serialize + Clone + 'static> IntoArg<Vec<T>> for &[T] {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Value(codec::encode(&self.to_vec())?))
    }
}

impl<P> IntoArg<P> for &ObjectRef<P> {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Ref(self.inner.info.clone()))
    }
}

impl<P> IntoArg<P> for ObjectRef<P> {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Ref(self.inner.info.clone()))
    }
}

impl<E: Element> IntoArg<View<E>> for &ObjectRef<Vec<E>> {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Ref(self.inner.info.clone()))
    }
}

impl IntoArg<View<u8>> for &ObjectRef<bytes::Bytes> {
    fn into_arg(self) -> Result<Arg> {
        Ok(Arg::Ref(self.inner.info.clone()))
    }
}
