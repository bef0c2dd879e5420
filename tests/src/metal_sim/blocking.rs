//! [`BlockingHttp`]: a minimal blocking HTTP/1.1 client over
//! [`std::net::TcpStream`], implementing the core's [`HttpClient`] port so
//! that the real Metal client runs natively against the simulator.
//!
//! One connection per request (`Connection: close`), plain `http://` only,
//! `Content-Length` or chunked answers, within the request's
//! [`Deadline`]. A connection closed before a whole answer arrived
//! (`Dropped`: how the client sees the simulator's `Drop` and
//! `CrashAfter` faults), a refused connection (`Unreachable`) and a
//! timeout (`Timeout`: a `Latency` fault longer than the deadline) are
//! [`TransportError`]s of their kind, as `wasi:http` reports them.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use metal_ipam_core::ports::http::{Deadline, HttpClient, TransportError, TransportKind};

/// A blocking HTTP/1.1 client (see the module docs).
#[derive(Debug, Clone)]
pub struct BlockingHttp {
    timeout: Duration,
}

impl Default for BlockingHttp {
    fn default() -> Self {
        BlockingHttp::new()
    }
}

impl BlockingHttp {
    /// A client with a 10 s connect, read and write timeout.
    pub fn new() -> BlockingHttp {
        BlockingHttp::with_timeout(Duration::from_secs(10))
    }

    /// A client whose connect, read and write timeouts are `timeout`.
    pub fn with_timeout(timeout: Duration) -> BlockingHttp {
        BlockingHttp { timeout }
    }
}

fn transport(e: impl std::fmt::Display) -> TransportError {
    TransportError::new(TransportKind::Dropped, e.to_string())
}

/// An I/O error after connecting: a timeout, or a broken connection.
fn io(e: std::io::Error) -> TransportError {
    let kind = match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => TransportKind::Timeout,
        _ => TransportKind::Dropped,
    };
    TransportError::new(kind, e.to_string())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, TransportError> {
    let mut out = Vec::new();
    loop {
        let line_end = find(raw, b"\r\n").ok_or_else(|| transport("truncated chunked body"))?;
        let size_text = std::str::from_utf8(&raw[..line_end]).map_err(transport)?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| transport(format!("bad chunk size {size_text:?}")))?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if raw.len() < size + 2 {
            return Err(transport("truncated chunked body"));
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

impl HttpClient for BlockingHttp {
    fn send(&self, req: http::Request<Vec<u8>>) -> Result<http::Response<Vec<u8>>, TransportError> {
        let uri = req.uri();
        if uri.scheme_str() != Some("http") {
            return Err(transport(format!("only http:// URLs are supported: {uri}")));
        }
        let host = uri.host().ok_or_else(|| transport("no host in the URL"))?;
        let port = uri.port_u16().unwrap_or(80);
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(transport)?
            .next()
            .ok_or_else(|| transport(format!("{host} does not resolve")))?;
        // The request's deadline where the caller set one (the core's
        // clients always do), within this client's own limit: connecting
        // within its connect timeout, and the whole call by its total (each
        // read and write waits no longer than what is left).
        let deadline = Deadline::of(&req);
        let (connect, total) = if Deadline::is_set(&req) {
            let ms = |v: u64| self.timeout.min(Duration::from_millis(v.max(1)));
            (ms(deadline.timeouts().connect_ms), ms(deadline.total_ms))
        } else {
            (self.timeout, self.timeout)
        };
        let end = Instant::now() + total;
        let left = || {
            end.checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| TransportError::new(TransportKind::Timeout, "deadline passed"))
        };
        let mut stream = TcpStream::connect_timeout(&addr, connect)
            .map_err(|e| TransportError::new(TransportKind::Unreachable, e.to_string()))?;
        stream.set_write_timeout(Some(left()?)).map_err(io)?;
        let target = uri.path_and_query().map_or("/", |pq| pq.as_str());
        let mut head = format!(
            "{} {target} HTTP/1.1\r\nhost: {host}:{port}\r\nconnection: close\r\ncontent-length: {}\r\n",
            req.method(),
            req.body().len()
        );
        for (name, value) in req.headers() {
            if matches!(name.as_str(), "host" | "connection" | "content-length") {
                continue;
            }
            let value = value.to_str().map_err(transport)?;
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).map_err(io)?;
        stream.write_all(req.body()).map_err(io)?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            stream.set_read_timeout(Some(left()?)).map_err(io)?;
            match stream.read(&mut buf).map_err(io)? {
                0 => break,
                n => raw.extend_from_slice(&buf[..n]),
            }
        }
        if raw.is_empty() {
            return Err(transport("the connection closed without an answer"));
        }
        let head_end =
            find(&raw, b"\r\n\r\n").ok_or_else(|| transport("the answer's head is incomplete"))?;
        let head = std::str::from_utf8(&raw[..head_end]).map_err(transport)?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| transport(format!("bad status line {status_line:?}")))?;
        let mut builder = http::Response::builder().status(status);
        let mut length: Option<usize> = None;
        let mut chunked = false;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().ok();
            }
            if name.eq_ignore_ascii_case("transfer-encoding") && value.contains("chunked") {
                chunked = true;
            }
            builder = builder.header(name, value);
        }
        let rest = &raw[head_end + 4..];
        let body = if chunked {
            dechunk(rest)?
        } else if let Some(n) = length {
            if rest.len() < n {
                return Err(transport("the connection closed in the middle of the body"));
            }
            rest[..n].to_vec()
        } else {
            rest.to_vec()
        };
        builder.body(body).map_err(transport)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_decode() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert!(dechunk(b"5\r\nab").is_err());
    }
}
