//! Transports: a small frame reader/writer abstraction, a connection driver
//! that serves requests concurrently on a worker pool (with Tflush handled
//! here), and stream listeners for unix and TCP sockets.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

use thiserror::Error;

use crate::message::{kind, parse_header, NOTAG};
use crate::server::{Server, Session, MIN_FRAME};
use crate::wire::Writer;

/// What [`FrameReader::read_frame`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// `buf` holds one complete frame.
    Message,
    /// The frame was larger than allowed and was discarded; reply Rlerror to `tag`.
    Oversized {
        /// Tag of the discarded request.
        tag: u16,
    },
    /// The peer closed the connection.
    Eof,
}

/// Source of request frames (one reader thread per connection).
pub trait FrameReader: Send {
    /// Reads the next frame into `buf` (replacing its contents); frames larger
    /// than `max` are consumed and reported as [`Frame::Oversized`].
    fn read_frame(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<Frame>;

    /// True when more input is already buffered (the client pipelined).
    fn has_buffered(&self) -> bool {
        false
    }
}

/// Sink of response frames, shared by the workers.
pub trait FrameWriter: Send + Sync {
    /// Writes one complete frame atomically with respect to other frames.
    fn write_frame(&self, frame: &[u8]) -> io::Result<()>;
}

/// Frame reader over a byte stream (`size[4]`-delimited frames), buffered so
/// that one read system call picks up every request the client pipelined.
#[derive(Debug)]
pub struct StreamReader<R>(pub io::BufReader<R>);

impl<R: Read> StreamReader<R> {
    /// Wraps a stream with a 128 KiB read buffer.
    pub fn new(inner: R) -> Self {
        StreamReader(io::BufReader::with_capacity(128 * 1024, inner))
    }
}

impl<R: Read + Send> FrameReader for StreamReader<R> {
    fn has_buffered(&self) -> bool {
        !self.0.buffer().is_empty()
    }

    fn read_frame(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<Frame> {
        let mut size = [0u8; 4];
        match self.0.read_exact(&mut size) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Frame::Eof),
            other => other?,
        }
        let n = u32::from_le_bytes(size) as usize;
        if n < MIN_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame size {n} below the 7-byte header"),
            ));
        }
        buf.clear();
        buf.extend_from_slice(&size);
        if n > max {
            let mut head = [0u8; 3];
            self.0.read_exact(&mut head)?;
            let tag = u16::from_le_bytes([head[1], head[2]]);
            let skip = (n - MIN_FRAME) as u64;
            let copied = io::copy(&mut (&mut self.0).take(skip), &mut io::sink())?;
            if copied != skip {
                return Ok(Frame::Eof);
            }
            return Ok(Frame::Oversized { tag });
        }
        buf.resize(n, 0);
        match self.0.read_exact(&mut buf[4..]) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(Frame::Eof),
            Err(e) => Err(e),
            Ok(()) => Ok(Frame::Message),
        }
    }
}

/// Frame writer over a byte stream.
#[derive(Debug)]
pub struct StreamWriter<W>(pub Mutex<W>);

impl<W: Write + Send> FrameWriter for StreamWriter<W> {
    fn write_frame(&self, frame: &[u8]) -> io::Result<()> {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        w.write_all(frame)
    }
}

/// Connection driver options.
#[derive(Debug, Clone, Copy)]
pub struct DriverOptions {
    /// Worker threads serving requests of one connection.
    pub workers: usize,
    /// Requests queued before the reader stops reading (backpressure).
    pub max_queued: usize,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            workers: 8,
            max_queued: 4096,
        }
    }
}

struct Job {
    tag: u16,
    frame: Vec<u8>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Tags being served → tags of Tflush requests waiting for them.
    inflight: HashMap<u16, Vec<u16>>,
    closed: bool,
}

