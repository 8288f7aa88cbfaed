//! The server runtime's [`Membership`] over a running agent: what a cluster server
//! (`dlock_transport::runtime::ServerConfig::cluster`) polls, answered from the agent's
//! published state or by requests to its thread.

use std::sync::Arc;

use dlock_core::cluster::{Map, ServerId, Timing};
use dlock_transport::runtime::membership::{Marks, Membership, MembershipStatus, Reply, Standing};

use crate::handle::{AgentHandle, Pending};

/// A [`Membership`] backed by the etcd agent.
#[derive(Clone, Debug)]
pub struct AgentMembership(AgentHandle);

impl AgentMembership {
    /// The membership of the agent behind `handle`.
    pub fn new(handle: AgentHandle) -> AgentMembership {
        AgentMembership(handle)
    }

    /// The agent's handle (status, drain).
    pub fn handle(&self) -> &AgentHandle {
        &self.0
    }
}

/// A pending agent answer as a polled [`Reply`].
fn reply<T: Send + 'static>(p: Pending<T>) -> Reply<T> {
    Reply::new(move || p.try_take().map(|r| r.map_err(|e| e.to_string())))
}

impl Membership for AgentMembership {
    fn server_id(&self) -> ServerId {
        self.0.server_id()
    }

    fn timing(&self) -> Timing {
        self.0.standing().timing
    }

    fn map_version(&self) -> Option<u64> {
        self.0.map_version()
    }

    fn map(&self) -> Option<Arc<Map>> {
        self.0.map()
    }

    fn standing(&self) -> Standing {
        let s = self.0.standing();
        Standing {
            incarnation: s.incarnation,
            authority_until: s.authority_until(),
            map_version: s.map_version,
        }
    }

    fn persisted_clients(&self, server: ServerId, incarnation: u64) -> Reply<Vec<u32>> {
        reply(self.0.persisted_clients(server, incarnation))
    }

    fn persist_clients(&self, ids: &[u32]) -> Reply<()> {
        reply(self.0.persist_clients(ids))
    }

    fn marks(&self, partition: u16) -> Reply<Marks> {
        reply(self.0.marks(partition))
    }

    fn reserve(&self, partition: u16, name: &[u8], mark: u64, map_version: u64) -> Reply<u64> {
        reply(self.0.reserve(partition, name, mark, map_version))
    }

    fn request_renewal(&self, partition: u16, epoch: u32) {
        self.0.request_renewal(partition, epoch);
    }

    fn drain(&self) {
        self.0.drain();
    }

    fn status(&self) -> MembershipStatus {
        let s = self.0.status();
        MembershipStatus {
            coordinator: s.coordinator,
            draining: s.draining,
            unreachable_since: s.etcd_unreachable_since,
            confirmed_sent: self.0.standing().confirmed_sent,
        }
    }
}
