//! Issue 50: the user's templates live in the overlay `certs` writes, so that a renewal, an upgrade or a GitOps
//! sync deploys them and never the shipped ones over them. What `certs` writes and keeps, and what `check` says
//! about an overlay; `kubectl kustomize` of the result is judged in tests/suite/manifests.rs and on the API server in
//! tests/e2e.rs.

use crate::common;

use std::path::Path;

use common::run;
use sidecar_injector_core::template::SHIPPED;

const BASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/base");

fn code(output: &std::process::Output) -> i32 {
    output.status.code().expect("the binary exited (no signal)")
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `certs` on `out` with `extra` flags; it must succeed.
fn certs(out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["certs", "--out", out.to_str().unwrap(), "--base", BASE];
    args.extend(extra);
    let output = run(&args, "");
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    stderr(&output)
}

/// The files a kustomization's template generator lists, in order.
fn listed(kustomization: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(kustomization).unwrap();
    let document = &sidecar_injector_core::offline::read_documents(&text).unwrap()[0];
    let generator = &document["configMapGenerator"][0];
    assert_eq!(generator["behavior"], "replace", "it replaces the shipped ConfigMap: {text}");
    assert_eq!(generator["options"]["disableNameSuffixHash"], true, "the name the Deployment mounts: {text}");
    generator["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_owned()).collect()
}

fn shipped_listing() -> Vec<String> {
    SHIPPED.iter().map(|(file, _)| format!("templates/{file}")).collect()
}

#[test]
fn the_shipped_templates_are_the_files_of_templates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
    let mut files: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    let shipped: Vec<&str> = SHIPPED.iter().map(|(file, _)| *file).collect();
    assert_eq!(files, shipped, "a template added to templates/ is added to template::SHIPPED");
    for (file, source) in SHIPPED {
        assert_eq!(std::fs::read_to_string(dir.join(file)).unwrap(), *source, "{file}");
    }
}

/// The first run seeds `templates/` with the shipped templates and lists them; the user's edits and additions
/// survive every later run (the README's renewal), which lists every file; `--templates-from` never overwrites.
#[test]
fn certs_seeds_the_templates_once_then_keeps_and_lists_the_users() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("my-injector");
    let said = certs(&out, &[]);
    assert!(said.contains("seeded") && said.contains("the shipped templates"), "{said}");
    for (file, source) in SHIPPED {
        assert_eq!(std::fs::read_to_string(out.join("templates").join(file)).unwrap(), *source, "{file}");
    }
    assert_eq!(listed(&out.join("kustomization.yaml")), shipped_listing());

    // The user's edit and a template of their own.
    let demo = out.join("templates/demo.yaml");
    let edited = std::fs::read_to_string(&demo).unwrap().replace("  port: 15000\n", "  port: 15000\n  mine: 1\n");
    std::fs::write(&demo, &edited).unwrap();
    std::fs::write(out.join("templates/mine.yaml"), SHIPPED[1].1.replace("demo-sidecar", "mine-sidecar")).unwrap();
    let said = certs(&out, &[]);
    assert!(said.contains("keeping the CA"), "{said}");
    assert!(said.contains("keeping the templates in") && said.contains("(6 files"), "{said}");
    assert!(said.contains("demo.yaml (changed)"), "names the shipped templates that differ: {said}");
    assert_eq!(std::fs::read_to_string(&demo).unwrap(), edited, "the edit is kept");
    let mut expected = shipped_listing();
    expected.push("templates/mine.yaml".into());
    expected.sort();
    assert_eq!(listed(&out.join("kustomization.yaml")), expected, "every file is listed");

    // Seeding from a directory is for a new overlay only.
    let templates = concat!(env!("CARGO_MANIFEST_DIR"), "/templates");
    let output = run(&["certs", "--out", out.to_str().unwrap(), "--base", BASE, "--templates-from", templates], "");
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("never overwrites"), "{}", stderr(&output));
    assert_eq!(std::fs::read_to_string(&demo).unwrap(), edited);
}

