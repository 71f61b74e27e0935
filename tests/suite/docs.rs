//! The documentation's tables are checked against the code that defines what they describe, so they cannot drift:
//! `serve`'s flags and defaults (clap), the metrics the server registers, and the exit codes the docs promise
//! (run against the binary).

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use clap::CommandFactory;
use sidecar_injector::cli::Cli;

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

/// The rows of the flag table in docs/operations.md: the flags the first cell names, and the default cell.
fn flag_rows() -> Vec<(Vec<String>, String)> {
    let doc = read("docs/operations.md");
    let table = doc.split("| flag | default |").nth(1).expect("docs/operations.md has the flag table");
    table
        .lines()
        .skip(2) // the header's end and the separator row
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let flags = cells[1]
                .split('`')
                .skip(1)
                .step_by(2)
                .filter_map(|flag| flag.split_whitespace().next())
                .map(str::to_owned)
                .collect();
            (flags, cells[2].to_owned())
        })
        .collect()
}

/// The values a default cell shows: what is in backquotes, or the whole cell.
fn shown_defaults(cell: &str) -> Vec<String> {
    let quoted: Vec<String> = cell.split('`').skip(1).step_by(2).map(str::to_owned).collect();
    if quoted.is_empty() { vec![cell.to_owned()] } else { quoted }
}

#[test]
fn the_flag_table_lists_every_serve_flag_with_its_default() {
    let cli = Cli::command();
    let serve = cli.find_subcommand("serve").expect("a serve subcommand");
    let flags: Vec<(String, Vec<String>)> = serve
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            let defaults = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            Some((format!("--{long}"), defaults))
        })
        .filter(|(long, _)| long != "--help" && long != "--version")
        .collect();
    let rows = flag_rows();
    let documented: BTreeSet<&str> = rows.iter().flat_map(|(flags, _)| flags.iter().map(String::as_str)).collect();
    let defined: BTreeSet<&str> = flags.iter().map(|(long, _)| long.as_str()).collect();
    assert_eq!(documented, defined, "the flag table of docs/operations.md and `serve --help` differ");
    for (names, cell) in &rows {
        let shown = shown_defaults(cell);
        for (i, name) in names.iter().enumerate() {
            let (_, defaults) = flags.iter().find(|(long, _)| long == name).unwrap();
            if defaults.is_empty() {
                continue; // no default, or one computed at run time: the cell says so in words
            }
            let shown = shown.get(i).or(shown.last()).unwrap();
            assert_eq!(shown, &defaults.join(","), "{name}: the table's default is not clap's");
        }
    }
}

#[test]
fn the_documented_metrics_are_the_registered_ones() {
    let names = |text: &str, quoted: bool| -> BTreeSet<String> {
        let prefix = if quoted { "\"sidecar_injector_" } else { "sidecar_injector_" };
        text.match_indices(prefix)
            .map(|(at, _)| {
                let name = &text[at + usize::from(quoted)..];
                let end = name.find(|c: char| !(c.is_ascii_lowercase() || c == '_')).unwrap_or(name.len());
                name[..end].to_owned()
            })
            .collect()
    };
    let mut registered = BTreeSet::new();
    for file in ["src/server/telemetry.rs", "src/server/reload.rs"] {
        registered.extend(names(&read(file), true));
    }
    assert!(registered.len() >= 10, "found the registered metrics: {registered:?}");
    let documented = names(&read("docs/operations.md"), false);
    assert_eq!(documented, registered, "docs/operations.md and the metrics the server registers differ");
}

