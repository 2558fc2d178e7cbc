//! How configuration keys are declared: once each, with their type, default, bounds and doc
//! line ([`section!`]). From that one declaration come the section's struct (what serde reads),
//! its `Default`, the range check, and [`Key`], the list docs/configuration.md's reference is
//! rendered from.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::ConfigError;

pub const HOUR: Duration = Duration::from_secs(3600);
pub const TEN_YEARS: Duration = Duration::from_secs(3650 * 24 * 3600);

/// `n` minutes, for bounds (a constant expression).
pub const fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

/// A declared key: its full name (`http.listen`), its type as written in the declaration, its
/// bounds and its description.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Key {
    pub name: &'static str,
    pub ty: &'static str,
    pub bound: Bound,
    pub doc: &'static str,
}

/// A declared section: its name (`http`), its description and its keys.
#[derive(Debug, Clone, Copy)]
pub struct Section {
    pub name: &'static str,
    pub doc: &'static str,
    pub keys: &'static [Key],
}

/// What values a key takes beyond its type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// Any value of the type.
    Any,
    /// A count from the first to the second, both included.
    Count(u64, u64),
    /// A duration longer than zero and at most this.
    Duration(Duration),
}

impl Bound {
    /// Whole seconds or a count, for the check's message.
    fn check_count(self, key: &'static str, value: u64) -> Result<(), ConfigError> {
        match self {
            Bound::Count(min, max) if value < min || value > max => Err(ConfigError::Invalid {
                key,
                message: format!("must be between {min} and {max}"),
            }),
            _ => Ok(()),
        }
    }
}

/// A type a key may have: how it is read and written (a duration as text such as `"30s"`,
/// everything else as serde does), and how its bound is checked.
pub trait ConfigValue: Sized {
    fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
    /// Checks `self` against `bound`, naming `key` in the error. A type without a bound of its
    /// own (text, addresses, paths) takes any value.
    fn check(&self, _key: &'static str, _bound: Bound) -> Result<(), ConfigError> {
        Ok(())
    }
}

/// The serde adapter every field of a section uses (`#[serde(with = "...::value")]`).
pub mod value {
    use super::ConfigValue;
    use serde::{Deserializer, Serializer};

    pub fn serialize<T: ConfigValue, S: Serializer>(
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.write(serializer)
    }

    pub fn deserialize<'de, T: ConfigValue, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        T::read(deserializer)
    }
}

/// Types read and written as serde does.
macro_rules! as_serde_does {
    ($($ty:ty),+ $(,)?) => {
        $(impl ConfigValue for $ty {
            fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                self.serialize(serializer)
            }
            fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                <$ty>::deserialize(deserializer)
            }
        })+
    };
}

as_serde_does!(
    bool,
    f64,
    String,
    SocketAddr,
    PathBuf,
    crate::config::LogFormat,
    crate::config::UrlList,
    crate::config::ConnectionString,
    Vec<crate::config::ClientSettings>,
    Vec<crate::config::AdminPrincipal>,
    Vec<String>,
);

/// Counts: read as serde does, checked against [`Bound::Count`].
macro_rules! counts {
    ($($ty:ty),+) => {
        $(impl ConfigValue for $ty {
            fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                self.serialize(serializer)
            }
            fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                <$ty>::deserialize(deserializer)
            }
            fn check(&self, key: &'static str, bound: Bound) -> Result<(), ConfigError> {
                // A negative count is below every lower bound there is.
                bound.check_count(key, u64::try_from(*self).unwrap_or(0))
            }
        })+
    };
}

counts!(u16, u32, usize, i32);

impl<T: ConfigValue> ConfigValue for Option<T> {
    fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Some(value) => value.write(serializer),
            None => serializer.serialize_none(),
        }
    }

    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// `T` through its own reading, as serde's `Option` wants a `Deserialize` type.
        struct Read<T>(T);
        impl<'de, T: ConfigValue> Deserialize<'de> for Read<T> {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                T::read(deserializer).map(Read)
            }
        }
        Ok(Option::<Read<T>>::deserialize(deserializer)?.map(|read| read.0))
    }

    fn check(&self, key: &'static str, bound: Bound) -> Result<(), ConfigError> {
        self.as_ref()
            .map_or(Ok(()), |value| value.check(key, bound))
    }
}

/// A duration written as text such as `"30s"`, `"250ms"` or `"24h"`, longer than zero and at
/// most its bound.
impl ConfigValue for Duration {
    fn write<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(*self).to_string())
    }

    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(&text).map_err(|error| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration such as \"30s\" or \"24h\": {error}"
            ))
        })
    }

    fn check(&self, key: &'static str, bound: Bound) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid { key, message };
        if self.is_zero() {
            return Err(invalid("must be longer than zero".into()));
        }
        match bound {
            Bound::Duration(max) if *self > max => Err(invalid(format!(
                "must be at most {}",
                humantime::format_duration(max)
            ))),
            _ => Ok(()),
        }
    }
}

/// Declares a configuration section: a struct whose every field is a key with its type, its
/// default, its bounds and its doc line, all in one place:
///
/// ```text
/// section! {
///     /// The HTTP listener.
///     pub struct HttpSettings("http") {
///         /// Largest request body accepted; larger ones get 413.
///         max_body_bytes: usize = 64 * 1024, Bound::Count(64, 64 << 20);
///     }
/// }
/// ```
///
/// gives the struct (serde: unknown keys refused, absent ones defaulted), its `Default`,
/// `KEYS` (each key's full name, type, bounds and doc line), `SECTION` (the section's name, doc
/// line and keys) and `check_bounds`.
macro_rules! section {
    (
        $(#[doc = $section_doc:literal])*
        pub struct $name:ident($section:literal) {
            $(
                $(#[doc = $doc:literal])+
                $field:ident: $ty:ty = $default:expr, $bound:expr;
            )+
        }
    ) => {
        $(#[doc = $section_doc])*
        #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $(
                $(#[doc = $doc])+
                #[serde(with = "crate::config::keys::value")]
                pub $field: $ty,
            )+
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    $($field: $default,)+
                }
            }
        }

        impl $name {
            /// The keys of this section, as declared.
            pub const KEYS: &'static [$crate::config::keys::Key] = &[
                $($crate::config::keys::Key {
                    name: concat!($section, ".", stringify!($field)),
                    ty: stringify!($ty),
                    bound: $bound,
                    doc: concat!($($doc),+),
                },)+
            ];

            /// This section, as declared.
            pub const SECTION: $crate::config::keys::Section = $crate::config::keys::Section {
                name: $section,
                doc: concat!($($section_doc),*),
                keys: Self::KEYS,
            };

            /// Every value within its key's bounds.
            pub(super) fn check_bounds(&self) -> Result<(), $crate::config::ConfigError> {
                $(
                    $crate::config::keys::ConfigValue::check(
                        &self.$field,
                        concat!($section, ".", stringify!($field)),
                        $bound,
                    )?;
                )+
                Ok(())
            }
        }
    };
}

pub(crate) use section;
