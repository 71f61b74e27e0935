//! The user's templates in the overlay `certs` writes: their one home, kept where GitOps keeps them.
//!
//! ```text
//! OVERLAY/kustomization.yaml            configMapGenerator: sidecar-injector-templates, from templates/
//! OVERLAY/templates/                    the default revision's templates (seeded with the shipped ones)
//! OVERLAY/revisions/NAME/kustomization.yaml   a component: sidecar-injector-templates-NAME, from templates/
//! OVERLAY/revisions/NAME/templates/           the revision's templates (seeded with a copy of the default's)
//! ```
//!
//! Each generator replaces the ConfigMap of the same name that the base (or a revision's component) ships, keeps
//! its name (no hash suffix: the Deployment mounts it, its Role reads it, and the replicas reload an edit without a
//! rollout) and its labels. Renewals and upgrades apply the same overlay, so they keep the user's templates by
//! construction. A revision's generator lives in a component of its own because kustomize runs an overlay's
//! generators before its components, which bring the ConfigMap it replaces.
//!
//! Kustomize takes a generator's files one by one, never a directory: `certs` lists every template file of a
//! directory each time it runs, and [`Home::listing_problem`] (run by `check`) finds a file the listing lacks,
//! which `kubectl apply -k` would otherwise leave out without a word.

use std::path::{Path, PathBuf};

use super::CliError;
use super::names;
use sidecar_injector_core::SetSources;

/// The directory of a revision's templates, beside the kustomization that lists them.
pub const TEMPLATES_DIR: &str = "templates";
/// Where the components of the named revisions' templates live in an overlay: `revisions/NAME`.
pub const REVISIONS_DIR: &str = "revisions";

/// One revision's templates in an overlay: the directory holding them and the kustomization listing them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    /// `None` for the default revision (listed by the overlay's own kustomization), or the revision's name.
    pub revision: Option<String>,
    /// The directory of the kustomization: the overlay, or `OVERLAY/revisions/NAME`.
    pub root: PathBuf,
}

impl Home {
    /// The default revision's home in `overlay`.
    pub fn default_revision(overlay: &Path) -> Home {
        Home { revision: None, root: overlay.to_owned() }
    }

    /// The home of the revision `name` in `overlay`.
    pub fn revision(overlay: &Path, name: &str) -> Home {
        Home { revision: Some(name.to_owned()), root: overlay.join(REVISIONS_DIR).join(name) }
    }

    /// Every home an overlay has: the default revision's, then each revision's that has a component in it.
    pub fn all(overlay: &Path) -> Vec<Home> {
        let mut homes = vec![Home::default_revision(overlay)];
        let mut revisions: Vec<String> = std::fs::read_dir(overlay.join(REVISIONS_DIR))
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| overlay.join(REVISIONS_DIR).join(name).join("kustomization.yaml").is_file())
            .collect();
        revisions.sort();
        homes.extend(revisions.iter().map(|name| Home::revision(overlay, name)));
        homes
    }

    /// The home whose templates directory is `dir`, if `dir` is one: named `templates`, beside a kustomization
    /// that generates a template ConfigMap from it.
    pub fn of_templates_dir(dir: &Path) -> Option<Home> {
        if dir.file_name()? != TEMPLATES_DIR {
            return None;
        }
        let root = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let generator = Generator::read(&root.join("kustomization.yaml"))?;
        let revision = generator.name.strip_prefix(names::TEMPLATES_CONFIGMAP)?;
        let revision = revision.strip_prefix('-').map(str::to_owned);
        Some(Home { revision, root: root.to_owned() })
    }

    /// The templates directory.
    pub fn dir(&self) -> PathBuf {
        self.root.join(TEMPLATES_DIR)
    }

    /// The ConfigMap its generator makes: the base's `sidecar-injector-templates`, or `...-NAME` of a revision's
    /// component.
    pub fn config_map(&self) -> String {
        match &self.revision {
            None => names::TEMPLATES_CONFIGMAP.to_owned(),
            Some(name) => format!("{}-{name}", names::TEMPLATES_CONFIGMAP),
        }
    }

    /// The component the overlay lists for a revision's home, relative to the overlay: `revisions/NAME`.
    pub fn component(&self) -> Option<String> {
        self.revision.as_ref().map(|name| format!("{REVISIONS_DIR}/{name}"))
    }

    /// The files `kubectl apply -k` puts into the ConfigMap: the directory's templates and values file, by
    /// name, sorted.
    pub fn files(&self) -> Result<Vec<String>, CliError> {
        Ok(template_files(&self.dir())?.into_iter().map(|(file, _)| file).collect())
    }

    /// The files to seed the directory with, by name, sorted, if it does not exist yet: those of `from`;
    /// `None` when it exists (it is the user's). Read now, written later, so that a run that fails writes nothing.
    pub fn seed(&self, from: Seed<'_>) -> Result<Option<Vec<(String, String)>>, CliError> {
        let dir = self.dir();
        if dir.exists() {
            if !dir.is_dir() {
                return Err(CliError::Config(format!("{}: not a directory", dir.display())));
            }
            return Ok(None);
        }
        let mut files = match from {
            Seed::Shipped => sidecar_injector_core::template::SHIPPED
                .iter()
                .map(|(file, source)| (file.to_string(), source.to_string()))
                .collect(),
            Seed::Dir(source) => read_template_files(source)?,
            Seed::Files(files) => files.to_vec(),
        };
        files.sort();
        Ok(Some(files))
    }

    /// The `configMapGenerator` entry that makes its ConfigMap from `files` (in the templates directory).
    pub fn generator(&self, namespace: &str, files: &[String]) -> String {
        let mut text =
            format!("  - name: {}\n    namespace: {namespace}\n    behavior: replace\n    files:\n", self.config_map());
        for file in files {
            text.push_str(&format!("      - {TEMPLATES_DIR}/{file}\n"));
        }
        text.push_str(
            "    options:\n      # A stable name: the Deployment mounts it and its Role reads it by name; the replicas reload an\n      \
             # edit within seconds, without a rollout.\n      disableNameSuffixHash: true\n",
        );
        text
    }

    /// A revision's component: the kustomization in `revisions/NAME` with its generator.
    pub fn component_kustomization(&self, namespace: &str, files: &[String]) -> String {
        let name = self.revision.as_deref().unwrap_or_default();
        format!(
            "# Generated by `sidecar-injector certs`: the templates of the revision {name}, the files of {TEMPLATES_DIR}/ \
             beside this\n# file. Edit them there, run `sidecar-injector check` on the overlay, then `kubectl apply -k` \
             it. A file\n# added there is deployed once listed below: `certs` run again lists every file (`check` says \
             when one is not).\napiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nconfigMapGenerator:\n{}",
            self.generator(namespace, files)
        )
    }

    /// What its kustomization's generator lists, against what the directory holds: `None` when they agree, else
    /// a paragraph naming each file `kubectl apply -k` would leave out or could not find.
    pub fn listing_problem(&self) -> Result<Option<String>, CliError> {
        let kustomization = self.root.join("kustomization.yaml");
        let Some(generator) = Generator::read(&kustomization).filter(|g| g.name == self.config_map()) else {
            return Ok(None);
        };
        let files = self.files()?;
        let prefix = format!("{TEMPLATES_DIR}/");
        let listed: Vec<&str> = generator.files.iter().filter_map(|f| f.strip_prefix(&prefix)).collect();
        let unlisted: Vec<&String> = files.iter().filter(|f| !listed.contains(&f.as_str())).collect();
        let absent: Vec<&&str> = listed.iter().filter(|f| !files.iter().any(|file| file == **f)).collect();
        if unlisted.is_empty() && absent.is_empty() {
            return Ok(None);
        }
        let mut text = String::new();
        for file in unlisted {
            text.push_str(&format!(
                "  {}: not in the files of {}'s configMapGenerator: `kubectl apply -k` would leave it out of the \
                 ConfigMap {}\n",
                self.dir().join(file).display(),
                kustomization.display(),
                self.config_map()
            ));
        }
        for file in absent {
            text.push_str(&format!(
                "  {}: listed by {}, but no such template file: `kubectl apply -k` would fail\n",
                self.dir().join(file).display(),
                kustomization.display()
            ));
        }
        let overlay = match self.revision {
            Some(_) => self.root.parent().and_then(Path::parent).unwrap_or(&self.root),
            None => &self.root,
        };
        let overlay = if overlay.as_os_str().is_empty() { Path::new(".") } else { overlay };
        text.push_str(&format!(
            "  to list every template file: run `sidecar-injector certs --out {}` again (or edit `files:`)\n",
            overlay.display()
        ));
        Ok(Some(text))
    }
}

