//! After a partition changed owner: the client re-claims at the new owner every lock it knows
//! in that partition — each grant or ticket with the proof the old owner gave it, references
//! alone otherwise — in batches of at most 31 (`BatchUpdateLocks`), then says
//! `ReclaimDone(partition, epoch)` (`CLUSTER-SPEC` §5).
//!
//! | answer to a claim               | the link's record                                   |
//! |---------------------------------|-----------------------------------------------------|
//! | `Success`                       | filed under the new owner's id, epoch and incarnation |
//! | `NotReady`, `PartitionMoved` (transient) | kept as it was, claimed again after a backoff |
//! | any other status (permanent: `Fail`, `ServerNoResource`, `Einval`, …) | the grant is gone (or cannot be restored there): forgotten; the reference taken again at next use |
//! | no answer (a lost reply), or the batch refused whole | kept as it was, claimed again after a backoff |
//!
//! A refusal is transient when it names a passing state of the new owner, not of the claim:
//! `NotReady` (it has not persisted the client yet, or the partition waits for its takeover),
//! `PartitionMoved` (it has not applied the map the client learned, or it is fenced). Every
//! other status speaks of the claim itself (`Fail`: the grant is gone; `ServerNoResource`: no
//! room for it while the owner recovers, which frees no slot; `Einval`: a name, hold or proof
//! it will never accept), which the client would send unchanged and see refused the same way:
//! kept, it was sent again at every heartbeat and its partition's `ReclaimDone` never said, so
//! the partition held every other client in `NotReady` until its grace deadline, when the claim
//! is refused `Fail` all the same. Forgetting a grant the owner did not take is always safe;
//! believing in it is not. What is kept for a transient refusal is claimed again at the next
//! heartbeat or retry once its backoff is over: [`BACKOFF_MIN`], doubling to [`BACKOFF_MAX`] at
//! each refusal in a row, so an owner that stays unready is not sent the same batch every few
//! milliseconds by every client that retries a call.
//!
//! A client that was silent past the old owner's lease claims nothing but its references: the
//! old owner may have freed its grants before it died (the lease-lapse rule of
//! `Client::reinit`). The same owner at a new epoch (a renewal of its token counter) needs no
//! re-claim: its ids stay valid.
//!
//! # What the client owes until it is taken
//!
//! The new owner of a partition serves it early only when every client the old owner had
//! persisted said `ReclaimDone` there; one missing word holds the partition in `NotReady` until
//! the grace deadline (the longest grant lease, 30 s by default). The client learns a map from
//! whichever server answers first, often before the new owner applied it, and the new owner
//! refuses claims and `ReclaimDone` as naming a future epoch until it has; a client it has not
//! persisted yet gets `NotReady` for its claims. Both are retried within the call's deadline,
//! which for a lock call is short. So what was not taken is kept in [`Owed`] — partitions whose
//! re-claims were not all answered, and `ReclaimDone`s of partitions without locks — and paid
//! at each heartbeat ([`ClusterLink::pay_owed`]), and before each retry of a request a
//! partition check refused ([`ClusterLink::retry_pause`]: that request may wait on this very
//! debt), until taken, or until the map gives the partition to someone else. Before, a claim
//! refused once waited for the lock's next use, and a `ReclaimDone` refused until the deadline
//! was never sent again.

mod dones;

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use dlock_core::Status;
use dlock_core::cluster::{Handover, ServerId};
use dlock_core::proto::{
    Batch, BatchEntry, CONTROL_FRAME_MAX, ControlRequest, ControlResponse, LockClaim,
    PartitionEpoch, decode_control_response,
};

use super::{ClusterLink, Dial, garbage};
use crate::client::LocalLock;