struct Shared {
    q: Mutex<Queue>,
    work: Condvar,
    space: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn small_reply(w: &dyn FrameWriter, rkind: u8, tag: u16, code: Option<u32>) -> io::Result<()> {
    let mut out = Vec::with_capacity(16);
    let mut m = Writer::begin(&mut out, rkind, tag);
    if let Some(c) = code {
        m.u32(c);
    }
    m.finish();
    w.write_frame(&out)
}

/// Serves one connection until the peer closes it: one reader (this thread)
/// and `opts.workers` workers. Returns the reader's I/O error, if any.
pub fn serve_connection(
    session: Arc<Session>,
    mut reader: impl FrameReader,
    writer: Arc<dyn FrameWriter>,
    opts: DriverOptions,
) -> io::Result<()> {
    let shared = Arc::new(Shared {
        q: Mutex::new(Queue::default()),
        work: Condvar::new(),
        space: Condvar::new(),
    });
    let workers: Vec<_> = (0..opts.workers.max(1))
        .map(|_| {
            let (shared, session, writer) = (shared.clone(), session.clone(), writer.clone());
            std::thread::spawn(move || worker(&shared, &session, &*writer))
        })
        .collect();
    let result = read_loop(&session, &mut reader, &*writer, &shared, opts);
    shared.lock().closed = true;
    shared.work.notify_all();
    for w in workers {
        let _ = w.join();
    }
    result
}

/// Replies gathered by the reader are written once this much is pending
/// (and always before the reader could wait for anything).
const REPLY_BATCH: usize = 64 * 1024;

/// Writes the replies gathered in `out` (one system call for all of them).
fn flush_replies(writer: &dyn FrameWriter, out: &mut Vec<u8>) -> io::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    writer.write_frame(out)?;
    out.clear();
    // Keep big read replies from pinning memory between requests.
    if out.capacity() > 1 << 20 {
        *out = Vec::with_capacity(REPLY_BATCH);
    }
    Ok(())
}

/// The reader: serves every request that needs no waiting (cached lookups
/// and reads, getattr, clunk: [`Session::handle_nowait`]) itself, in the
/// order read, gathering the replies of everything the client pipelined into
/// one write; hands the others to the workers, so a request waiting for the
/// disk never holds up the rest.
fn read_loop(
    session: &Session,
    reader: &mut impl FrameReader,
    writer: &dyn FrameWriter,
    shared: &Shared,
    opts: DriverOptions,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(REPLY_BATCH);
    let mut frame = Vec::new();
    loop {
        if !reader.has_buffered() || out.len() >= REPLY_BATCH {
            // Reading on would wait for the client: send what it waits for.
            flush_replies(writer, &mut out)?;
        }
        // The limit is re-read each time: Tversion may lower it.
        let max = session.msize() as usize;
        let tag = match reader.read_frame(&mut frame, max)? {
            Frame::Eof => return flush_replies(writer, &mut out),
            Frame::Oversized { tag } => {
                Session::rlerror(&mut out, tag, libc::EMSGSIZE as u32);
                continue;
            }
            Frame::Message => parse_header(&frame).map(|h| h.tag).unwrap_or(NOTAG),
        };
        let is_flush = frame.len() == MIN_FRAME + 2 && frame[4] == kind::TFLUSH;
        if is_flush {
            let oldtag = u16::from_le_bytes([frame[7], frame[8]]);
            let mut q = shared.lock();
            if let Some(i) = q.jobs.iter().position(|j| j.tag == oldtag) {
                // Not started: drop it; it gets no reply.
                q.jobs.remove(i);
                shared.space.notify_one();
            } else if let Some(waiters) = q.inflight.get_mut(&oldtag) {
                // Being served: Rflush follows its reply.
                waiters.push(tag);
                continue;
            }
            drop(q);
            // After the old request's reply, if that is still in `out`.
            Writer::begin(&mut out, kind::TFLUSH + 1, tag).finish();
            continue;
        }
        if session.handle_nowait(&frame, &mut out).is_some() {
            continue;
        }
        let mut q = shared.lock();
        if q.jobs.is_empty() && !reader.has_buffered() {
            // No backlog and nothing more buffered: the client waits for
            // this reply, so serve it here and save two thread hand-offs
            // (requests already with workers keep running in parallel).
            drop(q);
            flush_replies(writer, &mut out)?;
            session.handle(&frame, &mut out);
            continue;
        }
        if q.jobs.len() >= opts.max_queued {
            drop(q);
            flush_replies(writer, &mut out)?;
            q = shared.lock();
            while q.jobs.len() >= opts.max_queued {
                q = shared.space.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        }
        q.jobs.push_back(Job {
            tag,
            frame: std::mem::take(&mut frame),
        });
        drop(q);
        shared.work.notify_one();
    }
}

fn worker(shared: &Shared, session: &Session, writer: &dyn FrameWriter) {
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        let job = {
            let mut q = shared.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    q.inflight.insert(job.tag, Vec::new());
                    shared.space.notify_one();
                    break job;
                }
                if q.closed {
                    return;
                }
                q = shared.work.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        out.clear();
        session.handle(&job.frame, &mut out);
        if let Err(e) = writer.write_frame(&out) {
            tracing::debug!(error = %e, "9p reply not delivered");
        }
        // Keep big read buffers from pinning memory between requests.
        if out.capacity() > 1 << 20 {
            out = Vec::with_capacity(64 * 1024);
        }
        let waiters = shared.lock().inflight.remove(&job.tag).unwrap_or_default();
        for flush_tag in waiters {
            let _ = small_reply(writer, kind::TFLUSH + 1, flush_tag, None);
        }
    }
}

