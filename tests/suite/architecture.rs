//! The module graph has floors and no circle, between rooms as inside them:
//!
//! - each top-level module of the two crates (the core, `core/src`, and the process around it, `src`) imports only
//!   from the floors below its own, as docs/architecture.md lists them (the one place the order is written; this
//!   test reads it). The core cannot import the process at all: it does not depend on it, the compiler sees to it;
//! - inside each room (a module that is a directory, and the load harness's files), no file imports, through
//!   others, itself: a room's files have floors too. Its `mod.rs` is the room's door (it declares the files and
//!   re-exports their names), not a file of the room.
//!
//! Imports are read from the source as paths (`crate::…`, `sidecar_injector_core::…`, `super::…`, in `use` lines
//! and in code, groups included; a name a crate root or a room's door re-exports counts as its module's), outside
//! comments and unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MARKER: &str = "<!-- module floors, lowest first -->";
/// The core's source, and how the process names it.
const CORE: &str = "core/src";
const CORE_CRATE: &str = "sidecar_injector_core::";

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

/// The first names of the paths after each `prefix` in `code`: with `crate::`, `crate::a::b` gives `a`,
/// `crate::{a, b::c}` gives `a` and `b`.
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let ident = |s: &str| s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut names = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        // `crate::` inside `sidecar_injector_core::`, or `super::` inside `super::super::`, is another path.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
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
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

