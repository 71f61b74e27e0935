//! Injection without a webhook: a template compiled into a MutatingAdmissionPolicy (`admissionregistration.k8s.io/v1`,
//! Kubernetes 1.36 and later) and its binding, which the API server evaluates in process.
//!
//! The policy does what the webhook does for the pods it selects: the same selection (the shipped webhook
//! configuration's selectors and conditions, read by the caller, and the engine's own skip rules as CEL conditions),
//! and one JSONPatch whose every `add` is guarded as the add-only merge decides it ([`walk`]), so that a second
//! evaluation adds nothing. What a policy cannot do as the webhook does is refused with the reason: overrides (vetted
//! per pod against the API server's rules), a held app, per-pod values the webhook validates per pod, host ports
//! judged with each pod's own, leaves with no CEL equivalent ([`leaves`]), lists matched by two keys.

pub(crate) mod cel;
mod leaves;
mod walk;
mod withheld;

use serde_json::{Value, json};

use crate::decision::{OPT_OUT_VALUES, SkipReason};
use crate::template::{InitPosition, Template};
use leaves::Leaves;
use walk::{At, Text, Walk};

/// Why a template does not compile into a policy: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
pub struct Refusal {
    /// The line of the template's file, when the reason has one.
    pub line: Option<usize>,
    /// What cannot be compiled, and where in the template when a line does not say.
    pub reason: String,
}

impl Refusal {
    pub(crate) fn new(reason: String) -> Refusal {
        Refusal { line: None, reason }
    }
}

/// Which pods the webhook is called for, as the shipped webhook configuration says (its first mutating webhook's
/// `namespaceSelector`, `objectSelector`, `matchConditions`, `failurePolicy` and `reinvocationPolicy`): the policy
/// selects the same pods.
#[derive(Debug, Clone)]
pub struct Selection {
    /// The namespaces (the injection label, the revision's absence, not the system namespaces).
    pub namespace_selector: Value,
    /// The pods (not opted out by label).
    pub object_selector: Value,
    /// The CEL conditions (not opted out by annotation, not a mirror pod).
    pub match_conditions: Vec<Value>,
    /// `Ignore`: a pod the policy fails for is admitted as it came, as with the webhook.
    pub failure_policy: Value,
    /// `IfNeeded`: evaluated again when a later mutation changes the pod.
    pub reinvocation_policy: Value,
}

impl Selection {
    /// The selection of `webhook`, one webhook of a MutatingWebhookConfiguration (as JSON).
    pub fn of_webhook(webhook: &Value) -> Selection {
        Selection {
            namespace_selector: webhook["namespaceSelector"].clone(),
            object_selector: webhook["objectSelector"].clone(),
            match_conditions: webhook["matchConditions"].as_array().cloned().unwrap_or_default(),
            failure_policy: webhook["failurePolicy"].clone(),
            reinvocation_policy: webhook["reinvocationPolicy"].clone(),
        }
    }
}

/// The most characters (code points) the API server's CEL parser takes in one expression (cel-go's default,
/// which Kubernetes keeps).
const MAX_EXPRESSION: usize = 100_000;

/// The name of the policy (and of its binding) of the template `template`.
pub fn policy_name(template: &str) -> String {
    format!("sidecar-injector-{template}")
}

