//! "Did you mean ...?": the closest known name to a misspelt one, for every message that names an unknown key (an
//! annotation under the injector's prefix, a template's field or top-level key).

/// The known name closest to `wanted` (Levenshtein distance at most 2, the nearest first; among equals, the first
/// in `known`), if any is that close.
pub(crate) fn closest<'a>(wanted: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .map(|k| (strsim::levenshtein(k, wanted), k))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn the_nearest_known_name_within_two_edits() {
        let fields = ["image", "imagePullPolicy", "name"];
        assert_eq!(closest("imagePullPolcy", fields), Some("imagePullPolicy"));
        assert_eq!(closest("imgae", fields), Some("image"));
        assert_eq!(closest("resources", fields), None, "nothing close: no guess");
        assert_eq!(closest("proxy-cpus", ["proxy-cpu", "proxy-cpu-limit"]), Some("proxy-cpu"));
    }
}
