//! `sidecar-injector certs`: the overlay a cluster deploys, and certificates for clusters without cert-manager.
//! Writes a CA, a serving certificate for the webhook's Service and a kustomize overlay on `manifests/` that
//! deploys them (the TLS Secret, and the CA as the `caBundle` of the webhook configuration); with `--cert-manager`,
//! the overlay alone, on `manifests/cert-manager`. Either way the overlay is the home of the user's templates
//! ([`super::overlay`]): seeded the first time, kept and listed on every later run.
//!
//! Run again on the same directory, it keeps the CA and issues a new serving certificate, so the `caBundle` the
//! API server trusts does not change when the certificate is renewed; and it keeps the templates, so a renewal or
//! an upgrade deploys the user's templates, never the shipped ones over them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use clap::Args;

use super::{CliError, names, overlay};
use crate::pki::Authority;
use sidecar_injector_core::validation::KubeVersion;

/// Arguments of `certs`.
#[derive(Debug, Args)]
pub struct CertsArgs {
    /// The webhook's Service.
    #[arg(long, value_name = "NAME", default_value = names::SERVICE)]
    pub service: String,

    /// The Service's namespace.
    #[arg(long, value_name = "NS", default_value = names::NAMESPACE)]
    pub namespace: String,

    /// Where to write the certificates and the overlay (created if needed).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// The kustomize base the overlay builds on: a directory (written relative to DIR) or a remote URL
    /// [default: manifests/base; with --cert-manager, manifests/cert-manager].
    #[arg(long, value_name = "DIR|URL")]
    pub base: Option<String>,

    /// cert-manager issues and renews the serving certificate: write the overlay alone, on manifests/cert-manager
    /// (kept by later runs on the same overlay).
    #[arg(long)]
    pub cert_manager: bool,

    /// Seed the overlay's templates directory (DIR/templates) with the template files of this directory instead
    /// of the shipped templates; only when the overlay has none yet (an existing one is never overwritten).
    #[arg(long, value_name = "DIR")]
    pub templates_from: Option<PathBuf>,

    /// The injector's image, `NAME[:TAG]` or `NAME@DIGEST`, set in the overlay [default: the base's].
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,

    /// Days the serving certificate is valid.
    #[arg(long, value_name = "DAYS", default_value_t = 365, value_parser = clap::value_parser!(u64).range(1..=3650))]
    pub days: u64,

    /// Make a new CA even if DIR holds one (the webhook configuration's caBundle then changes).
    #[arg(long)]
    pub new_ca: bool,

    /// Also deploy the revision NAME (repeatable): the overlay adds the component `revision-NAME` beside the base
    /// (manifests/revision-canary for `canary`) and gives its webhooks the caBundle too.
    #[arg(long = "revision", value_name = "NAME")]
    pub revisions: Vec<String>,

    /// The cluster's Kubernetes version (1.20, v1.27.3), for clusters older than the base needs (1.30): the
    /// overlay then patches out what that version lacks and runs the injector with the same
    /// --kubernetes-version [default: a cluster of 1.30 or later, the base as written].
    #[arg(long, value_name = "VERSION")]
    pub kubernetes_version: Option<KubeVersion>,
}

/// The oldest Kubernetes the manifests can be made to run on: `admissionregistration.k8s.io/v1`.
const OLDEST_SUPPORTED_MINOR: u32 = 16;

