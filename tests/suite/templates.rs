//! Template sets: selection by annotation, combinations, shared values, overrides, error policies, warnings and
//! audit annotations, as the engine answers them.

use crate::common;

use common::{answer, apply, review};
use serde_json::{Value, json};
use sidecar_injector_core::{Engine, Policy, SetSources, Settings, TemplateError, TemplateSet, Verdict};

const MESH: &str = r#"
values:
  image: mesh:1
  cpu: 50m
overrides:
  proxy-cpu: { value: cpu, type: quantity }
  log-level: { value: level, type: string, oneOf: [info, debug] }
pod:
  spec:
    containers:
      - name: proxy
        image: "{{ values.image }}"
        args: ["--level={{ values.level }}", "--service={{ pod.labels.app | default(pod.name) }}"]
        resources: { requests: { cpu: "{{ values.cpu }}" } }
    volumes:
      - name: mesh
        emptyDir: {}
"#;

const AGENT: &str = r#"
onError: deny
pod:
  metadata:
    labels: { agent: "on" }
  spec:
    containers:
      - name: proxy
        image: ignored-because-mesh-comes-first
        env: [{ name: AGENT, value: "1" }]
      - name: agent
        image: "{{ values.agentImage }}"
        args: ["--version={{ pod.labels.version }}"]
    volumes:
      - name: agent
        emptyDir: {}
"#;

const VALUES: &str = "level: info\nagentImage: agent:7\nimage: mesh:2\n";

fn sources(templates: &[(&str, &str)], values: Option<&str>) -> SetSources {
    SetSources {
        origin: "test".into(),
        templates: templates.iter().map(|(n, s)| (n.to_string(), format!("{n}.yaml"), s.to_string())).collect(),
        values: values.map(|v| ("values.yaml".to_owned(), v.to_owned())),
        ignored: Vec::new(),
    }
}

fn engine(settings: Settings) -> Engine {
    let set = TemplateSet::compile(sources(&[("default", MESH), ("agent", AGENT)], Some(VALUES)), "default", &settings)
        .unwrap();
    Engine::new(set, &settings)
}

fn pod(annotations: Value) -> Value {
    json!({
        "metadata": {"name": "web-1", "labels": {"app": "shop", "version": "v2"}, "annotations": annotations},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}
    })
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

