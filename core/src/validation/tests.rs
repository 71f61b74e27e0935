//! One case per rule: a valid and an invalid pod, and the API server's message for the invalid one.

use serde_json::{Value as J, json};

use super::{KubeVersion, validate_pod};

/// A valid pod with `container` merged into its first container, `spec` into its spec and `metadata` into its
/// metadata (JSON merge: a null removes).
fn pod(container: J, spec: J, metadata: J) -> J {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"team": "shop"}},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.27",
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                 "volumes": [{"name": "data", "emptyDir": {}}]},
    });
    json_patch::merge(&mut pod["spec"]["containers"][0], &container);
    json_patch::merge(&mut pod["spec"], &spec);
    json_patch::merge(&mut pod["metadata"], &metadata);
    pod
}

fn errors_at(pod: &J, version: u32) -> Vec<String> {
    validate_pod(pod, KubeVersion::new(version)).iter().map(ToString::to_string).collect()
}

fn errors(pod: &J) -> Vec<String> {
    errors_at(pod, 29)
}

/// `good` is accepted; `bad` is refused with exactly `message` among its errors.
#[track_caller]
fn rule(good: J, bad: J, message: &str) {
    assert_eq!(errors(&good), Vec::<String>::new(), "the valid case");
    let found = errors(&bad);
    assert!(found.iter().any(|e| e == message), "expected {message:?} in {found:#?}");
}

fn c(container: J) -> J {
    pod(container, json!({}), json!({}))
}

fn s(spec: J) -> J {
    pod(json!({}), spec, json!({}))
}

fn m(metadata: J) -> J {
    pod(json!({}), json!({}), metadata)
}

#[test]
fn the_base_pod_is_valid_at_every_version() {
    for version in [20, 24, 28, 29, 30, 33, 34] {
        assert_eq!(errors_at(&pod(json!({}), json!({}), json!({})), version), Vec::<String>::new());
    }
}

#[test]
fn container_names_are_dns_labels_unique_across_lists() {
    rule(
        c(json!({"name": "proxy-sidecar"})),
        c(json!({"name": "Proxy_Sidecar"})),
        "spec.containers[0].name: Invalid value: \"Proxy_Sidecar\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
    );
    rule(
        s(json!({"initContainers": [{"name": "init", "image": "x"}]})),
        s(json!({"initContainers": [{"name": "app", "image": "x"}]})),
        "spec.initContainers[0].name: Duplicate value: \"app\"",
    );
    let twice = json!({"containers": [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]});
    rule(s(json!({})), s(twice), "spec.containers[1].name: Duplicate value: \"a\"");
    rule(c(json!({"image": "x"})), c(json!({"image": ""})), "spec.containers[0].image: Required value");
}

#[test]
fn volume_names_and_sources() {
    rule(
        s(json!({"volumes": [{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}]})),
        s(json!({"volumes": [{"name": "data", "emptyDir": {}}, {"name": "data", "configMap": {"name": "c"}}]})),
        "spec.volumes[1].name: Duplicate value: \"data\"",
    );
    rule(
        s(json!({"volumes": [{"name": "data"}]})),
        s(json!({"volumes": [{"name": "data", "emptyDir": {}, "configMap": {"name": "c"}}]})),
        "spec.volumes[0].configMap: Forbidden: may not specify more than 1 volume type",
    );
    rule(
        s(json!({"volumes": [{"name": "data", "secret": {"secretName": "s", "defaultMode": 420}}]})),
        s(json!({"volumes": [{"name": "data", "secret": {"secretName": "s", "defaultMode": 644}}]})),
        "spec.volumes[0].secret.defaultMode: Invalid value: 644: must be a number between 0 and 0777 (octal), both inclusive",
    );
    rule(
        s(
            json!({"volumes": [{"name": "data", "configMap": {"name": "c", "items": [{"key": "k", "path": "p", "mode": 256}]}}]}),
        ),
        s(
            json!({"volumes": [{"name": "data", "configMap": {"name": "c", "items": [{"key": "k", "path": "p", "mode": 1000}]}}]}),
        ),
        "spec.volumes[0].configMap.items[0].mode: Invalid value: 1000: must be a number between 0 and 0777 (octal), both inclusive",
    );
    rule(
        s(json!({"volumes": [{"name": "data", "hostPath": {"path": "/var/run", "type": "Directory"}}]})),
        s(json!({"volumes": [{"name": "data", "hostPath": {"path": "/var/run", "type": "Folder"}}]})),
        "spec.volumes[0].hostPath.type: Unsupported value: \"Folder\": supported values: \"\", \"BlockDevice\", \"CharDevice\", \"Directory\", \"DirectoryOrCreate\", \"File\", \"FileOrCreate\", \"Socket\"",
    );
}

