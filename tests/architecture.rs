//! The module graph has floors and no circle: each of the crate's top-level modules imports only from the floors
//! below its own, as docs/architecture.md lists them (the one place the order is written; this test reads it).
//!
//! Imports are read from the source as `crate::…` paths (in `use` lines and in code, groups included; a name the
//! crate root re-exports counts as its module), outside comments and unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MARKER: &str = "<!-- module floors, lowest first -->";

/// The floors as docs/architecture.md lists them: one line of module names each, lowest first.
fn floors() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let after = doc.split_once(MARKER).unwrap_or_else(|| panic!("docs/architecture.md has no {MARKER}")).1;
    let block = after.trim_start().strip_prefix("```text\n").expect("a text block after the marker");
    let block = block.split_once("\n```").unwrap().0;
    block
        .lines()
        .map(|line| line.split_once(':').map_or(line, |(_, names)| names))
        .map(|names| names.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments and without its unit tests (`tests.rs`, `#[cfg(test)] mod tests`).
fn code(path: &Path) -> String {
    if path.file_name().is_some_and(|n| n == "tests.rs") || path.components().any(|c| c.as_os_str() == "tests") {
        return String::new();
    }
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    text.lines().map(|line| line.split_once("//").map_or(line, |(code, _)| code)).collect::<Vec<_>>().join("\n")
}

/// The first names of the paths after each `crate::` in `code`: `crate::a::b` gives `a`, `crate::{a, b::c}` gives
/// `a` and `b`.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let (mut depth, mut item) = (0, String::new());
                for ch in group.chars() {
                    match ch {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            names.push(ident(&item));
                            item.clear();
                            continue;
                        }
                        _ => {}
                    }
                    item.push(ch);
                }
                names.push(ident(&item));
            }
            None => names.push(ident(rest)),
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

/// The names `src/lib.rs` re-exports (`pub use module::{A, B}`), with their module.
fn root_reexports() -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(Path::new(ROOT).join("src/lib.rs")).unwrap();
    let mut names = BTreeMap::new();
    for statement in lib.split(';').filter_map(|s| s.trim().strip_prefix("pub use ")) {
        let Some((module, items)) = statement.split_once("::") else { continue };
        for item in items.trim_matches(|c: char| c == '{' || c == '}' || c.is_whitespace()).split(',') {
            let item = item.trim();
            if !item.is_empty() {
                names.insert(item.to_owned(), module.to_owned());
            }
        }
    }
    names
}

/// Each top-level module of `src/` and the top-level modules its code names.
fn imports() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let src = Path::new(ROOT).join("src");
    let reexports = root_reexports();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let imported = graph.entry(module.clone()).or_default();
        for name in crate_paths(&code(&file)) {
            let target = reexports.get(&name).cloned().unwrap_or(name);
            if target != module {
                imported.entry(target).or_default().insert(relative.display().to_string());
            }
        }
    }
    graph
}

#[test]
fn every_module_imports_only_from_the_floors_below_it() {
    let floors = floors();
    let floor_of: BTreeMap<&str, usize> =
        floors.iter().enumerate().flat_map(|(i, names)| names.iter().map(move |n| (n.as_str(), i))).collect();
    let graph = imports();
    let unplaced: Vec<&String> = graph.keys().filter(|m| !floor_of.contains_key(m.as_str())).collect();
    assert!(unplaced.is_empty(), "modules docs/architecture.md does not place on a floor: {unplaced:?}");
    let gone: Vec<&&str> = floor_of.keys().filter(|m| !graph.contains_key(**m)).collect();
    assert!(gone.is_empty(), "docs/architecture.md places modules that do not exist: {gone:?}");
    let mut climbs = Vec::new();
    for (module, imported) in &graph {
        for (target, files) in imported {
            // Names that are not modules (`crate::SomeMacro`) are not the graph's concern.
            let Some(&to) = floor_of.get(target.as_str()) else { continue };
            if to >= floor_of[module.as_str()] {
                climbs.push(format!("{module} imports {target} (in {files:?})"));
            }
        }
    }
    assert!(climbs.is_empty(), "imports from the same floor or a floor above:\n{}", climbs.join("\n"));
}

#[test]
fn the_reader_of_imports_sees_groups_nested_paths_and_reexports() {
    let code = "use crate::{a, b::{C, D}, e::f};\nfn x() { crate::g::h(); crate::Engine::new(); }";
    assert_eq!(crate_paths(code), ["a", "b", "e", "g", "Engine"]);
    assert_eq!(root_reexports().get("Engine").map(String::as_str), Some("engine"));
    assert!(code_of_comment_is_ignored());
}

fn code_of_comment_is_ignored() -> bool {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(&file, "// crate::hidden\nuse crate::seen; // crate::also_hidden\n").unwrap();
    crate_paths(&code(&file)) == ["seen"]
}
