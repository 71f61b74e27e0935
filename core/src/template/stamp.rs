//! What a template writes about itself: its id and hash, and the status annotation on every pod it injects
//! (which `status` and `uninject` read back as a [`Stamp`]).

use sha2::{Digest, Sha256};

use super::yaml::{YNode, YValue};
use super::{Injects, TemplateError};
use crate::settings::DEFAULT_REVISION;

/// Which template, at which version: what the status annotation, the response's audit annotations and an
/// engine's [`Outcome`](crate::Outcome) name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateId {
    /// The template's name: a file's stem, or the names of a combination joined by commas.
    pub name: String,
    /// The template's version: the first 16 hex digits of the SHA-256 of its sources (and the shared values).
    pub version: String,
    /// The hash of the whole set the template was loaded with.
    pub set: String,
    /// The response's `auditAnnotations` for a pod this template was applied to, as JSON: the same for every pod,
    /// so written once.
    audit_json: String,
}

impl TemplateId {
    pub(super) fn new(name: String, version: String, set: String) -> Self {
        let audit_json =
            serde_json::json!({"template": name, "template-version": version, "template-set": set}).to_string();
        TemplateId { name, version, set, audit_json }
    }

    /// The `auditAnnotations` object (JSON) of a response for a pod this template was applied to.
    pub(crate) fn audit_json(&self) -> &str {
        &self.audit_json
    }
}

/// The hash of a whole set: every template's name and source, and the shared values file.
pub(crate) fn set_hash<'a>(templates: impl Iterator<Item = (&'a str, &'a str)>, values: Option<&str>) -> String {
    let mut hasher = Sha256::new();
    for (name, source) in templates {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(source.as_bytes());
        hasher.update([0]);
    }
    if let Some(values) = values {
        hasher.update(b"values\0");
        hasher.update(values.as_bytes());
    }
    hex_prefix(&hasher.finalize())
}

pub(super) fn hex_prefix(digest: &[u8]) -> String {
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The status annotation (`<prefix>status`) the injector writes on every pod it injects: which template, at which
/// version, from which set and revision, and what it injects. Written when a template is assembled, read back by
/// the engine (is a pod's sidecar this template's?) and by `status` (which pods run an outdated one?).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stamp {
    /// The containers the template injects.
    #[serde(default)]
    pub containers: Vec<String>,
    /// Its init containers (native sidecars among them).
    #[serde(default)]
    pub init_containers: Vec<String>,
    /// The revision (`serve --template-dir NAME=DIR`) that injected the pod; absent on pods injected before
    /// revisions existed, which the default revision did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The hash of the template set.
    #[serde(default)]
    pub set: String,
    /// The revision tag whose webhooks the pod came through (`sidecar-injector tag set`), if any: the name its
    /// namespace is labelled with, which points to `revision`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The template's name.
    pub template: String,
    /// The template's version.
    pub version: String,
    /// The volumes it injects.
    #[serde(default)]
    pub volumes: Vec<String>,
}

impl Stamp {
    /// Reads a pod's status annotation; `None` when it is not one of ours.
    pub fn parse(annotation: &str) -> Option<Stamp> {
        serde_json::from_str(annotation).ok()
    }

    /// The revision that injected the pod: the default one for a pod stamped before revisions existed.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }
}

/// The status annotation: which template, its version, the set's and the revision, and what it injects.
pub(super) fn status_value(name: &str, hash: &str, set_hash: &str, revision: &str, injects: &Injects) -> String {
    let stamp = Stamp {
        containers: injects.containers.clone(),
        init_containers: injects.init_containers.clone(),
        revision: Some(revision.to_owned()),
        set: set_hash.to_owned(),
        tag: None,
        template: name.to_owned(),
        version: hash.to_owned(),
        volumes: injects.volumes.clone(),
    };
    serde_json::to_string(&stamp).expect("a stamp serialises")
}

/// A revision tag's name: a stable name (`prod`) that points to a revision, as a namespace's `<prefix>rev` label
/// names it (`sidecar-injector tag set`). A DNS label, so that it goes into a label value, a webhook's path and the
/// status annotation as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tag(Box<str>);

impl Tag {
    /// The tag `name`, or why it cannot be one.
    pub fn new(name: &str) -> Result<Tag, String> {
        match crate::validation::names::dns1123_label(name).into_iter().next() {
            Some(reason) => Err(format!("tag {name:?}: {reason}")),
            None => Ok(Tag(name.into())),
        }
    }

