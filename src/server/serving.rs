//! What the server serves each template set with ([`Serving`]): the combinations pods ask for (`template: a,b`),
//! assembled once, off the async workers; and when each template reached this replica, carried over reloads. The
//! set itself is immutable; this state is made with it, at start and at each reload, and swapped in with it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use sidecar_injector_core::template_set::{Combinations, Serving};
use sidecar_injector_core::{Engine, Template, TemplateError, TemplateSet};

/// A set's serving state in the server.
#[derive(Debug, Default)]
pub struct Served {
    combinations: Combinations,
    /// When each template that reached this process by a reload arrived, by name.
    arrivals: BTreeMap<String, Instant>,
}

impl Served {
    /// The state of `set`, replacing `previous` at `now` (a reload): a template `previous` did not have arrives
    /// now, the others keep their arrival; the combinations `previous` had assembled whose templates are all in
    /// `set` are assembled again, ahead of any pod, so that the pods asking for them after an edit find them ready.
    pub fn after(previous: &Engine, set: &TemplateSet, now: Instant) -> Served {
        let was = previous.served_with();
        let arrivals = (set.templates())
            .map(Template::name)
            .filter_map(|name| match previous.set().has(name) {
                true => was.arrived(name).map(|at| (name.to_owned(), at)),
                false => Some((name.to_owned(), now)),
            })
            .collect();
        let served = Served { combinations: Combinations::default(), arrivals };
        for key in was.assembled() {
            let names: Vec<&str> = key.split(',').collect();
            if names.iter().all(|name| set.has(name)) {
                // Kept whether or not the templates combine: the pods asking for them get the reason at once.
                let _ = served.combinations.assemble(set, &names);
            }
        }
        served
    }
}

impl Serving for Served {
    /// A combination assembled before is one atomic load. The first pod asking for one waits for its assembly
    /// (a dry run on every sample pod): on a multi-threaded runtime the worker hands its other connections to
    /// the others meanwhile (`block_in_place`), so that no review waits behind it.
    fn combination(&self, set: &TemplateSet, names: &[&str]) -> Result<Arc<Template>, Arc<TemplateError>> {
        if let Some(assembled) = self.combinations.get(names) {
            return assembled;
        }
        let assemble = || self.combinations.assemble(set, names);
        let multi_threaded = tokio::runtime::Handle::try_current()
            .is_ok_and(|runtime| runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if multi_threaded { tokio::task::block_in_place(assemble) } else { assemble() }
    }

    fn arrived(&self, template: &str) -> Option<Instant> {
        self.arrivals.get(template).copied()
    }

    fn assembled(&self) -> Vec<String> {
        self.combinations.keys()
    }
}