fn status(pod: &Value) -> Value {
    serde_json::from_str(pod["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap()).unwrap()
}

#[test]
fn pods_get_the_default_template_and_shared_values_override_the_templates_own() {
    let engine = engine(Settings::default());
    let (outcome, response, patch) = answer(&engine, &review(&pod(json!({}))));
    assert!(matches!(outcome.verdict, Verdict::Injected { .. }));
    let injected = apply(&pod(json!({})), &patch.unwrap());
    assert_eq!(container(&injected, "proxy")["args"], json!(["--level=info", "--service=shop"]));
    assert_eq!(container(&injected, "proxy")["image"], "mesh:2", "values.yaml overrides the template's default");
    let status = status(&injected);
    assert_eq!(status["template"], "default");
    assert_eq!(status["set"], engine.set().hash());
    assert_eq!(status["version"], engine.template().hash());
    let audit = &response["response"]["auditAnnotations"];
    assert_eq!(audit["template"], "default");
    assert_eq!(audit["template-version"], engine.template().hash());
    assert_eq!(audit["template-set"], engine.set().hash());
}

#[test]
fn a_pod_can_combine_templates_in_order_and_the_result_is_idempotent() {
    let engine = engine(Settings::default());
    let asked = pod(json!({"sidecar-injector.io/template": " default , agent,default"}));
    let (_, response, patch) = answer(&engine, &review(&asked));
    let injected = apply(&asked, &patch.unwrap());
    let proxy = container(&injected, "proxy");
    assert_eq!(proxy["image"], "mesh:2", "the first template wins where both set a field");
    assert_eq!(proxy["env"], json!([{"name": "AGENT", "value": "1"}]), "the second fills what the first lacks");
    assert_eq!(container(&injected, "agent")["image"], "agent:7");
    assert_eq!(container(&injected, "agent")["args"], json!(["--version=v2"]));
    assert_eq!(injected["metadata"]["labels"]["agent"], "on");
    let volumes: Vec<&str> =
        injected["spec"]["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(volumes, ["mesh", "agent"]);
    assert_eq!(status(&injected)["template"], "default,agent");
    assert_eq!(response["response"]["auditAnnotations"]["template"], "default,agent");
    // The combination is compiled once per snapshot and then served from it: the same answer again.
    let (_, _, again) = answer(&engine, &review(&asked));
    assert_eq!(apply(&asked, &again.unwrap()), injected);
    let (outcome, _, none) = answer(&engine, &review(&injected));
    assert_eq!(none, None, "injecting the combination into its own output adds nothing");
    assert_eq!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::AlreadyInjected));
    // Another order is another template version, and the pod is left alone with a warning.
    let reordered = {
        let mut p = injected.clone();
        p["metadata"]["annotations"]["sidecar-injector.io/template"] = json!("agent,default");
        p
    };
    let (outcome, _, none) = answer(&engine, &review(&reordered));
    assert_eq!(none, None);
    assert!(outcome.warnings[0].contains("another template version"), "{:?}", outcome.warnings);
}

/// A combination (`template: a,b`) is assembled where a pod first asks for it and kept by what the set is served
/// with, so that the set itself never changes: the first review is answered with it, the same patch every time. A
/// reload (the server's serving state, carried to the set replacing this one) assembles the combinations the
/// set it replaces had, ahead of any pod; one that does not combine is kept with its reason.
#[test]
fn a_combination_is_assembled_once_kept_beside_the_set_and_carried_by_a_reload() {
    use sidecar_injector::server::serving::Served;
    let settings = Settings::default();
    let compile = |templates: &[(&str, &str)]| {
        TemplateSet::compile(sources(templates, Some(VALUES)), "default", &settings).unwrap()
    };
    let asked = pod(json!({"sidecar-injector.io/template": "default,agent"}));
    let first = Engine::new(compile(&[("default", MESH), ("agent", AGENT)]), &settings);
    assert!(first.served_with().assembled().is_empty());
    let (outcome, _, patch) = answer(&first, &review(&asked));
    assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{outcome:?}");
    assert_eq!(first.served_with().assembled(), ["default,agent"]);
    let (_, _, again) = answer(&first, &review(&asked));
    assert_eq!(again, patch, "the kept combination gives the same patch");

    // A reload (another set, replacing this one) has the combination ready before any pod asks.
    let set = compile(&[("default", MESH), ("agent", AGENT)]);
    let served = Served::after(&first, &set, std::time::Instant::now());
    let reloaded = Engine::serving(set, &settings, std::sync::Arc::new(served));
    assert_eq!(reloaded.served_with().assembled(), ["default,agent"]);
    let (outcome, _, reloaded_patch) = answer(&reloaded, &review(&asked));
    assert!(matches!(outcome.verdict, Verdict::Injected { .. }), "{outcome:?}");
    assert_eq!(reloaded_patch, patch);
    // A template the replaced set lacked arrives with the reload; those it had keep their arrival (none here).
    let set = compile(&[("default", MESH), ("agent", AGENT), ("new", AGENT)]);
    let served = Served::after(&reloaded, &set, std::time::Instant::now());
    let with_new = Engine::serving(set, &settings, std::sync::Arc::new(served));
    assert!(with_new.served_with().arrived("new").is_some());
    assert!(with_new.served_with().arrived("agent").is_none());

    // Two templates that do not combine (each alone is valid; together they ask for host port 9999 twice) are
    // kept as such: every pod asking gets the reason, from the first.
    let host_port = |name: &str, port: u16| {
        format!(
            "pod:\n  spec:\n    containers:\n      - name: {name}\n        image: {name}:1\n        ports: \
             [{{containerPort: {port}, hostPort: 9999}}]\n"
        )
    };
    let (first, second) = (host_port("first", 8001), host_port("second", 8002));
    let clashing = Engine::new(compile(&[("default", &first), ("second", &second)]), &settings);
    let asked = pod(json!({"sidecar-injector.io/template": "default,second"}));
    for _ in 0..2 {
        let (outcome, _, patch) = answer(&clashing, &review(&asked));
        assert_eq!(patch, None);
        assert_eq!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::CombinationRefused));
        assert!(outcome.warnings[0].contains("cannot be combined"), "{:?}", outcome.warnings);
    }
    assert_eq!(clashing.served_with().assembled(), ["default,second"]);
}

