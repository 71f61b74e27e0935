//! `manifests/`: every object deserialises into its Kubernetes type without losing a field, the kustomizations
//! list every file, the webhook configuration has the safety properties the good-practice guide asks for, the
//! Deployment is hardened and consistent with the binary's flags, and the ConfigMap carries `templates/`.
//!
//! The ConfigMap is generated from `templates/`: after editing a template, regenerate it with
//! `SIDECAR_INJECTOR_BLESS=1 cargo test --test suite manifests::`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::Value;
use sidecar_injector::cli::names;
use sidecar_injector_core::decision::OPT_OUT_VALUES;

const BASE: &str = "manifests/base";
const CERT_MANAGER: &str = "manifests/cert-manager";
const AVAILABILITY_FIRST: &str = "manifests/availability-first";
const REVISION_CANARY: &str = "manifests/revision-canary";
const WEBHOOKS_FROM_KONNECTIVITY: &str = "manifests/webhooks-from-konnectivity";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The YAML documents of a file, read as kubectl reads them.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    sidecar_injector_core::offline::read_documents(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every object of a kustomization directory, with the file it came from.
fn objects(dir: &str) -> Vec<(String, Value)> {
    let mut all = Vec::new();
    for file in yaml_files(&root().join(dir)) {
        if file == "kustomization.yaml" {
            continue;
        }
        for doc in documents(&root().join(dir).join(&file)) {
            all.push((file.clone(), doc));
        }
    }
    all
}

fn yaml_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".yaml"))
        .collect()
}

fn the<'a>(objects: &'a [(String, Value)], kind: &str) -> &'a Value {
    let mut found = objects.iter().filter(|(_, o)| o["kind"] == kind);
    let (_, object) = found.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(found.next().is_none(), "one {kind}");
    object
}

fn typed<T: serde::de::DeserializeOwned>(object: &Value) -> T {
    serde_json::from_value(object.clone()).unwrap()
}

/// Deserialises `object` as `T` and serialises it back: any field `T` does not know (a typo) is lost on the way
/// and shows as a difference, reported with its path.
fn round_trips_as<T: serde::de::DeserializeOwned + serde::Serialize>(file: &str, object: &Value) {
    let parsed: T = serde_json::from_value(object.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not deserialise: {e}", object["kind"]));
    let back = serde_json::to_value(&parsed).unwrap();
    if let Some(difference) = first_difference(object, &back, String::new()) {
        panic!("{file}: {} {difference}", object["kind"]);
    }
}

fn first_difference(written: &Value, understood: &Value, path: String) -> Option<String> {
    match (written, understood) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    None => return Some(format!("{here}: unknown field (a typo, or not in this API version)")),
                    Some(other) => {
                        if let Some(d) = first_difference(value, other, here) {
                            return Some(d);
                        }
                    }
                }
            }
            None
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            a.iter().zip(b).enumerate().find_map(|(i, (x, y))| first_difference(x, y, format!("{path}[{i}]")))
        }
        _ if written == understood => None,
        _ => Some(format!("{path}: written {written}, understood as {understood}")),
    }
}

#[test]
fn every_object_deserialises_into_its_kubernetes_type_without_losing_a_field() {
    use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let base = objects(BASE);
    let mut kinds = BTreeSet::new();
    for (file, object) in &base {
        let kind = object["kind"].as_str().unwrap_or_else(|| panic!("{file}: no kind"));
        match kind {
            "Namespace" => round_trips_as::<Namespace>(file, object),
            "ServiceAccount" => round_trips_as::<ServiceAccount>(file, object),
            "Role" => round_trips_as::<Role>(file, object),
            "RoleBinding" => round_trips_as::<RoleBinding>(file, object),
            "ClusterRole" => round_trips_as::<ClusterRole>(file, object),
            "ClusterRoleBinding" => round_trips_as::<ClusterRoleBinding>(file, object),
            "ConfigMap" => round_trips_as::<ConfigMap>(file, object),
            "Deployment" => round_trips_as::<Deployment>(file, object),
            "Service" => round_trips_as::<Service>(file, object),
            "PodDisruptionBudget" => round_trips_as::<PodDisruptionBudget>(file, object),
            "HorizontalPodAutoscaler" => round_trips_as::<HorizontalPodAutoscaler>(file, object),
            "NetworkPolicy" => round_trips_as::<NetworkPolicy>(file, object),
            "MutatingWebhookConfiguration" => round_trips_as::<MutatingWebhookConfiguration>(file, object),
            "ValidatingWebhookConfiguration" => round_trips_as::<ValidatingWebhookConfiguration>(file, object),
            other => panic!("{file}: unexpected kind {other}"),
        }
        kinds.insert(kind);
    }
    assert_eq!(kinds.len(), 14, "one of each: {kinds:?}");
    for (file, object) in objects(CERT_MANAGER) {
        match object["kind"].as_str().unwrap() {
            "Issuer" => drop(serde_json::from_value::<cert_manager::Issuer>(object).unwrap()),
            "Certificate" => drop(serde_json::from_value::<cert_manager::Certificate>(object).unwrap()),
            "MutatingWebhookConfiguration" => round_trips_as::<MutatingWebhookConfiguration>(&file, &object),
            "ValidatingWebhookConfiguration" => round_trips_as::<ValidatingWebhookConfiguration>(&file, &object),
            other => panic!("{file}: unexpected kind {other}"),
        }
    }
}

#[test]
fn the_round_trip_catches_a_misspelt_field() {
    let base = objects(BASE);
    let mut deployment = the(&base, "Deployment").clone();
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = serde_json::json!({});
    let caught = std::panic::catch_unwind(|| round_trips_as::<Deployment>("deployment.yaml", &deployment));
    let message = *caught.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains(".spec.template.spec.containers[0].readinesProbe: unknown field"), "{message}");
}

