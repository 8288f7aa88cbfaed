//! The world the real clients run in: the server incarnations, the shared network and the
//! server's end of it, and a clock that moves only when the world steps.

use dlock_core::manager::retain::Role;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use dlock_core::server::{Server, SlotRouting};
use dlock_core::table::Tables;
use dlock_core::{Config, Status};

use crate::sim::endpoint::{Controlled, Decided, Endpoint, Served, reply_to};
use crate::sim::net::{Channel, Dir, LinkId, Message, Net};
use crate::sim::oracle::Oracle;
use crate::sim::swarm::{FaultPlan, Faults, ReplyFate};
use crate::sim::{Rng, sim_session_key};

/// How often the runtime would call `Server::tick` (ms).
const TICK_MS: u64 = 10;

/// What arrived on a link for its client and has not been read.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    pub control: VecDeque<Vec<u8>>,
    pub data: Vec<Vec<u8>>,
}

/// The simulated system but the clients.
pub(super) struct World<'r> {
    pub server: Server<'r>,
    /// The configuration the server runs with (its epoch grows at each replacement).
    cfg: Config,
    /// Tables for the replacement servers still to come (each in a region of its own).
    spare: Vec<Tables<'r>>,
    /// The servers share a session key (see [`start_server`]).
    keyed: bool,
    pub net: Net,
    pub endpoint: Endpoint<'r>,
    pub oracle: Oracle,
    pub inbox: HashMap<LinkId, Inbox>,
    pub now_ms: u64,
    pub base: Instant,
    pub rng: Rng,
    pub plan: FaultPlan,
    pub faults: Faults,
    next_tick: u64,
    /// A compound fault's server crash, due at this tick.
    pub crash_at: Option<u64>,
    /// Server incarnations so far: a client's beliefs count only once it has re-synced with
    /// the current one.
    pub incarnation: u32,
    /// Data messages the server has served.
    pub messages: u64,
    /// The first violation found while the world stepped inside a client's call.
    pub failure: Option<String>,
    /// Processes a compound fault wants stopped past their lease (the scheduler does it).
    pub lapses: Vec<usize>,
    /// Turns refused exclusive trylocks into grants on their way to the client: a broken
    /// server or transport, for the test that proves the oracle sees it.
    pub sabotage: bool,
    /// The generator of data channels breaking alone (the plan's `stream_break_ppm`), apart
    /// from the world's, so a seed without the fault runs as it did.
    pub breaks: Rng,
}

impl std::fmt::Debug for World<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("now_ms", &self.now_ms)
            .finish()
    }
}

/// A server over `tables`; with `keyed`, under the session key every incarnation shares.
pub(super) fn start_server<'r>(tables: Tables<'r>, cfg: &Config, keyed: bool) -> Server<'r> {
    let mut server = Server::new(tables, cfg, crate::sim::rng::sim_entropy);
    if keyed {
        server.set_session_key(sim_session_key(), dlock_transport::runtime::hmac_sha256);
    }
    server
}

