//! Revision tags (`sidecar-injector tag`): a stable name (`prod`) that points to a revision, as Istio's revision
//! tags do. A tag is a webhook configuration of each kind of its own, `sidecar-injector-tag-TAG`: its revision's
//! webhooks, each renamed, calling the revision's path with `/tag/TAG` (so the pods it injects carry the tag in
//! their stamp), for the namespaces labelled `<prefix>rev=TAG`. Moving a tag rewrites them (one command; new pods
//! get the new revision, and `status` lists the running ones as other-revision until they restart). Derived from
//! the revision's webhooks as the cluster has them, so a tag has their certificate, selectors and conditions.
//! Pure: the calls are `cluster`'s.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use sidecar_injector_core::Tag;
use sidecar_injector_core::settings::Keys;

/// The webhook configurations (of each kind) that hold the revisions' webhooks (manifests/base, the revision
/// components, the chart).
pub const CONFIGURATION: &str = "sidecar-injector";
/// The two kinds of webhook configuration a tag is made of, by resource name: the mutating one first (its labels
/// are what [`pointed`] reads).
pub const RESOURCES: [&str; 2] = ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"];
/// Who applies a tag's webhook configurations (server-side apply's field manager).
pub const FIELD_MANAGER: &str = "sidecar-injector-tag";
/// The label that marks a tag's webhook configuration, with the tag as its value.
pub const TAG_LABEL: &str = "sidecar-injector.io/tag";
/// The label that says which revision a tag's webhook configuration points to.
pub const REVISION_LABEL: &str = "sidecar-injector.io/tag-revision";
/// How a revision's webhooks are named: `[REVISION.]KIND` and this suffix (no revision: the default one's).
const WEBHOOK_SUFFIX: &str = ".sidecar-injector.io";
/// What `tag` calls the revision whose webhooks have no revision in their names (the bare paths).
pub const DEFAULT_REVISION: &str = sidecar_injector_core::settings::DEFAULT_REVISION;

/// The name of a tag's webhook configurations (one of each kind).
pub fn configuration_name(tag: &Tag) -> String {
    format!("{CONFIGURATION}-tag-{tag}")
}

/// Why a tag cannot be made from a revision's webhooks.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TagError {
    /// The revision has no webhook in the configuration.
    #[error("revision {revision:?} has no webhooks in the {kind} {CONFIGURATION} (its revisions: {found})")]
    NoRevision {
        /// The revision asked for.
        revision: String,
        /// `MutatingWebhookConfiguration` or `ValidatingWebhookConfiguration`.
        kind: &'static str,
        /// The revisions it has.
        found: String,
    },
    /// The tag has a revision's name: a namespace labelled with it would be selected twice.
    #[error("{0:?} is a revision's name: a namespace labelled with it would be that revision's and the tag's")]
    NamesARevision(String),
    /// A webhook of the revision calls neither a Service path nor a URL.
    #[error("webhook {0} has no clientConfig to call")]
    NoClientConfig(String),
}

/// The revision a webhook of the revisions' configuration serves, from its name; `None` for one of no revision.
fn revision_of(webhook: &Value) -> Option<&str> {
    let name = webhook["name"].as_str()?.strip_suffix(WEBHOOK_SUFFIX)?;
    match name.rsplit_once('.') {
        Some((revision, _kind)) => Some(revision),
        None => Some(DEFAULT_REVISION),
    }
}

/// The revisions whose webhooks the revisions' configuration holds, each once, in order.
pub fn revisions(configuration: &Value) -> Vec<&str> {
    let mut found: Vec<&str> = Vec::new();
    for revision in webhooks(configuration).iter().filter_map(revision_of) {
        if !found.contains(&revision) {
            found.push(revision);
        }
    }
    found
}