/// What the base uses that older clusters lack, newest first: the first minor version that has it, why, and the
/// kustomize patch an overlay for an older cluster applies (`{mutating}` and `{validating}` stand for one `remove`
/// per webhook of that configuration). docs/operations.md ("Older clusters") lists the same; a test applies them to a 1.20 cluster.
const OLDER_CLUSTERS: &[(u32, &str, &str)] = &[
    (
        30,
        "the preStop `sleep` action needs 1.30: the injector waits itself instead (--shutdown-delay=7s)",
        "  - target: {kind: Deployment, name: sidecar-injector}\n    patch: |-\n      - {op: remove, path: \
         /spec/template/spec/containers/0/lifecycle}\n      - {op: add, path: /spec/template/spec/containers/0/args/-, \
         value: --shutdown-delay=7s}\n",
    ),
    (
        28,
        "CEL matchConditions need 1.28: the API server calls the webhooks for opted-out pods too, which the injector \
         skips",
        "  - target: {kind: MutatingWebhookConfiguration}\n    patch: |-\n{mutating}  - target: {kind: \
         ValidatingWebhookConfiguration}\n    patch: |-\n{validating}",
    ),
    (
        27,
        "the PodDisruptionBudget's unhealthyPodEvictionPolicy needs 1.27",
        "  - target: {kind: PodDisruptionBudget, name: sidecar-injector}\n    patch: |-\n      - {op: remove, path: \
         /spec/unhealthyPodEvictionPolicy}\n",
    ),
    (
        23,
        "autoscaling/v2 needs 1.23: the HorizontalPodAutoscaler as autoscaling/v2beta2 (the same fields)",
        "  - target: {kind: HorizontalPodAutoscaler, name: sidecar-injector}\n    patch: |-\n      - {op: replace, \
         path: /apiVersion, value: autoscaling/v2beta2}\n",
    ),
    (
        21,
        "policy/v1 needs 1.21: the PodDisruptionBudget as policy/v1beta1 (the same fields)",
        "  - target: {kind: PodDisruptionBudget, name: sidecar-injector}\n    patch: |-\n      - {op: replace, path: \
         /apiVersion, value: policy/v1beta1}\n",
    ),
    (
        20,
        "the token mounted to read the template ConfigMap (bound tokens, kube-root-ca.crt) needs 1.20: not mounted, \
         not read; a template just added reaches each replica with the kubelet's update of its volume",
        "  - target: {kind: Deployment, name: sidecar-injector}\n    patch: |-\n      - {op: test, path: \
         /spec/template/spec/containers/0/args/4, value: --template-configmap=sidecar-injector-templates}\n      - \
         {op: remove, path: /spec/template/spec/containers/0/args/4}\n      - {op: test, path: \
         /spec/template/spec/containers/0/volumeMounts/2/name, value: api-access}\n      - {op: remove, path: \
         /spec/template/spec/containers/0/volumeMounts/2}\n      - {op: test, path: /spec/template/spec/volumes/2/name, \
         value: api-access}\n      - {op: remove, path: /spec/template/spec/volumes/2}\n",
    ),
];

/// The overlay's patches for a cluster of `version`: each of [`OLDER_CLUSTERS`] it lacks, and the injector told
/// the version (so that it does not inject what the cluster cannot run, native sidecars before 1.29).
fn older_cluster_patches(version: KubeVersion, revisions: usize) -> String {
    let mut text = format!(
        "  # Kubernetes {version} (`certs --kubernetes-version {version}`): the injector is told the version, and what \
         the\n  # base uses that {version} lacks is patched out.\n  - target: {{kind: Deployment, name: sidecar-injector}}\n    \
         patch: |-\n      - {{op: add, path: /spec/template/spec/containers/0/args/-, value: \
         --kubernetes-version={version}}}\n"
    );
    // Each revision (the default one and those of components) has the same webhooks in each configuration.
    let removals = |webhooks: &[&str]| -> String {
        (0..webhooks.len() * revisions)
            .map(|i| format!("      - {{op: remove, path: /webhooks/{i}/matchConditions}}\n"))
            .collect()
    };
    for (since, why, patch) in OLDER_CLUSTERS {
        if !version.at_least(*since) {
            text.push_str(&format!("  # {why}\n"));
            let patch = patch.replace("{mutating}", &removals(names::MUTATING_WEBHOOKS));
            text.push_str(&patch.replace("{validating}", &removals(names::VALIDATING_WEBHOOKS)));
        }
    }
    text
}

