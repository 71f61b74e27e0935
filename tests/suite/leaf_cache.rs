//! The per-thread cache of rendered leaves (`LeafCache`) never changes an answer, by a differential test: a
//! long-lived engine, whose cache is warm from the pods before, answers every review with exactly the bytes (and
//! the outcome) that a freshly built engine gives, whose renderers are new and so find nothing in the cache. Both
//! run on the same review bytes in the same thread, for sequences of pods drawn from small alphabets (so that
//! repeats and near-repeats, pods that differ in one field, one label, the order of their labels or the map an
//! entry is in, are the rule), through templates that between them read the pod in every way a template can: a
//! label by attribute and by subscript, a missing one with `default`, `in`, `is defined`, more absent keys than a
//! record keeps one by one, `length` and truthiness, iteration in the pod's order and sorted, a whole map printed,
//! the names with a short-circuit, a branch on a label choosing what else to read, a key computed from another
//! field, the containers and their ports, the whole pod, overrides, strict lookups that fail (a failure must be
//! the same warm and cold too), and the built-in template. The warm engine reviews the sequence three times (in
//! order, again, and in reverse), each pod just after a decoy engine whose template reads the same and renders
//! otherwise. The cache may key an entry on only what the render read; whatever it keys on, a pod must never get
//! the output rendered for another. Hand-written cases at the end pin the likeliest mistakes.

use crate::common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use sidecar_injector_core::{Engine, Outcome, PARSE_PADDING, Settings, TemplateSet};

/// The templates under test, each reading the pod in a few ways (and each loaded by `engine`, which fails the
/// test if it does not load). Env values and annotations must be strings, so leaves that print another type
/// carry some text; `periodSeconds` takes a leaf that is a number.
const TEMPLATES: [(&str, &str); 13] = [
    (
        // Fails for a pod without `app` (strict undefined), and names the pod in its warning.
        "strict",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: APP, value: "{{ pod.labels.app }}" }
          - { name: VERSION, value: "v-{{ pod.labels['version'] }}" }
"#,
    ),
    (
        "lookup",
        r#"
pod:
  metadata:
    annotations:
      example.com/app: "{{ pod.labels.app | default('none') }}"
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: NAME, value: "{{ pod.labels['app.kubernetes.io/name'] | default(pod.labels.app | default('-')) }}" }
          - { name: VERSION, value: "{{ pod.labels.version | default(pod.namespace) }}" }
          - { name: TRUTHY, value: "{{ pod.annotations.note | default('empty', true) }}" }
"#,
    ),
    (
        // Reads `x` and `version` of the labels and `note` of the annotations for their presence only.
        "presence",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: HAS_X, value: "x={{ 'x' in pod.labels }}" }
          - { name: VERSION_DEFINED, value: "v={{ pod.labels.version is defined }}" }
          - { name: NO_NOTE, value: "n={{ pod.annotations.note is undefined }}" }
"#,
    ),
    (
        // More lookups of absent keys in one map than a record of reads may keep one by one: the fifth, `x`,
        // must still count.
        "many",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - name: MANY
            value: "{% for _ in [1, 2, 3, 4] %}{{ pod.labels.version | default('-') }}{% endfor %}/{{ pod.labels.x | default('-') }}"
          - { name: NOTE, value: "{{ pod.annotations.note | default('-') }}" }
"#,
    ),
    (
        "length",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: COUNTS, value: "{{ pod.labels | length }} labels, {{ pod.annotations | length }} annotations" }
          - { name: ANY, value: "{{ 'some' if pod.annotations else 'none' }}" }
        readinessProbe:
          exec: { command: ["true"] }
          periodSeconds: "{{ (pod.labels | length) + 1 }}"
"#,
    ),
    (
        "iterate",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: LABELS, value: "{% for k, v in pod.labels | items %}{{ k }}={{ v }};{% endfor %}" }
          - { name: SORTED, value: "{% for k, v in pod.annotations | dictsort %}{{ k }}={{ v }};{% endfor %}" }
          - { name: FIRST, value: "{% for k in pod.labels %}{% if loop.first %}{{ k }}{% endif %}{% endfor %}." }
"#,
    ),
    (
        "print",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: ANNOTATIONS, value: "a={{ pod.annotations }}" }
          - { name: LABELS, value: "{{ pod.labels | tojson }}" }
          - { name: KEYS, value: "{{ pod.labels | list | join(',') }}" }
"#,
    ),
    (
        // `pod.name` is read only when `generateName` is empty.
        "names",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: SERVICE, value: "{{ pod.generateName or pod.name }}" }
          - { name: ACCOUNT, value: "{{ pod.serviceAccountName }}" }
