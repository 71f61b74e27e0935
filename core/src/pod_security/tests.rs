//! Each check: a pod that passes, a pod that breaks it (level, check, fields), and the boundary cases of the
//! upstream check and its fixtures (`k8s.io/pod-security-admission/test/fixtures_*.go`).

use serde_json::{Value as J, json};

use super::*;

/// A container that meets restricted.
fn hardened(name: &str) -> J {
    json!({
        "name": name,
        "image": "nginx",
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    })
}

/// A restricted pod: one hardened container, `app`.
fn restricted_pod() -> J {
    json!({"metadata": {"name": "web"}, "spec": {"containers": [hardened("app")]}})
}

/// A restricted pod after `edits`: (JSON pointer, value) pairs, set in order.
fn restricted_pod_with(edits: &[(&str, J)]) -> J {
    let mut pod = restricted_pod();
    for (pointer, value) in edits {
        set(&mut pod, pointer, value.clone());
    }
    pod
}

/// Sets the field at `pointer` (object keys and list indices, the length to append), creating the objects on the
/// way.
fn set(doc: &mut J, pointer: &str, value: J) {
    let mut at = doc;
    for key in pointer.split('/').skip(1) {
        at = match at {
            J::Array(items) => {
                let index = key.parse::<usize>().expect("a list index");
                if index == items.len() {
                    items.push(J::Null);
                }
                &mut items[index]
            }
            other => {
                if !other.is_object() {
                    *other = json!({});
                }
                other.as_object_mut().expect("just made an object").entry(key).or_insert(J::Null)
            }
        };
    }
    *at = value;
}

/// The IDs of the checks the report fails.
fn checks(report: &Report) -> Vec<&'static str> {
    report.violations.iter().map(|v| v.check).collect()
}

/// The report's only violation, which must be of `check` at `level`, naming `fields`.
#[track_caller]
fn only(report: &Report, level: Level, check: &str, fields: &[&str]) -> Violation {
    assert_eq!(checks(report), [check], "{report:#?}");
    let violation = report.violations[0].clone();
    assert_eq!(violation.level, level, "{violation:#?}");
    assert_eq!(violation.fields, fields, "{violation:#?}");
    violation
}

// === Levels and reports ===

#[test]
fn levels_parse_print_and_order() {
    for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
        assert_eq!(level.as_str().parse::<Level>(), Ok(level));
        assert_eq!(level.to_string(), level.as_str());
    }
    for bad in ["", "Baseline", "latest", "restricted "] {
        assert!(bad.parse::<Level>().is_err(), "{bad}");
    }
    assert!(Level::Privileged < Level::Baseline && Level::Baseline < Level::Restricted);
}

#[test]
fn the_hardened_app_pod_is_restricted() {
    let report = evaluate(&restricted_pod());
    assert_eq!(report.violations, []);
    assert_eq!(report.level(), Level::Restricted);
    assert_eq!(report.breaking(Level::Restricted).count(), 0);
}

#[test]
fn a_proxy_init_adding_net_admin_makes_the_pod_privileged() {
    let mut pod = restricted_pod();
    set(
        &mut pod,
        "/spec/initContainers",
        json!([{
            "name": "proxy-init",
            "image": "proxy-init",
            "securityContext": {
                "runAsUser": 0,
                "runAsNonRoot": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
            },
        }]),
    );
    let report = evaluate(&pod);
    assert_eq!(report.level(), Level::Privileged);
    let baseline: Vec<_> = report.breaking(Level::Baseline).collect();
    assert_eq!(baseline.len(), 1, "{baseline:#?}");
    assert_eq!(baseline[0].check, "capabilities_baseline");
    assert_eq!(baseline[0].level, Level::Baseline);
    assert_eq!(baseline[0].fields, ["spec.initContainers[proxy-init].securityContext.capabilities.add"]);
    assert!(baseline[0].detail.starts_with("adds NET_ADMIN, NET_RAW (baseline allows only AUDIT_WRITE, CHOWN"));
    // At restricted, capabilities_restricted reports the capabilities instead of capabilities_baseline.
    let restricted: Vec<_> = report.breaking(Level::Restricted).map(|v| v.check).collect();
    assert_eq!(
        restricted,
        [
            "allowPrivilegeEscalation",
            "capabilities_restricted",
            "runAsNonRoot",
            "runAsUser",
            "seccompProfile_restricted"
        ]
    );
}