#[test]
fn each_kustomization_lists_every_file_beside_it() {
    let base: Value = documents(&root().join(BASE).join("kustomization.yaml")).remove(0);
    let listed: BTreeSet<String> =
        base["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_owned()).collect();
    let mut present = yaml_files(&root().join(BASE));
    present.remove("kustomization.yaml");
    assert_eq!(listed, present, "{BASE}/kustomization.yaml resources");

    let overlay: Value = documents(&root().join(CERT_MANAGER).join("kustomization.yaml")).remove(0);
    let mut listed: BTreeSet<String> =
        overlay["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_owned()).collect();
    assert!(listed.remove("../base"), "the cert-manager overlay builds on the base");
    listed.extend(overlay["patches"].as_array().unwrap().iter().map(|p| p["path"].as_str().unwrap().to_owned()));
    let mut present = yaml_files(&root().join(CERT_MANAGER));
    present.remove("kustomization.yaml");
    assert_eq!(listed, present, "{CERT_MANAGER}/kustomization.yaml resources and patches");

    let component: Value = documents(&root().join(AVAILABILITY_FIRST).join("kustomization.yaml")).remove(0);
    assert_eq!(component["kind"], "Component");
    let listed: BTreeSet<String> =
        component["patches"].as_array().unwrap().iter().map(|p| p["path"].as_str().unwrap().to_owned()).collect();
    let mut present = yaml_files(&root().join(AVAILABILITY_FIRST));
    present.remove("kustomization.yaml");
    assert_eq!(listed, present, "{AVAILABILITY_FIRST}/kustomization.yaml patches");

    let component: Value = documents(&root().join(REVISION_CANARY).join("kustomization.yaml")).remove(0);
    assert_eq!(component["kind"], "Component");
    let mut listed: BTreeSet<String> =
        component["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_owned()).collect();
    listed.extend(component["patches"].as_array().unwrap().iter().map(|p| p["path"].as_str().unwrap().to_owned()));
    let mut present = yaml_files(&root().join(REVISION_CANARY));
    present.remove("kustomization.yaml");
    assert_eq!(listed, present, "{REVISION_CANARY}/kustomization.yaml resources and patches");
}

#[test]
fn the_validating_companion_fails_closed_on_exactly_the_pods_the_mutating_webhook_sees() {
    let base = objects(BASE);
    let mutating: MutatingWebhookConfiguration = typed(the(&base, "MutatingWebhookConfiguration"));
    let validating: ValidatingWebhookConfiguration = typed(the(&base, "ValidatingWebhookConfiguration"));
    assert_eq!(validating.metadata.name.as_deref(), Some(names::VALIDATING_CONFIGURATION));
    let (mutating, validating) = (mutating.webhooks.unwrap().remove(0), validating.webhooks.unwrap());
    let names_: Vec<&str> = validating.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names_, names::VALIDATING_WEBHOOKS, "the names `certs` patches");
    let validating = &validating[0];
    assert_eq!(mutating.failure_policy.as_deref(), Some("Ignore"), "the mutating webhook fails open");
    assert_eq!(validating.failure_policy.as_deref(), Some("Fail"), "the validating one fails closed");
    assert_eq!(validating.side_effects, "None");
    assert!((2..=5).contains(&validating.timeout_seconds.unwrap()));
    assert_eq!(validating.admission_review_versions, ["v1", "v1beta1"]);
    assert_eq!(validating.client_config.service.as_ref().unwrap().path.as_deref(), Some("/validate"));
    let service = |w: &Option<k8s_openapi::api::admissionregistration::v1::ServiceReference>| {
        let s = w.clone().unwrap();
        (s.name, s.namespace, s.port)
    };
    assert_eq!(service(&validating.client_config.service), service(&mutating.client_config.service));
    // The same pods: rules, selectors and match conditions equal to the mutating webhook's.
    fn json<T: serde::Serialize>(field: &T) -> Value {
        serde_json::to_value(field).unwrap()
    }
    assert_eq!(json(&validating.rules), json(&mutating.rules));
    assert_eq!(json(&validating.namespace_selector), json(&mutating.namespace_selector));
    assert_eq!(json(&validating.object_selector), json(&mutating.object_selector));
    assert_eq!(json(&validating.match_conditions), json(&mutating.match_conditions));
    assert_eq!(validating.match_policy, mutating.match_policy);
}

#[test]
fn the_webhook_configuration_is_safe() {
    let base = objects(BASE);
    let configuration: MutatingWebhookConfiguration = typed(the(&base, "MutatingWebhookConfiguration"));
    assert_eq!(configuration.metadata.name.as_deref(), Some(names::MUTATING_CONFIGURATION));
    let webhooks = configuration.webhooks.unwrap();
    let webhook_names: Vec<&str> = webhooks.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(webhook_names, names::MUTATING_WEBHOOKS, "the names `certs` patches");
    let webhook = &webhooks[0];

    assert_eq!(webhook.admission_review_versions, ["v1", "v1beta1"]);
    assert_eq!(webhook.side_effects, "None");
    let timeout = webhook.timeout_seconds.unwrap();
    assert!((2..=5).contains(&timeout), "timeoutSeconds {timeout}");
    assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"), "fails open");
    assert_eq!(webhook.reinvocation_policy.as_deref(), Some("IfNeeded"));
    assert_eq!(webhook.match_policy.as_deref(), Some("Equivalent"));

    let rules = webhook.rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    let rule = &rules[0];
    assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_owned()][..]), "CREATE only");
    assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]), "the core group only");
    assert_eq!(rule.api_versions.as_deref(), Some(&["v1".to_owned()][..]));
    assert_eq!(rule.resources.as_deref(), Some(&["pods".to_owned()][..]), "pods, no subresources");

    // The namespace selector: opt-in by label, and never the system namespaces or our own.
    let deployment: Deployment = typed(the(&base, "Deployment"));
    let own_namespace = deployment.metadata.namespace.clone().unwrap();
    let selector = webhook.namespace_selector.as_ref().unwrap();
    assert!(selector.match_labels.is_none());
    let expressions = selector.match_expressions.as_ref().unwrap();
    let opt_in = expressions.iter().find(|e| e.key == "sidecar-injector.io/inject").expect("opt-in by label");
    assert_eq!((opt_in.operator.as_str(), opt_in.values.as_deref()), ("In", Some(&["enabled".to_owned()][..])));
    let excluded = expressions.iter().find(|e| e.key == "kubernetes.io/metadata.name").expect("exclusion by name");
    assert_eq!(excluded.operator, "NotIn");
    let excluded = excluded.values.as_ref().unwrap();
    for namespace in ["kube-system", "kube-node-lease", own_namespace.as_str()] {
        assert!(excluded.iter().any(|n| n == namespace), "{namespace} is excluded: {excluded:?}");
    }

    // Per-pod opt-out: the label and, through CEL, the annotation, with exactly the engine's values.
    let object_selector = webhook.object_selector.as_ref().unwrap().match_expressions.as_ref().unwrap();
    assert_eq!(object_selector.len(), 1);
    assert_eq!(
        (object_selector[0].key.as_str(), object_selector[0].operator.as_str()),
        ("sidecar-injector.io/inject", "NotIn")
    );
    assert_eq!(object_selector[0].values.as_deref().unwrap(), OPT_OUT_VALUES);
    let conditions = webhook.match_conditions.as_ref().unwrap();
    let annotation = &conditions.iter().find(|c| c.name == "not-opted-out-by-annotation").unwrap().expression;
    assert!(annotation.contains("object.metadata.annotations['sidecar-injector.io/inject']"), "{annotation}");
    let quoted: Vec<String> = OPT_OUT_VALUES.iter().map(|v| format!("'{v}'")).collect();
    assert!(annotation.contains(&format!("[{}]", quoted.join(", "))), "{annotation}");
    assert!(conditions.iter().any(|c| c.expression.contains("'kubernetes.io/config.mirror'")));

    // It calls our Service, on the port that leads to the container's webhook port, on serve's default path.
    let service: Service = typed(the(&base, "Service"));
    let client = webhook.client_config.service.as_ref().unwrap();
    assert_eq!(client.name, service.metadata.name.clone().unwrap());
    assert_eq!(Some(&client.namespace), service.metadata.namespace.as_ref());
    assert_eq!(client.path.as_deref(), Some("/mutate"));
    let port = service.spec.unwrap().ports.unwrap().into_iter().find(|p| Some(p.port) == client.port).unwrap();
    assert_eq!(port.name.as_deref(), Some("https"));
    assert!(webhook.client_config.ca_bundle.is_none(), "the caBundle comes from an overlay");
}