/// The names a module's door re-exports (`pub use module::{A, B}`, `pub(crate) use …`), with their module.
fn reexports(door: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(door).unwrap();
    let mut names = BTreeMap::new();
    for statement in text.split(';') {
        let starts =
            ["pub use ", "pub(crate) use ", "pub(super) use "].map(|p| statement.rfind(p).map(|at| at + p.len()));
        let Some(at) = starts.into_iter().flatten().max() else { continue };
        let statement = statement[at..].trim();
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

/// Each top-level module of the crate at `src` and the top-level modules (of either crate) its code names.
fn imports(src: &str) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let dir = Path::new(ROOT).join(src);
    let own = reexports(&dir.join("lib.rs"));
    let core = reexports(&Path::new(ROOT).join(CORE).join("lib.rs"));
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&dir).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let imported = graph.entry(module.clone()).or_default();
        let code = code(&file);
        let named = names_after(&code, "crate::").into_iter().map(|n| own.get(&n).cloned().unwrap_or(n));
        let in_core = names_after(&code, CORE_CRATE).into_iter().map(|n| core.get(&n).cloned().unwrap_or(n));
        for target in named.chain(in_core) {
            if target != module {
                imported.entry(target).or_default().insert(format!("{src}/{}", relative.display()));
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
    let mut graph = imports(CORE);
    let core_modules: BTreeSet<String> = graph.keys().cloned().collect();
    for (module, imported) in imports("src") {
        assert!(!core_modules.contains(&module), "{module} is a module of both crates");
        graph.insert(module, imported);
    }
    let unplaced: Vec<&String> = graph.keys().filter(|m| !floor_of.contains_key(m.as_str())).collect();
    assert!(unplaced.is_empty(), "modules docs/architecture.md does not place on a floor: {unplaced:?}");
    let gone: Vec<&&str> = floor_of.keys().filter(|m| !graph.contains_key(**m)).collect();
    assert!(gone.is_empty(), "docs/architecture.md places modules that do not exist: {gone:?}");
    // The core's floors are all below the process's: the doc's order says what the compiler enforces.
    let highest_core = core_modules.iter().map(|m| floor_of[m.as_str()]).max().unwrap();
    let lowest_process = graph.keys().filter(|m| !core_modules.contains(*m)).map(|m| floor_of[m.as_str()]).min();
    assert!(lowest_process.is_some_and(|p| p > highest_core), "a module of the process is placed among the core's");
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

/// The files of the room at `dir` (its `.rs` files beside the door, `mod.rs` or `lib.rs`/`main.rs`) and the
/// files of the room each imports, through `super::`, `crate::` or the crate path down to the room (`room_path`),
/// a name the door re-exports counting as its file's.
fn room(dir: &Path, room_path: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let door = ["mod.rs", "lib.rs", "main.rs"].iter().map(|d| dir.join(d)).find(|d| d.exists());
    let door_names = door.as_deref().map(reexports).unwrap_or_default();
    let files: BTreeMap<String, PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .filter(|(stem, _)| !["mod", "lib", "main", "tests"].contains(&stem.as_str()))
        .collect();
    let mut graph = BTreeMap::new();
    for (stem, path) in &files {
        let code = code(path);
        let mut prefixes = vec!["super::".to_owned()];
        if room_path.is_empty() {
            prefixes.push("crate::".to_owned());
        } else {
            prefixes.push(format!("crate::{}::", room_path.join("::")));
        }
        let mut imported = BTreeSet::new();
        for prefix in &prefixes {
            for name in names_after(&code, prefix) {
                let target = door_names.get(&name).cloned().unwrap_or(name);
                if files.contains_key(&target) && &target != stem {
                    imported.insert(target);
                }
            }
        }
        graph.insert(stem.clone(), imported);
    }
    graph
}

/// The circles of `graph`: each strongly connected group of more than one file, sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reaches = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(node) = stack.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> = graph.keys().map(|n| (n, reaches(n))).collect();
    let mut groups: BTreeSet<Vec<String>> = BTreeSet::new();
    for node in graph.keys() {
        let group: Vec<String> = graph
            .keys()
            .filter(|other| reach[node].contains(*other) && reach[*other].contains(node))
            .cloned()
            .collect();
        if group.len() > 1 {
            groups.insert(group);
        }
    }
    groups.into_iter().collect()
}

#[test]
fn no_room_has_a_circle_among_its_files() {
    let mut rooms: Vec<(PathBuf, Vec<String>)> = vec![(Path::new(ROOT).join("loadtest/src"), vec![])];
    for src in [CORE, "src"] {
        for entry in std::fs::read_dir(Path::new(ROOT).join(src)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                rooms.push((path, vec![name]));
            }
        }
    }
    let mut found = Vec::new();
    for (dir, path) in &rooms {
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        for circle in circles(&room(dir, &path)) {
            found.push(format!("{}: {}", dir.strip_prefix(ROOT).unwrap().display(), circle.join(" ⇄ ")));
        }
    }
    assert!(found.is_empty(), "files that import each other, through others or directly:\n{}", found.join("\n"));
}

#[test]
fn the_reader_of_imports_sees_groups_nested_paths_and_reexports() {
    let code =
        "use crate::{a, b::{C, D}, e::f};\nfn x() { crate::g::h(); crate::Engine::new(); sidecar_injector_core::k(); }";
    assert_eq!(names_after(code, "crate::"), ["a", "b", "e", "g", "Engine"]);
    assert_eq!(names_after(code, CORE_CRATE), ["k"]);
    let core = reexports(&Path::new(ROOT).join(CORE).join("lib.rs"));
    assert_eq!(core.get("Engine").map(String::as_str), Some("engine"));
    let graph = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
        ("d".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(circles(&graph), [["a", "b", "c"]]);
    assert!(code_of_comment_is_ignored());
}

fn code_of_comment_is_ignored() -> bool {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(&file, "// crate::hidden\nuse crate::seen; // crate::also_hidden\n").unwrap();
    names_after(&code(&file), "crate::") == ["seen"]
}

/// The core's dependencies, all the way down (normal ones, as `cargo metadata` resolves them), hold no async
/// runtime, no HTTP, no Kubernetes client, no metrics recorder, no CLI parser and no file watcher: what the core
/// cannot link, it cannot call.
#[test]
fn the_core_links_nothing_that_does_io() {
    // The host's platform only: offline, cargo has the packages the build downloaded, not other platforms' (a
    // Windows console crate of clap's), which an unfiltered resolve would want.
    let rustc = std::process::Command::new("rustc").arg("-vV").output().unwrap();
    let rustc = String::from_utf8(rustc.stdout).unwrap();
    let host = rustc.lines().find_map(|l| l.strip_prefix("host: ")).expect("rustc -vV names the host");
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--locked", "--filter-platform", host])
        .current_dir(ROOT)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let nodes = metadata["resolve"]["nodes"].as_array().unwrap();
    let name_of = |id: &str| {
        let package = metadata["packages"].as_array().unwrap().iter().find(|p| p["id"] == id).unwrap();
        package["name"].as_str().unwrap().to_owned()
    };
    let core = nodes.iter().find(|n| name_of(n["id"].as_str().unwrap()) == "sidecar-injector-core").unwrap();
    let mut linked = BTreeSet::new();
    let mut stack = vec![core];
    while let Some(node) = stack.pop() {
        for dep in node["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"].as_array().unwrap().iter().any(|k| k["kind"].is_null());
            let id = dep["pkg"].as_str().unwrap();
            if normal && linked.insert(name_of(id)) {
                stack.push(nodes.iter().find(|n| n["id"] == id).unwrap());
            }
        }
    }
    assert!(linked.contains("simd-json") && linked.contains("minijinja"), "{linked:?}");
    let forbidden =
        ["tokio", "mio", "hyper", "h2", "rustls", "kube", "metrics", "clap", "notify", "tracing", "socket2"];
    let found: Vec<&String> = linked
        .iter()
        .filter(|name| forbidden.iter().any(|f| *name == f || name.starts_with(&format!("{f}-"))))
        .collect();
    assert!(found.is_empty(), "the core links {found:?}");
}