/// A new CA is valid for ten years; the serving certificates it signs are renewed far more often.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Runs `certs`. Every input is checked (the base, an existing CA, the templates) and every file made in memory
/// before the first is written, so a run that fails leaves the output directory as it was.
pub fn run(args: &CertsArgs) -> Result<(), CliError> {
    let out = &args.out;
    if out.exists() && !out.is_dir() {
        return Err(CliError::Config(format!("--out {}: not a directory", out.display())));
    }
    // Run again on its overlay (the README's renewal step), what the last run was told is kept unless told anew;
    // so are the components added to it by hand, and a revision's among them gets its webhooks' caBundle.
    let previous = Previous::read(&out.join("kustomization.yaml"))?;
    let cert_manager = args.cert_manager || previous.cert_manager;
    if cert_manager && args.new_ca {
        return Err(CliError::Config(format!(
            "--new-ca: the overlay in {} is cert-manager's, which issues the CA (to make certificates here instead, \
             move its kustomization.yaml away and run certs without --cert-manager)",
            out.display()
        )));
    }
    let base_arg = args.base.as_deref().unwrap_or(if cert_manager { CERT_MANAGER_BASE } else { BASE });
    let base = base_reference(base_arg, out)?;
    if let Some(version) = args.kubernetes_version
        && !version.at_least(OLDEST_SUPPORTED_MINOR)
    {
        return Err(CliError::Config(format!(
            "--kubernetes-version {version}: the webhook configurations need Kubernetes 1.{OLDEST_SUPPORTED_MINOR} or \
             later (admissionregistration.k8s.io/v1)"
        )));
    }
    let mut components = args
        .revisions
        .iter()
        .map(|revision| revision_component(base_arg, &base, revision))
        .collect::<Result<Vec<_>, _>>()?;
    let mut revisions = args.revisions.clone();
    let mut kept = Vec::new();
    for component in &previous.components {
        let revision = revision_of(component);
        let ours = component.starts_with(&format!("{}/", overlay::REVISIONS_DIR));
        if ours || components.contains(component) || revision.is_some_and(|r| revisions.iter().any(|given| given == r))
        {
            continue;
        }
        components.push(component.clone());
        revisions.extend(revision.map(str::to_owned));
        kept.push(component);
    }
    // The generators replace the ConfigMaps of the base's namespace, whatever the Service's.
    let templates = Templates::plan(out, &revisions, args.templates_from.as_deref(), names::NAMESPACE)?;
    // Each revision's templates come after the component whose ConfigMap they replace.
    components.extend(templates.homes.iter().filter_map(|planned| planned.home.component()));

    let (ca_cert, ca_key) = (out.join("ca.crt"), out.join("ca.key"));
    let (service, namespace) = (&args.service, &args.namespace);
    let dns_names = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.clone(),
    ];
    let certificates = if cert_manager { None } else { Some(Certificates::make(args, &ca_cert, &ca_key, &dns_names)?) };

    // Everything is known: now write, the CA first (a new one only).
    std::fs::create_dir_all(out).map_err(|e| CliError::Config(format!("{}: {e}", out.display())))?;
    if let Some(certificates) = &certificates {
        certificates.write(out, &ca_cert, &ca_key, &revisions)?;
    }
    templates.write()?;
    let image = args.image.clone().or_else(|| previous.image.clone());
    let version = args.kubernetes_version.or(previous.kubernetes_version);
    let older = version.map(|v| older_cluster_patches(v, 1 + revisions.len()));
    let overlay = Overlay {
        base: &base,
        certificates: !cert_manager,
        templates: &templates.generator,
        components: &components,
        namespace,
        image: image.as_deref(),
        older_cluster: older.as_deref(),
    };
    write(&out.join("kustomization.yaml"), &overlay.kustomization(), false)?;
    if let (None, Some(image)) = (&args.image, &previous.image) {
        eprintln!("sidecar-injector: keeping the image {image} of the existing overlay (--image changes it)");
    }
    for component in kept {
        let ca =
            if revision_of(component).is_some() && !cert_manager { " (its webhooks get the caBundle)" } else { "" };
        eprintln!("sidecar-injector: keeping the component {component} of the existing overlay{ca}");
    }
    if let (None, Some(version)) = (args.kubernetes_version, previous.kubernetes_version) {
        eprintln!(
            "sidecar-injector: keeping --kubernetes-version {version} of the existing overlay (give another to change it)"
        );
    }
    if service != names::SERVICE || namespace != names::NAMESPACE {
        super::stderr(format_args!(
            "sidecar-injector: note: the base deploys Service {} in namespace {}; give the overlay a matching name \
             and namespace (and the webhook configuration's clientConfig.service) before applying it\n",
            names::SERVICE,
            names::NAMESPACE
        ));
    }
    templates.report(previous.written);
    let what = match certificates {
        Some(_) => format!(
            "a serving certificate for {} (valid {} days) and a kustomize overlay",
            dns_names[..2].join(", "),
            args.days
        ),
        None => "a kustomize overlay (cert-manager issues the certificate)".to_owned(),
    };
    super::stderr(format_args!("sidecar-injector: wrote {what}; deploy with `kubectl apply -k {}`\n", out.display()));
    Ok(())
}

