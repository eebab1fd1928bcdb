//! An envelope's JSON read straight into AMQP values: what [`value_from_json`] makes of the
//! parsed JSON, without building the JSON tree first (egress reads an envelope for every
//! delivery whose Metadata differs from the last one's).
//!
//! Reading is lenient as the envelope asks (ENV-12): keys it does not know are skipped, and a
//! section that is not an object counts as absent. Only `amqp10` itself must be an object.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_amqp::primitives::{Symbol, Ulong};
use serde_amqp::Value;
use serde_json::Value as Json;

use super::entries::Entries;
use super::{from_marker, prop_from_json, value_from_json, Arg, PROPS};

/// A map section's entries in their order.
pub(super) type MapSection = Vec<(Value, Value)>;

/// The sections an envelope records, as AMQP values.
#[derive(Debug, Default)]
pub(super) struct Sections {
    /// The properties fields, by position (null when absent).
    pub props: Props,
    /// Application-properties, string keys.
    pub app: Option<MapSection>,
    /// Message annotations, symbol (or ulong) keys.
    pub annotations: Option<MapSection>,
    /// Delivery annotations.
    pub delivery_annotations: Option<MapSection>,
    /// The footer.
    pub footer: Option<MapSection>,
    /// Whether the body was an AmqpValue.
    pub value_body: bool,
}

impl Sections {
    /// Where the map section `key` names is kept, and how it is read; `None` for other keys.
    fn map_section(&mut self, key: Key) -> Option<(&mut Option<MapSection>, MapObject)> {
        Some(match key {
            Key::App => (&mut self.app, MapObject::App),
            Key::Annotations => (&mut self.annotations, MapObject::Annotations),
            Key::DeliveryAnnotations => (&mut self.delivery_annotations, MapObject::Annotations),
            Key::Footer => (&mut self.footer, MapObject::Annotations),
            Key::Amqp10 | Key::Props | Key::BodySection | Key::Other => return None,
        })
    }
}

/// The properties section's fields and the header fields kept beside them (ENV-3).
#[derive(Debug, Default)]
pub(super) struct Props {
    /// By position, as [`PROPS`] names them, up to the last one set (a Vec, not an array of
    /// all 13: the sections are moved about while read, and an array of values is large).
    pub fields: Vec<Value>,
    /// The header ttl.
    pub ttl: Option<u32>,
    /// The header priority.
    pub priority: Option<u8>,
}

impl Props {
    /// Sets the field named `name` (one of [`PROPS`]) from its JSON; other names are ignored.
    pub fn set(&mut self, name: &str, json: &Json) {
        if let Some(i) = PROPS.iter().position(|p| *p == name) {
            self.set_field(i, prop_from_json(name, json));
        }
    }

    /// Sets the field named `name` (one of [`PROPS`]) to `v`; other names are ignored.
    pub fn set_value(&mut self, name: &str, v: Value) {
        if let Some(i) = PROPS.iter().position(|p| *p == name) {
            self.set_field(i, v);
        }
    }

    /// Sets the field at position `i`.
    fn set_field(&mut self, i: usize, v: Value) {
        if self.fields.len() <= i {
            // Room for every field at the first: an envelope sets several, in any order.
            self.fields
                .reserve(PROPS.len().max(i + 1) - self.fields.len());
            self.fields.resize_with(i + 1, || Value::Null);
        }
        if let Some(slot) = self.fields.get_mut(i) {
            *slot = v;
        }
    }
}

/// The whole Metadata: `{"amqp10": {...}}`; an error when it is not an envelope (OP-ENV-6).
/// The properties fields named in `stamped` are skipped unread: the caller sets them over
/// whatever the envelope holds.
pub(super) fn envelope(metadata: &str, stamped: &[&str]) -> Option<Sections> {
    let mut de = serde_json::Deserializer::from_str(metadata);
    let sections = (&mut de).deserialize_map(Outer { stamped }).ok()?;
    de.end().ok()?;
    Some(sections)
}

/// The keys of both objects; anything else is skipped.
#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Key {
    Amqp10,
    Props,
    App,
    Annotations,
    DeliveryAnnotations,
    Footer,
    BodySection,
    #[serde(other)]
    Other,
}

/// The outer object, which must hold an `amqp10` object.
struct Outer<'s> {
    stamped: &'s [&'s str],
}

impl<'de> Visitor<'de> for Outer<'_> {
    type Value = Sections;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object with an amqp10 object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Sections, A::Error> {
        let mut amqp10 = None;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                // A non-object here fails the whole read: then it is not an envelope.
                Key::Amqp10 => {
                    amqp10 = Some(map.next_value_seed(Amqp10 {
                        stamped: self.stamped,
                    })?)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        amqp10.ok_or_else(|| serde::de::Error::missing_field("amqp10"))
    }
}

