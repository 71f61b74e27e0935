//! What the merge must know of the Pod API beyond JSON: how list items are matched (merge keys), which members of
//! an object exclude each other, and when a value counts as absent, so that completing what the user wrote never
//! yields a pod the API server refuses. The one rule set, which the one walk ([`add_only`](super::add_only))
//! follows, for injecting a template into a pod (`merge`) and for combining templates (`template::combine`).

use super::spec::{
    CONTAINER_LISTS, CONTAINERS, ENV_VAR_SOURCES, EPHEMERAL_CONTAINERS, INIT_CONTAINERS, LIFECYCLE_HANDLERS,
    LIFECYCLE_HOOKS, PROBE_HANDLERS, PROBES, VOLUME_SOURCES,
};

/// Where a template node sits: under a key of a map, or as an item of the list under a key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place<'a> {
    /// The root of `pod` or `containerDefaults`.
    Root,
    /// The value of this key.
    Field(&'a str),
    /// An item of the list under this key.
    ItemOf(&'a str),
}

/// The merge key of a Pod list field (the `patchMergeKey` of the Kubernetes API). Lists not named here are
/// atomic, as in Kubernetes: their order and content belong to the user (`command`, `args`, `tolerations`...).
pub(crate) fn merge_key_for(field: &str) -> Option<&'static str> {
    match field {
        CONTAINERS | INIT_CONTAINERS | EPHEMERAL_CONTAINERS | "volumes" | "env" | "imagePullSecrets"
        | "resourceClaims" | "schedulingGates" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        PORTS => Some("containerPort"),
        "hostAliases" => Some("ip"),
        "topologySpreadConstraints" => Some("topologyKey"),
        _ => None,
    }
}

/// A keyed list whose items the API tells apart by a second field beside the merge key (its `listMapKeys`): a
/// spread constraint by `whenUnsatisfiable`. (A port's `protocol` is one too in the API; ports stay matched by
/// `containerPort` alone here, which keeps a pod's port of either protocol the user's.) Two
/// items are the same item only when both fields are equal, the second read with the API server's default when
/// absent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SecondKey {
    pub field: &'static str,
    /// The API server's default for an item that leaves it out (`TCP` for a port's protocol), if any.
    pub default: Option<&'static str>,
}

impl SecondKey {
    /// Does an item whose second key is `ours` match one whose second key is `theirs` (each `None` when absent)?
    pub(crate) fn same(self, ours: Option<&str>, theirs: Option<&str>) -> bool {
        ours.or(self.default) == theirs.or(self.default)
    }
}

/// The second key of the keyed list under `field`, if the API has one (see [`SecondKey`]).
pub(crate) fn second_key_for(field: &str) -> Option<SecondKey> {
    match field {
        "topologySpreadConstraints" => Some(SecondKey { field: "whenUnsatisfiable", default: None }),
        _ => None,
    }
}

/// Keyed lists whose items are found by their merge key but belong to the object their `name` refers to: a pod's
/// mount, at the path the template mounts its volume, of a volume of the pod's own is the pod's, and not ours to
/// complete (adding `readOnly` to it would change the user's mount).
pub(crate) fn identified_by_name(field: &str) -> bool {
    matches!(field, "volumeMounts" | "volumeDevices")
}

/// How the members of an object relate, for the add-only merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Each member stands alone.
    Plain,
    /// An API union: the API server refuses an object that sets more than one of these members (an env var's
    /// `value` and `valueFrom`, a probe's handlers, a volume's sources). When the pod has set one, it is the
    /// user's choice, and the template's member is not added beside it.
    OneOf(&'static [&'static str]),
    /// `resources` (requests and limits): a resource the pod names in either map is the user's in both. A
    /// template's request above the user's limit, or limit below the user's request, would be refused.
    Resources,
    /// A `securityContext`: the API server refuses `allowPrivilegeEscalation: false` beside `privileged: true` or
    /// an added `CAP_SYS_ADMIN`, so neither side is added to a context whose user set the other.
    SecurityContext,
}

/// The shape of the object at `place`.
pub(crate) fn shape_of(place: Place<'_>) -> Shape {
    match place {
        Place::ItemOf("env") => Shape::OneOf(&["value", "valueFrom"]),
        Place::Field("valueFrom") => Shape::OneOf(ENV_VAR_SOURCES),
        Place::Field(field) if PROBES.contains(&field) => Shape::OneOf(PROBE_HANDLERS),
        Place::Field(field) if LIFECYCLE_HOOKS.contains(&field) => Shape::OneOf(LIFECYCLE_HANDLERS),
        Place::ItemOf("volumes") => Shape::OneOf(VOLUME_SOURCES),
        Place::ItemOf("volumeMounts") => Shape::OneOf(&["subPath", "subPathExpr"]),
        Place::Field("resources") => Shape::Resources,
        Place::Field("securityContext") => Shape::SecurityContext,
        _ => Shape::Plain,
    }
}

