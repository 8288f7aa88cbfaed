//! `dlock serve --metrics-addr ADDR`: the counters `dlock stat` prints, served for Prometheus at
//! `GET /metrics` in the OpenMetrics text format (`prometheus-client`'s encoder), on a thread
//! of its own.
//!
//! Each scrape reads the server's counters the way `dlock stat` does — one `Stats` request over
//! the server's Unix socket — so the two never disagree and the data thread is not touched
//! beyond answering one control request. Names are `dlock_<stat name>`: counters get the
//! OpenMetrics `_total` suffix (`dlock_grants_total`), gauges do not
//! (`dlock_partitions_owned`). `dlock_up` is 1 when the counters could be read, 0 otherwise
//! (then no other `dlock_*` line). A cluster server adds its membership's view
//! (`dlock_cluster_map_version`, `dlock_cluster_fenced`: 1 while it may not grant).
//!
//! The HTTP side is HTTP/1.1 at its smallest: one request per connection (`Connection:
//! close`), parsed with `httparse` (hyper's parser: no dependencies, well kept), answered
//! `200` for `GET /metrics`, `404` for another path, `405` for another method, `400` for
//! bytes that are not a request. A connection is served in turn on this thread with a short
//! read and write timeout, so a stalled peer delays the next scrape by at most that. A tokio
//! server (hyper, axum) would bring a runtime into the CLI's default build, which has none;
//! `tiny_http` and the like bring threads and more code than the twenty lines below.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dlock_core::server::Counter;
use dlock_transport::client::{Endpoint, read_server_stats};
use dlock_transport::runtime::membership::Membership;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// How long a scrape's connection may take to send its request or read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long reading the server's counters may take.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request head read (a scraper's is a few hundred bytes).
const REQUEST_MAX: usize = 8 * 1024;
/// The OpenMetrics text format's content type.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a scrape reports: the server's counters and, in a cluster, its membership.
#[derive(Debug)]
struct ServerCollector {
    endpoint: Endpoint,
    membership: Option<Arc<dyn Membership>>,
}

impl Collector for ServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = read_server_stats(&self.endpoint, STATS_TIMEOUT);
        gauge(
            &mut encoder,
            "up",
            "1 when the server answered its counters",
            i64::from(stats.is_ok()),
        )?;
        for (name, value) in stats.iter().flatten() {
            let help = format!("the server's `{name}` (dlock stat)");
            if Counter::ALL
                .iter()
                .any(|c| c.name() == *name && c.is_gauge())
            {
                gauge(&mut encoder, name, &help, clamp(*value))?;
            } else {
                let c = ConstCounter::new(*value);
                c.encode(encoder.encode_descriptor(name, &help, None, c.metric_type())?)?;
            }
        }
        if let Some(m) = &self.membership {
            let version = m.map_version().map_or(0, clamp);
            let help = "the newest cluster map's version this server knows";
            gauge(&mut encoder, "cluster_map_version", help, version)?;
            let may_grant = m
                .standing()
                .authority_until
                .is_some_and(|until| Instant::now() < until);
            let help = "1 while this server may not grant: its etcd lease may have run out";
            gauge(&mut encoder, "cluster_fenced", help, i64::from(!may_grant))?;
        }
        Ok(())
    }
}

/// A gauge's value: Prometheus gauges are signed.
fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