#[test]
fn the_deployment_is_hardened_and_runs_what_it_mounts() {
    use sidecar_injector::cli::{Cli, Command};
    let base = objects(BASE);
    let deployment: Deployment = typed(the(&base, "Deployment"));
    let spec = deployment.spec;
    assert!(spec.replicas.unwrap() >= 2);
    let pod = spec.template.spec.unwrap();
    let spread = pod.topology_spread_constraints.unwrap();
    assert!(spread.iter().any(|c| c.topology_key == "kubernetes.io/hostname"), "spread across nodes");
    assert_eq!(pod.automount_service_account_token, Some(false));
    let pod_security = pod.security_context.unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.seccomp_profile.unwrap().type_, "RuntimeDefault");

    assert_eq!(pod.containers.len(), 1);
    let container = &pod.containers[0];
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let resources = container.resources.clone().unwrap();
    for key in ["cpu", "memory"] {
        assert!(resources.requests.as_ref().unwrap().contains_key(key), "a {key} request");
    }
    // The memory limit is the one docs/operations.md's arithmetic sums up to (with room for what no setting bounds).
    let limit = resources.limits.unwrap()["memory"].0.clone();
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    let total = docs.lines().find(|l| l.starts_with("| **total**")).expect("the memory table's total");
    let sum: u32 = total.split("**").nth(3).and_then(|n| n.parse().ok()).expect("| **total** | | **N**, of L |");
    assert!(total.ends_with(&format!("of {} |", limit.trim_end_matches("Mi"))), "{total} vs {limit}");
    assert!(limit.ends_with("Mi") && sum * 5 / 4 < limit.trim_end_matches("Mi").parse::<u32>().unwrap(), "{limit}");
    assert!(container.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap().sleep.is_some(), "a preStop delay");

    // The probes use the plain metrics port, on the paths `serve` answers.
    let metrics_port = container.ports.as_ref().unwrap().iter().find(|p| p.name.as_deref() == Some("metrics")).unwrap();
    for (probe, path) in [(&container.readiness_probe, "/readyz"), (&container.liveness_probe, "/healthz")] {
        let http = probe.clone().unwrap().http_get.unwrap();
        assert_eq!(http.path.as_deref(), Some(path));
        assert_eq!(http.port, k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into()));
    }

    let image = container.image.as_deref().unwrap();
    assert!(image.starts_with(&format!("{}:", names::IMAGE)), "the image `certs --image` replaces: {image}");

    // The arguments parse as `serve` and name files in the mounted Secret and ConfigMap, mounted as directories.
    let args = container.args.clone().unwrap();
    let cli =
        <Cli as clap::Parser>::try_parse_from(std::iter::once("sidecar-injector".to_owned()).chain(args)).unwrap();
    let Command::Serve(serve) = cli.command else { panic!("the container runs serve") };
    assert_eq!(
        serve.server.listen.port(),
        container.ports.as_ref().unwrap().iter().find(|p| p.name.as_deref() == Some("https")).unwrap().container_port
            as u16
    );
    assert_eq!(serve.server.metrics_listen.port(), metrics_port.container_port as u16);
    let mounts = container.volume_mounts.clone().unwrap();
    assert!(mounts.iter().all(|m| m.sub_path.is_none()), "subPath mounts never see updates");
    let volumes = pod.volumes.unwrap();
    let mounted = |volume_name: &str| {
        let mount = mounts.iter().find(|m| m.name == volume_name).unwrap();
        let volume = volumes.iter().find(|v| v.name == volume_name).unwrap();
        (PathBuf::from(&mount.mount_path), volume.clone())
    };
    let (tls_dir, tls) = mounted("tls");
    assert_eq!(tls.secret.unwrap().secret_name.as_deref(), Some(names::TLS_SECRET));
    assert_eq!(serve.tls_cert.unwrap(), tls_dir.join("tls.crt"));
    assert_eq!(serve.tls_key.unwrap(), tls_dir.join("tls.key"));
    let (templates_dir, templates) = mounted("templates");
    let configmap: ConfigMap = typed(the(&base, "ConfigMap"));
    assert_eq!(templates.config_map.unwrap().name, configmap.metadata.name.clone().unwrap());
    assert_eq!(serve.template.template_dir[0].dir, templates_dir);

    // The ConfigMap read through the API server is the one mounted, and the one thing the account may do is read
    // it, with the token mounted for this container alone.
    let name = configmap.metadata.name.clone().unwrap();
    assert_eq!(serve.template_configmap.len(), 1);
    assert_eq!(
        (serve.template_configmap[0].revision.as_str(), serve.template_configmap[0].name.as_str()),
        ("default", name.as_str())
    );
    let role: Role = typed(the(&base, "Role"));
    let rules = serde_json::to_value(role.rules.unwrap()).unwrap();
    assert_eq!(
        rules,
        serde_json::json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [name], "verbs": ["get"]}])
    );
    let binding: RoleBinding = typed(the(&base, "RoleBinding"));
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
    let subjects = binding.subjects.unwrap();
    assert_eq!((subjects.len(), subjects[0].kind.as_str()), (1, "ServiceAccount"));
    assert_eq!(Some(&subjects[0].name), pod.service_account_name.as_ref());
    // Events (serve --events): created and patched (their series), and nothing else, in any namespace; the
    // replica's name from the downward API tells the replicas' Events apart.
    let events: ClusterRole = typed(the(&base, "ClusterRole"));
    let rules = serde_json::to_value(events.rules.unwrap()).unwrap();
    assert_eq!(
        rules,
        serde_json::json!([{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}])
    );
    let binding: ClusterRoleBinding = typed(the(&base, "ClusterRoleBinding"));
    assert_eq!(binding.role_ref.name, events.metadata.name.unwrap());
    let subjects = binding.subjects.unwrap();
    assert_eq!(Some(&subjects[0].name), pod.service_account_name.as_ref());
    assert_eq!(subjects[0].namespace.as_deref(), Some("sidecar-injector"));
    let container = &pod.containers[0];
    let pod_name = container.env.iter().flatten().find(|e| e.name == "POD_NAME").expect("POD_NAME");
    let field = pod_name.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str());
    assert_eq!(field, Some("metadata.name"));
    let (token_dir, token) = mounted("api-access");
    assert_eq!(token_dir, Path::new("/var/run/secrets/kubernetes.io/serviceaccount"), "where in-cluster clients look");
    let sources = token.projected.unwrap().sources.unwrap();
    let token = sources.iter().find_map(|s| s.service_account_token.clone()).expect("a bound token");
    assert!(token.expiration_seconds.unwrap() <= 3600, "short-lived");
    assert!(sources.iter().any(|s| s.config_map.as_ref().is_some_and(|c| c.name == "kube-root-ca.crt")), "the CA");
    assert!(sources.iter().any(|s| s.downward_api.is_some()), "the namespace");

    // The injector's own pods are never injected, wherever they run.
    let labels = spec.template.metadata.unwrap().labels.unwrap();
    assert_eq!(labels.get("sidecar-injector.io/inject").map(String::as_str), Some("false"));
}