"#,
    ),
    (
        // What is read depends on what was read before it.
        "branch",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - name: WHERE
            value: "{% if pod.labels.version | default('') == 'a' %}{{ pod.namespace }}{% else %}{{ pod.serviceAccountName }}{% endif %}"
          - name: WHAT
            value: "{% if 'x' in pod.labels %}{{ pod.labels.x }}{% else %}none{% endif %}"
          - name: EITHER
            value: "{{ pod.annotations.app if 'app' in pod.annotations else pod.labels.app | default('-') }}"
"#,
    ),
    (
        // A key computed from another field, an alias of a map, and a truthiness test.
        "indirect",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: PICK, value: "{{ pod.annotations[pod.labels.x | default('app')] | default('-') }}" }
          - { name: ALIAS, value: "{% set l = pod.labels %}{{ l.version | default('?') }}" }
          - { name: TRUTHY, value: "{{ pod.labels.app | default('empty', true) }}" }
"#,
    ),
    (
        "containers",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: NAMES, value: "{{ pod.containers | map(attribute='name') | join(',') }}" }
          - { name: PORTS, value: "{{ pod.containers[0].ports | map(attribute='containerPort') | join(',') }}" }
          - name: ALL_PORTS
            value: "{% for c in pod.containers %}{% for p in c.ports %}{{ p.name | default('-') }}/{{ p.containerPort }}/{{ p.protocol }};{% endfor %}{% endfor %}"
"#,
    ),
    (
        // The whole pod, printed and read by subscript.
        "whole",
        r#"
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: POD, value: "p={{ pod }}" }
          - { name: WHO, value: "{{ pod['namespace'] }}/{{ pod.name }}" }
"#,
    ),
    (
        // A value pods may override by annotation (`sidecar-injector.io/level`, one of a or b).
        "overrides",
        r#"
values:
  level: a
overrides:
  level: { value: level, type: string, oneOf: [a, b] }
pod:
  spec:
    containers:
      - name: proxy
        image: probe:1
        env:
          - { name: LEVEL, value: "{{ values.level }}:{{ pod.labels.app | default('') }}" }
          - { name: PLAIN, value: "{{ values.level }}" }
"#,
    ),
];

/// The source of the template `name` of [`TEMPLATES`].
fn source(name: &str) -> &'static str {
    TEMPLATES.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("no template {name}")).1
}

/// A new engine (new renderers, so nothing of the thread's cache is its own) over template `name`, or the
/// built-in set for `builtin`.
fn engine(name: &str) -> Engine {
    let settings = Settings::default();
    let set = match name {
        "builtin" => TemplateSet::builtin(&settings),
        _ => TemplateSet::from_source(name, &format!("{name}.yaml"), source(name), &settings),
    };
    let set = set.unwrap_or_else(|e| panic!("template {name} does not load: {e}"));
    Engine::new(set, &settings)
}

/// An engine over a twin of template `name`: the same reads, another output (its env values start with `decoy-`).
/// Its renders fill the thread's cache with entries that a cache keyed on what was read (but not on whose render
/// it was) would serve for the real template.
fn decoy(name: &str) -> Engine {
    let settings = Settings::default();
    let source = match name {
        "builtin" => sidecar_injector_core::template::BUILTIN_SOURCE,
        _ => source(name),
    };
    let twin = source.replace("value: \"", "value: \"decoy-");
    assert_ne!(twin, source, "template {name} has no env value to make a decoy of");
    let set = TemplateSet::from_source(name, &format!("{name}.yaml"), &twin, &settings);
    Engine::new(set.unwrap_or_else(|e| panic!("the decoy of template {name} does not load: {e}")), &settings)
}

/// An engine's answer to a review: the outcome and the response bytes.
type Answer = (Outcome, Vec<u8>);

/// The engine's answer to `body`.
fn ask(engine: &Engine, body: &[u8]) -> Answer {
    let mut request = Vec::with_capacity(body.len() + PARSE_PADDING);
    request.extend_from_slice(body);
    let mut out = Vec::new();
    let outcome = engine.review(&mut request, &mut out).unwrap_or_else(|e| panic!("a well-formed review: {e}"));
    (outcome, out)
}

/// A response as a person reads it: its JSON with the patch decoded.
fn readable(response: &[u8]) -> String {
    use base64::Engine as _;
    let Ok(mut value) = serde_json::from_slice::<Value>(response) else {
        return String::from_utf8_lossy(response).into_owned();
    };
    if let Some(patch) = value["response"].get_mut("patch") {
        let bytes = base64::engine::general_purpose::STANDARD.decode(patch.as_str().unwrap_or_default());
        if let Some(decoded) = bytes.ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()) {
            *patch = decoded;
        }
    }
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