#[test]
fn a_pod_without_security_settings_is_baseline_not_restricted() {
    let pod = json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "app", "image": "nginx"}]}});
    let report = evaluate(&pod);
    assert_eq!(report.level(), Level::Baseline);
    assert_eq!(report.breaking(Level::Baseline).count(), 0);
    assert_eq!(
        report.breaking(Level::Restricted).map(|v| v.check).collect::<Vec<_>>(),
        ["allowPrivilegeEscalation", "capabilities_restricted", "runAsNonRoot", "seccompProfile_restricted"]
    );
    assert!(report.violations.iter().all(|v| v.level == Level::Restricted));
    let capabilities = &report.violations[1];
    assert_eq!(capabilities.fields, ["spec.containers[app].securityContext.capabilities.drop"]);
    assert!(report.breaking(Level::Privileged).next().is_none());
}

#[test]
fn an_empty_or_malformed_pod_does_not_panic() {
    for pod in
        [json!(null), json!("pod"), json!([]), json!({}), json!({"spec": []}), json!({"spec": {"containers": 3}})]
    {
        assert_eq!(evaluate(&pod).level(), Level::Restricted, "{pod}");
    }
    // Ill-typed fields count as absent, as they would be once decoded.
    let pod = restricted_pod_with(&[
        ("/spec/hostNetwork", json!("true")),
        ("/spec/containers/0/securityContext/privileged", json!(1)),
        ("/spec/containers/0/securityContext/capabilities/add", json!([7, {"a": 1}])),
        ("/spec/containers/0/ports", json!([{"hostPort": "80"}, 3])),
        ("/spec/containers/1", json!("not a container")),
        ("/spec/securityContext", json!("not an object")),
        ("/metadata/annotations", json!({"container.apparmor.security.beta.kubernetes.io/app": 5})),
    ]);
    assert_eq!(evaluate(&pod).violations, []);
}

#[test]
fn a_container_without_a_name_is_named_by_its_index() {
    let pod = restricted_pod_with(&[
        ("/spec/containers/0/name", json!(null)),
        ("/spec/containers/1", hardened("")),
        ("/spec/containers/1/securityContext/privileged", json!(true)),
    ]);
    only(&evaluate(&pod), Level::Baseline, "privileged", &["spec.containers[1].securityContext.privileged"]);
}

#[test]
fn a_violation_prints_its_check_fields_and_detail() {
    let pod = restricted_pod_with(&[("/spec/hostPID", json!(true))]);
    let violation = &evaluate(&pod).violations[0];
    assert_eq!(
        violation.to_string(),
        "hostNamespaces (spec.hostPID): shares the host's namespaces: hostPID=true (baseline allows false or unset)"
    );
}

// === Baseline ===

