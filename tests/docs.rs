//! The documentation's tables are checked against the code that defines what they describe, so they cannot drift:
//! `serve`'s flags and defaults (clap), and the metrics the server registers.

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
