//! THE BASELINE: the webhook a competent Rust engineer writes the usual way, to measure sidecar-injector against
//! in the same run (`--start-baseline`, `--compare`). It is part of the harness only, never of the injector.
//!
//! axum + axum-server (rustls); the whole review deserialised with `serde_json` into typed structs around a typed
//! `k8s-openapi` Pod; the sidecar built as typed `Container`s and `Volume`s; the patch a `json_patch::Patch` of
//! `add` operations, serialised, base64-encoded, and the response serialised with `serde_json`. It injects what
//! the built-in template injects (proxy container, init container, volume, label, status annotation), skips what
//! is not a Pod CREATE, pods that opted out and pods that already have the proxy. No per-request logging.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use axum::Json;
use axum::routing::post;
use base64::Engine as _;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Pod, Probe, ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `loadtest __baseline`, and the start of `loadtest __floor-server`: where to listen and with which certificate.
#[derive(Debug, clap::Args)]
pub struct BaselineArgs {
    /// HTTPS listener.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Serving certificate (PEM).
    #[arg(long)]
    pub tls_cert: PathBuf,
    /// Its key (PEM).
    #[arg(long)]
    pub tls_key: PathBuf,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionReview {
    api_version: String,
    request: Option<AdmissionRequest>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct AdmissionRequest {
    uid: String,
    kind: GroupVersionKind,
    operation: String,
    namespace: Option<String>,
    object: Option<Pod>,
}

#[derive(Deserialize, Default)]
struct GroupVersionKind {
    kind: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionReviewResponse {
    api_version: String,
    kind: &'static str,
    response: AdmissionResponse,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionResponse {
    uid: String,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
}

/// Runs the baseline until killed.
pub fn run(args: &BaselineArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&args.tls_cert, &args.tls_key)
            .await
            .map_err(|e| format!("certificate: {e}"))?;
        let app = axum::Router::new().route("/mutate", post(mutate));
        axum_server::bind_rustls(args.listen, config).serve(app.into_make_service()).await.map_err(|e| e.to_string())
    })
}

async fn mutate(Json(review): Json<AdmissionReview>) -> Json<AdmissionReviewResponse> {
    let request = review.request.unwrap_or_default();
    let patch = match (&request.object, request.kind.kind.as_str(), request.operation.as_str()) {
        (Some(pod), "Pod", "CREATE") => patch_for(pod, request.namespace.as_deref().unwrap_or("default")),
        _ => None,
    };
    let patch = patch.map(|patch| {
        // Serialising a Patch of Values cannot fail.
        base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&patch).unwrap())
    });
    Json(AdmissionReviewResponse {
        api_version: review.api_version,
        kind: "AdmissionReview",
        response: AdmissionResponse {
            uid: request.uid,
            allowed: true,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
        },
    })
}

const PREFIX: &str = "sidecar-injector.io";

fn patch_for(pod: &Pod, namespace: &str) -> Option<Patch> {
    let annotations = pod.metadata.annotations.as_ref();
    if annotations.and_then(|a| a.get(&format!("{PREFIX}/inject"))).is_some_and(|v| v == "false") {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    if spec.containers.iter().any(|c| c.name == "proxy") {
        return None;
    }
    let mut ops = Vec::new();
    let mut add =
        |path: String, value: Value| ops.push(PatchOperation::Add(AddOperation { path: path.parse().unwrap(), value }));

    add("/spec/containers/-".into(), json(&proxy(pod, namespace)));
    match spec.init_containers.as_ref().filter(|c| !c.is_empty()) {
        Some(_) => add("/spec/initContainers/0".into(), json(&proxy_init())),
        None => add("/spec/initContainers".into(), json(&vec![proxy_init()])),
    }
    match spec.volumes.as_ref().filter(|v| !v.is_empty()) {
        Some(_) => add("/spec/volumes/-".into(), json(&volume())),
        None => add("/spec/volumes".into(), json(&vec![volume()])),
    }
    let label = format!("{PREFIX}/injected");
    match pod.metadata.labels.as_ref().filter(|l| !l.is_empty()) {
        Some(_) => add(format!("/metadata/labels/{}", label.replace('/', "~1")), Value::from("true")),
        None => add("/metadata/labels".into(), json(&BTreeMap::from([(label, "true".to_owned())]))),
    }
    let status = format!("{PREFIX}/status");
    let status_value =
        r#"{"containers":["proxy"],"initContainers":["proxy-init"],"volumes":["sidecar-injector-proxy"]}"#;
    match annotations.filter(|a| !a.is_empty()) {
        Some(_) => add(format!("/metadata/annotations/{}", status.replace('/', "~1")), Value::from(status_value)),
        None => add("/metadata/annotations".into(), json(&BTreeMap::from([(status, status_value.to_owned())]))),
    }
    Some(Patch(ops))
}

/// A typed value as JSON: containers, volumes and maps of strings always serialise.
fn json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap()
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction { path: Some(path.into()), port: IntOrString::Int(15000), ..Default::default() }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn mount() -> VolumeMount {
    VolumeMount { name: "sidecar-injector-proxy".into(), mount_path: "/var/run/proxy".into(), ..Default::default() }
}

fn resources(cpu: &str, memory: &str, limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), Quantity(cpu.into())),
            ("memory".into(), Quantity(memory.into())),
        ])),
        limits: Some(BTreeMap::from([("memory".into(), Quantity(limit.into()))])),
        ..Default::default()
    }
}

