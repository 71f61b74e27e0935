//! Per-request rendering of the few pod-dependent leaves of a template, with minijinja.
//!
//! Every leaf is compiled once, when the template loads, into a template whose output is JSON. The environment
//! auto-escapes as JSON, with a formatter that serialises whatever a `{{ ... }}` prints (an undefined value is an
//! error): so a leaf that is exactly one expression (`{{ expr }}`) keeps its type (a string, a number, a map...),
//! and a leaf that mixes text and expressions (`proxy-{{ pod.name }}`) is rendered as plain text inside
//! `{% filter tojson %}`, so it becomes a JSON string. Whatever bytes the pod carries, and even a `| safe` in the
//! template, the output is valid, correctly escaped JSON.
//!
//! Per request, all the pod-dependent leaves are rendered by one evaluation of one template that joins them with a
//! separator byte JSON never leaves raw in its output, so the cost of setting up an evaluation is paid once.
//!
//! Rendering is a pure function of what the leaves read of the pod, and the pods of one controller give the same
//! answers to what templates usually read (labels, service account, namespace). So each thread remembers the last
//! few renders, each with the record of what it read ([`LeafCache`], [`Dependencies`]): a pod that gives the same
//! answers costs a comparison, not an evaluation.
//!
//! The pod reaches minijinja as one owned object ([`PodObject`]) whose fields and labels are looked up when an
//! expression reads them, and noted as read, rather than as a minijinja map built from every field and label: the
//! default template reads a few of them.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use minijinja::value::Serde;
use minijinja::{AutoEscape, Environment, Output, State, UndefinedBehavior, Value};

use super::leaf_cache::LeafCache;
use super::pod_context::{ContainerEntries, PodContext, PodObject, Reads, StrEntries, encode_containers};

/// Names a template may use: the pod being admitted and the template's `values`.
const KNOWN_VARIABLES: [&str; 2] = ["pod", "values"];

/// Separates the leaves in the output of the joined template. A control character: JSON text never contains one
/// unescaped, so it cannot come out of a leaf.
const SEPARATOR: char = '\u{1e}';

/// Prints a value as JSON where the environment auto-escapes as JSON (every leaf, outside the text of a mixed
/// leaf), straight into the output. Strict undefined already refuses a plain undefined value before this is
/// called; the "silent" one of an `if` without `else` is refused here rather than printed as `null`.
fn json_formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), minijinja::Error> {
    if *state.auto_escape() != AutoEscape::Json {
        return minijinja::escape_formatter(out, state, value);
    }
    if value.is_undefined() {
        let why = "the expression is undefined (an `if` without an `else`?): give it an `else`, or `| default(...)`";
        return Err(minijinja::Error::new(minijinja::ErrorKind::UndefinedError, why));
    }
    serde_json::to_writer(OutputWriter(out), value)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::BadSerialization, e.to_string()))
}

/// minijinja's output as the `io::Write` serde_json writes to. serde_json writes only whole UTF-8 sequences
/// (it writes `str`s, or ASCII), so each chunk is valid text on its own.
struct OutputWriter<'a, 'b>(&'a mut Output<'b>);

impl std::io::Write for OutputWriter<'_, '_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let text = std::str::from_utf8(bytes).map_err(std::io::Error::other)?;
        std::fmt::Write::write_str(self.0, text).map_err(std::io::Error::other)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The name of the template that renders every pod-dependent leaf at once.
const POD_LEAVES: &str = "pod-leaves";
/// The name of the template that renders every leaf that depends on an overridable value (and not on the pod).
const OVERRIDE_LEAVES: &str = "override-leaves";

/// How a leaf was classified when it was compiled.
#[derive(Debug)]
pub(crate) enum LeafKind {
    /// Depends only on `values` that no pod can override: already rendered, as JSON.
    Static(serde_json::Value),
    /// Depends on the pod or on an overridable value: rendered per request into slot `n`.
    Dynamic(usize),
}

/// The compiled leaves of one template.
///
/// Two groups of leaves are rendered per request, each by one evaluation: those that read the pod, and those
/// that read only `values` some of which a pod may override. The second group's output without overrides is
/// rendered at load, so a pod without override annotations costs a copy there, not an evaluation.
#[derive(Debug)]
pub(crate) struct Renderer {
    /// Unique to this renderer, so that a cache never serves the output of a previous template.
    id: u64,
    env: Environment<'static>,
    /// The JSON-producing source of each per-request leaf, by slot; each is also a template named `leaf<slot>`.
    leaves: Vec<String>,
    /// The slots of the pod-dependent leaves and of the override-only leaves, each in slot order.
    pod_slots: Vec<usize>,
    override_slots: Vec<usize>,
    /// The override-only leaves rendered with the template's own values, joined by the separator.
    override_defaults: String,
    values_json: serde_json::Value,
    values: Value,
    /// The keys of `values` that pods may override.
    overridable: Vec<String>,
    /// The fields of the pod the pod-dependent leaves read.
    reads: Reads,
}

/// Validated per-pod overrides: `(key of values, value)`.
pub(crate) type Overrides = [(String, serde_json::Value)];

/// Does `source` use template syntax at all?
pub(crate) fn is_template(source: &str) -> bool {
    source.contains("{{") || source.contains("{%")
}