/// A user who kept templates of their own (the old README's `kubectl create configmap --from-file=my-templates/`)
/// seeds a new overlay with them; an overlay of an older `certs`, without a templates directory, is seeded with a
/// warning that applying it replaces the ConfigMap in the cluster.
#[test]
fn templates_from_a_directory_and_an_older_overlay_warned() {
    let dir = tempfile::tempdir().unwrap();
    let mine = dir.path().join("my-templates");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("default.yaml"), SHIPPED[0].1).unwrap();
    std::fs::write(mine.join("mine.yaml"), SHIPPED[1].1).unwrap();
    std::fs::write(mine.join("README.md"), "not a template").unwrap();
    let out = dir.path().join("my-injector");
    let said = certs(&out, &["--templates-from", mine.to_str().unwrap()]);
    assert!(said.contains(&format!("with {}", mine.display())), "{said}");
    assert_eq!(listed(&out.join("kustomization.yaml")), ["templates/default.yaml", "templates/mine.yaml"]);
    assert!(!out.join("templates/README.md").exists(), "only template files are copied");

    // An empty directory is refused before anything is written.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let absent = dir.path().join("absent");
    let output = run(
        &["certs", "--out", absent.to_str().unwrap(), "--base", BASE, "--templates-from", empty.to_str().unwrap()],
        "",
    );
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(stderr(&output).contains("no template files"), "{}", stderr(&output));
    assert!(!absent.exists());

    // An overlay without a templates directory (written before issue 50).
    std::fs::remove_dir_all(out.join("templates")).unwrap();
    let said = certs(&out, &[]);
    assert!(said.contains("warning: this overlay had no templates directory"), "{said}");
}

/// A revision's templates: a component of the overlay's own, after the revision's, seeded with a copy of the
/// default revision's templates (the user's, not the shipped ones), kept and listed like them.
#[test]
fn a_revision_gets_its_own_templates_seeded_from_the_default_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("my-injector");
    certs(&out, &[]);
    std::fs::write(out.join("templates/mine.yaml"), SHIPPED[1].1).unwrap();
    certs(&out, &["--revision", "canary"]);
    let component = out.join("revisions/canary");
    assert!(component.join("templates/mine.yaml").is_file(), "a copy of the default revision's templates");
    let text = std::fs::read_to_string(component.join("kustomization.yaml")).unwrap();
    assert!(text.contains("kind: Component") && text.contains("name: sidecar-injector-templates-canary"), "{text}");
    let kustomization = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    let components: Vec<&str> = kustomization
        .lines()
        .skip_while(|l| *l != "components:")
        .skip(1)
        .take_while(|l| l.starts_with("  - "))
        .collect();
    assert_eq!(components.len(), 2, "{kustomization}");
    assert!(components[0].ends_with("manifests/revision-canary"), "the revision first: {kustomization}");
    assert_eq!(components[1], "  - revisions/canary", "then its templates, which replace its ConfigMap");

    // Renewed without --revision: kept, listed once, and its edits survive.
    std::fs::write(component.join("templates/canary-only.yaml"), SHIPPED[1].1).unwrap();
    certs(&out, &[]);
    let again = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    assert_eq!(again, kustomization, "the same overlay");
    assert!(listed(&component.join("kustomization.yaml")).contains(&"templates/canary-only.yaml".to_owned()));
    assert!(!out.join("templates/canary-only.yaml").exists());
}

