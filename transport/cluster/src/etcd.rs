//! The agent's etcd calls: connecting, the creation record, registration, confirmation rounds,
//! high-water marks. Each is one request or one small transaction with a timeout; the loops
//! that retry them are in `run` and `coordinator`.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::cluster::{Map, Partitions, ServerId};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions,
    TlsOptions, Txn, TxnOp,
};

use crate::config::AgentConfig;
use crate::handle::{AgentError, Shared, lock};
use crate::keys::{self, Keys, MemberRecord, MemberState};

/// An error from etcd or from a request that ran out of time.
pub(crate) type EtcdResult<T> = Result<T, String>;

/// Runs `f` with the request timeout; a timeout is an error like any other.
pub(crate) async fn timed<T, F>(limit: Duration, f: F) -> EtcdResult<T>
where
    F: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {} ms", limit.as_millis())),
    }
}

/// Connects to etcd (TLS with a client certificate if configured). The channel connects
/// lazily: the first request tells whether etcd is there.
pub(crate) async fn connect(cfg: &AgentConfig) -> EtcdResult<Client> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(cfg.request_timeout)
        .with_timeout(cfg.request_timeout);
    if let Some(tls) = &cfg.tls {
        let mut t = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(&tls.ca_pem))
            .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
        if let Some(d) = &tls.domain {
            t = t.domain_name(d.clone());
        }
        opts = opts.with_tls(t);
    }
    timed(
        cfg.request_timeout,
        Client::connect(&cfg.endpoints, Some(opts)),
    )
    .await
}

/// Why a server may not join.
#[derive(Debug)]
pub(crate) enum JoinRefusal {
    /// etcd did not answer.
    Etcd(String),
    /// The cluster disagrees with this server's configuration.
    Mismatch(String),
}

/// Reads the creation record, creating it if the cluster is new; refuses a server configured
/// with another partition count.
pub(crate) async fn check_meta(client: &Client, cfg: &AgentConfig) -> Result<(), JoinRefusal> {
    let keys = Keys::new(&cfg.cluster);
    let mut kv = client.kv_client();
    let create = Txn::new()
        .when([Compare::version(keys.meta(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            keys.meta(),
            keys::encode_meta(cfg.partitions),
            None,
        )])
        .or_else([TxnOp::get(keys.meta(), None)]);
    let resp = timed(cfg.request_timeout, kv.txn(create))
        .await
        .map_err(JoinRefusal::Etcd)?;
    if resp.succeeded() {
        tracing::info!(cluster = %cfg.cluster, partitions = cfg.partitions.get(), "created the cluster");
        return Ok(());
    }
    let existing = resp.op_responses().into_iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    });
    match existing.as_deref().and_then(keys::decode_meta) {
        Some(p) if p == cfg.partitions => Ok(()),
        Some(p) => Err(JoinRefusal::Mismatch(format!(
            "cluster {:?} was created with {} partitions; this server is configured with {} \
             (the partition count is fixed for the cluster's life: configure {} or join another cluster)",
            cfg.cluster,
            p.get(),
            cfg.partitions.get(),
            p.get()
        ))),
        None => Err(JoinRefusal::Mismatch(format!(
            "cluster {:?} has an unreadable creation record at {}",
            cfg.cluster,
            keys.meta()
        ))),
    }
}

/// A registration: the lease and the TTL etcd granted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lease {
    pub(crate) id: i64,
    pub(crate) ttl_ms: u32,
}

/// Grants a lease and puts the member key under it, if no live server holds the id.
pub(crate) async fn register(
    client: &Client,
    cfg: &AgentConfig,
    shared: &Shared,
) -> Result<Lease, JoinRefusal> {
    let keys = Keys::new(&cfg.cluster);
    let mut c = client.clone();
    let granted = timed(
        cfg.request_timeout,
        c.lease_grant(i64::from(cfg.lease_ttl_s), None),
    )
    .await
    .map_err(JoinRefusal::Etcd)?;
    let lease = Lease {
        id: granted.id(),
        ttl_ms: u32::try_from(granted.ttl().max(1)).unwrap_or(u32::MAX / 1_000) * 1_000,
    };
    let record = member_record(cfg, shared).encode();
    let txn = Txn::new()
        .when([Compare::version(
            keys.server(cfg.server_id),
            CompareOp::Equal,
            0,
        )])
        .and_then([TxnOp::put(
            keys.server(cfg.server_id),
            record,
            Some(PutOptions::new().with_lease(lease.id)),
        )]);
    let resp = timed(cfg.request_timeout, c.kv_client().txn(txn))
        .await
        .map_err(JoinRefusal::Etcd)?;
    if !resp.succeeded() {
        // Best effort: the lease would expire by itself.
        let _ = timed(cfg.request_timeout, c.lease_revoke(lease.id)).await;
        return Err(JoinRefusal::Mismatch(format!(
            "server id {} is registered by a live server in cluster {:?} (a previous run's \
             registration lasts until its lease expires)",
            cfg.server_id.get(),
            cfg.cluster
        )));
    }
    Ok(lease)
}

