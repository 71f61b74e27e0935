//! Our Pod validator against the real API server's (issue 20): generated templates and override annotations,
//! valid and invalid alike, injected into a pod without our checks; the injected pod is created with
//! `dryRun=All` and the API server's verdict compared with `validate_pod`'s. They must agree on every case.
//!
//! And the guarantee itself: whenever the template passes our load-time checks, the pod the engine really answers
//! with (overrides vetted) is one the API server stores.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use sidecar_injector_core::validation::validate_pod;
use sidecar_injector_core::{Engine, Settings, TemplateSet, Verdict};

use super::Cluster;

const NAMESPACE: &str = "e2e-rules";
/// Cases per run: each costs one or two dry-run creates, a few milliseconds each. `E2E_CASES` runs a longer
/// campaign.
const CASES: u32 = 700;

/// One change to the base template or pod: a field set to a value that may or may not be valid.
#[derive(Debug, Clone)]
enum Change {
    ContainerName(&'static str),
    Image(&'static str),
    Port(i64),
    PortName(&'static str),
    SecondPortName(&'static str),
    Protocol(&'static str),
    EnvName(&'static str),
    FieldPath(&'static str),
    ValueBesideValueFrom,
    Request(&'static str, &'static str),
    Limit(&'static str, &'static str),
    /// Overrides of the template's values, by annotation.
    Override(&'static str, &'static str),
    VolumeName(&'static str),
    DefaultMode(i64),
    ItemMode(i64),
    MountName(&'static str),
    SecondMountPath(&'static str),
    SubPath(&'static str),
    ProbeHandlers(&'static [&'static str]),
    ProbePort(PortRef),
    LivenessSuccess(i64),
    PeriodSeconds(i64),
    PreStopHandlers(&'static [&'static str]),
    PullPolicy(&'static str),
    TerminationMessagePolicy(&'static str),
    RunAsUser(i64),
    EscalationWithCapability(&'static str),
    Seccomp(&'static str, Option<&'static str>),
    Label(&'static str, &'static str),
    AnnotationKey(&'static str),
    HostAliasIp(&'static str),
    InitContainerProbe,
    /// `dnsPolicy` and a `dnsConfig`, if any.
    Dns(&'static str, Option<DnsConfig>),
    ReadinessGate(&'static str),
    RuntimeClass(&'static str),
    /// `hostnameOverride` (on by default from 1.35), and whether `setHostnameAsFQDN` is set beside it.
    HostnameOverride(&'static str, bool),
    /// key, operator, value, effect, tolerationSeconds
    Toleration(&'static str, &'static str, &'static str, &'static str, Option<i64>),
    /// A required node affinity expression: key, operator, how many values.
    NodeAffinity(&'static str, &'static str, usize),
    /// A node field selector: key, operator, its values.
    NodeField(&'static str, &'static str, &'static [&'static str]),
    /// A preferred pod anti-affinity term: weight, topology key, selector operator, how many values, namespace.
    PodAntiAffinity(i64, &'static str, &'static str, usize, &'static str),
    /// The app pod has a second container (a worker), with this host port (0: none).
    Worker(i64),
    /// The app container uses this host port and protocol.
    AppHostPort(i64, &'static str),
    /// The sidecar's port has this host port and protocol.
    SidecarHostPort(i64, &'static str),
    /// `containerDefaults` add a port with this host port (0: none) to every container of the pod.
    DefaultsPort(i64),
    /// The sidecar's probe port, its memory request and its image read from the pod's annotations, set to these.
    RenderedProbePort(&'static str),
    RenderedRequest(&'static str),
    RenderedImage(&'static str),
    /// A label rendered from the pod's labels: `tier` set on the pod to this.
    RenderedLabel(&'static str),
    /// A resize policy of the sidecar's (resource, restart policy); two of them may name one resource.
    ResizePolicy(&'static str, &'static str),
    /// An init container with a resize policy (restart policy), a native sidecar if set.
    InitResize(&'static str, bool),
    /// The app pod's `restartPolicy: Never`.
    NeverRestarts,
}

/// A `dnsConfig`: its nameservers, its searches, and whether it has an option without a name.
type DnsConfig = (&'static [&'static str], &'static [&'static str], bool);

#[derive(Debug, Clone, Copy)]
enum PortRef {
    Number(i64),
    Name(&'static str),
}

fn change() -> impl Strategy<Value = Change> {
    use Change::*;
    let names = ["proxy", "proxy-2", "Proxy_Sidecar", "-proxy", "app", "proxy.v2", "p"];
    let quantities = ["10m", "0", "1", "0.5", "1500m", "-100m", "64Mi", "1Gi", "2Gi", "1e3", "1 core", "12ab", "+5"];
    prop_oneof![
        prop::sample::select(names.to_vec()).prop_map(ContainerName),
        prop::sample::select(vec!["proxy:1", "", " proxy:1", "proxy:1 ", "proxy:1\t"]).prop_map(Image),
        prop::sample::select(vec![1i64, 80, 15000, 65535, 65536, 99999, -1, 0]).prop_map(Port),
        prop::sample::select(vec!["admin", "Admin", "admin_port", "a-long-port-name-x", "1234", "x-1", "http-2"])
            .prop_map(PortName),
        prop::sample::select(vec!["admin", "metrics"]).prop_map(SecondPortName),
        prop::sample::select(vec!["TCP", "UDP", "SCTP", "HTTP", "tcp"]).prop_map(Protocol),
        prop::sample::select(vec!["POD_IP", "pod.ip-2", "1BAD", "HAS SPACE", "A=B", "_ok", ""]).prop_map(EnvName),
        prop::sample::select(vec![
            "metadata.name",
            "status.podIP",
            "status.phase",
            "metadata.labels['app']",
            "metadata.nam",
            "spec.nodeName",
            "status.hostIPs",
            "metadata.annotations['Bad Key']",
            "spec.host"
        ])
        .prop_map(FieldPath),
        Just(ValueBesideValueFrom),
        (
            prop::sample::select(vec!["cpu", "memory", "example.com/gpu", "gpu"]),
            prop::sample::select(quantities.to_vec())
        )
            .prop_map(|(r, q)| Request(r, q)),
        (prop::sample::select(vec!["cpu", "memory", "example.com/gpu"]), prop::sample::select(quantities.to_vec()))
            .prop_map(|(r, q)| Limit(r, q)),
        (
            prop::sample::select(vec!["proxy-cpu", "proxy-memory", "proxy-memory-limit", "proxy-cpus"]),
            prop::sample::select(vec!["100m", "-100m", "1Gi", "32Mi", "2Gi", "0", "lots"])
        )
            .prop_map(|(a, v)| Override(a, v)),
        prop::sample::select(vec!["proxy-data", "Proxy_Data", "data-2"]).prop_map(VolumeName),
        prop::sample::select(vec![0o644i64, 644, 0o777, 0o1000, -1, 0]).prop_map(DefaultMode),
        prop::sample::select(vec![0o400i64, 400, 511, 512]).prop_map(ItemMode),
        prop::sample::select(vec!["proxy-data", "missing", ""]).prop_map(MountName),
        prop::sample::select(vec!["/var/run/proxy", "/var/run/other"]).prop_map(SecondMountPath),
        prop::sample::select(vec!["a/b", "../b", "/abs", "a/../b"]).prop_map(SubPath),
        prop::sample::select(vec![
            &["httpGet"][..],
            &["tcpSocket"],
            &["exec"],
            &[],
            &["httpGet", "tcpSocket"],
            &["exec", "httpGet"]
        ])
        .prop_map(ProbeHandlers),
        prop_oneof![
            prop::sample::select(vec![15000i64, 0, 65536]).prop_map(PortRef::Number),
            prop::sample::select(vec!["admin", "Admin", "a_b"]).prop_map(PortRef::Name),
        ]
        .prop_map(ProbePort),
        prop::sample::select(vec![1i64, 0, 2, -1]).prop_map(LivenessSuccess),
        prop::sample::select(vec![10i64, 0, -5]).prop_map(PeriodSeconds),
        prop::sample::select(vec![&["exec"][..], &["httpGet"], &["exec", "tcpSocket"], &[]]).prop_map(PreStopHandlers),
        prop::sample::select(vec!["Always", "IfNotPresent", "Never", "Sometimes"]).prop_map(PullPolicy),
        prop::sample::select(vec!["File", "FallbackToLogsOnError", "Logs"]).prop_map(TerminationMessagePolicy),
        prop::sample::select(vec![1337i64, 0, -1, 2_147_483_648]).prop_map(RunAsUser),
        prop::sample::select(vec!["NET_ADMIN", "CAP_SYS_ADMIN"]).prop_map(EscalationWithCapability),
        prop::sample::select(vec![
            ("RuntimeDefault", None),
            ("Localhost", None),
            ("Localhost", Some("profiles/proxy.json")),
            ("Localhost", Some("../proxy.json")),
            ("Unconfined", Some("x.json")),
            ("Custom", None)
        ])
        .prop_map(|(t, p)| Seccomp(t, p)),
        prop::sample::select(vec![
            ("sidecar-injector.io/injected", "true"),
            ("Bad Key", "x"),
            ("example.com/tier", "-edge"),
            ("tier", "a-label-value-that-is-far-too-long-for-the-api-server-to-accept-it"),
            ("a/b/c", "x")
        ])
        .prop_map(|(k, v)| Label(k, v)),
        prop::sample::select(vec!["example.com/note", "Example.com/Note", "bad key", "a/b/c"]).prop_map(AnnotationKey),
        prop::sample::select(vec!["127.0.0.1", "::1", "not-an-ip"]).prop_map(HostAliasIp),
        Just(InitContainerProbe),
        (
            prop::sample::select(vec!["cpu", "memory", "example.com/gpu", ""]),
            prop::sample::select(vec!["NotRequired", "RestartContainer", "Restart", ""])
        )
            .prop_map(|(r, p)| ResizePolicy(r, p)),
        (prop::sample::select(vec!["NotRequired", "RestartContainer"]), any::<bool>())
            .prop_map(|(p, native)| InitResize(p, native)),
        Just(NeverRestarts),
        dns(),
        prop::sample::select(vec!["example.com/ready", "ready", "not ready", "a/b/c", "", "-x"])
            .prop_map(ReadinessGate),
        // `kata` exists (the RuntimeClass admission plugin refuses a pod naming one that does not, and answers 500
        // for an empty name before validation sees it).
        prop::sample::select(vec!["kata", "Kata", "kata_v2"]).prop_map(RuntimeClass),
        (
            prop::sample::select(vec![
                "web",
                "web.shop",
                "Web_Shop",
                "-web",
                "a-hostname-override-that-is-longer-than-sixty-four-characters-long",
            ]),
            any::<bool>()
        )
            .prop_map(|(name, fqdn)| HostnameOverride(name, fqdn)),
        toleration(),
        (
            prop::sample::select(vec!["zone", "topology.kubernetes.io/zone", "Bad Key", ""]),
            prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Within"]),
            0usize..3
        )
            .prop_map(|(k, o, n)| NodeAffinity(k, o, n)),
        (
            prop::sample::select(vec!["metadata.name", "metadata.namespace"]),
            prop::sample::select(vec!["In", "NotIn", "Exists"]),
            prop::sample::select(vec![&["node-1"][..], &[], &["node-1", "node-2"], &["Node_1"]])
        )
            .prop_map(|(k, o, v)| NodeField(k, o, v)),
        (
            prop::sample::select(vec![1i64, 100, 0, 101]),
            prop::sample::select(vec!["kubernetes.io/hostname", "", "bad key"]),
            prop::sample::select(vec!["In", "Exists", "Has"]),
            0usize..2,
            prop::sample::select(vec!["", "shop", "Shop"])
        )
            .prop_map(|(w, t, o, n, ns)| PodAntiAffinity(w, t, o, n, ns)),
        prop::sample::select(vec![0i64, 9100, 15000]).prop_map(Worker),
        (prop::sample::select(vec![9100i64, 15000, 15001]), prop::sample::select(vec!["TCP", "UDP"]))
            .prop_map(|(p, t)| AppHostPort(p, t)),
        (prop::sample::select(vec![9100i64, 15000, 70000]), prop::sample::select(vec!["TCP", "UDP"]))
            .prop_map(|(p, t)| SidecarHostPort(p, t)),
        prop::sample::select(vec![0i64, 9100, 9200]).prop_map(DefaultsPort),
        prop::sample::select(vec!["8081", "99999", "0", "-1"]).prop_map(RenderedProbePort),
        prop::sample::select(vec!["128Mi", "1Gi", "-1Mi", "lots"]).prop_map(RenderedRequest),
        prop::sample::select(vec!["proxy:2", " proxy:2", "proxy:2 ", "proxy :2"]).prop_map(RenderedImage),
        prop::sample::select(vec!["edge", "Edge", "a.b", "x".repeat(60).leak()])
            .prop_map(|v: &'static str| RenderedLabel(v)),
    ]
}

fn dns() -> impl Strategy<Value = Change> {
    let seven: &'static [&'static str] = &["a", "b", "c", "d", "e", "f", "g"];
    let configs: Vec<Option<DnsConfig>> = vec![
        None,
        Some((&[], &[], false)),
        Some((&["10.0.0.10"], &[], false)),
        Some((&["10.0.0.10", "::1"], &["svc.cluster.local.", "example.com"], false)),
        Some((&["dns.local"], &[], false)),
        Some((&["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"], &[], false)),
        Some((&["10.0.0.10"], &["Bad_Domain"], false)),
        Some((&["10.0.0.10"], seven, false)),
        Some((&["10.0.0.10"], &[], true)),
    ];
    (prop::sample::select(vec!["None", "ClusterFirst", "Default", "Sometimes"]), prop::sample::select(configs))
        .prop_map(|(policy, config)| Change::Dns(policy, config))
}

fn toleration() -> impl Strategy<Value = Change> {
    (
        prop::sample::select(vec!["dedicated", "", "Bad Key", "example.com/gpu"]),
        prop::sample::select(vec!["Equal", "Exists", "", "Equals", "Gt"]),
        prop::sample::select(vec!["", "proxy", "a b"]),
        prop::sample::select(vec!["", "NoSchedule", "NoExecute", "NoRun"]),
        prop::sample::select(vec![None, Some(30i64)]),
    )
        .prop_map(|(k, o, v, e, t)| Change::Toleration(k, o, v, e, t))
}

/// A template, the pod's override annotations and labels, and the pod's own containers, made from the changes.
#[derive(Debug)]
struct Case {
    template: String,
    annotations: Value,
    labels: Value,
    containers: Value,
    /// The app pod's `restartPolicy`, if it sets one.
    restart_policy: Option<&'static str>,
}

fn case(changes: &[Change]) -> Case {
    let mut proxy = json!({
        "name": "proxy", "image": "proxy:1",
        "ports": [{"name": "admin", "containerPort": 15000, "protocol": "TCP"}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "{{ values.cpu }}", "memory": "{{ values.memory }}"},
                      "limits": {"memory": "{{ values.memoryLimit }}"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 15000}},
        "volumeMounts": [{"name": "proxy-data", "mountPath": "/var/run/proxy"}],
    });
    let mut volume =
        json!({"name": "proxy-data", "configMap": {"name": "proxy", "items": [{"key": "k", "path": "k"}]}});
    let mut pod = json!({"metadata": {"labels": {}, "annotations": {}}, "spec": {"containers": []}});
    let mut annotations = json!({});
    let mut labels = json!({"app": "shop"});
    let mut app = json!({"name": "app", "image": "nginx:1.27"});
    let mut worker = None;
    let mut defaults = None;
    let mut init = None;
    let mut restart_policy = None;
    for change in changes {
        use Change::*;
        match change {
            ContainerName(name) => proxy["name"] = json!(name),
            Image(image) => proxy["image"] = json!(image),
            Port(port) => proxy["ports"][0]["containerPort"] = json!(port),
            PortName(name) => proxy["ports"][0]["name"] = json!(name),
            SecondPortName(name) => {
                proxy["ports"].as_array_mut().unwrap().push(json!({"name": name, "containerPort": 15090}))
            }
            Protocol(protocol) => proxy["ports"][0]["protocol"] = json!(protocol),
            EnvName(name) => proxy["env"][0]["name"] = json!(name),
            FieldPath(path) => proxy["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] = json!(path),
            ValueBesideValueFrom => proxy["env"][0]["value"] = json!("x"),
            Request(resource, quantity) => proxy["resources"]["requests"][*resource] = json!(quantity),
            Limit(resource, quantity) => proxy["resources"]["limits"][*resource] = json!(quantity),
            Override(annotation, value) => annotations[format!("sidecar-injector.io/{annotation}")] = json!(value),
            VolumeName(name) => volume["name"] = json!(name),
            DefaultMode(mode) => volume["configMap"]["defaultMode"] = json!(mode),
            ItemMode(mode) => volume["configMap"]["items"][0]["mode"] = json!(mode),
            MountName(name) => proxy["volumeMounts"][0]["name"] = json!(name),
            SecondMountPath(path) => proxy["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "proxy-data", "mountPath": path, "readOnly": true})),
            SubPath(path) => proxy["volumeMounts"][0]["subPath"] = json!(path),
            ProbeHandlers(handlers) => {
                let mut probe = json!({});
                for handler in *handlers {
                    probe[*handler] = match *handler {
                        "httpGet" => json!({"path": "/ready", "port": 15000}),
                        "tcpSocket" => json!({"port": 15000}),
                        _ => json!({"command": ["ready"]}),
                    };
                }
                proxy["readinessProbe"] = probe;
            }
            ProbePort(port) => {
                let port = match port {
                    self::PortRef::Number(n) => json!(n),
                    self::PortRef::Name(name) => json!(name),
                };
                proxy["livenessProbe"] = json!({"tcpSocket": {"port": port}});
            }
            LivenessSuccess(n) => {
                proxy["livenessProbe"] = json!({"tcpSocket": {"port": 15000}, "successThreshold": n});
            }
            PeriodSeconds(n) => proxy["readinessProbe"]["periodSeconds"] = json!(n),
            PreStopHandlers(handlers) => {
                let mut hook = json!({});
                for handler in *handlers {
                    hook[*handler] = match *handler {
                        "httpGet" => json!({"path": "/quit", "port": 15000}),
                        "tcpSocket" => json!({"port": 15000}),
                        _ => json!({"command": ["quit"]}),
                    };
                }
                proxy["lifecycle"] = json!({"preStop": hook});
            }
            PullPolicy(policy) => proxy["imagePullPolicy"] = json!(policy),
            TerminationMessagePolicy(policy) => proxy["terminationMessagePolicy"] = json!(policy),
            RunAsUser(uid) => proxy["securityContext"]["runAsUser"] = json!(uid),
            EscalationWithCapability(capability) => {
                proxy["securityContext"]["allowPrivilegeEscalation"] = json!(false);
                proxy["securityContext"]["capabilities"] = json!({"add": [capability]});
            }
            Seccomp(kind, profile) => {
                let mut seccomp = json!({"type": kind});
                if let Some(profile) = profile {
                    seccomp["localhostProfile"] = json!(profile);
                }
                pod["spec"]["securityContext"] = json!({"seccompProfile": seccomp});
            }
            Label(key, value) => pod["metadata"]["labels"][*key] = json!(value),
            AnnotationKey(key) => pod["metadata"]["annotations"][*key] = json!("x"),
            HostAliasIp(ip) => pod["spec"]["hostAliases"] = json!([{"ip": ip, "hostnames": ["proxy.local"]}]),
            InitContainerProbe => {
                init = Some(json!({"name": "proxy-init", "image": "init:1",
                                   "readinessProbe": {"exec": {"command": ["ok"]}}}));
            }
            Dns(policy, config) => {
                pod["spec"]["dnsPolicy"] = json!(policy);
                if let Some((nameservers, searches, unnamed_option)) = config {
                    let mut dns = json!({"nameservers": nameservers, "searches": searches});
                    if *unnamed_option {
                        dns["options"] = json!([{"value": "2"}]);
                    }
                    pod["spec"]["dnsConfig"] = dns;
                }
            }
            ReadinessGate(condition) => pod["spec"]["readinessGates"] = json!([{"conditionType": condition}]),
            RuntimeClass(class) => pod["spec"]["runtimeClassName"] = json!(class),
            HostnameOverride(name, fqdn) => {
                pod["spec"]["hostnameOverride"] = json!(name);
                if *fqdn {
                    pod["spec"]["setHostnameAsFQDN"] = json!(true);
                }
            }
            Toleration(key, operator, value, effect, seconds) => {
                let mut toleration = json!({});
                for (field, text) in [("key", key), ("operator", operator), ("value", value), ("effect", effect)] {
                    if !text.is_empty() {
                        toleration[field] = json!(text);
                    }
                }
                if let Some(seconds) = seconds {
                    toleration["tolerationSeconds"] = json!(seconds);
                }
                pod["spec"]["tolerations"] = json!([toleration]);
            }
            NodeAffinity(key, operator, values) => {
                let values: Vec<String> = (0..*values).map(|i| (i + 4).to_string()).collect();
                let expression = json!({"key": key, "operator": operator, "values": values});
                pod["spec"]["affinity"]["nodeAffinity"] = json!({"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}});
            }
            NodeField(key, operator, values) => {
                let expression = json!({"key": key, "operator": operator, "values": values});
                pod["spec"]["affinity"]["nodeAffinity"] = json!({"preferredDuringSchedulingIgnoredDuringExecution":
                    [{"weight": 10, "preference": {"matchFields": [expression]}}]});
            }
            PodAntiAffinity(weight, topology, operator, values, namespace) => {
                let values: Vec<&str> = ["web", "shop"][..*values].to_vec();
                let mut term = json!({"topologyKey": topology, "labelSelector":
                    {"matchExpressions": [{"key": "app", "operator": operator, "values": values}]}});
                if !namespace.is_empty() {
                    term["namespaces"] = json!([namespace]);
                }
                pod["spec"]["affinity"]["podAntiAffinity"] = json!({"preferredDuringSchedulingIgnoredDuringExecution":
                    [{"weight": weight, "podAffinityTerm": term}]});
            }
            Worker(host_port) => {
                let mut port = json!({"containerPort": 8080});
                if *host_port != 0 {
                    port["hostPort"] = json!(host_port);
                }
                worker = Some(json!({"name": "worker", "image": "worker:1", "ports": [port]}));
            }
            AppHostPort(port, protocol) => {
                app["ports"] = json!([{"containerPort": 8080, "hostPort": port, "protocol": protocol}]);
            }
            SidecarHostPort(port, protocol) => {
                proxy["ports"][0]["hostPort"] = json!(port);
                proxy["ports"][0]["protocol"] = json!(protocol);
            }
            DefaultsPort(host_port) => {
                let mut port = json!({"name": "node-metrics", "containerPort": 9101});
                if *host_port != 0 {
                    port["hostPort"] = json!(host_port);
                }
                defaults = Some(json!({"ports": [port]}));
            }
            RenderedProbePort(value) => {
                annotations["example.com/probe-port"] = json!(value);
                proxy["livenessProbe"] = json!({"tcpSocket":
                    {"port": "{{ pod.annotations['example.com/probe-port'] | default(15000) | int }}"}});
            }
            RenderedRequest(value) => {
                annotations["example.com/proxy-memory"] = json!(value);
                proxy["resources"]["requests"]["memory"] =
                    json!("{{ pod.annotations['example.com/proxy-memory'] | default('64Mi') }}");
            }
            RenderedImage(value) => {
                annotations["example.com/proxy-image"] = json!(value);
                proxy["image"] = json!("{{ pod.annotations['example.com/proxy-image'] | default('proxy:1') }}");
            }
            RenderedLabel(value) => {
                labels["tier"] = json!(value);
                pod["metadata"]["labels"]["sidecar-tier"] = json!("{{ pod.labels.tier | default('none') }}-sidecar");
            }
            ResizePolicy(resource, restart) => {
                let policy = json!({"resourceName": resource, "restartPolicy": restart});
                match proxy["resizePolicy"].as_array_mut() {
                    Some(policies) => policies.push(policy),
                    None => proxy["resizePolicy"] = json!([policy]),
                }
            }
            InitResize(restart, native) => {
                let mut container = json!({"name": "proxy-init", "image": "init:1",
                                           "resizePolicy": [{"resourceName": "cpu", "restartPolicy": restart}]});
                if *native {
                    container["restartPolicy"] = json!("Always");
                }
                init = Some(container);
            }
            NeverRestarts => restart_policy = Some("Never"),
        }
    }
    pod["spec"]["containers"] = json!([proxy]);
    let mut containers = vec![app];
    containers.extend(worker);
    pod["spec"]["volumes"] = json!([volume]);
    if let Some(init) = init {
        pod["spec"]["initContainers"] = json!([init]);
    }
    // JSON is YAML: the template's sections are written as JSON, its values with a type kubectl would keep.
    let template = format!(
        "values: {{cpu: \"50m\", memory: \"64Mi\", memoryLimit: \"256Mi\"}}\n\
         overrides:\n  proxy-cpu: {{value: cpu, type: quantity}}\n  proxy-memory: {{value: memory, type: quantity}}\n  \
         proxy-memory-limit: {{value: memoryLimit, type: quantity}}\n\
         pod: {pod}\n"
    );
    let template = match defaults {
        Some(defaults) => format!("{template}containerDefaults: {defaults}\n"),
        None => template,
    };
    Case { template, annotations, labels, containers: json!(containers), restart_policy }
}

/// `spec.containers[1].name` as `spec.containers.name`; map keys (`limits[cpu]`) stay.
fn without_indices(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(open) = rest.find('[') {
        let close = rest[open..].find(']').map_or(rest.len(), |c| open + c + 1);
        let inner = &rest[open + 1..close.saturating_sub(1)];
        out.push_str(&rest[..open]);
        if !inner.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&rest[open..close]);
        }
        rest = &rest[close..];
    }
    out.push_str(rest);
    out
}

/// The pod the generated case is injected into.
fn app_pod(case: &Case, name: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": case.labels, "annotations": case.annotations},
        "spec": {"containers": case.containers},
    });
    if let Some(policy) = case.restart_policy {
        pod["spec"]["restartPolicy"] = json!(policy);
    }
    pod
}

/// Why the API server refused a pod: its message and, for a validation refusal (422), the fields it names.
#[derive(Debug)]
struct Refusal {
    message: String,
    fields: Option<std::collections::BTreeSet<String>>,
}

/// The API server's verdict on a dry-run create: `Ok` stored, `Err` why not.
async fn api_server_verdict(cluster: &Cluster, pod: &Value) -> Result<(), Refusal> {
    let (status, body) = cluster.create(&format!("/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All"), pod.clone()).await;
    let message = body["message"].as_str().unwrap_or_default().to_owned();
    match status {
        201 => Ok(()),
        // A body it cannot decode: no field list. Or refused by an admission plugin before validation (403: the
        // RuntimeClass plugin looks the pod's runtime class up first).
        400 | 403 => Err(Refusal { message, fields: None }),
        422 => {
            let causes = body["details"]["causes"].as_array().cloned().unwrap_or_default();
            // 1.20 copies a seccomp profile into its deprecated annotations and reports it twice: the field is ours.
            let derived = |field: &&str| field.contains("seccomp.security.alpha.kubernetes.io");
            let fields =
                causes.iter().filter_map(|c| c["field"].as_str()).filter(|f| !derived(f)).map(str::to_owned).collect();
            Err(Refusal { message, fields: Some(fields) })
        }
        other => panic!("unexpected answer {other}: {body}"),
    }
}

/// What a run covered: cases refused by both, accepted by both, served by the engine; the fields the generated
/// templates set (their paths without indices); the fields refusals named.
#[derive(Default)]
struct Coverage {
    counts: [usize; 3],
    set: std::collections::BTreeSet<String>,
    refused: std::collections::BTreeSet<String>,
}

/// The paths of every leaf of `value` under `at`, without list indices.
fn leaf_paths(value: &Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::Object(members) => {
            for (key, member) in members {
                leaf_paths(member, &if at.is_empty() { key.clone() } else { format!("{at}.{key}") }, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| leaf_paths(item, at, out)),
        _ => {
            out.insert(at.to_owned());
        }
    }
}

async fn run_case(cluster: &Cluster, changes: &[Change], coverage: &mut Coverage) -> Result<(), TestCaseError> {
    let case = case(changes);
    // Our rules are judged at the API server's release.
    let version = cluster.version;
    let settings = Settings { kubernetes_version: version, ..Settings::default() };
    let pod = app_pod(&case, "rules");
    let Ok(injected) = sidecar_injector_core::template_set::inject_unchecked(&case.template, &pod, &settings) else {
        return Ok(()); // refused before the API rules (a YAML or type problem): nothing to compare
    };
    let ours = validate_pod(&injected, version);
    leaf_paths(&injected, "", &mut coverage.set);
    coverage.refused.extend(ours.iter().map(|e| without_indices(&e.path.to_string())));
    let theirs = api_server_verdict(cluster, &injected).await;
    prop_assert_eq!(
        ours.is_empty(),
        theirs.is_ok(),
        "disagreement on {:?}\ninjected pod: {}\nours: {:#?}\nthe API server: {:?}",
        changes,
        serde_json::to_string_pretty(&injected).unwrap(),
        ours.iter().map(ToString::to_string).collect::<Vec<_>>(),
        theirs
    );
    // Refused by both for validation reasons: for the same fields.
    // Compared without list indices: 1.20 leaves some out (`spec.hostAliases.ip`) where later releases name them.
    if let Err(Refusal { fields: Some(fields), message }) = &theirs {
        let mine: std::collections::BTreeSet<String> =
            ours.iter().map(|e| without_indices(&e.path.to_string())).collect();
        let theirs: std::collections::BTreeSet<String> = fields.iter().map(|f| without_indices(f)).collect();
        let ours: Vec<String> = ours.iter().map(ToString::to_string).collect();
        prop_assert_eq!(
            mine,
            theirs,
            "different fields for {:?}\nours: {:#?}\nthe API server: {}",
            changes,
            ours,
            message
        );
    }
    coverage.counts[usize::from(ours.is_empty())] += 1;

    // The guarantee: a template our checks accept, served by the engine with its overrides vetted, yields a pod
    // the API server stores (when it stores the pod without the sidecar: a pod's own faults are not ours).
    if api_server_verdict(cluster, &pod).await.is_err() {
        return Ok(());
    }
    if let Ok(template) = TemplateSet::from_source("generated", "generated.yaml", &case.template, &settings) {
        coverage.counts[2] += 1;
        let engine = Engine::new(template, &settings);
        let (outcome, _, patch) = crate::common::answer(&engine, &crate::common::review(&pod));
        if let (Verdict::Injected { .. }, Some(patch)) = (outcome.verdict, patch) {
            let served = crate::common::apply(&pod, &patch);
            let stored = api_server_verdict(cluster, &served).await;
            prop_assert!(
                stored.is_ok(),
                "the engine answered with a pod the API server refuses: {:?}\n{}\nwarnings: {:?}",
                stored,
                serde_json::to_string_pretty(&served).unwrap(),
                outcome.warnings
            );
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a kube-apiserver: tests/e2e/apiserver.sh"]
fn the_validator_agrees_with_the_api_server() {
    let cluster = Cluster::start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
        cluster.must_create("/api/v1/namespaces", namespace).await;
        let kata = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"},
                          "handler": "kata"});
        cluster.must_create("/apis/node.k8s.io/v1/runtimeclasses", kata).await;
    });
    let mut runner = super::case_runner(CASES);
    let coverage = std::cell::RefCell::new(Coverage::default());
    let strategy = prop::collection::vec(change(), 0..4);
    let result =
        runner.run(&strategy, |changes| runtime.block_on(run_case(&cluster, &changes, &mut coverage.borrow_mut())));
    let coverage = coverage.into_inner();
    let [refused, accepted, served] = coverage.counts;
    eprintln!(
        "{} cases compared: {accepted} accepted and {refused} refused by both; {served} served by the engine; {} \
         fields set, {} fields named in refusals",
        refused + accepted,
        coverage.set.len(),
        coverage.refused.len()
    );
    result.unwrap();
    assert!(refused + accepted >= 500, "at least 500 cases compared");
    assert!(refused >= 100 && accepted >= 100, "both verdicts are exercised: {refused} refused, {accepted} accepted");
}
