//! The fields a k8s-openapi type knows at each place of a value, as its `Deserialize` names them: what the
//! "did you mean" of an unknown field in a template is chosen from.
//!
//! k8s-openapi's structs ignore unknown fields, and their field lists are not public, but every generated
//! `Deserialize` hands its list to `deserialize_struct`. [`Probe`] is a deserializer over a JSON value that notes
//! those lists, by path, on the way. It runs only when a template has an unknown field.

use std::cell::RefCell;

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{DeserializeOwned, Deserializer, IntoDeserializer, Visitor};
use serde_json::Value as J;

use super::yaml::PathSeg;

/// The field lists met while deserialising a value as `T`, each with the path (from `base`) of its object.
pub(super) fn known_fields<T: DeserializeOwned>(
    value: &J,
    base: &[PathSeg],
) -> Vec<(Vec<PathSeg>, &'static [&'static str])> {
    let noted = RefCell::new(Vec::new());
    // A value of the wrong type ends the walk early; the lists noted until then are still good.
    let _ = T::deserialize(Probe { value, path: base.to_vec(), noted: &noted });
    noted.into_inner()
}

/// Deserialises `value` as `serde_json::Value`'s own deserializer does, noting each struct's field list.
struct Probe<'a> {
    value: &'a J,
    path: Vec<PathSeg>,
    noted: &'a RefCell<Vec<(Vec<PathSeg>, &'static [&'static str])>>,
}

impl<'a> Probe<'a> {
    fn child(&self, seg: PathSeg, value: &'a J) -> Probe<'a> {
        let mut path = self.path.clone();
        path.push(seg);
        Probe { value, path, noted: self.noted }
    }
}

impl<'a> IntoDeserializer<'a, serde_json::Error> for Probe<'a> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de> Deserializer<'de> for Probe<'de> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            J::Object(members) => {
                let entries =
                    members.iter().map(|(key, value)| (key.as_str(), self.child(PathSeg::Key(key.clone()), value)));
                let mut map = MapDeserializer::new(entries);
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
            J::Array(items) => {
                let items = items.iter().enumerate().map(|(i, item)| self.child(PathSeg::Index(i), item));
                let mut seq = SeqDeserializer::new(items);
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.noted.borrow_mut().push((self.path.clone(), fields));
        self.deserialize_any(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            J::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_enum(name, variants, visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit unit_struct seq
        tuple tuple_struct map identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;
    use serde_json::json;

    use super::*;

    #[test]
    fn notes_each_objects_fields_by_path() {
        let spec = json!({"containers": [{"name": "p", "image": "x", "imagePullPolcy": "Always",
                                          "resources": {"requests": {"cpu": "1"}}}]});
        let noted = known_fields::<PodSpec>(&spec, &[PathSeg::Key("spec".into())]);
        let at = |path: &[PathSeg]| noted.iter().find(|(p, _)| p == path).map(|(_, fields)| *fields);
        let spec_path = [PathSeg::Key("spec".into())];
        assert!(at(&spec_path).unwrap().contains(&"initContainers"));
        let container = [spec_path[0].clone(), PathSeg::Key("containers".into()), PathSeg::Index(0)];
        let fields = at(&container).expect("the container's fields");
        assert!(fields.contains(&"imagePullPolicy") && !fields.contains(&"imagePullPolcy"));
        let resources = [container.as_slice(), &[PathSeg::Key("resources".into())]].concat();
        assert!(at(&resources).unwrap().contains(&"limits"));
    }
}