/// The `amqp10` object.
struct Amqp10<'s> {
    stamped: &'s [&'s str],
}

impl<'de> DeserializeSeed<'de> for Amqp10<'_> {
    type Value = Sections;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Sections, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Amqp10<'_> {
    type Value = Sections;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Sections, A::Error> {
        let mut s = Sections::default();
        // A key given twice: the last one counts, whole.
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Props => {
                    s.props = map
                        .next_value_seed(Lenient(PropsObject {
                            stamped: self.stamped,
                        }))?
                        .unwrap_or_default()
                }
                Key::BodySection => {
                    s.value_body = map.next_value::<MarkerValue<'de>>()?.0.is_text("value")
                }
                key => match s.map_section(key) {
                    Some((slot, object)) => *slot = map.next_value_seed(Lenient(object))?,
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                },
            }
        }
        Ok(s)
    }
}

/// How a section object is read, and what it makes.
trait SectionObject {
    type Read;
    fn read<'de, A: MapAccess<'de>>(self, map: A) -> Result<Self::Read, A::Error>;
}

/// The properties, and the header fields kept with them; the `stamped` ones are left unread.
struct PropsObject<'s> {
    stamped: &'s [&'s str],
}

impl SectionObject for PropsObject<'_> {
    type Read = Props;
    fn read<'de, A: MapAccess<'de>>(self, map: A) -> Result<Props, A::Error> {
        props(map, self.stamped)
    }
}

/// A map section.
#[derive(Clone, Copy)]
enum MapObject {
    /// Application-properties: string keys.
    App,
    /// An annotation map: symbol keys, or ulong keys written `$u64:N`.
    Annotations,
}

impl SectionObject for MapObject {
    type Read = MapSection;
    fn read<'de, A: MapAccess<'de>>(self, map: A) -> Result<MapSection, A::Error> {
        match self {
            MapObject::App => app(map),
            MapObject::Annotations => annotations(map),
        }
    }
}

/// A section object; any other JSON (skipped whole) is `None`.
struct Lenient<O>(O);

impl<'de, O: SectionObject> DeserializeSeed<'de> for Lenient<O> {
    type Value = Option<O::Read>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<O::Read>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, O: SectionObject> Visitor<'de> for Lenient<O> {
    type Value = Option<O::Read>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<O::Read>, A::Error> {
        self.0.read(map).map(Some)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<O::Read>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<O::Read>, E> {
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<O::Read>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<O::Read>, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<O::Read>, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<O::Read>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<O::Read>, E> {
        Ok(None)
    }
}

/// The properties object; absent fields are null, and the `stamped` ones are left unread.
fn props<'de, A: MapAccess<'de>>(mut map: A, stamped: &[&str]) -> Result<Props, A::Error> {
    let mut p = Props::default();
    while let Some(Text(key)) = map.next_key()? {
        match &*key {
            "ttl" => {
                p.ttl = map
                    .next_value::<Json>()?
                    .as_u64()
                    .and_then(|t| u32::try_from(t).ok())
            }
            "priority" => {
                p.priority = map
                    .next_value::<Json>()?
                    .as_u64()
                    .and_then(|t| u8::try_from(t).ok())
            }
            name if stamped.contains(&name) => {
                map.next_value::<IgnoredAny>()?;
            }
            // Typed by its name: read as JSON first.
            "content_type" | "content_encoding" | "group_sequence" => {
                p.set(&key, &map.next_value::<Json>()?)
            }
            name => match PROPS.iter().position(|n| *n == name) {
                Some(i) => p.set_field(i, map.next_value::<FromJson>()?.0),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            },
        }
    }
    Ok(p)
}

/// Application-properties: string keys.
fn app<'de, A: MapAccess<'de>>(map: A) -> Result<Vec<(Value, Value)>, A::Error> {
    Ok(entries(map)?
        .into_iter()
        .map(|(k, v)| (Value::String(k), v))
        .collect())
}

/// An annotation map: symbol keys, or ulong keys written `$u64:N`.
fn annotations<'de, A: MapAccess<'de>>(map: A) -> Result<Vec<(Value, Value)>, A::Error> {
    Ok(entries(map)?
        .into_iter()
        .map(|(k, v)| {
            let key = match k
                .strip_prefix("$u64:")
                .and_then(|n| n.parse::<Ulong>().ok())
            {
                Some(n) => Value::Ulong(n),
                None => Value::Symbol(Symbol::from(k)),
            };
            (key, v)
        })
        .collect())
}

/// An object's entries as AMQP values, a repeated key in its first place with its last value.
fn entries<'de, A: MapAccess<'de>>(mut map: A) -> Result<Entries<String, Value>, A::Error> {
    let mut e = Entries::with_capacity(map.size_hint().unwrap_or(0));
    while let Some(key) = map.next_key::<String>()? {
        let v = map.next_value::<FromJson>()?.0;
        e.insert(key, v);
    }
    Ok(e)
}

/// A JSON string, borrowed from the Metadata when it holds no escapes (serde's own `Cow` always
/// copies).
struct Text<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_string())))
            }
            fn visit_string<E>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

