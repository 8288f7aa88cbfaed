//! The region: one page-aligned mapping sized exactly for a server's tables.
//!
//! An anonymous mapping is zero-filled by the kernel and its pages are only backed when first
//! touched, so a server with default capacities (118 MiB of address space) costs resident
//! memory in proportion to what it uses. The tables are carved from the fresh mapping without a
//! zeroing pass the first time; if they are carved again (a restarted server in the same
//! region), the region is zeroed first.

use std::io;

use dlock_core::table::Tables;
use dlock_core::{Config, Status};
use memmap2::MmapMut;

/// One server's memory.
#[derive(Debug)]
pub struct Region {
    map: MmapMut,
    cfg: Config,
    /// Whether the mapping may hold non-zero bytes (tables were carved from it before).
    dirty: bool,
}

impl Region {
    /// Maps an anonymous, zeroed region for `cfg`.
    pub fn anonymous(cfg: &Config) -> io::Result<Region> {
        let size = cfg.region_size().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                cfg.invalid_field().unwrap_or("invalid config"),
            )
        })?;
        let map = MmapMut::map_anon(size)?;
        Ok(Region {
            map,
            cfg: *cfg,
            dirty: false,
        })
    }

    /// The region size in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: a region has at least its header page.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The config the region was sized for.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Carves the tables (zeroing the region first if it was used before).
    pub fn tables(&mut self) -> Result<Tables<'_>, Status> {
        if std::mem::replace(&mut self.dirty, true) {
            return Tables::format(&mut self.map, &self.cfg);
        }
        let base = std::ptr::NonNull::new(self.map.as_mut_ptr()).ok_or(Status::Enomem)?;
        // SAFETY: the mapping is page-aligned, `len` bytes long and lives as long as the `&mut
        // self` borrow that bounds the returned tables; it is a fresh anonymous mapping, so all
        // zero (the kernel guarantees it), and this is the first carve (`dirty` was false); the
        // exclusive borrow means nothing else accesses it meanwhile.
        unsafe { Tables::from_zeroed_raw(base, self.map.len(), &self.cfg) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::server::Server;

    #[test]
    fn fresh_and_reused_regions_both_give_empty_tables() {
        let cfg = Config {
            locks_max: 16,
            clients_max: 4,
            objects_max: 8,
            ..Config::default()
        };
        let mut region = Region::anonymous(&cfg).unwrap();
        assert_eq!(region.len(), cfg.region_size().unwrap());
        {
            let mut s = Server::new(region.tables().unwrap(), &cfg);
            let c = s.client_init(2, 0, 0).unwrap();
            s.get_lock(c.get(), dlock_core::LockKind::Rw, b"x", 0)
                .unwrap();
            assert_eq!(s.usage().locks, 1);
        }
        // A second carve zeroes the region: the slot's generation starts over, which it would
        // not if the previous server's metadata were still there.
        let mut s = Server::new(region.tables().unwrap(), &cfg);
        let c = s.client_init(2, 0, 0).unwrap();
        let id = s
            .get_lock(c.get(), dlock_core::LockKind::Rw, b"y", 0)
            .unwrap();
        assert_eq!((id.index(), id.generation()), (0, 1));
    }

    #[test]
    fn invalid_config_is_an_error_not_a_panic() {
        let cfg = Config {
            locks_max: 0,
            ..Config::default()
        };
        assert_eq!(
            Region::anonymous(&cfg).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
