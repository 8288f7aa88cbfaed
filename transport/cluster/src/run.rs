//! The agent's thread: a current-thread tokio runtime running the start-up, then one
//! registration (incarnation) after another until told to stop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::Client;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::StartError;
use crate::config::AgentConfig;
use crate::coordinator;
use crate::etcd::{self, JoinRefusal, Lease, Round};
use crate::handle::{AgentError, Command, Shared, lock};

/// Runs on the agent's thread: starts, reports the start's outcome on `started`, then serves
/// until a `Stop` command (or every handle is gone).
pub(crate) fn thread_main(
    cfg: Arc<AgentConfig>,
    shared: Arc<Shared>,
    commands: UnboundedReceiver<Command>,
    started: std::sync::mpsc::SyncSender<Result<(), StartError>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = started.send(Err(StartError::Thread(e.to_string())));
            return;
        }
    };
    rt.block_on(async move {
        let (client, lease) = match start(&cfg, &shared).await {
            Ok(v) => v,
            Err(e) => {
                let _ = started.send(Err(e));
                return;
            }
        };
        let _ = started.send(Ok(()));
        serve(client, cfg, shared, commands, lease).await;
    });
}

/// Connects, checks the creation record and registers, retrying until the start timeout.
async fn start(cfg: &AgentConfig, shared: &Shared) -> Result<(Client, Lease), StartError> {
    let deadline = Instant::now() + cfg.start_timeout;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last = match attempt(cfg, shared).await {
            Ok(v) => return Ok(v),
            Err(JoinRefusal::Mismatch(m)) if !m.contains("is registered by a live server") => {
                return Err(StartError::Refused(m));
            }
            Err(JoinRefusal::Mismatch(m) | JoinRefusal::Etcd(m)) => m,
        };
        if Instant::now() >= deadline {
            return Err(if last.contains("is registered by a live server") {
                StartError::Refused(last)
            } else {
                StartError::Unreachable {
                    endpoints: cfg.endpoints.join(","),
                    attempts,
                    last_error: last,
                }
            });
        }
        tracing::debug!(attempt = attempts, error = %last, "etcd not ready; retrying");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn attempt(cfg: &AgentConfig, shared: &Shared) -> Result<(Client, Lease), JoinRefusal> {
    let client = etcd::connect(cfg).await.map_err(JoinRefusal::Etcd)?;
    etcd::check_meta(&client, cfg).await?;
    let lease = begin(&client, cfg, shared).await?;
    Ok((client, lease))
}

/// Registers a new incarnation and confirms it once, so the runtime has a standing and the
/// map when `start` returns.
async fn begin(client: &Client, cfg: &AgentConfig, shared: &Shared) -> Result<Lease, JoinRefusal> {
    let sent = Instant::now();
    let lease = etcd::register(client, cfg, shared).await?;
    let timing = cfg.timing(lease.ttl_ms);
    *lock(&shared.timing) = timing;
    let version = etcd::follow_map(client, cfg, shared)
        .await
        .map_err(JoinRefusal::Etcd)?;
    {
        let mut s = lock(&shared.standing);
        s.incarnation = Some(lease.id as u64);
        s.timing = timing;
        // The lease was granted after `sent`: its TTL runs from later than that.
        s.confirmed_sent = Some(sent);
        s.map_version = version;
    }
    lock(&shared.status).incarnation = Some(lease.id as u64);
    shared.reachable();
    tracing::info!(
        server = cfg.server_id.get(),
        lease = lease.id,
        ttl_ms = lease.ttl_ms,
        "registered"
    );
    Ok(lease)
}

/// One incarnation after another until `Stop`.
async fn serve(
    client: Client,
    cfg: Arc<AgentConfig>,
    shared: Arc<Shared>,
    mut commands: UnboundedReceiver<Command>,
    mut lease: Lease,
) {
    loop {
        let lost = incarnation(&client, &cfg, &shared, &mut commands, lease).await;
        match lost {
            Lost::Stop { leave } => {
                if leave {
                    leave_cluster(&client, &cfg, lease).await;
                }
                return;
            }
            Lost::Lease => {
                tracing::warn!(
                    server = cfg.server_id.get(),
                    lease = lease.id,
                    "lease lost; registering again"
                );
                lock(&shared.standing).incarnation = None;
                lock(&shared.status).incarnation = None;
            }
        }
        lease = loop {
            match begin(&client, &cfg, &shared).await {
                Ok(l) => break l,
                Err(JoinRefusal::Etcd(e) | JoinRefusal::Mismatch(e)) => shared.unreachable(e),
            }
            // Commands still get answers (errors) while etcd is away.
            if let Some(Lost::Stop { .. }) = drain_commands(&mut commands) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
    }
}

enum Lost {
    Lease,
    Stop { leave: bool },
}

/// Runs one registration: confirmation rounds, the coordinator's campaign and the commands,
/// until the lease is gone or a `Stop` comes.
async fn incarnation(
    client: &Client,
    cfg: &Arc<AgentConfig>,
    shared: &Arc<Shared>,
    commands: &mut UnboundedReceiver<Command>,
    lease: Lease,
) -> Lost {
    let campaign = tokio::spawn(coordinator::run(
        client.clone(),
        cfg.clone(),
        shared.clone(),
        lease.id,
    ));
    let period = Duration::from_millis(u64::from(lease.ttl_ms) / 3);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let lost = loop {
        tokio::select! {
            _ = tick.tick() => {
                if confirm_round(client, cfg, shared, lease).await {
                    break Lost::Lease;
                }
            }
            cmd = commands.recv() => match cmd {
                None => break Lost::Stop { leave: true },
                Some(Command::Stop { leave }) => break Lost::Stop { leave },
                Some(Command::Republish) => {
                    if let Err(e) = etcd::republish(client, cfg, shared, lease.id).await {
                        shared.unreachable(e);
                    }
                }
                Some(cmd) => spawn_request(client, cfg, shared, cmd),
            },
        }
    };
    campaign.abort();
    lock(&shared.status).coordinator = false;
    lost
}

/// One confirmation round (`dlock_core::cluster::timing`); true if the lease is gone.
async fn confirm_round(client: &Client, cfg: &AgentConfig, shared: &Shared, lease: Lease) -> bool {
    let sent = Instant::now();
    match etcd::confirm(client, cfg, shared, lease.id).await {
        Ok(Round::Confirmed { version }) => {
            let mut s = lock(&shared.standing);
            s.confirmed_sent = Some(sent);
            s.map_version = version;
            drop(s);
            shared.reachable();
            false
        }
        Ok(Round::LeaseGone) => true,
        Err(e) => {
            // The standing stops advancing: the runtime fences itself when it runs out.
            shared.unreachable(e);
            false
        }
    }
}

/// Runs a reservation or a mark read beside the rounds, so a slow etcd delays neither.
fn spawn_request(client: &Client, cfg: &Arc<AgentConfig>, shared: &Arc<Shared>, cmd: Command) {
    let (client, cfg, shared) = (client.clone(), cfg.clone(), shared.clone());
    tokio::spawn(async move {
        match cmd {
            Command::Reserve {
                partition,
                name,
                mark,
                map_version,
                reply,
            } => {
                let r = match shared.map_revision() {
                    Some((rev, v)) if v == map_version => {
                        etcd::reserve(&client, &cfg, rev, partition, &name, mark).await
                    }
                    _ => Err(AgentError::MapChanged),
                };
                if let Err(AgentError::Etcd(e)) = &r {
                    shared.unreachable(e.clone());
                }
                let _ = reply.send(r);
            }
            Command::Marks { partition, reply } => {
                let _ = reply.send(etcd::marks(&client, &cfg, partition).await);
            }
            Command::SessionKey { reply } => {
                let _ = reply.send(etcd::session_key(&client, &cfg).await);
            }
            Command::PersistClients { ids, reply } => {
                let incarnation = lock(&shared.standing).incarnation;
                let r = match incarnation {
                    Some(inc) => etcd::persist_clients(&client, &cfg, inc, &ids).await,
                    None => Err(AgentError::Etcd("not registered".into())),
                };
                let _ = reply.send(r);
            }
            Command::Clients {
                server,
                incarnation,
                reply,
            } => {
                let r = etcd::persisted_clients(&client, &cfg, server, incarnation).await;
                let _ = reply.send(r);
            }
            Command::Republish | Command::Stop { .. } => {}
        }
    });
}

/// Answers pending requests while no registration exists; returns a `Stop` if one came.
fn drain_commands(commands: &mut UnboundedReceiver<Command>) -> Option<Lost> {
    while let Ok(cmd) = commands.try_recv() {
        match cmd {
            Command::Stop { leave } => return Some(Lost::Stop { leave }),
            Command::Reserve { reply, .. } => {
                let _ = reply.send(Err(AgentError::Etcd("not registered".into())));
            }
            Command::Marks { reply, .. } => {
                let _ = reply.send(Err(AgentError::Etcd("not registered".into())));
            }
            Command::PersistClients { reply, .. } => {
                let _ = reply.send(Err(AgentError::Etcd("not registered".into())));
            }
            Command::SessionKey { reply } => {
                let _ = reply.send(Err(AgentError::Etcd("not registered".into())));
            }
            Command::Clients { reply, .. } => {
                let _ = reply.send(Err(AgentError::Etcd("not registered".into())));
            }
            Command::Republish => {}
        }
    }
    None
}

/// Leaves the cluster: revoking the lease deletes the member key at once (and ends a
/// campaign), so the coordinator moves the partitions now instead of a TTL later. The runtime
/// must have stopped granting first (`Agent::leave`'s contract).
async fn leave_cluster(client: &Client, cfg: &AgentConfig, lease: Lease) {
    let mut c = client.clone();
    match etcd::timed(cfg.request_timeout, c.lease_revoke(lease.id)).await {
        Ok(_) => tracing::info!(server = cfg.server_id.get(), "left the cluster"),
        Err(e) => tracing::warn!(error = %e, "could not revoke the lease; it will expire"),
    }
}