/// The base `certs` builds on by default, and with `--cert-manager`.
const BASE: &str = "manifests/base";
const CERT_MANAGER_BASE: &str = "manifests/cert-manager";

/// The CA (kept or new) and the serving certificate it signed, made in memory.
struct Certificates {
    ca: Authority,
    kept_ca: bool,
    leaf: crate::pki::Issued,
}

impl Certificates {
    fn make(args: &CertsArgs, ca_cert: &Path, ca_key: &Path, dns_names: &[String]) -> Result<Certificates, CliError> {
        let kept_ca = !args.new_ca && ca_cert.exists() && ca_key.exists();
        let ca = if kept_ca {
            Authority::from_pem(&read(ca_cert)?, &read(ca_key)?).map_err(|e| {
                CliError::Config(format!(
                    "{} and {}: not a usable CA ({e}); use --new-ca to replace it",
                    ca_cert.display(),
                    ca_key.display()
                ))
            })?
        } else {
            Authority::generate(&format!("{} webhook CA", args.service), CA_VALIDITY)
                .map_err(|e| CliError::Config(e.to_string()))?
        };
        let validity = Duration::from_secs(args.days * 24 * 3600);
        let leaf = ca.issue_server(&dns_names[0], dns_names, validity).map_err(|e| CliError::Config(e.to_string()))?;
        Ok(Certificates { ca, kept_ca, leaf })
    }

    /// Writes the CA (a new one only), the serving certificate, the caBundle patch and the `.gitignore` that
    /// keeps the private keys out of git.
    fn write(&self, out: &Path, ca_cert: &Path, ca_key: &Path, revisions: &[String]) -> Result<(), CliError> {
        if self.kept_ca {
            super::stderr(format_args!(
                "sidecar-injector: keeping the CA in {} (the caBundle does not change)\n",
                ca_cert.display()
            ));
        } else {
            write(ca_cert, self.ca.cert_pem(), false)?;
            write(ca_key, &self.ca.key_pem(), true)?;
        }
        write(&out.join("tls.crt"), &self.leaf.cert_pem, false)?;
        write(&out.join("tls.key"), &self.leaf.key_pem, true)?;
        write(&out.join("webhook-ca-patch.yaml"), &ca_bundle_patch(self.ca.cert_pem(), revisions), false)?;
        // The overlay may be committed; the private keys must not be.
        write(
            &out.join(".gitignore"),
            "# Written by `sidecar-injector certs`: private keys stay out of git.\n*.key\n",
            false,
        )
    }
}

/// The templates of every revision the overlay deploys: their homes, what is to be written to seed new ones,
/// and the listing of each.
struct Templates {
    homes: Vec<Planned>,
    /// The default revision's generator entry, for the overlay's kustomization.
    generator: String,
    /// Each revision's component kustomization, to write.
    components: Vec<(PathBuf, String)>,
}

/// One home as this run leaves it.
struct Planned {
    home: overlay::Home,
    /// The files it will hold, by name.
    files: Vec<String>,
    /// For a new directory: where its files come from (for the report) and the files to write, by name.
    seed: Option<(String, Vec<(String, String)>)>,
}

