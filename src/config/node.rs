//! A JSON value as the trusted file wrote it, and a serde deserializer over
//! it whose errors are data.
//!
//! `serde_json::Value` keeps the last of two equal keys and its errors are
//! text; the file's schema wants both kept (a duplicate key is an error)
//! and the unknown, duplicate or misspelt name handed back as a field, so
//! that the message names the key path. The schema itself stays serde's:
//! `#[derive(Deserialize)] #[serde(deny_unknown_fields)]` structs and
//! enums, deserialized from a [`Node`].

use std::fmt;

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, IntoDeserializer, Visitor};
use serde::Deserialize;

/// One JSON value, objects in file order with every key kept.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

impl Node {
    /// What the value is, for "expected X, found Y".
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Number(_) => "a number",
            Node::String(_) => "a string",
            Node::Array(_) => "an array",
            Node::Object(_) => "an object",
        }
    }
}

/// What the schema's derived code reported, as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaError {
    UnknownField {
        field: String,
        expected: &'static [&'static str],
    },
    DuplicateField {
        field: &'static str,
    },
    UnknownVariant {
        variant: String,
        expected: &'static [&'static str],
    },
    /// Anything else serde says (a type mismatch the caller did not check first).
    Other(String),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::UnknownField { field, .. } => write!(f, "unknown key `{field}`"),
            SchemaError::DuplicateField { field } => write!(f, "duplicate key `{field}`"),
            SchemaError::UnknownVariant { variant, .. } => write!(f, "unknown value `{variant}`"),
            SchemaError::Other(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for SchemaError {}

impl de::Error for SchemaError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        SchemaError::Other(msg.to_string())
    }
    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        SchemaError::UnknownField { field: field.to_owned(), expected }
    }
    fn duplicate_field(field: &'static str) -> Self {
        SchemaError::DuplicateField { field }
    }
    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        SchemaError::UnknownVariant { variant: variant.to_owned(), expected }
    }
}

/// Builds a [`Node`] from any deserializer (the file's text, through
/// `serde_json`), keeping duplicate keys.
impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Number(v as f64))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
                Ok(Node::Number(v as f64))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Number(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Node, E> {
                Ok(Node::String(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Node, E> {
                Ok(Node::String(v))
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Array(items))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Node>()? {
                    entries.push((k, v));
                }
                Ok(Node::Object(entries))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> IntoDeserializer<'de, SchemaError> for Node {
    type Deserializer = Node;
    fn into_deserializer(self) -> Node {
        self
    }
}

/// The schema's structs and enums read from a [`Node`]. `null` is a value
/// like any other (an `Option` field is absent only when its key is).
impl<'de> de::Deserializer<'de> for Node {
    type Error = SchemaError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, SchemaError> {
        match self {
            Node::Null => visitor.visit_unit(),
            Node::Bool(b) => visitor.visit_bool(b),
            Node::Number(n) => visitor.visit_f64(n),
            Node::String(s) => visitor.visit_string(s),
            Node::Array(items) => {
                let mut seq = SeqDeserializer::new(items.into_iter());
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Node::Object(entries) => {
                let mut map = MapDeserializer::new(entries.into_iter());
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, SchemaError> {
        visitor.visit_some(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, SchemaError> {
        match self {
            Node::String(s) => visitor.visit_enum(s.into_deserializer()),
            other => Err(SchemaError::Other(format!("expected a string, found {}", other.kind()))),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Two {
        first_key: Option<Node>,
        second: Option<Node>,
    }

    fn node(text: &str) -> Node {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn keeps_duplicate_keys_and_reports_schema_errors_as_data() {
        assert_eq!(
            node(r#"{"a": 1, "a": [true, null, "x"]}"#),
            Node::Object(vec![
                ("a".into(), Node::Number(1.0)),
                ("a".into(), Node::Array(vec![Node::Bool(true), Node::Null, Node::String("x".into())])),
            ])
        );
        let ok = Two::deserialize(node(r#"{"firstKey": null}"#)).unwrap();
        assert_eq!(ok, Two { first_key: Some(Node::Null), second: None });
        assert_eq!(
            Two::deserialize(node(r#"{"firstkey": 1}"#)),
            Err(SchemaError::UnknownField { field: "firstkey".into(), expected: &["firstKey", "second"] })
        );
        assert_eq!(
            Two::deserialize(node(r#"{"second": 1, "second": 2}"#)),
            Err(SchemaError::DuplicateField { field: "second" })
        );
    }
}
