//! Review to decision: whether this request is one we inject into, and if not, why not.
//!
//! The rules, in order: only a `Pod` (core group, v1) on `CREATE`, without a subresource, with an object; not a
//! mirror pod (the kubelet owns those); not a pod that opted out by annotation or label; not a pod that runs on
//! Windows nodes only (a Linux sidecar would keep it from starting). Then, once the pod's
//! template is chosen: a Job's pod takes the template's Job shape or is skipped (its `jobs` setting); not a
//! `hostNetwork` pod unless the template allows it; not a pod that carries another template version's sidecar. `dryRun` changes nothing: injection has no side effects.

use crate::pod::PodView;
use crate::review::{Review, ReviewError};
use crate::settings::Keys;
use crate::template::Template;

/// Why a request was admitted without a patch. The set is closed so that it can label a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
#[non_exhaustive]
pub enum SkipReason {
    /// The object is not a core/v1 Pod.
    NotAPod,
    /// The operation is not CREATE.
    NotCreate,
    /// The request is for a subresource (status, ephemeralcontainers, binding...).
    Subresource,
    /// The request carries no object.
    NoObject,
    /// A static pod mirrored by the kubelet.
    MirrorPod,
    /// The pod opted out with `<prefix>inject: "false"`.
    OptedOut,
    /// The pod runs on Windows nodes only (`spec.os.name`, its node selector or its required node affinity), where
    /// a Linux sidecar cannot run.
    Windows,
    /// The pod uses the host network and the template does not inject those.
    HostNetwork,
    /// The pod runs to completion (a Job's pod, or any pod with `restartPolicy: Never` or `OnFailure`) and the
    /// template skips those (`jobs: skip`, or `native-sidecar` on a Kubernetes older than 1.29).
    Job,
    /// The pod carries the status annotation of another template or version.
    InjectedByOtherVersion,
    /// The pod already has everything the template adds.
    AlreadyInjected,
    /// A template expression failed to render for this pod.
    RenderFailed,
    /// The pod's own pod-level resources (`spec.resources`) cannot hold the sidecar's requests or limits.
    PodResources,
    /// The sidecar clashes with the pod's own containers in a way only the pod decides (a host port the pod
    /// already uses): the injected pod would be refused.
    PodConflict,
    /// The pod names a template the set does not have.
    UnknownTemplate,
    /// The pod names templates that cannot be combined (more than a combination may have, or two that conflict).
    CombinationRefused,
    /// The pod names a template that needs a newer Kubernetes than the injector is set for.
    TemplateUnavailable,
}

impl SkipReason {
    /// Every one, for registering metrics up front.
    pub const ALL: &'static [SkipReason] = <SkipReason as strum::VariantArray>::VARIANTS;

    /// Its name: a metric's label, the word in logs, warnings and the docs.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The pod was one to inject and could not be injected (the template or the pod is at fault), rather than
    /// one the rules leave out: `inject` exits 1 for it, as it does for a refused one.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            SkipReason::RenderFailed
                | SkipReason::PodResources
                | SkipReason::PodConflict
                | SkipReason::UnknownTemplate
                | SkipReason::CombinationRefused
                | SkipReason::TemplateUnavailable
        )
    }

    /// A sentence for `review --explain`.
    pub fn explain(self) -> &'static str {
        match self {
            SkipReason::NotAPod => "the object is not a core/v1 Pod",
            SkipReason::NotCreate => "the operation is not CREATE (only new pods are injected)",
            SkipReason::Subresource => "the request is for a subresource, not the pod itself",
            SkipReason::NoObject => "the request carries no object",
            SkipReason::MirrorPod => "the pod is a mirror of a static pod (annotation kubernetes.io/config.mirror)",
            SkipReason::OptedOut => "the pod opted out with the inject annotation or label set to false",
            SkipReason::Windows => {
                "the pod runs on Windows nodes only (spec.os.name, or kubernetes.io/os: windows in its node selector or \
                 required node affinity), where a Linux sidecar cannot run"
            }
            SkipReason::HostNetwork => "the pod uses the host network and the template has injectHostNetwork: false",
            SkipReason::Job => {
                "the pod runs to completion (a Job's, or restartPolicy Never or OnFailure) and the template does not \
                 inject those (its `jobs` setting)"
            }
            SkipReason::InjectedByOtherVersion => "the pod carries the status annotation of another template version",
            SkipReason::AlreadyInjected => "the pod already has everything the template adds",
            SkipReason::RenderFailed => "a template expression failed to render for this pod",
            SkipReason::PodResources => "the pod's pod-level resources (spec.resources) cannot hold the sidecar",
            SkipReason::PodConflict => "the sidecar clashes with the pod's own containers (a host port they use)",
            SkipReason::UnknownTemplate => "the pod names a template that the injector does not have",
            SkipReason::CombinationRefused => {
                "the pod names templates that cannot be combined (more than a combination may have, or two that \
                 conflict)"
            }
            SkipReason::TemplateUnavailable => {
                "the pod names a template that needs a newer Kubernetes than the injector is set for"
            }
        }
    }
}

