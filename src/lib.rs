//! sidecar-injector: a Kubernetes mutating admission webhook that injects a templated sidecar into Pods.
//!
//! This package is the process around the core ([`sidecar_injector_core`], re-exported as [`core`]), which
//! answers a review with no I/O:
//!
//! - [`server`]: the HTTPS service (hyper over rustls), the memory account and connection bounds, the template
//!   reloads, the metrics;
//! - [`cli`]: the command line (`serve`, `check`, `inject`, `review`, `certs`, `status`);
//! - [`status`]: the cluster survey behind `status` (read through the caller's kubeconfig);
//! - [`pki`]: the certificates `certs` and the development server issue.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use sidecar_injector_core as core;

pub mod cli;
pub mod pki;
pub mod server;
pub mod status;
