//! A template's per-pod leaves (minijinja) as CEL over the object the API server admits. Only what a policy can
//! compute the same way is translated: the pod's names (`pod.name`, `pod.generateName`, `pod.namespace`,
//! `pod.serviceAccountName`), its labels and annotations read with a default, `or` between them, text around them,
//! string constants and the template's values, and the injector's own default-container leaf. Anything else is
//! refused, naming the leaf: a policy that computed it otherwise would inject other pods than the webhook does.

use minijinja::machinery::ast::{self, Expr, Stmt};

use super::Refusal;
use super::cel;
use crate::template::{Template, default_container_leaf};

/// The CEL expression (a string) of every render slot of a template, or why it has none.
pub(crate) struct Leaves {
    slots: Vec<Result<String, Refusal>>,
}

impl Leaves {
    pub(crate) fn of(template: &Template) -> Leaves {
        let default_container = default_container_leaf(&template.injects().containers);
        let slots = (0..)
            .map_while(|slot| template.slot_source(slot).map(|source| (slot, source)))
            .map(|(slot, (source, values))| {
                if source == default_container {
                    return Ok(default_container_cel(&template.injects().containers));
                }
                translate(source, values).map_err(|reason| Refusal {
                    line: template.slot_line(slot),
                    ..Refusal::new(format!("{}: {reason}", template.slot_path(slot)))
                })
            })
            .collect();
        Leaves { slots }
    }

    /// The CEL of render slot `slot`.
    pub(crate) fn expression(&self, slot: usize) -> Result<String, Refusal> {
        match self.slots.get(slot) {
            Some(result) => result.clone(),
            None => Err(Refusal::new(format!("render slot {slot} has no source"))),
        }
    }
}

/// The injector's default-container leaf ([`default_container_leaf`]) as CEL: the pod's first container that is not
/// one of `ours`, or "" (the e2e differential holds the two to the same pods).
fn default_container_cel(ours: &[String]) -> String {
    let ours: Vec<String> = ours.iter().map(|name| cel::string(name)).collect();
    let others = format!("object.spec.?containers.orValue([]).map(c, c.name).filter(n, !(n in [{}]))", ours.join(", "));
    format!("size({others}) > 0 ? string({others}[0]) : \"\"")
}

/// A leaf (text with `{{ }}` expressions) as one CEL string expression.
fn translate(source: &str, values: &serde_json::Value) -> Result<String, String> {
    let syntax = Default::default();
    let parsed = minijinja::machinery::parse(source, "leaf", syntax)
        .map_err(|e| format!("the expression does not parse: {e}"))?;
    let Stmt::Template(template) = parsed else { return Err("not a template".into()) };
    let mut pieces = Vec::new();
    for child in &template.children {
        match child {
            Stmt::EmitRaw(raw) => pieces.push(cel::string(raw.raw)),
            Stmt::EmitExpr(emit) => {
                let text = expression(&emit.expr, values)?;
                if text.maybe_none {
                    return Err("its value may be none (a `default(none)` nothing follows), which a policy writes \
                                otherwise"
                        .into());
                }
                pieces.push(text.cel);
            }
            _ => return Err("it uses a statement (`{% %}`), which has no CEL equivalent here".into()),
        }
    }
    Ok(match pieces.len() {
        0 => cel::string(""),
        _ => pieces.join(" + "),
    })
}

/// A translated expression: CEL of type string, where minijinja's falsy values (none, "") are "".
struct Text {
    cel: String,
    /// The minijinja value may be none (which prints otherwise than "").
    maybe_none: bool,
}

fn text(cel: String) -> Text {
    Text { cel, maybe_none: false }
}

fn expression(expr: &Expr<'_>, values: &serde_json::Value) -> Result<Text, String> {
    match expr {
        Expr::Const(c) => match c.value.as_str() {
            Some(s) => Ok(text(cel::string(s))),
            None if c.value.is_none() => Ok(Text { cel: cel::string(""), maybe_none: true }),
            None => Err(format!("the constant {} is not a string", c.value)),
        },
        Expr::BinOp(op) if matches!(op.op, ast::BinOpKind::ScOr) => {
            // `a or b or c`: the first that is not falsy, else the last. One list, each operand once.
            let mut operands = Vec::new();
            or_operands(expr, &mut operands);
            let (last, before) = operands.split_last().expect("an `or` has two operands");
            let before = before.iter().map(|e| expression(e, values).map(|t| t.cel)).collect::<Result<Vec<_>, _>>()?;
            let last = expression(last, values)?;
            Ok(Text {
                cel: format!("([{}].filter(x, x != \"\") + [{}])[0]", before.join(", "), last.cel),
                maybe_none: last.maybe_none,
            })
        }
        Expr::BinOp(op) if matches!(op.op, ast::BinOpKind::Concat) => {
            let (left, right) = (expression(&op.left, values)?, expression(&op.right, values)?);
            if left.maybe_none || right.maybe_none {
                return Err("it joins a value that may be none".into());
            }
            Ok(text(format!("{} + {}", left.cel, right.cel)))
        }
        Expr::Filter(filter) if filter.name == "default" => {
            let [ast::CallArg::Pos(default)] = filter.args.as_slice() else {
                return Err("`default` with other than one argument".into());
            };
            let default = expression(default, values)?;
            let Some(of) = &filter.expr else { return Err("`default` of nothing".into()) };
            let lookup = map_lookup(of)?;
            Ok(Text { cel: format!("string({}.orValue({}))", lookup, default.cel), maybe_none: default.maybe_none })
        }
        _ => {
            if let Some(path) = attribute_path(expr)
                && let Some(first) = path.first()
            {
                match (*first, &path[1..]) {
                    ("pod", [field]) => return pod_field(field).map(text),
                    ("values", rest) if !rest.is_empty() => return value_of(values, rest).map(text),
                    _ => {}
                }
            }
            if map_lookup(expr).is_ok() {
                return Err("it reads a label or annotation without `default`, which fails for pods without it".into());
            }
            Err("it uses an expression that has no CEL equivalent here".into())
        }
    }
}

