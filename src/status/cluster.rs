//! The API server, through the caller's kubeconfig: the namespaces and pods `status` judges, their owners, the
//! template ConfigMaps, the restarts and the in-place upgrades (a dry run of each pod, then its patch). The CLI's
//! only client; the server's own calls are its ConfigMap read (`server::source`) and its Events (`server::events`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};

use super::owners::{self, Kind, Workload};
use super::restart::{self, FIELD_MANAGER};
use super::{Enrollment, Revision};
use sidecar_injector_core::SetSources;
use sidecar_injector_core::settings::Keys;

/// Where the webhook configurations are.
const ADMISSION: &str = "/apis/admissionregistration.k8s.io/v1";

/// Objects asked for per list call: the page size client-go (and kubectl) use.
const PAGE: u32 = 500;

/// Why a workload could not be rolled (`status --restart`).
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    /// A paused Deployment would not roll.
    #[error("the Deployment is paused: `kubectl rollout resume` it first")]
    Paused,
    /// Not a kind `kubectl rollout restart` rolls.
    #[error("not restartable")]
    NotRestartable,
    /// The API server refused the read or the patch.
    #[error("the API server refused")]
    Api(#[from] kube::Error),
}

/// Why the API server could not be asked, or did not answer as needed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig named by `--kubeconfig` cannot be read or used.
    #[error("cannot use the kubeconfig {}", .path.display())]
    KubeconfigFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: KubeconfigError,
    },
    /// The default kubeconfig (KUBECONFIG, ~/.kube/config) cannot be used with `--context`.
    #[error("cannot use the kubeconfig (KUBECONFIG or ~/.kube/config)")]
    Kubeconfig(#[source] KubeconfigError),
    /// Neither a kubeconfig nor an in-cluster service account was found.
    #[error("no kubeconfig (KUBECONFIG, ~/.kube/config or --kubeconfig) and not running in a pod")]
    Infer(#[source] InferConfigError),
    /// The client could not be built from the configuration (TLS material, proxy).
    #[error("cannot make a client for the API server")]
    Client(#[source] kube::Error),
    /// The API server refused a call: `what` says which.
    #[error("{what}")]
    Api {
        /// The call, in words: `listing pods in shop`.
        what: String,
        /// The client's error: the API server's status.
        #[source]
        source: kube::Error,
    },
    /// A call did not reach the API server, or got no answer.
    #[error("cannot reach the API server {server} ({what})")]
    Unreachable {
        /// The API server's URL, from the kubeconfig.
        server: String,
        /// The call, in words.
        what: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

impl ClusterError {
    /// A failed call to `server`: refused by the API server, or not answered.
    fn call(server: &str, what: String, source: kube::Error) -> ClusterError {
        match source {
            kube::Error::Api(_) => ClusterError::Api { what, source },
            source => ClusterError::Unreachable { server: server.to_owned(), what, source },
        }
    }
}

/// Which namespaces to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Those opted in (the default).
    OptedIn,
    /// Every namespace (`-A`).
    All,
    /// These (`-n`), opted in or not.
    Named(Vec<String>),
}

/// A client for the API server, with the owners looked up so far.
pub struct Cluster {
    client: Client,
    /// The API server's URL, for messages.
    server: String,
    /// A ReplicaSet's or Job's own controller, by namespace, kind and name (`None`: it has none, or is gone).
    parents: HashMap<(String, Kind, String), Option<OwnerReference>>,
}

impl Cluster {
    /// A client as kubectl makes one: from `kubeconfig` if given, else `KUBECONFIG` or `~/.kube/config`, else the
    /// pod's service account; `context` instead of the current context.
    pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Cluster, ClusterError> {
        let options = KubeConfigOptions { context: context.map(str::to_owned), ..KubeConfigOptions::default() };
        let config = match kubeconfig {
            Some(path) => {
                let file = |source| ClusterError::KubeconfigFile { path: path.to_owned(), source };
                let kubeconfig = Kubeconfig::read_from(path).map_err(file)?;
                Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(file)?
            }
            None if context.is_some() => Config::from_kubeconfig(&options).await.map_err(ClusterError::Kubeconfig)?,
            None => Config::infer().await.map_err(ClusterError::Infer)?,
        };
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config).map_err(ClusterError::Client)?;
        Ok(Cluster { client, server, parents: HashMap::new() })
    }

    /// The namespaces of `scope`, with how each is opted in (through the revision `tags` too), by name.
    pub async fn namespaces(
        &self,
        scope: &Scope,
        keys: &Keys,
        revisions: &[Revision],
        tags: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<(String, Enrollment)>, ClusterError> {
        let api = Api::<Namespace>::all(self.client.clone());
        let found = match scope {
            Scope::Named(names) => {
                let mut found = Vec::new();
                for name in names {
                    let what = || format!("reading namespace {name}");
                    found.push(api.get(name).await.map_err(|e| ClusterError::call(&self.server, what(), e))?);
                }
                found
            }
            Scope::OptedIn | Scope::All => self.list(&api, || "listing namespaces".to_owned()).await?,
        };
        let mut namespaces: Vec<(String, Enrollment)> = found
            .into_iter()
            .map(|namespace| {
                let name = namespace.metadata.name.unwrap_or_default();
                let labels = namespace.metadata.labels.unwrap_or_default();
                let enrollment = Enrollment::of(&name, &labels, keys, revisions, tags);
                (name, enrollment)
            })
            .filter(|(_, enrollment)| *scope != Scope::OptedIn || enrollment.opted_in())
            .collect();
        namespaces.sort_by(|a, b| a.0.cmp(&b.0));
        namespaces.dedup_by(|a, b| a.0 == b.0);
        Ok(namespaces)
    }

    /// The pods of `namespace`.
    pub async fn pods(&self, namespace: &str) -> Result<Vec<Pod>, ClusterError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        self.list(&api, || format!("listing pods in {namespace}")).await
    }

    /// The workload `pod` of `namespace` belongs to: one more lookup for a ReplicaSet's or a Job's controller,
    /// remembered for the next pod of the same one.
    pub async fn workload(&mut self, namespace: &str, pod: &Pod) -> Result<Workload, ClusterError> {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let controller = owners::controller(pod.metadata.owner_references.as_deref().unwrap_or_default());
        let parent = match controller {
            Some(reference) if Workload::of(reference).kind.has_parent() => self.parent(namespace, reference).await?,
            _ => None,
        };
        Ok(owners::workload(name, controller, parent.as_ref()))
    }

    async fn parent(
        &mut self,
        namespace: &str,
        reference: &OwnerReference,
    ) -> Result<Option<OwnerReference>, ClusterError> {
        let workload = Workload::of(reference);
        let key = (namespace.to_owned(), workload.kind.clone(), workload.name.clone());
        if let Some(parent) = self.parents.get(&key) {
            return Ok(parent.clone());
        }
        let what = || format!("reading {workload} in {namespace} (the owner of its pods)");
        let client = self.client.clone();
        let metadata = match workload.kind {
            Kind::ReplicaSet => Api::<ReplicaSet>::namespaced(client, namespace)
                .get_opt(&workload.name)
                .await
                .map(|o| o.map(|o| o.metadata)),
            Kind::Job => {
                Api::<Job>::namespaced(client, namespace).get_opt(&workload.name).await.map(|o| o.map(|o| o.metadata))
            }
            _ => Ok(None),
        }
        .map_err(|e| ClusterError::call(&self.server, what(), e))?;
        let parent =
            metadata.and_then(|m| m.owner_references).and_then(|references| owners::controller(&references).cloned());
        self.parents.insert(key, parent.clone());
        Ok(parent)
    }

    /// Reads the ConfigMap `namespace/name`: its `data` as `serve` reads the directory the kubelet mounts it
    /// as ([`SetSources::from_config_map`]).
    pub async fn configmap_sources(&self, namespace: &str, name: &str) -> Result<SetSources, ClusterError> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), namespace);
        let what = format!("reading ConfigMap {namespace}/{name} (--configmap)");
        let configmap = api.get(name).await.map_err(|e| ClusterError::call(&self.server, what, e))?;
        Ok(SetSources::from_config_map(&format!("configmap/{namespace}/{name}"), configmap.data.unwrap_or_default()))
    }

    /// Rolls `target` as `kubectl rollout restart` does, with `patch` ([`restart::patch`]); a paused Deployment
    /// is left alone (as kubectl does), since it would not roll.
    pub async fn restart(&self, target: &restart::Target, patch: &serde_json::Value) -> Result<(), RestartError> {
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PatchParams::default() };
        let (namespace, name) = (target.namespace.as_str(), target.workload.name.as_str());
        let patch = Patch::Strategic(patch);
        let client = self.client.clone();
        let patched = match target.workload.kind {
            Kind::Deployment => {
                let api = Api::<Deployment>::namespaced(client, namespace);
                let deployment = api.get(name).await?;
                if deployment.spec.paused == Some(true) {
                    return Err(RestartError::Paused);
                }
                api.patch(name, &params, &patch).await.map(drop)
            }
            Kind::StatefulSet => {
                Api::<StatefulSet>::namespaced(client, namespace).patch(name, &params, &patch).await.map(drop)
            }
            Kind::DaemonSet => {
                Api::<DaemonSet>::namespaced(client, namespace).patch(name, &params, &patch).await.map(drop)
            }
            _ => return Err(RestartError::NotRestartable),
        };
        Ok(patched?)
    }

    /// The pod `namespace/name` as JSON (`status --upgrade` reads it again just before deciding).
    pub async fn pod_json(&self, namespace: &str, name: &str) -> Result<serde_json::Value, kube::Error> {
        self.raw(hyper::Method::GET, &format!("/api/v1/namespaces/{namespace}/pods/{name}"), None, "").await
    }

    /// The names of the pods of `namespace` that `selector` (a label selector) selects.
    pub async fn pods_selected(&self, namespace: &str, selector: &str) -> Result<Vec<String>, ClusterError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().labels(selector);
        let what = || format!("listing pods in {namespace} selected by {selector}");
        let pods = api.list(&params).await.map_err(|e| ClusterError::call(&self.server, what(), e))?;
        Ok(pods.items.into_iter().filter_map(|p| p.metadata.name).collect())
    }

    /// What the API server would store for `pod` created in `namespace` now (a server-side dry run: every
    /// admission webhook, ours among them, and every default).
    pub async fn dry_run_pod(
        &self,
        namespace: &str,
        pod: &serde_json::Value,
    ) -> Result<serde_json::Value, kube::Error> {
        let path = format!("/api/v1/namespaces/{namespace}/pods?dryRun=All");
        self.raw(hyper::Method::POST, &path, Some(pod), "application/json").await
    }

    /// Applies the JSON Patch `patch` to the pod `namespace/name` (`status --upgrade`).
    pub async fn patch_pod(&self, namespace: &str, name: &str, patch: &serde_json::Value) -> Result<(), kube::Error> {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}?fieldManager={FIELD_MANAGER}");
        let _: serde_json::Value =
            self.raw(hyper::Method::PATCH, &path, Some(patch), "application/json-patch+json").await?;
        Ok(())
    }

    /// The webhook configuration of `kind` (`mutatingwebhookconfigurations` or `validatingwebhookconfigurations`)
    /// named `name`, as JSON; `None` when there is none.
    pub async fn webhook_configuration(
        &self,
        kind: &str,
        name: &str,
    ) -> Result<Option<serde_json::Value>, ClusterError> {
        let read = self.raw(hyper::Method::GET, &format!("{ADMISSION}/{kind}/{name}"), None, "").await;
        self.unless_absent(read, || format!("reading {kind}/{name}"))
    }

    /// The webhook configurations of `kind` with the label `label`, as JSON.
    pub async fn webhook_configurations_labelled(
        &self,
        kind: &str,
        label: &str,
    ) -> Result<Vec<serde_json::Value>, ClusterError> {
        let what = || format!("listing {kind} labelled {label}");
        let path = format!("{ADMISSION}/{kind}?labelSelector={label}");
        let list = self.raw(hyper::Method::GET, &path, None, "").await;
        let list = list.map_err(|e| ClusterError::call(&self.server, what(), e))?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The cluster's revision tags, each with the revision it points to ([`super::tags::pointed`]).
    pub async fn revision_tags(&self) -> Result<std::collections::BTreeMap<String, String>, ClusterError> {
        let [mutating, _] = super::tags::RESOURCES;
        let configurations = self.webhook_configurations_labelled(mutating, super::tags::TAG_LABEL).await?;
        Ok(super::tags::pointed(&configurations))
    }

    /// Creates or updates the webhook configuration `object` of `kind` (a server-side apply that owns it whole).
    pub async fn apply_webhook_configuration(
        &self,
        kind: &str,
        object: &serde_json::Value,
    ) -> Result<(), ClusterError> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let what = || format!("applying {kind}/{name}");
        let path = format!("{ADMISSION}/{kind}/{name}?fieldManager={}&force=true", super::tags::FIELD_MANAGER);
        let applied = self.raw(hyper::Method::PATCH, &path, Some(object), "application/apply-patch+yaml").await;
        applied.map(drop).map_err(|e| ClusterError::call(&self.server, what(), e))
    }

    /// Deletes the webhook configuration `name` of `kind`; false when there was none.
    pub async fn delete_webhook_configuration(&self, kind: &str, name: &str) -> Result<bool, ClusterError> {
        let deleted = self.raw(hyper::Method::DELETE, &format!("{ADMISSION}/{kind}/{name}"), None, "").await;
        Ok(self.unless_absent(deleted, || format!("deleting {kind}/{name}"))?.is_some())
    }

    /// A call's answer, `None` when the object is not there (404), or the error of the call `what` describes.
    fn unless_absent<T>(
        &self,
        answer: Result<T, kube::Error>,
        what: impl Fn() -> String,
    ) -> Result<Option<T>, ClusterError> {
        match answer {
            Ok(found) => Ok(Some(found)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(e) => Err(ClusterError::call(&self.server, what(), e)),
        }
    }

    /// The names of the namespaces labelled `key=value`.
    pub async fn namespaces_labelled(&self, key: &str, value: &str) -> Result<Vec<String>, ClusterError> {
        let api = Api::<Namespace>::all(self.client.clone());
        let params = ListParams::default().labels(&format!("{key}={value}"));
        let what = || format!("listing namespaces labelled {key}={value}");
        let found = api.list(&params).await.map_err(|e| ClusterError::call(&self.server, what(), e))?;
        Ok(found.items.into_iter().filter_map(|n| n.metadata.name).collect())
    }

    /// One call with a JSON body of our own: kube's typed calls cannot send a JSON Patch with `test` operations
    /// (its `Patch::Json` is another json-patch's type) nor an untyped pod.
    async fn raw(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<&serde_json::Value>,
        content_type: &str,
    ) -> Result<serde_json::Value, kube::Error> {
        let mut request = hyper::Request::builder().method(method).uri(path);
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, content_type);
        }
        // A JSON value serialises; the request is built from a path of ours, which parses.
        let body = body.map(|b| serde_json::to_vec(b).expect("JSON serialises")).unwrap_or_default();
        let request = request.body(body).map_err(kube::Error::HttpError)?;
        self.client.request(request).await
    }

    /// Every object of `api`'s collection, a page at a time.
    async fn list<K>(&self, api: &Api<K>, what: impl Fn() -> String) -> Result<Vec<K>, ClusterError>
    where
        K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    {
        let mut objects = Vec::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = api.list(&params).await.map_err(|e| ClusterError::call(&self.server, what(), e))?;
            objects.extend(page.items);
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(objects),
            }
        }
    }
}
