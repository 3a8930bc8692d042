//! Two procs over TLS (`channel::tls`): a test binary of its own, since
//! TLS is installed for the whole process.

use std::path::PathBuf;
use std::time::Duration;

use hyperactor::channel::tls::{self, TlsConfig};
use hyperactor::testing::{Echo, EchoActor, Numbered, StreamReport};
use hyperactor::{ChannelAddr, Proc, ProcConfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A TLS directory as `monarch-host certs new` makes one.
fn tls_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hyperactor-tls-procs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "test cluster CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut host = CertificateParams::new(vec![tls::SERVER_NAME.to_string()]).unwrap();
    host.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = host.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join(tls::CA_FILE), ca_cert.pem()).unwrap();
    std::fs::write(dir.join(tls::CERT_FILE), cert.pem()).unwrap();
    std::fs::write(dir.join(tls::KEY_FILE), key.serialize_pem()).unwrap();
    dir
}

/// TL-1: with TLS installed, calls between two procs on 127.0.0.1 carry
/// payloads past 1 MiB intact, and a burst of thousands of messages
/// arrives whole and in order; TL-3: while a silent client holds a
/// connection to the receiving proc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tl1_procs_talk_over_tls() {
    let dir = tls_dir();
    tls::install(TlsConfig::from_dir(&dir).unwrap()).unwrap();
    assert_eq!(
        tls::installed().map(|c| c.dir().to_path_buf()),
        Some(dir.clone())
    );
    let config = ProcConfig {
        delivery_timeout: Duration::from_secs(10),
        ..ProcConfig::default()
    };
    let tcp: ChannelAddr = "tcp:127.0.0.1:0".parse().unwrap();
    let a = Proc::serve_with_config("a", tcp.clone(), config.clone())
        .await
        .unwrap();
    let b = Proc::serve_with_config("b", tcp, config).await.unwrap();
    let echo = b.spawn("echo", 0, EchoActor::default()).unwrap().bind();
    let (client, _) = a.attach("client").unwrap();
    // TL-3: a client that connects and never says a word holds up nobody.
    let ChannelAddr::Tcp(b_addr) = b.id().addr().clone() else {
        panic!("b serves TCP");
    };
    let _silent = std::net::TcpStream::connect(b_addr).unwrap();
    let started = std::time::Instant::now();
    let first = echo.call(&client, |reply| Echo {
        payload: b"first".to_vec(),
        reply,
    });
    assert_eq!(first.await.unwrap(), b"first");
    assert!(
        started.elapsed() < tls::HANDSHAKE_TIMEOUT,
        "the first call waited for the silent client's handshake"
    );

    for len in [8, 1 << 20, (3 << 20) + 5, 100] {
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let back = tokio::time::timeout(
            Duration::from_secs(20),
            echo.call(&client, |reply| Echo {
                payload: payload.clone(),
                reply,
            }),
        )
        .await
        .expect("no answer over TLS")
        .unwrap();
        assert!(back == payload, "a {len}-byte payload came back changed");
    }

    for seq in 0..5000 {
        echo.send(&client, Numbered { stream: 1, seq });
    }
    let stats = tokio::time::timeout(
        Duration::from_secs(20),
        echo.call(&client, |reply| StreamReport { stream: 1, reply }),
    )
    .await
    .expect("no report over TLS")
    .unwrap();
    assert_eq!(stats.received, 5000);
    assert_eq!(stats.out_of_order, 0);

    // Installing the same directory again is harmless; another is refused.
    tls::install(TlsConfig::from_dir(&dir).unwrap()).unwrap();
    let other = tls_dir_other(&dir);
    let err = tls::install(TlsConfig::from_dir(&other).unwrap()).unwrap_err();
    assert!(err.to_string().contains("already"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&other).ok();
}

/// A copy of `dir` under another name.
fn tls_dir_other(dir: &std::path::Path) -> PathBuf {
    let other = dir.with_extension("copy");
    std::fs::create_dir_all(&other).unwrap();
    for file in [tls::CA_FILE, tls::CERT_FILE, tls::KEY_FILE] {
        std::fs::copy(dir.join(file), other.join(file)).unwrap();
    }
    other
}