const NAMES: [&str; 3] = ["", "a", "b"];
const GENERATE_NAMES: [Option<&str>; 3] = [None, Some("web-"), Some("db-")];
/// `None` takes the request's namespace, `shop`: the same namespace as `Some("shop")`, reached another way.
const NAMESPACES: [Option<&str>; 3] = [None, Some("shop"), Some("lab")];
/// `None` is `default` to templates, like `Some("default")`.
const ACCOUNTS: [Option<&str>; 3] = [None, Some("default"), Some("robot")];
const LABEL_KEYS: [&str; 4] = ["app", "app.kubernetes.io/name", "version", "x"];
/// `a` is also a value of the label `x` (template `indirect` looks it up); `sidecar-injector.io/level` is the
/// override of template `overrides` (refused when empty), an unknown annotation (a warning) to the others.
const ANNOTATION_KEYS: [&str; 5] = ["app", "a", "note", "example.com/team", "sidecar-injector.io/level"];
const VALUES: [&str; 3] = ["", "a", "b"];
/// `proxy` is also the name of the templates' sidecar.
const CONTAINERS: [&str; 3] = ["web", "api", "proxy"];
const PORTS: usize = 5;

/// Port lists a container may have, by index: none, absent, and a few with and without a name or protocol.
fn ports(choice: usize) -> Option<Value> {
    match choice {
        0 => None,
        1 => Some(json!([])),
        2 => Some(json!([{"containerPort": 8080}])),
        3 => Some(json!([{"name": "http", "containerPort": 8080}])),
        _ => Some(json!([{"name": "http", "containerPort": 8080}, {"containerPort": 9090, "protocol": "UDP"}])),
    }
}

/// A pod, in the fields templates read (and whether a Job owns it, which gives another shape of the template).
/// Maps keep their order, which is the order of the JSON object.
#[derive(Clone, PartialEq, Eq)]
struct Pod {
    /// Empty: no name.
    name: &'static str,
    generate_name: Option<&'static str>,
    namespace: Option<&'static str>,
    account: Option<&'static str>,
    /// `None`: no `labels` at all; `Some(empty)`: `{}`.
    labels: Option<Vec<(&'static str, &'static str)>>,
    annotations: Option<Vec<(&'static str, &'static str)>>,
    /// Each container's name and its ports (an index of [`ports`]).
    containers: Vec<(&'static str, usize)>,
    job: bool,
}

impl Pod {
    fn json(&self) -> Value {
        let text = |s: &str| Value::String(s.to_owned());
        let map =
            |entries: &[(&str, &str)]| Value::Object(entries.iter().map(|(k, v)| (k.to_string(), text(v))).collect());
        let mut metadata = Map::new();
        if !self.name.is_empty() {
            metadata.insert("name".into(), text(self.name));
        }
        if let Some(generate) = self.generate_name {
            metadata.insert("generateName".into(), text(generate));
        }
        if let Some(namespace) = self.namespace {
            metadata.insert("namespace".into(), text(namespace));
        }
        if let Some(labels) = &self.labels {
            metadata.insert("labels".into(), map(labels));
        }
        if let Some(annotations) = &self.annotations {
            metadata.insert("annotations".into(), map(annotations));
        }
        if self.job {
            let owner = json!({"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j-1", "controller": true});
            metadata.insert("ownerReferences".into(), json!([owner]));
        }
        let mut spec = Map::new();
        if let Some(account) = self.account {
            spec.insert("serviceAccountName".into(), text(account));
        }
        let containers = self.containers.iter().map(|(name, choice)| {
            let mut container = Map::new();
            container.insert("name".into(), text(name));
            container.insert("image".into(), text("app:1"));
            if let Some(ports) = ports(*choice) {
                container.insert("ports".into(), ports);
            }
            Value::Object(container)
        });
        spec.insert("containers".into(), Value::Array(containers.collect()));
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    }

    /// The review of this pod, with `uid`, as bytes.
    fn review(&self, uid: &str) -> Vec<u8> {
        let mut review = common::review(&self.json());
        review["request"]["uid"] = json!(uid);
        serde_json::to_vec(&review).unwrap()
    }