/// Claims per `BatchUpdateLocks` (the batch limit).
const CLAIMS_MAX: usize = dlock_core::config::BATCH_MAX;
/// How long a heartbeat, or a command on its way to its server, may spend paying what the
/// client owes new owners ([`Owed`]).
pub(super) const OWED_WAIT: Duration = Duration::from_millis(250);
/// The wait before a partition's claims, refused for a passing reason, are sent again.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// The longest such wait: short beside the grace deadline (the longest grant lease, 30 s by
/// default) that a partition waits for a client that does not say `ReclaimDone`.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Whether a claim refused with `status` may be taken later as it is (module doc).
#[must_use]
fn refusal_is_transient(status: Status) -> bool {
    matches!(status, Status::NotReady | Status::PartitionMoved)
}

impl<D: Dial> ClusterLink<D> {
    /// Refreshes the map (from `first`, then the others) and, if it changed, re-claims every
    /// partition that moved. Whether the map changed.
    pub(super) fn follow_map(&mut self, first: Option<ServerId>, deadline: Instant) -> bool {
        self.follow_map_without(first, None, deadline)
    }

    /// [`Self::follow_map`], asking every server but `skip` (one gone silent).
    pub(super) fn follow_map_without(
        &mut self,
        first: Option<ServerId>,
        skip: Option<ServerId>,
        deadline: Instant,
    ) -> bool {
        let before = self.map.clone();
        let changed = self.refresh(first, skip, deadline);
        if changed {
            self.rehome(deadline);
            self.done_without_records(&before, deadline);
        }
        changed
    }

    /// Says `ReclaimDone` to the new owner of every partition that moved away from a server
    /// the client is registered with, and in which it knows no lock (those with locks said it
    /// after their re-claims, in `rehome`). The old owner persisted the client's id, so the
    /// new owner waits for this client's word in *every* partition it took from that owner
    /// before it serves: without it, one client that never used a partition held the
    /// partition in `NotReady` until the grace deadline (the longest grant lease, 30 s by
    /// default), after every failover and every planned move.
    fn done_without_records(&mut self, before: &dlock_core::cluster::Map, deadline: Instant) {
        // The partitions with routes, sorted: one pass over the routes, not one per partition.
        let with_routes = self.routes.partitions();
        for p in 0..self.map.partitions().get() {
            let (old, new) = match (before.owner(p), self.map.owner(p)) {
                (Some(old), Some(new)) => (*old, *new),
                _ => continue,
            };
            let (Some(old_server), Some(new_server)) = (old.server, new.server) else {
                continue;
            };
            let moved = old_server != new_server
                || before.server(old_server).map(|e| e.incarnation())
                    != self.map.server(new_server).map(|e| e.incarnation());
            if !moved
                || !self.members.contains_key(&old_server)
                || with_routes.binary_search(&p).is_ok()
            {
                continue;
            }
            self.owed.dones.insert(p, (new_server, new.epoch));
        }
        self.pay_dones(deadline);
    }

    /// Pays what the client still owes new owners ([`Owed`]): the re-claims of partitions not
    /// all answered, then the owed `ReclaimDone`s. At each heartbeat, after the heartbeats
    /// went out, and within [`OWED_WAIT`] of the heartbeat's deadline: what is refused again
    /// waits for the next heartbeat rather than retrying until the deadline, which would
    /// starve the heartbeats that keep the client's leases (a client whose lease lapsed is
    /// dropped by the server with its references). Nothing to do (two empty sets) in steady
    /// state.
    pub(super) fn pay_owed(&mut self, deadline: Instant) {
        let now = Instant::now();
        let deadline = deadline.min(now + OWED_WAIT);
        let due: Vec<u16> = (self.owed.reclaims.iter())
            .filter(|(_, b)| b.due <= now)
            .map(|(&p, _)| p)
            .collect();
        for p in due {
            self.rehome_partition(p, deadline);
        }
        self.pay_dones(deadline);
    }

    /// The pause before a request refused by a partition check (`NotReady`, `PartitionMoved`)
    /// is sent again, in which the client first pays what it owes new owners ([`Owed`]): the
    /// request may wait on a partition's recovery that waits on this very client's word, and
    /// a client retrying until its deadline without saying it held the partition (and itself)
    /// until then — after a kill, the XID workers' fetch-and-adds stalled for their whole
    /// 5-second deadline this way.
    pub(super) fn retry_pause(&mut self, pause: Duration, deadline: Instant) -> Duration {
        self.pay_owed(deadline);
        self.pause(pause, deadline)
    }

