//! The revision tags a revision is called through: a tag's webhooks (`sidecar-injector tag set`) call
//! `<path>[/REVISION]/tag/TAG`, so the server learns its tags from the calls, and a tag moves without a restart.
//! Each tag's name is checked and its request counter made once, by the first call through it; later calls find
//! both without a lock or an allocation.

use std::sync::Arc;

use arc_swap::ArcSwap;
use metrics::Counter;
use sidecar_injector_core::Tag;

use super::telemetry::Metrics;

/// The tags a revision keeps a counter of: more means a misconfiguration or a caller probing paths, and each
/// would be a series. Calls through further tags are served all the same, counted as the tag `other`.
pub(crate) const MAX_TAGS: usize = 64;

/// A tag a revision was called through, with its requests counter.
pub(crate) struct Seen {
    pub tag: Tag,
    requests: Counter,
}

impl Seen {
    /// Counts a call through the tag.
    pub(crate) fn called(&self) {
        self.requests.increment(1);
    }
}

/// The tags one revision was called through.
#[derive(Default)]
pub(crate) struct Tags {
    seen: ArcSwap<Vec<Arc<Seen>>>,
    /// The counter of the calls through tags past [`MAX_TAGS`], made by the first.
    other: std::sync::OnceLock<Counter>,
}

impl Tags {
    /// The tag `name` of `revision`; the first call through it checks the name and makes its counter. `Err` with
    /// the reason for a name that cannot be a tag.
    pub(crate) fn get(&self, name: &str, revision: &str, metrics: &Metrics) -> Result<Arc<Seen>, String> {
        if let Some(seen) = self.seen.load().iter().find(|s| s.tag.as_str() == name) {
            return Ok(seen.clone());
        }
        let tag = Tag::new(name)?;
        let mut added = None;
        self.seen.rcu(|seen| {
            let mut seen = Vec::clone(seen);
            match seen.iter().find(|s| s.tag.as_str() == name) {
                Some(found) => added = Some(found.clone()),
                None if seen.len() < MAX_TAGS => {
                    let new = Arc::new(Seen { tag: tag.clone(), requests: metrics.tag_requests(revision, name) });
                    seen.push(new.clone());
                    added = Some(new);
                }
                None => added = None,
            }
            seen
        });
        Ok(added.unwrap_or_else(|| {
            let requests = self.other.get_or_init(|| metrics.tag_requests(revision, "other")).clone();
            Arc::new(Seen { tag, requests })
        }))
    }
}