/// What [`json_source`] puts around a leaf of text and expressions.
const TEXT_LEAF_START: &str = "{% autoescape false %}{% filter tojson %}";
const TEXT_LEAF_END: &str = "{% endfilter %}{% endautoescape %}";

/// The leaf rewritten so that it renders to JSON (see the module documentation).
fn json_source(source: &str) -> String {
    let trimmed = source.trim();
    let inner = trimmed.strip_prefix("{{").and_then(|t| t.strip_suffix("}}"));
    match inner {
        // One expression: the formatter prints its value as JSON, whatever its type.
        Some(expr) if !expr.contains("{{") && !expr.contains("}}") => trimmed.to_owned(),
        // The text is rendered plain and then made one JSON string; the outer `autoescape false` prints that
        // string as it is, rather than serialising it a second time.
        _ => format!("{TEXT_LEAF_START}{source}{TEXT_LEAF_END}"),
    }
}

impl Renderer {
    /// A renderer over `values`, none of which a pod may override.
    #[cfg(test)]
    pub(crate) fn new(values: &serde_json::Value) -> Self {
        Self::with_overridable(values, Vec::new())
    }

    /// A renderer over `values`, of which the keys `overridable` may be replaced per pod.
    pub(crate) fn with_overridable(values: &serde_json::Value, overridable: Vec<String>) -> Self {
        let mut env = Environment::new();
        // A typo in a variable name must fail loudly, at load time, not render as an empty string.
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| AutoEscape::Json);
        env.set_formatter(json_formatter);
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Renderer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            env,
            leaves: Vec::new(),
            pod_slots: Vec::new(),
            override_slots: Vec::new(),
            override_defaults: String::new(),
            values_json: values.clone(),
            values: Value::from(Serde(values)),
            overridable,
            reads: Reads::default(),
        }
    }

    /// Compiles one leaf. Values-only leaves are rendered now and come back as JSON; pod-dependent ones get a
    /// slot.
    pub(crate) fn add_leaf(&mut self, source: &str) -> Result<LeafKind, LeafError> {
        let slot = self.leaves.len();
        let json = json_source(source);
        let name = format!("leaf{slot}");
        self.env.add_template_owned(name.clone(), json.clone())?;
        let template = self.env.get_template(&name)?;
        let top = template.undeclared_variables(false);
        if let Some(unknown) = top.iter().find(|v| !KNOWN_VARIABLES.contains(&v.as_str())) {
            return Err(LeafError::UnknownVariable(unknown.clone()));
        }
        let nested = template.undeclared_variables(true);
        let reads_pod = top.contains("pod");
        let reads_overridable = nested.iter().any(|var| {
            // `values` read whole (or by subscript, which is not tracked by name) may read any key.
            var == "values" && !self.overridable.is_empty()
                || self.overridable.iter().any(|key| {
                    var.strip_prefix("values.")
                        .and_then(|rest| rest.strip_prefix(key.as_str()))
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
                })
        });
        if !reads_pod {
            let ctx = minijinja::context! { values => self.values.clone() };
            let text = template.render(ctx).map_err(|e| match self.undefined_values(&e, &nested) {
                Some(names) => LeafError::UndefinedValue(names),
                None => LeafError::Expression(e),
            })?;
            let value: serde_json::Value = match serde_json::from_str(&text) {
                Ok(value) => value,
                Err(source) => return Err(LeafError::NotJson { text, source }),
            };
            if !reads_overridable {
                self.env.remove_template(&name);
                return Ok(LeafKind::Static(value));
            }
            if !self.override_slots.is_empty() {
                self.override_defaults.push(SEPARATOR);
            }
            self.override_defaults.push_str(&text);
            self.override_slots.push(slot);
        } else {
            self.reads = nested.iter().fold(self.reads, |reads, var| reads.union(Reads::of(var)));
            self.pod_slots.push(slot);
        }
        self.leaves.push(json);
        for (group, slots) in [(POD_LEAVES, &self.pod_slots), (OVERRIDE_LEAVES, &self.override_slots)] {
            let joined =
                slots.iter().map(|s| self.leaves[*s].as_str()).collect::<Vec<_>>().join(&SEPARATOR.to_string());
            self.env.add_template_owned(group, joined)?;
        }
        Ok(LeafKind::Dynamic(slot))
    }

    /// The local slots of the leaves that read only overridable values, each with its output when no pod
    /// overrides anything (JSON text).
    pub(crate) fn override_defaults(&self) -> impl Iterator<Item = (usize, &str)> {
        self.override_slots.iter().copied().zip(self.override_defaults.split(SEPARATOR))
    }

    /// How many per-request leaves (slots) this renderer has.
    pub(crate) fn slots(&self) -> usize {
        self.leaves.len()
    }

    /// The leaf of local slot `slot` as written (before [`json_source`] wrapped it), and the values it reads.
    pub(crate) fn leaf_source(&self, slot: usize) -> Option<(&str, &serde_json::Value)> {
        let json = self.leaves.get(slot)?;
        let source =
            json.strip_prefix(TEXT_LEAF_START).and_then(|rest| rest.strip_suffix(TEXT_LEAF_END)).unwrap_or(json);
        Some((source, &self.values_json))
    }

    /// True when the template has no per-request leaves at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }

    /// The fields of the pod this renderer's leaves read.
    pub(crate) fn reads(&self) -> Reads {
        self.reads
    }

    /// Appends the output of every per-request leaf for `pod` and its `overrides` to `buf` (JSON text), and one
    /// range per slot to `ranges`, or copies them from `cache` when this renderer already rendered the same input
    /// on this thread.
    pub(crate) fn render_cached<M: StrEntries, C: ContainerEntries>(
        &self,
        pod: &PodContext<'_, M, C>,
        overrides: &Overrides,
        cache: &mut LeafCache,
        buf: &mut Vec<u8>,
        ranges: &mut Vec<Range<usize>>,
    ) -> Result<(), RenderError> {
        if self.pod_slots.is_empty() && overrides.is_empty() {
            // Only override-only leaves, and no override: their output was rendered at load.
            return self.render(pod, overrides, buf, ranges);
        }
        cache.overrides.clear();
        if !overrides.is_empty() {
            serde_json::to_writer(&mut cache.overrides, overrides).expect("JSON values always serialise");
        }
        cache.containers.clear();
        if self.reads.containers() {
            encode_containers(&pod.containers, &mut cache.containers);
        }
        if cache.answer(self.id, pod, buf, ranges) {
            return Ok(());
        }
        let (base, first) = (buf.len(), ranges.len());
        let containers = self.reads.containers().then_some(cache.containers.as_slice());
        let seen = self.render_noting_reads(pod, containers, overrides, buf, ranges)?;
        match seen {
            Some(seen) => cache.dependencies.record(&seen, pod, &cache.containers),
            None => cache.dependencies.clear(),
        }
        cache.remember(self.id, &buf[base..], &ranges[first..], base);
        Ok(())
    }

    /// Appends the output of every per-request leaf for `pod` and its `overrides` to `buf` (JSON text), and one
    /// range per slot to `ranges`.
    pub(crate) fn render<M: StrEntries, C: ContainerEntries>(
        &self,
        pod: &PodContext<'_, M, C>,
        overrides: &Overrides,
        buf: &mut Vec<u8>,
        ranges: &mut Vec<Range<usize>>,
    ) -> Result<(), RenderError> {
        let containers = self.encoded_containers(pod);
        self.render_noting_reads(pod, containers.as_deref(), overrides, buf, ranges).map(drop)
    }

    /// The pod's containers as [`encode_containers`] writes them, when this renderer's leaves read them.
    fn encoded_containers<M: StrEntries, C: ContainerEntries>(&self, pod: &PodContext<'_, M, C>) -> Option<Vec<u8>> {
        self.reads.containers().then(|| {
            let mut encoded = Vec::new();
            encode_containers(&pod.containers, &mut encoded);
            encoded
        })
    }

    /// [`Renderer::render`], which also returns the pod as the leaves saw it, with what they read of it noted;
    /// `None` when no leaf was evaluated (so none read anything). `containers` is the pod's containers as
    /// [`encode_containers`] writes them, when this renderer reads them.
    fn render_noting_reads<M: StrEntries, C: ContainerEntries>(
        &self,
        pod: &PodContext<'_, M, C>,
        containers: Option<&[u8]>,
        overrides: &Overrides,
        buf: &mut Vec<u8>,
        ranges: &mut Vec<Range<usize>>,
    ) -> Result<Option<Arc<PodObject>>, RenderError> {
        if self.leaves.is_empty() {
            return Ok(None);
        }
        let first = ranges.len();
        ranges.resize(first + self.leaves.len(), 0..0);
        let mine = &mut ranges[first..];
        let overridden = values_overridden(&self.overridable, overrides);
        // An evaluation only when some leaf needs one: the override-only leaves without an override of theirs were
        // rendered at load.
        let evaluation = (!self.pod_slots.is_empty() || overridden).then(|| {
            let seen = pod.to_object(self.reads, containers);
            let values = self.values_with(overrides);
            let ctx = minijinja::context! { pod => Value::from_dyn_object(seen.clone()), values => values };
            (seen, ctx)
        });
        if let (false, Some((_, ctx))) = (self.pod_slots.is_empty(), &evaluation) {
            let start = buf.len();
            self.render_group(POD_LEAVES, ctx, buf)?;
            split_in_place(buf, start, &self.pod_slots, mine)?;
        }
        if !self.override_slots.is_empty() {
            let start = buf.len();
            match &evaluation {
                Some((_, ctx)) if overridden => self.render_group(OVERRIDE_LEAVES, ctx, buf)?,
                _ => buf.extend_from_slice(self.override_defaults.as_bytes()),
            }
            split_in_place(buf, start, &self.override_slots, mine)?;
        }
        Ok(evaluation.map(|(seen, _)| seen))
    }

    /// Appends the output of the joined template `group` (its leaves' JSON, separated) to `buf`; on failure `buf`
    /// is left as it was.
    fn render_group(&self, group: &str, ctx: &Value, buf: &mut Vec<u8>) -> Result<(), RenderError> {
        let text = self.env.get_template(group).and_then(|t| t.render(ctx));
        let text = text.map_err(|_| self.first_failure(ctx))?;
        buf.extend_from_slice(text.as_bytes());
        Ok(())
    }

    /// The template's values with the pod's overrides of this renderer's overridable keys.
    fn values_with(&self, overrides: &Overrides) -> Value {
        if !values_overridden(&self.overridable, overrides) {
            return self.values.clone();
        }
        let mut values = self.values_json.clone();
        for (key, value) in overrides {
            if self.overridable.contains(key) {
                values[key.as_str()] = value.clone();
            }
        }
        Value::from(Serde(values))
    }

    /// Which leaf fails, and why: each is rendered alone. Only taken when the joined render failed.
    #[cold]
    fn first_failure(&self, ctx: &Value) -> RenderError {
        self.failures(ctx).next().unwrap_or_else(|| RenderError {
            slot: 0,
            reason: "the leaves failed together but not one by one".to_owned(),
        })
    }

    /// Every leaf that fails for `ctx`, each rendered alone, in slot order.
    fn failures<'a>(&'a self, ctx: &'a Value) -> impl Iterator<Item = RenderError> + 'a {
        (0..self.leaves.len()).filter_map(move |slot| {
            let template = match self.env.get_template(&format!("leaf{slot}")) {
                Ok(template) => template,
                Err(e) => return Some(RenderError { slot, reason: describe(&e) }),
            };
            let error = template.render(ctx).err()?;
            let named = self.undefined_values(&error, &template.undeclared_variables(true));
            let reason = match named {
                Some(names) => format!("undefined value: {names}"),
                None => describe(&error),
            };
            Some(RenderError { slot, reason })
        })
    }

    /// Every leaf that fails to render for `pod` (without overrides): what a template's check lists, where a
    /// request stops at the first.
    pub(crate) fn all_failures<M: StrEntries, C: ContainerEntries>(
        &self,
        pod: &PodContext<'_, M, C>,
    ) -> Vec<RenderError> {
        let ctx = minijinja::context! {
            pod => Value::from_dyn_object(pod.to_object(self.reads, self.encoded_containers(pod).as_deref())),
            values => self.values.clone(),
        };
        self.failures(&ctx).collect()
    }
}

