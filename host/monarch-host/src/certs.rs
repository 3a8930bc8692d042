//! `monarch-host certs`: the certificates of a cluster's TLS (see
//! `hyperactor::channel::tls` and docs/clusters.md, "TLS between hosts").
//!
//! `certs new` makes a cluster CA and host certificates signed by it. Every
//! host certificate serves and connects (serverAuth and clientAuth) and
//! carries the DNS name `monarch-host`, which peers check it against: a
//! certificate is good for a cluster because its CA signed it, wherever
//! the host's address happens to be.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hyperactor::channel::tls::{CA_FILE, CERT_FILE, KEY_FILE, SERVER_NAME};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The cluster CA's private key in the directory `certs new` writes.
const CA_KEY_FILE: &str = "ca.key";

/// Makes the certificates for TLS between hosts.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CertsCommand {
    /// Makes a cluster CA (DIR/ca.pem, DIR/ca.key) and a host certificate
    /// signed by it (DIR/host.pem, DIR/host.key); with --hosts, one more
    /// per host in DIR/NAME/, with a copy of ca.pem. Give each host a
    /// directory with ca.pem, host.pem and host.key (never ca.key) and
    /// start everything with `--tls-dir` pointing at it.
    ///
    /// Example: monarch-host certs new --dir /etc/monarch/tls --hosts node1,node2
    New(NewArgs),
}

#[derive(Debug, clap::Args)]
struct NewArgs {
    /// Where to write the files (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Also a certificate per host, in DIR/NAME/ (comma-separated names;
    /// a name that is an IP or a DNS name is added to its certificate).
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// How long the certificates are valid, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36500))]
    days: u32,
    /// Replaces an existing CA in DIR. Certificates signed by the old one
    /// stop working with the new ones.
    #[arg(long)]
    force: bool,
}

/// Runs `monarch-host certs`.
pub fn command(args: CertsArgs) -> ExitCode {
    match args.command {
        CertsCommand::New(args) => match new(&args) {
            Ok(written) => {
                for path in &written {
                    println!("wrote {}", path.display());
                }
                let dir = args.dir.display();
                let agent_dir = match args.hosts.first() {
                    Some(host) => args.dir.join(host).display().to_string(),
                    None => dir.to_string(),
                };
                println!(
                    "\nKeep {dir}/{CA_KEY_FILE} private: it signs certificates. Each host needs a \
                     directory with {CA_FILE}, {CERT_FILE} and {KEY_FILE}{}; start agents, \
                     controllers and servers with --tls-dir DIR (or MONARCH_TLS_DIR=DIR), e.g.\n  \
                     monarch-host agent --listen IP:7070 --token-file TOKEN --tls-dir {agent_dir}\n  \
                     monarch-host run app.wasm --hosts IP:7070 --token-file TOKEN --tls-dir {dir}",
                    if args.hosts.is_empty() {
                        String::new()
                    } else {
                        format!(" ({dir}/NAME/ for host NAME)")
                    }
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("monarch-host certs new: error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Writes the CA and host certificates; the files written.
fn new(args: &NewArgs) -> Result<Vec<PathBuf>, String> {
    for name in &args.hosts {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(format!(
                "`{name}` is not a host name for --hosts (it names a directory in --dir)"
            ));
        }
    }
    let dir = &args.dir;
    let ca_key_path = dir.join(CA_KEY_FILE);
    if !args.force && (ca_key_path.exists() || dir.join(CA_FILE).exists()) {
        return Err(format!(
            "{} already holds a cluster CA; its hosts' certificates would stop working with \
             new ones. Use another --dir, or --force to replace it",
            dir.display()
        ));
    }
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::hours(1);
    let not_after = now + time::Duration::days(i64::from(args.days));
    let failed = |what: &str, e: rcgen::Error| format!("cannot make {what}: {e}");

    let ca_key = KeyPair::generate().map_err(|e| failed("the CA key", e))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(|e| failed("the CA", e))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "monarch-host cluster CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| failed("the CA", e))?;
    let ca_pem = ca_cert.pem();
    let issuer = Issuer::new(ca, ca_key);

    let mut written = Vec::new();
    let mut write = |path: PathBuf, text: &str, mode: u32| -> Result<(), String> {
        monarch_cluster::write_atomic(&path, text.as_bytes(), mode).map_err(|e| e.to_string())?;
        written.push(path);
        Ok(())
    };
    write(dir.join(CA_FILE), &ca_pem, 0o644)?;
    write(ca_key_path, &issuer.key().serialize_pem(), 0o600)?;
    let host = host_cert(&issuer, None, not_before, not_after)?;
    write(dir.join(CERT_FILE), &host.0, 0o644)?;
    write(dir.join(KEY_FILE), &host.1, 0o600)?;
    for name in &args.hosts {
        let host_dir = dir.join(name);
        let (cert, key) = host_cert(&issuer, Some(name), not_before, not_after)?;
        write(host_dir.join(CA_FILE), &ca_pem, 0o644)?;
        write(host_dir.join(CERT_FILE), &cert, 0o644)?;
        write(host_dir.join(KEY_FILE), &key, 0o600)?;
    }
    Ok(written)
}

/// A host certificate and key, in PEM: DNS name `monarch-host` (and
/// `name`, as an IP or DNS name, when it is one), serverAuth and
/// clientAuth.
fn host_cert(
    issuer: &Issuer<'_, KeyPair>,
    name: Option<&str>,
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> Result<(String, String), String> {
    let what = name.unwrap_or("this host");
    let failed = |e: rcgen::Error| format!("cannot make the certificate of {what}: {e}");
    let key = KeyPair::generate().map_err(failed)?;
    let mut names = vec![SERVER_NAME.to_string()];
    if let Some(name) = name
        && name != SERVER_NAME
    {
        names.push(name.to_string());
    }
    // A name that cannot be a DNS name still gets its certificate, without it.
    let mut params = CertificateParams::new(names)
        .or_else(|_| CertificateParams::new(vec![SERVER_NAME.to_string()]))
        .map_err(failed)?;
    params
        .distinguished_name
        .push(DnType::CommonName, name.unwrap_or(SERVER_NAME));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.signed_by(&key, issuer).map_err(failed)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Reads a TLS directory and makes this process speak TLS on every TCP
/// channel connection.
pub(crate) fn install(dir: &Path) -> Result<(), String> {
    let dir =
        std::fs::canonicalize(dir).map_err(|e| format!("--tls-dir {}: {e}", dir.display()))?;
    let config = hyperactor::channel::tls::TlsConfig::from_dir(&dir)
        .map_err(|e| format!("--tls-dir: {e}"))?;
    hyperactor::channel::tls::install(config).map_err(|e| format!("--tls-dir: {e}"))
}