#[test]
fn an_unknown_template_is_reported_and_the_pod_admitted_or_denied_by_policy() {
    let asked = pod(json!({"sidecar-injector.io/template": "default,mesh-v2"}));
    let (outcome, response, patch) = answer(&engine(Settings::default()), &review(&asked));
    assert_eq!(patch, None);
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::UnknownTemplate));
    let warning = response["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.contains("no template named mesh-v2 (known: agent, default)"), "{warning}");
    assert!(response["response"].get("auditAnnotations").is_none());

    let strict = Settings { on_unknown_template: Policy::Deny, ..Settings::default() };
    let (outcome, response, _) = answer(&engine(strict), &review(&asked));
    assert_eq!(outcome.verdict, Verdict::Denied(sidecar_injector_core::SkipReason::UnknownTemplate));
    assert_eq!(response["response"]["allowed"], false);
    assert_eq!(response["response"]["status"]["code"], 400);
    assert!(response["response"]["status"]["message"].as_str().unwrap().contains("mesh-v2"));
}

#[test]
fn a_render_failure_follows_the_templates_policy_then_the_servers() {
    // `agent` reads pod.labels.version without a default (the sample pod has one; this pod does not) and says `onError: deny`.
    let unlabelled = json!({
        "metadata": {"name": "x", "annotations": {"sidecar-injector.io/template": "agent"}},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]}
    });
    let (outcome, response, _) = answer(&engine(Settings::default()), &review(&unlabelled));
    assert_eq!(outcome.verdict, Verdict::Denied(sidecar_injector_core::SkipReason::RenderFailed));
    let message = response["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("template agent field pod.spec.containers[1].args[0] failed to render"), "{message}");
    assert_eq!(response["response"]["auditAnnotations"]["template"], "agent");

    // `default` has no policy of its own: the server's decides.
    let mesh_only = "pod:\n  spec:\n    containers:\n      - name: p\n        image: \"{{ pod.labels.version }}\"\n";
    let set = |policy| {
        let settings = Settings { on_error: policy, ..Settings::default() };
        let set = TemplateSet::compile(sources(&[("default", mesh_only)], None), "default", &Settings::default());
        Engine::new(set.unwrap(), &settings)
    };
    let bare = json!({"metadata": {"name": "x"}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
    let (outcome, response, _) = answer(&set(Policy::Allow), &review(&bare));
    assert_eq!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::RenderFailed));
    assert!(response["response"]["warnings"][0].as_str().unwrap().contains("admitted without the sidecar"));
    let (outcome, _, _) = answer(&set(Policy::Deny), &review(&bare));
    assert_eq!(outcome.verdict, Verdict::Denied(sidecar_injector_core::SkipReason::RenderFailed));
}