    /// Re-claims every partition the client knows locks in whose owner changed in the map.
    pub(super) fn rehome(&mut self, deadline: Instant) {
        for p in self.routes.partitions() {
            self.rehome_partition(p, deadline);
        }
    }

    /// Brings the routes of partition `p` to the map's owner of it: a new epoch of the same
    /// owner is only noted; a new owner gets the partition's re-claims. Failures are logged
    /// and leave the routes as they were, to be re-claimed at the next use.
    ///
    /// Every data command's route comes here first, so a partition whose routes were all found
    /// at its owner in this very map, and that owes no re-claim, is passed over at one look
    /// ([`Owed::homed`]): the pass reads every route of the client, which made each lock and
    /// unlock of a client holding N locks cost a sort of N and two allocations.
    pub(super) fn rehome_partition(&mut self, p: u16, deadline: Instant) {
        let version = self.map.version();
        if self.owed.homed(p, version) {
            return;
        }
        let owner = self.map.owner(p).copied().unwrap_or_default();
        let Some(server) = owner.server else {
            return;
        };
        let incarnation = self.map.server(server).map_or(0, |e| e.incarnation());
        // The partition's routes, then those of them to re-claim, in the link's one list of
        // them ([`Owed::pass`]), taken for the pass and put back after it.
        let mut stale = std::mem::take(&mut self.owed.pass);
        self.owed.passes += 1;
        self.routes.in_partition(p, &mut stale);
        stale.retain(|&id| {
            let Some(r) = self.routes.get_mut(id) else {
                return false;
            };
            // The same server and registration is the same ownership only at the same epoch,
            // or at a later one the owner got by renewing its own (`Renewal`). A partition that
            // left and came back (A → B → A) is a new ownership at A: A freed the slots of the
            // earlier one, this client's reference with them, so the record is claimed again.
            let same = (r.server, r.incarnation) == (server, incarnation)
                && (r.epoch == owner.epoch || owner.handover == Handover::Renewal);
            if same {
                r.epoch = owner.epoch;
            }
            !same
        });
        let settled = stale.is_empty()
            || match self.reclaim(p, server, incarnation, owner.epoch, &stale, deadline) {
                Ok(settled) => settled,
                Err(e) => {
                    tracing::warn!(partition = p, %server, error = %e, "dlock: re-claims not done; kept for the next try");
                    false
                }
            };
        self.owed.pass = stale;
        if settled {
            self.owed.reclaims.remove(&p);
            self.owed.home(p, version, self.map.partitions().get());
        } else {
            self.owed.back_off(p);
        }
    }

