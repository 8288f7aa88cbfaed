//! The server's cluster half: the map it serves under, each partition's phase and tokens, the
//! check every command passes, and the requests a cluster adds (`GetMap`, `ClientJoin`,
//! `ReclaimDone`). The pure rules are `crate::cluster`'s; this file keeps their state.
//!
//! A standalone server has no [`ClusterSide`] and none of this runs: its answers are
//! byte-for-byte those of a server built before the cluster existed.
//!
//! # What a cluster server keeps per partition ([`PartState`])
//!
//! | state                        | the data path answers                                | leaves it when                      |
//! |------------------------------|------------------------------------------------------|-------------------------------------|
//! | not owned (never, or lost)   | `PartitionMoved` (aux = map version)                  | a map gives it to this server       |
//! | owned, recovering            | re-claims and `ReclaimDone` served, else `NotReady`  | grace end, or every client of the old owner said `ReclaimDone` |
//! | owned, serving               | everything; a re-claim is `Fail` (`ReclaimClosed`)   | a map takes it away                  |
//! | any, authority lapsed        | `PartitionMoved` (`Fenced`), nothing executed         | the membership confirms the lease    |
//!
//! A lost partition's lock slots stay (clients may still release them) until the grants in it
//! can no longer be believed in — [`Timing::grant_lease_max_ms`] stretched by the drift bound
//! after the loss — and are then freed ([`Server::cluster_tick`]).
//!
//! # Who the new owner waits for
//!
//! A partition taken over (`Expired`) or moved (`Moved`) recovers until its grace deadline, or
//! until every client id the old owner had persisted (the runtime hands the lists to
//! [`Server::apply_map`]) has said `ReclaimDone` for it. The ids are tracked in a table of one
//! entry per client slot of this server (`Config::clients_max`: [`ClusterSide::expected`])
//! with one bit per (partition, entry): an old owner configured
//! as this server is fits whole, however many clients it had. A takeover whose lists do not
//! fit (old owners with more clients between them than this server has slots) waits for the
//! grace deadline for the owners that did not fit (safe, only slower). A server grants nothing to a
//! client whose id it has not persisted yet ([`Server::client_persisted`]), so the list a
//! successor reads covers every client that can hold a grant here.

use super::cluster_awaited::Awaited;
use super::{Counter, Server};
use crate::cluster::token::PartitionTokens;
use crate::cluster::{
    Class, Handover, Local, Map, PARTITIONS_MAX, Phase, ServerId, Timing, Verdict,
};
use crate::status::Status;
use crate::table::{ClientEntry, SlotState};

/// Reservation requests queued for the membership before the data thread stops asking (it asks
/// again at the next fetch-and-add that wants one).
pub const RESERVE_QUEUE_MAX: usize = 64;

/// One partition as this server sees it (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartState {
    /// Token counter at the partition's epoch (epoch 0: not owned).
    pub tokens: PartitionTokens,
    /// Owned here under the applied map.
    pub owned: bool,
    /// Recovery is over (latched: a partition never goes back to recovering at one epoch).
    pub serving: bool,
    /// Before this, nothing but re-claims (the new owner's wait).
    pub first_grant_ms: u64,
    /// From this, serve whoever has not re-claimed.
    pub grace_end_ms: u64,
    /// Tracked clients of the old owner yet to say `ReclaimDone`; `u32::MAX`: not tracked
    /// (wait for the grace end).
    pub awaiting: u32,
    /// A renewal of the epoch was asked for at `tokens.epoch()`.
    pub renewal_asked: bool,
    /// Lost with slots still in use: free them at `free_at_ms`.
    pub lost: bool,
    /// When a lost partition's slots are freed.
    pub free_at_ms: u64,
}

