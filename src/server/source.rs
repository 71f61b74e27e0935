//! Where a revision's templates come from when read through the API server (the template ConfigMap), and why a
//! read failed: what `serve` configures and [`super::refresh`] reads.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;

/// A ConfigMap's `data`, or why it could not be read.
pub type FetchFuture = Pin<Box<dyn Future<Output = Result<BTreeMap<String, String>, FetchError>> + Send>>;

/// Why the ConfigMap could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The API server refused the read or did not answer.
    #[error("cannot read {what}")]
    Api {
        /// The ConfigMap.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// No answer within [`super::refresh::FETCH_TIMEOUT`].
    #[error("no answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
}

/// Where a revision's template directory comes from, read through the API server.
#[derive(Clone)]
pub struct TemplateSource {
    /// For logs: `ConfigMap sidecar-injector/sidecar-injector-templates`.
    pub label: String,
    fetch: Arc<dyn Fn() -> FetchFuture + Send + Sync>,
}

impl std::fmt::Debug for TemplateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateSource").field("label", &self.label).finish_non_exhaustive()
    }
}

impl TemplateSource {
    /// The ConfigMap `namespace/name`, read with `client`.
    pub fn config_map(client: kube::Client, namespace: &str, name: &str) -> TemplateSource {
        let api = kube::Api::<ConfigMap>::namespaced(client, namespace);
        let (label, name) = (format!("ConfigMap {namespace}/{name}"), name.to_owned());
        let what = label.clone();
        TemplateSource::from_fn(label, move || {
            let (api, name, what) = (api.clone(), name.clone(), what.clone());
            Box::pin(async move {
                let configmap = api.get(&name).await.map_err(|source| FetchError::Api { what, source })?;
                Ok(configmap.data.unwrap_or_default())
            })
        })
    }

    /// A source that calls `fetch` for each read (the tests' fake API server).
    pub fn from_fn(label: String, fetch: impl Fn() -> FetchFuture + Send + Sync + 'static) -> TemplateSource {
        TemplateSource { label, fetch: Arc::new(fetch) }
    }
}

impl TemplateSource {
    /// Reads the ConfigMap's `data` once.
    pub(crate) fn fetch(&self) -> FetchFuture {
        (self.fetch)()
    }
}
