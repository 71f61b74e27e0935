//! `holdApplicationUntilSidecarReady`: the app's containers start only once the template's sidecars are ready
//! (istio#11130), so an app whose first request goes through the proxy, or whose start reads what the agent
//! writes, never races its sidecar.
//!
//! The kubelet offers two ways, and the Kubernetes version the injector is set for (`--kubernetes-version`)
//! chooses one when the template is assembled:
//!
//! - from 1.29 ([`NATIVE_SIDECAR_MINOR`](super::NATIVE_SIDECAR_MINOR)), the template's containers become native
//!   sidecars (the very shape Jobs' pods get, [`as_native_sidecars`]): the kubelet starts the app's containers once
//!   every init container has completed or, for a native sidecar, once its `startupProbe` has succeeded. Their
//!   `lifecycle.postStart`, the wait for older kubelets, is taken out: the probe is the one wait;
//! - below, the template's containers go first in `spec.containers`, in the template's order (the merge inserts
//!   them at `/spec/containers/0`, `/1`, ...), each with its `lifecycle.postStart`: the kubelet starts a pod's
//!   containers one after the other and does not start the next before the previous one's `postStart` hook has
//!   returned.
//!
//! Only the template knows how its sidecar says it is ready, so it writes both: a `startupProbe` and a
//! `postStart` `exec` command that returns once the sidecar is ready. A template that says `true` without them
//! is refused at load, at the container's line ([`problems`]), whatever the version, so that it serves on every
//! version it may meet.

use super::TemplateError;
use super::native::as_native_sidecars;
use super::part_settings::HOLD_KEY as KEY;
use super::yaml::{PathSeg, YNode, YValue, display_path};

/// How a template holds the app's containers until its sidecars are ready, for the Kubernetes version it is
/// assembled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hold {
    /// The sidecars are native sidecars: the kubelet starts the app's containers once each one's `startupProbe`
    /// has succeeded (Kubernetes 1.29 and later).
    StartupProbe,
    /// The sidecars go first among the pod's containers: the kubelet starts the app's containers once each
    /// sidecar's `postStart` hook has returned (before Kubernetes 1.29).
    PostStart,
}

impl Hold {
    /// The way for a kubelet that has native sidecars (`native`) or not.
    pub(crate) fn for_version(native: bool) -> Self {
        if native { Hold::StartupProbe } else { Hold::PostStart }
    }

    /// What it does, for `check`.
    pub fn describe(self) -> &'static str {
        match self {
            Hold::StartupProbe => "its containers as native sidecars, the app started once each startupProbe succeeds",
            Hold::PostStart => "its containers first, the app started once each postStart hook returns",
        }
    }
}

/// Shapes the template's `pod` for [`Hold::StartupProbe`]: its containers lose their `lifecycle.postStart` (and a
/// `lifecycle` left empty) and become native sidecars.
pub(crate) fn as_held_by_startup_probes(pod: &mut YNode) {
    let containers = pod.map_get_mut("spec").and_then(|spec| spec.map_get_mut("containers"));
    if let Some(YNode { value: YValue::Seq(containers), .. }) = containers {
        for container in containers {
            let YValue::Map(fields) = &mut container.value else { continue };
            let Some(at) = fields.iter().position(|(key, _)| key == "lifecycle") else { continue };
            if let YValue::Map(hooks) = &mut fields[at].1.value {
                hooks.retain(|(hook, _)| hook != "postStart");
                if hooks.is_empty() {
                    fields.remove(at);
                }
            }
        }
    }
    as_native_sidecars(pod);
}

/// What keeps a template file that says `holdApplicationUntilSidecarReady: true` from holding the app: no
/// containers to wait for, or a container without its `startupProbe` or without a `lifecycle.postStart` `exec`
/// command. `pod` is the file's `pod` section, `setting_line` the setting's line.
pub(crate) fn problems(
    pod: &YNode,
    setting_line: usize,
    invalid: &dyn Fn(usize, String) -> TemplateError,
) -> Vec<TemplateError> {
    let containers = match pod.map_get("spec").and_then(|spec| spec.map_get("containers")).map(|c| &c.value) {
        Some(YValue::Seq(items)) if !items.is_empty() => items,
        _ => {
            let reason = format!(
                "`{KEY}` needs the template to inject `containers` (under `pod.spec`) for the app to wait for; a \
                 native sidecar written in `initContainers` (with `restartPolicy: Always`) holds the app by itself \
                 until its startupProbe succeeds"
            );
            return vec![invalid(setting_line, reason)];
        }
    };
    let mut found = Vec::new();
    for (index, container) in containers.iter().enumerate() {
        let path = [
            PathSeg::Key("pod".into()),
            PathSeg::Key("spec".into()),
            PathSeg::Key("containers".into()),
            PathSeg::Index(index),
        ];
        let name = container.map_get("name").and_then(YNode::as_str).unwrap_or("?");
        let at = |reason: String| invalid(container.line, format!("{}: {reason}", display_path(&path)));
        if container.map_get("startupProbe").is_none_or(|p| p.value == YValue::Null) {
            found.push(at(format!(
                "`{KEY}` needs `{name}` to have a `startupProbe`: from Kubernetes 1.29 `{name}` is a native \
                 sidecar and the kubelet starts the app's containers once that probe succeeds"
            )));
        }
        let exec = container.map_get("lifecycle").and_then(|l| l.map_get("postStart")).and_then(|h| h.map_get("exec"));
        if exec.is_none_or(|e| e.value == YValue::Null) {
            found.push(at(format!(
                "`{KEY}` needs `{name}` to have a `lifecycle.postStart.exec` command that returns once `{name}` is \
                 ready (such as `[sh, -c, \"until wget -q -O /dev/null http://127.0.0.1:PORT/ready; do sleep 1; \
                 done\"]`): below Kubernetes 1.29 `{name}` goes first and the kubelet starts the app's containers \
                 once that hook returns"
            )));
        }
    }
    found
}