/// The memory a cluster server keeps its cluster state in, handed in by the runtime (the core
/// allocates nothing): about 1.4 MiB for the default 1,000 clients, of which the reclaim grid
/// is 512 KiB; the grid takes 512 bytes per client slot (32 MiB at the 65,536-client limit).
#[derive(Debug)]
pub struct ClusterSide<'c> {
    /// The applied map.
    pub map: &'c mut Map,
    /// Its wire encoding, what `GetMap` sends: [`crate::cluster::MAP_ENCODED_MAX`] bytes.
    pub encoded: &'c mut [u8],
    /// One per partition: [`PARTITIONS_MAX`] entries.
    pub parts: &'c mut [PartState],
    /// Tracked client ids of old owners: one entry per client slot (`Config::clients_max`; a
    /// longer slice is cut to that). A client re-claims at the new owner over a registration
    /// there (its join), so an old owner with as many clients as this server has slots is
    /// tracked whole.
    pub expected: &'c mut [u32],
    /// One bit per (partition, tracked client): [`ClusterSide::reclaims_len`] words.
    pub reclaims: &'c mut [u64],
}

impl ClusterSide<'_> {
    /// Words of [`ClusterSide::reclaims`] for a server with `clients_max` client slots: each
    /// partition's bits are a whole number of words, which a takeover clears as one run.
    pub const fn reclaims_len(clients_max: u32) -> usize {
        PARTITIONS_MAX as usize * reclaim_row_words(clients_max)
    }
}

/// Words of one partition's row of the reclaim grid: a bit per tracked client, rounded up.
pub(super) const fn reclaim_row_words(clients_max: u32) -> usize {
    (clients_max as usize).div_ceil(64)
}

/// What a cluster server is configured with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterSettings {
    /// This server.
    pub me: ServerId,
    /// The timing rules (lease TTL as granted, drift bound, longest grant lease).
    pub timing: Timing,
    /// How far ahead of a counter's value its high-water mark is reserved.
    pub counter_step: u64,
}

/// Work for the membership that the data path found ([`Server::cluster_work`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterWork<'a> {
    /// Persist high-water mark `mark` for counter `name` (object `object`) of `partition`,
    /// under map `map_version`; answer with [`Server::mark_confirmed`] or [`Server::mark_failed`].
    Reserve {
        /// The counter's partition.
        partition: u16,
        /// The object's id (slot and generation).
        object: u32,
        /// Its name.
        name: &'a [u8],
        /// The mark to persist.
        mark: u64,
        /// The map version the partition is served under.
        map_version: u64,
    },
    /// `partition`'s token counter at `epoch` is half used: ask the coordinator for a new epoch.
    Renew {
        /// The partition.
        partition: u16,
        /// Its current epoch.
        epoch: u32,
    },
}

/// The server's cluster state (module doc).
#[derive(Debug)]
pub(super) struct ClusterCore<'c> {
    pub(super) side: ClusterSide<'c>,
    pub(super) me: ServerId,
    pub(super) timing: Timing,
    pub(super) counter_step: u64,
    /// The registration the applied map is for (0: no map yet).
    pub(super) incarnation: u64,
    pub(super) encoded_len: usize,
    /// Until when (exclusive, server tick) this server may grant; 0: not at all.
    pub(super) authority_until_ms: u64,
    /// Entries of `side.expected` in use (its length is the most there may be).
    pub(super) expected_len: usize,
    /// Words of one partition's row of `side.reclaims`.
    pub(super) row_words: usize,
    /// Reservations asked for since the last `cluster_work`: the object and the mark the
    /// asking fetch-and-add needs (`Reserve::wants`).
    pub(super) reserve_queue: [(u32, u64); RESERVE_QUEUE_MAX],
    pub(super) reserve_len: usize,
    /// Partitions lost with slots to free, or recovering: `cluster_tick` has work.
    pub(super) pending: u32,
    /// A token counter crossed its renewal point: `cluster_work` looks for it (and only then
    /// walks the partitions).
    pub(super) renewals_due: bool,
}