impl Renderer {
    /// For an undefined-value error that does not say which name (minijinja names `pod.labels.x`, not a missing key
    /// of `values`): each `values.…` the leaf reads (`nested`) that the template's values lack, with the closest
    /// key there is. `None` for another error, or when every name is defined.
    #[cold]
    fn undefined_values(&self, error: &minijinja::Error, nested: &std::collections::HashSet<String>) -> Option<String> {
        if error.kind() != minijinja::ErrorKind::UndefinedError {
            return None;
        }
        // minijinja names some undefined reads itself: a pod's are left to its message.
        let named = undefined_name(error);
        if named.is_some_and(|name| !name.starts_with("values.")) {
            return None;
        }
        let mut found: Vec<String> = nested
            .iter()
            .filter(|var| named.is_none_or(|name| name == var.as_str()))
            .filter_map(|var| var.strip_prefix("values."))
            .filter_map(|rest| {
                let mut at = &self.values_json;
                let mut walked = String::from("values");
                for key in rest.split('.') {
                    let Some(next) = at.get(key) else {
                        let keys: Vec<&str> =
                            at.as_object().into_iter().flat_map(|o| o.keys().map(String::as_str)).collect();
                        let hint = match crate::suggest::closest(key, keys.iter().copied()) {
                            Some(close) => format!(" (did you mean `{walked}.{close}`?)"),
                            None => format!(" (`{walked}` has: {})", keys.join(", ")),
                        };
                        return Some(format!("`{walked}.{key}` is undefined{hint}"));
                    };
                    at = next;
                    walked.push('.');
                    walked.push_str(key);
                }
                None
            })
            .collect();
        found.sort();
        found.dedup();
        (!found.is_empty()).then(|| found.join("; "))
    }
}