impl Templates {
    fn plan(out: &Path, revisions: &[String], from: Option<&Path>, namespace: &str) -> Result<Templates, CliError> {
        let default = overlay::Home::default_revision(out);
        if let Some(from) = from
            && default.dir().exists()
        {
            return Err(CliError::Config(format!(
                "--templates-from {}: {} exists and holds the overlay's templates, which certs never overwrites (edit \
                 them there, or move the directory away to seed it again)",
                from.display(),
                default.dir().display()
            )));
        }
        let (seed, seeded_from) = match from {
            Some(dir) => (overlay::Seed::Dir(dir), dir.display().to_string()),
            None => (overlay::Seed::Shipped, "the shipped templates".to_owned()),
        };
        let default_seed = default.seed(seed)?;
        // A new revision starts as a copy of the default revision's templates, as they will be after this run.
        let default_files = match &default_seed {
            Some(files) => files.clone(),
            None => overlay::read_template_files(&default.dir())?,
        };
        let mut plan = Templates { homes: Vec::new(), generator: String::new(), components: Vec::new() };
        let mut default_seed = default_seed.map(|files| (seeded_from, files));
        let homes = std::iter::once(default).chain(revisions.iter().map(|r| overlay::Home::revision(out, r)));
        for home in homes {
            let seed = match home.revision {
                None => default_seed.take(),
                Some(_) => {
                    let copy = home.seed(overlay::Seed::Files(&default_files))?;
                    copy.map(|files| (format!("a copy of {}", overlay::TEMPLATES_DIR), files))
                }
            };
            let files: Vec<String> = match &seed {
                Some((_, files)) => files.iter().map(|(file, _)| file.clone()).collect(),
                // An existing directory must hold templates: an empty ConfigMap would stop every replica at start.
                None => overlay::read_template_files(&home.dir())?.into_iter().map(|(file, _)| file).collect(),
            };
            match home.revision {
                None => plan.generator = home.generator(namespace, &files),
                Some(_) => plan
                    .components
                    .push((home.root.join("kustomization.yaml"), home.component_kustomization(namespace, &files))),
            }
            plan.homes.push(Planned { home, files, seed });
        }
        Ok(plan)
    }

    fn write(&self) -> Result<(), CliError> {
        let seeds = self.homes.iter().filter_map(|planned| {
            let (_, files) = planned.seed.as_ref()?;
            Some(files.iter().map(|(file, source)| (planned.home.dir().join(file), source.clone())))
        });
        for (path, source) in seeds.flatten().chain(self.components.iter().cloned()) {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| CliError::Config(format!("{}: {e}", dir.display())))?;
            }
            write(&path, &source, false)?;
        }
        Ok(())
    }

    /// Says where each revision's templates are and, for a directory the user already had, which shipped
    /// templates differ from it (an upgrade brings new ones, never over the user's).
    fn report(&self, overlay_existed: bool) {
        for Planned { home, files, seed } in &self.homes {
            let dir = home.dir();
            match seed {
                Some((from, _)) => {
                    eprintln!(
                        "sidecar-injector: seeded {} with {from} ({} files): the templates `kubectl apply -k` deploys \
                         as the ConfigMap {}; edit them there, then `sidecar-injector check` the overlay",
                        dir.display(),
                        files.len(),
                        home.config_map()
                    );
                    if overlay_existed && home.revision.is_none() {
                        eprintln!(
                            "sidecar-injector: warning: this overlay had no templates directory; if the templates in the \
                             cluster were edited there, put those files into {} before `kubectl apply -k`, which \
                             replaces the ConfigMap {} with this directory's",
                            dir.display(),
                            home.config_map()
                        );
                    }
                }
                None => {
                    eprintln!(
                        "sidecar-injector: keeping the templates in {} ({} files, listed in the overlay as the \
                         ConfigMap {})",
                        dir.display(),
                        files.len(),
                        home.config_map()
                    );
                    let differ = shipped_differences(&dir);
                    if home.revision.is_none() && !differ.is_empty() {
                        eprintln!(
                            "sidecar-injector: note: this release ships templates that differ from those in {}: {}; \
                             yours are deployed as they are (compare with `templates/` of this release)",
                            dir.display(),
                            differ.join(", ")
                        );
                    }
                }
            }
        }
    }
}