/// This server's member record now.
pub(crate) fn member_record(cfg: &AgentConfig, shared: &Shared) -> MemberRecord {
    MemberRecord {
        state: if shared.draining.load(std::sync::atomic::Ordering::Relaxed) {
            MemberState::Draining
        } else {
            MemberState::Serving
        },
        address: cfg.address.clone(),
        renewals: lock(&shared.renewals).clone(),
    }
}

/// Rewrites the member record under `lease` (drain, renewals).
pub(crate) async fn republish(
    client: &Client,
    cfg: &AgentConfig,
    shared: &Shared,
    lease: i64,
) -> EtcdResult<()> {
    let keys = Keys::new(&cfg.cluster);
    let record = member_record(cfg, shared).encode();
    let mut kv = client.kv_client();
    timed(
        cfg.request_timeout,
        kv.put(
            keys.server(cfg.server_id),
            record,
            Some(PutOptions::new().with_lease(lease)),
        ),
    )
    .await
    .map(|_| ())
}

/// How a confirmation round ended.
pub(crate) enum Round {
    /// The lease lives and the map read matches what is published (`version`).
    Confirmed { version: u64 },
    /// etcd answered that the lease is gone.
    LeaseGone,
}

/// One confirmation round: a keepalive, then a linearizable read of the map (applying it if it
/// is newer than the published one).
pub(crate) async fn confirm(
    client: &Client,
    cfg: &AgentConfig,
    shared: &Shared,
    lease: i64,
) -> EtcdResult<Round> {
    let mut c = client.clone();
    let (mut keeper, mut stream) = timed(cfg.request_timeout, c.lease_keep_alive(lease)).await?;
    timed(cfg.request_timeout, keeper.keep_alive()).await?;
    let answer = timed(cfg.request_timeout, stream.message()).await?;
    match answer {
        Some(r) if r.ttl() > 0 => {}
        Some(_) => return Ok(Round::LeaseGone),
        None => return Err("the keepalive stream closed".into()),
    }
    let version = follow_map(client, cfg, shared).await?;
    Ok(Round::Confirmed { version })
}

/// Reads the map; publishes it if newer. Returns the version now published (0: no map yet).
pub(crate) async fn follow_map(
    client: &Client,
    cfg: &AgentConfig,
    shared: &Shared,
) -> EtcdResult<u64> {
    let keys = Keys::new(&cfg.cluster);
    let mut kv = client.kv_client();
    let resp = timed(cfg.request_timeout, kv.get(keys.map(), None)).await?;
    if let Some(item) = resp.kvs().first() {
        let known = shared.map_revision().map(|(rev, _)| rev);
        if known != Some(item.mod_revision()) {
            let map = decode_map(item.value(), cfg.partitions)?;
            shared.publish_map(map, item.mod_revision());
        }
    }
    Ok(shared.map_revision().map_or(0, |(_, v)| v))
}

/// Decodes a map read from etcd into a fresh allocation.
pub(crate) fn decode_map(bytes: &[u8], partitions: Partitions) -> EtcdResult<Arc<Map>> {
    let mut map = Box::new(Map::new(partitions));
    Map::decode(bytes, &mut map).map_err(|e| format!("the map in etcd does not decode: {e}"))?;
    if map.partitions() != partitions {
        return Err("the map in etcd has another partition count".into());
    }
    Ok(Arc::from(map))
}