    /// Re-claims the locks `ids` of partition `p` at `server`, which owns it at `epoch`;
    /// whether all is settled (every claim answered for good and `ReclaimDone` taken).
    fn reclaim(
        &mut self,
        p: u16,
        server: ServerId,
        incarnation: u64,
        epoch: u32,
        ids: &[u32],
        deadline: Instant,
    ) -> io::Result<bool> {
        // Read before the new owner is joined (which replaces the old one's record when the
        // same server came back as another incarnation).
        let now = Instant::now();
        for &id in ids {
            let lapsed = self
                .routes
                .get(id)
                .is_some_and(|r| self.lapsed(r.server, now));
            if lapsed && let Some(r) = self.routes.get_mut(id) {
                r.record = LocalLock::new(r.record.id, r.record.kind);
            }
        }
        let mut reply = vec![0u8; CONTROL_FRAME_MAX];
        let mut all = true;
        let new = Owned {
            server,
            incarnation,
            epoch,
        };
        for chunk in ids.chunks(CLAIMS_MAX) {
            let (ids, names, claims) = self.claims(chunk);
            let claims: Vec<LockClaim<'_>> = claims
                .iter()
                .zip(&names)
                .map(|(c, name)| LockClaim { name, ..*c })
                .collect();
            let body = ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims));
            let m = self.control_with(server, body, &mut reply, deadline)?;
            let frame = decode_control_response(&reply[..m])
                .map_err(|_| garbage("a re-claim reply is malformed"))?;
            let entries: Vec<BatchEntry> = match (frame.header.status(), frame.body) {
                (Some(Status::Success), ControlResponse::Entries(e)) if e.len() == ids.len() => {
                    e.iter().collect()
                }
                (Some(Status::Success), _) => {
                    return Err(garbage("a re-claim reply has another count"));
                }
                (status, _) => {
                    return Err(io::Error::other(format!(
                        "the re-claims were refused whole: {status:?}"
                    )));
                }
            };
            all &= self.file(&ids, &entries, new);
        }
        if !all {
            return Ok(false);
        }
        // Said with the others owed to that server, in one message where it takes them
        // (`pay_dones`), by whoever called for the re-claim.
        self.owed.dones.insert(p, (server, epoch));
        Ok(true)
    }

    /// The claims of the routes `chunk` (each with its name apart, for the borrow): a grant
    /// or ticket with its proof, or the reference alone for a record no claim can describe.
    fn claims(&self, chunk: &[u32]) -> (Vec<u32>, Vec<Vec<u8>>, Vec<LockClaim<'static>>) {
        let now_ms = self.now_ms();
        let (mut ids, mut names, mut claims) = (Vec::new(), Vec::new(), Vec::new());
        for &id in chunk {
            let Some(r) = self.routes.get(id) else {
                continue;
            };
            let c = r.record.claim(now_ms).unwrap_or_else(|| {
                tracing::warn!(lock = ?r.name, "dlock: lock record inconsistent; only its reference is claimed");
                LocalLock::new(r.record.id, r.record.kind)
                    .claim(now_ms)
                    .expect("a fresh record can always claim its reference")
            });
            ids.push(id);
            names.push(r.name.clone());
            claims.push(LockClaim {
                kind: r.record.kind,
                held: c.held,
                name: &[],
                old_lock: r.server_lock.unwrap_or(0),
                word: r.record.word,
                ticket: c.ticket,
                remaining_ms: c.remaining_ms,
                age_ms: c.age_ms,
                token: c.token,
                proof: c.proof,
                value: c.value,
            });
        }
        (ids, names, claims)
    }

    /// Files the new owner's answers to the claims of `ids` (the table in the module doc);
    /// whether every claim was answered for good (taken or refused).
    fn file(&mut self, ids: &[u32], entries: &[BatchEntry], new: Owned) -> bool {
        let mut all = true;
        for (id, entry) in ids.iter().zip(entries) {
            let Some(r) = self.routes.get_mut(*id) else {
                continue;
            };
            let server_lock = match entry.status {
                Status::Success => Some(entry.id),
                // Refused for a passing reason: kept, claimed again after a backoff.
                s if refusal_is_transient(s) => {
                    tracing::debug!(lock = ?r.name, status = ?s, "dlock: a claim was not taken yet; kept");
                    all = false;
                    continue;
                }
                // Refused for good (module doc): forget the grant, keep the name (taken again
                // at the next use), as the standalone recovery drops every claim not taken.
                // `ServerNoResource`: the new owner's lock table is full, and stays so while
                // it recovers (it takes nothing but re-claims, which free no slot).
                refused => {
                    if refused == Status::Fail {
                        tracing::debug!(lock = ?r.name, "dlock: the new owner says a re-claimed grant is gone");
                    } else {
                        tracing::warn!(lock = ?r.name, status = ?refused, "dlock: the new owner refused a re-claimed grant for good; it is lost");
                    }
                    r.record = LocalLock::new(r.record.id, r.record.kind);
                    None
                }
            };
            r.server = new.server;
            r.incarnation = new.incarnation;
            r.epoch = new.epoch;
            r.server_lock = server_lock;
        }
        all
    }
}