#[test]
fn overrides_land_when_valid_are_refused_with_a_warning_when_not_and_are_always_escaped() {
    let engine = engine(Settings::default());
    let asked = pod(json!({"sidecar-injector.io/proxy-cpu": "250m", "sidecar-injector.io/log-level": "debug"}));
    let (outcome, _, patch) = answer(&engine, &review(&asked));
    assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
    let proxy = container(&apply(&asked, &patch.unwrap()), "proxy").clone();
    assert_eq!(proxy["resources"]["requests"]["cpu"], "250m");
    assert_eq!(proxy["args"][0], "--level=debug");

    let hostile = "1\"}],\"x\":{\"y\":\"\u{2028}</script>";
    let asked = pod(json!({"sidecar-injector.io/proxy-cpu": hostile, "sidecar-injector.io/log-level": "trace"}));
    let (outcome, _, patch) = answer(&engine, &review(&asked));
    let proxy = container(&apply(&asked, &patch.unwrap()), "proxy").clone();
    assert_eq!(proxy["resources"]["requests"]["cpu"], "50m", "the template's value is used");
    assert_eq!(proxy["args"][0], "--level=info");
    assert_eq!(outcome.warnings.len(), 2, "{:?}", outcome.warnings);
    assert!(outcome.warnings.iter().any(|w| w.contains("proxy-cpu") && w.contains("not a Kubernetes quantity")));
    assert!(outcome.warnings.iter().any(|w| w.contains("log-level") && w.contains("one of info, debug")));

    // A free-form string override carries any bytes, escaped into the patch as data.
    let free = MESH.replace("oneOf: [info, debug]", "maxLength: 100");
    let set = TemplateSet::compile(sources(&[("default", &free)], Some(VALUES)), "default", &Settings::default());
    let engine = Engine::new(set.unwrap(), &Settings::default());
    let asked = pod(json!({"sidecar-injector.io/log-level": hostile}));
    let (_, _, patch) = answer(&engine, &review(&asked));
    let injected = apply(&asked, &patch.unwrap());
    assert_eq!(container(&injected, "proxy")["args"][0], format!("--level={hostile}"));
    assert!(injected.get("x").is_none() && container(&injected, "proxy").get("x").is_none());
}

#[test]
fn a_set_without_its_default_template_or_with_broken_files_is_refused_naming_every_file() {
    let err = TemplateSet::compile(
        sources(&[("mesh", MESH)], Some(VALUES)),
        "default",
        &Settings { annotation_prefix: "p/".into(), ..Default::default() },
    )
    .unwrap_err();
    assert!(err.to_string().contains("no template named `default`"), "{err}");
    let broken =
        sources(&[("default", "pod: [\n"), ("agent", "pod:\n  spec:\n    containers:\n      - name: a\n")], None);
    match TemplateSet::compile(
        broken,
        "default",
        &sidecar_injector_core::Settings { annotation_prefix: "p/".into(), ..Default::default() },
    )
    .unwrap_err()
    {
        TemplateError::Several(errors) => {
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            assert!(text.iter().any(|e| e.starts_with("agent.yaml:4: ") && e.contains("needs an `image`")), "{text:?}");
            assert!(text.iter().any(|e| e.starts_with("default.yaml:")), "{text:?}");
        }
        other => panic!("expected one error per file, got {other}"),
    }
    let err = TemplateSet::compile(
        sources(&[("default", MESH)], Some("- not\n- a map\n")),
        "default",
        &Settings { annotation_prefix: "p/".into(), ..Default::default() },
    );
    assert!(err.unwrap_err().to_string().starts_with("values.yaml:1: "));
}

#[test]
fn overriding_a_value_with_its_default_gives_the_same_patch_as_not_overriding_it() {
    // Pods without overrides get a tree compiled with the defaults in place; pods with overrides get one that
    // renders them. The two must agree.
    let engine = engine(Settings::default());
    let plain = pod(json!({"example.com/x": "1"}));
    let overridden = pod(
        json!({"example.com/x": "1", "sidecar-injector.io/proxy-cpu": "50m", "sidecar-injector.io/log-level": "info"}),
    );
    let (_, _, a) = answer(&engine, &review(&plain));
    let (outcome, _, b) = answer(&engine, &review(&overridden));
    assert!(outcome.warnings.is_empty());
    assert_eq!(a.unwrap(), b.unwrap());
}

