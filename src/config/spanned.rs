//! A value with its place in the config text, for errors that name the line: `toml::Spanned`,
//! wrapped so the config's serde types can also describe themselves as a JSON Schema
//! (`schemars`), where a spanned value is just the value.

use std::borrow::Cow;
use std::ops::Range;

use serde::{Deserialize, Deserializer};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spanned<T>(toml::Spanned<T>);

impl<T> Spanned<T> {
    pub fn new(span: Range<usize>, value: T) -> Self {
        Spanned(toml::Spanned::new(span, value))
    }

    /// Byte range of the value in the config text.
    pub fn span(&self) -> Range<usize> {
        self.0.span()
    }

    pub fn get_ref(&self) -> &T {
        self.0.get_ref()
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Spanned<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        toml::Spanned::<T>::deserialize(deserializer).map(Spanned)
    }
}

impl<T: schemars::JsonSchema> schemars::JsonSchema for Spanned<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(generator)
    }
}
