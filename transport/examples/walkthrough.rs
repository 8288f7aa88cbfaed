//! A walk through the dlock server state machine, end to end through the wire format: two
//! clients register, take each kind of lock, contend, queue on a fair lock, take 31 row-group
//! locks all-or-nothing, allocate transaction ids, and one of them dies holding a lock.
//!
//! Run: `cargo run -p dlock-transport --example walkthrough`

use dlock_core::proto::{
    Command, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse, DATA_MESSAGE_MAX,
    DataHeader, FLAG_ALL_OR_NOTHING, LockCommand, LockOp, ObjectCommand, ObjectOp, PROTO_VERSION,
    decode_control_response, decode_data_response, encode_control_request, encode_data_request,
};
use dlock_core::server::Server;
use dlock_core::table::Layout;
use dlock_core::{Config, FencingToken, LockKind, Ticket};
use dlock_transport::Region;

/// A client's view of the wire: it encodes requests and decodes replies, like a transport would.
struct Wire<'s, 'r> {
    server: &'s mut Server<'r>,
    message_id: u16,
    now_ms: u64,
}

impl Wire<'_, '_> {
    fn control(&mut self, client: u32, body: ControlRequest<'_>) -> (dlock_core::Status, Vec<u8>) {
        self.message_id = self.message_id.wrapping_add(1);
        let header = ControlHeader {
            version: PROTO_VERSION,
            msg: body.msg_type(),
            message_id: self.message_id,
            word: client,
        };
        let mut req = vec![0; dlock_core::proto::CONTROL_FRAME_MAX];
        let n = encode_control_request(&ControlRequestFrame { header, body }, &mut req)
            .expect("encode");
        let mut out = vec![0; dlock_core::proto::CONTROL_FRAME_MAX];
        let m = self
            .server
            .handle_control(&req[..n], &mut out, self.now_ms)
            .expect("well-formed");
        out.truncate(m);
        let reply = decode_control_response(&out).expect("server replies are well-formed");
        assert_eq!(
            reply.header.message_id, self.message_id,
            "message ids are echoed"
        );
        (reply.header.status().expect("known status"), out)
    }

    fn data(
        &mut self,
        client: u32,
        flags: u32,
        commands: &[Command],
    ) -> Vec<dlock_core::proto::DataResult> {
        self.message_id = self.message_id.wrapping_add(1);
        let header = DataHeader {
            version: PROTO_VERSION,
            count: 0,
            message_id: self.message_id,
            client,
            flags,
        };
        let mut req = [0; DATA_MESSAGE_MAX];
        let n = encode_data_request(&header, commands, &mut req).expect("encode");
        let mut out = [0; DATA_MESSAGE_MAX];
        let m = self
            .server
            .handle_data(&req[..n], &mut out, self.now_ms)
            .expect("well-formed");
        decode_data_response(&out[..m])
            .expect("well-formed reply")
            .results()
            .collect()
    }

    fn register(&mut self) -> u32 {
        let (status, bytes) = self.control(
            0,
            ControlRequest::ClientInit {
                min_version: PROTO_VERSION,
                lease_ms: 3_000,
            },
        );
        match decode_control_response(&bytes).unwrap().body {
            ControlResponse::Init(init) => {
                println!(
                    "  client_init -> {status}: id {} (protocol v{}, lease {} ms)",
                    init.client, init.version, init.lease_ms
                );
                init.client
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }

    fn get_lock(&mut self, client: u32, kind: LockKind, name: &str) -> u32 {
        let (status, bytes) = self.control(
            client,
            ControlRequest::GetLock {
                kind,
                name: name.as_bytes(),
            },
        );
        let ControlResponse::Lock { lock } = decode_control_response(&bytes).unwrap().body else {
            panic!("get_lock {name}: {status}")
        };
        lock
    }
}

fn lock(kind: LockKind, op: LockOp, lock: u32, expire_ms: u32, ticket: Ticket) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock,
        expire_ms,
        ticket,
        wait_ms: 0,
        partition_epoch: 0,
    })
}