/// Where to listen: `unix:PATH` or `tcp:HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A unix stream socket path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(String),
}

/// A bad `--listen` value or a failure to bind it.
#[derive(Debug, Error)]
pub enum ListenError {
    /// Neither `unix:` nor `tcp:`.
    #[error("listen address {0:?} must be unix:PATH or tcp:HOST:PORT")]
    Syntax(String),
    /// Binding failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: io::Error,
    },
}

impl std::str::FromStr for ListenAddr {
    type Err = ListenError;
    fn from_str(s: &str) -> Result<Self, ListenError> {
        if let Some(p) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            Ok(ListenAddr::Unix(PathBuf::from(p)))
        } else if let Some(a) = s.strip_prefix("tcp:").filter(|a| a.contains(':')) {
            Ok(ListenAddr::Tcp(a.to_string()))
        } else {
            Err(ListenError::Syntax(s.to_string()))
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    /// Unix socket.
    Unix(UnixListener),
    /// TCP socket.
    Tcp(TcpListener),
}

impl Listener {
    /// Binds `addr`; a stale unix socket file at the path is replaced.
    pub fn bind(addr: &ListenAddr) -> Result<Listener, ListenError> {
        match addr {
            ListenAddr::Unix(p) => {
                use std::os::unix::fs::FileTypeExt;
                if std::fs::symlink_metadata(p)
                    .map(|m| m.file_type().is_socket())
                    .unwrap_or(false)
                {
                    let _ = std::fs::remove_file(p);
                }
                UnixListener::bind(p)
                    .map(Listener::Unix)
                    .map_err(|source| ListenError::Bind {
                        addr: p.display().to_string(),
                        source,
                    })
            }
            ListenAddr::Tcp(a) => {
                TcpListener::bind(a)
                    .map(Listener::Tcp)
                    .map_err(|source| ListenError::Bind {
                        addr: a.clone(),
                        source,
                    })
            }
        }
    }

    /// Accepts connections forever (or `max_conns` of them), serving each on
    /// its own session and threads.
    pub fn serve(
        &self,
        server: &Arc<Server>,
        opts: DriverOptions,
        max_conns: Option<usize>,
    ) -> io::Result<()> {
        let mut handles = Vec::new();
        let mut accepted = 0usize;
        while max_conns.is_none_or(|m| accepted < m) {
            let server = server.clone();
            let handle = match self {
                Listener::Unix(l) => {
                    let (s, _) = l.accept()?;
                    std::thread::spawn(move || serve_unix_stream(&server, s, opts))
                }
                Listener::Tcp(l) => {
                    let (s, peer) = l.accept()?;
                    tracing::info!(%peer, "9p client connected");
                    std::thread::spawn(move || serve_tcp_stream(&server, s, opts))
                }
            };
            accepted += 1;
            handles.push(handle);
            handles.retain(|h| !h.is_finished());
        }
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    }
}

/// A connected byte stream that can be cloned into a reader half and a writer half.
trait DuplexStream: Read + Write + Send + Sized + 'static {
    fn clone_stream(&self) -> io::Result<Self>;
}

impl DuplexStream for UnixStream {
    fn clone_stream(&self) -> io::Result<Self> {
        self.try_clone()
    }
}

impl DuplexStream for TcpStream {
    fn clone_stream(&self) -> io::Result<Self> {
        self.try_clone()
    }
}

fn serve_duplex<S: DuplexStream>(server: &Arc<Server>, s: S, opts: DriverOptions) {
    let result = s.clone_stream().and_then(|w| {
        let writer: Arc<dyn FrameWriter> = Arc::new(StreamWriter(Mutex::new(w)));
        serve_connection(
            Arc::new(server.session()),
            StreamReader::new(s),
            writer,
            opts,
        )
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, "9p connection ended with an error");
    }
}

/// Serves one unix stream connection to completion.
pub fn serve_unix_stream(server: &Arc<Server>, s: UnixStream, opts: DriverOptions) {
    serve_duplex(server, s, opts);
}

/// Serves one TCP connection to completion.
pub fn serve_tcp_stream(server: &Arc<Server>, s: TcpStream, opts: DriverOptions) {
    let _ = s.set_nodelay(true);
    serve_duplex(server, s, opts);
}
