//! Template compilation over arbitrary text: a template is compiled or refused with a reason, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecar_injector_core::{Settings, TemplateSet};

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else { return };
    if let Err(error) = TemplateSet::from_source("fuzzed", "fuzzed.yaml", source, &Settings::default()) {
        assert!(!error.to_string().is_empty(), "a refusal says why");
    }
});