/// The shipped templates that `dir` lacks or holds otherwise: `demo.yaml (changed)`, `new.yaml (not in yours)`.
fn shipped_differences(dir: &Path) -> Vec<String> {
    sidecar_injector_core::template::SHIPPED
        .iter()
        .filter_map(|(file, source)| match std::fs::read_to_string(dir.join(file)) {
            Ok(theirs) if theirs == *source => None,
            Ok(_) => Some(format!("{file} (changed)")),
            Err(_) => Some(format!("{file} (not in yours)")),
        })
        .collect()
}

/// What an overlay written by an earlier run says that a run without the same flags would otherwise drop.
#[derive(Debug, Default)]
struct Previous {
    /// `--image`: the `images:` entry for the base's image, as a reference.
    image: Option<String>,
    /// `--kubernetes-version`: the version its serve argument names.
    kubernetes_version: Option<KubeVersion>,
    /// Its components, as it refers to them: `--revision`'s, and any added by hand.
    components: Vec<String>,
    /// `--cert-manager`: an overlay of ours without the TLS Secret.
    cert_manager: bool,
    /// Was there an overlay of ours at all?
    written: bool,
}

impl Previous {
    /// Reads the overlay at `path`; nothing when there is none. One `certs` did not write (say, a cert-manager
    /// overlay written by hand) is refused: `certs` writes the whole file, and would lose what it says.
    fn read(path: &Path) -> Result<Previous, CliError> {
        let Ok(text) = std::fs::read_to_string(path) else { return Ok(Previous::default()) };
        if !text.starts_with(GENERATED) {
            return Err(CliError::Config(format!(
                "{}: not written by `sidecar-injector certs`, which would replace it whole; move it away (keeping what \
                 you need of it: --image, --base, --cert-manager, --revision say the same) or give another --out",
                path.display()
            )));
        }
        let Ok(overlay) = serde_saphyr::from_str::<serde_json::Value>(&text) else { return Ok(Previous::default()) };
        let image =
            overlay["images"].as_array().into_iter().flatten().find(|i| i["name"] == names::IMAGE).and_then(|i| {
                let name = i["newName"].as_str().unwrap_or(names::IMAGE);
                match (i["newTag"].as_str(), i["digest"].as_str()) {
                    (_, Some(digest)) => Some(format!("{name}@{digest}")),
                    (Some(tag), None) => Some(format!("{name}:{tag}")),
                    (None, None) => i["newName"].as_str().map(str::to_owned),
                }
            });
        let kubernetes_version = text
            .split("value: --kubernetes-version=")
            .nth(1)
            .and_then(|rest| rest.split(['}', '\n']).next())
            .and_then(|v| v.trim().parse().ok());
        let components = overlay["components"].as_array().into_iter().flatten();
        let components = components.filter_map(|c| c.as_str().map(str::to_owned)).collect();
        let cert_manager = overlay["secretGenerator"].is_null();
        Ok(Previous { image, kubernetes_version, components, cert_manager, written: true })
    }
}

/// The revision a component serves, by its directory's name (`../manifests/revision-canary`: `canary`); `None` for
/// another component.
fn revision_of(component: &str) -> Option<&str> {
    let name = component.trim_end_matches('/').rsplit('/').next()?.strip_prefix("revision-")?;
    sidecar_injector_core::validation::dns1123_label(name).is_empty().then_some(name)
}

/// The strategic-merge patches that give every webhook, mutating and validating, the CA bundle: the base's and
/// those of each revision's component (`NAME.` before the base's names).
fn ca_bundle_patch(ca_pem: &str, revisions: &[String]) -> String {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut patch = String::from(
        "# Generated by `sidecar-injector certs`: the CA that signed the serving certificate, for the API server.\n",
    );
    let configurations = [
        ("MutatingWebhookConfiguration", names::MUTATING_CONFIGURATION, names::MUTATING_WEBHOOKS),
        ("ValidatingWebhookConfiguration", names::VALIDATING_CONFIGURATION, names::VALIDATING_WEBHOOKS),
    ];
    for (i, (kind, name, webhooks)) in configurations.into_iter().enumerate() {
        if i > 0 {
            patch.push_str("---\n");
        }
        patch.push_str(&format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: {name}\nwebhooks:\n"
        ));
        let revision_webhooks = revisions.iter().flat_map(|r| webhooks.iter().map(move |w| format!("{r}.{w}")));
        for webhook in webhooks.iter().map(|w| w.to_string()).chain(revision_webhooks) {
            patch.push_str(&format!("  - name: {webhook}\n    clientConfig:\n      caBundle: {bundle}\n"));
        }
    }
    patch
}