    fn apply(&mut self, change: &Change) {
        fn set(map: &mut Option<Vec<(&'static str, &'static str)>>, key: &'static str, value: Option<&'static str>) {
            let entries = map.get_or_insert_with(Vec::new);
            match (entries.iter().position(|(k, _)| *k == key), value) {
                (Some(at), Some(value)) => entries[at].1 = value,
                (Some(at), None) => {
                    entries.remove(at);
                }
                (None, Some(value)) => entries.push((key, value)),
                (None, None) => {}
            }
        }
        match *change {
            Change::Name(name) => self.name = name,
            Change::GenerateName(generate) => self.generate_name = generate,
            Change::Namespace(namespace) => self.namespace = namespace,
            Change::Account(account) => self.account = account,
            Change::Label(key, value) => set(&mut self.labels, key, value),
            Change::Annotation(key, value) => set(&mut self.annotations, key, value),
            Change::RotateLabels => {
                if let Some(labels) = self.labels.as_mut().filter(|l| !l.is_empty()) {
                    labels.rotate_left(1);
                }
            }
            Change::RotateAnnotations => {
                if let Some(annotations) = self.annotations.as_mut().filter(|a| !a.is_empty()) {
                    annotations.rotate_left(1);
                }
            }
            Change::SwapMaps => std::mem::swap(&mut self.labels, &mut self.annotations),
            Change::Container(at, name, choice) => {
                let at = at.min(self.containers.len());
                if self.containers.iter().enumerate().any(|(i, (n, _))| i != at && *n == name) {
                    return;
                }
                match self.containers.get_mut(at) {
                    Some(container) => *container = (name, choice),
                    None => self.containers.push((name, choice)),
                }
            }
            Change::DropContainer => {
                if self.containers.len() > 1 {
                    self.containers.pop();
                }
            }
            Change::Job(job) => self.job = job,
        }
    }
}

impl fmt::Debug for Pod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.json())
    }
}