/// One JSON value as [`value_from_json`] reads it.
pub(super) struct FromJson(pub Value);

impl<'de> serde::Deserialize<'de> for FromJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromJsonVisitor).map(FromJson)
    }
}

struct FromJsonVisitor;

/// An entry of an object being read: a key that may be a marker keeps its JSON until the object
/// is known to hold nothing else (a string, what most markers hold, without building JSON).
enum Pending<'de> {
    Text(Cow<'de, str>),
    Json(Json),
    Value(Value),
}

impl Pending<'_> {
    fn value(self) -> Value {
        match self {
            Pending::Text(s) => Value::String(s.into_owned()),
            Pending::Json(j) => value_from_json(&j),
            Pending::Value(v) => v,
        }
    }

    /// Whether this is the string `s`.
    fn is_text(&self, s: &str) -> bool {
        matches!(self, Pending::Text(t) if t == s)
    }

    /// The marker `key` with this value, if it is one.
    fn marker(&self, key: &str) -> Option<Value> {
        match self {
            Pending::Text(s) => from_marker(key, Arg::Str(s)),
            Pending::Json(j) => from_marker(key, Arg::of(j)),
            Pending::Value(_) => None,
        }
    }
}

/// The value of a key that may be a marker.
struct MarkerValue<'de>(Pending<'de>);

impl<'de> serde::Deserialize<'de> for MarkerValue<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MarkerValue<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(MarkerValue(Pending::Text(Cow::Borrowed(s))))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(MarkerValue(Pending::Text(Cow::Owned(s.to_string()))))
            }
            fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
                Ok(MarkerValue(Pending::Text(Cow::Owned(s))))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(MarkerValue(Pending::Json(Json::Null)))
            }
            fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
                Ok(MarkerValue(Pending::Json(Json::Bool(b))))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
                Ok(MarkerValue(Pending::Json(n.into())))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
                Ok(MarkerValue(Pending::Json(n.into())))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Self::Value, E> {
                // What serde_json makes of a number that is not finite (never parsed from text).
                Ok(MarkerValue(Pending::Json(
                    serde_json::Number::from_f64(f).map_or(Json::Null, Json::Number),
                )))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                let d = serde::de::value::SeqAccessDeserializer::new(seq);
                <Json as serde::Deserialize>::deserialize(d).map(|j| MarkerValue(Pending::Json(j)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let d = serde::de::value::MapAccessDeserializer::new(map);
                <Json as serde::Deserialize>::deserialize(d).map(|j| MarkerValue(Pending::Json(j)))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Visitor<'de> for FromJsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Long(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(i64::try_from(n).map_or(Value::Double((n as f64).into()), Value::Long))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        Ok(Value::Double(f.into()))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(FromJson(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let pending = |key: &str, map: &mut A| -> Result<Pending<'de>, A::Error> {
            Ok(if key.starts_with('$') {
                map.next_value::<MarkerValue<'de>>()?.0
            } else {
                Pending::Value(map.next_value::<FromJson>()?.0)
            })
        };
        // The common object here is a marker alone (`{"$u64":"7"}`): read without a list.
        let Some(first) = map.next_key::<Text<'de>>()?.map(|t| t.0) else {
            return Ok(Value::Map(Default::default()));
        };
        let first_value = pending(&first, &mut map)?;
        let Some(second) = map.next_key::<Text<'de>>()?.map(|t| t.0) else {
            if let Some(v) = first_value.marker(&first) {
                return Ok(v);
            }
            return Ok(Value::Map(
                [(Value::String(first.into_owned()), first_value.value())]
                    .into_iter()
                    .collect(),
            ));
        };
        let mut e: Entries<Cow<'de, str>, Pending<'de>> = Entries::with_capacity(2);
        e.insert(first, first_value);
        let second_value = pending(&second, &mut map)?;
        e.insert(second, second_value);
        while let Some(Text(key)) = map.next_key()? {
            let v = pending(&key, &mut map)?;
            e.insert(key, v);
        }
        let mut entries = e.into_iter();
        let first = entries.next();
        // A key given twice may have left one entry: then it is read as a marker too.
        if let (Some((k, v)), 0) = (&first, entries.len()) {
            if let Some(v) = v.marker(k) {
                return Ok(v);
            }
        }
        Ok(Value::Map(
            first
                .into_iter()
                .chain(entries)
                .map(|(k, v)| (Value::String(k.into_owned()), v.value()))
                .collect(),
        ))
    }
}