fn proxy(pod: &Pod, namespace: &str) -> Container {
    let labels = pod.metadata.labels.as_ref();
    let service = labels
        .and_then(|l| l.get("app.kubernetes.io/name").or_else(|| l.get("app")))
        .or(pod.metadata.generate_name.as_ref())
        .or(pod.metadata.name.as_ref())
        .cloned()
        .unwrap_or_else(|| namespace.to_owned());
    let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_default();
    Container {
        name: "proxy".into(),
        image: Some("ghcr.io/sidecar-injector/proxy:1.4.2".into()),
        args: Some(vec!["run".into(), "--log-level=info".into(), "--admin-port=15000".into()]),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_IP", "status.podIP"),
            EnvVar { name: "PROXY_SERVICE_NAME".into(), value: Some(service), ..Default::default() },
            EnvVar { name: "PROXY_SERVICE_ACCOUNT".into(), value: Some(account), ..Default::default() },
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("proxy-admin".into()),
            container_port: 15000,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(http_probe("/ready", 5, 3)),
        liveness_probe: Some(http_probe("/live", 10, 6)),
        startup_probe: Some(http_probe("/ready", 1, 60)),
        resources: Some(resources("50m", "64Mi", "256Mi")),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(1337),
            run_as_group: Some(1337),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![mount()]),
        ..Default::default()
    }
}

fn proxy_init() -> Container {
    Container {
        name: "proxy-init".into(),
        image: Some("ghcr.io/sidecar-injector/proxy-init:1.4.2".into()),
        args: Some(vec![
            "--proxy-uid=1337".into(),
            "--inbound-port=15006".into(),
            "--outbound-port=15001".into(),
            "--exclude-ports=15000".into(),
        ]),
        resources: Some(resources("10m", "16Mi", "32Mi")),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(false),
            run_as_user: Some(0),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: Some(vec!["NET_ADMIN".into(), "NET_RAW".into()]),
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![mount()]),
        ..Default::default()
    }
}

fn volume() -> Volume {
    Volume {
        name: "sidecar-injector-proxy".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity("16Mi".into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn applied(pod_json: Value) -> Value {
        let patch = patch_for(&pod(pod_json.clone()), "default").expect("a patch");
        assert!(patch.0.iter().all(|op| matches!(op, PatchOperation::Add(_))));
        let mut patched = pod_json;
        json_patch::patch(&mut patched, &patch).unwrap();
        patched
    }

    #[test]
    fn injects_what_the_builtin_template_injects() {
        let patched = applied(json!({"metadata": {"generateName": "web-"}, "spec": {"containers": [{"name": "web"}]}}));
        let names: Vec<_> =
            patched["spec"]["containers"].as_array().unwrap().iter().map(|c| c["name"].clone()).collect();
        assert_eq!(names, [json!("web"), json!("proxy")]);
        assert_eq!(patched["spec"]["initContainers"][0]["name"], "proxy-init");
        assert_eq!(patched["spec"]["volumes"][0]["emptyDir"]["sizeLimit"], "16Mi");
        assert_eq!(patched["metadata"]["labels"]["sidecar-injector.io/injected"], "true");
        assert_eq!(patched["spec"]["containers"][1]["env"][3]["value"], "web-");
        let pod: Pod = serde_json::from_value(patched).unwrap();
        assert!(patch_for(&pod, "default").is_none(), "an injected pod is left alone");
    }

    #[test]
    fn completes_existing_lists_and_maps() {
        let patched = applied(json!({
            "metadata": {"name": "p", "labels": {"app": "shop"}, "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "web"}], "initContainers": [{"name": "setup"}], "volumes": [{"name": "v"}]}
        }));
        assert_eq!(patched["spec"]["initContainers"][0]["name"], "proxy-init");
        assert_eq!(patched["spec"]["initContainers"][1]["name"], "setup");
        assert_eq!(patched["spec"]["volumes"][1]["name"], "sidecar-injector-proxy");
        assert_eq!(patched["metadata"]["annotations"]["a"], "b");
        assert!(patched["metadata"]["annotations"]["sidecar-injector.io/status"].is_string());
    }

    #[test]
    fn opted_out_pods_are_left_alone() {
        let opted_out = pod(json!({"metadata": {"annotations": {"sidecar-injector.io/inject": "false"}},
            "spec": {"containers": [{"name": "web"}]}}));
        assert!(patch_for(&opted_out, "default").is_none());
    }
}