/// One field of a pod changed: what makes the next pod a near-repeat of an earlier one.
#[derive(Clone, Debug)]
enum Change {
    Name(&'static str),
    GenerateName(Option<&'static str>),
    Namespace(Option<&'static str>),
    Account(Option<&'static str>),
    /// Sets (in place, or appended) or removes a label.
    Label(&'static str, Option<&'static str>),
    Annotation(&'static str, Option<&'static str>),
    /// The first label becomes the last: the same labels in another order.
    RotateLabels,
    RotateAnnotations,
    /// The labels become the annotations and the annotations the labels: the same entries in the other map.
    SwapMaps,
    /// Replaces the container at (or appends one past) an index, unless another has its name.
    Container(usize, &'static str, usize),
    DropContainer,
    Job(bool),
}

fn pick<T: Clone + fmt::Debug + 'static>(items: &'static [T]) -> impl Strategy<Value = T> + Clone {
    prop::sample::select(items)
}

/// A map over `keys`: absent, or a subset of them with values from [`VALUES`], in any order.
fn string_map(keys: &'static [&'static str]) -> impl Strategy<Value = Option<Vec<(&'static str, &'static str)>>> {
    let entries = (
        prop::collection::vec(prop::option::of(pick(&VALUES)), keys.len()),
        Just((0..keys.len()).collect::<Vec<_>>()).prop_shuffle(),
    )
        .prop_map(move |(values, order)| {
            order.into_iter().filter_map(|i| values[i].map(|v| (keys[i], v))).collect::<Vec<_>>()
        });
    prop_oneof![1 => Just(None), 5 => entries.prop_map(Some)]
}

fn pod() -> impl Strategy<Value = Pod> {
    let containers = prop::collection::vec((pick(&CONTAINERS), 0..PORTS), 1..=2).prop_map(|mut containers| {
        containers.dedup_by_key(|(name, _)| *name);
        containers
    });
    (
        pick(&NAMES),
        pick(&GENERATE_NAMES),
        pick(&NAMESPACES),
        pick(&ACCOUNTS),
        string_map(&LABEL_KEYS),
        string_map(&ANNOTATION_KEYS),
        containers,
        prop::bool::weighted(0.1),
    )
        .prop_map(|(name, generate_name, namespace, account, labels, annotations, containers, job)| Pod {
            name,
            generate_name,
            namespace,
            account,
            labels,
            annotations,
            containers,
            job,
        })
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        1 => pick(&NAMES).prop_map(Change::Name),
        1 => pick(&GENERATE_NAMES).prop_map(Change::GenerateName),
        1 => pick(&NAMESPACES).prop_map(Change::Namespace),
        1 => pick(&ACCOUNTS).prop_map(Change::Account),
        3 => (pick(&LABEL_KEYS), prop::option::of(pick(&VALUES))).prop_map(|(k, v)| Change::Label(k, v)),
        2 => (pick(&ANNOTATION_KEYS), prop::option::of(pick(&VALUES))).prop_map(|(k, v)| Change::Annotation(k, v)),
        2 => Just(Change::RotateLabels),
        1 => Just(Change::RotateAnnotations),
        1 => Just(Change::SwapMaps),
        1 => (0..2usize, pick(&CONTAINERS), 0..PORTS).prop_map(|(at, name, choice)| Change::Container(at, name, choice)),
        1 => Just(Change::DropContainer),
        1 => any::<bool>().prop_map(Change::Job),
    ]
}

/// 1 to 23 pods: each an earlier pod (or one of a few random ones) again, or with one or two fields changed.
fn pods() -> impl Strategy<Value = Vec<Pod>> {
    let changes = prop_oneof![
        2 => Just(Vec::new()),
        2 => prop::collection::vec(change(), 1),
        1 => prop::collection::vec(change(), 2),
    ];
    let steps = prop::collection::vec((any::<prop::sample::Index>(), changes), 1..24);
    (prop::collection::vec(pod(), 1..5), steps).prop_map(|(seeds, steps)| {
        let mut known = seeds;
        let mut sequence = Vec::with_capacity(steps.len());
        for (from, changes) in steps {
            let mut next = from.get(&known).clone();
            for change in &changes {
                next.apply(change);
            }
            known.push(next.clone());
            sequence.push(next);
        }
        sequence
    })
}

/// The uid of every review: one pod, one body, whatever its place in a sequence.
const UID: &str = "0f7c1e9a-uid";

/// The answer of a new engine over `template` to `body`. A new engine's answer depends on nothing but the two,
/// so it is computed once per thread (each property runs on its own thread) and then remembered: a sequence
/// repeats its pods, cases share some, and shrinking a failure replays them.
fn cold(template: &str, body: &[u8]) -> Answer {
    thread_local! {
        static ANSWERS: RefCell<HashMap<(String, Vec<u8>), Answer>> = RefCell::new(HashMap::new());
    }
    let key = (template.to_owned(), body.to_vec());
    if let Some(answer) = ANSWERS.with(|answers| answers.borrow().get(&key).cloned()) {
        return answer;
    }
    let answer = ask(&engine(template), body);
    ANSWERS.with(|answers| answers.borrow_mut().insert(key, answer.clone()));
    answer
}

/// The differential check: `pods` reviewed by one engine over `template` kept for the whole sequence (three
/// passes: in order, in order again, in reverse) give, pod by pod, the same outcome and response bytes as a new
/// engine. All in this thread, so the warm engine's renders share the cache with the new engines' and with those
/// of a [`decoy`], which reviews each pod just before the warm engine does.
fn differential(template: &str, pods: &[Pod]) -> Result<(), TestCaseError> {
    let bodies: Vec<Vec<u8>> = pods.iter().map(|pod| pod.review(UID)).collect();
    let cold: Vec<Answer> = bodies.iter().map(|body| cold(template, body)).collect();
    let warm = engine(template);
    let decoy = decoy(template);
    let order: Vec<usize> = (0..pods.len()).chain(0..pods.len()).chain((0..pods.len()).rev()).collect();
    for (step, &i) in order.iter().enumerate() {
        ask(&decoy, &bodies[i]);
        let (outcome, response) = ask(&warm, &bodies[i]);
        let (cold_outcome, cold_response) = &cold[i];
        if response != *cold_response || outcome != *cold_outcome {
            let history: Vec<String> = order[..=step].iter().map(|&j| format!("  #{j}: {:?}", pods[j])).collect();
            return Err(TestCaseError::fail(format!(
                "template {template}: pod #{i} answered differently by the warm engine (review {step} of its \
                 passes) and by a new one\nwarm engine's reviews so far:\n{}\nwarm: {outcome:?}\n{}\ncold: \
                 {cold_outcome:?}\n{}",
                history.join("\n"),
                readable(&response),
                readable(cold_response),
            )));
        }
    }
    Ok(())
}

/// Cases per template: each is up to 23 pods, every new one reviewed by an engine built for it (about 5 ms in a
/// debug build, 25 ms for the built-in template, which gets fewer cases).
const CASES: u32 = 24;
const BUILTIN_CASES: u32 = 12;

/// `cases` cases, and room to shrink a failure down to the few pods that show it (proptest's default stops after
/// four shrinking steps a case).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 4096, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config(CASES))]

    #[test]
    fn strict_lookups_answer_and_fail_alike_warm_and_cold(pods in pods()) {
        differential("strict", &pods)?;
    }

    #[test]
    fn lookups_with_defaults_answer_alike_warm_and_cold(pods in pods()) {
        differential("lookup", &pods)?;
    }

    #[test]
    fn presence_tests_answer_alike_warm_and_cold(pods in pods()) {
        differential("presence", &pods)?;
    }

    #[test]
    fn many_absent_lookups_answer_alike_warm_and_cold(pods in pods()) {
        differential("many", &pods)?;
    }

    #[test]
    fn lengths_answer_alike_warm_and_cold(pods in pods()) {
        differential("length", &pods)?;
    }

    #[test]
    fn iterated_maps_answer_alike_warm_and_cold(pods in pods()) {
        differential("iterate", &pods)?;
    }

    #[test]
    fn printed_maps_answer_alike_warm_and_cold(pods in pods()) {
        differential("print", &pods)?;
    }

    #[test]
    fn short_circuited_names_answer_alike_warm_and_cold(pods in pods()) {
        differential("names", &pods)?;
    }

    #[test]
    fn branches_answer_alike_warm_and_cold(pods in pods()) {
        differential("branch", &pods)?;
    }

    #[test]
    fn computed_keys_answer_alike_warm_and_cold(pods in pods()) {
        differential("indirect", &pods)?;
    }

    #[test]
    fn containers_answer_alike_warm_and_cold(pods in pods()) {
        differential("containers", &pods)?;
    }

    #[test]
    fn the_whole_pod_answers_alike_warm_and_cold(pods in pods()) {
        differential("whole", &pods)?;
    }

    #[test]
    fn overrides_answer_alike_warm_and_cold(pods in pods()) {
        differential("overrides", &pods)?;
    }
}

proptest! {
    #![proptest_config(config(BUILTIN_CASES))]

    #[test]
    fn the_builtin_template_answers_alike_warm_and_cold(pods in pods()) {
        differential("builtin", &pods)?;
    }
}

// Hand-written cases, the ones a cache keyed on what the render read most easily gets wrong. Each runs the pods in
// order through one warm engine and checks every answer against a new engine's, and also that the pods that must
// differ do (so the warm engine had something to get wrong).

/// A pod with the given labels (in this order), the rest fixed.
fn labelled(labels: &[(&'static str, &'static str)]) -> Pod {
    Pod {
        name: "a",
        generate_name: None,
        namespace: Some("shop"),
        account: None,
        labels: Some(labels.to_vec()),
        annotations: None,
        containers: vec![("web", 0)],
        job: false,
    }
}

/// Reviews `pods` in order with one warm engine over `template`, checks each answer against a new engine's, and
/// returns the value of the env var `var` of the injected sidecar for each pod (`None` when not injected).
fn sidecar_env(template: &str, pods: &[Pod], var: &str) -> Vec<Option<String>> {
    let warm = engine(template);
    pods.iter()
        .enumerate()
        .map(|(i, pod)| {
            let body = pod.review(&format!("uid-{i}"));
            let (outcome, response) = ask(&warm, &body);
            let (cold_outcome, cold_response) = ask(&engine(template), &body);
            assert_eq!(
                readable(&response),
                readable(&cold_response),
                "template {template}: pod #{i} {pod:?} after {:?}",
                &pods[..i]
            );
            assert_eq!(response, cold_response, "template {template}: pod #{i}: the same JSON, other bytes");
            assert_eq!(outcome, cold_outcome, "template {template}: pod #{i}");
            env_of_sidecar(&pod.json(), &response, var)
        })
        .collect()
}

/// The container `proxy` once the response's patch is applied to `pod` (`None` without a patch).
fn sidecar(pod: &Value, response: &[u8]) -> Option<Value> {
    use base64::Engine as _;
    let response: Value = serde_json::from_slice(response).unwrap();
    let patch = response["response"]["patch"].as_str()?;
    let patch = serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(patch).unwrap()).unwrap();
    let injected = common::apply(pod, &patch);
    let containers = injected["spec"]["containers"].as_array().unwrap();
    Some(containers.iter().find(|c| c["name"] == "proxy").unwrap_or_else(|| panic!("no proxy in {injected}")).clone())
}