/// Does `overrides` set any of `overridable`?
fn values_overridden(overridable: &[String], overrides: &Overrides) -> bool {
    overrides.iter().any(|(key, _)| overridable.contains(key))
}

/// Records where each leaf's output lies in `buf[start..]` (the outputs of `slots`, joined by the separator), at
/// its slot in `ranges`.
fn split_in_place(buf: &[u8], start: usize, slots: &[usize], ranges: &mut [Range<usize>]) -> Result<(), RenderError> {
    let mut parts = buf[start..].split(|byte| *byte == SEPARATOR as u8);
    let mut offset = start;
    for slot in slots {
        // JSON output never holds a raw control character, so the parts match the slots; refuse rather than
        // mis-slot if they ever did not.
        let part = parts.next().ok_or_else(|| RenderError { slot: *slot, reason: "missing leaf output".into() })?;
        ranges[*slot] = offset..offset + part.len();
        offset += part.len() + 1;
    }
    match parts.next() {
        None => Ok(()),
        Some(_) => Err(RenderError { slot: 0, reason: "leaf output held a control character".to_owned() }),
    }
}

/// A leaf that failed to render for a particular pod.
#[derive(Debug, Clone)]
pub(crate) struct RenderError {
    pub slot: usize,
    pub reason: String,
}