/// The exit-code statements of a document: the text from `marker` to the end of its paragraph, split into
/// `(code, what it says of that code)` at each code (`` `1` ``, or `1 ` after `: ` or `; ` in the help text).
fn exit_clauses(text: &str, marker: &str) -> Vec<(i32, String)> {
    // From the marker's last character, its colon: `Exit codes: 0 success` states 0.
    let start = text.find(marker).unwrap_or_else(|| panic!("the docs say {marker:?}")) + marker.len() - 1;
    let paragraph = &text[start..];
    let paragraph = &paragraph[..paragraph.find("\n\n").unwrap_or(paragraph.len())];
    // As one line: the help text is wrapped to the terminal.
    let paragraph = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut clauses: Vec<(i32, String)> = Vec::new();
    let mut rest = paragraph.as_str();
    loop {
        let next = (0..=2)
            .flat_map(|code| {
                [format!("`{code}`"), format!(": {code} "), format!("; {code} ")]
                    .into_iter()
                    .filter_map(move |token| rest.find(&token).map(|at| (at, token.len(), code)))
            })
            .min();
        let text_before = &rest[..next.map_or(rest.len(), |(at, _, _)| at)];
        if let Some(last) = clauses.last_mut() {
            last.1.push_str(text_before);
        }
        let Some((at, len, code)) = next else { break };
        clauses.push((code, String::new()));
        rest = &rest[at + len..];
    }
    clauses
}

/// The code a document gives for a situation it names by `phrase` (which must name it in one clause only).
fn documented_code(clauses: &[(i32, String)], phrase: &str, document: &str) -> i32 {
    let codes: Vec<i32> = clauses.iter().filter(|(_, text)| text.contains(phrase)).map(|(code, _)| *code).collect();
    assert_eq!(codes.len(), 1, "{document}: {phrase:?} is in one exit code's clause, not {codes:?}: {clauses:?}");
    codes[0]
}

/// Issue 35: every exit code the docs state (README's table, `--help`, docs/templates.md's `review` and `inject`)
/// is the one the binary exits with in the situation they name. docs/templates.md said `review` exits 1 for a
/// refused template; it exits 2, as README's table says of configuration (only `check` judges templates).
#[test]
fn the_documented_exit_codes_are_the_binarys() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "pod:\n  spec:\n    containers:\n      - { name: Proxy_Sidecar, image: x }\n").unwrap();
    let broken = broken.to_str().unwrap();
    let missing = dir.path().join("missing.json");
    let missing = missing.to_str().unwrap();
    let review = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/pod-create.json");
    let review_body = std::fs::read(review).unwrap();
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: a}]}\n";
    // (the situation, the command and its stdin)
    type Run<'a> = (&'a [&'a str], &'a [u8]);
    let check_refused: Run = (&["check", broken], b"");
    let review_broken_template: Run = (&["review", "-f", review, "--template", broken], b"");
    let inject_broken_template: Run = (&["inject", "-f", "-", "--template", broken], manifest.as_bytes());
    let not_a_review: Run = (&["review"], b"{not json");
    let not_yaml: Run = (&["inject", "-f", "-"], b"a: [1\n");
    // Issue 38: a pod template the template fails to render for (it reads a label the pod lacks) is not injected.
    let unlabelled = dir.path().join("unlabelled.yaml");
    let reads_app =
        "pod:\n  spec:\n    containers:\n      - { name: side, image: x, args: [\"{{ pod.labels.app }}\"] }\n";
    std::fs::write(&unlabelled, reads_app).unwrap();
    let unlabelled = unlabelled.to_str().unwrap();
    let not_injected: Run = (&["inject", "-f", "-", "--template", unlabelled], manifest.as_bytes());
    let pod_refused: Run = (&["review", "--validate"], &review_body);
    let unknown_flag: Run = (&["review", "--no-such-flag"], b"");
    let unreadable: Run = (&["review", "-f", missing], b"");
    let answered: Run = (&["review", "-f", review], b"");
    let help = common::run(&["--help"], "");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let templates = read("docs/templates.md");
    let review_section = &templates[templates.find("## `review`").unwrap()..];
    let inject_section = &templates[templates.find("## `inject`").unwrap()..];
    // (the document, its exit-code clauses, the situations it names)
    type Document<'a> = (&'a str, Vec<(i32, String)>, Vec<(&'a str, Run<'a>)>);
    let documents: [Document; 4] = [
        (
            "README.md",
            exit_clauses(&read("README.md"), "Exit codes, for scripts:"),
            vec![
                ("success", answered),
                ("`check` refused a template", check_refused),
                ("refused a pod", pod_refused),
                ("the input is not a review", not_a_review),
                ("not YAML", not_yaml),
                ("`inject` could not inject", not_injected),
                ("unknown flag", unknown_flag),
                ("unreadable file", unreadable),
                ("a template that does not load", review_broken_template),
                ("a template that does not load", inject_broken_template),
            ],
        ),
        (
            "--help",
            exit_clauses(&help, "Exit codes:"),
            vec![
                ("success", answered),
                ("check refused a template", check_refused),
                ("refused a pod", pod_refused),
                ("the input is not a review", not_a_review),
                ("inject could not inject", not_injected),
                ("unknown flag", unknown_flag),
                ("a template that does not load", review_broken_template),
            ],
        ),
        (
            "docs/templates.md, review",
            exit_clauses(review_section, "Exit codes:"),
            vec![
                ("answered", answered),
                ("request or the pod was refused", not_a_review),
                ("request or the pod was refused", pod_refused),
                ("unknown flag", unknown_flag),
                ("unreadable file", unreadable),
                ("a template that does not load", review_broken_template),
            ],
        ),
        (
            "docs/templates.md, inject",
            exit_clauses(inject_section, "Exit codes:"),
            vec![
                ("YAML with its line", not_yaml),
                ("could not inject", not_injected),
                ("unknown flag", unknown_flag),
                ("a template that does not load", inject_broken_template),
            ],
        ),
    ];
    for (document, clauses, situations) in &documents {
        assert!(clauses.len() >= 3, "{document}: the exit codes 0, 1 and 2 are stated: {clauses:?}");
        for (phrase, (args, stdin)) in situations {
            let documented = documented_code(clauses, phrase, document);
            let ran = common::run(args, stdin).status.code().expect("the binary exited (no signal)");
            assert_eq!(
                ran,
                documented,
                "{document} says {phrase:?} exits {documented}; `{}` exits {ran}",
                args.join(" ")
            );
        }
    }
}

