//! A deterministic model of the etcd the agent uses (`transport/cluster`): one linearizable
//! key space with revisions, leases with a TTL on the model clock that expire unless kept
//! alive (and delete the keys bound to them), compare-and-swap on a key's mod revision, the
//! election as etcd's recipe runs it (the live campaign key with the lowest create revision
//! leads), and outages during which nothing is answered.
//!
//! What the model keeps of etcd's documented behaviour (the assumptions of
//! `dlock_core::cluster::timing`): a lease expires no earlier than its TTL after the last
//! keepalive etcd received; a keepalive answered "alive" reached a live lease; a leader that
//! comes back from an outage extends every lease by a full TTL from then (etcd renews leases
//! on a leader change), so an outage shorter than the TTL expires nobody.

use std::collections::BTreeMap;

/// One key's value and revisions.
#[derive(Clone, Debug)]
pub struct Entry {
    pub value: Vec<u8>,
    pub create_rev: u64,
    pub mod_rev: u64,
    /// The lease the key is bound to (deleted when it expires).
    pub lease: Option<u64>,
}

/// The etcd model (module doc).
#[derive(Debug, Default)]
pub struct Etcd {
    rev: u64,
    kv: BTreeMap<String, Entry>,
    /// Live leases: id → (TTL, expiry on the model clock).
    leases: BTreeMap<u64, (u64, u64)>,
    next_lease: u64,
    /// Unavailable before this instant.
    down_until: u64,
    /// Requests answered (keepalives, reads, writes).
    pub requests: u64,
}

impl Etcd {
    /// Whether etcd answers at `now`; expires the leases due first.
    pub fn available(&mut self, now: u64) -> bool {
        if now < self.down_until {
            return false;
        }
        self.expire(now);
        true
    }

    /// etcd is down from `now` for `ms`: when it comes back its leader renews every lease.
    pub fn outage(&mut self, now: u64, ms: u64) {
        self.expire(now);
        self.down_until = self.down_until.max(now + ms);
        let back = self.down_until;
        for (ttl, expiry) in self.leases.values_mut() {
            *expiry = (*expiry).max(back + *ttl);
        }
    }

    /// Deletes the leases expired at `now` and the keys bound to them.
    fn expire(&mut self, now: u64) {
        let dead: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, (_, expiry))| *expiry <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in dead {
            self.revoke(id);
        }
    }

    /// Deletes lease `id` and its keys.
    pub fn revoke(&mut self, id: u64) {
        if self.leases.remove(&id).is_none() {
            return;
        }
        let keys: Vec<String> = self
            .kv
            .iter()
            .filter(|(_, e)| e.lease == Some(id))
            .map(|(k, _)| k.clone())
            .collect();
        if !keys.is_empty() {
            self.rev += 1;
        }
        for k in keys {
            self.kv.remove(&k);
        }
    }

    /// A new lease of `ttl` ms (ids start at 1 and never repeat, as etcd's).
    pub fn grant(&mut self, ttl: u64, now: u64) -> u64 {
        self.requests += 1;
        self.next_lease += 1;
        self.leases.insert(self.next_lease, (ttl, now + ttl));
        self.next_lease
    }

    /// A keepalive of lease `id`: whether it was alive (and is renewed for its TTL).
    pub fn keepalive(&mut self, id: u64, now: u64) -> bool {
        self.requests += 1;
        match self.leases.get_mut(&id) {
            Some((ttl, expiry)) => {
                *expiry = now + *ttl;
                true
            }
            None => false,
        }
    }

    /// Puts `key` (bound to `lease` if given, which must be alive); the new revision.
    pub fn put(&mut self, key: &str, value: Vec<u8>, lease: Option<u64>) -> Option<u64> {
        self.requests += 1;
        if lease.is_some_and(|l| !self.leases.contains_key(&l)) {
            return None;
        }
        self.rev += 1;
        let rev = self.rev;
        let create_rev = self.kv.get(key).map_or(rev, |e| e.create_rev);
        self.kv.insert(
            key.to_string(),
            Entry {
                value,
                create_rev,
                mod_rev: rev,
                lease,
            },
        );
        Some(rev)
    }

    /// Puts `key` only if its mod revision is `expect` (0: only if absent): a transaction.
    pub fn cas(&mut self, key: &str, expect: u64, value: Vec<u8>) -> bool {
        let now_rev = self.kv.get(key).map_or(0, |e| e.mod_rev);
        if now_rev != expect {
            self.requests += 1;
            return false;
        }
        self.put(key, value, None).is_some()
    }

    /// One key.
    pub fn get(&mut self, key: &str) -> Option<Entry> {
        self.requests += 1;
        self.kv.get(key).cloned()
    }

    /// Every key under `prefix`, in key order.
    pub fn prefix(&mut self, prefix: &str) -> Vec<(String, Entry)> {
        self.requests += 1;
        self.kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect()
    }

    /// Campaigns with `lease` under `election`: puts the candidate's key if it has none.
    pub fn campaign(&mut self, election: &str, lease: u64, value: &[u8]) {
        let key = format!("{election}/{lease:x}");
        if self.kv.contains_key(&key) {
            return;
        }
        let _ = self.put(&key, value.to_vec(), Some(lease));
    }

    /// The lease of the election's leader: the live campaign key created first.
    pub fn leader(&mut self, election: &str) -> Option<u64> {
        self.prefix(&format!("{election}/"))
            .into_iter()
            .min_by_key(|(_, e)| e.create_rev)
            .and_then(|(_, e)| e.lease)
    }
}
