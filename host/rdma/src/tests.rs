//! End-to-end tests: managers talking over loopback, in this process and
//! with a second OS process (this test binary, run again as the owner).

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::handle::ManagerId;
use crate::tcp::server::ServeGate;
use crate::tcp::wire::{Op, REQUEST_LEN, RESPONSE_LEN, Request, Response, Status};
use crate::{BackendKind, Buffer, Direction, RdmaConfig, RdmaError, RdmaManager, Transfer};

/// Deterministic bytes that differ at every position.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// FNV-1a over the bytes.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ byte as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn config() -> RdmaConfig {
    RdmaConfig {
        chunk_size: 256 * 1024,
        connections_per_peer: 4,
        op_timeout: Duration::from_secs(10),
        ..RdmaConfig::default()
    }
}

async fn pair() -> (RdmaManager, RdmaManager) {
    (
        RdmaManager::new(config()).await.unwrap(),
        RdmaManager::new(config()).await.unwrap(),
    )
}

fn filled(manager: &RdmaManager, bytes: &[u8]) -> Buffer {
    let buffer = manager.alloc(bytes.len()).unwrap();
    buffer.region().write(0, bytes).unwrap();
    buffer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd1_write_then_read_round_trip_of_a_few_mib() {
    let (a, b) = pair().await;
    let len = 3 * 1024 * 1024 + 12_345;
    let data = pattern(len, 1);
    let source = filled(&a, &data);
    let remote = b.alloc(len).unwrap();
    let back = a.alloc(len).unwrap();
    assert_eq!(a.backend_for(&source, &remote.handle()), BackendKind::Tcp);

    let moved = a
        .write_from(&source, 0, &remote.handle(), 0, len as u64)
        .await
        .unwrap();
    assert_eq!(moved, len as u64);
    assert_eq!(checksum(&remote.region().to_vec()), checksum(&data));

    let moved = a
        .read_into(&back, 0, &remote.handle(), 0, len as u64)
        .await
        .unwrap();
    assert_eq!(moved, len as u64);
    assert_eq!(checksum(&back.region().to_vec()), checksum(&data));
    assert!(back.region().to_vec() == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd5_offsets_move_exactly_the_requested_range() {
    let config = RdmaConfig {
        chunk_size: crate::MIN_CHUNK_SIZE,
        ..config()
    };
    let a = RdmaManager::new(config.clone()).await.unwrap();
    let b = RdmaManager::new(config).await.unwrap();
    let data = pattern(20_000, 2);
    let source = filled(&a, &data);
    let remote = b.alloc(30_000).unwrap();

    // 10,000 bytes from local offset 3 to remote offset 4097: three chunks
    // that start and end off the chunk grid.
    a.write_from(&source, 3, &remote.handle(), 4097, 10_000)
        .await
        .unwrap();
    let written = remote.region().to_vec();
    assert!(written[..4097].iter().all(|&b| b == 0));
    assert_eq!(&written[4097..14_097], &data[3..10_003]);
    assert!(written[14_097..].iter().all(|&b| b == 0));

    let back = a.alloc(20_000).unwrap();
    a.read_into(&back, 500, &remote.handle(), 5000, 7000)
        .await
        .unwrap();
    let read = back.region().to_vec();
    assert!(read[..500].iter().all(|&b| b == 0));
    assert_eq!(&read[500..7500], &written[5000..12_000]);
    assert!(read[7500..].iter().all(|&b| b == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd9_concurrent_transfers_share_a_bounded_connection_pool() {
    let config = RdmaConfig {
        chunk_size: 64 * 1024,
        connections_per_peer: 2,
        ..config()
    };
    let a = RdmaManager::new(config.clone()).await.unwrap();
    let b = RdmaManager::new(config).await.unwrap();
    let part = 300_000;
    let parts = 8;
    let data = pattern(part * parts, 3);
    let source = Arc::new(filled(&a, &data));
    let remote = b.alloc(part * parts).unwrap();
    let handle = remote.handle();

    let mut writes = Vec::new();
    for i in 0..parts {
        let (a, source, handle) = (a.clone(), Arc::clone(&source), handle.clone());
        let offset = (i * part) as u64;
        writes.push(tokio::spawn(async move {
            a.write_from(&source, offset, &handle, offset, part as u64)
                .await
        }));
    }
    for write in writes {
        assert_eq!(write.await.unwrap().unwrap(), part as u64);
    }
    assert!(remote.region().to_vec() == data);

    let back = Arc::new(a.alloc(part * parts).unwrap());
    let mut reads = Vec::new();
    for i in 0..parts {
        let (a, back, handle) = (a.clone(), Arc::clone(&back), handle.clone());
        let offset = (i * part) as u64;
        reads.push(tokio::spawn(async move {
            a.read_into(&back, offset, &handle, offset, part as u64)
                .await
        }));
    }
    for read in reads {
        assert_eq!(read.await.unwrap().unwrap(), part as u64);
    }
    assert!(back.region().to_vec() == data);
    let idle = a.idle_connections(b.tcp_addr());
    assert!(
        (1..=2).contains(&idle),
        "{idle} idle connections, at most 2 allowed"
    );
}

#[tokio::test]
async fn rd2_a_wrong_key_is_refused_and_nothing_is_written() {
    let (a, b) = pair().await;
    let source = filled(&a, &[9; 100]);
    let remote = b.alloc(100).unwrap();
    let mut forged = remote.handle();
    forged.key[0] ^= 1;
    let err = a.write_from(&source, 0, &forged, 0, 100).await.unwrap_err();
    assert_eq!(
        err,
        RdmaError::WrongKey {
            owner: b.id(),
            id: remote.handle().id()
        }
    );
    assert!(err.to_string().contains("key does not match"));
    assert!(remote.region().to_vec().iter().all(|&b| b == 0));
    let err = a.read_into(&source, 0, &forged, 0, 100).await.unwrap_err();
    assert!(matches!(err, RdmaError::WrongKey { .. }));
    // Transfers with the real handle still work afterwards.
    a.write_from(&source, 0, &remote.handle(), 0, 100)
        .await
        .unwrap();
    assert_eq!(remote.region().to_vec(), vec![9; 100]);
}

#[tokio::test]
async fn rd2_unknown_buffers_and_stale_handles_are_refused() {
    let (a, b) = pair().await;
    let local = a.alloc(16).unwrap();
    let remote = b.alloc(16).unwrap();

    let mut unknown = remote.handle();
    unknown.id = 999;
    let err = a.read_into(&local, 0, &unknown, 0, 16).await.unwrap_err();
    assert_eq!(
        err,
        RdmaError::UnknownBuffer {
            owner: b.id(),
            id: 999
        }
    );

    let mut stale = remote.handle();
    stale.owner = ManagerId([0x55; 16]);
    let err = a.read_into(&local, 0, &stale, 0, 16).await.unwrap_err();
    assert!(matches!(err, RdmaError::StaleHandle { addr, .. } if addr == b.tcp_addr()));

    // A buffer of another manager cannot be the local side.
    let err = a
        .read_into(&remote, 0, &local.handle(), 0, 16)
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::ForeignBuffer { .. }));
}

#[tokio::test]
async fn rd2_out_of_range_is_refused_before_sending_and_by_the_owner() {
    let (a, b) = pair().await;
    let local = a.alloc(100).unwrap();
    let remote = b.alloc(50).unwrap();

    let err = a
        .read_into(&local, 0, &remote.handle(), 10, 41)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        RdmaError::OutOfRange {
            side: crate::Side::Remote,
            buffer_len: 50,
            ..
        }
    ));
    let err = a
        .read_into(&local, 90, &remote.handle(), 0, 20)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        RdmaError::OutOfRange {
            side: crate::Side::Local,
            buffer_len: 100,
            ..
        }
    ));
    let err = a
        .read_into(&local, u64::MAX, &remote.handle(), 0, 2)
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaError::OutOfRange { .. }));

    // A handle that lies about the length is caught by the owner.
    let mut liar = remote.handle();
    liar.len = 100;
    let err = a.read_into(&local, 0, &liar, 0, 100).await.unwrap_err();
    assert_eq!(
        err,
        RdmaError::OutOfRange {
            side: crate::Side::Remote,
            offset: 0,
            len: 100,
            buffer_len: 50
        }
    );
}

