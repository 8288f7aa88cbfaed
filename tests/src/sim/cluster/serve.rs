//! Calls executed at a server, and answers read by their client.

use std::sync::Arc;

use dlock_core::cluster::{Map, partition_of};
use dlock_core::proto::{ControlRequest, PROTO_VERSION};
use dlock_core::{LockKind, Status};

use super::clients::{
    self, Held, Pending, Rep, Req, counter_name, execute, faa, lock_name, trylock, unlock,
};
use super::{CALL_TIMEOUT_MS, EXPIRE_MAX_MS, Event, World};

/// A counter's object lease (s): longer than any run, so a counter is never destroyed under
/// its users (a re-created counter starting over is not a cluster fault).
const OBJECT_LEASE_S: u32 = 1_000_000;

impl World {
    /// Client `i` acts if it is idle: registers, fetches the map, owes a `ReclaimDone`, or
    /// releases, locks or counts.
    pub(super) fn act(&mut self, i: usize) -> Result<(), String> {
        let now = self.now;
        let c = &mut self.clients[i];
        if let Some(p) = &c.pending {
            if now < p.sent + CALL_TIMEOUT_MS {
                return Ok(());
            }
            // Given up: a late answer is dropped.
            c.pending = None;
        }
        if now < c.idle_until {
            return Ok(());
        }
        c.held.retain(|_, h| h.until > now);
        let running: Vec<usize> = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].server.is_some())
            .collect();
        let any = running[self.rng.index(running.len())];
        let c = &mut self.clients[i];
        let (host, req) = if c.reg.is_none() {
            (any, Req::Init)
        } else if c.map.is_none() {
            (any, Req::GetMap)
        } else if let Some((host, partition, epoch)) = c.owed.pop() {
            (host, Req::Done { partition, epoch })
        } else if self.rng.below(50) == 0 {
            // Now and then a client learns the map from any server (a new connection does),
            // not only from a `PartitionMoved`: clients with different maps meet.
            (any, Req::GetMap)
        } else {
            let roll = self.rng.below(10);
            if roll < 3 && !c.held.is_empty() {
                let k = self.rng.index(c.held.len());
                let (&name, &h) = c.held.iter().nth(k).expect("k < len");
                c.held.remove(&name);
                self.oracle.let_go(i, name, now);
                if h.life != self.hosts[h.host].life {
                    // The process that granted it is gone, and the grant with it.
                    return Ok(());
                }
                let req = Req::Unlock {
                    lock: h.lock,
                    epoch: h.epoch,
                };
                (h.host, req)
            } else if roll < 5 {
                let name = self.rng.index(self.p.counters);
                let Some((host, p, epoch)) = self.route(i, &counter_name(name)) else {
                    // No owner in its map: ask for a newer one.
                    return self.send(i, any, Req::GetMap);
                };
                let c = &mut self.clients[i];
                c.known.insert(p);
                let object = c.objects.get(&(host, self.hosts[host].life, name)).copied();
                (
                    host,
                    Req::Faa {
                        name,
                        object,
                        epoch,
                    },
                )
            } else {
                let name = self.rng.index(self.p.lock_names);
                if c.held.contains_key(&name) {
                    return Ok(());
                }
                let Some((host, p, epoch)) = self.route(i, &lock_name(name)) else {
                    return self.send(i, any, Req::GetMap);
                };
                let expire_ms = self.rng.range(100, EXPIRE_MAX_MS) as u32;
                let c = &mut self.clients[i];
                c.known.insert(p);
                let lock = c.locks.get(&(host, self.hosts[host].life, name)).copied();
                (
                    host,
                    Req::Lock {
                        name,
                        lock,
                        epoch,
                        expire_ms,
                    },
                )
            }
        };
        self.send(i, host, req)
    }

    /// Client `i` calls `host` with `req`.
    fn send(&mut self, i: usize, host: usize, req: Req) -> Result<(), String> {
        let now = self.now;
        self.ops += 1;
        self.seq += 1;
        let (seq, life) = (self.seq, self.hosts[host].life);
        self.clients[i].pending = Some(Pending {
            seq,
            sent: now,
            host,
            life,
            req: req.clone(),
        });
        if let Some(d) = self.transit() {
            self.at(
                d,
                Event::Call {
                    client: i,
                    seq,
                    host,
                    life,
                    req,
                },
            );
        }
        Ok(())
    }

    /// The host, partition and epoch client `i`'s map gives `name`.
    fn route(&self, i: usize, name: &[u8]) -> Option<(usize, u16, u32)> {
        let map = self.clients[i].map.as_ref()?;
        let p = partition_of(name, map.partitions());
        let o = map.owner(p)?;
        Some((o.server?.get() as usize - 1, p, o.epoch))
    }

    /// Client `i`'s call `req` reaches server `host` (if the process it was sent to runs).
    pub(super) fn call(
        &mut self,
        i: usize,
        (seq, host, life): (u64, usize, u32),
        req: Req,
    ) -> Result<(), String> {
        let model_now = self.now;
        let h = &mut self.hosts[host];
        let server_id = h.id.get();
        if h.life != life {
            return Ok(());
        }
        let now = h.clock(model_now);
        let applied = h.agent.applied.as_ref().map(|(m, _)| m.clone());
        let Some(srv) = h.server.as_mut() else {
            return Ok(());
        };
        self.touched[host] = true;
        let c = &self.clients[i];
        let mut rep = Rep::status(Status::Success, model_now);
        if !matches!(req, Req::Init | Req::GetMap) && c.joined.get(&host) != Some(&life) {
            let (raw, session) = c.reg.expect("a registered client");
            let s = clients::join(srv, raw, session, now);
            if s != Status::Success {
                rep.status = s;
                return self.reply(i, seq, rep);
            }
            h.registered.insert(raw);
            rep.joined = true;
        }
        let raw = c.reg.map_or(0, |r| r.0);
        match req {
            Req::Init => match srv.client_init(PROTO_VERSION, 0, now) {
                Ok(id) => {
                    let (_, session) = srv.client_session(id.get()).expect("just registered");
                    h.registered.insert(id.get());
                    rep.registered = Some((id.get(), session));
                }
                Err(s) => rep.status = s,
            },
            Req::GetMap => rep.map = applied.clone(),
            Req::Lock {
                name,
                lock,
                epoch,
                expire_ms,
            } => {
                let id = match lock {
                    Some(id) => Ok(id),
                    None => srv
                        .get_lock(raw, LockKind::Atomic, &lock_name(name), now)
                        .map(|id| id.raw()),
                };
                match id {
                    Ok(id) => {
                        rep.id = Some(id);
                        let r = execute(srv, raw, trylock(id, epoch, expire_ms), now);
                        rep.status = r.status;
                        rep.aux = r.aux;
                        if r.status == Status::Success {
                            self.oracle.granted(name, r.aux, server_id, model_now)?;
                        }
                    }
                    Err(s) => rep.status = s,
                }
            }
            Req::Unlock { lock, epoch, .. } => {
                rep.status = execute(srv, raw, unlock(lock, epoch), now).status;
            }
            Req::Faa {
                name,
                object,
                epoch,
            } => {
                let id = match object {
                    Some(id) => Ok(id),
                    None => counter_id(srv, raw, &counter_name(name), now),
                };
                match id {
                    Ok(id) => {
                        rep.id = Some(id);
                        let r = execute(srv, raw, faa(id, epoch), now);
                        rep.status = r.status;
                        if self.trace {
                            eprintln!(
                                "{model_now}: server {server_id} (life {life}) counter {name} \
                                 object {id:#x} epoch {epoch}: {:?} {}",
                                r.status, r.aux
                            );
                        }
                        if r.status == Status::Success {
                            self.oracle.faa(name, r.aux, server_id, model_now)?;
                        }
                    }
                    Err(s) => rep.status = s,
                }
            }
            Req::Done { partition, epoch } => {
                let body = ControlRequest::ReclaimDone { partition, epoch };
                rep.status = clients::control(srv, raw, body, now);
            }
        }
        if rep.status == Status::PartitionMoved {
            rep.map = applied;
        }
        self.reply(i, seq, rep)
    }

    fn reply(&mut self, i: usize, seq: u64, rep: Rep) -> Result<(), String> {
        if let Some(d) = self.transit() {
            self.at(
                d,
                Event::Answer {
                    client: i,
                    seq,
                    rep,
                },
            );
        }
        Ok(())
    }

    /// Client `i` reads the answer to call `seq` (dropped if it gave up on it).
    pub(super) fn answer(&mut self, i: usize, seq: u64, rep: Rep) -> Result<(), String> {
        let now = self.now;
        let c = &mut self.clients[i];
        let Some(p) = c.pending.take_if(|p| p.seq == seq) else {
            return Ok(());
        };
        if rep.joined {
            c.joined.insert(p.host, p.life);
        }
        if let Some(map) = rep.map.clone() {
            self.adopt(i, map);
        }
        let c = &mut self.clients[i];
        match rep.status {
            Status::Success => {}
            Status::PartitionMoved => {
                self.counts.moved_answers += 1;
                return Ok(());
            }
            Status::NotReady => {
                self.counts.not_ready += 1;
                c.idle_until = now + self.rng.range(5, 100);
                return Ok(());
            }
            Status::ClientNotInit => {
                c.joined.remove(&p.host);
                let gone: Vec<usize> = c
                    .held
                    .iter()
                    .filter(|(_, h)| h.host == p.host)
                    .map(|(&n, _)| n)
                    .collect();
                for n in gone {
                    c.held.remove(&n);
                    self.oracle.let_go(i, n, now);
                }
                return Ok(());
            }
            _ => {
                // A stale id (its server restarted, or the slot was freed): look it up again.
                match p.req {
                    Req::Lock { name, .. } => c.locks.remove(&(p.host, p.life, name)),
                    Req::Faa { name, .. } => c.objects.remove(&(p.host, p.life, name)),
                    _ => None,
                };
                return Ok(());
            }
        }
        match p.req {
            Req::Init => {
                c.reg = rep.registered;
                c.joined.insert(p.host, p.life);
            }
            Req::Lock {
                name,
                epoch,
                expire_ms,
                ..
            } => {
                let lock = rep.id.expect("a lock id with a grant");
                c.locks.insert((p.host, p.life, name), lock);
                let until = p.sent + u64::from(expire_ms);
                let route = self.route(i, &lock_name(name));
                let partition = route.map_or(u16::MAX, |r| r.1);
                let current = route.map(|r| (r.0, r.2));
                let c = &mut self.clients[i];
                if until > now && current == Some((p.host, epoch)) {
                    self.oracle
                        .believe(i, name, rep.aux, (rep.at, until), now)?;
                    c.held.insert(
                        name,
                        Held {
                            host: p.host,
                            life: p.life,
                            partition,
                            lock,
                            epoch,
                            until,
                        },
                    );
                }
            }
            Req::Faa { name, .. } => {
                if let Some(id) = rep.id {
                    c.objects.insert((p.host, p.life, name), id);
                }
            }
            Req::Done { .. } => self.counts.reclaim_dones += 1,
            Req::GetMap | Req::Unlock { .. } => {}
        }
        Ok(())
    }

    /// Client `i` takes `map` if it is newer than its own: every partition it knows whose
    /// owner or epoch changed is let go (its grants there are not re-claimed) and owes the new
    /// owner a `ReclaimDone`.
    fn adopt(&mut self, i: usize, map: Arc<Map>) {
        let now = self.now;
        let c = &mut self.clients[i];
        let old = match &c.map {
            Some(m) if m.version() >= map.version() => return,
            old => old.clone(),
        };
        c.map = Some(map.clone());
        let moved = |p: u16| {
            let new = map.owner(p).map(|o| (o.server, o.epoch));
            old.as_ref()
                .and_then(|m| m.owner(p))
                .map(|o| (o.server, o.epoch))
                != new
        };
        let gone: Vec<usize> = c
            .held
            .iter()
            .filter(|(_, h)| moved(h.partition))
            .map(|(&n, _)| n)
            .collect();
        for n in gone {
            c.held.remove(&n);
            self.oracle.let_go(i, n, now);
        }
        for &p in &c.known {
            if moved(p)
                && let Some(o) = map.owner(p)
                && let Some(s) = o.server
            {
                c.owed.push((s.get() as usize - 1, p, o.epoch));
            }
        }
    }
}

/// Client `raw`'s id of counter `name` at `srv`: created (at 0) if it does not exist.
fn counter_id(
    srv: &mut dlock_core::server::Server<'_>,
    raw: u32,
    name: &[u8],
    now: u64,
) -> Result<u32, Status> {
    match srv.object_create(raw, name, 0, OBJECT_LEASE_S, now) {
        Ok(id) => Ok(id.raw()),
        Err(Status::ObjectAlreadyCreated | Status::ObjectAlreadyExisted) => srv
            .object_get(raw, name, OBJECT_LEASE_S, now)
            .map(|(id, _)| id.raw()),
        Err(s) => Err(s),
    }
}
