//! Fields of a pod that an admission plugin on by default owns: it sets them before the webhooks from another
//! field (a priority from `priorityClassName`, an overhead from the RuntimeClass), and refuses a pod whose own value
//! differs from what it computes (`plugin/pkg/admission/priority`, `plugin/pkg/admission/runtimeclass`). A template
//! cannot set them well: the value it adds after the plugin ran is refused when the pod is validated, or on the
//! plugin's next run. So they are refused when a template loads, naming the plugin.

/// A field owned by an admission plugin.
#[derive(Debug)]
pub(crate) struct PluginField {
    /// A dotted path under the pod.
    pub path: &'static str,
    /// The admission plugin.
    pub plugin: &'static str,
    /// What the plugin does with it.
    pub why: &'static str,
}

/// Every field of a pod an admission plugin on by default owns (from 1.20 to 1.37 alike).
pub(crate) const PLUGIN_FIELDS: &[PluginField] = &[
    PluginField {
        path: "spec.priority",
        plugin: "Priority",
        why: "computes it from priorityClassName and refuses a pod whose own value differs (\"the integer value of \
              priority must not be provided in pod spec\")",
    },
    PluginField {
        path: "spec.preemptionPolicy",
        plugin: "Priority",
        why: "computes it from priorityClassName and refuses a pod whose own value differs (\"the string value of \
              PreemptionPolicy must not be provided in pod spec\")",
    },
    PluginField {
        path: "spec.overhead",
        plugin: "RuntimeClass",
        why: "sets it from the pod's RuntimeClass and refuses a pod that has one its RuntimeClass does not define \
              (\"Pod Overhead set without corresponding RuntimeClass defined Overhead\")",
    },
];