impl<'r> World<'r> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        server: Server<'r>,
        cfg: Config,
        spare: Vec<Tables<'r>>,
        keyed: bool,
        oracle: Oracle,
        rng: Rng,
        plan: FaultPlan,
        slots: &'r mut [SlotRouting],
    ) -> Self {
        World {
            server,
            cfg,
            spare,
            keyed,
            net: Net::default(),
            endpoint: Endpoint::new(slots),
            oracle,
            inbox: HashMap::new(),
            now_ms: 0,
            base: Instant::now(),
            rng,
            plan,
            faults: Faults::default(),
            next_tick: 0,
            crash_at: None,
            incarnation: 0,
            messages: 0,
            failure: None,
            lapses: Vec::new(),
            sabotage: false,
            breaks: Rng::new(0),
        }
    }

    /// Records the first violation (a world stepping inside a client's call cannot return it).
    fn fail(&mut self, r: Result<(), String>) {
        if let Err(e) = r
            && self.failure.is_none()
        {
            self.failure = Some(e);
        }
    }

    /// Records violation `e` found by a process (the first one stops the run).
    pub fn fail_with(&mut self, e: String) {
        self.fail(Err(e));
    }

    /// The server dies with everything in flight; a replacement with a larger epoch starts on
    /// the same address, recovering for the clients registered with the old one. False when
    /// no replacement is left to start.
    pub fn crash(&mut self) -> bool {
        self.crash_at = None;
        let Some(tables) = self.spare.pop() else {
            return false;
        };
        let expected = self.server.usage().clients;
        let r = self.endpoint.check(&self.server, &mut self.oracle);
        self.fail(r);
        self.cfg.epoch += 1;
        self.cfg.recovery_clients = expected.min(self.cfg.clients_max);
        self.server = start_server(tables, &self.cfg, self.keyed);
        self.net.clear();
        self.inbox.clear();
        self.endpoint.restart();
        self.oracle.new_incarnation();
        self.incarnation += 1;
        self.faults.server_crashes += 1;
        true
    }

    /// Moves the clock to the next event (at most to `until`, at least one millisecond on when
    /// nothing is due), delivers what is due, and runs the server's timers.
    pub fn step(&mut self, until: u64) {
        let target = match self.net.next_at() {
            Some(at) if at <= self.now_ms => self.now_ms,
            Some(at) => at.min(until).max(self.now_ms + 1),
            None => (self.now_ms + 1).min(until.max(self.now_ms + 1)),
        };
        self.now_ms = target;
        if self.crash_at.is_some_and(|t| self.now_ms >= t) {
            self.crash();
        }
        if self.plan.stream_break_ppm > 0 && self.breaks.chance(self.plan.stream_break_ppm) {
            // A data connection closes while its control connection lives on, maybe under a
            // request parked on the server (this runs inside clients' calls too).
            let link = self.breaks.index(self.net.links().max(1));
            if self.net.break_stream(link) {
                self.links_broken();
            }
        }
        while let Some(m) = self.net.pop_due(self.now_ms) {
            match m.dir {
                Dir::ToServer => {
                    let r = self.serve(m);
                    self.fail(r);
                }
                Dir::ToClient => {
                    let inbox = self.inbox.entry(m.link).or_default();
                    match m.channel {
                        Channel::Control => inbox.control.push_back(m.bytes),
                        Channel::Data => inbox.data.push(m.bytes),
                    }
                }
            }
            self.links_broken();
        }
        let now = self.now_ms;
        let tick = now >= self.next_tick;
        if tick {
            self.next_tick = now + TICK_MS;
        }
        let mut emptied = Vec::new();
        let r = self
            .endpoint
            .timers(&mut self.server, &mut self.oracle, now, tick, &mut emptied)
            .map(|decided| self.send_decided(decided));
        self.fail(r);
        self.send_events();
        // Links whose clients were all removed close, as the runtime closes such connections.
        for link in emptied {
            self.net.break_link(link);
        }
        self.links_broken();
        let r = self.endpoint.check(&self.server, &mut self.oracle);
        self.fail(r);
    }

    /// The server handles one request.
    fn serve(&mut self, m: Message) -> Result<(), String> {
        let now = self.now_ms;
        let (reply, channel) = match m.channel {
            Channel::Control => {
                let (controlled, replaced) = self.endpoint.control(
                    &mut self.server,
                    &mut self.oracle,
                    m.link,
                    &m.bytes,
                    now,
                    Role::Client,
                )?;
                for link in replaced {
                    self.net.break_link(link);
                }
                let Controlled::Reply(reply, status) = controlled else {
                    self.net.break_link(m.link);
                    return Ok(());
                };
                if matches!(
                    status,
                    Some(Status::ServerNoResource | Status::ObjectTooMany)
                ) {
                    self.faults.tables_full += 1;
                }
                (reply, Channel::Control)
            }
            Channel::Data => {
                self.messages += 1;
                match self.endpoint.data(
                    &mut self.server,
                    &mut self.oracle,
                    m.link,
                    &m.bytes,
                    now,
                )? {
                    Served::Reply(reply) => (reply, Channel::Data),
                    Served::Parked => return Ok(()),
                    Served::Close => {
                        self.net.break_link(m.link);
                        return Ok(());
                    }
                }
            }
        };
        let to = reply_to(channel, &m.bytes, &reply);
        let fate = self.plan.reply_fate(to, &mut self.rng, &mut self.faults);
        self.send_reply(m.link, channel, reply, fate);
        let decided = self
            .endpoint
            .decided(&mut self.server, &mut self.oracle, now)?;
        self.send_decided(decided);
        self.send_events();
        Ok(())
    }

    /// Sends the revokes the server wrote into its event rings since the last call, as event
    /// messages on the data channels of their clients, behind what those channels carry
    /// already (call it after every server turn, so the oracle learns each at the tick it was
    /// sent).
    fn send_events(&mut self) {
        let (now, timing) = (self.now_ms, self.cfg.timing);
        self.endpoint
            .drain_events(&mut self.server, &mut self.oracle, now, timing);
        let lost = self.endpoint.events_lost;
        for (link, bytes, revokes) in self.endpoint.events() {
            self.faults.revokes += revokes as u64;
            self.send_reply(link, Channel::Data, bytes, ReplyFate::Normal);
        }
        self.faults.event_messages_lost += self.endpoint.events_lost - lost;
    }

    /// Sends reply `bytes` on `link` as the seed's compound faults decide.
    fn send_reply(&mut self, link: LinkId, channel: Channel, bytes: Vec<u8>, fate: ReplyFate) {
        let now = self.now_ms;
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
                    // A client's call cannot be stopped from inside it: the scheduler stops
                    // the process once the call returns.
                    let owner = self.net.owner(link);
                    self.lapses.push(owner);
                }
            }
        }
    }

    fn send_decided(&mut self, decided: Vec<Decided>) {
        for d in decided {
            if let Some(link) = d.link {
                self.send_reply(link, Channel::Data, d.bytes, ReplyFate::Normal);
            }
        }
    }

    /// The server notices the links that broke (their clients notice on their next read).
    pub fn links_broken(&mut self) {
        for link in self.net.take_broken_streams() {
            self.faults.streams_broken += 1;
            if let Some(inbox) = self.inbox.get_mut(&link) {
                inbox.data.clear();
            }
            self.endpoint
                .stream_lost(&mut self.server, link, self.now_ms);
        }
        for link in self.net.take_broken() {
            self.faults.connections_reset += 1;
            self.inbox.remove(&link);
            self.endpoint.link_lost(&mut self.server, link, self.now_ms);
        }
        let r = self
            .endpoint
            .decided(&mut self.server, &mut self.oracle, self.now_ms)
            .map(|d| self.send_decided(d));
        self.fail(r);
        self.send_events();
    }
}
