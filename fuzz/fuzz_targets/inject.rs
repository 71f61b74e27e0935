//! `inject` over arbitrary multi-document YAML: manifests are injected or refused with a reason, never a panic, and
//! injecting the output again changes nothing.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use sidecar_injector_core::offline::{inject_document, read_documents};
use sidecar_injector_core::{Engine, Settings, TemplateSet};

static ENGINE: LazyLock<Engine> = LazyLock::new(|| {
    let settings = Settings::default();
    // The built-in template always compiles (a unit test says so).
    Engine::new(TemplateSet::builtin(&settings).expect("the built-in template compiles"), &settings)
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(documents) = read_documents(text) else { return };
    for mut document in documents {
        if inject_document(&ENGINE, &mut document, "default").is_err() {
            continue;
        }
        let once = document.clone();
        inject_document(&ENGINE, &mut document, "default").expect("an injected manifest injects again");
        assert_eq!(document, once, "injecting the output again changes nothing");
    }
});