/// The env var `var` of the container `proxy` once the response's patch is applied to `pod`.
fn env_of_sidecar(pod: &Value, response: &[u8], var: &str) -> Option<String> {
    let proxy = sidecar(pod, response)?;
    Some(common::env_value(&proxy, var).as_str().unwrap().to_owned())
}

#[test]
fn every_template_loads_and_renders_each_pod_its_own_way() {
    // Else a property over it would compare answers that no cache could get wrong.
    let quiet = labelled(&[]);
    let busy = Pod {
        name: "b",
        generate_name: Some("db-"),
        namespace: Some("lab"),
        account: Some("robot"),
        labels: Some(vec![("x", "a"), ("version", "a"), ("app.kubernetes.io/name", "b"), ("app", "b")]),
        annotations: Some(vec![("note", "b"), ("a", "b"), ("app", "b"), ("sidecar-injector.io/level", "b")]),
        containers: vec![("api", 4), ("web", 3)],
        job: false,
    };
    for name in TEMPLATES.iter().map(|(name, _)| *name).chain(["builtin"]) {
        let [quiet, busy] = [&quiet, &busy].map(|pod| sidecar(&pod.json(), &ask(&engine(name), &pod.review(UID)).1));
        assert!(busy.is_some(), "template {name} injects nothing into a pod that has every field");
        assert_ne!(quiet, busy, "template {name} renders two pods that differ in every field alike");
    }
}

