//! Per-request rendering of the few pod-dependent leaves of a template, with minijinja.
//!
//! Every leaf is compiled once, when the template loads. A leaf that is exactly one expression (`{{ expr }}`)
//! renders with JSON auto-escaping, so its output is the JSON form of the value (a string, a number, a map...).
//! A leaf that mixes text and expressions (`proxy-{{ pod.name }}`) renders as text and is then written as a
//! JSON string by our escaper. Either way, whatever bytes the pod carries end up correctly escaped JSON.

use std::ops::Range;

use minijinja::value::Serde;
use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};
use serde::Serialize;

/// Names a template may use: the pod being admitted and the template's `values`.
const KNOWN_VARIABLES: [&str; 2] = ["pod", "values"];

/// One leaf expression.
#[derive(Debug)]
struct Leaf {
    /// The leaf's name in the environment; its extension selects the escaping.
    name: String,
    /// `{{ expr }}` alone: renders to JSON. Otherwise text, JSON-escaped after rendering.
    whole: bool,
}

/// How a leaf was classified when it was compiled.
#[derive(Debug)]
pub(crate) enum LeafKind {
    /// Depends only on `values`: already rendered, as JSON.
    Static(serde_json::Value),
    /// Depends on the pod: rendered per request into slot `n`.
    Dynamic(usize),
}

/// The compiled leaves of one template.
#[derive(Debug)]
pub(crate) struct Renderer {
    env: Environment<'static>,
    leaves: Vec<Leaf>,
    values: Value,
    needs_labels: bool,
    needs_annotations: bool,
}

/// The pod as templates see it: `pod.name`, `pod.generateName`, `pod.namespace`, `pod.serviceAccountName`,
/// `pod.labels`, `pod.annotations`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PodContext<'a, M: Serialize> {
    pub name: &'a str,
    pub generate_name: &'a str,
    pub namespace: &'a str,
    pub service_account_name: &'a str,
    pub labels: M,
    pub annotations: M,
}

/// Does `source` use template syntax at all?
pub(crate) fn is_template(source: &str) -> bool {
    source.contains("{{") || source.contains("{%")
}

impl Renderer {
    pub(crate) fn new(values: &serde_json::Value) -> Self {
        let mut env = Environment::new();
        // A typo in a variable name must fail loudly, at load time, not render as an empty string.
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|name| if name.ends_with(".json") { AutoEscape::Json } else { AutoEscape::None });
        Renderer {
            env,
            leaves: Vec::new(),
            values: Value::from(Serde(values)),
            needs_labels: false,
            needs_annotations: false,
        }
    }

    /// Compiles one leaf. Values-only leaves are rendered now and come back as JSON; pod-dependent ones get a
    /// slot. The error is a one-line reason.
    pub(crate) fn add_leaf(&mut self, source: &str) -> Result<LeafKind, String> {
        let trimmed = source.trim();
        let whole = trimmed.starts_with("{{")
            && trimmed.ends_with("}}")
            && trimmed[2..trimmed.len() - 2].find("{{").is_none()
            && trimmed[2..trimmed.len() - 2].find("}}").is_none();
        let index = self.leaves.len();
        let name = format!("leaf{index}.{}", if whole { "json" } else { "txt" });
        let body = if whole { trimmed.to_owned() } else { source.to_owned() };
        self.env.add_template_owned(name.clone(), body).map_err(|e| describe(&e))?;
        let template = self.env.get_template(&name).map_err(|e| describe(&e))?;
        let top = template.undeclared_variables(false);
        if let Some(unknown) = top.iter().find(|v| !KNOWN_VARIABLES.contains(&v.as_str())) {
            return Err(format!("unknown variable `{unknown}` (a template can use `pod` and `values`)"));
        }
        if !top.contains("pod") {
            let ctx = minijinja::context! { values => self.values.clone() };
            let text = template.render(ctx).map_err(|e| describe(&e))?;
            return leaf_json(whole, text).map(LeafKind::Static);
        }
        for var in template.undeclared_variables(true) {
            self.needs_labels |= var == "pod" || var.starts_with("pod.labels");
            self.needs_annotations |= var == "pod" || var.starts_with("pod.annotations");
        }
        self.leaves.push(Leaf { name, whole });
        Ok(LeafKind::Dynamic(index))
    }

    /// True when the template has pod-dependent leaves at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }

    pub(crate) fn needs_labels(&self) -> bool {
        self.needs_labels
    }

    pub(crate) fn needs_annotations(&self) -> bool {
        self.needs_annotations
    }

    /// Renders every pod-dependent leaf for `pod`, appending JSON text to `buf` and one range per slot.
    pub(crate) fn render<M: Serialize>(
        &self,
        pod: &PodContext<'_, M>,
        buf: &mut Vec<u8>,
        ranges: &mut Vec<Range<usize>>,
    ) -> Result<(), RenderError> {
        buf.clear();
        ranges.clear();
        let ctx = minijinja::context! { pod => Value::from(Serde(pod)), values => self.values.clone() };
        for (slot, leaf) in self.leaves.iter().enumerate() {
            let template = self.env.get_template(&leaf.name).map_err(|e| RenderError { slot, reason: describe(&e) })?;
            let text = template.render(&ctx).map_err(|e| RenderError { slot, reason: describe(&e) })?;
            let start = buf.len();
            if leaf.whole {
                buf.extend_from_slice(text.as_bytes());
            } else {
                crate::json::write_str(buf, &text);
            }
            ranges.push(start..buf.len());
        }
        Ok(())
    }
}