/// Issue 38: each subcommand's help describes its own flags in its own terms. The webhook's answer policies are
/// `serve`'s and `review`'s (which answers as the webhook does), not `inject`'s or `status`'s; `--template-dir`
/// speaks of reloading and of revisions' paths for `serve` only.
#[test]
fn each_subcommand_describes_only_its_own_flags() {
    let cli = Cli::command();
    let help_of = |command: &str, flag: &str| -> Option<String> {
        let sub = cli.find_subcommand(command).unwrap_or_else(|| panic!("a {command} subcommand"));
        let arg = sub.get_arguments().find(|a| a.get_long() == Some(flag))?;
        Some(arg.get_help().map(ToString::to_string).unwrap_or_default())
    };
    for policy in ["on-error", "unknown-template", "validation"] {
        for command in ["serve", "review"] {
            assert!(help_of(command, policy).is_some(), "{command} --{policy}");
        }
        for command in ["inject", "status"] {
            assert!(help_of(command, policy).is_none(), "{command} lists serve's --{policy}");
        }
    }
    let serve = help_of("serve", "template-dir").unwrap();
    assert!(serve.contains("reloaded when it changes") && serve.contains("/mutate/REVISION"), "{serve}");
    for command in ["review", "inject", "status"] {
        let help = help_of(command, "template-dir").unwrap();
        assert!(!help.contains("reload") && !help.contains("/mutate"), "{command}: {help}");
    }
    assert!(help_of("status", "template-dir").unwrap().contains("judged by the templates of the revision"));
}

