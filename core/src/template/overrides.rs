//! Per-pod overrides: a template declares which of its `values` a pod may set by annotation, and of what type.
//!
//! ```yaml
//! overrides:
//!   proxy-cpu:    { value: proxyCPU, type: quantity }    # annotation <prefix>proxy-cpu sets values.proxyCPU
//!   log-level:    { value: logLevel, type: string, oneOf: [debug, info, warn, error] }
//!   exclude-ports: { value: excludePorts, type: ports }  # "8080, 9090" becomes [8080, 9090]
//! ```
//!
//! A pod's value is checked against the declared type before it reaches a template; a value that does not pass is
//! refused with a warning and the template's own value is used. Values reach the patch through the renderer, which
//! writes every leaf as JSON, so whatever the annotation holds it is escaped.

use super::Problem;
use super::yaml::{PathSeg, YNode, YValue};
use crate::validation::quantity;

/// The annotation keys the injector itself reads or writes; an override cannot take them.
const RESERVED: [&str; 3] = ["inject", "status", "template"];

/// Longest string override accepted unless the declaration says otherwise.
const DEFAULT_MAX_LENGTH: usize = 256;
/// Longest quantity override: enough for any real one, and it keeps exact comparisons cheap.
const MAX_QUANTITY_LENGTH: usize = 64;

/// One declared override.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OverrideSpec {
    /// The annotation key, prefix included (`sidecar-injector.io/proxy-cpu`).
    pub annotation: String,
    /// The key of `values` it replaces (`proxyCPU`).
    pub value: String,
    pub kind: OverrideKind,
}

/// What an override's value must be.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OverrideKind {
    /// Any string up to `max_length` bytes, or one of `one_of` when given.
    String { one_of: Vec<String>, max_length: usize },
    /// A Kubernetes resource quantity (`100m`, `1.5Gi`, `2`).
    Quantity,
    /// An integer within bounds.
    Integer { min: i64, max: i64 },
    /// `true` or `false`.
    Boolean,
    /// A comma-separated list of port numbers, given to templates as a list of integers.
    Ports,
}

impl OverrideKind {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            OverrideKind::String { .. } => "string",
            OverrideKind::Quantity => "quantity",
            OverrideKind::Integer { .. } => "integer",
            OverrideKind::Boolean => "boolean",
            OverrideKind::Ports => "ports",
        }
    }
}

/// Why a pod's override annotation was refused: the sentence completes "annotation X=... ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("must be one of {}", .0.join(", "))]
    NotOneOf(Vec<String>),
    #[error("is longer than {0} bytes")]
    TooLong(usize),
    #[error("is not a Kubernetes quantity (such as 100m, 0.5, 128Mi or 1G)")]
    NotAQuantity,
    #[error("must be an integer from {min} to {max}")]
    OutOfRange { min: i64, max: i64 },
    #[error("must be true or false")]
    NotABoolean,
    #[error("must be port numbers (1-65535) separated by commas")]
    NotPorts,
}

impl OverrideSpec {
    /// Checks a pod's annotation value; `Ok` is the value templates see, `Err` says why it was refused.
    pub(crate) fn accept(&self, raw: &str) -> Result<serde_json::Value, Refused> {
        let text = raw.trim();
        match &self.kind {
            OverrideKind::String { one_of, max_length } => {
                if !one_of.is_empty() && !one_of.iter().any(|o| o == text) {
                    return Err(Refused::NotOneOf(one_of.clone()));
                }
                if text.len() > *max_length {
                    return Err(Refused::TooLong(*max_length));
                }
                Ok(text.into())
            }
            OverrideKind::Quantity if text.len() <= MAX_QUANTITY_LENGTH && quantity::parse(text).is_ok() => {
                Ok(text.into())
            }
            OverrideKind::Quantity => Err(Refused::NotAQuantity),
            OverrideKind::Integer { min, max } => match text.parse::<i64>() {
                Ok(n) if (*min..=*max).contains(&n) => Ok(n.into()),
                _ => Err(Refused::OutOfRange { min: *min, max: *max }),
            },
            OverrideKind::Boolean => match text {
                "true" => Ok(true.into()),
                "false" => Ok(false.into()),
                _ => Err(Refused::NotABoolean),
            },
            OverrideKind::Ports => {
                let ports: Option<Vec<serde_json::Value>> = text
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(|p| p.parse::<u16>().ok().filter(|n| *n > 0).map(serde_json::Value::from))
                    .collect();
                ports.map(serde_json::Value::Array).ok_or(Refused::NotPorts)
            }
        }
    }
}