/// A leaf that failed to render for a particular pod.
#[derive(Debug, Clone)]
pub(crate) struct RenderError {
    pub slot: usize,
    pub reason: String,
}

/// The JSON value of a rendered leaf.
pub(crate) fn leaf_json(whole: bool, text: String) -> Result<serde_json::Value, String> {
    if whole {
        serde_json::from_str(&text).map_err(|e| format!("expression did not render to JSON ({e}): {text}"))
    } else {
        Ok(serde_json::Value::String(text))
    }
}

/// minijinja's message without its multi-line source excerpt.
fn describe(err: &minijinja::Error) -> String {
    let mut reason = err.kind().to_string();
    if let Some(detail) = err.detail() {
        reason.push_str(": ");
        reason.push_str(detail);
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodContext<'static, std::collections::BTreeMap<&'static str, &'static str>> {
        PodContext {
            name: "web-1",
            generate_name: "",
            namespace: "shop",
            service_account_name: "default",
            labels: [("app", "we\"b\\\n\u{2028}")].into_iter().collect(),
            annotations: Default::default(),
        }
    }

    #[test]
    fn values_only_leaves_render_at_compile_time() {
        let mut r = Renderer::new(&serde_json::json!({"image": "proxy:1", "port": 15001, "res": {"cpu": "10m"}}));
        assert!(matches!(r.add_leaf("{{ values.image }}"), Ok(LeafKind::Static(v)) if v == "proxy:1"));
        assert!(matches!(r.add_leaf(" {{ values.port }} "), Ok(LeafKind::Static(v)) if v == 15001));
        assert!(matches!(r.add_leaf("{{ values.res }}"), Ok(LeafKind::Static(v)) if v["cpu"] == "10m"));
        assert!(matches!(r.add_leaf("p:{{ values.port }}"), Ok(LeafKind::Static(v)) if v == "p:15001"));
        assert!(r.is_empty());
    }

    #[test]
    fn pod_leaves_render_per_request_and_escape_hostile_bytes() {
        let mut r = Renderer::new(&serde_json::json!({}));
        assert!(matches!(r.add_leaf("{{ pod.labels.app }}"), Ok(LeafKind::Dynamic(0))));
        assert!(matches!(r.add_leaf("svc-{{ pod.labels.app }}.{{ pod.namespace }}"), Ok(LeafKind::Dynamic(1))));
        assert!(r.needs_labels() && !r.needs_annotations());
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        r.render(&pod(), &mut buf, &mut ranges).unwrap();
        let first: String = serde_json::from_slice(&buf[ranges[0].clone()]).unwrap();
        let second: String = serde_json::from_slice(&buf[ranges[1].clone()]).unwrap();
        assert_eq!(first, "we\"b\\\n\u{2028}");
        assert_eq!(second, "svc-we\"b\\\n\u{2028}.shop");
    }

    #[test]
    fn typos_and_syntax_errors_are_refused() {
        let mut r = Renderer::new(&serde_json::json!({"image": "x"}));
        assert!(r.add_leaf("{{ value.image }}").unwrap_err().contains("unknown variable `value`"));
        assert!(r.add_leaf("{{ values.imag }}").unwrap_err().contains("undefined"));
        assert!(r.add_leaf("{{ values.image ").is_err());
    }

    #[test]
    fn a_missing_label_fails_at_render_time_unless_defaulted() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.labels.version }}").unwrap();
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        assert!(r.render(&pod(), &mut buf, &mut ranges).is_err());
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.labels.version | default('v0') }}").unwrap();
        r.render(&pod(), &mut buf, &mut ranges).unwrap();
        assert_eq!(&buf[ranges[0].clone()], b"\"v0\"");
    }
}
