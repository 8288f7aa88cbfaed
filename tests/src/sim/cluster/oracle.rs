//! The cluster oracle: what must hold across every server of the cluster, whatever fails.
//!
//! - **Never two holders of a lock whose leases run.** A holder believes in its grant from the
//!   server's decision until it releases it, lets it go (its partition moved), or its lease —
//!   counted from when it *sent* the request — runs out. Two beliefs of one lock by different
//!   clients must not overlap, whichever servers granted them.
//! - **Fencing tokens increase per lock across owners**: every grant of a lock, on any server,
//!   carries a token above every token granted for it before.
//! - **Fetch-and-add values are never repeated**: a counter's values, on every owner it had.

use std::collections::HashMap;

/// One client's belief that it holds a lock.
#[derive(Clone, Copy, Debug)]
struct Belief {
    client: usize,
    /// When the server granted it (model clock).
    from: u64,
    /// When the belief ends: lease end, or earlier when the holder let go.
    until: u64,
    token: u64,
    /// Still held (its end may still move earlier, never later).
    open: bool,
}

/// The oracle's state (module doc).
#[derive(Debug, Default)]
pub struct ClusterOracle {
    /// Per lock name: the largest token granted so far.
    tokens: HashMap<usize, u64>,
    beliefs: HashMap<usize, Vec<Belief>>,
    /// Values handed out: (counter, value) → (server, instant).
    faa: HashMap<(usize, u64), (u32, u64)>,
    pub checks: u64,
    pub grants: u64,
    pub faas: u64,
}

impl ClusterOracle {
    /// Server `server` granted lock `name` with `token` at model instant `now`.
    pub fn granted(
        &mut self,
        name: usize,
        token: u64,
        server: u32,
        now: u64,
    ) -> Result<(), String> {
        self.checks += 1;
        self.grants += 1;
        let top = self.tokens.entry(name).or_insert(0);
        if token <= *top {
            return Err(format!(
                "lock {name}: server {server} granted token {token:#x} at {now}, not above \
                 {top:#x} granted before"
            ));
        }
        *top = token;
        Ok(())
    }

    /// Client `client` took the grant of lock `name` (token `token`, decided at `from`) into
    /// its records; it believes in it until `until` at most.
    pub fn believe(
        &mut self,
        client: usize,
        name: usize,
        token: u64,
        (from, until): (u64, u64),
        now: u64,
    ) -> Result<(), String> {
        let list = self.beliefs.entry(name).or_default();
        // Beliefs over long enough ago cannot overlap a new one (grants reach clients within
        // the request timeout).
        list.retain(|b| b.open || b.until + 10_000 > now);
        for b in list.iter() {
            self.checks += 1;
            if b.client != client && from < b.until && b.from < until {
                return Err(format!(
                    "lock {name}: client {client} holds token {token:#x} from {from} while client \
                     {} believes in token {:#x} from {} until {} (two holders)",
                    b.client, b.token, b.from, b.until
                ));
            }
        }
        list.push(Belief {
            client,
            from,
            until,
            token,
            open: true,
        });
        Ok(())
    }

    /// Client `client` stops believing in its grant of lock `name` at `now`.
    pub fn let_go(&mut self, client: usize, name: usize, now: u64) {
        if let Some(list) = self.beliefs.get_mut(&name) {
            for b in list.iter_mut().filter(|b| b.client == client && b.open) {
                b.open = false;
                b.until = b.until.min(now);
            }
        }
    }

    /// Counter `name` handed out `value`.
    pub fn faa(&mut self, name: usize, value: u64, server: u32, now: u64) -> Result<(), String> {
        self.checks += 1;
        self.faas += 1;
        if let Some((first, at)) = self.faa.insert((name, value), (server, now)) {
            return Err(format!(
                "counter {name}: server {server} handed out {value} at {now}, which server \
                 {first} handed out at {at}"
            ));
        }
        Ok(())
    }
}