fn webhooks(configuration: &Value) -> &[Value] {
    configuration["webhooks"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// The tag's webhook configuration of `configuration`'s kind: the webhooks of `revision` in `configuration` (the
/// revisions' own), each named `TAG.tag.NAME`, calling its path with `/tag/TAG`, for the namespaces labelled
/// `<prefix>rev=TAG` (and still none of the system namespaces its selector leaves out).
pub fn derive(tag: &Tag, revision: &str, configuration: &Value, keys: &Keys) -> Result<Value, TagError> {
    let revisions = revisions(configuration);
    if revisions.contains(&tag.as_str()) || tag.as_str() == DEFAULT_REVISION {
        return Err(TagError::NamesARevision(tag.to_string()));
    }
    let kind = if configuration["kind"] == "ValidatingWebhookConfiguration" {
        "ValidatingWebhookConfiguration"
    } else {
        "MutatingWebhookConfiguration"
    };
    let mut derived = Vec::new();
    for webhook in webhooks(configuration).iter().filter(|w| revision_of(w) == Some(revision)) {
        let mut webhook = webhook.clone();
        let name = webhook["name"].as_str().unwrap_or_default().to_owned();
        webhook["name"] = json!(format!("{tag}.tag.{name}"));
        let client = &mut webhook["clientConfig"];
        let suffix = format!("/tag/{tag}");
        if let Some(url) = client["url"].as_str() {
            client["url"] = json!(format!("{}{suffix}", url.trim_end_matches('/')));
        } else if client["service"].is_object() {
            let path = client["service"]["path"].as_str().unwrap_or_default().trim_end_matches('/').to_owned();
            client["service"]["path"] = json!(format!("{path}{suffix}"));
        } else {
            return Err(TagError::NoClientConfig(name));
        }
        webhook["namespaceSelector"] = tag_selector(&webhook["namespaceSelector"], tag, keys);
        derived.push(webhook);
    }
    if derived.is_empty() {
        let found = if revisions.is_empty() { "none".to_owned() } else { revisions.join(", ") };
        return Err(TagError::NoRevision { revision: revision.to_owned(), kind, found });
    }
    let source = &configuration["metadata"];
    let mut labels = source["labels"].as_object().cloned().unwrap_or_default();
    labels.insert(TAG_LABEL.to_owned(), json!(tag.as_str()));
    labels.insert(REVISION_LABEL.to_owned(), json!(revision));
    // cert-manager's CA injector keeps a tag's caBundle as it keeps the revision's (its annotation says from where).
    let annotations: serde_json::Map<String, Value> = (source["annotations"].as_object().into_iter().flatten())
        .filter(|(key, _)| !key.starts_with("kubectl.kubernetes.io/"))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let mut metadata = json!({"name": configuration_name(tag), "labels": labels});
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    Ok(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "webhooks": derived,
    }))
}