/// `PartitionMoved` with the map version in `aux`, or the status a verdict answers.
#[inline]
pub(super) fn verdict_status(v: Verdict) -> Option<(Status, u64)> {
    match v {
        Verdict::Serve => None,
        Verdict::NotOwner { version }
        | Verdict::StaleEpoch { version }
        | Verdict::FutureEpoch { version }
        | Verdict::Fenced { version } => Some((Status::PartitionMoved, version)),
        Verdict::BadPartition => Some((Status::PartitionMoved, 0)),
        Verdict::NotReady => Some((Status::NotReady, 0)),
        Verdict::ReclaimClosed => Some((Status::Fail, 0)),
    }
}

impl ClusterCore<'_> {
    /// The check of `crate::cluster::check` for `partition` at `epoch` now.
    #[inline]
    pub(super) fn verdict(&self, partition: u16, epoch: u32, class: Class, now_ms: u64) -> Verdict {
        let local = Local {
            map: self.side.map,
            me: self.me,
            incarnation: self.incarnation,
            authority: now_ms < self.authority_until_ms,
        };
        let phase = match self.side.parts.get(usize::from(partition)) {
            Some(s) if s.serving => Phase::Serving,
            _ => Phase::Recovering,
        };
        crate::cluster::check(&local, partition, epoch, class, phase)
    }

    /// The partition's epoch under the applied map (0 if `partition` is out of range).
    #[inline]
    pub(super) fn epoch_of(&self, partition: u16) -> u32 {
        self.side.map.owner(partition).map_or(0, |o| o.epoch)
    }

    /// Whether this server owns `partition` now, may grant, and serves it (name-based control
    /// requests ask this: they carry no epoch).
    #[inline]
    pub(super) fn owns(&self, partition: u16, now_ms: u64) -> Verdict {
        self.verdict(partition, self.epoch_of(partition), Class::Ordinary, now_ms)
    }
}

impl<'r> Server<'r> {
    /// Makes this a cluster server: from now on every command is checked against the map
    /// (none applied yet: everything is `PartitionMoved` until [`Server::apply_map`]). The
    /// memory of `side` is formatted here.
    pub fn enable_cluster(&mut self, mut side: ClusterSide<'r>, settings: ClusterSettings) {
        assert!(side.parts.len() >= usize::from(PARTITIONS_MAX));
        let clients_max = self.config().clients_max;
        assert!(side.expected.len() >= clients_max as usize);
        assert!(side.reclaims.len() >= ClusterSide::reclaims_len(clients_max));
        assert!(side.encoded.len() >= crate::cluster::MAP_ENCODED_MAX);
        side.parts.fill(PartState::default());
        // One entry per client slot: the table's length is then the most it tracks (`fits`);
        // the re-claim grid is cut to those entries' rows, so clearing it clears no more.
        let expected = core::mem::take(&mut side.expected);
        side.expected = &mut expected[..clients_max as usize];
        let reclaims = core::mem::take(&mut side.reclaims);
        side.reclaims = &mut reclaims[..ClusterSide::reclaims_len(clients_max)];
        side.reclaims.fill(0);
        self.cluster = Some(ClusterCore {
            side,
            me: settings.me,
            timing: settings.timing,
            counter_step: settings.counter_step.max(1),
            incarnation: 0,
            encoded_len: 0,
            authority_until_ms: 0,
            expected_len: 0,
            row_words: reclaim_row_words(clients_max),
            reserve_queue: [(0, 0); RESERVE_QUEUE_MAX],
            reserve_len: 0,
            pending: 0,
            renewals_due: false,
        });
    }

    /// Whether this is a cluster server.
    #[inline]
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// The version of the map applied (`None`: standalone, or no map yet applied).
    pub fn map_version(&self) -> Option<u64> {
        let c = self.cluster.as_ref()?;
        (c.incarnation != 0).then(|| c.side.map.version())
    }

    /// A partition's state (`None`: standalone or out of range), for diagnostics and tests.
    pub fn partition_state(&self, p: u16) -> Option<PartState> {
        self.cluster
            .as_ref()?
            .side
            .parts
            .get(usize::from(p))
            .copied()
    }