#[test]
fn mounts_name_a_valid_volume_at_a_unique_path() {
    rule(
        c(json!({"volumeMounts": [{"name": "data", "mountPath": "/data"}]})),
        c(json!({"volumeMounts": [{"name": "cache", "mountPath": "/cache"}]})),
        "spec.containers[0].volumeMounts[0].name: Not found: \"cache\"",
    );
    rule(
        c(json!({"volumeMounts": [{"name": "data", "mountPath": "/a"}, {"name": "data", "mountPath": "/b"}]})),
        c(json!({"volumeMounts": [{"name": "data", "mountPath": "/a"}, {"name": "data", "mountPath": "/a"}]})),
        "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/a\": must be unique",
    );
    rule(
        c(json!({"volumeMounts": [{"name": "data", "mountPath": "/a", "subPath": "x/y"}]})),
        c(json!({"volumeMounts": [{"name": "data", "mountPath": "/a", "subPath": "../y"}]})),
        "spec.containers[0].volumeMounts.subPath: Invalid value: \"../y\": must not contain '..'",
    );
}

#[test]
fn ports_are_in_range_and_their_names_unique() {
    rule(
        c(json!({"ports": [{"containerPort": 15000, "name": "admin"}]})),
        c(json!({"ports": [{"containerPort": 99999}]})),
        "spec.containers[0].ports[0].containerPort: Invalid value: 99999: must be between 1 and 65535, inclusive",
    );
    rule(
        c(json!({"ports": [{"containerPort": 1, "name": "a"}, {"containerPort": 2, "name": "b"}]})),
        c(json!({"ports": [{"containerPort": 1, "name": "a"}, {"containerPort": 2, "name": "a"}]})),
        "spec.containers[0].ports[1].name: Duplicate value: \"a\"",
    );
    rule(
        c(json!({"ports": [{"containerPort": 1, "name": "metrics"}]})),
        c(json!({"ports": [{"containerPort": 1, "name": "metrics_port"}]})),
        "spec.containers[0].ports[0].name: Invalid value: \"metrics_port\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
    );
    rule(
        c(json!({"ports": [{"containerPort": 1, "protocol": "UDP"}]})),
        c(json!({"ports": [{"containerPort": 1, "protocol": "HTTP"}]})),
        "spec.containers[0].ports[0].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
    );
    // A duplicate containerPort is accepted (the API server only warns, from 1.29).
    assert!(errors(&c(json!({"ports": [{"containerPort": 1}, {"containerPort": 1}]}))).is_empty());
}