/// The metrics endpoint's thread; stopped (and joined) on drop.
#[derive(Debug)]
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens at `addr` and serves the counters of the server at `endpoint` (its embedded
    /// endpoint: the Unix socket), with `membership`'s view when it is in a cluster.
    pub(crate) fn start(
        addr: SocketAddr,
        endpoint: Endpoint,
        membership: Option<Arc<dyn Membership>>,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let mut registry = Registry::with_prefix("dlock");
        registry.register_collector(Box::new(ServerCollector {
            endpoint,
            membership,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("dlock-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    // Acquire: pairs with the Release in `drop`, which then wakes this accept.
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(conn) = conn
                        && let Err(e) = answer(conn, &registry)
                    {
                        tracing::debug!(error = %e, "a metrics scrape failed");
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens at (the port chosen, for `:0`).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        // Release: see the thread's Acquire.
        self.stop.store(true, Ordering::Release);
        // The thread waits in accept: a connection of our own wakes it to see the flag.
        let _ = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request from `conn` and answers it.
fn answer(mut conn: TcpStream, registry: &Registry) -> io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = vec![0u8; REQUEST_MAX];
    let mut len = 0;
    let (status, body) = loop {
        let n = conn.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(()); // closed before a whole request: nothing to answer
        }
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(_)) => break route(&req, registry),
            Ok(httparse::Status::Partial) if len < buf.len() => continue,
            Ok(httparse::Status::Partial) | Err(_) => {
                break ("400 Bad Request", "not an HTTP/1.1 request\n".to_owned());
            }
        }
    };
    let content_type = match status {
        "200 OK" => CONTENT_TYPE,
        _ => "text/plain; charset=utf-8",
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())?;
    conn.flush()
}

/// The status and body for a parsed request.
fn route(req: &httparse::Request<'_, '_>, registry: &Registry) -> (&'static str, String) {
    let path = req.path.unwrap_or("");
    // A query string (`/metrics?x=y`, which some scrapers add) names the same resource.
    let path = path.split('?').next().unwrap_or(path);
    match (req.method, path) {
        (Some("GET"), "/metrics") => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, registry) {
                Ok(()) => ("200 OK", body),
                Err(_) => ("500 Internal Server Error", "encoding failed\n".into()),
            }
        }
        (Some("GET"), _) => ("404 Not Found", "only /metrics is here\n".into()),
        _ => ("405 Method Not Allowed", "only GET\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::start;
    use dlock_core::cluster::{Map, Member, Partitions, ServerId, Timing, assign};
    use dlock_transport::runtime::membership::StaticCluster;
    use std::collections::HashMap;

    /// A raw HTTP/1.1 request to `addr`: the status line, the headers and the body.
    fn http(addr: SocketAddr, request: &str) -> (String, String, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        let (status, headers) = head.split_once("\r\n").unwrap();
        (status.to_owned(), headers.to_owned(), body.to_owned())
    }

    /// Scrapes `/metrics`: every sample by name, and the `# TYPE` of every family.
    fn scrape(addr: SocketAddr) -> (HashMap<String, f64>, HashMap<String, String>) {
        let (status, headers, body) = http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(headers.contains(CONTENT_TYPE), "{headers}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        let (mut samples, mut types) = (HashMap::new(), HashMap::new());
        for line in body.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["#", "TYPE", name, kind] => {
                    types.insert(name.to_string(), kind.to_string());
                }
                ["#", ..] => {}
                [name, value] => {
                    samples.insert(name.to_string(), value.parse().unwrap());
                }
                _ => panic!("not a sample: {line}"),
            }
        }
        (samples, types)
    }

    #[test]
    fn a_standalone_servers_counters_are_scraped_live_over_loopback() {
        let server = start(None);
        let m = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Endpoint::embedded(&server),
            None,
        )
        .unwrap();
        let (first, types) = scrape(m.addr());
        assert_eq!(first["dlock_up"], 1.0);
        assert_eq!(types["dlock_control_requests"], "counter");
        assert_eq!(types["dlock_partitions_owned"], "gauge");
        assert_eq!(first["dlock_partitions_owned"], 0.0);
        assert!(!first.contains_key("dlock_cluster_map_version"));
        // Every counter `dlock stat` prints is there, under its name.
        for c in Counter::ALL {
            let name = match c.is_gauge() {
                true => format!("dlock_{}", c.name()),
                false => format!("dlock_{}_total", c.name()),
            };
            assert!(first.contains_key(&name), "{name}");
        }
        // Each scrape reads the server anew (its `Stats` request is a control request).
        let (second, _) = scrape(m.addr());
        assert!(
            second["dlock_control_requests_total"] > first["dlock_control_requests_total"],
            "{first:?} {second:?}"
        );
    }

    #[test]
    fn only_get_metrics_is_served() {
        let server = start(None);
        let m = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Endpoint::embedded(&server),
            None,
        )
        .unwrap();
        let (status, ..) = http(m.addr(), "GET / HTTP/1.1\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 404 Not Found");
        let (status, ..) = http(m.addr(), "POST /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
        let (status, ..) = http(m.addr(), "\x16\x03\x01 garbage\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 400 Bad Request");
        // A query string names the same resource.
        let (status, ..) = http(m.addr(), "GET /metrics?x=1 HTTP/1.1\r\n\r\n");
        assert_eq!(status, "HTTP/1.1 200 OK");
    }

    #[test]
    fn a_cluster_server_adds_its_map_version_and_whether_it_is_fenced() {
        let cluster = StaticCluster::new();
        let me = Member {
            id: ServerId::new(1).unwrap(),
            incarnation: 7,
            address: b"127.0.0.1:1",
            draining: false,
        };
        let empty = Map::new(Partitions::new(32).unwrap());
        let mut map = Map::new(Partitions::new(32).unwrap());
        assign(&empty, &[me], &[], &mut map).unwrap();
        cluster.set_map(map.clone());
        let server = start(Some(&cluster));
        let timing = Timing {
            ttl_ms: 1_000,
            drift_ppm: 10_000,
            grant_lease_max_ms: 2_000,
        };
        // The same member the server runs with (same id, incarnation and cluster).
        let member = cluster.member(me.id, 7, timing);
        let m = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Endpoint::embedded(&server),
            Some(Arc::new(member.clone())),
        )
        .unwrap();
        let (s, types) = scrape(m.addr());
        assert_eq!(s["dlock_cluster_map_version"], map.version() as f64);
        assert_eq!(types["dlock_cluster_map_version"], "gauge");
        assert_eq!(s["dlock_cluster_fenced"], 0.0);
        member.fence(true);
        let (s, _) = scrape(m.addr());
        assert_eq!(s["dlock_cluster_fenced"], 1.0);
    }
}