/// A template that needs a newer Kubernetes than the injector is set for is left out of the set, not a reason to
/// refuse the set: pods that ask for it are answered per its `onError` (a warning and no patch, or a refusal), and
/// the same files compile whole at the newer version. The default template may not need a newer version.
#[test]
fn a_template_for_a_newer_kubernetes_is_left_out_and_pods_asking_for_it_follow_its_on_error() {
    // A native sidecar, which the API server before 1.29 refuses: compiled at 1.20 it would fail the set.
    let native = r#"
minKubernetesVersion: "1.29"
pod:
  spec:
    initContainers:
      - { name: agent, image: "agent:1", restartPolicy: Always }
"#;
    let strict = format!("onError: deny\n{native}");
    let old = Settings { kubernetes_version: "1.20".parse().unwrap(), ..Settings::default() };
    let set = TemplateSet::compile(
        sources(&[("default", MESH), ("native", native), ("strict", &strict)], Some(VALUES)),
        "default",
        &old,
    )
    .unwrap();
    let left_out: Vec<&str> = set.unavailable().iter().map(|u| u.name.as_str()).collect();
    assert_eq!(left_out, ["native", "strict"]);
    assert_eq!(set.names(), "default");
    let engine = Engine::new(set, &old);

    let (outcome, response, patch) = answer(&engine, &review(&pod(json!({"sidecar-injector.io/template": "native"}))));
    assert_eq!(patch, None);
    assert_eq!(response["response"]["allowed"], true);
    assert_eq!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::TemplateUnavailable));
    let warning = response["response"]["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("template `native` needs Kubernetes 1.29 (its minKubernetesVersion)")
            && warning.contains("1.20"),
        "{warning}"
    );
    // In a combination too.
    let (outcome, ..) = answer(&engine, &review(&pod(json!({"sidecar-injector.io/template": "default,native"}))));
    assert_eq!(outcome.verdict, Verdict::Skipped(sidecar_injector_core::SkipReason::TemplateUnavailable));
    // `onError: deny` refuses.
    let (outcome, response, _) = answer(&engine, &review(&pod(json!({"sidecar-injector.io/template": "strict"}))));
    assert_eq!(outcome.verdict, Verdict::Denied(sidecar_injector_core::SkipReason::TemplateUnavailable));
    assert_eq!(response["response"]["allowed"], false);
    // Pods that name no template still get the default.
    let (_, _, patch) = answer(&engine, &review(&pod(json!({}))));
    assert!(patch.is_some());

    // At 1.29 the same files compile whole, and the native sidecar is injected.
    let new = Settings { kubernetes_version: "1.29".parse().unwrap(), ..Settings::default() };
    let set =
        TemplateSet::compile(sources(&[("default", MESH), ("native", native)], Some(VALUES)), "default", &new).unwrap();
    assert!(set.unavailable().is_empty());
    let engine = Engine::new(set, &new);
    let asked = pod(json!({"sidecar-injector.io/template": "native"}));
    let (_, _, patch) = answer(&engine, &review(&asked));
    let injected = apply(&asked, &patch.unwrap());
    assert_eq!(injected["spec"]["initContainers"][0]["name"], "agent");

    // The default template may not be left out; an unquoted version is refused at its line.
    let error = TemplateSet::compile(sources(&[("default", native)], None), "default", &old).unwrap_err().to_string();
    assert!(error.contains("the default template `default` needs Kubernetes 1.29"), "{error}");
    let unquoted = native.replace("\"1.29\"", "1.30");
    let error =
        TemplateSet::compile(sources(&[("default", &unquoted)], None), "default", &new).unwrap_err().to_string();
    assert!(error.contains("default.yaml:2: `minKubernetesVersion` must be a Kubernetes version in quotes"), "{error}");
}

/// The shipped templates serve at every version the README supports: 1.16 to 1.33, the newest whose rules the
/// validator knows, and one past it (1.20 is what tests/cluster.rs deploys); the templates that need 1.29 are left
/// out below it.
#[test]
fn the_shipped_templates_load_at_every_supported_version() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/templates");
    for minor in 16..=34 {
        let version = format!("1.{minor}");
        let unavailable = if minor < 29 { vec!["native-sidecar", "restricted"] } else { vec![] };
        let settings = Settings { kubernetes_version: version.parse().unwrap(), ..Settings::default() };
        let set = TemplateSet::load_dir(std::path::Path::new(dir), "default", &settings)
            .unwrap_or_else(|e| panic!("templates/ at {version}: {e}"));
        let left_out: Vec<&str> = set.unavailable().iter().map(|u| u.name.as_str()).collect();
        assert_eq!(left_out, unavailable, "at {version}");
    }
}
