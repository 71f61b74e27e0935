//! The native sidecar shape: a template's containers as init containers with `restartPolicy: Always`, which is
//! how Jobs' pods get the sidecar (`jobs: native-sidecar`) and how `holdApplicationUntilSidecarReady` orders
//! the sidecars before the app.

use super::yaml::{YNode, YValue};
use crate::pod_api::spec::{CONTAINERS, INIT_CONTAINERS};

/// Moves the template's containers to the end of its init containers, each with `restartPolicy: Always`: native
/// sidecars, started in order after the template's own init containers (which may set up what they need) and
/// stopped by the kubelet once the pod's own containers have ended.
pub(super) fn as_native_sidecars(pod: &mut YNode) {
    let Some(spec) = pod.map_get_mut("spec") else { return };
    let YValue::Map(members) = &mut spec.value else { return };
    let Some(at) = members.iter().position(|(key, _)| key == CONTAINERS) else { return };
    let (_, containers) = members.remove(at);
    let line = containers.line;
    let YValue::Seq(mut sidecars) = containers.value else { return };
    for sidecar in &mut sidecars {
        if let YValue::Map(fields) = &mut sidecar.value
            && !fields.iter().any(|(key, _)| key == "restartPolicy")
        {
            let always = YNode { line: sidecar.line, value: YValue::Str("Always".into()) };
            fields.push(("restartPolicy".into(), always));
        }
    }
    match members.iter_mut().find(|(key, _)| key == INIT_CONTAINERS) {
        Some((_, YNode { value: YValue::Seq(init), .. })) => init.append(&mut sidecars),
        _ => members.push((INIT_CONTAINERS.into(), YNode { line, value: YValue::Seq(sidecars) })),
    }
}