/// The operands of a chain of `or`s, in order.
fn or_operands<'e, 'a>(expr: &'e Expr<'a>, out: &mut Vec<&'e Expr<'a>>) {
    match expr {
        Expr::BinOp(op) if matches!(op.op, ast::BinOpKind::ScOr) => {
            or_operands(&op.left, out);
            or_operands(&op.right, out);
        }
        other => out.push(other),
    }
}

/// `a.b.c` as its names.
fn attribute_path<'a>(expr: &Expr<'a>) -> Option<Vec<&'a str>> {
    match expr {
        Expr::Var(var) => Some(vec![var.id]),
        Expr::GetAttr(get) => {
            let mut path = attribute_path(&get.expr)?;
            path.push(get.name);
            Some(path)
        }
        _ => None,
    }
}

/// `pod.labels['k']`, `pod.labels.k` (and annotations) as a CEL optional of the value.
fn map_lookup(expr: &Expr<'_>) -> Result<String, String> {
    let (map, key) = match expr {
        Expr::GetAttr(get) => (attribute_path(&get.expr), Some(get.name.to_owned())),
        Expr::GetItem(get) => {
            let key = match &get.subscript_expr {
                Expr::Const(c) => c.value.as_str().map(str::to_owned),
                _ => None,
            };
            (attribute_path(&get.expr), key)
        }
        _ => (None, None),
    };
    match (map.as_deref(), key) {
        (Some(["pod", map @ ("labels" | "annotations")]), Some(key)) => {
            Ok(format!("object.metadata.?{map}[?{}]", cel::string(&key)))
        }
        _ => Err("not a label or annotation".into()),
    }
}

/// `pod.<field>` as the engine reads it (`PodView`).
fn pod_field(field: &str) -> Result<String, String> {
    let meta = |name: &str| format!("string(object.metadata.?{name}.orValue(\"\"))");
    Ok(match field {
        "name" => meta("name"),
        "generateName" => meta("generateName"),
        // The object's namespace, or the request's when it carries none (controller-created pods).
        "namespace" => format!("({m} != \"\" ? {m} : request.namespace)", m = meta("namespace")),
        "serviceAccountName" => {
            let account = "string(object.spec.?serviceAccountName.orValue(\"\"))";
            let alias = "string(object.spec.?serviceAccount.orValue(\"\"))";
            format!("({account} != \"\" ? {account} : ({alias} != \"\" ? {alias} : \"default\"))")
        }
        _ => return Err(format!("it reads pod.{field}, which has no CEL equivalent here")),
    })
}

/// A string or number of the template's values, as a CEL string literal (as minijinja prints it).
fn value_of(values: &serde_json::Value, path: &[&str]) -> Result<String, String> {
    let value = path.iter().try_fold(values, |v, key| v.get(key)).ok_or("it reads a value that is not set")?;
    match value {
        serde_json::Value::String(s) => Ok(cel::string(s)),
        serde_json::Value::Number(n) => Ok(cel::string(&n.to_string())),
        serde_json::Value::Bool(b) => Ok(cel::string(if *b { "true" } else { "false" })),
        _ => Err("it prints a list or map of values".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_labels_with_defaults_and_or_translate() {
        let values = json!({"port": 15000});
        assert_eq!(
            translate("--namespace={{ pod.namespace }}", &values).unwrap(),
            r#""--namespace=" + (string(object.metadata.?namespace.orValue("")) != "" ? string(object.metadata.?namespace.orValue("")) : request.namespace)"#
        );
        let leaf = "{{ pod.labels['app.kubernetes.io/name'] | default(none) or pod.labels.app | default(none) or pod.generateName or pod.name }}";
        let cel = translate(leaf, &values).unwrap();
        let expected = r#"([string(object.metadata.?labels[?"app.kubernetes.io/name"].orValue("")), string(object.metadata.?labels[?"app"].orValue("")), string(object.metadata.?generateName.orValue(""))].filter(x, x != "") + [string(object.metadata.?name.orValue(""))])[0]"#;
        assert_eq!(cel, expected);
        assert_eq!(translate("p={{ values.port }}", &values).unwrap(), r#""p=" + "15000""#);
    }

    #[test]
    fn what_has_no_equivalent_is_refused_with_the_reason() {
        let values = json!({});
        assert!(translate("{{ pod.labels.app }}", &values).unwrap_err().contains("without `default`"));
        assert!(translate("{{ pod.labels.app | default(none) }}", &values).unwrap_err().contains("may be none"));
        assert!(translate("{{ pod.containers | length }}", &values).unwrap_err().contains("no CEL equivalent"));
        assert!(translate("{% if pod.name %}x{% endif %}", &values).unwrap_err().contains("statement"));
    }
}
