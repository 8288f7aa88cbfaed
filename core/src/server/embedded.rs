//! The in-process entry with lock value blocks: [`Server::execute_message_with_values`].
//!
//! [`Server::execute_message`] is the typed entry an embedding caller (a simulator, a
//! benchmark, an engine calling the state machine directly) uses instead of encoded bytes; it
//! carries no value blocks. This is the same entry with the two value trailers as slices: the
//! blocks the request's exclusive unlocks write, and the blocks its grants return. It applies
//! the bytes decoder's rules (`proto::value`): a block is given exactly for the commands that
//! write one (an exclusive unlock flagged [`LockFlags::VALUE_BLOCK`](crate::proto::LockFlags::VALUE_BLOCK)), or the message is
//! refused with `Einval` and nothing runs.

use super::Server;
use super::data::names_partition_epoch;
use super::waiters::{Disposition, MessageMeta};
use crate::ids::GrantProof;
use crate::manager::value::{ValueBlock, ValueRead};
use crate::proto::{Command, CommandResult, PROTO_VERSION, REQUEST_FLAGS_KNOWN};
use crate::status::Status;

/// The value trailers of one in-process message.
#[derive(Debug)]
pub struct MessageValues<'a> {
    /// The block command `i` writes: empty when no command writes one, otherwise one entry per
    /// command, `Some` exactly for the exclusive unlocks flagged [`LockFlags::VALUE_BLOCK`](crate::proto::LockFlags::VALUE_BLOCK).
    pub blocks: &'a [Option<ValueBlock>],
    /// Receives, for command `i`, the lock's block when the command asked for it and was
    /// granted (`None` otherwise): at least one entry per command.
    pub read: &'a mut [Option<ValueRead>],
}

/// Whether `c` writes a block from the request's value trailer.
#[inline]
fn writes(c: &Command) -> bool {
    matches!(c, Command::Lock(l) if l.flags.writes_value(l.op as u8))
}

impl<'r> Server<'r> {
    /// [`Self::execute_message`] with lock value blocks (module doc). `Err(Einval)`, nothing
    /// executed, also when `values.blocks` does not give a block exactly to the commands that
    /// write one or `values.read` is shorter than `commands` (and for unknown `flags`, as there). A parked request's value comes
    /// with its late reply ([`super::WaitReply::value`]).
    pub fn execute_message_with_values(
        &mut self,
        raw_client: u32,
        flags: u32,
        commands: &[Command],
        results: &mut [CommandResult],
        values: MessageValues<'_>,
        now_ms: u64,
    ) -> Result<Disposition, Status> {
        let MessageValues { blocks, read } = values;
        let blocks_fit = match blocks.len() {
            0 => !commands.iter().any(writes),
            n => {
                n == commands.len()
                    && commands
                        .iter()
                        .zip(blocks)
                        .all(|(c, b)| writes(c) == b.is_some())
            }
        };
        if results.len() < commands.len()
            || flags & !REQUEST_FLAGS_KNOWN != 0
            || read.len() < commands.len()
            || !blocks_fit
            || names_partition_epoch(commands)
        {
            return Err(self.refuse(Status::Einval));
        }
        let meta = MessageMeta {
            version: PROTO_VERSION,
            message_id: 0,
            flags,
        };
        let found = self.client_slot(raw_client);
        self.execute_with(
            (raw_client, found),
            meta,
            commands.len(),
            (|i| commands[i], |i| blocks.get(i).copied().flatten()),
            &mut |i: usize, r: &CommandResult, _proof: &GrantProof, value: Option<&ValueRead>| {
                results[i] = *r;
                read[i] = value.copied();
            },
            now_ms,
        )
    }
}
