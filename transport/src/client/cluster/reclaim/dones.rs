//! Saying `ReclaimDone`: the words the client owes new owners ([`Owed`]'s `dones`) — after its
//! re-claims of a partition, or for a partition that moved and in which it knows no lock —
//! paid to each server in one `ReclaimDones` message where the server speaks protocol 6, one
//! `ReclaimDone` each to an older one, and kept while they are refused for a passing reason.

use std::io;
use std::time::Instant;

use dlock_core::Status;
use dlock_core::cluster::ServerId;
use dlock_core::proto::{
    Batch, CONTROL_FRAME_MAX, ControlRequest, ControlResponse, PROTO_VERSION_RECLAIM_DONES,
    PartitionEpoch, RECLAIM_DONES_MAX, decode_control_response,
};

use super::super::{ClusterLink, Dial, garbage};
#[cfg(doc)]
use super::Owed;
use super::refusal_is_transient;

impl<D: Dial> ClusterLink<D> {
    /// Whether a `ReclaimDone` is owed anywhere: one look, which every data command's route
    /// makes before it reads the clock to pay.
    pub(in crate::client::cluster) fn owes_dones(&self) -> bool {
        !self.owed.dones.is_empty()
    }

    /// Says the `ReclaimDone`s still owed ([`Owed`]), all those owed to one server in one
    /// `ReclaimDones` message where the server's registration or join named protocol 6, one
    /// `ReclaimDone` per partition to an older server; each taken is forgotten, and so is one
    /// owed to an owner the map no longer names for its partition (a word for an earlier
    /// owner or epoch would only be refused). After a failover a client owes a word for every
    /// partition that moved from a server it knew, with or without locks in it: 85 each over
    /// three servers with 256 partitions, so a new owner with 1,000 such clients took 85,000
    /// messages where 1,000 do.
    pub(in crate::client::cluster) fn pay_dones(&mut self, deadline: Instant) {
        if self.owed.dones.is_empty() {
            return;
        }
        let map = &self.map;
        self.owed.dones.retain(|&p, &mut (server, epoch)| {
            map.owner(p)
                .is_some_and(|o| o.server == Some(server) && o.epoch == epoch)
        });
        // The words owed, by server, then partition, in the link's list of them ([`Owed::words`]):
        // every data command's route pays while a word is owed, so not a list of its own per
        // payment. A word owed while these are said waits for the next payment.
        let mut owed = std::mem::take(&mut self.owed.words);
        owed.clear();
        for (&partition, &(server, epoch)) in &self.owed.dones {
            owed.push((server, PartitionEpoch { partition, epoch }));
        }
        owed.sort_unstable_by_key(|&(server, d)| (server, d.partition));
        for words in owed.chunk_by(|a, b| a.0 == b.0) {
            let server = words[0].0;
            if let Err(e) = self.say_dones(server, words, deadline) {
                tracing::debug!(%server, error = %e, "dlock: ReclaimDone not sent");
            }
        }
        self.owed.words = owed;
    }

    /// Says `words`, owed to `server`: in `ReclaimDones` messages where it speaks protocol 6,
    /// one `ReclaimDone` each to a server of protocol 5; those answered `NotReady` or
    /// `PartitionMoved` are sent again after a pause while `deadline` lasts. The client can
    /// learn a map (from one server) before the new owner applied it, which then refuses the
    /// word as naming a future epoch; a word dropped there is never sent again, and the new
    /// owner waits for it until its grace deadline. A word is forgotten as soon as it is
    /// settled — taken, or refused for good (another status: the server will never take it) —
    /// so an error later in the exchange loses none of that; those still refused as the
    /// deadline came stay owed ([`Owed`]).
    fn say_dones(
        &mut self,
        server: ServerId,
        words: &[(ServerId, PartitionEpoch)],
        deadline: Instant,
    ) -> io::Result<()> {
        // The link's one reply buffer for these words, taken for the exchange and put back
        // whatever its outcome (a control reply needs room for the largest frame).
        let mut reply = std::mem::take(&mut self.owed.reply);
        reply.resize(CONTROL_FRAME_MAX, 0);
        let said = self.say_dones_into(server, words, &mut reply, deadline);
        self.owed.reply = reply;
        said
    }