#[test]
fn the_cert_manager_overlay_issues_the_secret_the_deployment_mounts_for_the_service() {
    let overlay = objects(CERT_MANAGER);
    let serving = overlay
        .iter()
        .map(|(_, o)| o)
        .find(|o| o["kind"] == "Certificate" && o["spec"]["secretName"] == names::TLS_SECRET)
        .expect("a Certificate for the TLS Secret");
    let dns: Vec<&str> = serving["spec"]["dnsNames"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(dns.contains(&format!("{}.{}.svc", names::SERVICE, names::NAMESPACE).as_str()), "{dns:?}");
    let injection = the(&overlay, "MutatingWebhookConfiguration");
    let from = injection["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as_str().unwrap();
    assert_eq!(
        from,
        format!(
            "{}/{}",
            serving["metadata"]["namespace"].as_str().unwrap(),
            serving["metadata"]["name"].as_str().unwrap()
        )
    );
    assert_eq!(injection["metadata"]["name"], names::MUTATING_CONFIGURATION);
}

/// The ConfigMap of templates `manifests/` deploys under `name`, as generated from `templates/`.
fn expected_configmap(name: &str) -> String {
    let mut text = format!(
        "# Generated from templates/ by `SIDECAR_INJECTOR_BLESS=1 cargo test --test suite manifests::`: edit the templates\n\
         # there, not here (a test fails when the two differ). A cluster's templates live in its overlay: `certs`\n\
         # writes templates/ there and a configMapGenerator that replaces this ConfigMap with its files (README).\n\
         apiVersion: v1\n\
         kind: ConfigMap\n\
         metadata:\n  name: {name}\n  namespace: sidecar-injector\n  labels:\n    app.kubernetes.io/name: sidecar-injector\n\
         data:\n",
    );
    for file in yaml_files(&root().join("templates")) {
        let source = std::fs::read_to_string(root().join("templates").join(&file)).unwrap();
        assert!(
            !source.starts_with([' ', '\n']) && source.ends_with('\n') && !source.ends_with("\n\n"),
            "{file}: one trailing newline, no leading space"
        );
        text.push_str(&format!("  {file}: |\n"));
        for line in source.lines() {
            if line.is_empty() {
                text.push('\n');
            } else {
                text.push_str(&format!("    {line}\n"));
            }
        }
    }
    text
}

#[test]
fn the_configmap_carries_the_templates_and_they_pass_check() {
    // The canary revision starts as a copy of the default one: its ConfigMap is the one edited for a canary.
    for (dir, name) in [(BASE, "sidecar-injector-templates"), (REVISION_CANARY, "sidecar-injector-templates-canary")] {
        let path = root().join(dir).join("configmap.yaml");
        let expected = expected_configmap(name);
        if std::env::var_os("SIDECAR_INJECTOR_BLESS").is_some() {
            std::fs::write(&path, &expected).unwrap();
        }
        let actual = std::fs::read_to_string(&path).unwrap();
        assert!(
            actual == expected,
            "{} differs from templates/: run `SIDECAR_INJECTOR_BLESS=1 cargo test --test suite manifests::`",
            path.display()
        );
    }
    let path = root().join(BASE).join("configmap.yaml");

    // What the kubelet will write into the mounted directory is exactly the template files...
    let configmap: ConfigMap = typed(&documents(&path)[0]);
    let data = configmap.data.unwrap();
    assert_eq!(data.keys().cloned().collect::<BTreeSet<_>>(), yaml_files(&root().join("templates")));
    let dir = tempfile::tempdir().unwrap();
    for (file, source) in &data {
        assert_eq!(source, &std::fs::read_to_string(root().join("templates").join(file)).unwrap(), "{file}");
        std::fs::write(dir.path().join(file), source).unwrap();
    }
    // ...and `check` accepts it as the injector will load it.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .args(["check", dir.path().to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// `kubectl kustomize` builds the base and both overlays. Run it where kubectl is installed:
/// `cargo test --test suite -- --ignored manifests::`.
#[test]
#[ignore = "needs kubectl on PATH (CI machines lack it)"]
fn kustomize_builds_the_base_and_the_overlays() {
    let kubectl = kubectl().expect("kubectl is on PATH (this test is run on purpose, with --ignored)");
    let build = |dir: &Path| -> Vec<Value> {
        let output = std::process::Command::new(&kubectl).arg("kustomize").arg(dir).output().unwrap();
        assert!(
            output.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        sidecar_injector_core::offline::read_documents(std::str::from_utf8(&output.stdout).unwrap()).unwrap()
    };
    let base = build(&root().join(BASE));
    assert_eq!(base.len(), objects(BASE).len());
    let deployment = base.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "ghcr.io/sidecar-injector/sidecar-injector:0.1.0"
    );

    let with_cert_manager = build(&root().join(CERT_MANAGER));
    for (kind, policy) in [("MutatingWebhookConfiguration", "Ignore"), ("ValidatingWebhookConfiguration", "Fail")] {
        let webhook = with_cert_manager.iter().find(|o| o["kind"] == kind).unwrap();
        assert!(webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_string(), "{kind}");
        assert_eq!(webhook["webhooks"][0]["failurePolicy"], policy, "the patch keeps the base's webhooks");
    }

    // The overlay `certs` writes, built on the base.
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .current_dir(root())
        .args(["certs", "--image", "registry:5000/team/injector:1.20", "--out"])
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success());
    let with_certs = build(out.path());
    let secret = with_certs.iter().find(|o| o["kind"] == "Secret").expect("the TLS Secret");
    assert_eq!(secret["metadata"]["name"], names::TLS_SECRET);
    assert_eq!(secret["metadata"]["namespace"], names::NAMESPACE);
    assert_eq!(secret["type"], "kubernetes.io/tls");
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    // kustomize wraps long base64 lines; Go's decoder (the API server's) skips the newlines.
    let cert: String = secret["data"]["tls.crt"].as_str().unwrap().split_whitespace().collect();
    let cert = b64.decode(cert).unwrap();
    assert_eq!(cert, std::fs::read(out.path().join("tls.crt")).unwrap());
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        let webhook = with_certs.iter().find(|o| o["kind"] == kind).unwrap();
        let bundle = b64.decode(webhook["webhooks"][0]["clientConfig"]["caBundle"].as_str().unwrap()).unwrap();
        assert_eq!(bundle, std::fs::read(out.path().join("ca.crt")).unwrap(), "{kind}");
        assert_eq!(
            webhook["webhooks"][0]["clientConfig"]["service"]["name"],
            names::SERVICE,
            "the patch keeps the rest"
        );
    }
    assert_eq!(with_certs.len(), base.len() + 1);
    // The templates: the overlay's files, seeded with the shipped ones, in place of the base's ConfigMap.
    let configmap = |objects: &[Value]| objects.iter().find(|o| o["kind"] == "ConfigMap").unwrap().clone();
    assert_eq!(configmap(&with_certs), configmap(&base), "seeded with the shipped templates: the same ConfigMap");
    let edited = "# the user's edit\n";
    std::fs::write(out.path().join("templates/demo.yaml"), edited).unwrap();
    let with_edit = configmap(&build(out.path()));
    assert_eq!(with_edit["data"]["demo.yaml"], edited, "the overlay's file, not the base's");
    assert_eq!(with_edit["metadata"], configmap(&base)["metadata"], "the same name, namespace and labels");
    let deployment = with_certs.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(deployment["spec"]["template"]["spec"]["containers"][0]["image"], "registry:5000/team/injector:1.20");

    // The availability-first component, added to that overlay.
    let kustomization = out.path().join("kustomization.yaml");
    let mut text = std::fs::read_to_string(&kustomization).unwrap();
    let component = root().join(AVAILABILITY_FIRST);
    text.push_str(&format!("components:\n  - {}\n", pathdiff::diff_paths(&component, out.path()).unwrap().display()));
    std::fs::write(&kustomization, text).unwrap();
    let relaxed = build(out.path());
    let validating = relaxed.iter().find(|o| o["kind"] == "ValidatingWebhookConfiguration").unwrap();
    assert_eq!(validating["webhooks"][0]["failurePolicy"], "Ignore");
    assert!(validating["webhooks"][0]["clientConfig"]["caBundle"].is_string(), "the rest of the webhook is kept");
    let container =
        &relaxed.iter().find(|o| o["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "SIDECAR_INJECTOR_VALIDATION" && e["value"] == "warn")
    );
    assert!(
        container["env"].as_array().unwrap().iter().any(|e| e["name"] == "SIDECAR_INJECTOR_WORKERS"),
        "the env list is merged"
    );

    // The konnectivity component: port 8443 from the agents in kube-system only, the metrics rule kept.
    let component = root().join(WEBHOOKS_FROM_KONNECTIVITY);
    let text = std::fs::read_to_string(&kustomization).unwrap();
    let text = text.replace(
        "components:\n",
        &format!("components:\n  - {}\n", pathdiff::diff_paths(&component, out.path()).unwrap().display()),
    );
    std::fs::write(&kustomization, text).unwrap();
    let narrowed = build(out.path());
    let policy = narrowed.iter().find(|o| o["kind"] == "NetworkPolicy").unwrap();
    let webhooks = &policy["spec"]["ingress"][0];
    assert_eq!(webhooks["ports"][0]["port"], 8443);
    let sources = webhooks["from"].as_array().expect("8443 from named sources");
    assert_eq!(sources.len(), 2);
    for source in sources {
        assert_eq!(source["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "kube-system");
        let labels = source["podSelector"]["matchLabels"].as_object().unwrap();
        assert!(labels.values().all(|v| v == "konnectivity-agent") && labels.len() == 1, "{source}");
    }
    assert_eq!(policy["spec"]["ingress"][1]["ports"][0]["port"], 9090, "the metrics rule is kept");
}

fn kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("kubectl")).find(|candidate| {
        candidate.is_file()
            && std::process::Command::new(candidate)
                .args(["kustomize", "--help"])
                .output()
                .is_ok_and(|o| o.status.success())
    })
}

/// The cert-manager resources we write, as far as we use them: serde refuses a field it does not know. The
/// fields are read by serde only.
#[allow(dead_code)]
mod cert_manager {
    use serde::Deserialize;
    use serde_json::Value;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Issuer {
        api_version: ApiVersion,
        kind: String,
        metadata: Value,
        spec: IssuerSpec,
    }

    #[derive(Deserialize)]
    enum ApiVersion {
        #[serde(rename = "cert-manager.io/v1")]
        V1,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct IssuerSpec {
        self_signed: Option<Value>,
        ca: Option<CaIssuer>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct CaIssuer {
        secret_name: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Certificate {
        api_version: ApiVersion,
        kind: String,
        metadata: Value,
        spec: CertificateSpec,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct CertificateSpec {
        secret_name: String,
        #[serde(default, rename = "isCA")]
        is_ca: bool,
        common_name: Option<String>,
        #[serde(default)]
        dns_names: Vec<String>,
        duration: Option<String>,
        renew_before: Option<String>,
        #[serde(default)]
        usages: Vec<String>,
        private_key: Option<PrivateKey>,
        issuer_ref: IssuerRef,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct PrivateKey {
        algorithm: String,
        size: u32,
        rotation_policy: Option<String>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct IssuerRef {
        kind: String,
        name: String,
    }
}

/// The matchConditions, evaluated by an independent CEL interpreter with the strings extension the API server
/// offers: an expression that fails to evaluate would skip the webhook (failurePolicy Ignore) for every pod.
#[test]
fn the_match_conditions_skip_exactly_the_pods_the_engine_skips() {
    use std::sync::Arc;
    let base = objects(BASE);
    let configuration: MutatingWebhookConfiguration = typed(the(&base, "MutatingWebhookConfiguration"));
    let conditions = configuration.webhooks.unwrap().remove(0).match_conditions.unwrap();
    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings).unwrap();
    let env = Arc::new(env);
    let programs: Vec<_> = conditions
        .iter()
        .map(|c| (c.name.clone(), env.compile(&c.expression).unwrap_or_else(|e| panic!("{}: {e:?}", c.name))))
        .collect();
    let called = |metadata: Value| -> bool {
        let mut context = cel::Context::with_env(env.clone());
        context.add_variable("object", serde_json::json!({"metadata": metadata, "spec": {}})).unwrap();
        programs.iter().all(|(name, program)| match program.execute(&context) {
            Ok(value) => value == cel::Value::from(true),
            Err(e) => panic!("{name} fails on {metadata}: {e:?}"),
        })
    };
    assert!(called(serde_json::json!({"name": "web"})), "no annotations at all");
    assert!(called(serde_json::json!({"annotations": {"other": "x"}})));
    for yes in ["true", "enabled", ""] {
        assert!(called(serde_json::json!({"annotations": {"sidecar-injector.io/inject": yes}})), "{yes:?}");
    }
    for no in OPT_OUT_VALUES.iter().flat_map(|v| [v.to_string(), v.to_uppercase(), format!(" {v} ")]) {
        assert!(!called(serde_json::json!({"annotations": {"sidecar-injector.io/inject": no}})), "{no:?}");
    }
    assert!(!called(serde_json::json!({"annotations": {"kubernetes.io/config.mirror": "abc"}})), "a mirror pod");
}

/// The preview webhook: warnings only (it fails open and never sees a pod), in the pod webhooks' namespaces, for
/// the workload kinds `inject` reads, and called only for what the injector would preview: its matchConditions,
/// run by the independent CEL interpreter, skip exactly what `/preview` skips itself.
#[test]
fn the_preview_webhook_warns_about_workloads_in_the_injected_namespaces_and_skips_what_the_injector_skips() {
    use std::sync::Arc;
    let base = objects(BASE);
    let mutating: MutatingWebhookConfiguration = typed(the(&base, "MutatingWebhookConfiguration"));
    let validating: ValidatingWebhookConfiguration = typed(the(&base, "ValidatingWebhookConfiguration"));
    let mutating = mutating.webhooks.unwrap().remove(0);
    let preview = validating.webhooks.unwrap().into_iter().find(|w| w.name == "preview.sidecar-injector.io").unwrap();
    assert_eq!(preview.failure_policy.as_deref(), Some("Ignore"), "warnings only: never the reason a workload fails");
    assert_eq!(preview.side_effects, "None");
    assert_eq!(preview.client_config.service.as_ref().unwrap().path.as_deref(), Some("/preview"));
    assert_eq!(
        serde_json::to_value(&preview.namespace_selector).unwrap(),
        serde_json::to_value(&mutating.namespace_selector).unwrap(),
        "the injected namespaces"
    );
    let mut kinds: Vec<(String, String)> = Vec::new();
    for rule in preview.rules.iter().flatten() {
        assert_eq!(rule.operations.as_deref().unwrap(), ["CREATE", "UPDATE"]);
        assert_eq!(rule.api_versions.as_deref().unwrap(), ["v1"]);
        for group in rule.api_groups.iter().flatten() {
            kinds.extend(rule.resources.iter().flatten().map(|r| (group.clone(), r.clone())));
        }
    }
    let expected = [
        ("apps", "deployments"),
        ("apps", "statefulsets"),
        ("apps", "daemonsets"),
        ("apps", "replicasets"),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
    ];
    assert_eq!(kinds, expected.map(|(g, r)| (g.to_owned(), r.to_owned())), "no subresource (scale) and no pods");

    let mut env = cel::Env::stdlib();
    env.add_extension(cel::extensions::strings).unwrap();
    let env = Arc::new(env);
    let conditions = preview.match_conditions.unwrap();
    let programs: Vec<_> = conditions
        .iter()
        .map(|c| (c.name.clone(), env.compile(&c.expression).unwrap_or_else(|e| panic!("{}: {e:?}", c.name))))
        .collect();
    let called = |operation: &str, object: &Value, old: &Value| -> bool {
        let mut context = cel::Context::with_env(env.clone());
        context.add_variable("object", object.clone()).unwrap();
        context.add_variable("oldObject", old.clone()).unwrap();
        context.add_variable("request", serde_json::json!({"operation": operation})).unwrap();
        programs.iter().all(|(name, program)| match program.execute(&context) {
            Ok(value) => value == cel::Value::from(true),
            Err(e) => panic!("{name} fails on {operation} {object}: {e:?}"),
        })
    };
    let template = |image: &str| serde_json::json!({"spec": {"containers": [{"name": "app", "image": image}]}});
    let deployment = |image: &str, replicas: u32| serde_json::json!({"metadata": {"name": "web"}, "spec": {"replicas": replicas, "template": template(image)}});
    let cronjob = |image: &str| serde_json::json!({"metadata": {"name": "nightly"}, "spec": {"jobTemplate": {"spec": {"template": template(image)}}}});
    assert!(called("CREATE", &deployment("a", 1), &Value::Null));
    assert!(called("UPDATE", &deployment("b", 1), &deployment("a", 1)), "a new pod template");
    assert!(!called("UPDATE", &deployment("a", 3), &deployment("a", 1)), "scaled: the same pod template");
    assert!(called("UPDATE", &cronjob("b"), &cronjob("a")));
    assert!(!called("UPDATE", &cronjob("a"), &cronjob("a")));
    let mut owned = deployment("a", 1);
    owned["metadata"]["ownerReferences"] =
        serde_json::json!([{"kind": "Deployment", "name": "web", "controller": true}]);
    assert!(!called("CREATE", &owned, &Value::Null), "a controller's ReplicaSet");
    owned["metadata"]["ownerReferences"] =
        serde_json::json!([{"kind": "ConfigMap", "name": "c"}, {"kind": "X", "controller": false}]);
    assert!(called("CREATE", &owned, &Value::Null), "owned, but not by a controller");
}

/// The Dockerfile builds the binary the Deployment runs, as the user the Deployment expects, from a context
/// that holds everything cargo needs (it cannot be built here: no container daemon).
#[test]
fn the_dockerfile_matches_the_deployment_and_its_context_holds_the_sources() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(stages.len(), 2, "multi-stage: {stages:?}");
    assert!(stages[1].contains("distroless"), "the final image is distroless: {}", stages[1]);
    let copies: Vec<&str> = dockerfile.lines().filter(|l| l.starts_with("COPY --from")).collect();
    assert_eq!(copies, ["COPY --from=build /sidecar-injector /sidecar-injector"], "the binary only");
    // The binary is manifests/pgo-build.sh's (profile-guided), built from the lock file.
    assert!(dockerfile.contains("manifests/pgo-build.sh --profile dist --out /sidecar-injector"));
    let pgo_build = std::fs::read_to_string(root().join("manifests/pgo-build.sh")).unwrap();
    assert!(pgo_build.contains("--bin sidecar-injector") && pgo_build.contains("--locked"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/sidecar-injector"]"#));

    // The Rust image is at least the crate's rust-version.
    let rust_image = stages[0].split_whitespace().nth(1).unwrap();
    let image_version = rust_image.trim_start_matches("rust:").split('-').next().unwrap();
    let cargo_toml = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let required = cargo_toml.lines().find_map(|l| l.strip_prefix("rust-version = ")).unwrap().trim_matches('"');
    let version = |v: &str| v.split('.').map(|n| n.parse::<u32>().unwrap()).collect::<Vec<_>>();
    assert!(version(image_version) >= version(required), "{rust_image} builds rust-version {required}");

    // The user is the Deployment's.
    let user = dockerfile.lines().find_map(|l| l.strip_prefix("USER ")).unwrap();
    let deployment: Deployment = typed(the(&objects(BASE), "Deployment"));
    let uid = deployment.spec.template.spec.unwrap().security_context.unwrap().run_as_user.unwrap();
    assert_eq!(user, format!("{uid}:{uid}"));

    // .dockerignore leaves in what cargo reads to build the binary (the workspace's members and targets, and the
    // built-in template compiled into it) and what the profile-guided build trains with (the script, the load
    // harness's pods and review), and leaves out the rest of the tests and manifests.
    let patterns: Vec<(bool, String)> = std::fs::read_to_string(root().join(".dockerignore"))
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (kept, pattern) = l.strip_prefix('!').map_or((false, l), |rest| (true, rest));
            (kept, pattern.trim_start_matches("**/").trim_end_matches('/').to_owned())
        })
        .collect();
    // As Docker reads it: the last pattern that matches decides; `DIR/*` matches what is inside DIR.
    let excluded = |path: &str| {
        let matches = |pattern: &str| match pattern.strip_suffix("/*") {
            Some(dir) => path.starts_with(&format!("{dir}/")),
            None => path == pattern || path.starts_with(&format!("{pattern}/")),
        };
        patterns.iter().rev().find(|(_, pattern)| matches(pattern)).is_some_and(|(kept, _)| !kept)
    };
    let needed = ["Cargo.toml", "Cargo.lock", "src", "templates", "benches", "loadtest/Cargo.toml", "loadtest/src"];
    let trained_with =
        ["manifests/pgo-build.sh", "tests/corpus/pods", "tests/corpus/reviews/apiserver-1.20-pod-create.json"];
    for needed in needed.into_iter().chain(trained_with) {
        assert!(root().join(needed).exists(), "{needed}");
        assert!(!excluded(needed), ".dockerignore leaves out {needed}, which the build needs");
    }
    for left_out in ["manifests/base", "tests/e2e", ".git"] {
        assert!(excluded(left_out), ".dockerignore lets {left_out} into the build context");
    }
}

/// Does a label selector's `matchExpressions` select an object with `labels`?
fn selects(selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector, labels: &[(&str, &str)]) -> bool {
    assert!(selector.match_labels.is_none(), "the webhooks select by expressions only");
    selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.iter().find(|(k, _)| *k == e.key).map(|(_, v)| *v);
        let listed = |v: &str| e.values.iter().flatten().any(|x| x == v);
        match e.operator.as_str() {
            "In" => value.is_some_and(listed),
            "NotIn" => !value.is_some_and(listed),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => panic!("operator {other}"),
        }
    })
}

/// The base's objects with the canary component's patches applied, as kustomize applies them.
fn with_canary() -> (Deployment, MutatingWebhookConfiguration, ValidatingWebhookConfiguration, ConfigMap) {
    let base = objects(BASE);
    let patched = |kind: &str, file: &str| -> Value {
        let mut object = the(&base, kind).clone();
        let patch: json_patch::Patch =
            serde_json::from_value(documents(&root().join(REVISION_CANARY).join(file)).remove(0)).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
        object
    };
    let configmap = typed(&documents(&root().join(REVISION_CANARY).join("configmap.yaml"))[0]);
    (
        typed(&patched("Deployment", "deployment.yaml")),
        typed(&patched("MutatingWebhookConfiguration", "mutatingwebhookconfiguration.yaml")),
        typed(&patched("ValidatingWebhookConfiguration", "validatingwebhookconfiguration.yaml")),
        configmap,
    )
}

#[test]
fn the_canary_component_adds_a_revision_the_server_serves_for_its_namespaces_alone() {
    use sidecar_injector::cli::{Cli, Command};
    let (deployment, mutating, validating, configmap) = with_canary();
    fn json<T: serde::Serialize>(field: &T) -> Value {
        serde_json::to_value(field).unwrap()
    }

    // Each configuration gains one webhook for each of the default's: the same, but for its name, path and
    // namespaces.
    let mutating = mutating.webhooks.unwrap();
    let validating = validating.webhooks.unwrap();
    let defaults_and_canaries = [(json(&mutating), &["/mutate"][..]), (json(&validating), &["/validate", "/preview"])];
    for (webhooks, paths) in defaults_and_canaries {
        let webhooks = webhooks.as_array().unwrap();
        assert_eq!(webhooks.len(), 2 * paths.len(), "{webhooks:?}");
        let (defaults, canaries) = webhooks.split_at(paths.len());
        for ((default, canary), path) in defaults.iter().zip(canaries).zip(paths) {
            assert_eq!(canary["name"], format!("canary.{}", default["name"].as_str().unwrap()));
            assert_eq!(canary["clientConfig"]["service"]["path"], format!("{path}/canary"));
            let mut same = canary.clone();
            same["name"] = default["name"].clone();
            same["clientConfig"] = default["clientConfig"].clone();
            same["namespaceSelector"] = default["namespaceSelector"].clone();
            assert_eq!(&same, default, "the canary's {path} webhook differs from the default's only where it must");
        }
    }

    // Routing: a namespace is the default revision's or the canary's, never both; the system ones neither's.
    let (default, canary) = (&mutating[0], &mutating[1]);
    let routed = |labels: &[(&str, &str)]| {
        let to = |w: &k8s_openapi::api::admissionregistration::v1::MutatingWebhook| {
            selects(w.namespace_selector.as_ref().unwrap(), labels)
        };
        (to(default), to(canary))
    };
    let name = |n| ("kubernetes.io/metadata.name", n);
    let (inject, on_canary) = (("sidecar-injector.io/inject", "enabled"), ("sidecar-injector.io/rev", "canary"));
    assert_eq!(routed(&[name("shop"), inject]), (true, false), "opted in: the default revision");
    assert_eq!(routed(&[name("shop"), inject, on_canary]), (false, true), "one label moves it to the canary");
    assert_eq!(routed(&[name("shop"), on_canary]), (false, true));
    assert_eq!(
        routed(&[name("shop"), inject, ("sidecar-injector.io/rev", "beta")]),
        (false, false),
        "no such revision"
    );
    assert_eq!(routed(&[name("shop")]), (false, false), "not opted in");
    assert_eq!(routed(&[name("kube-system"), on_canary]), (false, false), "never a system namespace");
    assert_eq!(routed(&[name("sidecar-injector"), inject]), (false, false), "never our own");

    // The Deployment serves both revisions, each from the ConfigMap mounted where its --template-dir points.
    let pod = deployment.spec.template.spec.unwrap();
    let container = &pod.containers[0];
    let mut args = vec!["sidecar-injector".to_owned()];
    args.extend(container.args.clone().unwrap());
    let Command::Serve(serve) = <Cli as clap::Parser>::try_parse_from(&args).unwrap().command else { panic!("serve") };
    let revisions: Vec<(String, String)> = serve
        .template
        .template_dir
        .iter()
        .map(|r| {
            let mount = container.volume_mounts.iter().flatten().find(|m| Path::new(&m.mount_path) == r.dir).unwrap();
            let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name).unwrap();
            (r.revision.clone(), volume.config_map.clone().unwrap().name)
        })
        .collect();
    assert_eq!(
        revisions,
        [
            ("default".to_owned(), "sidecar-injector-templates".to_owned()),
            ("canary".to_owned(), configmap.metadata.name.clone().unwrap())
        ]
    );
    // Each revision reads, through the API server, the ConfigMap it mounts, and the role allows exactly those.
    let read: Vec<(String, String)> =
        serve.template_configmap.iter().map(|c| (c.revision.clone(), c.name.clone())).collect();
    assert_eq!(read, revisions);
    let base = objects(BASE);
    let mut role = the(&base, "Role").clone();
    let patch: json_patch::Patch =
        serde_json::from_value(documents(&root().join(REVISION_CANARY).join("role.yaml")).remove(0)).unwrap();
    json_patch::patch(&mut role, &patch).unwrap();
    let allowed: Vec<&str> =
        role["rules"][0]["resourceNames"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(allowed, revisions.iter().map(|(_, name)| name.as_str()).collect::<Vec<_>>());
}

/// The NetworkPolicy lets anyone reach the webhooks (the API server's address is the cluster's), the metrics port
/// only from pods carrying the label docs/operations.md tells Prometheus to carry, and out only to the API server.
#[test]
fn the_network_policy_admits_the_metrics_port_only_from_labelled_scrapers() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let base = objects(BASE);
    let policy: NetworkPolicy = typed(the(&base, "NetworkPolicy"));
    let spec = policy.spec.unwrap();
    let deployment: Deployment = typed(the(&base, "Deployment"));
    let pod_labels = deployment.spec.template.metadata.unwrap().labels.unwrap();
    // Selectors by `matchLabels` only, here.
    let selects = |selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
                   labels: &[(&str, &str)]| {
        assert!(selector.match_expressions.is_none(), "{selector:?}");
        let wanted = selector.match_labels.iter().flatten();
        wanted.clone().count() > 0 && wanted.into_iter().all(|(k, v)| labels.contains(&(k.as_str(), v.as_str())))
    };
    let pod_labels: Vec<(&str, &str)> = pod_labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert!(selects(&spec.pod_selector.unwrap(), &pod_labels), "the policy selects the injector's pods");
    // Egress: TCP to the API server's usual ports, nothing else (no DNS).
    let egress = serde_json::to_value(spec.egress.unwrap()).unwrap();
    assert_eq!(
        egress,
        serde_json::json!([{"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}]),
        "egress to the API server only"
    );
    let rules = spec.ingress.unwrap();
    let port_of = |port: i32| {
        let rule = rules.iter().find(|r| {
            r.ports
                .iter()
                .flatten()
                .any(|p| p.port == Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port)))
        });
        rule.unwrap_or_else(|| panic!("no rule for port {port}")).clone()
    };
    assert!(port_of(8443).from.is_none(), "the webhooks: from anywhere");
    let scrapers = port_of(9090).from.expect("the metrics port: from named sources only");
    let label = ("sidecar-injector.io/metrics-scraper", "true");
    assert!(!scrapers.is_empty());
    for peer in &scrapers {
        assert!(peer.ip_block.is_none(), "{peer:?}");
        let pods = peer.pod_selector.as_ref().expect("pods, by label");
        assert!(selects(pods, &[label]) && !selects(pods, &[]), "{peer:?}: only the labelled pods");
    }
    let docs = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    assert!(docs.contains(&format!("`{}: \"{}\"`", label.0, label.1)), "docs/operations.md names the label");
}

/// The Helm chart carries the shipped templates as files of its own (Helm reads nothing outside the chart's
/// directory): charts/sidecar-injector/files/templates/ holds exactly the files of templates/, byte for byte.
/// `SIDECAR_INJECTOR_BLESS=1 cargo test --test suite manifests::` copies them, as it regenerates the ConfigMaps;
/// tests/e2e/helm.rs checks that the chart deploys them as manifests/base does.
#[test]
fn the_helm_chart_carries_the_templates() {
    let chart = root().join("charts/sidecar-injector/files/templates");
    let shipped = yaml_files(&root().join("templates"));
    let carried = || -> BTreeSet<String> {
        std::fs::read_dir(&chart).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect()
    };
    if std::env::var_os("SIDECAR_INJECTOR_BLESS").is_some() {
        for stale in carried().difference(&shipped) {
            std::fs::remove_file(chart.join(stale)).unwrap();
        }
        for file in &shipped {
            std::fs::copy(root().join("templates").join(file), chart.join(file)).unwrap();
        }
    }
    let bless = "run `SIDECAR_INJECTOR_BLESS=1 cargo test --test suite manifests::`";
    assert_eq!(carried(), shipped, "{} holds other files than templates/: {bless}", chart.display());
    for file in &shipped {
        let theirs = std::fs::read(root().join("templates").join(file)).unwrap();
        let ours = std::fs::read(chart.join(file)).unwrap();
        assert!(ours == theirs, "{}/{file} differs from templates/{file}: {bless}", chart.display());
    }
}