impl Shape {
    /// The member among `earlier` (the keys a template object sets before `key`) that is in a union with
    /// `key`: the API server would refuse the two together.
    pub(crate) fn conflict<'k>(self, mut earlier: impl Iterator<Item = &'k str>, key: &str) -> Option<&'k str> {
        let rivals = self.rivals(key);
        earlier.find(|other| *other != key && rivals.contains(other))
    }

    /// For `Resources`, the member whose keys rule out those of `key` (`limits` for `requests`, and back).
    pub(crate) fn linked(self, key: &str) -> Option<&'static str> {
        match (self, key) {
            (Shape::Resources, "requests") => Some("limits"),
            (Shape::Resources, "limits") => Some("requests"),
            _ => None,
        }
    }

    /// The union members other than `key`, when `key` belongs to one.
    pub(crate) fn rivals(self, key: &str) -> &'static [&'static str] {
        match self {
            Shape::OneOf(members) if members.contains(&key) => members,
            _ => &[],
        }
    }
}

/// A container's ports: matched by `containerPort`, and their names are unique in the container too.
pub(crate) const PORTS: &str = "ports";

/// A node of what a template is merged into: the pod (on simd-json's tape) when injecting, or the template that
/// comes first when templates are combined. The rules below read it through this trait, so that both merges
/// apply the same rules.
pub(crate) trait Existing<'a>: Copy {
    /// The member `key`, unless it is absent or null.
    fn member(self, key: &str) -> Option<Self>;
    /// The node as a string, if it is one.
    fn string(self) -> Option<&'a str>;
    /// The node as a boolean, if it is one.
    fn boolean(self) -> Option<bool>;
    /// The node's items, if it is a list.
    fn items(self) -> Option<impl Iterator<Item = Self>>;
    /// The node as an integer, if it is one.
    fn int(self) -> Option<i64>;
    /// Is the node null?
    fn is_null(self) -> bool;
    /// Whether the node, a map, is empty; `None` when it is no map.
    fn map_is_empty(self) -> Option<bool>;
    /// Whether the node, a list, is empty; `None` when it is no list.
    fn list_is_empty(self) -> Option<bool>;
    /// The node's entries in order, if it is a map of more than `more_than` of them: the walk then finds its
    /// members in one pass ([`Existing::member`] scans a tape's map, once for each member looked up).
    fn large_map_entries(self, more_than: usize) -> Option<impl Iterator<Item = (&'a str, Self)>>;
}

/// May the template add the member `key` to `object`, an object of the given shape that lacks it? Not when the
/// object has chosen another member of the same union, nor when it would pair `allowPrivilegeEscalation` with
/// privilege: the API server refuses both, and what the user set wins.
pub(crate) fn may_add_member<'a>(shape: Shape, key: &str, object: impl Existing<'a>) -> bool {
    !(shape.rivals(key).iter().any(|rival| object.member(rival).is_some())
        || shape == Shape::SecurityContext && escalation_conflict(key, object))
}

/// Would adding `key` to the security context `context` pair `allowPrivilegeEscalation` with privilege
/// (`privileged: true`, or `CAP_SYS_ADMIN` added)? The API server refuses the pair.
fn escalation_conflict<'a>(key: &str, context: impl Existing<'a>) -> bool {
    let privileged = || {
        context.member("privileged").and_then(Existing::boolean) == Some(true)
            || context
                .member("capabilities")
                .and_then(|c| c.member("add"))
                .and_then(Existing::items)
                .is_some_and(|mut added| added.any(|c| c.string() == Some("CAP_SYS_ADMIN")))
    };
    match key {
        "allowPrivilegeEscalation" => privileged(),
        "privileged" => context.member("allowPrivilegeEscalation").and_then(Existing::boolean) == Some(false),
        _ => false,
    }
}

/// May the template add an item named `name` to `items`, the list under `field`, which has no item of the same
/// merge key? Not when it repeats a name the API server wants unique: a port name the container gives another
/// port, or a container the pod declares in another of its container `lists` (in [`CONTAINER_LISTS`] order; the
/// pod's own, say a sidecar declared as a native sidecar, is the user's choice).
pub(crate) fn may_add_item<'a, N: Existing<'a>>(
    field: &str,
    name: Option<&str>,
    items: N,
    lists: &[Option<N>; 3],
) -> bool {
    let Some(name) = name else { return true };
    let named = |item: N| item.member("name").and_then(Existing::string) == Some(name);
    if field == PORTS {
        return !items.items().is_some_and(|mut ports| ports.any(named));
    }
    !named_elsewhere(lists, field, name)
}

