//! Certificates made by the tests: a CA and the server and client certificates it issues.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SerialNumber,
};

/// A CA and what it signs, written as PEM files into a folder.
pub struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pki = Pki {
            dir: tempfile::tempdir().unwrap(),
            ca,
        };
        std::fs::write(pki.path("ca.pem"), pki.ca.pem()).unwrap();
        pki
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// A certificate named `name` (files `<name>.pem`, `<name>.key`) for `cn` with serial
    /// `serial`; a server certificate (for 127.0.0.1 and localhost) unless `client`; valid
    /// from now unless `expired`.
    pub fn issue(&self, name: &str, cn: &str, serial: u64, client: bool, expired: bool) {
        let sans = if client {
            vec![]
        } else {
            vec!["localhost".to_string(), "127.0.0.1".to_string()]
        };
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(SerialNumber::from(serial));
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        let key = key.serialize_pem();
        testkit::logs::used_secret(&key);
        std::fs::write(self.path(&format!("{name}.key")), key).unwrap();
    }
}