/// minijinja's message without its multi-line source excerpt.
/// Why a leaf (a string with an expression) could not be compiled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeafError {
    /// The expression does not compile, or (reading only values) does not render.
    #[error("{}", describe(.0))]
    Expression(#[from] minijinja::Error),
    /// Reading only values, it reads one the template's values lack (named, with the closest there is).
    #[error("undefined value: {0}")]
    UndefinedValue(String),
    /// It reads a variable templates do not have.
    #[error("unknown variable `{0}` ({hint})", hint = known_variables_hint(.0))]
    UnknownVariable(String),
    /// Reading only values, it rendered to text that is not JSON.
    #[error("expression did not render to JSON ({source}): {text}")]
    NotJson {
        /// What it rendered to.
        text: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The variable a misspelt one was meant to be, or the ones there are.
fn known_variables_hint(unknown: &str) -> String {
    match crate::suggest::closest(unknown, KNOWN_VARIABLES) {
        Some(close) => format!("did you mean `{close}`?"),
        None => "a template can use `pod` and `values`".to_owned(),
    }
}

fn describe(err: &minijinja::Error) -> String {
    let mut reason = err.kind().to_string();
    if let Some(detail) = err.detail() {
        reason.push_str(": ");
        reason.push_str(detail);
    }
    if let Some(name) = undefined_name(err) {
        // The fix, with the name in it: what a person copies into the template.
        reason.push_str(&format!(
            "; give it a default, `{{{{ {name} | default(...) }}}}`, or test it, `{{% if {name} is defined %}}`"
        ));
    }
    reason
}

/// The expression an undefined-value error names (minijinja's detail says `` `pod.labels.app` is undefined``).
fn undefined_name(err: &minijinja::Error) -> Option<&str> {
    if err.kind() != minijinja::ErrorKind::UndefinedError {
        return None;
    }
    let detail = err.detail()?;
    let end = detail.find("` is undefined")?;
    let start = detail[..end].rfind('`')? + 1;
    Some(&detail[start..end])
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::template::Port;

    type Containers = Vec<(&'static str, Vec<Port<'static>>)>;
    type Context<'a> = PodContext<'a, BTreeMap<&'a str, &'a str>, Containers>;

    fn pod() -> Context<'static> {
        PodContext {
            containers: vec![
                ("web", vec![Port { name: Some("http"), container_port: 8080, protocol: "TCP" }]),
                ("worker", vec![Port { name: None, container_port: 9090, protocol: "UDP" }]),
            ],
            name: "web-1",
            generate_name: "",
            namespace: "shop",
            service_account_name: "default",
            labels: [("app", "we\"b\\\n\u{2028}")].into_iter().collect(),
            annotations: Default::default(),
        }
    }

    /// Every slot `r` renders for `pod()`, each decoded as a JSON string.
    fn rendered_strings(r: &Renderer) -> Vec<String> {
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        r.render(&pod(), &[], &mut buf, &mut ranges).unwrap();
        ranges.iter().map(|range| serde_json::from_slice(&buf[range.clone()]).unwrap()).collect()
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
        assert!(r.reads().labels() && !r.reads().annotations() && !r.reads().containers());
        assert_eq!(rendered_strings(&r), ["we\"b\\\n\u{2028}", "svc-we\"b\\\n\u{2028}.shop"]);
    }

    #[test]
    fn typos_and_syntax_errors_are_refused() {
        let mut r = Renderer::new(&serde_json::json!({"image": "x"}));
        assert_eq!(
            r.add_leaf("{{ value.image }}").unwrap_err().to_string(),
            "unknown variable `value` (did you mean `values`?)"
        );
        assert!(r.add_leaf("{{ podd.name }}").unwrap_err().to_string().contains("did you mean `pod`?"));
        assert!(
            r.add_leaf("{{ cluster.name }}").unwrap_err().to_string().contains("a template can use `pod` and `values`")
        );
        assert!(r.add_leaf("{{ values.imag }}").unwrap_err().to_string().contains("undefined"));
        assert!(r.add_leaf("{{ values.image ").is_err());
    }

    #[test]
    fn a_missing_label_fails_at_render_time_unless_defaulted() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.labels.version }}").unwrap();
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        assert!(r.render(&pod(), &[], &mut buf, &mut ranges).is_err());
        // An `if` without `else` is undefined when false: refused too, not printed as `null` or nothing.
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.name if pod.labels.version is defined }}").unwrap();
        assert!(r.render(&pod(), &[], &mut buf, &mut ranges).unwrap_err().reason.contains("undefined"));
        assert!(buf.is_empty(), "a failed render leaves the buffer as it was");
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.labels.version | default('v0') }}").unwrap();
        buf.clear();
        ranges.clear();
        r.render(&pod(), &[], &mut buf, &mut ranges).unwrap();
        assert_eq!(&buf[ranges[0].clone()], b"\"v0\"");
    }

    #[test]
    fn a_safe_filter_cannot_smuggle_raw_json_into_the_patch() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.labels.app | safe }}").unwrap();
        r.add_leaf("x-{{ pod.labels.app | safe }}").unwrap();
        assert_eq!(rendered_strings(&r), ["we\"b\\\n\u{2028}", "x-we\"b\\\n\u{2028}"]);
    }

    #[test]
    fn whitespace_control_and_types_survive_the_rewrite() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{- pod.name -}}").unwrap();
        r.add_leaf("{{ pod.labels | length }}").unwrap();
        r.add_leaf("{{ pod.annotations }}").unwrap();
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        r.render(&pod(), &[], &mut buf, &mut ranges).unwrap();
        let slots: Vec<&[u8]> = ranges.iter().map(|r| &buf[r.clone()]).collect();
        assert_eq!(slots, [b"\"web-1\"".as_slice(), b"1", b"{}"]);
    }

    #[test]
    fn templates_see_the_pod_and_its_labels_as_maps() {
        let mut r = Renderer::new(&serde_json::json!({}));
        for leaf in [
            "{{ 'app' in pod.labels }}",
            "{{ pod.labels.version is defined }}",
            "{{ pod.labels | items | list }}",
            "{{ pod.labels | dictsort }}",
            "{% for key, value in pod.labels | items %}{{ key }}={{ value }};{% endfor %}",
            "{{ pod | list }}",
            "{{ pod.annotations | length }}",
            "{{ pod['namespace'] ~ '/' ~ pod.name }}",
            "{{ pod }}",
        ] {
            r.add_leaf(leaf).unwrap();
        }
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        r.render(&pod(), &[], &mut buf, &mut ranges).unwrap();
        let slots: Vec<serde_json::Value> =
            ranges.iter().map(|range| serde_json::from_slice(&buf[range.clone()]).unwrap()).collect();
        let app = "we\"b\\\n\u{2028}";
        assert_eq!(
            slots,
            [
                serde_json::json!(true),
                serde_json::json!(false),
                serde_json::json!([["app", app]]),
                serde_json::json!([["app", app]]),
                serde_json::json!(format!("app={app};")),
                serde_json::json!([
                    "name",
                    "generateName",
                    "namespace",
                    "serviceAccountName",
                    "labels",
                    "annotations",
                    "containers"
                ]),
                serde_json::json!(0),
                serde_json::json!("shop/web-1"),
                serde_json::json!({
                    "name": "web-1", "generateName": "", "namespace": "shop", "serviceAccountName": "default",
                    "labels": {"app": app}, "annotations": {},
                    "containers": [
                        {"name": "web", "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]},
                        {"name": "worker", "ports": [{"containerPort": 9090, "protocol": "UDP"}]},
                    ]
                }),
            ]
        );
    }

    /// Slot 0 of what `r` renders for `pod` through `cache`, decoded as a JSON string.
    fn first_slot_cached(r: &Renderer, pod: &Context<'_>, cache: &mut LeafCache) -> String {
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        r.render_cached(pod, &[], cache, &mut buf, &mut ranges).unwrap();
        serde_json::from_slice::<String>(&buf[ranges[0].clone()]).unwrap()
    }

    #[test]
    fn the_cache_tells_a_label_from_the_same_annotation() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.labels | length }}-{{ pod.annotations | length }}").unwrap();
        let mut cache = LeafCache::default();
        let entry: BTreeMap<&str, &str> = [("k", "v")].into_iter().collect();
        let labelled = PodContext { labels: entry.clone(), annotations: Default::default(), ..pod() };
        let annotated = PodContext { labels: Default::default(), annotations: entry, ..pod() };
        assert_eq!(first_slot_cached(&r, &labelled, &mut cache), "1-0");
        assert_eq!(first_slot_cached(&r, &annotated, &mut cache), "0-1");
        assert_eq!(first_slot_cached(&r, &labelled, &mut cache), "1-0");
    }

    #[test]
    fn an_undefined_name_is_named_with_the_filter_that_guards_it() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("x-{{ pod.labels.version }}").unwrap();
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        let reason = r.render(&pod(), &[], &mut buf, &mut ranges).unwrap_err().reason;
        assert!(reason.contains("`pod.labels.version` is undefined"), "{reason}");
        assert!(reason.contains("`{{ pod.labels.version | default(...) }}`"), "{reason}");
        let mut r = Renderer::new(&serde_json::json!({"image": "x"}));
        let reason = r.add_leaf("{{ values.imag }}").unwrap_err().to_string();
        // A value the template's values lack is named with the closest one they have.
        assert!(reason.contains("`values.imag` is undefined (did you mean `values.image`?)"), "{reason}");
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.name if pod.labels.version is defined }}").unwrap();
        let reason = r.render(&pod(), &[], &mut buf, &mut ranges).unwrap_err().reason;
        assert!(reason.contains("give it an `else`, or `| default(...)`"), "{reason}");
    }

    #[test]
    fn every_failing_leaf_is_listed() {
        let mut r = Renderer::new(&serde_json::json!({}));
        for leaf in ["{{ pod.labels.a }}", "{{ pod.name }}", "{{ pod.labels.app }}", "{{ pod.annotations.b }}"] {
            r.add_leaf(leaf).unwrap();
        }
        let failed: Vec<usize> = r.all_failures(&pod()).iter().map(|e| e.slot).collect();
        assert_eq!(failed, [0, 3]);
    }

    #[test]
    fn a_failure_names_the_leaf_that_failed() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.name }}").unwrap();
        r.add_leaf("v-{{ pod.labels.version }}").unwrap();
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        let err = r.render(&pod(), &[], &mut buf, &mut ranges).unwrap_err();
        assert_eq!(err.slot, 1);
        assert!(err.reason.contains("undefined"), "{}", err.reason);
    }

    #[test]
    fn the_cache_answers_a_repeated_context_and_nothing_else() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.labels.app }}-{{ pod.name }}").unwrap();
        let mut cache = LeafCache::default();
        let mut render = |pod: &Context<'_>, r: &Renderer| first_slot_cached(r, pod, &mut cache);
        let first = pod();
        assert_eq!(render(&first, &r), "we\"b\\\n\u{2028}-web-1");
        assert_eq!(render(&first, &r), "we\"b\\\n\u{2028}-web-1", "a hit gives the same output");
        let renamed = PodContext { name: "web-2", ..pod() };
        assert_eq!(render(&renamed, &r), "we\"b\\\n\u{2028}-web-2");
        let relabelled = PodContext { labels: [("app", "shop")].into_iter().collect(), ..pod() };
        assert_eq!(render(&relabelled, &r), "shop-web-1");
        // Another template with the same leaf source is another renderer: it never reads this one's entries.
        let mut other = Renderer::new(&serde_json::json!({}));
        other.add_leaf("{{ pod.labels.app }}+{{ pod.name }}").unwrap();
        assert_eq!(render(&first, &other), "we\"b\\\n\u{2028}+web-1");
        // More distinct contexts than entries: the oldest are replaced and everything still renders right.
        for i in 0..3 * LeafCache::ENTRIES {
            let name = format!("pod-{i}");
            assert_eq!(render(&PodContext { name: &name, ..pod() }, &r), format!("we\"b\\\n\u{2028}-{name}"));
        }
        assert_eq!(cache.renderers().count(), LeafCache::ENTRIES);
    }

    #[test]
    fn overridable_values_render_from_defaults_until_a_pod_overrides_them() {
        let values = serde_json::json!({"cpu": "50m", "image": "proxy:1"});
        let mut r = Renderer::with_overridable(&values, vec!["cpu".into()]);
        assert!(matches!(r.add_leaf("{{ values.image }}"), Ok(LeafKind::Static(_))), "not overridable: static");
        assert!(matches!(r.add_leaf("{{ values.cpu }}"), Ok(LeafKind::Dynamic(0))));
        assert!(matches!(r.add_leaf("{{ pod.name }}/{{ values.cpu }}"), Ok(LeafKind::Dynamic(1))));
        assert!(matches!(r.add_leaf("{{ values['cpu'] }}"), Ok(LeafKind::Dynamic(2))), "a subscript may read it");
        let mut cache = LeafCache::default();
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        let mut slots = |overrides: &Overrides| {
            buf.clear();
            ranges.clear();
            r.render_cached(&pod(), overrides, &mut cache, &mut buf, &mut ranges).unwrap();
            ranges.iter().map(|x| String::from_utf8(buf[x.clone()].to_vec()).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(slots(&[]), [r#""50m""#, r#""web-1/50m""#, r#""50m""#]);
        let hostile = [("cpu".to_owned(), serde_json::json!("1\"}],\"x\":{\""))];
        let rendered = slots(&hostile);
        assert_eq!(serde_json::from_str::<String>(&rendered[0]).unwrap(), "1\"}],\"x\":{\"");
        assert_eq!(slots(&[("cpu".to_owned(), serde_json::json!("2"))]), [r#""2""#, r#""web-1/2""#, r#""2""#]);
        assert_eq!(slots(&[("other".to_owned(), serde_json::json!("9"))])[0], r#""50m""#, "not ours: ignored");
        assert_eq!(slots(&[])[0], r#""50m""#, "the cache keys on the overrides");
    }
    #[test]
    fn templates_see_the_pods_containers_and_their_ports() {
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.containers[0].name }}").unwrap();
        r.add_leaf("{{ pod.containers | map(attribute='name') | join(',') }}").unwrap();
        r.add_leaf("{{ pod.containers[1].ports[0].containerPort }}/{{ pod.containers[1].ports[0].protocol }}").unwrap();
        r.add_leaf("{{ pod.containers[0].ports | selectattr('name', 'eq', 'http') | list | length }}").unwrap();
        // A list as any other: from the end, its length, past its end, printed whole.
        r.add_leaf("{{ pod.containers[-1].name }} {{ pod.containers | length }} {{ pod.containers[7] is defined }}")
            .unwrap();
        r.add_leaf("{{ pod.containers | first | tojson }}").unwrap();
        assert!(r.reads().containers() && !r.reads().labels());
        let (mut buf, mut ranges) = (Vec::new(), Vec::new());
        r.render(&pod(), &[], &mut buf, &mut ranges).unwrap();
        let slots: Vec<&[u8]> = ranges.iter().map(|r| &buf[r.clone()]).collect();
        let first = br#""{\"name\": \"web\", \"ports\": [{\"name\": \"http\", \"containerPort\": 8080, \"protocol\": \"TCP\"}]}""#;
        assert_eq!(
            slots,
            [b"\"web\"".as_slice(), b"\"web,worker\"", b"\"9090/UDP\"", b"1", b"\"worker 2 False\"", first.as_slice()]
        );
    }

    /// Renders slot 0 for each pod through one cache: the outputs, and how many entries the cache then holds
    /// (a hit adds none).
    fn through_one_cache(r: &Renderer, pods: &[Context<'_>]) -> (Vec<String>, usize) {
        let mut cache = LeafCache::default();
        let outputs = pods.iter().map(|pod| first_slot_cached(r, pod, &mut cache)).collect();
        (outputs, cache.renderers().count())
    }

    #[test]
    fn the_cache_keys_on_what_a_render_read() {
        // Reads only the containers: pods that differ in name and labels share one entry; a pod whose containers
        // differ, in a name or a port, has its own.
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.containers[0].name }}-{{ pod.containers[0].ports | length }}").unwrap();
        let mut moved = pod();
        moved.containers[0].1[0].container_port = 8081;
        let unnamed_port =
            PodContext { containers: vec![("web", vec![Port { name: None, ..pod().containers[0].1[0] }])], ..pod() };
        let pods = [
            pod(),
            PodContext { name: "web-2", labels: BTreeMap::new(), ..pod() },
            PodContext { containers: vec![("api", Vec::new())], ..pod() },
            moved,
            unnamed_port,
            pod(),
        ];
        let (outputs, entries) = through_one_cache(&r, &pods);
        assert_eq!(outputs, ["web-1", "web-1", "api-0", "web-1", "web-1", "web-1"]);
        assert_eq!(entries, 4, "one entry per distinct container list");

        // Reads the name only when no `app` label names the service: with the label, every name shares one entry.
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{{ pod.labels.app | default(none) or pod.name }}").unwrap();
        let app = |value| [("app", value), ("pod-name", "unique")].into_iter().collect::<BTreeMap<_, _>>();
        let unlabelled = BTreeMap::new;
        let pods = [
            PodContext { name: "a", labels: app("shop"), ..pod() },
            PodContext { name: "b", labels: app("shop"), ..pod() },
            PodContext { name: "c", labels: [("app", "shop")].into_iter().collect(), ..pod() },
            // Without the label the name is read: one entry each, and never the entry of a labelled pod.
            PodContext { name: "a", labels: unlabelled(), ..pod() },
            PodContext { name: "b", labels: unlabelled(), ..pod() },
            PodContext { name: "a", labels: unlabelled(), ..pod() },
            // A label that was absent is now present: not the unlabelled pod's entry.
            PodContext { name: "a", labels: app("cart"), ..pod() },
            // An empty value is falsy: the name again.
            PodContext { name: "a", labels: app(""), ..pod() },
        ];
        let (outputs, entries) = through_one_cache(&r, &pods);
        assert_eq!(outputs, ["shop", "shop", "shop", "a", "b", "a", "cart", "a"]);
        assert_eq!(entries, 5);

        // Iterating a map reads all of it, in order.
        let mut r = Renderer::new(&serde_json::json!({}));
        r.add_leaf("{% for k, v in pod.labels | items %}{{ k }}={{ v }},{% endfor %}").unwrap();
        #[derive(Default)]
        struct Ordered(Vec<(&'static str, &'static str)>);
        impl StrEntries for Ordered {
            fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
                self.0.iter().copied()
            }
        }
        let mut cache = LeafCache::default();
        let mut render = |labels: Vec<(&'static str, &'static str)>| {
            let pod = PodContext { labels: Ordered(labels), annotations: Ordered(Vec::new()), ..pod_with() };
            let (mut buf, mut ranges) = (Vec::new(), Vec::new());
            r.render_cached(&pod, &[], &mut cache, &mut buf, &mut ranges).unwrap();
            serde_json::from_slice::<String>(&buf[ranges[0].clone()]).unwrap()
        };
        assert_eq!(render(vec![("a", "1"), ("b", "2")]), "a=1,b=2,");
        assert_eq!(render(vec![("b", "2"), ("a", "1")]), "b=2,a=1,");
        assert_eq!(render(vec![("a", "1"), ("b", "2")]), "a=1,b=2,");
        assert_eq!(render(vec![("a", "1")]), "a=1,");
        assert_eq!(cache.renderers().count(), 3);
    }

    /// `pod()`'s scalars and containers, with maps of another type.
    fn pod_with<M: StrEntries + Default>() -> PodContext<'static, M, Containers> {
        let PodContext { name, generate_name, namespace, service_account_name, containers, .. } = pod();
        PodContext {
            name,
            generate_name,
            namespace,
            service_account_name,
            labels: M::default(),
            annotations: M::default(),
            containers,
        }
    }

    #[test]
    fn an_entry_that_keeps_answering_outlives_a_stream_of_one_off_pods() {
        let mut shared = Renderer::new(&serde_json::json!({}));
        shared.add_leaf("{{ pod.containers[0].name }}").unwrap();
        let mut by_name = Renderer::new(&serde_json::json!({}));
        by_name.add_leaf("{{ pod.name }}").unwrap();
        let mut cache = LeafCache::default();
        let shared_entry = |cache: &LeafCache| cache.renderers().position(|r| r == shared.id);
        for i in 0..4 * LeafCache::ENTRIES {
            let name = format!("pod-{i}");
            let pod = PodContext { name: &name, ..pod() };
            assert_eq!(first_slot_cached(&shared, &pod, &mut cache), "web");
            assert_eq!(first_slot_cached(&by_name, &pod, &mut cache), name);
            // Rendered once into the first entry, and answered from it ever since: never replaced.
            assert_eq!(shared_entry(&cache), Some(0), "after {i} one-off pods");
        }
    }
}