fn main() {
    let cfg = Config::default();
    let layout = Layout::new(&cfg);
    println!(
        "region at the reference's capacities ({} locks, {} clients, {} objects):",
        cfg.locks_max, cfg.clients_max, cfg.objects_max
    );
    for (name, part) in layout.parts() {
        println!("  {name:<18} {:>12} bytes", part.len);
    }
    println!(
        "  {:<18} {:>12} bytes ({:.1} MiB of address space; pages are touched on use)",
        "total",
        layout.total,
        layout.total as f64 / (1 << 20) as f64
    );

    let mut region = Region::anonymous(&cfg).expect("map the region");
    let mut server = Server::new(
        region.tables().expect("carve the tables"),
        &cfg,
        dlock_transport::runtime::os_entropy,
    );
    let mut w = Wire {
        server: &mut server,
        message_id: 0,
        now_ms: 1,
    };

    println!("\nregistration (random 31-bit ids, version negotiated):");
    let a = w.register();
    let b = w.register();

    println!(
        "\nan atomic lock with expiry: a takes it, b is refused, b takes it after it expires:"
    );
    let (la, lb) = (
        w.get_lock(a, LockKind::Atomic, "table-7:checkpoint"),
        w.get_lock(b, LockKind::Atomic, "table-7:checkpoint"),
    );
    let r = w.data(
        a,
        0,
        &[lock(
            LockKind::Atomic,
            LockOp::TryExclusive,
            la,
            500,
            Ticket::default(),
        )],
    );
    println!(
        "  a trylock(500 ms)   -> {} token {:#x}",
        r[0].result.status, r[0].result.aux
    );
    let r = w.data(
        b,
        0,
        &[lock(
            LockKind::Atomic,
            LockOp::TryExclusive,
            lb,
            500,
            Ticket::default(),
        )],
    );
    println!("  b trylock           -> {}", r[0].result.status);
    w.now_ms += 501;
    let r = w.data(
        b,
        0,
        &[lock(
            LockKind::Atomic,
            LockOp::TryExclusive,
            lb,
            500,
            Ticket::default(),
        )],
    );
    let token = FencingToken(r[0].result.aux);
    println!(
        "  b trylock at +501ms -> {} token {:#x} (epoch {}, larger than a's)",
        r[0].result.status,
        token.0,
        token.standalone_epoch()
    );
    let r = w.data(
        a,
        0,
        &[lock(
            LockKind::Atomic,
            LockOp::UnlockExclusive,
            la,
            0,
            Ticket::default(),
        )],
    );
    println!(
        "  a unlock (stale)    -> {} (a lost the lock when it expired)",
        r[0].result.status
    );

    println!("\na fair lock queues in ticket order:");
    let (fa, fb) = (
        w.get_lock(a, LockKind::Fair, "log-tail"),
        w.get_lock(b, LockKind::Fair, "log-tail"),
    );
    let ra = w.data(
        a,
        0,
        &[lock(
            LockKind::Fair,
            LockOp::TryExclusive,
            fa,
            5_000,
            Ticket::default(),
        )],
    );
    let ticket_a = dlock_core::word::fair::FairWord::from_bits(ra[0].result.word);
    let ticket_a = Ticket {
        exclusive: ticket_a.mx(),
        shared: ticket_a.ms(),
    };
    println!("  a trylock           -> {}", ra[0].result.status);
    let rb = w.data(
        b,
        0,
        &[lock(
            LockKind::Fair,
            LockOp::TryExclusive,
            fb,
            5_000,
            Ticket::default(),
        )],
    );
    let ticket_b = Ticket {
        exclusive: rb[0].result.aux as u16,
        shared: (rb[0].result.aux >> 16) as u16,
    };
    println!(
        "  b trylock           -> {} with ticket {:?}",
        rb[0].result.status, ticket_b
    );
    let r = w.data(
        a,
        0,
        &[lock(
            LockKind::Fair,
            LockOp::UnlockExclusive,
            fa,
            0,
            ticket_a,
        )],
    );
    println!("  a unlock            -> {}", r[0].result.status);
    let r = w.data(
        b,
        0,
        &[lock(
            LockKind::Fair,
            LockOp::TicketExclusive,
            fb,
            5_000,
            ticket_b,
        )],
    );
    println!("  b retry with ticket -> {}", r[0].result.status);

    println!("\n31 row-group locks in one message, all or nothing:");
    let names: Vec<String> = (0..31).map(|i| format!("orders:rg{i}")).collect();
    let ids_a: Vec<u32> = names
        .iter()
        .map(|n| w.get_lock(a, LockKind::Rw, n))
        .collect();
    let ids_b: Vec<u32> = names
        .iter()
        .map(|n| w.get_lock(b, LockKind::Rw, n))
        .collect();
    let take = |ids: &[u32]| -> Vec<Command> {
        ids.iter()
            .map(|&l| lock(LockKind::Rw, LockOp::TryExclusive, l, 0, Ticket::default()))
            .collect()
    };
    let r = w.data(b, 0, &take(&ids_b[17..18]));
    println!("  b takes rg17        -> {}", r[0].result.status);
    let r = w.data(a, FLAG_ALL_OR_NOTHING, &take(&ids_a));
    let refused = r
        .iter()
        .filter(|r| r.result.status == dlock_core::Status::Fail)
        .count();
    println!(
        "  a takes rg0..rg30   -> {refused} refused (rg17), the other 30 undone: {}",
        r[0].result.status
    );
    let r = w.data(a, 0, &take(&ids_a));
    println!(
        "  a per item          -> {} of 31 granted",
        r.iter()
            .filter(|r| r.result.status == dlock_core::Status::Success)
            .count()
    );

    println!("\ntransaction ids from a umo_atomic64 object:");
    let (status, bytes) = w.control(
        a,
        ControlRequest::ObjectCreate {
            name: b"global-xid",
            init: 1_000,
            lease_s: 60,
        },
    );
    let ControlResponse::Object { object } = decode_control_response(&bytes).unwrap().body else {
        panic!("{status}")
    };
    let (status, _) = w.control(
        a,
        ControlRequest::ObjectGet {
            name: b"global-xid",
            lease_s: 60,
        },
    );
    assert!(status.is_success(), "object_get: {status}");
    let faa = Command::Object(ObjectCommand {
        op: ObjectOp::Faa,
        object,
        a: 1_000,
        b: 0,
        partition_epoch: 0,
    });
    let r = w.data(a, 0, &[faa, faa, faa]);
    let blocks: Vec<u64> = r.iter().map(|r| r.result.aux).collect();
    println!("  3 × FAA(1000)       -> blocks starting at {blocks:?}");

    println!("\nb falls silent while holding rg17; its lease runs out:");
    w.now_ms += 3_001;
    let (status, _) = w.control(a, ControlRequest::Heartbeat);
    assert!(status.is_success(), "heartbeat: {status}");
    let died = w.server.tick(w.now_ms);
    println!("  tick                -> {died} client declared dead, its locks released");
    let r = w.data(a, 0, &take(&ids_a[17..18]));
    println!("  a takes rg17        -> {}", r[0].result.status);
    let (status, bytes) = w.control(a, ControlRequest::Stats);
    if let ControlResponse::Counters(c) = decode_control_response(&bytes).unwrap().body {
        let names = dlock_core::server::Counter::ALL.map(|c| c.name());
        let shown: Vec<String> = names
            .iter()
            .zip(c.iter())
            .filter(|(_, v)| *v > 0)
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        println!("\nserver counters ({status}): {}", shown.join(" "));
    }
}
