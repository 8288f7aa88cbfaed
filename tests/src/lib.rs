//! What the cross-crate tests in `tests/tests/` share: a server over a fresh region, and short
//! constructors for commands.

use dlock_core::proto::{Command, CommandResult, LockCommand, LockOp, ObjectCommand, ObjectOp};
use dlock_core::server::{Server, predictable_entropy};
use dlock_core::{ClientId, Config, LockId, LockKind, ObjectId, Status, Ticket};
use dlock_transport::Region;

pub mod counting;

/// Cases per property test of hostile input: `DLOCK_FUZZ_CASES` if set (a long campaign, e.g.
/// `DLOCK_FUZZ_CASES=1000000`), else `default`, so the normal suite stays fast. A value that is
/// not a number stops the run rather than silently running the short suite.
pub fn fuzz_cases(default: u32) -> u32 {
    match std::env::var("DLOCK_FUZZ_CASES") {
        Ok(v) => v.parse().expect("DLOCK_FUZZ_CASES is a case count"),
        Err(_) => default,
    }
}

/// A fresh region for `cfg` (the caller keeps it alive while the server borrows it).
pub fn region(cfg: &Config) -> Region {
    Region::anonymous(cfg).expect("map region")
}

/// A server over `region`.
pub fn server(region: &mut Region) -> Server<'_> {
    let cfg = *region.config();
    Server::new(
        region.tables().expect("carve tables"),
        &cfg,
        predictable_entropy,
    )
}

/// A lock command without a ticket.
pub fn lock_cmd(kind: LockKind, op: LockOp, id: LockId, expire_ms: u32) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms,
        ticket: Ticket::default(),
        wait_ms: 0,
        partition_epoch: 0,
        flags: dlock_core::proto::LockFlags::NONE,
    })
}

/// An object command.
pub fn object_cmd(op: ObjectOp, id: ObjectId, a: u64, b: u64) -> Command {
    Command::Object(ObjectCommand {
        op,
        object: id.raw(),
        a,
        b,
        partition_epoch: 0,
    })
}

/// A blank result slot.
pub const BLANK: CommandResult = CommandResult {
    status: Status::Success,
    word: 0,
    aux: 0,
    plain: false,
};

/// Executes one command for `client` and returns its result; the server's tables must still
/// agree with one another afterwards (`Server::check_invariants`).
pub fn run(s: &mut Server<'_>, client: ClientId, cmd: Command, now_ms: u64) -> CommandResult {
    let mut r = [BLANK];
    s.execute_message(client.get(), 0, &[cmd], &mut r, now_ms)
        .expect("one command is a valid message");
    if let Err(v) = s.check_invariants() {
        panic!("after {cmd:?} of client {client:?}: {v}");
    }
    r[0]
}

/// The fair-lock ticket a grant or queue reply carries (the reply word's `mx`/`ms`).
pub fn ticket_of(r: &CommandResult) -> Ticket {
    let w = dlock_core::word::fair::FairWord::from_bits(r.word);
    Ticket {
        exclusive: w.mx(),
        shared: w.ms(),
    }
}

/// A lock command carrying a fair-lock ticket.
pub fn ticket_cmd(
    kind: LockKind,
    op: LockOp,
    id: LockId,
    expire_ms: u32,
    ticket: Ticket,
) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms,
        ticket,
        wait_ms: 0,
        partition_epoch: 0,
        flags: dlock_core::proto::LockFlags::NONE,
    })
}

pub mod sim;
