//! What an immutable [`TemplateSet`] is served with: the combinations pods ask for (`template: a,b`), each
//! assembled once, and when each template reached the process. The set never changes; this state belongs to
//! whoever serves it: the server keeps its own (combinations assembled off its async workers, arrivals carried
//! over reloads), the CLI and the tests use [`OnDemand`].

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;

use super::TemplateSet;
use crate::template::{Template, TemplateError};

/// Combinations kept per set; beyond this many, the oldest makes room.
const MAX_COMBINATIONS: usize = 32;

/// What the engine asks of whoever serves a set.
pub trait Serving: Send + Sync + std::fmt::Debug {
    /// The combination of `names` (each a template of `set`, at least two, in order), assembled the first time
    /// and kept, or why the templates do not combine (kept too, so that a pod asking again is answered at once).
    fn combination(&self, set: &TemplateSet, names: &[&str]) -> Result<Arc<Template>, Arc<TemplateError>>;

    /// When `template` reached this process by a reload, if it did (not for the templates it started with).
    fn arrived(&self, template: &str) -> Option<Instant>;

    /// The combinations assembled so far, as their names joined by commas (`a,b`), oldest first.
    fn assembled(&self) -> Vec<String>;
}

/// Combinations as assembled, published lock-free: a lookup is one atomic load; an assembly publishes a new list.
#[derive(Debug, Default)]
pub struct Combinations(ArcSwap<Vec<Combination>>);

#[derive(Debug, Clone)]
struct Combination {
    key: String,
    assembled: Result<Arc<Template>, Arc<TemplateError>>,
}

impl Combinations {
    /// The combination of `names`, if it was assembled.
    pub fn get(&self, names: &[&str]) -> Option<Result<Arc<Template>, Arc<TemplateError>>> {
        self.0.load().iter().find(|c| is_key(&c.key, names)).map(|c| c.assembled.clone())
    }

    /// Assembles the combination of `names` from `set` and keeps it (beyond [`MAX_COMBINATIONS`], the oldest makes
    /// room); another thread's, if it kept one first.
    pub fn assemble(&self, set: &TemplateSet, names: &[&str]) -> Result<Arc<Template>, Arc<TemplateError>> {
        let assembled = set.assemble(names).map(Arc::new).map_err(Arc::new);
        let combination = Combination { key: names.join(","), assembled };
        let previous = self.0.rcu(|current| {
            let mut next = Vec::clone(current);
            if !next.iter().any(|c| c.key == combination.key) {
                if next.len() >= MAX_COMBINATIONS {
                    next.remove(0);
                }
                next.push(combination.clone());
            }
            next
        });
        match previous.iter().find(|c| c.key == combination.key) {
            Some(first) => first.assembled.clone(),
            None => combination.assembled,
        }
    }

    /// The keys (`a,b`) of the combinations kept, oldest first.
    pub fn keys(&self) -> Vec<String> {
        self.0.load().iter().map(|c| c.key.clone()).collect()
    }
}

/// Is `key` (`a,b`) the combination of `names`?
fn is_key(key: &str, names: &[&str]) -> bool {
    key.split(',').eq(names.iter().copied())
}

/// The serving state of a set used off any request path (the CLI, the tests): a combination is assembled where it
/// is first asked for, then kept; no template arrives later than the start.
#[derive(Debug, Default)]
pub struct OnDemand(Combinations);

impl Serving for OnDemand {
    fn combination(&self, set: &TemplateSet, names: &[&str]) -> Result<Arc<Template>, Arc<TemplateError>> {
        self.0.get(names).unwrap_or_else(|| self.0.assemble(set, names))
    }

    fn arrived(&self, _template: &str) -> Option<Instant> {
        None
    }

    fn assembled(&self) -> Vec<String> {
        self.0.keys()
    }
}
