//! The Kubernetes version the injected pods are meant for: some rules (native sidecars, the sleep hook, relaxed env
//! var names) depend on it, as the API server's do on its version and feature gates.

use std::fmt;
use std::str::FromStr;

/// A Kubernetes minor version (`1.29`). Patch releases do not change what a pod may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    /// The minor version: 29 for 1.29.
    pub minor: u32,
}

impl KubeVersion {
    /// The version assumed unless the server or command is told otherwise: 1.37, the newest release the suite
    /// tests (a one-node cluster of it runs the base as written, tests/cluster.rs). A cluster older than that sets
    /// its own version (`certs --kubernetes-version` writes it into the overlay), so that a rule a later release
    /// relaxed is judged as that cluster judges it; templates that need newer features are refused, not
    /// half-applied.
    pub const DEFAULT: KubeVersion = KubeVersion::new(37);

    /// Version 1.`minor`.
    pub const fn new(minor: u32) -> Self {
        KubeVersion { minor }
    }

    /// Is this version `1.minor` or later?
    pub fn at_least(self, minor: u32) -> bool {
        self.minor >= minor
    }
}

impl Default for KubeVersion {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor)
    }
}

/// A version that is not `1.N` (optionally `v1.N.P`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a Kubernetes version: write it as 1.29 (or v1.29.3)")]
pub struct VersionError(String);

impl FromStr for KubeVersion {
    type Err = VersionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || VersionError(text.to_owned());
        let bare = text.trim().strip_prefix('v').unwrap_or(text.trim());
        let mut parts = bare.split('.');
        let (Some("1"), Some(minor)) = (parts.next(), parts.next()) else { return Err(error()) };
        let patch_ok = match parts.next() {
            None => true,
            // A patch version may carry a pre-release or build suffix (`1.29.3-eks-1`): only its digits matter.
            Some(patch) => patch.starts_with(|c: char| c.is_ascii_digit()),
        };
        let minor: u32 = minor.parse().map_err(|_| error())?;
        if !patch_ok || parts.next().is_some() {
            return Err(error());
        }
        Ok(KubeVersion::new(minor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_kubectl_version_prints() {
        assert_eq!("1.29".parse::<KubeVersion>().unwrap(), KubeVersion::new(29));
        assert_eq!("v1.33.2".parse::<KubeVersion>().unwrap(), KubeVersion::new(33));
        assert_eq!("1.30.1-eks-36c9ff8".parse::<KubeVersion>().unwrap(), KubeVersion::new(30));
        for bad in ["", "1", "2.1", "1.x", "1.29.x", "1.29.1.2", "latest"] {
            assert!(bad.parse::<KubeVersion>().is_err(), "{bad}");
        }
        assert_eq!(KubeVersion::new(20).to_string(), "1.20");
        assert!(KubeVersion::new(29).at_least(29) && !KubeVersion::new(28).at_least(29));
    }
}
