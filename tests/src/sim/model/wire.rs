//! What crosses the network between the model clients and the server: requests served
//! through the [`Endpoint`](crate::sim::endpoint::Endpoint), replies delivered, links that
//! break.

use dlock_core::Status;
use dlock_core::manager::retain::Role;
use dlock_core::server::Server;

use super::World;
use super::client::Phase;
use crate::sim::endpoint::{Controlled, Decided, Served, reply_to};
use crate::sim::net::{Channel, Dir, LinkId, Message};
use crate::sim::swarm::ReplyFate;

impl World<'_> {
    /// Sends `bytes` from client `i` to the server on `channel` of its link, opening a link
    /// if it has none (it registers, or re-registers after its last one broke). On a link
    /// that broke and that the client has not noticed yet, the message is lost with it.
    pub(super) fn send_to_server(&mut self, i: usize, channel: Channel, bytes: Vec<u8>) {
        let link = match self.clients[i].link {
            Some(l) => l,
            None => {
                let l = self.net.open(i);
                self.clients[i].link = Some(l);
                l
            }
        };
        let now = self.now;
        let _ = self.net.send(
            link,
            channel,
            Dir::ToServer,
            bytes,
            now,
            &mut self.rng,
            &self.plan,
            &mut self.faults,
        );
    }

    /// Client `i` gives up on its link (a request timed out): both ends notice.
    pub(super) fn close_link(&mut self, i: usize) {
        if let Some(link) = self.clients[i].link {
            self.net.break_link(link);
        }
    }

    /// Sends reply `bytes` on `link` as the seed's compound faults decide.
    pub(super) fn send_reply(
        &mut self,
        link: LinkId,
        channel: Channel,
        bytes: Vec<u8>,
        fate: ReplyFate,
    ) {
        let now = self.now;
        match fate {
            ReplyFate::Normal => {
                let _ = self.net.send(
                    link,
                    channel,
                    Dir::ToClient,
                    bytes,
                    now,
                    &mut self.rng,
                    &self.plan,
                    &mut self.faults,
                );
            }
            ReplyFate::HeldThenCrash {
                delay_ms,
                crash_in_ms,
            } => {
                self.net
                    .send_after(link, channel, Dir::ToClient, bytes, now + delay_ms);
                let at = now + crash_in_ms;
                self.crash_at = Some(self.crash_at.map_or(at, |c| c.min(at)));
            }
            ReplyFate::LostThenCrash { crash_in_ms } => {
                self.net.break_link(link);
                let at = now + crash_in_ms;
                self.crash_at = Some(self.crash_at.map_or(at, |c| c.min(at)));
            }
            ReplyFate::Lost { lapse } => {
                self.net.break_link(link);
                if lapse {
                    let i = self.net.owner(link);
                    self.pause(i, true);
                }
            }
        }
    }

    /// Delivers message `m` to the server or to its client.
    pub(super) fn deliver(&mut self, srv: &mut Server<'_>, m: Message) -> Result<(), String> {
        let i = self.net.owner(m.link);
        if m.dir == Dir::ToServer {
            return self.serve_request(srv, i, m);
        }
        let c = &self.clients[i];
        if c.phase == Phase::Dead || c.link != Some(m.link) {
            return Ok(());
        }
        if c.paused_until > self.now {
            // A paused process reads its socket when it runs again.
            let until = c.paused_until;
            self.net.hold(m, until);
            return Ok(());
        }
        self.on_reply(srv, i, m.channel, &m.bytes)
    }

    /// The server handles one request from client `i` and its reply is sent.
    fn serve_request(&mut self, srv: &mut Server<'_>, i: usize, m: Message) -> Result<(), String> {
        let now = self.server_now();
        if let Some(d) = &mut self.dead[i] {
            d.1 = now;
        }
        if self.oracle.trace {
            eprintln!("tick {now}: serve {:?} from sim client {i}", m.channel);
        }
        match m.channel {
            Channel::Control => {
                let (controlled, replaced) =
                    self.endpoint
                        .control(srv, &mut self.oracle, m.link, &m.bytes, now, role(i))?;
                for link in replaced {
                    self.net.break_link(link);
                }
                let Controlled::Reply(reply, status) = controlled else {
                    self.net.break_link(m.link);
                    return Ok(());
                };
                if self.oracle.trace {
                    let req = dlock_core::proto::peek_control_header(&m.bytes).map(|(h, _)| h);
                    eprintln!("  control {req:?} -> {status:?}");
                }
                if matches!(
                    status,
                    Some(Status::ServerNoResource | Status::ObjectTooMany)
                ) {
                    self.faults.tables_full += 1;
                }
                let to = reply_to(Channel::Control, &m.bytes, &reply);
                let fate = self.plan.reply_fate(to, &mut self.rng, &mut self.faults);
                self.send_reply(m.link, Channel::Control, reply, fate);
            }
            Channel::Data => {
                match self
                    .endpoint
                    .data(srv, &mut self.oracle, m.link, &m.bytes, now)?
                {
                    Served::Reply(reply) => {
                        let to = reply_to(Channel::Data, &m.bytes, &reply);
                        let fate = self.plan.reply_fate(to, &mut self.rng, &mut self.faults);
                        self.send_reply(m.link, Channel::Data, reply, fate);
                    }
                    Served::Parked => {}
                    Served::Close => self.net.break_link(m.link),
                }
            }
        }
        let decided = self.endpoint.decided(srv, &mut self.oracle, now)?;
        self.send_decided(decided);
        Ok(())
    }

    /// Sends the replies of parked requests the server decided.
    pub(super) fn send_decided(&mut self, decided: Vec<Decided>) {
        let now = self.server_now();
        for d in decided {
            let Some(&i) = self.by_id.get(&d.client) else {
                continue;
            };
            if let Some(dead) = &mut self.dead[i]
                && dead.0 == d.client
            {
                // The server heard of it: its request was decided now.
                dead.1 = now;
            }
            if let Some(link) = d.link {
                self.send_reply(link, Channel::Data, d.bytes, ReplyFate::Normal);
            }
        }
    }

    /// Both ends notice the links that broke: the server cancels what was parked over them and
    /// marks their clients abnormal; a client whose link it was drops what it waited for and
    /// re-registers later.
    pub(super) fn links_broken(&mut self, srv: &mut Server<'_>) -> Result<(), String> {
        loop {
            let broken = self.net.take_broken();
            if broken.is_empty() {
                return Ok(());
            }
            let now = self.server_now();
            for link in broken {
                self.endpoint.link_lost(srv, link, now);
                let decided = self.endpoint.decided(srv, &mut self.oracle, now)?;
                self.send_decided(decided);
                let i = self.net.owner(link);
                let c = &mut self.clients[i];
                if c.phase == Phase::Dead || c.link != Some(link) {
                    continue;
                }
                self.faults.connections_reset += 1;
                // Revokes on the way to it are lost with the link.
                c.revoke_all_cached();
                c.link = None;
                c.connected = false;
                c.pending = None;
                c.heartbeat = None;
                c.notice_at = self.now;
                match c.phase {
                    Phase::Initing => c.phase = Phase::Idle,
                    // The deinit may or may not have arrived; if not, the lease removes the
                    // client.
                    Phase::Deiniting => c.forget_all(),
                    _ => {}
                }
            }
        }
    }
}

/// The role the server's configuration gives sim client `i`: the first is a recoverer
/// (`--recoverer`), which may call `recovery_done`; the others may not.
pub(super) fn role(i: usize) -> Role {
    match i {
        0 => Role::Recoverer,
        _ => Role::Client,
    }
}
