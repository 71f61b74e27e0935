//! A pod's JSON read into k8s-openapi's types, as the API server decodes a request body: a string where a number
//! belongs, or a number out of an `int32`'s range, is refused, at the path it sits at.

use serde::de::DeserializeOwned;
use serde_json::Value as J;

/// One step of the path to where decoding failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// The member under this key.
    Key(String),
    /// The item at this index.
    Index(usize),
}

/// Where a value does not decode as its API type, and serde's word for why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct DecodeError {
    /// The path from the decoded value to the offending one.
    pub path: Vec<Step>,
    /// What is wrong there (`invalid type: string "http", expected i32`).
    pub message: String,
}

impl DecodeError {
    /// The offending value inside `root`, the value that was decoded (null where the path leads nowhere).
    pub(crate) fn value_in<'j>(&self, root: &'j J) -> &'j J {
        self.path.iter().fold(root, |at, step| {
            let next = match step {
                Step::Key(key) => at.get(key.as_str()),
                Step::Index(index) => at.get(*index),
            };
            next.unwrap_or(&J::Null)
        })
    }
}

/// Decodes `value` as the API type `T`. Unknown fields are dropped, as k8s-openapi does.
pub(crate) fn decode<T: DeserializeOwned>(value: &J) -> Result<T, DecodeError> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error
            .path()
            .iter()
            .filter_map(|segment| match segment {
                serde_path_to_error::Segment::Seq { index } => Some(Step::Index(*index)),
                serde_path_to_error::Segment::Map { key } => Some(Step::Key(key.clone())),
                _ => None,
            })
            .collect();
        DecodeError { path, message: error.into_inner().to_string() }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use serde_json::json;

    #[test]
    fn a_type_error_names_its_path_and_value() {
        let spec = json!({"containers": [{"name": "p", "image": "x", "ports": [{"containerPort": "http"}]}]});
        let error = decode::<PodSpec>(&spec).unwrap_err();
        let containers = Step::Key("containers".into());
        let ports = Step::Key("ports".into());
        assert_eq!(error.path, [containers, Step::Index(0), ports, Step::Index(0), Step::Key("containerPort".into())]);
        assert_eq!(error.value_in(&spec), &json!("http"));
        assert!(error.message.contains("invalid type"), "{error}");
    }

    /// A spec without `containers` decodes (k8s-openapi defaults the list to empty): a template's partial pod
    /// may leave it out, and a pod's missing `containers` is a validation error, reported as such, not a decoding
    /// one. Both readers rely on this rather than adding the list themselves.
    #[test]
    fn a_spec_without_containers_decodes() {
        let volumes = json!({"volumes": [{"name": "v", "emptyDir": {}}]});
        assert_eq!(decode::<PodSpec>(&volumes).map(|spec| spec.containers.len()), Ok(0));
    }
}