    /// [`Self::say_dones`], with `reply` to read the answers into.
    fn say_dones_into(
        &mut self,
        server: ServerId,
        words: &[(ServerId, PartitionEpoch)],
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<()> {
        let batched = self.member(server, deadline)?.version >= PROTO_VERSION_RECLAIM_DONES;
        let per_message = if batched { RECLAIM_DONES_MAX } else { 1 };
        let mut chunk = [PartitionEpoch {
            partition: 0,
            epoch: 0,
        }; RECLAIM_DONES_MAX];
        let mut pause = super::super::control::PAUSE_MIN;
        loop {
            let mut refused = false;
            let mut n = 0;
            // The words still owed: each settled one was forgotten (`say_chunk`).
            for &(_, d) in words {
                if self.owed.dones.get(&d.partition) != Some(&(server, d.epoch)) {
                    continue;
                }
                chunk[n] = d;
                n += 1;
                if n == per_message {
                    refused |= self.say_chunk(server, &chunk[..n], batched, reply, deadline)?;
                    n = 0;
                }
            }
            if n > 0 {
                refused |= self.say_chunk(server, &chunk[..n], batched, reply, deadline)?;
            }
            if !refused || Instant::now() >= deadline {
                return Ok(());
            }
            pause = self.pause(pause, deadline);
        }
    }

    /// Says `chunk` to `server` in one message and forgets each word settled; whether any was
    /// refused for a passing reason (`NotReady`, `PartitionMoved`: it stays owed).
    fn say_chunk(
        &mut self,
        server: ServerId,
        chunk: &[PartitionEpoch],
        batched: bool,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<bool> {
        let mut statuses = [Status::Success; RECLAIM_DONES_MAX];
        let statuses = if batched {
            self.send_dones(server, chunk, reply, &mut statuses, deadline)?
        } else {
            statuses[0] = self.send_done(server, chunk[0], reply, deadline)?;
            &statuses[..1]
        };
        let mut refused = false;
        for (d, &status) in chunk.iter().zip(statuses) {
            match status {
                s if refusal_is_transient(s) => refused = true,
                Status::Success => {
                    self.owed.dones.remove(&d.partition);
                }
                other => {
                    tracing::debug!(partition = d.partition, status = ?other, "dlock: ReclaimDone not taken");
                    self.owed.dones.remove(&d.partition);
                }
            }
        }
        Ok(refused)
    }

    /// One `ReclaimDones` message of `chunk` to `server`; the status of each partition (all
    /// the message's status where it was refused whole), written into `statuses`.
    fn send_dones<'s>(
        &mut self,
        server: ServerId,
        chunk: &[PartitionEpoch],
        reply: &mut [u8],
        statuses: &'s mut [Status; RECLAIM_DONES_MAX],
        deadline: Instant,
    ) -> io::Result<&'s [Status]> {
        let body = ControlRequest::ReclaimDones(Batch::from_slice(chunk));
        let m = self.control_with(server, body, reply, deadline)?;
        let frame = decode_control_response(&reply[..m])
            .map_err(|_| garbage("a ReclaimDones reply is malformed"))?;
        let statuses = &mut statuses[..chunk.len()];
        match (frame.header.status(), frame.body) {
            (Some(Status::Success), ControlResponse::PartitionStatuses(s))
                if s.len() == chunk.len()
                    && s.iter().zip(chunk).all(|(s, d)| s.partition == d.partition) =>
            {
                for (out, s) in statuses.iter_mut().zip(s.iter()) {
                    *out = s.status;
                }
            }
            (Some(Status::Success), _) => {
                return Err(garbage("a ReclaimDones reply answers other partitions"));
            }
            // Refused whole: every partition as if refused alone.
            (status, _) => statuses.fill(status.unwrap_or(Status::BadResponse)),
        }
        Ok(statuses)
    }

    /// One `ReclaimDone` of `done` to `server` (protocol 5); its status (`BadResponse` for a
    /// reply that does not decode).
    fn send_done(
        &mut self,
        server: ServerId,
        done: PartitionEpoch,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<Status> {
        let body = ControlRequest::ReclaimDone {
            partition: done.partition,
            epoch: done.epoch,
        };
        let m = self.control_with(server, body, reply, deadline)?;
        Ok(decode_control_response(&reply[..m])
            .ok()
            .and_then(|f| f.header.status())
            .unwrap_or(Status::BadResponse))
    }
}