    /// The membership says this server may grant until `until_ms` (exclusive, server tick),
    /// `None`: not at all (no confirmed round for the applied map). Self-fencing: past it every
    /// command is answered `PartitionMoved`, and serving resumes when a later confirmation
    /// moves it forward.
    pub fn set_authority_until(&mut self, until_ms: Option<u64>) {
        if let Some(c) = self.cluster.as_mut() {
            c.authority_until_ms = until_ms.unwrap_or(0);
        }
    }

    /// Applies a newer map (an older or equal version is ignored), registered as `incarnation`:
    /// partitions newly owned start their takeover (phase from `Timing::takeover`, tokens at
    /// the new epoch, the old owner's clients tracked from `old_clients`: `(server,
    /// incarnation, persisted ids)` per old owner the runtime could read), partitions lost stop
    /// being served at once and their slots are freed later, parked requests in a partition
    /// whose owner or epoch changed are answered `PartitionMoved`. Returns whether it applied.
    pub fn apply_map(
        &mut self,
        map: &Map,
        incarnation: u64,
        old_clients: &[(ServerId, u64, &[u32])],
        now_ms: u64,
    ) -> bool {
        let Some(c) = self.cluster.as_mut() else {
            return false;
        };
        let first = c.incarnation == 0;
        if !first && map.version() <= c.side.map.version() && incarnation == c.incarnation {
            return false;
        }
        if map.partitions() != c.side.map.partitions() && !first {
            // The partition count is fixed for a cluster's life: a map with another is not
            // this cluster's (the agent refuses such a cluster at join).
            return false;
        }
        let me = c.me;
        let was_mine = |m: &Map, inc: u64, p: u16| {
            inc != 0 && m.is_for(me, inc) && m.owner(p).is_some_and(|o| o.server == Some(me))
        };
        let mut moved = [0u64; PARTITIONS_MAX as usize / 64];
        // Partitions taken (again) whose slots of an earlier ownership here are still live:
        // freed before serving, so no grant of the earlier epoch revives (its holders
        // re-claim with proofs like everyone else's).
        let mut reset = [0u64; PARTITIONS_MAX as usize / 64];
        // Partitions taken over: their old owners' clients are tracked after the loop.
        let mut taken = [0u64; PARTITIONS_MAX as usize / 64];
        let mut any_reset = false;
        for p in 0..map.partitions().get() {
            let before = (was_mine(c.side.map, c.incarnation, p), c.epoch_of(p));
            let now_mine = was_mine(map, incarnation, p);
            let epoch = map.owner(p).map_or(0, |o| o.epoch);
            if before == (now_mine, epoch) {
                continue;
            }
            moved[usize::from(p) / 64] |= 1 << (p % 64);
            let handover = map.owner(p).map_or(Handover::First, |o| o.handover);
            let s = &mut c.side.parts[usize::from(p)];
            if now_mine {
                if before.0 && handover == Handover::Renewal {
                    // Same owner, new epoch: keep serving, tokens move on.
                    let _ = s.tokens.advance(epoch);
                    s.renewal_asked = false;
                    continue;
                }
                if before.0 || s.lost {
                    reset[usize::from(p) / 64] |= 1 << (p % 64);
                    any_reset = true;
                }
                let t = c.timing.takeover(now_ms, handover);
                *s = PartState {
                    tokens: PartitionTokens::at(epoch),
                    owned: true,
                    serving: false,
                    first_grant_ms: t.first_grant_ms,
                    grace_end_ms: t.grace_end_ms,
                    awaiting: u32::MAX,
                    renewal_asked: false,
                    lost: false,
                    free_at_ms: 0,
                };
                c.untrack(p);
                taken[usize::from(p) / 64] |= 1 << (p % 64);
                c.pending += 1;
            } else if before.0 {
                let free_at = now_ms + c.timing.stretch_ms(u64::from(c.timing.grant_lease_max_ms));
                *s = PartState {
                    lost: true,
                    free_at_ms: free_at,
                    ..PartState::default()
                };
                c.untrack(p);
                c.pending += 1;
            }
        }
        // Before the old map is replaced: it says who owned each partition taken.
        c.track_takeovers(&taken, old_clients);
        c.side.map.clone_from(map);
        c.incarnation = incarnation;
        let owned = c.side.parts.iter().filter(|s| s.owned).count();
        self.stats.0[Counter::PartitionsOwned as usize] = owned as u64;
        c.encoded_len = map.encode(c.side.encoded).unwrap_or(0);
        self.answer_moved_waiters(&moved, now_ms);
        if any_reset {
            self.free_lost_slots(&reset, now_ms);
        }
        self.cluster_tick(now_ms);
        true
    }