/// The revision's namespace selector made the tag's: what it says of `<prefix>rev` and `<prefix>inject` replaced by
/// `<prefix>rev In [TAG]`, the rest (the system namespaces left out) kept.
fn tag_selector(selector: &Value, tag: &Tag, keys: &Keys) -> Value {
    let ours = |key: &str| key == keys.rev || key == keys.inject;
    let mut expressions = vec![json!({"key": keys.rev, "operator": "In", "values": [tag.as_str()]})];
    let kept = selector["matchExpressions"].as_array().into_iter().flatten();
    expressions.extend(kept.filter(|e| !ours(e["key"].as_str().unwrap_or_default())).cloned());
    let mut tagged = json!({"matchExpressions": expressions});
    let labels: serde_json::Map<String, Value> = (selector["matchLabels"].as_object().into_iter().flatten())
        .filter(|(key, _)| !ours(key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    if !labels.is_empty() {
        tagged["matchLabels"] = Value::Object(labels);
    }
    tagged
}

/// The tags the cluster's tag configurations (those labelled [`TAG_LABEL`]) define, each with its revision.
pub fn pointed(configurations: &[Value]) -> BTreeMap<String, String> {
    configurations
        .iter()
        .filter_map(|c| {
            let labels = &c["metadata"]["labels"];
            Some((labels[TAG_LABEL].as_str()?.to_owned(), labels[REVISION_LABEL].as_str()?.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new(sidecar_injector_core::settings::DEFAULT_PREFIX)
    }

    fn webhook(name: &str, path: &str, selector: Value) -> Value {
        json!({
            "name": name,
            "clientConfig": {"service": {"name": "sidecar-injector", "namespace": "sidecar-injector", "path": path},
                             "caBundle": "Q0E="},
            "namespaceSelector": selector,
            "objectSelector": {"matchExpressions": [{"key": "sidecar-injector.io/inject", "operator": "NotIn",
                                                      "values": ["false"]}]},
            "failurePolicy": "Ignore",
        })
    }

    fn system() -> Value {
        json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]})
    }

    fn configuration() -> Value {
        let default = json!({"matchLabels": {"sidecar-injector.io/inject": "enabled"}, "matchExpressions": [
            {"key": "sidecar-injector.io/rev", "operator": "DoesNotExist"}, system()]});
        let canary = json!({"matchExpressions": [
            {"key": "sidecar-injector.io/rev", "operator": "In", "values": ["canary"]}, system()]});
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "sidecar-injector", "labels": {"app.kubernetes.io/name": "sidecar-injector"},
                         "annotations": {"cert-manager.io/inject-ca-from": "sidecar-injector/serving",
                                         "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                         "resourceVersion": "7", "uid": "u"},
            "webhooks": [webhook("inject.sidecar-injector.io", "/mutate", default),
                         webhook("canary.inject.sidecar-injector.io", "/mutate/canary", canary)],
        })
    }

    #[test]
    fn a_tag_is_its_revisions_webhooks_renamed_for_its_namespaces_through_its_path() {
        let prod = Tag::new("prod").unwrap();
        let tagged = derive(&prod, "canary", &configuration(), &keys()).unwrap();
        let mut expected = webhook(
            "prod.tag.canary.inject.sidecar-injector.io",
            "/mutate/canary/tag/prod",
            json!({"matchExpressions": [{"key": "sidecar-injector.io/rev", "operator": "In", "values": ["prod"]},
                                        system()]}),
        );
        assert_eq!(tagged["webhooks"], json!([expected.clone()]));
        assert_eq!(
            tagged["metadata"],
            json!({
                "name": "sidecar-injector-tag-prod",
                "labels": {"app.kubernetes.io/name": "sidecar-injector", TAG_LABEL: "prod", REVISION_LABEL: "canary"},
                "annotations": {"cert-manager.io/inject-ca-from": "sidecar-injector/serving"},
            })
        );
        assert_eq!(tagged["kind"], "MutatingWebhookConfiguration");

        // The default revision's: its opt-in label and the `rev` exclusion give way to the tag.
        let tagged = derive(&prod, DEFAULT_REVISION, &configuration(), &keys()).unwrap();
        expected["name"] = json!("prod.tag.inject.sidecar-injector.io");
        expected["clientConfig"]["service"]["path"] = json!("/mutate/tag/prod");
        assert_eq!(tagged["webhooks"], json!([expected]));

        // A webhook called by URL (a server outside the cluster) gets the same path.
        let mut by_url = configuration();
        by_url["webhooks"][1]["clientConfig"] = json!({"url": "https://10.0.0.1:8443/mutate/canary"});
        let tagged = derive(&prod, "canary", &by_url, &keys()).unwrap();
        assert_eq!(tagged["webhooks"][0]["clientConfig"]["url"], "https://10.0.0.1:8443/mutate/canary/tag/prod");
    }

    #[test]
    fn a_tag_needs_its_revision_and_a_name_of_its_own() {
        let config = configuration();
        assert_eq!(revisions(&config), ["default", "canary"]);
        assert_eq!(
            derive(&Tag::new("prod").unwrap(), "blue", &config, &keys()).unwrap_err().to_string(),
            "revision \"blue\" has no webhooks in the MutatingWebhookConfiguration sidecar-injector (its revisions: \
             default, canary)"
        );
        for name in ["canary", "default"] {
            assert_eq!(
                derive(&Tag::new(name).unwrap(), "canary", &config, &keys()),
                Err(TagError::NamesARevision(name.to_owned()))
            );
        }
    }

    #[test]
    fn the_tags_are_read_from_their_labels() {
        let prod = derive(&Tag::new("prod").unwrap(), "canary", &configuration(), &keys()).unwrap();
        let stable = derive(&Tag::new("stable").unwrap(), "default", &configuration(), &keys()).unwrap();
        let pointed = pointed(&[prod, stable, configuration()]);
        assert_eq!(
            pointed.into_iter().collect::<Vec<_>>(),
            [("prod".to_owned(), "canary".to_owned()), ("stable".to_owned(), "default".to_owned())]
        );
    }
}