#[test]
fn app_armor_profile() {
    let allowed = restricted_pod_with(&[
        ("/spec/securityContext/appArmorProfile", json!({"type": "RuntimeDefault"})),
        ("/spec/containers/0/securityContext/appArmorProfile", json!({"type": "Localhost", "localhostProfile": "p"})),
        (
            "/metadata/annotations",
            json!({
                "container.apparmor.security.beta.kubernetes.io/app": "runtime/default",
                "container.apparmor.security.beta.kubernetes.io/b": "localhost/custom",
                "container.apparmor.security.beta.kubernetes.io/c": "",
                "other.example.com/apparmor": "unconfined",
            }),
        ),
    ]);
    assert_eq!(evaluate(&allowed).violations, []);

    let pod = restricted_pod_with(&[
        ("/spec/securityContext/appArmorProfile", json!({"type": "Unconfined"})),
        ("/spec/containers/0/securityContext/appArmorProfile", json!({})),
        // Upstream checks every annotation with the prefix, even one naming no container of the pod.
        ("/metadata/annotations", json!({"container.apparmor.security.beta.kubernetes.io/ghost": "unconfined"})),
    ]);
    let violation = only(
        &evaluate(&pod),
        Level::Baseline,
        "appArmorProfile",
        &[
            "spec.securityContext.appArmorProfile.type",
            "spec.containers[app].securityContext.appArmorProfile.type",
            "metadata.annotations[container.apparmor.security.beta.kubernetes.io/ghost]",
        ],
    );
    assert!(violation.detail.starts_with(r#"AppArmor profile type "", Unconfined; annotation "#), "{violation:?}");
}

#[test]
fn capabilities_baseline() {
    let default_set = json!(CAPABILITIES_BASELINE);
    let pod =
        json!({"spec": {"containers": [{"name": "app", "securityContext": {"capabilities": {"add": default_set}}}]}});
    let report = evaluate(&pod);
    assert_eq!(report.level(), Level::Baseline);
    assert!(!checks(&report).contains(&"capabilities_baseline"));

    // The names are compared exactly: upstream's fixtures refuse `chown` and `CAP_CHOWN`.
    for added in ["NET_RAW", "chown", "CAP_CHOWN"] {
        let pod = json!({"spec": {"ephemeralContainers": [
            {"name": "debug", "securityContext": {"capabilities": {"add": ["CHOWN", added]}}}
        ]}});
        let report = evaluate(&pod);
        assert_eq!(report.level(), Level::Privileged, "{added}");
        let violation = report.breaking(Level::Baseline).next().expect("a baseline violation");
        assert_eq!(violation.check, "capabilities_baseline");
        assert_eq!(violation.fields, ["spec.ephemeralContainers[debug].securityContext.capabilities.add"]);
        assert!(violation.detail.starts_with(&format!("adds {added} (")), "{violation:?}");
    }
}

/// The default set, as upstream's fixtures list it.
const CAPABILITIES_BASELINE: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

#[test]
fn host_namespaces() {
    let allowed = restricted_pod_with(&[
        ("/spec/hostNetwork", json!(false)),
        ("/spec/hostPID", json!(null)),
        ("/spec/hostIPC", json!(false)),
    ]);
    assert_eq!(evaluate(&allowed).violations, []);

    let pod = restricted_pod_with(&[("/spec/hostNetwork", json!(true)), ("/spec/hostIPC", json!(true))]);
    let violation = only(&evaluate(&pod), Level::Baseline, "hostNamespaces", &["spec.hostNetwork", "spec.hostIPC"]);
    assert!(violation.detail.contains("hostNetwork=true, hostIPC=true"));
}

#[test]
fn host_path_volumes() {
    let allowed =
        restricted_pod_with(&[("/spec/volumes", json!([{"name": "logs", "hostPath": null, "emptyDir": {}}]))]);
    assert_eq!(evaluate(&allowed).violations, []);

    let pod = restricted_pod_with(&[("/spec/volumes", json!([{"name": "logs", "hostPath": {"path": "/var/log"}}]))]);
    let report = evaluate(&pod);
    assert_eq!(report.level(), Level::Privileged);
    let baseline: Vec<_> = report.breaking(Level::Baseline).collect();
    assert_eq!(baseline.len(), 1);
    assert_eq!(
        (baseline[0].check, baseline[0].fields.as_slice()),
        ("hostPathVolumes", &["spec.volumes[logs].hostPath".to_owned()][..])
    );
    // At restricted, restrictedVolumes reports it instead.
    let restricted: Vec<_> = report.breaking(Level::Restricted).collect();
    assert_eq!(restricted.len(), 1);
    assert_eq!(
        (restricted[0].check, restricted[0].fields.as_slice()),
        ("restrictedVolumes", &["spec.volumes[logs].hostPath".to_owned()][..])
    );
}

#[test]
fn host_ports() {
    let allowed = restricted_pod_with(&[("/spec/containers/0/ports", json!([{"containerPort": 80, "hostPort": 0}]))]);
    assert_eq!(evaluate(&allowed).violations, []);

    let pod = restricted_pod_with(&[
        ("/spec/containers/0/ports", json!([{"containerPort": 80}, {"containerPort": 8080, "hostPort": 8080}])),
        ("/spec/initContainers", json!([hardened("init")])),
        ("/spec/initContainers/0/ports", json!([{"containerPort": 53, "hostPort": 53}])),
    ]);
    let violation = only(
        &evaluate(&pod),
        Level::Baseline,
        "hostPorts",
        &["spec.initContainers[init].ports[0].hostPort", "spec.containers[app].ports[1].hostPort"],
    );
    assert_eq!(violation.detail, "binds hostPort 53, 8080 (baseline allows 0 or unset)");
}

#[test]
fn host_probes_and_lifecycle() {
    let allowed = restricted_pod_with(&[
        ("/spec/containers/0/livenessProbe", json!({"httpGet": {"path": "/", "port": 80, "host": ""}})),
        ("/spec/containers/0/readinessProbe", json!({"tcpSocket": {"port": 80}})),
        ("/spec/containers/0/lifecycle", json!({"preStop": {"sleep": {"seconds": 5}}})),
    ]);
    assert_eq!(evaluate(&allowed).violations, []);

    let pod = restricted_pod_with(&[
        ("/spec/containers/0/startupProbe", json!({"httpGet": {"port": 80, "host": "169.254.169.254"}})),
        ("/spec/initContainers", json!([hardened("init")])),
        ("/spec/initContainers/0/lifecycle", json!({"postStart": {"tcpSocket": {"port": 22, "host": "10.0.0.1"}}})),
    ]);
    let violation = only(
        &evaluate(&pod),
        Level::Baseline,
        "hostProbesAndHostLifecycle",
        &[
            "spec.initContainers[init].lifecycle.postStart.tcpSocket.host",
            "spec.containers[app].startupProbe.httpGet.host",
        ],
    );
    assert!(violation.detail.starts_with("probes or hooks host 10.0.0.1, 169.254.169.254"));
}

#[test]
fn privileged() {
    let allowed = restricted_pod_with(&[("/spec/containers/0/securityContext/privileged", json!(false))]);
    assert_eq!(evaluate(&allowed).violations, []);

    let pod = restricted_pod_with(&[
        ("/spec/initContainers", json!([hardened("init")])),
        ("/spec/initContainers/0/securityContext/privileged", json!(true)),
    ]);
    only(&evaluate(&pod), Level::Baseline, "privileged", &["spec.initContainers[init].securityContext.privileged"]);
}

#[test]
fn proc_mount() {
    let allowed = restricted_pod_with(&[("/spec/containers/0/securityContext/procMount", json!("Default"))]);
    assert_eq!(evaluate(&allowed).violations, []);

    // `hostUsers: false` relaxes this only behind a feature gate that 1.34 leaves off.
    let pod = restricted_pod_with(&[
        ("/spec/hostUsers", json!(false)),
        ("/spec/containers/0/securityContext/procMount", json!("Unmasked")),
    ]);
    let violation =
        only(&evaluate(&pod), Level::Baseline, "procMount", &["spec.containers[app].securityContext.procMount"]);
    assert_eq!(violation.detail, "procMount Unmasked (baseline allows Default or unset)");
}

#[test]
fn se_linux_options() {
    for kind in ["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"] {
        let allowed = restricted_pod_with(&[
            ("/spec/securityContext/seLinuxOptions", json!({"type": kind, "level": "s0:c123,c456"})),
            ("/spec/containers/0/securityContext/seLinuxOptions", json!({"user": "", "role": ""})),
        ]);
        assert_eq!(evaluate(&allowed).violations, [], "{kind}");
    }

    let pod = restricted_pod_with(&[
        ("/spec/securityContext/seLinuxOptions", json!({"type": "spc_t"})),
        ("/spec/containers/0/securityContext/seLinuxOptions", json!({"user": "system_u", "role": "system_r"})),
    ]);
    let violation = only(
        &evaluate(&pod),
        Level::Baseline,
        "seLinuxOptions",
        &[
            "spec.securityContext.seLinuxOptions.type",
            "spec.containers[app].securityContext.seLinuxOptions.user",
            "spec.containers[app].securityContext.seLinuxOptions.role",
        ],
    );
    assert!(violation.detail.starts_with("SELinux type spc_t, a user, a role (baseline allows type container_t"));
}

#[test]
fn seccomp_profile_baseline() {
    let pod = json!({"spec": {
        "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
        "containers": [{"name": "app", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}],
    }});
    assert!(!checks(&evaluate(&pod)).contains(&"seccompProfile_baseline"));

    let pod = json!({"spec": {"containers": [
        {"name": "app"},
        {"name": "debug", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
    ]}});
    let report = evaluate(&pod);
    assert_eq!(report.level(), Level::Privileged);
    let baseline: Vec<_> = report.breaking(Level::Baseline).collect();
    assert_eq!(baseline.len(), 1);
    assert_eq!(baseline[0].check, "seccompProfile_baseline");
    assert_eq!(baseline[0].fields, ["spec.containers[debug].securityContext.seccompProfile.type"]);
    // At restricted, seccompProfile_restricted reports it (and the container without a profile).
    let restricted = report.breaking(Level::Restricted).find(|v| v.check.starts_with("seccomp")).expect("seccomp");
    assert_eq!(restricted.check, "seccompProfile_restricted");
    assert_eq!(
        restricted.fields,
        [
            "spec.containers[app].securityContext.seccompProfile.type",
            "spec.containers[debug].securityContext.seccompProfile.type"
        ]
    );
}

#[test]
fn sysctls() {
    let allowed = restricted_pod_with(&[(
        "/spec/securityContext/sysctls",
        json!([
            {"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"},
            {"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"},
        ]),
    )]);
    assert_eq!(evaluate(&allowed).violations, []);

    // `net.ipv4.tcp_notsent_lowat` is allowed from policy 1.37, not in 1.34.
    let pod = restricted_pod_with(&[(
        "/spec/securityContext/sysctls",
        json!([{"name": "kernel.msgmax", "value": "65536"}, {"name": "net.ipv4.tcp_notsent_lowat", "value": "1"}]),
    )]);
    let violation = only(
        &evaluate(&pod),
        Level::Baseline,
        "sysctls",
        &["spec.securityContext.sysctls[kernel.msgmax]", "spec.securityContext.sysctls[net.ipv4.tcp_notsent_lowat]"],
    );
    assert!(
        violation.detail.starts_with("sets sysctl kernel.msgmax, net.ipv4.tcp_notsent_lowat (baseline allows only")
    );
}

#[test]
fn windows_host_process() {
    let allowed = restricted_pod_with(&[
        ("/spec/securityContext/windowsOptions", json!({"hostProcess": false})),
        ("/spec/containers/0/securityContext/windowsOptions", json!({"runAsUserName": "ContainerUser"})),
    ]);
    assert_eq!(evaluate(&allowed).violations, []);

    let pod = restricted_pod_with(&[
        ("/spec/securityContext/windowsOptions/hostProcess", json!(true)),
        ("/spec/ephemeralContainers", json!([hardened("debug")])),
        ("/spec/ephemeralContainers/0/securityContext/windowsOptions/hostProcess", json!(true)),
    ]);
    only(
        &evaluate(&pod),
        Level::Baseline,
        "windowsHostProcess",
        &[
            "spec.securityContext.windowsOptions.hostProcess",
            "spec.ephemeralContainers[debug].securityContext.windowsOptions.hostProcess",
        ],
    );
}

// === Restricted ===

#[test]
fn allow_privilege_escalation() {
    let pod = restricted_pod_with(&[
        ("/spec/containers/0/securityContext/allowPrivilegeEscalation", json!(true)),
        ("/spec/initContainers", json!([hardened("init")])),
        ("/spec/initContainers/0/securityContext/allowPrivilegeEscalation", json!(null)),
    ]);
    let violation = only(
        &evaluate(&pod),
        Level::Restricted,
        "allowPrivilegeEscalation",
        &[
            "spec.initContainers[init].securityContext.allowPrivilegeEscalation",
            "spec.containers[app].securityContext.allowPrivilegeEscalation",
        ],
    );
    assert_eq!(violation.detail, "allowPrivilegeEscalation true, unset (restricted requires false)");

    // A Windows pod is exempt: the API server refuses the field on Windows.
    let windows = restricted_pod_with(&[
        ("/spec/os/name", json!("windows")),
        ("/spec/containers/0/securityContext/allowPrivilegeEscalation", json!(null)),
    ]);
    assert_eq!(evaluate(&windows).violations, []);
}

#[test]
fn capabilities_restricted() {
    let allowed =
        restricted_pod_with(&[("/spec/containers/0/securityContext/capabilities/add", json!(["NET_BIND_SERVICE"]))]);
    assert_eq!(evaluate(&allowed).violations, []);

    // `all` is not `ALL`; a capability of the default set is still too much for restricted.
    let pod = restricted_pod_with(&[
        ("/spec/containers/0/securityContext/capabilities", json!({"drop": ["all"], "add": ["CHOWN"]})),
        ("/spec/initContainers", json!([{"name": "init", "securityContext": {"runAsNonRoot": true}}])),
        ("/spec/initContainers/0/securityContext/allowPrivilegeEscalation", json!(false)),
        ("/spec/securityContext/seccompProfile/type", json!("RuntimeDefault")),
    ]);
    let violation = only(
        &evaluate(&pod),
        Level::Restricted,
        "capabilities_restricted",
        &[
            "spec.initContainers[init].securityContext.capabilities.drop",
            "spec.containers[app].securityContext.capabilities.drop",
            "spec.containers[app].securityContext.capabilities.add",
        ],
    );
    assert_eq!(
        violation.detail,
        "does not drop ALL; adds CHOWN (restricted requires drop [ALL] and allows adding only NET_BIND_SERVICE)"
    );

    // Dropping every capability by name is not dropping ALL.
    let by_name =
        restricted_pod_with(&[("/spec/containers/0/securityContext/capabilities/drop", json!(CAPABILITIES_BASELINE))]);
    assert_eq!(checks(&evaluate(&by_name)), ["capabilities_restricted"]);

    let windows = restricted_pod_with(&[
        ("/spec/os/name", json!("windows")),
        ("/spec/containers/0/securityContext/capabilities", json!(null)),
    ]);
    assert_eq!(evaluate(&windows).violations, []);
}

#[test]
fn restricted_volumes() {
    let sources = [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    let mut volumes: Vec<J> = sources.iter().map(|source| json!({"name": source, *source: {}})).collect();
    // A volume without a source is an emptyDir once defaulted.
    volumes.push(json!({"name": "scratch"}));
    let allowed = restricted_pod_with(&[("/spec/volumes", J::Array(volumes))]);
    assert_eq!(evaluate(&allowed).violations, []);

    let pod = restricted_pod_with(&[(
        "/spec/volumes",
        json!([
            {"name": "config", "configMap": {"name": "c"}},
            {"name": "data", "nfs": {"server": "s", "path": "/"}},
            {"name": "repo", "gitRepo": {"repository": "r"}},
        ]),
    )]);
    let report = evaluate(&pod);
    assert_eq!(report.level(), Level::Baseline);
    let violation = only(
        &report,
        Level::Restricted,
        "restrictedVolumes",
        &["spec.volumes[data].nfs", "spec.volumes[repo].gitRepo"],
    );
    assert!(violation.detail.starts_with("uses volume type gitRepo, nfs (restricted allows only configMap, csi"));
}

#[test]
fn run_as_non_root() {
    // Pod-level true covers containers that leave it unset.
    let covered = restricted_pod_with(&[
        ("/spec/securityContext/runAsNonRoot", json!(true)),
        ("/spec/containers/0/securityContext/runAsNonRoot", json!(null)),
    ]);
    assert_eq!(evaluate(&covered).violations, []);

    // A container's false overrides the pod's true.
    let overridden = restricted_pod_with(&[
        ("/spec/securityContext/runAsNonRoot", json!(true)),
        ("/spec/containers/0/securityContext/runAsNonRoot", json!(false)),
    ]);
    only(
        &evaluate(&overridden),
        Level::Restricted,
        "runAsNonRoot",
        &["spec.containers[app].securityContext.runAsNonRoot"],
    );

    // The pod's false is a violation even where every container sets true.
    let pod_false = restricted_pod_with(&[("/spec/securityContext/runAsNonRoot", json!(false))]);
    only(&evaluate(&pod_false), Level::Restricted, "runAsNonRoot", &["spec.securityContext.runAsNonRoot"]);

    // Unset on a container of a pod that does not set true.
    let unset = restricted_pod_with(&[
        ("/spec/containers/1", hardened("sidecar")),
        ("/spec/containers/1/securityContext/runAsNonRoot", json!(null)),
    ]);
    let violation = only(
        &evaluate(&unset),
        Level::Restricted,
        "runAsNonRoot",
        &["spec.containers[sidecar].securityContext.runAsNonRoot"],
    );
    assert!(violation.detail.starts_with("runAsNonRoot unset on a container of a pod without runAsNonRoot=true"));
}

#[test]
fn run_as_user() {
    let allowed = restricted_pod_with(&[
        ("/spec/securityContext/runAsUser", json!(1000)),
        ("/spec/containers/0/securityContext/runAsUser", json!(65532)),
    ]);
    assert_eq!(evaluate(&allowed).violations, []);

    // The pod's 0 is a violation even where the container runs as another user.
    let pod = restricted_pod_with(&[
        ("/spec/securityContext/runAsUser", json!(0)),
        ("/spec/containers/0/securityContext/runAsUser", json!(1000)),
        ("/spec/containers/1", hardened("sidecar")),
        ("/spec/containers/1/securityContext/runAsUser", json!(0)),
    ]);
    only(
        &evaluate(&pod),
        Level::Restricted,
        "runAsUser",
        &["spec.securityContext.runAsUser", "spec.containers[sidecar].securityContext.runAsUser"],
    );
}

#[test]
fn seccomp_profile_restricted() {
    // The pod's profile covers containers without one; a container may name its own.
    let covered = restricted_pod_with(&[
        ("/spec/securityContext/seccompProfile", json!({"type": "RuntimeDefault"})),
        ("/spec/containers/0/securityContext/seccompProfile", json!(null)),
        ("/spec/initContainers", json!([hardened("init")])),
        (
            "/spec/initContainers/0/securityContext/seccompProfile",
            json!({"type": "Localhost", "localhostProfile": "p"}),
        ),
    ]);
    assert_eq!(evaluate(&covered).violations, []);

    // Unset everywhere on one container.
    let unset = restricted_pod_with(&[
        ("/spec/initContainers", json!([hardened("init")])),
        ("/spec/initContainers/0/securityContext/seccompProfile", json!(null)),
    ]);
    only(
        &evaluate(&unset),
        Level::Restricted,
        "seccompProfile_restricted",
        &["spec.initContainers[init].securityContext.seccompProfile.type"],
    );

    // An Unconfined pod profile covers nothing; the container that sets its own is fine.
    let pod_unconfined = restricted_pod_with(&[
        ("/spec/securityContext/seccompProfile", json!({"type": "Unconfined"})),
        ("/spec/containers/1", hardened("sidecar")),
        ("/spec/containers/1/securityContext/seccompProfile", json!(null)),
    ]);
    let report = evaluate(&pod_unconfined);
    assert_eq!(report.level(), Level::Privileged);
    let violation = report.breaking(Level::Restricted).next().expect("a violation");
    assert_eq!(report.breaking(Level::Restricted).count(), 1);
    assert_eq!(violation.check, "seccompProfile_restricted");
    assert_eq!(
        violation.fields,
        ["spec.securityContext.seccompProfile.type", "spec.containers[sidecar].securityContext.seccompProfile.type"]
    );

    let windows = restricted_pod_with(&[
        ("/spec/os", json!({"name": "windows"})),
        ("/spec/containers/0/securityContext/seccompProfile", json!(null)),
    ]);
    assert_eq!(evaluate(&windows).violations, []);
}

/// Upstream's walk covers the API's container lists, each once: one list of them, in another order.
#[test]
fn the_visit_order_is_the_apis_container_lists() {
    let mut visited = VISIT_ORDER;
    let mut lists = crate::pod_api::spec::CONTAINER_LISTS;
    visited.sort_unstable();
    lists.sort_unstable();
    assert_eq!(visited, lists);
}