/// The first line of every overlay `certs` writes.
const GENERATED: &str = "# Generated by `sidecar-injector certs`.";

/// The overlay's kustomization, as the parts of a run decided it.
struct Overlay<'a> {
    /// The base, as the overlay refers to it.
    base: &'a str,
    /// Ours (the TLS Secret from the files beside it, the caBundle patch), or cert-manager's (nothing here).
    certificates: bool,
    /// The default revision's templates generator.
    templates: &'a str,
    /// The revisions' components (and their templates'), and any added by hand.
    components: &'a [String],
    namespace: &'a str,
    image: Option<&'a str>,
    /// The patches for an older cluster.
    older_cluster: Option<&'a str>,
}

impl Overlay<'_> {
    fn kustomization(&self) -> String {
        let mut text = format!(
            "{GENERATED} Deploy with `kubectl apply -k` on this directory.\napiVersion: \
             kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n",
            self.base
        );
        if self.certificates {
            text.push_str(&format!(
                r#"secretGenerator:
  - name: {secret}
    namespace: {namespace}
    type: kubernetes.io/tls
    files: [tls.crt, tls.key]
    options:
      # The injector reloads a renewed certificate from the mounted Secret: no rollout, no hash suffix.
      disableNameSuffixHash: true
"#,
                secret = names::TLS_SECRET,
                namespace = self.namespace,
            ));
        }
        text.push_str(&format!(
            "# Your templates: the files of {dir}/, deployed as the ConfigMap {configmap} in place of the\n# shipped \
             ones. Edit them there, run `sidecar-injector check` on this directory, then `kubectl apply -k` it.\n# A file \
             added there is deployed once listed below: `certs` run again lists every file (`check` says when\n# one \
             is not).\n\
             configMapGenerator:\n{generator}",
            dir = overlay::TEMPLATES_DIR,
            configmap = names::TEMPLATES_CONFIGMAP,
            generator = self.templates,
        ));
        if self.certificates {
            text.push_str(
                "# A revision's component needs the caBundle in its webhooks: add it with `sidecar-injector certs --revision NAME`,\n\
                 # or add it under `components:` here and run `certs` again, which keeps it and patches its webhooks.\n\
                 patches:\n  - path: webhook-ca-patch.yaml\n",
            );
            text.push_str(self.older_cluster.unwrap_or(""));
        } else if let Some(older) = self.older_cluster {
            text.push_str("patches:\n");
            text.push_str(older);
        }
        if !self.components.is_empty() {
            text.push_str("components:\n");
            for component in self.components {
                text.push_str(&format!("  - {component}\n"));
            }
        }
        if let Some(image) = self.image {
            text.push_str(&format!("images:\n  - name: {}\n", names::IMAGE));
            text.push_str(&image_fields(image));
        }
        text
    }
}

/// `newName`, and `newTag` or `digest`, of an image reference (`registry:5000/name:tag`, `name@sha256:...`),
/// quoted so that a tag such as `1.20` stays a string.
fn image_fields(image: &str) -> String {
    let field = |key: &str, value: &str| format!("    {key}: {}\n", serde_json::Value::from(value));
    if let Some((name, digest)) = image.split_once('@') {
        return field("newName", name) + &field("digest", digest);
    }
    let last_segment = image.rfind('/').map_or(0, |slash| slash + 1);
    match image[last_segment..].rfind(':') {
        Some(colon) => {
            let (name, tag) = image.split_at(last_segment + colon);
            field("newName", name) + &field("newTag", &tag[1..])
        }
        None => field("newName", image),
    }
}