#[test]
fn a_label_absent_from_the_first_pod_is_looked_up_in_the_second() {
    let without = labelled(&[("app", "a")]);
    let with = labelled(&[("app", "a"), ("version", "b")]);
    let empty = labelled(&[("app", "a"), ("version", "")]);
    let pods = [without.clone(), with.clone(), empty.clone(), without.clone(), with];
    let version = sidecar_env("lookup", &pods, "VERSION");
    assert_eq!(version, ["shop", "b", "", "shop", "b"].map(|v| Some(v.to_owned())));
    let defined = sidecar_env("presence", &pods, "VERSION_DEFINED");
    assert_eq!(defined, ["v=False", "v=True", "v=True", "v=False", "v=True"].map(|v| Some(v.to_owned())));
    let alias = sidecar_env("indirect", &pods, "ALIAS");
    assert_eq!(alias, ["?", "b", "", "?", "b"].map(|v| Some(v.to_owned())));
    // The strict lookups: an absent `app` or `version` fails, for each pod anew (the warning names the pod and the
    // field), and a present one renders.
    let both = labelled(&[("app", "a"), ("version", "b")]);
    let no_app = labelled(&[("version", "b")]);
    let renamed = Pod { name: "b", ..no_app.clone() };
    let app = sidecar_env("strict", &[both.clone(), no_app.clone(), renamed.clone(), without, both], "APP");
    assert_eq!(app, [Some("a".to_owned()), None, None, None, Some("a".to_owned())]);
    let warnings = |pod: &Pod| ask(&engine("strict"), &pod.review(UID)).0.warnings;
    let (first, second) = (warnings(&no_app), warnings(&renamed));
    assert!(first[0].contains("pod shop/a") && second[0].contains("pod shop/b"), "{first:?} {second:?}");
}

#[test]
fn labels_in_another_order_iterate_in_their_own_order() {
    let one = labelled(&[("app", "a"), ("x", "b"), ("version", "")]);
    let other = labelled(&[("x", "b"), ("version", ""), ("app", "a")]);
    let pods = [one.clone(), other.clone(), one.clone(), other.clone()];
    let iterated = sidecar_env("iterate", &pods, "LABELS");
    let (first, second) = ("app=a;x=b;version=;", "x=b;version=;app=a;");
    assert_eq!(iterated, [first, second, first, second].map(|v| Some(v.to_owned())));
    let keys = sidecar_env("print", &pods, "KEYS");
    assert_eq!(keys, ["app,x,version", "x,version,app", "app,x,version", "x,version,app"].map(|v| Some(v.to_owned())));
    let printed = sidecar_env("print", &pods, "LABELS");
    assert_ne!(printed[0], printed[1]);
    assert_eq!((&printed[0], &printed[1]), (&printed[2], &printed[3]));
    // Counted or looked up, the order does not matter.
    let counts = sidecar_env("length", &pods, "COUNTS");
    assert!(counts.iter().all(|c| c.as_deref() == Some("3 labels, 0 annotations")), "{counts:?}");
}

#[test]
fn the_name_matters_only_when_there_is_no_generate_name() {
    let generated = |name| Pod { name, generate_name: Some("web-"), ..labelled(&[]) };
    let named = |name| Pod { name, generate_name: None, ..labelled(&[]) };
    let pods = [generated("a"), generated("b"), generated(""), named("a"), named("b"), generated("a"), named("a")];
    let service = sidecar_env("names", &pods, "SERVICE");
    assert_eq!(service, ["web-", "web-", "web-", "a", "b", "web-", "a"].map(|v| Some(v.to_owned())));
    let whole = sidecar_env("whole", &pods, "WHO");
    assert_eq!(
        whole,
        ["shop/a", "shop/b", "shop/", "shop/a", "shop/b", "shop/a", "shop/a"].map(|v| Some(v.to_owned()))
    );
}

#[test]
fn a_label_read_only_through_in_keys_on_its_presence_and_a_branch_on_its_value() {
    let pods = [
        labelled(&[("x", "a")]),
        labelled(&[("x", "b")]),
        labelled(&[("x", "")]),
        labelled(&[]),
        labelled(&[("x", "a")]),
        labelled(&[("app", "a")]),
    ];
    let present = sidecar_env("presence", &pods, "HAS_X");
    assert_eq!(present, ["x=True", "x=True", "x=True", "x=False", "x=True", "x=False"].map(|v| Some(v.to_owned())));
    // The branch reads the value only where `in` said it is there.
    let what = sidecar_env("branch", &pods, "WHAT");
    assert_eq!(what, ["a", "b", "", "none", "a", "none"].map(|v| Some(v.to_owned())));
    // And `x`'s value names the annotation looked up.
    let annotated = |labels: &[(&'static str, &'static str)]| Pod {
        annotations: Some(vec![("app", "from-app"), ("a", "from-a")]),
        ..labelled(labels)
    };
    let pods = [annotated(&[("x", "a")]), annotated(&[("x", "b")]), annotated(&[]), annotated(&[("x", "a")])];
    let picked = sidecar_env("indirect", &pods, "PICK");
    assert_eq!(picked, ["from-a", "-", "from-app", "from-a"].map(|v| Some(v.to_owned())));
}

