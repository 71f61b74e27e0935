//! The server's fixed limits: sizes and times that are not flags of `serve` (its flags, with their defaults, are
//! declared once, on [`super::ServeConfig`]). Each is written here because the memory arithmetic of
//! docs/operations.md counts it, or because a dependency's default could otherwise change under us.

use std::time::Duration;

/// `--metrics-listen`: the plain-HTTP listener for `/metrics`, `/healthz` and `/readyz`, on every interface. In a
/// pod, "every interface" is the pod's own network namespace: its IP, which the kubelet's probes and Prometheus
/// use, and loopback, which `kubectl port-forward` uses; binding the pod IP alone would only lose the latter (and
/// one address family on a dual-stack cluster). Nothing served here is secret (counters, template names and
/// `--header-read-timeout`: from the accept, the TLS handshake and the first request (HTTP/1.1: its headers;
/// HTTP/2: the preface, SETTINGS and the first request's HEADERS); on HTTP/1.1 also each later request's headers,
/// `--idle-timeout`: a keep-alive connection with no request in progress is closed after this long (HTTP/2 with a
/// GOAWAY). Longer than the 90 s after which the API server's HTTP client (Go's `IdleConnTimeout`, as client-go
/// sets it) drops an idle connection itself: the client closes first, so it never sends a request on a connection
/// `--max-connection-age`: off (zero). A connection older than this is ended without cutting a request: HTTP/1.1
/// with `Connection: close` on its next answer, HTTP/2 with a GOAWAY. The API server keeps its keep-alive
/// connections to a webhook and reuses them, so without it a replica added later (the autoscaler's) can get no
/// `--max-inflight-body-bytes`: request body bytes, and answer bytes until sent, held in memory at once over every
/// connection and stream (32 MiB: eight bodies of the largest size, or thousands of typical 6 KiB reviews). With
/// the shipped pod's 448 MiB limit: about 22 MiB idle, this budget, the engine's working memory for the reviews
/// being processed (one per worker, up to ~88 MiB each), 256 connections each holding all it may (~501 KiB with
/// `--max-connections`: connections served at once. Each can hold up to ~500 KiB (its kernel, TLS and protocol buffers,
/// and over HTTP/2 its streams' state and answers), so this and the stream limit below are what keep the worst case
/// inside the pod's memory limit (docs/operations.md). The API server keeps at most a few dozen connections to a
/// `--h2-max-concurrent-streams`: concurrent streams per HTTP/2 connection (~20 KiB each while its answer waits).
/// `--write-timeout`: a connection whose peer takes less than 16 KiB of its answers in this long is closed: writes
/// to its socket blocked (it does not read, or a few bytes at a time), or answers waiting for an HTTP/2
/// flow-control window it does not grant (or a little at a time). Such a
/// peer would otherwise hold a connection slot, and the memory of the answers, for ever. Longer than any honest
/// After a connection's last answer, what the peer still sends is read and dropped for at most this long before the
/// socket is closed (closing it with unread bytes sends a reset, which can destroy the answer). A peer that has
/// its answer closes at once; this bounds one that does not.
pub const LINGER_TIME: Duration = Duration::from_secs(2);

/// ... and at most this many bytes: the rest of a body refused early (413) up to four times the default
/// `--max-body-bytes`. Read from the socket under TLS, nothing decrypted, into the connection's read-ahead buffer:
/// it costs no memory.
pub const LINGER_BYTES: usize = 16 * 1024 * 1024;

/// The kernel's receive and send buffers of each webhook connection (`SO_RCVBUF`, `SO_SNDBUF`, set on the listener
/// and inherited by every connection; the kernel doubles each for its bookkeeping). Without them Linux grows a
/// connection's buffers to several MiB (`tcp_rmem`, `tcp_wmem`), memory a cgroup v2 limit counts against the pod:
/// peers that send and do not read held about 1 GiB that way. 32 KiB still carries a 4 MiB body in tens of
/// milliseconds inside a cluster. docs/operations.md counts both per connection.
pub const SOCKET_BUFFER: u32 = 32 * 1024;
/// HTTP/1.1: hyper's read buffer (a request's headers must fit: the API server's are under 1 KiB) and the size past
/// which it stops buffering answers to write. hyper's default, ~400 KiB, let every connection sending large headers
/// hold that much. the memory arithmetic of docs/operations.md counts two per connection.
pub const H1_MAX_BUF_SIZE: usize = 32 * 1024;

/// HTTP/2: the flow-control window of each request stream (SETTINGS_INITIAL_WINDOW_SIZE), the body bytes a client
/// may send before the handler has read them. The protocol's own default; hyper's, 1 MiB, let each connection
/// hold 1 MiB of bodies outside the in-flight body budget while their handlers waited for room in it.
pub const H2_STREAM_WINDOW: u32 = 65_535;

/// HTTP/2: the connection's flow-control window, over all its streams: the unread body bytes one connection can
/// hold, whatever its streams. 65,535 is the protocol's least (the window every connection starts with).
pub const H2_CONNECTION_WINDOW: u32 = 65_535;

/// HTTP/2: answer bytes h2 buffers per stream beyond what the peer's window lets it send. Our answers are one piece,
/// so this caps the buffer at about one answer; hyper's default is 400 KiB.
pub const H2_MAX_SEND_BUF_SIZE: usize = 16 * 1024;

/// HTTP/2: the largest header block a request may send (SETTINGS_MAX_HEADER_LIST_SIZE), decoded one at a time per
/// connection. hyper's default, written here because the memory arithmetic counts it.
pub const H2_MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;

/// The admin listener (`--metrics-listen`): connections open at once. Kubelet probes and a scraper or two are
/// all that should talk to it (the NetworkPolicy of `manifests/base` admits no one else); with every one taken, the
/// oldest is closed for the newcomer, so that a probe always gets through.
pub const ADMIN_MAX_CONNECTIONS: usize = 32;

/// The admin listener: time allowed for a request's headers, and for an idle keep-alive connection (hyper's header
/// timer runs while a connection waits for its next request). A probe or a scraper sends its headers at once; one
/// that trickles them (slowloris) must not hold a connection for long.
pub const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The admin listener: an admin connection is closed gracefully after this long, then given
/// [`ADMIN_HEADER_READ_TIMEOUT`] to finish its answer: a client that does not read its answers cannot hold one. A
/// scraper opens a new connection, which costs nothing here.
pub const ADMIN_CONNECTION_LIFETIME: Duration = Duration::from_secs(10);

/// How long a template reload waits after a change event for the burst to end: long enough for the kubelet's
/// writes of one ConfigMap update to land together, short next to a human edit.
pub const TEMPLATE_DEBOUNCE: Duration = Duration::from_millis(200);