/// Compiles `template` (of a set whose default template is `default_template`) into a MutatingAdmissionPolicy and
/// its binding, selecting the pods `selection` selects.
pub fn compile(template: &Template, default_template: &str, selection: &Selection) -> Result<[Value; 2], Refusal> {
    let mut conditions = selection.match_conditions.clone();
    conditions.extend(skip_conditions(template, default_template));
    let mut variables = Vec::new();
    // A Job's pods take the template in its Job shape: one mutation for each shape, each a no-op for the other's
    // pods (whether a pod runs to completion does not change under either), so that each expression stays within
    // the API server's size limit for one.
    let (expressions, kept) = match template.for_jobs() {
        Ok(for_jobs) if !std::ptr::eq(for_jobs, template) => {
            let ((jobs, jobs_kept), (others, others_kept)) =
                (patch(for_jobs, &mut variables)?, patch(template, &mut variables)?);
            let expressions = vec![
                format!("({}) ? ({jobs}) : []", runs_to_completion()),
                format!("({}) ? [] : ({others})", runs_to_completion()),
            ];
            (expressions, format!("({}) ? ({jobs_kept}) : ({others_kept})", runs_to_completion()))
        }
        Ok(_) => {
            let (expression, kept) = patch(template, &mut variables)?;
            (vec![expression], kept)
        }
        Err(_) => {
            conditions.push(condition(SkipReason::Job, &format!("!({})", runs_to_completion())));
            let (expression, kept) = patch(template, &mut variables)?;
            (vec![expression], kept)
        }
    };
    if let Some(long) = expressions.iter().map(|e| e.chars().count()).find(|n| *n > MAX_EXPRESSION) {
        return Err(Refusal::new(format!(
            "its policy's expression would be {long} characters, beyond the {MAX_EXPRESSION} the API server's CEL \
             parser takes in one (every field of a container the pod may declare itself gets a guard): split the \
             template, or keep it on the webhook"
        )));
    }
    if kept != "true" {
        conditions.push(json!({"name": "the-injected-pod-keeps-the-pod-wide-rules", "expression": kept}));
    }
    let mutations: Vec<Value> = expressions
        .into_iter()
        .map(|expression| json!({"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}))
        .collect();
    let variables: Vec<Value> =
        variables.into_iter().map(|(name, expression)| json!({"name": name, "expression": expression})).collect();
    let name = policy_name(template.name());
    let labels = json!({"app.kubernetes.io/name": "sidecar-injector", "sidecar-injector.io/template": template.name()});
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "failurePolicy": selection.failure_policy,
            "reinvocationPolicy": selection.reinvocation_policy,
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "namespaceSelector": selection.namespace_selector,
                "objectSelector": selection.object_selector,
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                    "scope": "Namespaced",
                }],
            },
            "matchConditions": conditions,
            "variables": variables,
            "mutations": mutations,
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {"policyName": name},
    });
    Ok([policy, binding])
}

/// The JSONPatch expression of `template` (one shape of it): the container defaults first (they address the pod's
/// containers by their index, which the sidecars added after would shift), then the `pod` section. And the
/// condition under which the injected pod keeps the API server's pod-wide rules ([`withheld`]; `true` when the
/// template writes nothing they read).
fn patch(template: &Template, variables: &mut Vec<(String, String)>) -> Result<(String, String), Refusal> {
    let reasons = template.needs_the_webhook();
    if !reasons.is_empty() {
        return Err(Refusal::new(reasons.join("; ")));
    }
    let leaves = Leaves::of(template);
    let walk = |variables| Walk {
        leaves: &leaves,
        variables,
        init_first: template.init_position == InitPosition::First,
        containers_first: template.containers_first(),
        adds: Vec::new(),
    };
    let trees = template.trees(false);
    let mut lists = Vec::new();
    let mut kept = Vec::new();
    if let Some(defaults) = &trees.container_defaults {
        kept.extend(withheld::device_paths(defaults, &defaults_reach(template)));
        let at = At::item("c".into(), container_pointer(), "spec.containers".into());
        let mut defaults_walk = walk(None);
        defaults_walk.root(defaults, &at)?;
        let reach = defaults_reach(template);
        for add in defaults_walk.adds {
            let guard =
                std::iter::once(reach.clone()).chain(add.guard.iter().cloned()).collect::<Vec<_>>().join(" && ");
            let patch = format!("JSONPatch{{op: \"add\", path: {}, value: {}}}", add.pointer.cel(), add.value);
            lists.push(format!("object.spec.?containers.orValue([]).transformList(i, c, {guard}, {patch})"));
        }
    }
    let mut pod_walk = walk(Some(variables));
    pod_walk.root(&trees.pod, &At::root())?;
    kept.extend(withheld::annotations_total(&trees.pod, &pod_walk)?);
    kept.extend(withheld::pod_seccomp(&trees.pod));
    kept.extend(withheld::resize_restarts(&[Some(&trees.pod), trees.container_defaults.as_ref()]));
    let adds: Vec<String> = pod_walk.adds.iter().map(walk::Add::cel).collect();
    lists.push(format!("[{}]", adds.join(", ")));
    let kept = if kept.is_empty() {
        "true".to_owned()
    } else {
        kept.iter().map(|k| format!("({k})")).collect::<Vec<_>>().join(" && ")
    };
    Ok((lists.join(" + "), kept))
}

/// `/spec/containers/<i>`: the pointer of the container `c` at index `i` of a `transformList`.
fn container_pointer() -> Text {
    let mut pointer = Text::default();
    pointer.push_static("/spec/containers/");
    pointer.push_expr("string(i)".into());
    pointer
}

