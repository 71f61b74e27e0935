//! The names `manifests/` gives the webhook's objects.

/// The Service (and Deployment, and ServiceAccount).
pub const SERVICE: &str = "sidecar-injector";
/// The namespace.
pub const NAMESPACE: &str = "sidecar-injector";
/// The Secret with the serving certificate, mounted by the Deployment.
pub const TLS_SECRET: &str = "sidecar-injector-tls";
/// The ConfigMap of the default revision's templates, mounted by the Deployment (a revision's: `...-NAME`).
pub const TEMPLATES_CONFIGMAP: &str = "sidecar-injector-templates";
/// The MutatingWebhookConfiguration.
pub const MUTATING_CONFIGURATION: &str = "sidecar-injector";
/// Its webhooks.
pub const MUTATING_WEBHOOKS: &[&str] = &["inject.sidecar-injector.io"];
/// The ValidatingWebhookConfiguration (the companion that checks the final pod).
pub const VALIDATING_CONFIGURATION: &str = "sidecar-injector";
/// Its webhooks.
pub const VALIDATING_WEBHOOKS: &[&str] = &["validate.sidecar-injector.io", "preview.sidecar-injector.io"];
/// The image the Deployment runs (without its tag), which kustomize `images:` entries replace.
pub const IMAGE: &str = "ghcr.io/sidecar-injector/sidecar-injector";
