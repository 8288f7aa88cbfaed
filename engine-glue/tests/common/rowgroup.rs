//! The set-up of the row-group cache's tests (`rowgroup_cached.rs`, `rowgroup_filter.rs`): a
//! small in-process server, workers with caching on or off, a rival worker on its own thread,
//! and the server's counters they read. A test file that uses only part of it leaves the rest
//! unused in its binary.
#![allow(dead_code)]

use std::thread;
use std::time::{Duration, Instant};

use dlock_engine_glue::EmbeddedServer;
use dlock_engine_glue::dlock_core::manager::Timing;
use dlock_engine_glue::dlock_core::{Config, Mode, Status};
use dlock_engine_glue::dlock_transport::client::read_server_stats;
use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks};

/// How long a test's acquisitions and waits may take.
pub const WAIT: Duration = Duration::from_secs(10);

/// A small server with the default timing.
pub fn server() -> EmbeddedServer {
    server_with(Timing::DEFAULT)
}

/// A small server with `timing`.
pub fn server_with(timing: Timing) -> EmbeddedServer {
    EmbeddedServer::start(EmbeddedServer::config(Config {
        locks_max: 1_024,
        clients_max: 16,
        objects_max: 4,
        timing,
        ..Config::default()
    }))
    .expect("server starts")
}

/// A worker of `s` over shared memory, caching or not.
pub fn worker(s: &EmbeddedServer, cached: bool) -> RowGroupLocks {
    let cfg = RowGroupConfig::DEFAULT.with_cached(cached);
    RowGroupLocks::new(s.client().expect("client"), cfg).expect("valid config")
}

/// The server's counter `name`.
pub fn counter(s: &EmbeddedServer, name: &str) -> u64 {
    let stats = read_server_stats(&s.endpoint(), Duration::from_secs(5)).unwrap();
    stats
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, v)| v)
        .expect("counted")
}

pub fn data_messages(s: &EmbeddedServer) -> u64 {
    counter(s, "data_messages")
}

pub fn revokes_sent(s: &EmbeddedServer) -> u64 {
    counter(s, "revokes_sent")
}

/// A thread of a new (uncached) worker taking `key` in `mode`, waiting up to [`WAIT`].
pub fn rival(
    s: &EmbeddedServer,
    key: RowGroup,
    mode: Mode,
) -> thread::JoinHandle<Result<(), Status>> {
    let mut w = worker(s, false);
    thread::spawn(move || {
        let mut txn = w.begin();
        txn.acquire(&[(key, mode)], AcquireOptions::wait(WAIT))?;
        txn.commit()
    })
}

/// One transaction of `w` taking `key` exclusively (no wait) and committing.
pub fn take_once(w: &mut RowGroupLocks, key: RowGroup) {
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Exclusive)], AcquireOptions::NO_WAIT)
        .unwrap();
    txn.commit().unwrap();
}

/// Waits until `w` has given back a revoked cached key (it looks at its revokes every ms).
pub fn give_back_when_asked(w: &mut RowGroupLocks) {
    let until = Instant::now() + WAIT;
    let mut back = 0;
    while back == 0 && Instant::now() < until {
        back = w.poll_revokes().unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(back, 1, "given back when asked");
}

/// Waits until the server has sent more than `past` revokes.
pub fn revoke_sent_after(s: &EmbeddedServer, past: u64) {
    let until = Instant::now() + WAIT;
    while revokes_sent(s) == past && Instant::now() < until {
        thread::sleep(Duration::from_millis(1));
    }
}