/// `--cert-manager`: the overlay alone, on manifests/cert-manager, with the same templates home; kept by a later
/// run without the flag.
#[test]
fn certs_for_cert_manager_writes_the_overlay_without_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("my-injector");
    let base = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/cert-manager");
    let output = run(&["certs", "--cert-manager", "--out", out.to_str().unwrap(), "--base", base], "");
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let names = |out: &Path| -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    };
    assert_eq!(names(&out), ["kustomization.yaml", "templates"]);
    let text = std::fs::read_to_string(out.join("kustomization.yaml")).unwrap();
    assert!(text.contains("manifests/cert-manager") && !text.contains("secretGenerator"), "{text}");
    assert_eq!(listed(&out.join("kustomization.yaml")), shipped_listing());
    // Run again without the flag: still cert-manager's (no certificate written).
    let output = run(&["certs", "--out", out.to_str().unwrap(), "--base", base, "--image", "injector:2"], "");
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    assert_eq!(names(&out), ["kustomization.yaml", "templates"]);
}

/// `check` on an overlay checks each revision's templates and that the kustomization lists every template file:
/// a file `kubectl apply -k` would leave out is a refusal naming it, not a template that silently never arrives.
#[test]
fn check_refuses_a_template_the_overlay_would_not_deploy() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("my-injector");
    certs(&out, &["--revision", "canary"]);
    let check = |path: &Path| run(&["check", path.to_str().unwrap()], "");
    let output = check(&out);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("my-injector/templates: set") && stdout.contains("revisions/canary/templates: set"));

    for templates in [out.join("templates"), out.join("revisions/canary/templates")] {
        std::fs::write(templates.join("mine.yaml"), SHIPPED[1].1).unwrap();
        for path in [&out, &templates] {
            let output = check(path);
            assert_eq!(code(&output), 1, "{}", stderr(&output));
            let said = stderr(&output);
            assert!(said.contains("mine.yaml: not in the files of") && said.contains("would leave it out"), "{said}");
            assert!(said.contains(&format!("certs --out {}", out.display())), "{said}");
        }
        std::fs::remove_file(templates.join("mine.yaml")).unwrap();
    }
    // A listed file that is gone: `kubectl apply -k` would fail.
    std::fs::remove_file(out.join("templates/demo.yaml")).unwrap();
    let output = check(&out);
    assert_eq!(code(&output), 1);
    assert!(stderr(&output).contains("demo.yaml: listed by"), "{}", stderr(&output));
    // A template directory outside an overlay is checked as before.
    let output = check(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/templates")));
    assert_eq!(code(&output), 0, "{}", stderr(&output));
}

/// A `kustomization.yaml` that `certs` did not write (the old README's cert-manager overlay, written by hand) is
/// refused, not replaced by a self-signed overlay; `--new-ca` on a cert-manager overlay is refused; an existing
/// but empty templates directory is refused (its ConfigMap would stop every replica at start).
#[test]
fn certs_refuses_what_it_would_silently_lose() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("by-hand");
    std::fs::create_dir(&out).unwrap();
    let by_hand = "resources: [../manifests/cert-manager]\nimages:\n  - name: x\n    newTag: dev\n";
    std::fs::write(out.join("kustomization.yaml"), by_hand).unwrap();
    let output = run(&["certs", "--out", out.to_str().unwrap(), "--base", BASE], "");
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(stderr(&output).contains("not written by `sidecar-injector certs`"), "{}", stderr(&output));
    assert_eq!(std::fs::read_to_string(out.join("kustomization.yaml")).unwrap(), by_hand);
    assert!(!out.join("templates").exists() && !out.join("ca.key").exists());

    let cert_manager = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/cert-manager");
    let out = dir.path().join("cert-manager");
    let output = run(&["certs", "--cert-manager", "--out", out.to_str().unwrap(), "--base", cert_manager], "");
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let output = run(&["certs", "--new-ca", "--out", out.to_str().unwrap(), "--base", cert_manager], "");
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(stderr(&output).contains("cert-manager's"), "{}", stderr(&output));

    let out = dir.path().join("emptied");
    certs(&out, &["--revision", "canary"]);
    let canary = out.join("revisions/canary/templates");
    for entry in std::fs::read_dir(&canary).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let output = run(&["certs", "--out", out.to_str().unwrap(), "--base", BASE], "");
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(stderr(&output).contains("no template files"), "{}", stderr(&output));
}
