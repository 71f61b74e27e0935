//! sidecar-injector's core: what answers an `AdmissionReview` and judges a pod, bytes in, bytes out, with no I/O
//! of its own beyond reading template files it is pointed at. The server, the CLI, `status` and the certificates
//! live in the `sidecar-injector` package, which brings the async runtime, HTTP, the Kubernetes client, the metrics
//! recorder and the CLI parser; this crate depends on none of them, so the compiler keeps the engine free of I/O.
//!
//! A request flows through these stages, one module each:
//!
//! 1. [`review`]: bytes to review, a zero-copy view of the `AdmissionReview` over a simd-json tape;
//! 2. [`decision`]: inject or skip, with a bounded reason;
//! 3. `merge` (with [`template`]): the add-only merge of the compiled template into the pod, written by
//!    `patch` as a minimal JSON Patch of `add` operations;
//! 4. `response`: the `AdmissionReview` response bytes, the patch in base64.
//!
//! The engine injects from a [`TemplateSet`]: the templates of a directory (or one file), compiled together into
//! one immutable snapshot. The server holds the engine in an `ArcSwap` that it replaces whole when the directory
//! changes, so a request sees one set from start to end.
//!
//! [`Engine`] runs them for one request, bytes in, bytes out:
//!
//! ```
//! use sidecar_injector_core::{Engine, Settings, TemplateSet, Verdict};
//!
//! let settings = Settings::default();
//! let engine = Engine::new(TemplateSet::builtin(&settings).unwrap(), &settings);
//! let mut body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
//!     "uid":"42","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"shop",
//!     "object":{"metadata":{"name":"web"},"spec":{"containers":[{"name":"web","image":"nginx"}]}}}}"#.to_vec();
//! let mut response = Vec::new();
//! let outcome = engine.review(&mut body, &mut response).unwrap();
//! assert!(matches!(outcome.verdict, Verdict::Injected { .. }));
//! assert_eq!(outcome.template.unwrap().name, "default");
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod decision;
mod engine;
mod json;
mod merge;
mod missing;
pub mod offline;
mod patch;
mod pod;
mod pod_api;
pub mod pod_security;
pub mod policy;
pub(crate) mod preview;
mod response;
pub mod review;
pub mod settings;
mod suggest;
pub mod template;
pub mod template_set;
mod uninject;
pub mod validation;
pub mod workload;

pub use decision::SkipReason;
pub use engine::{Call, Engine, Mode, Outcome, PARSE_PADDING, Stage, Subject, Trace, Verdict};
pub use review::{ApiVersion, ReviewError};
pub use settings::{Policy, Settings, Validation};
pub use template::{Hold, JobPolicy, Stamp, Tag, Template, TemplateError, TemplateId};
pub use template_set::{SelectError, Selection, SetSources, TemplateSet};