    /// The tag's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A template's status annotation, split where a tag goes: `head` + `,"tag":"TAG"` + `tail`, or the two joined for a
/// pod that came through the revision's own webhooks. Each half is also kept as the JSON string text the patch
/// writes, so that a tagged stamp costs a few copies, not a serialisation.
#[derive(Debug)]
pub(crate) struct StampText {
    head: Box<str>,
    tail: Box<str>,
    /// `"` and the JSON-escaped head.
    head_json: Box<[u8]>,
    /// The JSON-escaped tail and `"`.
    tail_json: Box<[u8]>,
}

/// Where a tag goes in the stamp's JSON, after `set` (the fields are serialised in order).
const TAG_MEMBER: &str = ",\"tag\":\"";

impl StampText {
    /// Splits `status` (an untagged stamp, as [`status_value`] writes it) where a tag goes.
    pub(crate) fn new(status: &str) -> Self {
        // Serialised with a tag no tag can be (a NUL), the tag member is found by its text.
        let mut stamp = Stamp::parse(status).expect("status_value writes a stamp");
        stamp.tag = Some("\0".to_owned());
        let tagged = serde_json::to_string(&stamp).expect("a stamp serialises");
        let member = format!("{TAG_MEMBER}\\u0000\"");
        let at = tagged.find(&member).expect("the stamp has the tag member");
        let (head, tail) = (&tagged[..at], &tagged[at + member.len()..]);
        debug_assert_eq!(format!("{head}{tail}"), status, "untagged, the stamp is the two halves joined");
        let json = |s: &str| {
            let mut out = Vec::new();
            crate::json::write_str(&mut out, s);
            out
        };
        let head_json = json(head);
        let tail_json = json(tail);
        StampText {
            head_json: head_json[..head_json.len() - 1].into(),
            tail_json: tail_json[1..].into(),
            head: head.into(),
            tail: tail.into(),
        }
    }

    /// Writes the stamp of a pod that came through `tag`'s webhooks as a JSON string, into `out` (cleared).
    pub(crate) fn write_tagged(&self, tag: &Tag, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.head_json);
        out.extend_from_slice(br#",\"tag\":\""#);
        out.extend_from_slice(tag.as_str().as_bytes());
        out.extend_from_slice(br#"\""#);
        out.extend_from_slice(&self.tail_json);
    }

    /// Is `status` this stamp with a tag (any)?
    pub(crate) fn is_tagged(&self, status: &str) -> bool {
        let tag = status.strip_prefix(&*self.head).and_then(|s| s.strip_suffix(&*self.tail));
        let tag = tag.and_then(|s| s.strip_prefix(TAG_MEMBER)).and_then(|s| s.strip_suffix('"'));
        tag.is_some_and(|tag| crate::validation::names::dns1123_label(tag).is_empty())
    }
}

/// Adds the status annotation to the template's `pod.metadata.annotations`, so that it is merged like any other
/// annotation: added when absent, left alone when present.
pub(super) fn insert_status(
    pod: &mut YNode,
    key: &str,
    value: &str,
    invalid: &dyn Fn(usize, String) -> TemplateError,
) -> Result<(), TemplateError> {
    let line = pod.line;
    let section = |node: &mut YNode, name: &str| -> Result<(), TemplateError> {
        match &mut node.value {
            YValue::Map(members) => {
                if !members.iter().any(|(k, _)| k == name) {
                    members.push((name.to_owned(), YNode { line, value: YValue::Map(Vec::new()) }));
                }
                Ok(())
            }
            _ => Err(invalid(node.line, format!("`{name}`'s parent must be a mapping"))),
        }
    };
    section(pod, "metadata")?;
    let metadata = pod.map_get_mut("metadata").expect("inserted above");
    section(metadata, "annotations")?;
    let annotations = metadata.map_get_mut("annotations").expect("inserted above");
    if annotations.map_get(key).is_some() {
        return Err(invalid(annotations.line, format!("the annotation `{key}` is written by the injector; remove it")));
    }
    let YValue::Map(members) = &mut annotations.value else {
        return Err(invalid(annotations.line, "`metadata.annotations` must be a mapping".into()));
    };
    members.push((key.to_owned(), YNode { line, value: YValue::Str(value.to_owned()) }));
    Ok(())
}