/// A partition's new owner, as the map gives it.
#[derive(Clone, Copy, Debug)]
struct Owned {
    server: ServerId,
    incarnation: u64,
    epoch: u32,
}

/// What the client owes new owners after a move (module doc), paid at each heartbeat and
/// before each retry of a refused request.
#[derive(Default)]
pub(super) struct Owed {
    /// Partitions with routes whose re-claim was not answered for good: re-claimed again once
    /// their backoff is over.
    reclaims: BTreeMap<u16, Backoff>,
    /// Partitions in which the client knows no lock, and the owner and epoch that awaits its
    /// `ReclaimDone` there.
    dones: BTreeMap<u16, (ServerId, u32)>,
    /// The words [`ClusterLink::pay_dones`] says, sorted by server: taken for each payment and
    /// put back after it, as [`Owed::reply`] is, so that a payment allocates only while the list
    /// grows to the most words owed at once.
    words: Vec<(ServerId, PartitionEpoch)>,
    /// The buffer the answers to `ReclaimDone`s are read into: allocated at the first, kept.
    reply: Vec<u8>,
    /// By partition, the map version at which its routes were last all found at its owner
    /// (or filed there by their re-claims): sized by the map's partition count at the first
    /// pass that settles one, then kept (a map of another count is never followed).
    homed: Vec<Option<u64>>,
    /// The routes a re-claim pass looks at, then those it re-claims
    /// ([`ClusterLink::rehome_partition`]): taken for each pass and put back after it.
    pass: Vec<u32>,
    /// How many passes looked through a partition's routes ([`ClusterLink::rehome_passes`]).
    passes: u64,
}

impl std::fmt::Debug for Owed {
    /// What is owed; not the buffers the payments reuse.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owed")
            .field("reclaims", &self.reclaims)
            .field("dones", &self.dones)
            .field("homed", &self.homed)
            .finish_non_exhaustive()
    }
}

impl Owed {
    /// How many passes looked through a partition's routes for ones to re-claim.
    pub(super) fn passes(&self) -> u64 {
        self.passes
    }

    /// Whether partition `p` needs no re-claim pass in the map of `version`: a pass found (or
    /// made) all its routes at the owner this map names, and owes none since. Nothing else
    /// can take a route of `p` from that owner while the map stays at `version`: the map is
    /// only ever replaced by a newer one (`refresh`), and a route is otherwise filed only at
    /// the owner, incarnation and epoch the map at hand names (a new reference, `GetLock`; a
    /// reference taken again, `resolve_again`). A re-claim owed ([`Owed::reclaims`], refused
    /// or unanswered) keeps the partition to a pass at every use, as before this look.
    fn homed(&self, p: u16, version: u64) -> bool {
        self.homed.get(usize::from(p)) == Some(&Some(version)) && !self.reclaims.contains_key(&p)
    }

    /// Partition `p`'s routes are all at its owner in the map of `version`, one of
    /// `partitions`.
    fn home(&mut self, p: u16, version: u64, partitions: u16) {
        let at = usize::from(p);
        if self.homed.len() <= at {
            self.homed.resize(usize::from(partitions).max(at + 1), None);
        }
        self.homed[at] = Some(version);
    }

    /// Partition `p`'s claims were refused for a passing reason (or not answered): claimed
    /// again after [`BACKOFF_MIN`], or after twice the last wait if they were refused before
    /// (at most [`BACKOFF_MAX`]).
    fn back_off(&mut self, p: u16) {
        let wait = self
            .reclaims
            .get(&p)
            .map_or(BACKOFF_MIN, |b| (b.wait * 2).min(BACKOFF_MAX));
        let due = Instant::now() + wait;
        self.reclaims.insert(p, Backoff { due, wait });
    }
}

/// When a partition's kept claims are sent again, and the wait that led there.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    due: Instant,
    wait: Duration,
}
