//! The API server, through the caller's kubeconfig: the namespaces and pods `status` judges, their owners, the
//! template ConfigMaps, and the restarts. The only module of the crate that talks to an API server; the injector
//! itself never does.

use std::collections::{BTreeMap, HashMap};
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
use crate::SetSources;
use crate::decision::Keys;

/// Objects asked for per list call: the page size client-go (and kubectl) use.
const PAGE: u32 = 500;

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
    /// A ConfigMap's templates could not be laid out as files to be read as `serve` reads its directory.
    #[error("cannot write the templates of {origin} to {}", .dir.display())]
    Scratch {
        /// The ConfigMap.
        origin: String,
        /// The scratch directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A ConfigMap key that cannot be a file name (the API server allows none such).
    #[error("{origin}: key {key:?} is not a valid ConfigMap key")]
    Key {
        /// The ConfigMap.
        origin: String,
        /// The key.
        key: String,
    },
    /// A ConfigMap's template files could not be read back.
    #[error("{origin}")]
    Templates {
        /// The ConfigMap.
        origin: String,
        /// Why.
        #[source]
        source: crate::TemplateError,
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

    /// The namespaces of `scope`, with how each is opted in, by name.
    pub async fn namespaces(
        &self,
        scope: &Scope,
        keys: &Keys,
        revisions: &[Revision],
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
                let enrollment = Enrollment::of(&name, &labels, keys, revisions);
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

    /// Reads the ConfigMap `namespace/name` and lays out its `data` as the kubelet mounts it, one file per key,
    /// then reads that directory exactly as `serve` reads its template directory.
    pub async fn configmap_sources(&self, namespace: &str, name: &str) -> Result<SetSources, ClusterError> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), namespace);
        let what = format!("reading ConfigMap {namespace}/{name} (--configmap)");
        let configmap = api.get(name).await.map_err(|e| ClusterError::call(&self.server, what, e))?;
        sources_from_data(&format!("configmap/{namespace}/{name}"), &configmap.data.unwrap_or_default())
    }

    /// Rolls `target` as `kubectl rollout restart` does, with `patch` ([`restart::patch`]); a paused Deployment
    /// is left alone (as kubectl does), since it would not roll.
    pub async fn restart(&self, target: &restart::Target, patch: &serde_json::Value) -> Result<(), String> {
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_owned()), ..PatchParams::default() };
        let (namespace, name) = (target.namespace.as_str(), target.workload.name.as_str());
        let patch = Patch::Strategic(patch);
        let client = self.client.clone();
        let patched = match target.workload.kind {
            Kind::Deployment => {
                let api = Api::<Deployment>::namespaced(client, namespace);
                let deployment = api.get(name).await.map_err(|e| super::chain(&e))?;
                if deployment.spec.and_then(|s| s.paused) == Some(true) {
                    return Err("the Deployment is paused: `kubectl rollout resume` it first".to_owned());
                }
                api.patch(name, &params, &patch).await.map(drop)
            }
            Kind::StatefulSet => {
                Api::<StatefulSet>::namespaced(client, namespace).patch(name, &params, &patch).await.map(drop)
            }
            Kind::DaemonSet => {
                Api::<DaemonSet>::namespaced(client, namespace).patch(name, &params, &patch).await.map(drop)
            }
            _ => return Err("not restartable".to_owned()),
        };
        patched.map_err(|e| super::chain(&e))
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

/// A ConfigMap's `data` as `serve` sees it mounted: each key a file of a scratch directory, read back by
/// [`SetSources::read_dir`] (so the same files are templates, the shared values or ignored), and labelled
/// `origin/KEY` in messages rather than with the scratch path.
pub(crate) fn sources_from_data(origin: &str, data: &BTreeMap<String, String>) -> Result<SetSources, ClusterError> {
    let dir =
        scratch_dir().map_err(|(dir, source)| ClusterError::Scratch { origin: origin.to_owned(), dir, source })?;
    let read = write_and_read(origin, &dir.0, data);
    drop(dir);
    let mut sources = read?;
    let prefix = format!("{}/", dir_label(&sources.origin));
    let relabel = |file: &mut String| {
        if let Some(key) = file.strip_prefix(&prefix) {
            *file = format!("{origin}/{key}");
        }
    };
    for (_, file, _) in &mut sources.templates {
        relabel(file);
    }
    if let Some((file, _)) = &mut sources.values {
        relabel(file);
    }
    sources.ignored.iter_mut().for_each(relabel);
    sources.origin = origin.to_owned();
    Ok(sources)
}

fn write_and_read(origin: &str, dir: &Path, data: &BTreeMap<String, String>) -> Result<SetSources, ClusterError> {
    for (key, value) in data {
        // The API server's rule for keys: [-._a-zA-Z0-9]+, not `.` or `..`; so never a path.
        let valid = !key.is_empty()
            && key != "."
            && key != ".."
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid {
            return Err(ClusterError::Key { origin: origin.to_owned(), key: key.clone() });
        }
        let file = dir.join(key);
        std::fs::write(&file, value).map_err(|source| ClusterError::Scratch {
            origin: origin.to_owned(),
            dir: dir.to_owned(),
            source,
        })?;
    }
    SetSources::read_dir(dir).map_err(|source| ClusterError::Templates { origin: origin.to_owned(), source })
}

/// The label [`SetSources::read_dir`] gives the directory (and, under it, each file).
fn dir_label(origin: &str) -> &str {
    origin.trim_end_matches('/')
}

/// A new, empty directory of our own under the system's temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch_dir() -> Result<Scratch, (PathBuf, std::io::Error)> {
    let base = std::env::temp_dir();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let mut attempt = 0;
    loop {
        let dir = base.join(format!("sidecar-injector-status-{}-{nanos}-{attempt}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(Scratch(dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
            Err(e) => return Err((dir, e)),
        }
    }
}
