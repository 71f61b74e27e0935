//! The rendered leaves of the last few pods one thread saw, each kept with what its render read of the pod
//! ([`Dependencies`]): a pod that gives the same answers gets the same output, for a comparison instead of an
//! evaluation. The pods of one controller (a Deployment scaling up, a Job's workers, a StatefulSet's replicas)
//! give the same answers to what a template usually reads: labels, service account, namespace.

use std::ops::Range;

use super::pod_context::{ContainerEntries, Dependencies, PodContext, StrEntries};

/// The rendered leaves of recent pods, per thread. Failures are not cached: they are rare, and a warning must
/// name the failing field every time.
#[derive(Debug, Default)]
pub(crate) struct LeafCache {
    entries: Vec<CachedRender>,
    /// The entry the next miss replaces (the clock algorithm's hand).
    next: usize,
    /// The current request's overrides as JSON (empty without), kept to reuse its allocation.
    pub(super) overrides: Vec<u8>,
    /// The current pod's containers, encoded for comparison (empty unless the renderer may read them), kept to
    /// reuse its allocation.
    pub(super) containers: Vec<u8>,
    /// A pod's answers to a cached render's questions, kept to reuse its allocation.
    answers: Vec<u8>,
    /// What the current render read, kept to reuse its allocation.
    pub(super) dependencies: Dependencies,
}

#[derive(Debug)]
struct CachedRender {
    /// Answered a request since the replacement hand last passed it: kept for one more round.
    referenced: bool,
    renderer: u64,
    overrides: Vec<u8>,
    dependencies: Dependencies,
    rendered: Vec<u8>,
    ranges: Vec<Range<usize>>,
}

impl LeafCache {
    /// Entries per thread: enough for the controllers that create pods at the same time, each pod taking one
    /// per renderer of its template (the template's parts and the injector's own).
    pub(super) const ENTRIES: usize = 16;
    /// Renders that read more than this of their pod (huge annotations, printed whole) are not worth keeping.
    const MAX_DEPENDENCIES: usize = 4096;

    /// Appends what `renderer` rendered for a pod that gives the answers of `pod` (and of the current overrides
    /// and containers), to `buf`, and its ranges to `ranges`: true if there was one.
    pub(super) fn answer<M: StrEntries, C: ContainerEntries>(
        &mut self,
        renderer: u64,
        pod: &PodContext<'_, M, C>,
        buf: &mut Vec<u8>,
        ranges: &mut Vec<Range<usize>>,
    ) -> bool {
        let LeafCache { entries, overrides, containers, answers, .. } = self;
        // The pod's answers to the questions of the last shape seen, and their fingerprint (`None`: it cannot
        // answer them alike).
        let mut asked: Option<(u64, Option<u64>)> = None;
        let hit = entries.iter_mut().find(|e| {
            // Lengths first: most pods override nothing, and comparing two empty buffers still calls `memcmp`.
            let same_overrides =
                e.overrides.len() == overrides.len() && (overrides.is_empty() || e.overrides == *overrides);
            if e.renderer != renderer || !same_overrides {
                return false;
            }
            let shape = e.dependencies.shape();
            let fingerprint = match asked {
                Some((asked_shape, fingerprint)) if asked_shape == shape => fingerprint,
                _ => {
                    let fingerprint = e.dependencies.answers_of(pod, containers, answers);
                    asked = Some((shape, fingerprint));
                    fingerprint
                }
            };
            fingerprint.is_some_and(|fingerprint| e.dependencies.holds_for(answers, fingerprint))
        });
        let Some(hit) = hit else { return false };
        hit.referenced = true;
        let base = buf.len();
        buf.extend_from_slice(&hit.rendered);
        ranges.extend(hit.ranges.iter().map(|r| r.start + base..r.end + base));
        true
    }

    /// Keeps `rendered` and its `ranges` (which start at `base` in the caller's buffer) under the current
    /// overrides and dependencies.
    pub(super) fn remember(&mut self, renderer: u64, rendered: &[u8], ranges: &[Range<usize>], base: usize) {
        if self.dependencies.len() > Self::MAX_DEPENDENCIES {
            return;
        }
        let relative = ranges.iter().map(|r| r.start - base..r.end - base);
        if self.entries.len() < Self::ENTRIES {
            let entry = CachedRender {
                referenced: false,
                renderer,
                overrides: self.overrides.clone(),
                dependencies: self.dependencies.clone(),
                rendered: rendered.to_vec(),
                ranges: relative.collect(),
            };
            return self.entries.push(entry);
        }
        // A full cache overwrites an entry in place, reusing its buffers (a stream of new pods allocates nothing
        // here): the next one the hand reaches that has not answered a request since it last passed (the clock
        // algorithm), so a stream of one-off pods does not push out the entries that keep answering, such as
        // those of a renderer that reads only what a Deployment's pods share.
        while std::mem::take(&mut self.entries[self.next].referenced) {
            self.next = (self.next + 1) % Self::ENTRIES;
        }
        let entry = &mut self.entries[self.next];
        entry.renderer = renderer;
        entry.overrides.clone_from(&self.overrides);
        entry.dependencies.clone_from(&self.dependencies);
        entry.rendered.clear();
        entry.rendered.extend_from_slice(rendered);
        entry.ranges.clear();
        entry.ranges.extend(relative);
        self.next = (self.next + 1) % Self::ENTRIES;
    }

    /// The renderer of each entry, in order: for tests.
    #[cfg(test)]
    pub(super) fn renderers(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().map(|e| e.renderer)
    }
}