#[test]
fn env_var_names_and_sources() {
    rule(
        c(json!({"env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]})),
        c(json!({"env": [{"name": "POD IP", "value": "x"}]})),
        "spec.containers[0].env[0].name: Invalid value: \"POD IP\": a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')",
    );
    // From 1.32, any printable ASCII character but `=`.
    assert!(errors_at(&c(json!({"env": [{"name": "POD IP", "value": "x"}]})), 32).is_empty());
    rule(
        c(json!({"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}]})),
        c(json!({"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}]})),
        "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Unsupported value: \"status.phase\": supported values: \"metadata.name\", \"metadata.namespace\", \"metadata.uid\", \"spec.nodeName\", \"spec.serviceAccountName\", \"status.hostIP\", \"status.hostIPs\", \"status.podIP\", \"status.podIPs\"",
    );
    rule(
        c(json!({"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]})),
        c(json!({"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.nam"}}}]})),
        "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Invalid value: \"metadata.nam\": error converting fieldPath: field label not supported: metadata.nam",
    );
    rule(
        c(json!({"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})),
        c(json!({"env": [{"name": "A", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})),
        "spec.containers[0].env[0].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty",
    );
    rule(
        c(json!({"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}}]})),
        c(json!({"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}]})),
        "spec.containers[0].env[0].valueFrom.resourceFieldRef.resource: Unsupported value: \"limits.gpu\": supported values: \"limits.cpu\", \"limits.ephemeral-storage\", \"limits.memory\", \"requests.cpu\", \"requests.ephemeral-storage\", \"requests.memory\"",
    );
}

#[test]
fn quantities_are_non_negative_and_requests_within_limits() {
    rule(
        c(json!({"resources": {"requests": {"cpu": "100m"}}})),
        c(json!({"resources": {"requests": {"cpu": "-100m"}}})),
        "spec.containers[0].resources.requests[cpu]: Invalid value: \"-100m\": must be greater than or equal to 0",
    );
    rule(
        c(json!({"resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "256Mi"}}})),
        c(json!({"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "256Mi"}}})),
        "spec.containers[0].resources.requests: Invalid value: \"1Gi\": must be less than or equal to memory limit",
    );
    rule(
        c(json!({"resources": {"limits": {"cpu": 1}}})),
        c(json!({"resources": {"limits": {"cpu": "1 core"}}})),
        "spec.containers[0].resources.limits[cpu]: Invalid value: \"1 core\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
    );
    rule(
        c(json!({"resources": {"limits": {"example.com/gpu": 1}}})),
        c(json!({"resources": {"requests": {"example.com/gpu": 1}}})),
        "spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources",
    );
    rule(
        c(json!({"resources": {"limits": {"memory": "1Gi"}}})),
        c(json!({"resources": {"limits": {"gpu": "1"}}})),
        "spec.containers[0].resources.limits[gpu]: Invalid value: \"gpu\": must be a standard resource for containers",
    );
}

#[test]
fn probes_and_hooks_have_exactly_one_handler() {
    rule(
        c(json!({"readinessProbe": {"httpGet": {"port": 8080}}})),
        c(json!({"readinessProbe": {"httpGet": {"port": 8080}, "tcpSocket": {"port": 8080}}})),
        "spec.containers[0].readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type",
    );
    rule(
        c(json!({"livenessProbe": {"exec": {"command": ["true"]}}})),
        c(json!({"livenessProbe": {"periodSeconds": 5}})),
        "spec.containers[0].livenessProbe: Required value: must specify a handler type",
    );
    rule(
        c(json!({"livenessProbe": {"tcpSocket": {"port": "admin"}, "successThreshold": 1}})),
        c(json!({"livenessProbe": {"tcpSocket": {"port": "admin"}, "successThreshold": 2}})),
        "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
    );
    rule(
        c(json!({"lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}})),
        c(json!({"lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}, "httpGet": {"port": 80}}}})),
        "spec.containers[0].lifecycle.preStop.httpGet: Forbidden: may not specify more than 1 handler type",
    );
    rule(
        c(json!({"readinessProbe": {"httpGet": {"port": 8080}}})),
        c(json!({"readinessProbe": {"httpGet": {"port": 0}}})),
        "spec.containers[0].readinessProbe.httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive",
    );
}

#[test]
fn enums() {
    rule(
        c(json!({"imagePullPolicy": "IfNotPresent"})),
        c(json!({"imagePullPolicy": "Sometimes"})),
        "spec.containers[0].imagePullPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"IfNotPresent\", \"Never\"",
    );
    rule(
        s(json!({"restartPolicy": "OnFailure"})),
        s(json!({"restartPolicy": "Sometimes"})),
        "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
    );
    rule(
        c(json!({"terminationMessagePolicy": "FallbackToLogsOnError"})),
        c(json!({"terminationMessagePolicy": "Logs"})),
        "spec.containers[0].terminationMessagePolicy: Invalid value: \"Logs\": must be 'File' or 'FallbackToLogsOnError'",
    );
}

#[test]
fn labels_and_annotations() {
    rule(
        m(json!({"labels": {"app.kubernetes.io/name": "web"}})),
        m(json!({"labels": {"app": "a-value-longer-than-sixty-three-characters-is-refused-by-the-api-server"}})),
        "metadata.labels: Invalid value: \"a-value-longer-than-sixty-three-characters-is-refused-by-the-api-server\": must be no more than 63 characters",
    );
    rule(
        m(json!({"labels": {"example.com/tier": "web"}})),
        m(json!({"labels": {"example.com/tier/x": "web"}})),
        "metadata.labels: Invalid value: \"example.com/tier/x\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
    );
    let big = "x".repeat(256 * 1024);
    rule(
        m(json!({"annotations": {"Example.com/Note": "fine"}})),
        m(json!({"annotations": {"note": big}})),
        "metadata.annotations: Too long: must have at most 262144 bytes",
    );
}

#[test]
fn security_contexts() {
    rule(
        c(json!({"securityContext": {"runAsUser": 1337}})),
        c(json!({"securityContext": {"runAsUser": -1}})),
        "spec.containers[0].securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive",
    );
    rule(
        c(json!({"securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"add": ["NET_ADMIN"]}}})),
        c(json!({"securityContext": {"allowPrivilegeEscalation": false, "privileged": true}})),
        "spec.containers[0].securityContext: Invalid value: \"securityContext\": cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
    );
    rule(
        s(json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}})),
        s(json!({"securityContext": {"seccompProfile": {"type": "Localhost"}}})),
        "spec.securityContext.seccompProfile.localhostProfile: Required value: must be set when seccomp type is Localhost",
    );
    rule(
        s(json!({"securityContext": {"fsGroup": 2000}})),
        s(json!({"securityContext": {"fsGroup": -5}})),
        "spec.securityContext.fsGroup: Invalid value: -5: must be between 0 and 2147483647, inclusive",
    );
}

#[test]
fn native_sidecars_need_1_29() {
    let sidecar = s(json!({"initContainers": [{"name": "agent", "image": "x", "restartPolicy": "Always",
                                               "readinessProbe": {"exec": {"command": ["ok"]}}}]}));
    assert_eq!(errors_at(&sidecar, 29), Vec::<String>::new());
    let old = errors_at(&sidecar, 28);
    assert!(old.iter().any(|e| e.starts_with("spec.initContainers[0].restartPolicy: Forbidden: a container's restartPolicy (a native sidecar) needs Kubernetes 1.29")), "{old:#?}");
    assert!(old.iter().any(|e| e == "spec.initContainers[0].readinessProbe: Invalid value: \"readinessProbe\": must not be set for init containers"), "{old:#?}");
    rule(
        sidecar.clone(),
        s(json!({"initContainers": [{"name": "agent", "image": "x", "restartPolicy": "OnFailure"}]})),
        "spec.initContainers[0].restartPolicy: Unsupported value: \"OnFailure\": supported values: \"Always\"",
    );
    rule(
        sidecar,
        c(json!({"restartPolicy": "Always"})),
        "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers",
    );
}

#[test]
fn handlers_of_newer_releases_are_refused_below_them() {
    let sleep = c(json!({"lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}));
    assert_eq!(errors_at(&sleep, 30), Vec::<String>::new());
    assert!(errors_at(&sleep, 29).iter().any(|e| e.contains("the sleep handler needs Kubernetes 1.30")));
    let zero = c(json!({"lifecycle": {"preStop": {"sleep": {"seconds": 0}}}}));
    assert!(!errors_at(&zero, 32).is_empty() && errors_at(&zero, 33).is_empty());
    let grpc = c(json!({"livenessProbe": {"grpc": {"port": 9090}}}));
    assert!(errors_at(&grpc, 24).is_empty() && !errors_at(&grpc, 23).is_empty());
}

#[test]
fn values_the_api_types_cannot_hold_are_refused_as_decoding_errors() {
    let found = errors(&c(json!({"ports": [{"containerPort": 4_294_967_296u64}]})));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("spec.containers[0].ports[0].containerPort: Invalid value: 4294967296"), "{found:?}");
    assert!(!errors(&c(json!({"ports": [{"containerPort": "http"}]}))).is_empty());
}

#[test]
fn pod_level_resources_hold_the_containers_requests_and_limits_from_1_34() {
    let requests = |cpu: &str| json!({"resources": {"requests": {"cpu": cpu}}});
    // A regular init container of 300m runs alone; the native sidecar (100m) runs beside the app (200m) and
    // before the plain init container: the aggregate is max(100m + 200m, 100m + 300m) = 400m.
    let spec = |pod_cpu: &str| {
        let sidecar = json!({"name": "proxy", "image": "p", "restartPolicy": "Always",
                             "resources": {"limits": {"cpu": "100m"}}});
        let init = json!({"name": "setup", "image": "s", "resources": {"requests": {"cpu": "300m"}}});
        json!({"initContainers": [sidecar, init], "resources": {"requests": {"cpu": pod_cpu}}})
    };
    let at = |pod_cpu: &str, version: u32| errors_at(&pod(requests("200m"), spec(pod_cpu), json!({})), version);
    assert_eq!(at("400m", 34), Vec::<String>::new());
    assert_eq!(
        at("399m", 34),
        [
            r#"spec.resources.requests[cpu]: Invalid value: "399m": must be greater than or equal to aggregate container requests of 400m"#
        ]
    );
    assert_eq!(at("399m", 33), Vec::<String>::new(), "not judged before 1.34");
    // A container may not limit more than the pod.
    let limited = pod(
        json!({"resources": {"limits": {"memory": "1Gi"}}}),
        json!({"resources": {"limits": {"memory": "512Mi"}}}),
        json!({}),
    );
    assert_eq!(
        errors_at(&limited, 34),
        [
            r#"spec.containers[0].resources.limits[memory]: Invalid value: "1Gi": must be less than or equal to pod limits of 536870912"#
        ]
    );
}

/// Found on the real 1.37 API server (tests/cluster.rs): from 1.37 the pod's requests are defaulted after the
/// webhooks, from every container's, so a sidecar whose requests the pod-level limits cannot hold beside the app's
/// is refused ("spec.resources.requests: Invalid value: \"80Mi\": must be less than or equal to memory limit of
/// 70Mi"), while before 1.37 the webhook saw requests defaulted from the app alone, judged by the rule above.
#[test]
fn pod_requests_defaulted_after_admission_stay_within_the_pod_limits_from_1_37() {
    let app = json!({"name": "app", "image": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}});
    let sidecar = json!({"name": "sidecar", "image": "s", "resources": {"requests": {"memory": "16Mi"}}});
    let spec = |memory: &str, requests: J| {
        json!({"containers": [app, sidecar], "volumes": [],
               "resources": {"limits": {"cpu": "1", "memory": memory}, "requests": requests}})
    };
    let no_change = json!({});
    let tight = pod(no_change.clone(), spec("70Mi", json!({})), json!({}));
    assert_eq!(
        errors_at(&tight, 37),
        [
            r#"spec.resources.requests: Invalid value: "83886080": must be less than or equal to memory limit of 73400320"#
        ]
    );
    assert_eq!(errors_at(&tight, 36), Vec::<String>::new(), "defaulted before the webhooks until 1.37");
    assert_eq!(errors_at(&pod(no_change.clone(), spec("80Mi", json!({})), json!({})), 37), Vec::<String>::new());
    // A request the pod sets is not defaulted: judged against the aggregate by the rule above.
    let explicit = pod(no_change, spec("70Mi", json!({"memory": "70Mi"})), json!({}));
    assert_eq!(
        errors_at(&explicit, 37),
        [
            r#"spec.resources.requests[memory]: Invalid value: "70Mi": must be greater than or equal to aggregate container requests of 83886080"#
        ]
    );
}

/// `hostnameOverride` (on by default from 1.35), as 1.37's `validatePodHostName` judges it.
#[test]
fn a_hostname_override_is_a_short_subdomain_beside_neither_fqdn_nor_host_network() {
    let spec = |extra: J| pod(json!({}), extra, json!({}));
    assert_eq!(errors_at(&spec(json!({"hostnameOverride": "web.shop"})), 37), Vec::<String>::new());
    let bad = errors_at(&spec(json!({"hostnameOverride": "Web_Shop"})), 37);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].starts_with(r#"spec.hostnameOverride: Invalid value: "Web_Shop": a lowercase RFC 1123 subdomain"#),
        "{bad:?}"
    );
    let long = format!("{}.b", "a".repeat(63));
    assert!(errors_at(&spec(json!({"hostnameOverride": long})), 37).iter().any(|e| e.contains("Too long")));
    let both = spec(json!({"hostnameOverride": "web", "setHostnameAsFQDN": true, "hostNetwork": true}));
    let errors = errors_at(&both, 37);
    assert!(
        errors.contains(
            &"spec.hostnameOverride: Forbidden: may not be specified when setHostnameAsFQDN is true".to_owned()
        ),
        "{errors:?}"
    );
    assert!(
        errors.contains(&"spec.hostnameOverride: Forbidden: may not be specified when hostNetwork is true".to_owned()),
        "{errors:?}"
    );
}

// Issue 35: fields the validator did not judge.

#[test]
fn images_have_no_leading_or_trailing_whitespace() {
    rule(
        c(json!({"image": "nginx:1.27"})),
        c(json!({"image": "nginx:1.27 "})),
        r#"spec.containers[0].image: Invalid value: "nginx:1.27 ": must not have leading or trailing whitespace"#,
    );
    let init = s(json!({"initContainers": [{"name": "init", "image": "\tbusybox"}]}));
    assert!(errors(&init).iter().any(|e| e.starts_with("spec.initContainers[0].image: Invalid value")));
}

#[test]
fn dns_policy_none_needs_a_dns_config_with_a_nameserver() {
    let good = s(json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["10.0.0.10"], "searches": ["svc.local."]}}));
    rule(
        good.clone(),
        s(json!({"dnsPolicy": "None"})),
        "spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None",
    );
    rule(
        good.clone(),
        s(json!({"dnsPolicy": "None", "dnsConfig": {"searches": ["a"]}})),
        "spec.dnsConfig.nameservers: Required value: must provide at least one DNS nameserver when `dnsPolicy` is None",
    );
    rule(
        good.clone(),
        s(json!({"dnsConfig": {"nameservers": ["dns"]}})),
        r#"spec.dnsConfig.nameservers[0]: Invalid value: "dns": must be valid IP address"#,
    );
    rule(
        good,
        s(json!({"dnsConfig": {"options": [{"value": "2"}]}})),
        "spec.dnsConfig.options[0]: Required value: Option.Name must not be empty",
    );
    // Seven search paths: too many before 1.26 (ExpandedDNSConfig), fine after.
    let seven = s(json!({"dnsConfig": {"searches": ["a", "b", "c", "d", "e", "f", "g"]}}));
    assert!(errors_at(&seven, 25).iter().any(|e| e.contains("must not have more than 6 search paths")));
    assert_eq!(errors_at(&seven, 26), Vec::<String>::new());
    let underscore = s(json!({"dnsConfig": {"searches": ["_srv.example.com"]}}));
    assert_eq!(errors_at(&underscore, 32).len(), 1);
    assert_eq!(errors_at(&underscore, 33), Vec::<String>::new());
}

#[test]
fn readiness_gates_runtime_classes_tolerations_and_affinity() {
    rule(
        s(json!({"readinessGates": [{"conditionType": "example.com/ready"}]})),
        s(json!({"readinessGates": [{"conditionType": "not ready"}]})),
        "spec.readinessGates[0].conditionType: Invalid value: \"not ready\": name part must consist of alphanumeric \
         characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or \
         'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
    );
    let bad_class = errors(&s(json!({"runtimeClassName": "Kata"})));
    assert!(bad_class[0].starts_with("spec.runtimeClassName: Invalid value: \"Kata\": a lowercase RFC 1123 subdomain"));
    assert_eq!(errors(&s(json!({"runtimeClassName": "kata.v2"}))), Vec::<String>::new());
    let good = s(json!({"tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "proxy", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    ]}));
    for (bad, message) in [
        (
            json!({"key": "a", "operator": "Gt"}),
            r#"spec.tolerations[0].operator: Unsupported value: "Gt": supported values: "Equal", "Exists""#,
        ),
        (
            json!({"operator": "Equal"}),
            "spec.tolerations[0].operator: Invalid value: \"Equal\": operator must be Exists when `key` is empty, \
             which means \"match all values and all keys\"",
        ),
        (
            json!({"key": "a", "operator": "Exists", "tolerationSeconds": 5}),
            "spec.tolerations[0].effect: Invalid value: \"\": effect must be 'NoExecute' when `tolerationSeconds` is set",
        ),
        (
            json!({"key": "a", "effect": "NoRun"}),
            r#"spec.tolerations[0].effect: Unsupported value: "NoRun": supported values: "NoExecute", "NoSchedule", "PreferNoSchedule""#,
        ),
    ] {
        rule(good.clone(), s(json!({"tolerations": [bad]})), message);
    }
    let term = |expression: J| {
        s(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}}))
    };
    let at = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].\
              matchExpressions[0]";
    rule(
        term(json!({"key": "zone", "operator": "In", "values": ["a"]})),
        term(json!({"key": "zone", "operator": "Near", "values": ["a"]})),
        &format!(r#"{at}.operator: Invalid value: "Near": not a valid selector operator"#),
    );
    rule(
        term(json!({"key": "cores", "operator": "Gt", "values": ["4"]})),
        term(json!({"key": "cores", "operator": "Gt", "values": ["4", "8"]})),
        &format!("{at}.values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'"),
    );
    let pods =
        |term: J| s(json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}));
    rule(
        pods(
            json!({"topologyKey": "zone", "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}),
        ),
        pods(
            json!({"topologyKey": "zone", "labelSelector": {"matchExpressions": [{"key": "app", "operator": "Has"}]}}),
        ),
        "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].\
         operator: Invalid value: \"Has\": not a valid selector operator",
    );
    rule(
        pods(json!({"topologyKey": "zone"})),
        pods(json!({})),
        "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: Required value: can \
         not be empty",
    );
}

#[test]
fn ephemeral_containers_node_names_and_the_os() {
    rule(
        s(json!({})),
        s(json!({"ephemeralContainers": [{"name": "debug", "image": "busybox"}]})),
        "spec.ephemeralContainers: Forbidden: cannot be set on create",
    );
    rule(
        s(json!({"os": {"name": "linux"}})),
        s(json!({"os": {"name": "plan9"}})),
        r#"spec.os.name: Unsupported value: "plan9": supported values: "linux", "windows""#,
    );
    assert_eq!(errors(&s(json!({"nodeName": "node-1.example.com"}))), Vec::<String>::new());
}

#[test]
fn resize_policies_name_each_resource_once_and_restart_only_what_may_restart() {
    let found = |pod: &J| errors_at(pod, 37);
    let policies = |list: J| c(json!({"resizePolicy": list}));
    let good = policies(json!([
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "RestartContainer"}
    ]));
    assert_eq!(found(&good), Vec::<String>::new());
    let at = "spec.containers[0].resizePolicy";
    let bad = policies(json!([
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "cpu", "restartPolicy": "Restart"},
        {"resourceName": "example.com/gpu", "restartPolicy": ""}
    ]));
    assert_eq!(
        found(&bad),
        [
            format!("{at}[1]: Duplicate value: \"cpu\""),
            format!("{at}: Unsupported value: \"Restart\": supported values: \"NotRequired\", \"RestartContainer\""),
            format!("{at}: Unsupported value: \"example.com/gpu\": supported values: \"cpu\", \"memory\""),
            format!("{at}: Required value"),
        ]
    );
    // A pod that never restarts: only `NotRequired`.
    let mut never = good.clone();
    never["spec"]["restartPolicy"] = json!("Never");
    assert_eq!(
        found(&never),
        [format!(
            "{at}: Invalid value: \"RestartContainer\": must be 'NotRequired' when pod `restartPolicy` is 'Never'"
        )]
    );
    // An init container that runs to completion is never restarted; a native sidecar may be.
    let init = |native: bool| {
        let mut container = json!({"name": "setup", "image": "setup:1",
            "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]});
        if native {
            container["restartPolicy"] = json!("Always");
        }
        s(json!({"initContainers": [container]}))
    };
    assert_eq!(found(&init(true)), Vec::<String>::new());
    assert_eq!(
        found(&init(false)),
        [
            "spec.initContainers[0].resizePolicy[0].restartPolicy: Invalid value: \"RestartContainer\": must not be set to \
          'RestartContainer' for non-sidecar initContainers"
        ]
    );
    // Before 1.33 the API server drops the field unjudged.
    assert_eq!(errors_at(&bad, 32), Vec::<String>::new());
}
