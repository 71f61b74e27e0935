//! A small certificate authority (rcgen) for the webhook's serving certificate: the development certificate of
//! `serve` without `--tls-cert`, and `sidecar-injector certs` for clusters without cert-manager.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused (a bad name, an unreadable key or CA certificate).
    #[error("{0}")]
    Rcgen(#[from] rcgen::Error),
}

/// A CA: its certificate and the key it signs with.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

/// A certificate and its private key, as PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// Certificates start an hour in the past, so that a node whose clock is a little behind accepts them at once.
const CLOCK_SKEW: time::Duration = time::Duration::hours(1);

impl Authority {
    /// A new CA named `common_name`, valid for `validity`.
    pub fn generate(common_name: &str, validity: Duration) -> Result<Self, PkiError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        set_validity(&mut params, validity);
        let key = KeyPair::generate()?;
        let cert_pem = params.self_signed(&key)?.pem();
        Ok(Authority { issuer: Issuer::new(params, key), cert_pem })
    }

    /// The CA of an earlier run, from its certificate and key (PEM).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(Authority { issuer, cert_pem: cert_pem.to_owned() })
    }

    /// The CA certificate (what clients trust: the webhook configuration's `caBundle`).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A serving certificate for `names` (DNS names or IP addresses), with a new key, valid for `validity`.
    pub fn issue_server(&self, common_name: &str, names: &[String], validity: Duration) -> Result<Issued, PkiError> {
        self.issue(common_name, names, ExtendedKeyUsagePurpose::ServerAuth, validity)
    }

    /// A client certificate for `common_name` (what the API server presents to a webhook served with
    /// `--client-ca`), with a new key, valid for `validity`.
    pub fn issue_client(&self, common_name: &str, validity: Duration) -> Result<Issued, PkiError> {
        self.issue(common_name, &[], ExtendedKeyUsagePurpose::ClientAuth, validity)
    }

    fn issue(
        &self,
        common_name: &str,
        names: &[String],
        usage: ExtendedKeyUsagePurpose,
        validity: Duration,
    ) -> Result<Issued, PkiError> {
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, validity);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - CLOCK_SKEW;
    params.not_after = now + validity;
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn a_reloaded_authority_issues_certificates_its_original_certificate_verifies() {
        use rustls::client::WebPkiServerVerifier;
        use rustls::client::danger::ServerCertVerifier;
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

        let ca = Authority::generate("test CA", 10 * DAY).unwrap();
        let reloaded = Authority::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        let leaf = reloaded.issue_server("svc", &["svc.ns.svc".to_owned()], DAY).unwrap();

        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap()).unwrap();
        let verifier = WebPkiServerVerifier::builder_with_provider(roots.into(), provider).build().unwrap();
        let cert = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap();
        let name = ServerName::try_from("svc.ns.svc").unwrap();
        verifier.verify_server_cert(&cert, &[], &name, &[], UnixTime::now()).unwrap();
        let other = ServerName::try_from("other.ns.svc").unwrap();
        assert!(verifier.verify_server_cert(&cert, &[], &other, &[], UnixTime::now()).is_err());
        assert!(Authority::from_pem("not a certificate", &ca.key_pem()).is_err());
    }
}