#[tokio::test]
async fn rd2_zero_length_transfers_still_check_the_handle() {
    let (a, b) = pair().await;
    let local = a.alloc(8).unwrap();
    let remote = b.alloc(8).unwrap();
    assert_eq!(a.read_into(&local, 8, &remote.handle(), 8, 0).await, Ok(0));
    let mut forged = remote.handle();
    forged.key = [0; 16];
    assert!(matches!(
        a.read_into(&local, 0, &forged, 0, 0).await,
        Err(RdmaError::WrongKey { .. })
    ));
}

#[tokio::test]
async fn rd6_deregistered_buffers_are_refused() {
    let (a, b) = pair().await;
    let local = a.alloc(32).unwrap();
    let dropped = b.alloc(32).unwrap();
    let dropped_handle = dropped.handle();
    drop(dropped);
    let err = a
        .read_into(&local, 0, &dropped_handle, 0, 32)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RdmaError::Deregistered {
            owner: b.id(),
            id: dropped_handle.id()
        }
    );

    let deregistered = b.alloc(32).unwrap();
    let handle = deregistered.handle();
    a.read_into(&local, 0, &handle, 0, 32).await.unwrap();
    deregistered.deregister().await;
    let err = a.write_from(&local, 0, &handle, 0, 32).await.unwrap_err();
    assert!(matches!(err, RdmaError::Deregistered { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd1_a_buffer_deregistered_in_the_middle_fails_the_transfer() {
    let gate = ServeGate::new();
    let owner = RdmaManager::new(RdmaConfig {
        serve_gate: Some(Arc::clone(&gate)),
        ..config()
    })
    .await
    .unwrap();
    let reader = RdmaManager::new(RdmaConfig {
        chunk_size: crate::MIN_CHUNK_SIZE,
        connections_per_peer: 1,
        ..config()
    })
    .await
    .unwrap();
    let remote = filled(&owner, &pattern(64 * 1024, 4));
    let handle = remote.handle();
    let local = reader.alloc(64 * 1024).unwrap();

    gate.allow(1);
    let transfer = {
        let reader = reader.clone();
        tokio::spawn(async move { reader.read_into(&local, 0, &handle, 0, 64 * 1024).await })
    };
    // One chunk of sixteen has been served; the next waits at the gate.
    gate.wait_served(1).await;
    drop(remote);
    gate.allow(100);
    let err = transfer.await.unwrap().unwrap_err();
    assert!(matches!(err, RdmaError::Deregistered { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd1_a_peer_dropped_in_the_middle_fails_the_transfer_at_once() {
    let gate = ServeGate::new();
    let owner = RdmaManager::new(RdmaConfig {
        serve_gate: Some(Arc::clone(&gate)),
        ..config()
    })
    .await
    .unwrap();
    let writer = RdmaManager::new(RdmaConfig {
        chunk_size: crate::MIN_CHUNK_SIZE,
        connections_per_peer: 2,
        op_timeout: Duration::from_secs(10),
        ..config()
    })
    .await
    .unwrap();
    let remote = owner.alloc(64 * 1024).unwrap();
    let handle = remote.handle();
    let local = filled(&writer, &pattern(64 * 1024, 5));

    gate.allow(2);
    let started = Instant::now();
    let transfer = {
        let writer = writer.clone();
        tokio::spawn(async move { writer.write_from(&local, 0, &handle, 0, 64 * 1024).await })
    };
    gate.wait_served(2).await;
    drop(owner);
    let err = transfer.await.unwrap().unwrap_err();
    assert!(matches!(err, RdmaError::Connection { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}: the loss was noticed by the timeout, not the connection",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd1_a_peer_that_stops_answering_times_out() {
    let gate = ServeGate::new();
    let owner = RdmaManager::new(RdmaConfig {
        serve_gate: Some(Arc::clone(&gate)),
        ..config()
    })
    .await
    .unwrap();
    let reader = RdmaManager::new(config()).await.unwrap();
    let remote = owner.alloc(1024 * 1024).unwrap();
    let local = reader.alloc(1024 * 1024).unwrap();

    let started = Instant::now();
    let err = reader
        .transfer(Transfer {
            direction: Direction::Read,
            local: &local,
            local_offset: 0,
            remote: &remote.handle(),
            remote_offset: 0,
            len: 1024 * 1024,
            timeout: Some(Duration::from_millis(300)),
        })
        .await
        .unwrap_err();
    assert_eq!(err, RdmaError::Timeout(Duration::from_millis(300)));
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
    // The manager is still usable afterwards.
    gate.allow(1000);
    reader
        .read_into(&local, 0, &remote.handle(), 0, 1024 * 1024)
        .await
        .unwrap();
}

#[tokio::test]
async fn rd1_an_unreachable_peer_is_an_error() {
    let a = RdmaManager::new(config()).await.unwrap();
    let gone = RdmaManager::new(config()).await.unwrap();
    let remote = gone.alloc(16).unwrap();
    let handle = remote.handle();
    drop(remote);
    gone.shutdown();
    drop(gone);
    // Let the listener task see the shutdown and close the socket.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let local = a.alloc(16).unwrap();
    let err = a.read_into(&local, 0, &handle, 0, 16).await.unwrap_err();
    assert!(matches!(err, RdmaError::Connection { .. }), "{err}");
    assert!(err.to_string().contains("cannot connect"));
}

#[tokio::test]
async fn rd1_a_shut_down_manager_refuses_new_transfers() {
    let (a, b) = pair().await;
    let local = a.alloc(16).unwrap();
    let remote = b.alloc(16).unwrap();
    a.shutdown();
    assert_eq!(
        a.read_into(&local, 0, &remote.handle(), 0, 16).await,
        Err(RdmaError::Shutdown)
    );
}

async fn raw_request(stream: &mut TcpStream, request: &Request) -> Response {
    stream.write_all(&request.encode()).await.unwrap();
    let mut header = [0u8; RESPONSE_LEN];
    stream.read_exact(&mut header).await.unwrap();
    Response::decode(&header).unwrap()
}

/// Reads until the peer closes; fails if it stays open for two seconds.
async fn assert_closed(stream: &mut TcpStream) {
    let mut sink = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the listener kept a connection that sent garbage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd3_garbage_closes_its_connection_and_the_listener_keeps_serving() {
    let (a, b) = pair().await;
    let remote = filled(&b, &pattern(4096, 6));
    let handle = remote.handle();

    let mut garbage = TcpStream::connect(b.tcp_addr()).await.unwrap();
    garbage.write_all(&pattern(1000, 7)).await.unwrap();
    assert_closed(&mut garbage).await;

    // Well framed but asking for more than any chunk may be.
    let mut huge = TcpStream::connect(b.tcp_addr()).await.unwrap();
    let mut header = Request {
        op: Op::Write,
        owner: handle.owner,
        buffer: handle.id,
        key: handle.key,
        offset: 0,
        len: 0,
    }
    .encode();
    header[56..64].copy_from_slice(&u64::MAX.to_le_bytes());
    huge.write_all(&header).await.unwrap();
    assert_closed(&mut huge).await;

    // A header cut short, then the end of the stream.
    let mut short = TcpStream::connect(b.tcp_addr()).await.unwrap();
    short.write_all(&header[..REQUEST_LEN / 2]).await.unwrap();
    short.shutdown().await.unwrap();
    assert_closed(&mut short).await;

    // A refused request keeps its connection: the next one on it is served.
    let mut polite = TcpStream::connect(b.tcp_addr()).await.unwrap();
    let refused = raw_request(
        &mut polite,
        &Request {
            op: Op::Write,
            owner: handle.owner,
            buffer: handle.id,
            key: [0; 16],
            offset: 0,
            len: 0,
        },
    )
    .await;
    assert_eq!(refused.status, Status::WrongKey);
    let ok = raw_request(
        &mut polite,
        &Request {
            op: Op::Read,
            owner: handle.owner,
            buffer: handle.id,
            key: handle.key,
            offset: 100,
            len: 10,
        },
    )
    .await;
    assert_eq!(ok, Response::ok(10));
    let mut data = [0u8; 10];
    polite.read_exact(&mut data).await.unwrap();
    assert_eq!(&data, &pattern(4096, 6)[100..110]);

    // And ordinary transfers still work.
    let local = a.alloc(4096).unwrap();
    a.read_into(&local, 0, &handle, 0, 4096).await.unwrap();
    assert_eq!(local.region().to_vec(), pattern(4096, 6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd6_a_stalled_peer_cannot_hold_up_a_deregistration() {
    let owner = RdmaManager::new(config()).await.unwrap();
    let len = crate::MAX_CHUNK_SIZE;
    let reading = owner.alloc(len).unwrap();
    let writing = owner.alloc(len).unwrap();

    // A peer asks for a whole chunk and never reads it: the owner blocks
    // sending once the socket buffers are full.
    let read_handle = reading.handle();
    let mut reader = TcpStream::connect(owner.tcp_addr()).await.unwrap();
    let response = raw_request(
        &mut reader,
        &Request {
            op: Op::Read,
            owner: read_handle.owner,
            buffer: read_handle.id,
            key: read_handle.key,
            offset: 0,
            len: len as u64,
        },
    )
    .await;
    assert_eq!(response, Response::ok(len as u64));
    // Another announces a whole chunk and sends only part of it.
    let write_handle = writing.handle();
    let mut writer = TcpStream::connect(owner.tcp_addr()).await.unwrap();
    let header = Request {
        op: Op::Write,
        owner: write_handle.owner,
        buffer: write_handle.id,
        key: write_handle.key,
        offset: 0,
        len: len as u64,
    };
    writer.write_all(&header.encode()).await.unwrap();
    writer.write_all(&[1u8; 4096]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    for buffer in [reading, writing] {
        tokio::time::timeout(Duration::from_secs(5), buffer.deregister())
            .await
            .expect("deregister waited for a peer that stopped");
    }
    assert_closed(&mut reader).await;
    assert_closed(&mut writer).await;
}

#[tokio::test]
async fn local_transfers_copy_within_one_manager_after_the_same_checks() {
    let a = RdmaManager::new(config()).await.unwrap();
    let source = filled(&a, b"0123456789");
    let target = a.alloc(10).unwrap();
    assert_eq!(a.backend_for(&target, &source.handle()), BackendKind::Local);
    a.read_into(&target, 2, &source.handle(), 5, 5)
        .await
        .unwrap();
    assert_eq!(target.region().to_vec(), b"\x00\x0056789\x00\x00\x00");
    // Overlapping ranges of one buffer.
    a.write_from(&source, 0, &source.handle(), 1, 9)
        .await
        .unwrap();
    assert_eq!(source.region().to_vec(), b"0012345678");
    let mut forged = source.handle();
    forged.key[3] ^= 0x80;
    assert!(matches!(
        a.read_into(&target, 0, &forged, 0, 1).await,
        Err(RdmaError::WrongKey { .. })
    ));
}

/// A `tracing` writer that keeps what it is given.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock())
            .matches(needle)
            .count()
    }
}

#[tokio::test]
async fn rd7_a_pair_that_falls_back_to_tcp_is_warned_about_once() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    // The warning is logged by the task that runs the transfer: this one.
    let _guard = tracing::subscriber::set_default(subscriber);
    const WARNING: &str = "RDMA is not available between these managers";

    // ibverbs is wanted (the default) but no device opens here.
    let a = RdmaManager::new(config()).await.unwrap();
    assert!(
        a.ibverbs_unavailable()
            .unwrap()
            .starts_with("no RDMA device")
    );
    let b = RdmaManager::new(config()).await.unwrap();
    let c = RdmaManager::new(config()).await.unwrap();
    let local = a.alloc(64).unwrap();
    let on_b = b.alloc(64).unwrap();
    let on_c = c.alloc(64).unwrap();

    for _ in 0..3 {
        a.read_into(&local, 0, &on_b.handle(), 0, 64).await.unwrap();
    }
    assert_eq!(captured.count(WARNING), 1);
    a.write_from(&local, 0, &on_c.handle(), 0, 64)
        .await
        .unwrap();
    a.write_from(&local, 0, &on_c.handle(), 0, 64)
        .await
        .unwrap();
    assert_eq!(captured.count(WARNING), 2);
    // The other direction is another manager's pair, warned by that manager.
    b.read_into(&on_b, 0, &local.handle(), 0, 64).await.unwrap();
    assert_eq!(captured.count(WARNING), 3);

    // A peer that advertises a device it cannot reach here: still TCP, and
    // the same once-per-pair rule.
    let mut advertising = on_c.handle();
    advertising.ibverbs = Some(crate::IbvRemote {
        endpoint: crate::IbvEndpoint {
            gid: [1; 16],
            lid: 1,
        },
        addr: 0x1000,
        rkey: 1,
    });
    assert_eq!(a.backend_for(&local, &advertising), BackendKind::Tcp);
    a.read_into(&local, 0, &advertising, 0, 64).await.unwrap();
    assert_eq!(captured.count(WARNING), 3);

    // With ibverbs turned off, TCP is what was asked for: no warning.
    let mut quiet_config = config();
    quiet_config.ibverbs.enabled = false;
    let quiet = RdmaManager::new(quiet_config).await.unwrap();
    assert_eq!(quiet.ibverbs_unavailable(), None);
    let quiet_local = quiet.alloc(64).unwrap();
    quiet
        .read_into(&quiet_local, 0, &on_b.handle(), 0, 64)
        .await
        .unwrap();
    assert_eq!(captured.count(WARNING), 3);
}

#[test]
fn handles_made_by_a_manager_survive_encoding() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (a, b) = pair().await;
        let remote = filled(&b, b"payload");
        let decoded = crate::BufferHandle::from_bytes(&remote.handle().to_bytes()).unwrap();
        let json: crate::BufferHandle =
            serde_json::from_str(&serde_json::to_string(&remote.handle()).unwrap()).unwrap();
        let local = a.alloc(7).unwrap();
        a.read_into(&local, 0, &decoded, 0, 7).await.unwrap();
        assert_eq!(local.region().to_vec(), b"payload");
        a.read_into(&local, 0, &json, 0, 7).await.unwrap();
    });
}

const CHILD_ENV: &str = "MONARCH_RDMA_TEST_OWNER";
const CHILD_BUFFER: usize = 4 * 1024 * 1024;
/// Requests the child serves before it stops answering: a 4 MiB write and a
/// 4 MiB read in 1 MiB chunks, then three chunks of the transfer that is cut off.
const CHILD_ALLOWED_REQUESTS: usize = 4 + 4 + 3;

/// Run by `rd1_an_owner_in_another_process_serves_and_its_death_is_an_error`
/// as the owner process; does nothing when run on its own.
#[test]
#[ignore = "the owner side of a two-process test; the parent test runs it"]
fn child_owner_process() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let gate = ServeGate::new();
        gate.allow(CHILD_ALLOWED_REQUESTS);
        let owner = RdmaManager::new(RdmaConfig {
            serve_gate: Some(gate),
            ..config()
        })
        .await
        .unwrap();
        let buffer = owner.alloc(CHILD_BUFFER).unwrap();
        let hex: String = buffer
            .handle()
            .to_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let mut stdout = std::io::stdout();
        writeln!(stdout, "HANDLE {hex}").unwrap();
        stdout.flush().unwrap();
        // Serve until the parent closes stdin (or kills this process).
        let mut stdin = tokio::io::stdin();
        let mut sink = Vec::new();
        let _ = stdin.read_to_end(&mut sink).await;
        drop(buffer);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd1_an_owner_in_another_process_serves_and_its_death_is_an_error() {
    use tokio::io::AsyncBufReadExt;

    let exe = std::env::current_exe().unwrap();
    let mut child = tokio::process::Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "tests::child_owner_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let handle = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // libtest may have written the test's name on the same line.
            if let Some((_, hex)) = line.split_once("HANDLE ") {
                let bytes: Vec<u8> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect();
                return crate::BufferHandle::from_bytes(&bytes).unwrap();
            }
        }
        panic!("the owner process ended without printing its handle");
    })
    .await
    .expect("the owner process did not start in time");

    let parent = RdmaManager::new(RdmaConfig {
        chunk_size: 1024 * 1024,
        connections_per_peer: 2,
        op_timeout: Duration::from_secs(10),
        ..config()
    })
    .await
    .unwrap();
    let data = pattern(CHILD_BUFFER, 8);
    let source = filled(&parent, &data);
    let back = parent.alloc(CHILD_BUFFER).unwrap();
    parent
        .write_from(&source, 0, &handle, 0, CHILD_BUFFER as u64)
        .await
        .unwrap();
    parent
        .read_into(&back, 0, &handle, 0, CHILD_BUFFER as u64)
        .await
        .unwrap();
    assert_eq!(checksum(&back.region().to_vec()), checksum(&data));

    // The owner serves three more chunks, then stops answering; killing it
    // must fail the transfer through the connection, well before the timeout.
    let started = Instant::now();
    let transfer = {
        let parent = parent.clone();
        let handle = handle.clone();
        tokio::spawn(async move {
            parent
                .read_into(&back, 0, &handle, 0, CHILD_BUFFER as u64)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !transfer.is_finished(),
        "the owner served more than it was allowed"
    );
    child.kill().await.unwrap();
    let err = transfer.await.unwrap().unwrap_err();
    assert!(matches!(err, RdmaError::Connection { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