/// Decides whether this request is a pod to inject into, before choosing a template: the pod, or why it is
/// skipped; an error for a pod whose echoed values the API server would refuse ([`PodView::beyond_api_limits`]).
pub(crate) fn decide<'t, 'i>(
    review: &Review<'t, 'i>,
    keys: &'i Keys,
) -> Result<Result<PodView<'t, 'i>, SkipReason>, ReviewError> {
    let pod = match skip_or_view(review, keys) {
        Ok(pod) => pod,
        Err(reason) => return Ok(Err(reason)),
    };
    if let Some((field, limit)) = pod.beyond_api_limits() {
        return Err(ReviewError::BeyondApiLimit { field, limit });
    }
    Ok(Ok(pod))
}

/// The rules of [`decide`] that skip a request, or the pod to look at.
fn skip_or_view<'t, 'i>(review: &Review<'t, 'i>, keys: &'i Keys) -> Result<PodView<'t, 'i>, SkipReason> {
    let kind = review.kind;
    if !(kind.group.is_empty() && kind.version == "v1" && kind.kind == "Pod") {
        return Err(SkipReason::NotAPod);
    }
    if !review.sub_resource.is_empty() {
        return Err(SkipReason::Subresource);
    }
    if review.operation != "CREATE" {
        return Err(SkipReason::NotCreate);
    }
    let Some(object) = review.object.filter(|o| o.as_object().is_some()) else {
        return Err(SkipReason::NoObject);
    };
    let pod = PodView::new(object, review.namespace, &keys.prefix);
    if pod.mirror() {
        return Err(SkipReason::MirrorPod);
    }
    if [pod.annotation(&keys.inject), pod.label(&keys.inject)].into_iter().flatten().any(is_false) {
        return Err(SkipReason::OptedOut);
    }
    if pod.windows() {
        return Err(SkipReason::Windows);
    }
    Ok(pod)
}

/// Decides whether the pod takes the template it selected.
pub(crate) fn admits(pod: &PodView<'_, '_>, keys: &Keys, template: &Template) -> Result<(), SkipReason> {
    if pod.host_network() && !template.inject_host_network {
        return Err(SkipReason::HostNetwork);
    }
    if pod.annotation(&keys.status).is_some_and(|status| !template.wrote_status(status)) {
        return Err(SkipReason::InjectedByOtherVersion);
    }
    Ok(())
}

/// The values of `<prefix>inject` that opt a pod out, compared without regard to case or surrounding space. The
/// webhook configuration's objectSelector and matchConditions (`manifests/`) list the same values, so that the API
/// server does not even call us for such pods.
pub const OPT_OUT_VALUES: [&str; 5] = ["false", "no", "off", "0", "disabled"];

/// The value of the namespace label `<prefix>inject` that opts a namespace in to the default revision (the
/// webhook configuration's namespaceSelector, `manifests/`, selects it).
pub const NAMESPACE_ENABLED: &str = "enabled";

/// The namespaces the webhook configuration never sends us, whatever their labels (its namespaceSelector's
/// `kubernetes.io/metadata.name NotIn` list in `manifests/base`: the system namespaces and the injector's own).
pub const EXCLUDED_NAMESPACES: [&str; 4] = ["kube-system", "kube-node-lease", "kube-public", "sidecar-injector"];

fn is_false(value: &str) -> bool {
    OPT_OUT_VALUES.iter().any(|f| value.trim().eq_ignore_ascii_case(f))
}
