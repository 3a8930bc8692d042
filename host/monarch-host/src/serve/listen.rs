//! The server's accept loop: HTTP/1.1 connections served by hyper, each
//! with a deadline for its request headers, so that a client sending them
//! a byte at a time (slowloris) is cut off rather than holding a
//! connection and a task for ever. Request bodies have their own deadline
//! (`--body-timeout`, enforced where they are read: `handlers`).
//!
//! - LS-1: a connection whose request headers have not all arrived
//!   `header_timeout` after they began is closed.
//! - LS-2: on stop, no new connection is accepted; open ones finish
//!   their request in flight and close.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Serves `router` on `listener` until `stopped` resolves (LS-2).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    header_timeout: Duration,
    stopped: impl std::future::Future<Output = ()>,
) {
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(stopped);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stopped => break,
            // Reap finished connections as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (tcp, _peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, usually: wait rather than spin.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Log streams write small events: without TCP_NODELAY an event
        // after the headers waits ~40 ms for a delayed ACK.
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stopping = stopping.clone();
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let connection = builder.serve_connection(TokioIo::new(tcp), service);
            tokio::pin!(connection);
            loop {
                tokio::select! {
                    served = connection.as_mut() => {
                        if let Err(e) = served {
                            tracing::debug!(error = %e, "a connection ended with an error");
                        }
                        break;
                    }
                    changed = stopping.changed() => {
                        connection.as_mut().graceful_shutdown();
                        if changed.is_err() {
                            // The loop is gone: the shutdown above was
                            // the last word.
                            let _ = connection.as_mut().await;
                            break;
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
}
