//! The cluster's keys in etcd and the records stored under them.
//!
//! | key                                   | value                                   | bound to         | written by            |
//! |---------------------------------------|-----------------------------------------|------------------|-----------------------|
//! | `/dlock/<c>/meta`                     | creation record: `partitions=P`         | nothing          | the first server, once (create-if-absent) |
//! | `/dlock/<c>/servers/<id>`             | member record: state, address, renewals | the server's lease | that server          |
//! | `/dlock/<c>/election/…`               | etcd's election keys (value: server id) | the campaigner's lease | etcd's election API |
//! | `/dlock/<c>/map`                      | the map's wire encoding (`dlock_core`)  | nothing          | the coordinator, by compare-and-swap |
//! | `/dlock/<c>/hwm/<p>/<name in hex>`    | a counter's high-water mark (decimal)   | nothing          | the partition's owner, by compare-and-swap |
//! | `/dlock/<c>/key`                      | the cluster's session key (64 hex digits), when no server was given one | nothing | the first server that asks, once (create-if-absent) |
//! | `/dlock/<c>/clients/<id>/<lease hex>` | the client ids registered with that incarnation (decimal, comma-separated) | nothing: a successor reads it after the lease is gone | that server, rewritten on change |
//!
//! Text records (`key=value` lines) for what people read with `etcdctl`, the binary encoding
//! for the map, which clients also fetch through the servers.

use dlock_core::cluster::{Partitions, ServerId};

/// The keys of one cluster.
#[derive(Clone, Debug)]
pub struct Keys {
    root: String,
}

impl Keys {
    /// The keys of cluster `cluster`.
    pub fn new(cluster: &str) -> Keys {
        Keys {
            root: format!("/dlock/{cluster}"),
        }
    }

    /// The creation record.
    pub fn meta(&self) -> String {
        format!("{}/meta", self.root)
    }

    /// The prefix of every member key.
    pub fn servers(&self) -> String {
        format!("{}/servers/", self.root)
    }

    /// Server `id`'s member key.
    pub fn server(&self, id: ServerId) -> String {
        format!("{}/servers/{}", self.root, id.get())
    }

    /// The election's name.
    pub fn election(&self) -> String {
        format!("{}/election", self.root)
    }

    /// The map.
    pub fn map(&self) -> String {
        format!("{}/map", self.root)
    }

    /// The prefix of partition `p`'s high-water marks.
    pub fn marks(&self, p: u16) -> String {
        format!("{}/hwm/{p}/", self.root)
    }

    /// The cluster's session key (when the servers keep it in etcd).
    pub fn session_key(&self) -> String {
        format!("{}/key", self.root)
    }

    /// The client ids server `id` persisted in registration `incarnation`.
    pub fn clients(&self, id: ServerId, incarnation: u64) -> String {
        format!("{}/clients/{}/{incarnation:x}", self.root, id.get())
    }

    /// The high-water mark of counter `name` in partition `p`.
    pub fn mark(&self, p: u16, name: &[u8]) -> String {
        let mut k = self.marks(p);
        for b in name {
            k.push_str(&format!("{b:02x}"));
        }
        k
    }
}

/// Decodes the name part of a mark key (hex), `None` if it is not ours.
pub fn mark_name(key: &[u8], prefix: &str) -> Option<Vec<u8>> {
    let hex = key.strip_prefix(prefix.as_bytes())?;
    if hex.len() % 2 != 0 {
        return None;
    }
    hex.chunks(2)
        .map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
        .collect()
}

/// A member's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Takes partitions.
    Serving,
    /// Asked to have its partitions moved away (`dlock drain`).
    Draining,
}

/// What a server publishes under its member key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRecord {
    /// Serving or draining.
    pub state: MemberState,
    /// Where clients reach it.
    pub address: String,
    /// Partitions whose token counter runs out, each with the epoch it runs out at: the
    /// coordinator renews a partition only while the map still has it at that epoch.
    pub renewals: Vec<(u16, u32)>,
}

impl MemberRecord {
    /// The record's text.
    pub fn encode(&self) -> String {
        let state = match self.state {
            MemberState::Serving => "serving",
            MemberState::Draining => "draining",
        };
        let renew: Vec<String> = self
            .renewals
            .iter()
            .map(|(p, e)| format!("{p}@{e}"))
            .collect();
        format!(
            "v=1\nstate={state}\naddress={}\nrenew={}\n",
            self.address,
            renew.join(",")
        )
    }

    /// Reads a record; `None` if it is not one (a member key written by something else is
    /// ignored, not trusted).
    pub fn decode(text: &[u8]) -> Option<MemberRecord> {
        let text = std::str::from_utf8(text).ok()?;
        let mut rec = MemberRecord {
            state: MemberState::Serving,
            address: String::new(),
            renewals: Vec::new(),
        };
        let mut version = false;
        for line in text.lines() {
            let (k, v) = line.split_once('=')?;
            match k {
                "v" => version = v == "1",
                "state" => {
                    rec.state = match v {
                        "serving" => MemberState::Serving,
                        "draining" => MemberState::Draining,
                        _ => return None,
                    }
                }
                "address" => rec.address = v.to_owned(),
                "renew" if v.is_empty() => {}
                "renew" => {
                    for item in v.split(',') {
                        let (p, e) = item.split_once('@')?;
                        rec.renewals.push((p.parse().ok()?, e.parse().ok()?));
                    }
                }
                _ => {}
            }
        }
        (version && !rec.address.is_empty()).then_some(rec)
    }
}

/// The cluster's creation record.
pub fn encode_meta(partitions: Partitions) -> String {
    format!("v=1\npartitions={}\n", partitions.get())
}

/// The partition count of a creation record.
pub fn decode_meta(text: &[u8]) -> Option<Partitions> {
    let text = std::str::from_utf8(text).ok()?;
    let mut partitions = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("partitions=") {
            partitions = Partitions::new(v.parse().ok()?);
        }
    }
    partitions
}

/// The server id in a member key.
pub fn member_id(key: &[u8], prefix: &str) -> Option<ServerId> {
    let id = std::str::from_utf8(key.strip_prefix(prefix.as_bytes())?).ok()?;
    ServerId::new(id.parse().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_records_round_trip_and_junk_is_ignored() {
        let rec = MemberRecord {
            state: MemberState::Draining,
            address: "10.0.0.1:21616".into(),
            renewals: vec![(3, 9), (200, 1)],
        };
        assert_eq!(MemberRecord::decode(rec.encode().as_bytes()), Some(rec));
        assert_eq!(MemberRecord::decode(b"hello"), None);
        assert_eq!(
            MemberRecord::decode(b"v=1\nstate=asleep\naddress=a\n"),
            None
        );
        assert_eq!(
            MemberRecord::decode(b"v=2\naddress=a\n"),
            None,
            "a format we do not know"
        );
    }

    #[test]
    fn keys_name_what_they_hold() {
        let k = Keys::new("prod");
        let id = ServerId::new(7).unwrap();
        assert_eq!(k.server(id), "/dlock/prod/servers/7");
        assert_eq!(member_id(k.server(id).as_bytes(), &k.servers()), Some(id));
        assert_eq!(k.mark(3, b"xid"), "/dlock/prod/hwm/3/786964");
        assert_eq!(
            mark_name(k.mark(3, b"xid").as_bytes(), &k.marks(3)),
            Some(b"xid".to_vec())
        );
        assert_eq!(
            decode_meta(encode_meta(Partitions::DEFAULT).as_bytes()),
            Some(Partitions::DEFAULT)
        );
    }
}
