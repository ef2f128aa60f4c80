//! rustls for libpq's `sslmode`/`sslrootcert` (see `connector`):
//! `verify-ca` checks the chain, `verify-full` the chain and the host
//! name (or IP address).
use crate::error::{CoreError, CoreResult};
use crate::store::url::{PgUrl, SslMode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, Error, SignatureScheme};
use std::sync::Arc;

#[derive(Debug)]
struct Verifier {
    inner: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    check_name: bool,
    schemes: Vec<SignatureScheme>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(inner) = &self.inner else {
            return Ok(ServerCertVerified::assertion());
        };
        match inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
                if !self.check_name =>
            {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}

/// Where the server's CA certificates come from, as libpq reads
/// `sslrootcert`: a PEM file, `system` (here the common public roots),
/// or by default `~/.postgresql/root.crt` when that file exists.
enum Roots {
    File(String),
    System,
}

fn roots(url: &PgUrl) -> Option<Roots> {
    match url.sslrootcert.as_deref() {
        Some("system") => Some(Roots::System),
        Some(path) => Some(Roots::File(path.to_string())),
        None => {
            let path = default_root_cert()?;
            std::path::Path::new(&path)
                .exists()
                .then_some(Roots::File(path))
        }
    }
}

fn default_root_cert() -> Option<String> {
    let home = std::env::var_os("HOME")?;
    Some(
        std::path::Path::new(&home)
            .join(".postgresql/root.crt")
            .to_string_lossy()
            .into_owned(),
    )
}

fn load(roots: &Roots) -> CoreResult<rustls::RootCertStore> {
    let mut store = rustls::RootCertStore::empty();
    let path = match roots {
        Roots::System => {
            store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            return Ok(store);
        }
        Roots::File(path) => path,
    };
    let bad = |e: &dyn std::fmt::Display| {
        CoreError::Config(format!("COMPOSE_STORE sslrootcert '{path}': {e}"))
    };
    let pem = std::fs::read(path).map_err(|e| bad(&e))?;
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        store.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
    }
    if store.is_empty() {
        return Err(bad(&"no PEM certificate in the file"));
    }
    Ok(store)
}

/// `prefer`/`require` encrypt without verifying, unless `require` has a
/// CA (given, or the default file): it then verifies as `verify-ca`,
/// as libpq does. `verify-ca`/`verify-full` without a CA is refused.
pub fn connector(url: &PgUrl) -> CoreResult<tokio_postgres_rustls::MakeRustlsConnect> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = match url.sslmode {
        SslMode::VerifyCa | SslMode::VerifyFull => Some(roots(url).ok_or_else(|| {
            let mode = if url.sslmode == SslMode::VerifyCa {
                "verify-ca"
            } else {
                "verify-full"
            };
            CoreError::Config(format!(
                "COMPOSE_STORE sslmode={mode} needs the server's CA certificate: no \
                 sslrootcert was given and '{}' does not exist -- add \
                 sslrootcert=/path/to/ca.pem (or sslrootcert=system for the common public \
                 roots), or use sslmode=require to encrypt without verifying",
                default_root_cert().unwrap_or_else(|| "~/.postgresql/root.crt".into())
            ))
        })?),
        SslMode::Require => roots(url),
        _ => None,
    };
    let inner = match roots {
        Some(roots) => Some(
            rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(load(&roots)?),
                provider.clone(),
            )
            .build()
            .map_err(|e| CoreError::Config(format!("COMPOSE_STORE TLS roots: {e}")))?,
        ),
        None => None,
    };
    let verifier = Verifier {
        inner,
        check_name: url.sslmode == SslMode::VerifyFull,
        schemes: provider
            .signature_verification_algorithms
            .supported_schemes(),
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CoreError::Config(format!("COMPOSE_STORE TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}