/// Does `containerDefaults` reach the container `c` (see `Template::defaults_reach`)? Never the template's own.
fn defaults_reach(template: &Template) -> String {
    let ours: Vec<String> = template.injects().containers.iter().map(|n| cel::string(n)).collect();
    let key = cel::string(&template.keys.containers);
    let annotation = format!("object.metadata.?annotations[?{key}]");
    let listed = match template.defaults_for() {
        None => "true".to_owned(),
        Some(names) => {
            let names: Vec<String> = names.iter().map(|n| cel::string(n)).collect();
            format!("c.name in [{}]", names.join(", "))
        }
    };
    format!(
        "!(c.name in [{}]) && ({annotation}.hasValue() ? string({annotation}.value()).split(\",\").exists(n, n.trim() == c.name) : {listed})",
        ours.join(", ")
    )
}

/// Does the pod run to completion (see `PodView::runs_to_completion`)?
fn runs_to_completion() -> String {
    "string(object.spec.?restartPolicy.orValue(\"Always\")) in [\"Never\", \"OnFailure\"] || \
     object.metadata.?ownerReferences.orValue([]).exists(o, o.?kind.orValue(\"\") == \"Job\" && \
     string(o.?apiVersion.orValue(\"\")).startsWith(\"batch/\"))"
        .to_owned()
}

/// A match condition named for the reason the webhook skips the pods it excludes.
fn condition(reason: SkipReason, expression: &str) -> Value {
    json!({"name": format!("not-skipped-{}", <&str>::from(reason)), "expression": expression})
}

/// The engine's own reasons to leave a pod alone (`decision`, `Engine::choose`), as match conditions: the pod
/// names this template (or none, and this is the default), is not opted out by label (the webhook's
/// `objectSelector` compares exactly; the engine ignores case and space), runs on Linux, is not on the host's
/// network unless the template says so, and was not injected by another template or version.
fn skip_conditions(template: &Template, default_template: &str) -> Vec<Value> {
    let keys = &template.keys;
    let annotation = |key: &str| format!("object.metadata.?annotations[?{}]", cel::string(key));
    let opt_out: Vec<String> = OPT_OUT_VALUES.iter().map(|v| cel::string(v)).collect();
    let requested = format!(
        "string({}.orValue(\"\")).split(\",\").map(n, n.trim()).filter(n, n != \"\")",
        annotation(&keys.template)
    );
    let name = cel::string(template.name());
    let takes = match template.name() == default_template {
        true => format!("{requested}.all(n, n == {name})"),
        false => format!("size({requested}) > 0 && {requested}.all(n, n == {name})"),
    };
    let windows = "string(object.spec.?nodeSelector[?\"kubernetes.io/os\"].orValue(\"\")) == \"windows\" || \
        string(object.spec.?os.?name.orValue(\"\")) == \"windows\" || \
        (size(object.spec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution.?nodeSelectorTerms.orValue([])) > 0 && \
        object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.all(t, \
        t.?matchExpressions.orValue([]).exists(r, r.?key.orValue(\"\") == \"kubernetes.io/os\" && r.?operator.orValue(\"\") == \"In\" \
        && size(r.?values.orValue([])) > 0 && r.values.all(v, v == \"windows\"))))";
    let status = annotation(&keys.status);
    let mut conditions = vec![
        json!({"name": "takes-this-template", "expression": takes}),
        condition(
            SkipReason::OptedOut,
            &format!(
                "!(string(object.metadata.?labels[?{}].orValue(\"\")).trim().lowerAscii() in [{}]) && \
                 !(string({}.orValue(\"\")).trim().lowerAscii() in [{}])",
                cel::string(&keys.inject),
                opt_out.join(", "),
                annotation(&keys.inject),
                opt_out.join(", ")
            ),
        ),
        condition(SkipReason::Windows, &format!("!({windows})")),
        condition(
            SkipReason::InjectedByOtherVersion,
            &format!(
                "!{status}.hasValue() || string({status}.value()) == {} || \
                 (string({status}.value()).contains({}) && string({status}.value()).contains({}))",
                cel::string(template.status()),
                cel::string(&format!("\"template\":{}", serde_json::Value::from(template.name()))),
                cel::string(&format!("\"version\":{}", serde_json::Value::from(template.hash())))
            ),
        ),
    ];
    if !template.inject_host_network {
        conditions.push(condition(SkipReason::HostNetwork, "!(object.spec.?hostNetwork.orValue(false) == true)"));
    }
    conditions
}

#[cfg(test)]
mod tests;