    /// The recovery gauges `dlock stat` shows: partitions recovering, and the clients they
    /// await.
    fn recovery_gauges(&mut self, recovering: u64, awaited: Awaited) {
        self.stats.0[Counter::PartitionsRecovering as usize] = recovering;
        self.stats.0[Counter::ReclaimAwaited as usize] = awaited.sum;
        self.stats.0[Counter::ReclaimAwaitedMax as usize] = awaited.max;
        self.stats.0[Counter::ReclaimUntracked as usize] = awaited.untracked;
    }

    /// Advances recovering partitions to serving and frees the slots of lost partitions whose
    /// grants are over. Runs at every `tick` and after a map is applied.
    pub fn cluster_tick(&mut self, now_ms: u64) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if c.pending == 0 {
            self.recovery_gauges(0, Awaited::default());
            return;
        }
        let mut recovering = 0;
        let mut awaited = Awaited::default();
        let mut pending = 0;
        let mut free = [0u64; PARTITIONS_MAX as usize / 64];
        let mut any_free = false;
        for p in 0..c.side.map.partitions().get() {
            let s = &mut c.side.parts[usize::from(p)];
            if s.owned && !s.serving {
                let t = crate::cluster::Takeover {
                    learned_ms: 0,
                    first_grant_ms: s.first_grant_ms,
                    grace_end_ms: s.grace_end_ms,
                };
                if t.phase(now_ms, s.awaiting == 0) == Phase::Serving {
                    s.serving = true;
                } else {
                    pending += 1;
                    recovering += 1;
                    awaited.add(s.awaiting);
                }
            }
            if s.lost {
                if now_ms >= s.free_at_ms {
                    s.lost = false;
                    if !s.owned {
                        free[usize::from(p) / 64] |= 1 << (p % 64);
                        any_free = true;
                    }
                } else {
                    pending += 1;
                }
            }
        }
        c.pending = pending;
        self.recovery_gauges(recovering, awaited);
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        if c.expected_len > 0 && c.side.parts.iter().all(|s| s.serving || !s.owned) {
            // No partition recovers: the tracked ids can go.
            c.side.reclaims.fill(0);
            c.expected_len = 0;
        }
        if any_free {
            self.free_lost_slots(&free, now_ms);
        }
    }

    /// The partition of a lock slot (0 on a standalone server, where it is never asked).
    #[inline]
    pub(super) fn lock_partition(&self, lock: u32) -> u16 {
        SlotState(self.t.lock_meta[lock as usize].state).partition()
    }

    /// The verdict for a lock or object command whose slot is in `partition`, at `epoch`.
    #[inline]
    pub(super) fn command_verdict(
        &mut self,
        partition: u16,
        epoch: u32,
        class: Class,
        now_ms: u64,
    ) -> Option<(Status, u64)> {
        let c = self.cluster.as_ref()?;
        let v = c.verdict(partition, epoch, class, now_ms);
        if matches!(v, Verdict::Fenced { .. }) {
            self.stats.bump(Counter::Fenced);
        }
        verdict_status(v)
    }

    /// The partition a new name goes in, if this server owns and serves it now; the status to
    /// answer otherwise. Standalone: partition 0, always.
    pub(super) fn partition_for_name(&mut self, name: &[u8], now_ms: u64) -> Result<u16, Status> {
        let Some(c) = self.cluster.as_ref() else {
            return Ok(0);
        };
        let p = crate::cluster::partition_of(name, c.side.map.partitions());
        match verdict_status(c.owns(p, now_ms)) {
            None => Ok(p),
            Some((s, _)) => Err(s),
        }
    }

    /// The next token for a grant in `partition`: the standalone counter, or the partition's.
    /// A cluster grant is made only after `cluster_refusal` saw the partition owned with a
    /// counter that has room, so the partition's counter cannot refuse here; if it did (a bug),
    /// the last token of the epoch is repeated rather than a smaller one issued.
    #[inline]
    pub(super) fn issue_token_in(&mut self, partition: u16) -> u64 {
        let Some(c) = self.cluster.as_mut() else {
            return self.issue_token().0;
        };
        let s = &mut c.side.parts[usize::from(partition)];
        match s.tokens.issue() {
            Ok(t) => {
                c.renewals_due |= !s.renewal_asked && s.tokens.wants_renewal();
                t
            }
            Err(e) => {
                debug_assert!(false, "a cluster grant without a token: {e:?}");
                crate::cluster::token::token(s.tokens.epoch(), crate::cluster::token::COUNTER_MAX)
            }
        }
    }

    /// The epoch a grant in `partition` is proved at: the partition's (standalone: the
    /// server's).
    #[inline]
    pub(super) fn proof_epoch(&self, partition: u16) -> u32 {
        match &self.cluster {
            Some(c) => c.epoch_of(partition),
            None => u32::from(self.cfg.epoch),
        }
    }

    /// Hands the membership's work to `sink`: reservations the data path asked for and epoch
    /// renewals. Call it from the runtime's loop; it does nothing when there is none.
    pub fn cluster_work(&mut self, mut sink: impl FnMut(ClusterWork<'_>)) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let version = c.side.map.version();
        for i in 0..c.reserve_len {
            let (raw, needed) = c.reserve_queue[i];
            let Some(index) = crate::ids::ObjectId::from_raw(raw).map(|id| id.index()) else {
                continue;
            };
            let meta = &self.t.object_meta[index as usize];
            let state = SlotState(meta.state);
            if !state.is_live() || meta.reserved == 0 {
                continue;
            }
            self.stats.bump(Counter::CounterReservations);
            // A step above the value now (which may have moved since the ask), and never below
            // the mark the asking fetch-and-add needs: one that adds more than the step would
            // otherwise be refused for ever, each confirmed mark short of it.
            let ahead = self.t.object_cells[index as usize]
                .load(core::sync::atomic::Ordering::Acquire)
                .saturating_add(c.counter_step);
            sink(ClusterWork::Reserve {
                partition: state.partition(),
                object: raw,
                name: self.t.object_names[index as usize].name(),
                mark: ahead.max(needed),
                map_version: version,
            });
        }
        c.reserve_len = 0;
        if !core::mem::take(&mut c.renewals_due) {
            return;
        }
        for p in 0..c.side.map.partitions().get() {
            let s = &mut c.side.parts[usize::from(p)];
            if s.owned && !s.renewal_asked && s.tokens.wants_renewal() {
                s.renewal_asked = true;
                self.stats.bump(Counter::TokenRenewals);
                sink(ClusterWork::Renew {
                    partition: p,
                    epoch: s.tokens.epoch(),
                });
            }
        }
    }

    /// The membership persisted client `raw`'s id: it may be granted from now on.
    pub fn client_persisted(&mut self, raw: u32) {
        if let Some(slot) = self.client_slot(raw) {
            self.t.clients[slot as usize].flags |= ClientEntry::PERSISTED;
        }
    }

    /// Whether client `slot` may be granted in a cluster (its id persisted); always on a
    /// standalone server.
    #[inline]
    pub(super) fn grantable_client(&self, slot: u32) -> bool {
        self.cluster.is_none() || self.t.clients[slot as usize].has(ClientEntry::PERSISTED)
    }
}
