//! TLS on the listener (`server.tls_cert`, `server.tls_key`): for a proxy reached across a
//! network rather than from the agents' own machine, with no TLS-terminating front of its
//! own. Plain HTTP stays the default.
//!
//! The serving loop wraps each accepted (watched) socket in a [`ClientIo`], which does the
//! handshake on its first read or write, so that a slow handshake holds up only its own
//! connection, under the same idle and header limits as a plain one (its bytes arrive
//! through the same [`Watched`] socket). TLS offers `http/1.1` only by ALPN: the listener
//! speaks HTTP/1.1 alone, plain or not (the serving loop in `src/proxy/mod.rs` says why).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::TlsAcceptor;

use super::connection::Watched;

/// A client connection's socket: plain, or TLS once its handshake is done.
pub enum ClientIo {
    Plain(Watched),
    Handshaking(Box<tokio_rustls::Accept<Watched>>),
    Tls(Box<tokio_rustls::server::TlsStream<Watched>>),
    /// The handshake failed; every read and write says so.
    Failed,
}

/// `io` as the listener serves it: through `tls`'s handshake when there is one.
pub fn wrap(tls: Option<&TlsAcceptor>, io: Watched) -> ClientIo {
    match tls {
        Some(acceptor) => ClientIo::Handshaking(Box::new(acceptor.accept(io))),
        None => ClientIo::Plain(io),
    }
}

impl ClientIo {
    /// Drives the handshake; ready once the socket can carry data (or never will).
    fn handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let ClientIo::Handshaking(accept) = self {
            match Pin::new(accept.as_mut()).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(stream)) => *self = ClientIo::Tls(Box::new(stream)),
                Poll::Ready(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake with a client failed");
                    *self = ClientIo::Failed;
                    return Poll::Ready(Err(e));
                }
            }
        }
        match self {
            ClientIo::Failed => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the TLS handshake failed",
            ))),
            _ => Poll::Ready(Ok(())),
        }
    }
}

/// Runs `$body` on the connected stream (plain or TLS) once the handshake is done. A plain
/// socket (the default) goes straight to it: every read and write of every connection
/// comes this way.
macro_rules! connected {
    ($self:ident, $cx:ident, |$io:ident| $body:expr) => {{
        let this = &mut *$self;
        if let ClientIo::Plain($io) = this {
            let $io = Pin::new($io);
            return $body;
        }
        if let Err(e) = std::task::ready!(this.handshake($cx)) {
            return Poll::Ready(Err(e));
        }
        match this {
            ClientIo::Plain($io) => {
                let $io = Pin::new($io);
                $body
            }
            ClientIo::Tls($io) => {
                let $io = Pin::new($io.as_mut());
                $body
            }
            ClientIo::Handshaking(_) | ClientIo::Failed => {
                Poll::Ready(Err(io::Error::from(io::ErrorKind::NotConnected)))
            }
        }
    }};
}

impl AsyncRead for ClientIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        connected!(self, cx, |io| io.poll_read(cx, buf))
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        connected!(self, cx, |io| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        connected!(self, cx, |io| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientIo::Plain(io) => io.is_write_vectored(),
            ClientIo::Tls(io) => io.is_write_vectored(),
            ClientIo::Handshaking(_) | ClientIo::Failed => false,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        connected!(self, cx, |io| io.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        connected!(self, cx, |io| io.poll_shutdown(cx))
    }
}