/// What a new templates directory is seeded with.
#[derive(Debug, Clone, Copy)]
pub enum Seed<'a> {
    /// The templates this release ships ([`sidecar_injector_core::template::SHIPPED`]).
    Shipped,
    /// The template files of a directory (`certs --templates-from`).
    Dir(&'a Path),
    /// These files, by name (a revision's, copied from the default revision's as seeded in the same run).
    Files(&'a [(String, String)]),
}

/// The template files of `dir` (templates and the values file), by name, with their contents; refused when
/// there are none.
pub fn read_template_files(dir: &Path) -> Result<Vec<(String, String)>, CliError> {
    let files = template_files(dir)?;
    if files.is_empty() {
        return Err(CliError::Config(format!("{}: no template files (NAME.yaml)", dir.display())));
    }
    Ok(files)
}

/// The template files of `dir` as the template set reads them (templates and the values file; hidden and other
/// files left out), by name, sorted, with their contents.
fn template_files(dir: &Path) -> Result<Vec<(String, String)>, CliError> {
    let sources = SetSources::read_dir(dir).map_err(|e| CliError::Config(e.to_string()))?;
    let files = sources.templates.into_iter().map(|(_, file, source)| (file, source)).chain(sources.values);
    let mut files: Vec<(String, String)> = files
        .filter_map(|(file, source)| Some((Path::new(&file).file_name()?.to_string_lossy().into_owned(), source)))
        .collect();
    files.sort();
    Ok(files)
}

/// A template ConfigMap's generator, as a kustomization declares it.
struct Generator {
    name: String,
    /// Its `files`, each as the path it reads (a `KEY=PATH` entry's path).
    files: Vec<String>,
}

impl Generator {
    /// The first generator of a template ConfigMap in the kustomization at `path`, if it has one.
    fn read(path: &Path) -> Option<Generator> {
        let text = std::fs::read_to_string(path).ok()?;
        let kustomization: serde_json::Value = serde_saphyr::from_str(&text).ok()?;
        let generators = kustomization["configMapGenerator"].as_array()?;
        let generator = generators
            .iter()
            .find(|g| g["name"].as_str().is_some_and(|name| name.starts_with(names::TEMPLATES_CONFIGMAP)))?;
        let files = generator["files"].as_array().into_iter().flatten().filter_map(serde_json::Value::as_str);
        let files = files.map(|entry| entry.split_once('=').map_or(entry, |(_, path)| path).to_owned()).collect();
        Some(Generator { name: generator["name"].as_str()?.to_owned(), files })
    }
}
