//! The repository stands alone: a user clones it and nothing else.

use std::path::Path;

/// Every file of the repository but build output and git's own.
fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if name != "target" && name != ".git" {
                files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

#[test]
fn nothing_refers_to_a_directory_beside_the_repository() {
    // Written in two pieces, so that this file does not name it either.
    let needle = ["..", "/shared"].concat();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    files(root, &mut all);
    assert!(all.len() > 100, "the walk found the repository ({} files)", all.len());
    let offenders: Vec<String> = all
        .iter()
        .filter(|path| {
            std::fs::read(path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .map(|path| path.strip_prefix(root).unwrap().display().to_string())
        .collect();
    assert!(offenders.is_empty(), "these files refer to {needle}, which a clone does not have: {offenders:?}");
}