/// How the overlay in `out` refers to `base`: a local kustomize base as a path relative to `out` (which need not
/// exist yet), a remote one as given.
fn base_reference(base: &str, out: &Path) -> Result<String, CliError> {
    let config = |reason: String| CliError::Config(format!("--base {base}: {reason}"));
    let path = Path::new(base);
    if !path.is_dir() {
        if base.contains("://") || base.starts_with("github.com/") {
            return Ok(base.to_owned());
        }
        return Err(config("no such directory (run from the repository, or give a path or URL)".into()));
    }
    if !["kustomization.yaml", "kustomization.yml", "Kustomization"].iter().any(|f| path.join(f).is_file()) {
        return Err(config("not a kustomize base (no kustomization.yaml)".into()));
    }
    let base = path.canonicalize().map_err(|e| config(e.to_string()))?;
    let out = canonical_to_be(out).map_err(|e| config(format!("{}: {e}", out.display())))?;
    let relative =
        pathdiff::diff_paths(&base, &out).ok_or_else(|| config(format!("cannot be reached from {}", out.display())))?;
    Ok(relative.to_string_lossy().into_owned())
}

/// The component of `revision`, `revision-NAME` beside the base, as the overlay refers to it (`reference` being
/// the base's reference from the overlay); a local one must exist.
fn revision_component(base: &str, reference: &str, revision: &str) -> Result<String, CliError> {
    if let Some(problem) = sidecar_injector_core::validation::dns1123_label(revision).into_iter().next() {
        return Err(CliError::Config(format!("--revision {revision:?}: {problem}")));
    }
    let sibling = |path: &str| -> String {
        let parent = path.trim_end_matches('/').rsplit_once('/').map_or("", |(parent, _)| parent);
        if parent.is_empty() { format!("revision-{revision}") } else { format!("{parent}/revision-{revision}") }
    };
    let local = Path::new(base);
    if local.is_dir() {
        let component = local.join("..").join(format!("revision-{revision}"));
        if !component.join("kustomization.yaml").is_file() {
            return Err(CliError::Config(format!(
                "--revision {revision}: no component {} (copy manifests/revision-canary and rename it)",
                component.display()
            )));
        }
    }
    Ok(sibling(reference))
}

/// The canonical path `path` has, or will have once created: its nearest existing ancestor resolved, the rest
/// appended.
fn canonical_to_be(path: &Path) -> std::io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    let mut missing = Vec::new();
    let mut existing = absolute.as_path();
    while !existing.exists() {
        missing.push(existing.file_name().unwrap_or_default().to_owned());
        existing = existing.parent().unwrap_or(Path::new("/"));
    }
    let mut resolved = existing.canonicalize()?;
    resolved.extend(missing.iter().rev());
    Ok(resolved)
}

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| CliError::Config(format!("{}: {e}", path.display())))
}

/// Writes `contents`; a private key is created readable by its owner only.
fn write(path: &Path, contents: &str, private: bool) -> Result<(), CliError> {
    use std::io::Write;
    let error = |e: std::io::Error| CliError::Config(format!("{}: {e}", path.display()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        if private {
            options.mode(0o600);
            // `mode` applies to a new file only; an existing one is narrowed before the key is written to it.
            if path.exists() {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(error)?;
            }
        }
    }
    options.open(path).and_then(|mut file| file.write_all(contents.as_bytes())).map_err(error)
}

#[cfg(test)]
mod tests {
    use super::image_fields;

    #[test]
    fn image_references_split_into_kustomize_fields() {
        assert_eq!(image_fields("sidecar-injector:dev"), "    newName: \"sidecar-injector\"\n    newTag: \"dev\"\n");
        assert_eq!(image_fields("registry:5000/team/injector"), "    newName: \"registry:5000/team/injector\"\n");
        assert_eq!(
            image_fields("registry:5000/team/injector:1.20"),
            "    newName: \"registry:5000/team/injector\"\n    newTag: \"1.20\"\n"
        );
        assert_eq!(image_fields("ghcr.io/x@sha256:abc"), "    newName: \"ghcr.io/x\"\n    digest: \"sha256:abc\"\n");
    }
}