/// The 16-hex-digit hash after `marker` at each place it occurs in `text`.
fn hashes_after<'t>(text: &'t str, marker: &str) -> Vec<&'t str> {
    text.match_indices(marker)
        .map(|(at, _)| &text[at + marker.len()..])
        .filter(|rest| rest.len() >= 16 && rest[..16].bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|rest| &rest[..16])
        .collect()
}

/// Issue 38: the hashes the docs show as the shipped templates' (`check templates`, the status annotation, the
/// validating webhook's refusal) are the ones `check templates` prints, so an edit of `templates/` that changes
/// them fails here until the docs say the new ones.
#[test]
fn the_documented_hashes_are_the_shipped_templates() {
    let output = common::run(&["check", "templates"], "");
    assert!(output.status.success());
    let check = String::from_utf8(output.stdout).unwrap();
    let set = hashes_after(&check, "templates: set ")[0];
    let version = |name: &str| hashes_after(&check, &format!("  {name}: version ")).first().copied();
    let templates = read("docs/templates.md");
    let operations = read("docs/operations.md");
    // (where, what the docs say, what it is)
    let mut shown: Vec<(String, &str, &str)> = Vec::new();
    for hash in hashes_after(&templates, "templates: set ") {
        shown.push(("docs/templates.md: check's set".into(), hash, set));
    }
    for hash in hashes_after(&templates, "\"set\":\"") {
        shown.push(("docs/templates.md: the status annotation's set".into(), hash, set));
    }
    for hash in hashes_after(&templates, "\"template\":\"default\",\"version\":\"") {
        shown.push(("docs/templates.md: the status annotation's version".into(), hash, version("default").unwrap()));
    }
    for hash in hashes_after(&operations, "template default (version ") {
        shown.push(("docs/operations.md: /validate's refusal".into(), hash, version("default").unwrap()));
    }
    for line in templates.lines().filter(|l| l.starts_with("  ") && l.contains(": version ")) {
        let name = line.trim_start().split(':').next().unwrap();
        let real = version(name).unwrap_or_else(|| panic!("docs/templates.md shows a template {name} the set lacks"));
        for hash in hashes_after(line, ": version ") {
            shown.push((format!("docs/templates.md: check's {name}"), hash, real));
        }
    }
    assert!(shown.len() >= 7, "the examples were found: {shown:?}");
    for (place, documented, real) in shown {
        assert_eq!(documented, real, "{place} shows {documented}; `sidecar-injector check templates` says {real}");
    }
}

/// Every reason a pod is admitted without the sidecar has its row in docs/templates.md's table, by the name the
/// metrics and `--explain` use; and the table names no reason the engine does not have.
#[test]
fn the_skip_table_lists_every_reason() {
    let doc = read("docs/templates.md");
    let documented: BTreeSet<&str> = doc
        .lines()
        .filter(|line| line.starts_with('|'))
        .filter_map(|line| line.trim_end_matches('|').rsplit('|').next())
        .filter_map(|cell| cell.trim().strip_prefix('`')?.strip_suffix('`'))
        .collect();
    let reasons: BTreeSet<&str> = sidecar_injector_core::SkipReason::ALL.iter().map(|r| r.as_str()).collect();
    let missing: Vec<_> = reasons.difference(&documented).collect();
    assert!(missing.is_empty(), "docs/templates.md's skip table lacks {missing:?}");
    let table_rows = doc.split("| skipped when |").nth(1).expect("the skip table").split("\n\n").next().unwrap();
    let unknown: Vec<_> = table_rows
        .lines()
        .skip(2)
        .filter_map(|line| line.trim_end_matches('|').rsplit('|').next())
        .filter_map(|cell| cell.trim().strip_prefix('`')?.strip_suffix('`'))
        .filter(|name| !reasons.contains(name))
        .collect();
    assert!(unknown.is_empty(), "docs/templates.md's skip table names reasons the engine lacks: {unknown:?}");
}