/// Persists a high-water mark by compare-and-swap, conditioned on the map's revision.
pub(crate) async fn reserve(
    client: &Client,
    cfg: &AgentConfig,
    map_rev: i64,
    partition: u16,
    name: &[u8],
    mark: u64,
) -> Result<u64, AgentError> {
    let keys = Keys::new(&cfg.cluster);
    let key = keys.mark(partition, name);
    let mut kv = client.kv_client();
    loop {
        let current = timed(cfg.request_timeout, kv.get(key.clone(), None))
            .await
            .map_err(AgentError::Etcd)?;
        let (held, rev) = match current.kvs().first() {
            Some(item) => (
                std::str::from_utf8(item.value())
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .ok_or_else(|| AgentError::Etcd(format!("{key} is not a mark")))?,
                item.mod_revision(),
            ),
            None => (0, 0),
        };
        if held >= mark {
            return Ok(held);
        }
        let txn = Txn::new()
            .when([
                Compare::mod_revision(keys.map(), CompareOp::Equal, map_rev),
                Compare::mod_revision(key.clone(), CompareOp::Equal, rev),
            ])
            .and_then([TxnOp::put(key.clone(), mark.to_string(), None)])
            .or_else([TxnOp::get(keys.map(), None)]);
        let resp = timed(cfg.request_timeout, kv.txn(txn))
            .await
            .map_err(AgentError::Etcd)?;
        if resp.succeeded() {
            return Ok(mark);
        }
        let map_moved = resp.op_responses().into_iter().any(|op| match op {
            etcd_client::TxnOpResponse::Get(g) => {
                g.kvs().first().map(|kv| kv.mod_revision()) != Some(map_rev)
            }
            _ => false,
        });
        if map_moved {
            return Err(AgentError::MapChanged);
        }
        // Only the mark moved (a concurrent reservation): read it again.
    }
}

/// Every mark of a partition.
pub(crate) async fn marks(
    client: &Client,
    cfg: &AgentConfig,
    partition: u16,
) -> Result<crate::handle::Marks, AgentError> {
    let keys = Keys::new(&cfg.cluster);
    let prefix = keys.marks(partition);
    let mut kv = client.kv_client();
    let resp = timed(
        cfg.request_timeout,
        kv.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
    )
    .await
    .map_err(AgentError::Etcd)?;
    let mut out = Vec::new();
    for item in resp.kvs() {
        let name = keys::mark_name(item.key(), &prefix);
        let mark = std::str::from_utf8(item.value())
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if let (Some(name), Some(mark)) = (name, mark) {
            out.push((name, mark));
        }
    }
    Ok(out)
}

/// Writes the client ids registered with this server in registration `incarnation`.
pub(crate) async fn persist_clients(
    client: &Client,
    cfg: &AgentConfig,
    incarnation: u64,
    ids: &[u32],
) -> Result<(), AgentError> {
    let key = Keys::new(&cfg.cluster).clients(cfg.server_id, incarnation);
    let value = ids
        .iter()
        .map(|id| id.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut kv = client.kv_client();
    timed(cfg.request_timeout, kv.put(key, value, None))
        .await
        .map_err(AgentError::Etcd)?;
    Ok(())
}

/// The client ids `server` persisted in registration `incarnation` (none: empty).
pub(crate) async fn persisted_clients(
    client: &Client,
    cfg: &AgentConfig,
    server: ServerId,
    incarnation: u64,
) -> Result<Vec<u32>, AgentError> {
    let key = Keys::new(&cfg.cluster).clients(server, incarnation);
    let mut kv = client.kv_client();
    let resp = timed(cfg.request_timeout, kv.get(key.clone(), None))
        .await
        .map_err(AgentError::Etcd)?;
    let Some(item) = resp.kvs().first() else {
        return Ok(Vec::new());
    };
    let text = std::str::from_utf8(item.value())
        .map_err(|_| AgentError::Etcd(format!("{key} is not text")))?;
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| AgentError::Etcd(format!("{key} holds {s:?}, not a client id")))
        })
        .collect()
}

/// The cluster's session key: read, or created once by compare-and-swap (64 hex digits).
pub(crate) async fn session_key(
    client: &Client,
    cfg: &AgentConfig,
) -> Result<[u8; 32], AgentError> {
    let key = Keys::new(&cfg.cluster).session_key();
    let mut fresh = [0u8; 32];
    getrandom::fill(&mut fresh).map_err(|e| AgentError::Etcd(format!("no entropy: {e}")))?;
    let hex: String = fresh.iter().map(|b| format!("{b:02x}")).collect();
    let txn = Txn::new()
        .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), hex, None)])
        .or_else([TxnOp::get(key.clone(), None)]);
    let mut kv = client.kv_client();
    let resp = timed(cfg.request_timeout, kv.txn(txn))
        .await
        .map_err(AgentError::Etcd)?;
    if resp.succeeded() {
        tracing::info!(cluster = %cfg.cluster, "created the cluster's session key in etcd");
        return Ok(fresh);
    }
    let stored = resp.op_responses().into_iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    });
    let bad = || AgentError::Etcd(format!("{key} does not hold 64 hex digits"));
    let text = stored.ok_or_else(bad)?;
    let text = std::str::from_utf8(&text).map_err(|_| bad())?.trim();
    if text.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}