/// Is `name`, of an item of the container list `field`, a container in another of the pod's container `lists`?
pub(crate) fn named_elsewhere<'a, N: Existing<'a>>(lists: &[Option<N>; 3], field: &str, name: &str) -> bool {
    let Some(own) = CONTAINER_LISTS.iter().position(|list| *list == field) else { return false };
    let named = |item: N| item.member("name").and_then(Existing::string) == Some(name);
    lists
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != own)
        .filter_map(|(_, list)| list.and_then(Existing::items))
        .any(|mut containers| containers.any(named))
}

/// The cluster autoscaler's pod annotation naming, comma-separated, the local volumes (`emptyDir`, `hostPath`) it
/// may evict the pod with; without it such a volume keeps the node from being scaled down (istio#19395).
pub(crate) const SAFE_TO_EVICT_LOCAL_VOLUMES: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes";

/// Is the string under `key` a comma-separated set of names, merged as a set? The pod's value is kept and the
/// names it lacks appended (the only `add` that replaces a value, and only with a longer one): what the user
/// listed stays listed. Any other string the pod has is the user's, whatever the template says.
pub(crate) fn is_name_set(key: &str) -> bool {
    key == SAFE_TO_EVICT_LOCAL_VOLUMES
}

/// The names of the set `template` (comma-separated) that the set `existing` lacks.
pub(crate) fn missing_names<'a>(existing: &'a str, template: &'a str) -> impl Iterator<Item = &'a str> {
    let names = |set: &'a str| set.split(',').map(str::trim).filter(|name| !name.is_empty());
    names(template).filter(move |name| !names(existing).any(|have| have == *name))
}

/// `existing` with the names of `template` it lacks appended, or `None` when it lacks none.
pub(crate) fn name_union(existing: &str, template: &str) -> Option<String> {
    let mut missing = missing_names(existing, template).peekable();
    missing.peek()?;
    let mut union = existing.trim().trim_end_matches(',').to_owned();
    for name in missing {
        if !union.is_empty() {
            union.push(',');
        }
        union.push_str(name);
    }
    Some(union)
}

/// The inverse of [`name_union`]: `existing` without the names of `template` that a union appended to it (the
/// longest such tail of the list whose union with `template` gives `existing` back exactly), or `None` when no
/// tail was appended. A name the user listed last that is also the template's cannot always be told from an
/// appended one.
pub(crate) fn name_difference(existing: &str, template: &str) -> Option<String> {
    let segments: Vec<&str> = existing.split(',').collect();
    let is_template_name = |segment: &&&str| template.split(',').any(|name| name.trim() == segment.trim());
    let tail = segments.iter().rev().take_while(is_template_name).count();
    (1..=tail.min(segments.len().saturating_sub(1))).rev().find_map(|k| {
        let kept = segments[..segments.len() - k].join(",");
        (name_union(&kept, template).as_deref() == Some(existing)).then_some(kept)
    })
}

/// Does an empty map or list that a template meets count as absent? It does, and takes the template's whole
/// value, unless the template's is empty too: `{}` already satisfies `emptyDir: {}`, and re-adding it would
/// never converge. (Null counts as absent always: see [`Existing::member`].)
#[inline]
pub(crate) fn empty_is_absent(existing_is_empty: bool, template_is_empty: bool) -> bool {
    existing_is_empty && !template_is_empty
}

/// Does `map` set `key` to anything but null? `map` is the pod's map whose keys are the user's beside the one
/// being merged (a container's `limits` beside its `requests`: see [`Shape::linked`]).
pub(crate) fn is_set<'a>(map: Option<impl Existing<'a>>, key: &str) -> bool {
    map.and_then(|m| m.member(key)).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_sets_keep_the_existing_names_and_append_the_missing_ones_once() {
        assert_eq!(name_union("data, cache", "cache,proxy"), Some("data, cache,proxy".to_owned()));
        assert_eq!(name_union("", "a,b"), Some("a,b".to_owned()));
        assert_eq!(name_union("a,", "b"), Some("a,b".to_owned()));
        assert_eq!(name_union("b , a", "a,b"), None);
        assert_eq!(name_union("x", ""), None);
        let once = name_union("x", "a,b").unwrap();
        assert_eq!(name_union(&once, "a,b"), None, "a union is a fixed point");
        for (own, template) in [("mine", "a,b"), ("mine, c", "a,b"), ("b,mine", "a,b"), ("mine, a", "a,b")] {
            let union = name_union(own, template).unwrap();
            assert_eq!(name_difference(&union, template).as_deref(), Some(own), "{own:?} + {template:?}");
        }
        assert_eq!(name_difference("mine", "a,b"), None);
        assert_eq!(name_difference("a,mine", "a"), None, "a name that does not end the list is the user's");
    }

    #[test]
    fn an_empty_value_is_absent_unless_the_templates_is_empty_too() {
        assert!(empty_is_absent(true, false));
        assert!(!empty_is_absent(true, true), "`emptyDir: {{}}` meets `{{}}`: nothing to add, ever");
        assert!(!empty_is_absent(false, false) && !empty_is_absent(false, true));
    }
}