#[test]
fn a_branch_reads_other_fields_for_other_pods() {
    let pod = |version, namespace, account| Pod {
        namespace: Some(namespace),
        account: Some(account),
        ..labelled(&[("version", version)])
    };
    let pods = [
        pod("b", "shop", "robot"),
        pod("a", "shop", "robot"),
        pod("a", "lab", "robot"),
        pod("b", "lab", "default"),
        pod("b", "shop", "robot"),
    ];
    let r#where = sidecar_env("branch", &pods, "WHERE");
    assert_eq!(r#where, ["robot", "shop", "lab", "default", "robot"].map(|v| Some(v.to_owned())));
}

#[test]
fn containers_and_their_ports_are_read_as_sent() {
    let pod = |containers: &[(&'static str, usize)]| Pod { containers: containers.to_vec(), ..labelled(&[]) };
    let pods = [
        pod(&[("web", 0)]),
        pod(&[("web", 0), ("api", 2)]),
        pod(&[("web", 2)]),
        pod(&[("web", 3)]),
        pod(&[("web", 4)]),
        pod(&[("api", 4), ("web", 0)]),
        pod(&[("web", 0)]),
    ];
    let names = sidecar_env("containers", &pods, "NAMES");
    assert_eq!(names, ["web", "web,api", "web", "web", "web", "api,web", "web"].map(|v| Some(v.to_owned())));
    let ports = sidecar_env("containers", &pods, "ALL_PORTS");
    let (unnamed, http, both) = ("-/8080/TCP;", "http/8080/TCP;", "http/8080/TCP;-/9090/UDP;");
    assert_eq!(ports, ["", unnamed, unnamed, http, both, both, ""].map(|v| Some(v.to_owned())));
}

#[test]
fn the_same_entry_as_a_label_or_as_an_annotation_is_told_apart() {
    let label = labelled(&[("app", "a")]);
    let annotation = Pod { labels: None, annotations: Some(vec![("app", "a")]), ..label.clone() };
    let pods = [label.clone(), annotation.clone(), label, annotation];
    let counts = sidecar_env("length", &pods, "COUNTS");
    let (one, other) = ("1 labels, 0 annotations", "0 labels, 1 annotations");
    assert_eq!(counts, [one, other, one, other].map(|v| Some(v.to_owned())));
    let any = sidecar_env("length", &pods, "ANY");
    assert_eq!(any, ["none", "some", "none", "some"].map(|v| Some(v.to_owned())));
    let either = sidecar_env("branch", &pods, "EITHER");
    assert!(either.iter().all(|v| v.as_deref() == Some("a")), "{either:?}");
    let printed = sidecar_env("print", &pods, "ANNOTATIONS");
    assert_ne!(printed[0], printed[1]);
}

#[test]
fn a_fifth_absent_key_looked_up_counts_as_much_as_the_first_four() {
    let pods = [
        labelled(&[]),
        labelled(&[("x", "a")]),
        labelled(&[("version", "b")]),
        labelled(&[("version", "b"), ("x", "a")]),
        labelled(&[]),
        labelled(&[("x", "b")]),
    ];
    let many = sidecar_env("many", &pods, "MANY");
    assert_eq!(many, ["----/-", "----/a", "bbbb/-", "bbbb/a", "----/-", "----/b"].map(|v| Some(v.to_owned())));
}

#[test]
fn the_builtin_template_reads_the_name_only_when_no_label_names_the_service() {
    let pod = |name, labels: &[(&'static str, &'static str)]| Pod { name, ..labelled(labels) };
    let pods = [pod("a", &[("app", "b")]), pod("b", &[("app", "b")]), pod("a", &[]), pod("b", &[]), pod("a", &[])];
    let service = sidecar_env("builtin", &pods, "PROXY_SERVICE_NAME");
    assert_eq!(service, ["b", "b", "a", "b", "a"].map(|v| Some(v.to_owned())));
}

#[test]
fn an_override_keys_the_render_it_changes() {
    let pod = |level: Option<&'static str>| Pod {
        annotations: Some(level.map(|l| ("sidecar-injector.io/level", l)).into_iter().collect()),
        ..labelled(&[("app", "a")])
    };
    // `b` overrides the value, `a` sets it to its default, an empty value is refused (the default is used).
    let pods = [pod(None), pod(Some("b")), pod(Some("a")), pod(Some("")), pod(Some("b")), pod(None)];
    let level = sidecar_env("overrides", &pods, "LEVEL");
    assert_eq!(level, ["a:a", "b:a", "a:a", "a:a", "b:a", "a:a"].map(|v| Some(v.to_owned())));
    let plain = sidecar_env("overrides", &pods, "PLAIN");
    assert_eq!(plain, ["a", "b", "a", "a", "b", "a"].map(|v| Some(v.to_owned())));
}