/// Parses the `overrides` section, checking each declaration against the template's `values` (the default must
/// exist and itself be a valid value of the declared type). Errors carry the path and reason.
pub(crate) fn parse(section: &YNode, values: &serde_json::Value, prefix: &str) -> Result<Vec<OverrideSpec>, Problem> {
    let root = vec![PathSeg::Key("overrides".into())];
    let YValue::Map(members) = &section.value else {
        return Err(Problem::new(root, "`overrides` maps annotation names to { value, type }"));
    };
    let mut specs: Vec<OverrideSpec> = Vec::with_capacity(members.len());
    for (annotation, decl) in members {
        let at = |key: Option<&str>| {
            let mut path = root.clone();
            path.push(PathSeg::Key(annotation.clone()));
            path.extend(key.map(|k| PathSeg::Key(k.to_owned())));
            path
        };
        if RESERVED.contains(&annotation.as_str()) {
            return Err(Problem::new(at(None), format!("`{annotation}` is an annotation of the injector itself")));
        }
        if !is_annotation_name(annotation) {
            return Err(Problem::new(at(None), "an override's name must be lowercase letters, digits, `-` and `.`"));
        }
        let field = |key: &str| decl.map_get(key);
        let Some(value) = field("value").and_then(YNode::as_str) else {
            return Err(Problem::new(
                at(Some("value")),
                "each override names the key of `values` it sets: `value: <key>`",
            ));
        };
        let Some(default) = values.get(value) else {
            return Err(Problem::new(
                at(Some("value")),
                format!("`values.{value}` does not exist; give it a default value"),
            ));
        };
        let kind = match field("type").and_then(YNode::as_str) {
            Some("string") => OverrideKind::String {
                one_of: match field("oneOf") {
                    None => Vec::new(),
                    Some(YNode { value: YValue::Seq(items), .. }) => {
                        items.iter().filter_map(|i| i.as_str().map(str::to_owned)).collect()
                    }
                    Some(_) => return Err(Problem::new(at(Some("oneOf")), "`oneOf` is a list of strings")),
                },
                max_length: match field("maxLength").map(|n| &n.value) {
                    None => DEFAULT_MAX_LENGTH,
                    Some(YValue::Int(n)) if *n > 0 => *n as usize,
                    Some(_) => return Err(Problem::new(at(Some("maxLength")), "`maxLength` is a positive integer")),
                },
            },
            Some("quantity") => OverrideKind::Quantity,
            Some("integer") => {
                let bound = |key: &str, or: i64| match field(key).map(|n| &n.value) {
                    None => Ok(or),
                    Some(YValue::Int(n)) => Ok(*n),
                    Some(_) => Err(Problem::new(at(Some(key)), format!("`{key}` is an integer"))),
                };
                OverrideKind::Integer { min: bound("min", i64::MIN)?, max: bound("max", i64::MAX)? }
            }
            Some("boolean") => OverrideKind::Boolean,
            Some("ports") => OverrideKind::Ports,
            _ => {
                return Err(Problem::new(
                    at(Some("type")),
                    "`type` is one of string, quantity, integer, boolean, ports",
                ));
            }
        };
        let spec = OverrideSpec { annotation: format!("{prefix}{annotation}"), value: value.to_owned(), kind };
        let default_text = match default {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(items) => items.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","),
            other => other.to_string(),
        };
        if let Err(reason) = spec.accept(&default_text) {
            return Err(Problem::new(
                at(Some("value")),
                format!("the default `values.{value}` is not a valid {}: it {reason}", spec.kind.name()),
            ));
        }
        if specs.iter().any(|s| s.value == spec.value) {
            return Err(Problem::new(at(Some("value")), format!("`values.{value}` already has an override")));
        }
        specs.push(spec);
    }
    Ok(specs)
}

/// A name usable after the annotation prefix: a DNS-1123 subdomain-like token.
fn is_annotation_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::yaml;

    fn specs(source: &str, values: serde_json::Value) -> Result<Vec<OverrideSpec>, String> {
        let node = yaml::parse(source).unwrap();
        parse(&node, &values, "p/").map_err(|problem| problem.to_string())
    }

    #[test]
    fn declarations_are_checked_against_values() {
        let values = serde_json::json!({"cpu": "50m", "level": "info", "ports": [15000], "k": 3});
        let ok = specs(
            "proxy-cpu: {value: cpu, type: quantity}\nlog-level: {value: level, type: string, oneOf: [info, debug]}\n\
             exclude-ports: {value: ports, type: ports}\nworkers: {value: k, type: integer, min: 1, max: 8}\n",
            values.clone(),
        )
        .unwrap();
        assert_eq!(ok.len(), 4);
        assert!(specs("x: {value: missing, type: string}", values.clone()).unwrap_err().contains("does not exist"));
        assert!(
            specs("x: {value: level, type: quantity}", values.clone()).unwrap_err().contains("not a valid quantity")
        );
        assert!(specs("x: {value: level, type: colour}", values.clone()).unwrap_err().contains("`type` is one of"));
        assert!(specs("status: {value: level, type: string}", values.clone()).unwrap_err().contains("injector itself"));
        assert!(specs("Bad_Name: {value: level, type: string}", values.clone()).unwrap_err().contains("lowercase"));
        let twice = "a: {value: level, type: string}\nb: {value: level, type: string}";
        assert!(specs(twice, values).unwrap_err().contains("already has an override"));
    }

    #[test]
    fn pod_values_are_checked_by_type() {
        let spec = |kind| OverrideSpec { annotation: "a".into(), value: "v".into(), kind };
        let quantity = spec(OverrideKind::Quantity);
        assert_eq!(quantity.accept(" 250m ").unwrap(), "250m");
        assert!(quantity.accept("lots").is_err());
        assert!(quantity.accept(&"1".repeat(65)).is_err(), "a quantity override is at most 64 bytes");
        let level = spec(OverrideKind::String { one_of: vec!["info".into(), "debug".into()], max_length: 10 });
        assert_eq!(level.accept("debug").unwrap(), "debug");
        assert!(level.accept("trace").unwrap_err().to_string().contains("one of info, debug"));
        let free = spec(OverrideKind::String { one_of: vec![], max_length: 4 });
        assert!(free.accept("12345").unwrap_err().to_string().contains("longer than 4"));
        let n = spec(OverrideKind::Integer { min: 1, max: 8 });
        assert_eq!(n.accept("8").unwrap(), 8);
        assert!(n.accept("9").is_err() && n.accept("x").is_err());
        let b = spec(OverrideKind::Boolean);
        assert_eq!(b.accept("true").unwrap(), true);
        assert!(b.accept("yes").is_err());
        let ports = spec(OverrideKind::Ports);
        assert_eq!(ports.accept("8080, 9090,").unwrap(), serde_json::json!([8080, 9090]));
        assert!(ports.accept("0").is_err() && ports.accept("70000").is_err() && ports.accept("80;x").is_err());
    }
}
