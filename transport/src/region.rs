//! The region: one page-aligned mapping sized exactly for a server's tables.
//!
//! In-process servers use an anonymous mapping; a server that clients in other processes reach
//! over shared memory uses a file under `/dev/shm`, which those clients map too. Either way the
//! kernel hands out zero pages, backed only when first touched, so a server with default
//! capacities (118.4 MiB of address space) costs resident memory in proportion to what it uses.
//! Huge pages are asked for with `madvise` when configured; the kernel may decline, which only
//! costs TLB misses.
//!
//! Who touches what: the server's tables (carved once, by the data thread) own every part but the
//! object cells, the mailboxes, the doorbells and the runtime's words in the header page, which
//! are atomics shared with clients. The views below hand out only those shared parts.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use dlock_core::table::layout::MAILBOX_LANES;
use dlock_core::table::{Layout, Tables, read_header};
use dlock_core::{Config, Status};
use memmap2::{MmapMut, MmapOptions};

use crate::shm::{Mailbox, SHM_HEADER_OFFSET, ShmHeader};
use crate::sync::AtomicU64;

/// One server's memory.
#[derive(Debug)]
pub struct Region {
    map: MmapMut,
    cfg: Config,
    layout: Layout,
    /// Whether the mapping may hold non-zero bytes (tables were carved from it before).
    dirty: bool,
    /// The `/dev/shm` file this region was created as (removed on drop), if any.
    owned_file: Option<PathBuf>,
    /// Mapped from a file another process's server created: never carved here.
    opened: bool,
}

fn invalid(cfg: &Config) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        cfg.invalid_field().unwrap_or("invalid config"),
    )
}

impl Region {
    /// Maps an anonymous, zeroed region for `cfg`.
    pub fn anonymous(cfg: &Config) -> io::Result<Region> {
        let size = cfg.region_size().map_err(|_| invalid(cfg))?;
        let map = MmapMut::map_anon(size)?;
        Ok(Region {
            map,
            cfg: *cfg,
            layout: Layout::new(cfg),
            dirty: false,
            owned_file: None,
            opened: false,
        })
    }

    /// Creates `/dev/shm/<name>` (which must not exist) sized for `cfg` and maps it shared, so
    /// clients in other processes can [`Region::open_shared`] it. The file is removed on drop.
    ///
    /// `mode` is the file's permission bits, set exactly (the umask does not apply): whoever can
    /// map the region can write any client's mailbox and read every session secret, so it is
    /// `0o600` (the server's user only) unless the operator opens it to a group (`0o660`).
    pub fn create_shared(cfg: &Config, name: &str, mode: u32) -> io::Result<Region> {
        let size = cfg.region_size().map_err(|_| invalid(cfg))?;
        let path = shm_path(name)?;
        // Created owner-only, so no other user can open it before the mode below is in force.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.set_len(size as u64)?;
        // SAFETY: the file was just created by us (create_new) and has the exact size; other
        // processes that map it follow the region's protocols (atomics only on shared parts).
        let map = unsafe { MmapOptions::new().len(size).map_mut(&file) }?;
        Ok(Region {
            map,
            cfg: *cfg,
            layout: Layout::new(cfg),
            dirty: false,
            owned_file: Some(path),
            opened: false,
        })
    }

    /// Maps the region a server in another process created as `/dev/shm/<name>`; the capacities
    /// come from its header.
    pub fn open_shared(name: &str) -> io::Result<Region> {
        let path = shm_path(name)?;
        let file: File = OpenOptions::new().read(true).write(true).open(&path)?;
        let len = file.metadata()?.len() as usize;
        // SAFETY: a server's region file: the server writes its tables, we use only the shared
        // atomic parts (mailboxes, doorbells, object cells, runtime words).
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file) }?;
        let h = read_header(&map).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "not a dlock region of this layout version",
            )
        })?;
        let cfg = Config {
            locks_max: h.locks_max,
            clients_max: h.clients_max,
            objects_max: h.objects_max,
            epoch: h.epoch as u16,
            ..Config::default()
        };
        if cfg.region_size().ok() != Some(len) || h.region_size as usize != len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "region size does not match its header",
            ));
        }
        Ok(Region {
            map,
            cfg,
            layout: Layout::new(&cfg),
            dirty: true,
            owned_file: None,
            opened: true,
        })
    }

    /// Asks the kernel for transparent huge pages on the region; returns whether it agreed.
    pub fn advise_huge_pages(&self) -> bool {
        self.map.advise(memmap2::Advice::HugePage).is_ok()
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

    /// Carves the tables (zeroing the region first if it was used before). Refused on a region
    /// mapped with [`Region::open_shared`]: that memory is another process's live server.
    pub fn tables(&mut self) -> Result<Tables<'_>, Status> {
        if self.opened {
            return Err(Status::Einval);
        }
        if std::mem::replace(&mut self.dirty, true) {
            return Tables::format(&mut self.map, &self.cfg);
        }
        // SAFETY: the mapping is page-aligned and `len` bytes long, borrowed mutably for the
        // tables' lifetime; it is fresh (never carved: `dirty` was false), hence all zero.
        unsafe { Tables::from_zeroed_raw(self.base(), self.map.len(), &self.cfg) }
    }

    /// Carves the tables while the shared views stay usable (the runtime's path).
    ///
    /// # Safety
    ///
    /// - The region is fresh (created by `anonymous` or `create_shared`, never carved before).
    /// - No other `Tables` over this region exists during `'a`.
    pub unsafe fn tables_shared(&self) -> Result<Tables<'_>, Status> {
        // SAFETY: the mapping is page-aligned, `len` bytes, zero (fresh, by the caller's
        // contract) and alive for the borrow; the tables are the only user of the parts they
        // carve (the caller's contract), and everything else touches only the atomics the
        // views hand out, which the tables never carve or only share atomically.
        unsafe { Tables::from_zeroed_raw(self.base(), self.map.len(), &self.cfg) }
    }

    fn base(&self) -> NonNull<u8> {
        NonNull::new(self.map.as_ptr().cast_mut()).expect("a mapping is never at address 0")
    }

    /// Typed shared view of a part of atomics.
    fn atomics<T>(&self, offset: usize, len: usize) -> &[T] {
        assert!(offset + len <= self.map.len() && offset.is_multiple_of(std::mem::align_of::<T>()));
        // SAFETY: in bounds and aligned (asserted; parts are 64-byte aligned in a page-aligned
        // mapping); `T` is made only of atomics, valid for any bits; every access through the
        // view is atomic, and the tables never hold a plain reference to these bytes.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().add(offset).cast::<T>(),
                len / std::mem::size_of::<T>(),
            )
        }
    }

    /// The mailboxes, one per client slot.
    pub fn mailboxes(&self) -> &[Mailbox] {
        self.atomics(self.layout.mailboxes.offset, self.layout.mailboxes.len)
    }

    /// Client slot `slot`'s lanes: [`MAILBOX_LANES`] consecutive mailboxes, request `seq` in
    /// lane `seq % MAILBOX_LANES`. `None` for a slot outside the region.
    pub fn client_mailboxes(&self, slot: u32) -> Option<&[Mailbox]> {
        let first = (slot as usize).checked_mul(MAILBOX_LANES)?;
        self.mailboxes().get(first..first + MAILBOX_LANES)
    }

    /// Client slot `slot`'s event ring (`dlock_core::table::events`), which the data thread
    /// writes and the client reads. `None` for a slot outside the region.
    pub fn client_event_ring(&self, slot: u32) -> Option<dlock_core::table::EventRing<'_>> {
        let part = self.layout.event_rings;
        let words = self.atomics::<core::sync::atomic::AtomicU64>(part.offset, part.len);
        dlock_core::table::EventRings::new(words).ring(slot)
    }

    /// The doorbell words.
    pub fn doorbell_words(&self) -> &[AtomicU64] {
        self.atomics(self.layout.doorbells.offset, self.layout.doorbells.len)
    }

    /// The object cells (for one-sided access by shared-memory clients).
    pub fn object_cells(&self) -> &[AtomicU64] {
        self.atomics(
            self.layout.object_cells.offset,
            self.layout.object_cells.len,
        )
    }

    /// The runtime's words in the header page.
    pub fn shm_header(&self) -> &ShmHeader {
        &self.atomics::<ShmHeader>(SHM_HEADER_OFFSET, std::mem::size_of::<ShmHeader>())[0]
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(path) = &self.owned_file {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// `/dev/shm/<name>`, refusing names that would escape the directory.
fn shm_path(name: &str) -> io::Result<PathBuf> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') || name.len() > 200 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "shared-memory name must be a plain file name",
        ));
    }
    Ok(Path::new("/dev/shm").join(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::server::{Server, predictable_entropy};

    fn small() -> Config {
        Config {
            locks_max: 16,
            clients_max: 4,
            objects_max: 8,
            ..Config::default()
        }
    }

    #[test]
    fn fresh_and_reused_regions_both_give_empty_tables() {
        let cfg = small();
        let mut region = Region::anonymous(&cfg).unwrap();
        assert_eq!(region.len(), cfg.region_size().unwrap());
        {
            let mut s = Server::new(region.tables().unwrap(), &cfg, predictable_entropy);
            let c = s.client_init(2, 0, 0).unwrap();
            s.get_lock(c.get(), dlock_core::LockKind::Rw, b"x", 0)
                .unwrap();
            assert_eq!(s.usage().locks, 1);
        }
        // A second carve zeroes the region: the slot's generation starts over, which it would
        // not if the previous server's metadata were still there.
        let mut s = Server::new(region.tables().unwrap(), &cfg, predictable_entropy);
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

    #[test]
    fn a_shared_region_is_seen_by_a_second_mapping_and_removed_on_drop() {
        let cfg = small();
        let name = format!("dlock-test-{}", std::process::id());
        let server = Region::create_shared(&cfg, &name, 0o600).unwrap();
        let mode = std::fs::metadata(Path::new("/dev/shm").join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "owner-only by default");
        // SAFETY: fresh region, carved once.
        let tables = unsafe { server.tables_shared() }.unwrap();
        assert_eq!(tables.layout.total, server.len());
        let mut client = Region::open_shared(&name).unwrap();
        assert_eq!(client.config().clients_max, cfg.clients_max);
        assert!(
            client.tables().is_err(),
            "a live server's region is never carved (zeroed) here"
        );
        server.object_cells()[3].store(42, std::sync::atomic::Ordering::Release);
        assert_eq!(
            client.object_cells()[3].load(std::sync::atomic::Ordering::Acquire),
            42
        );
        drop(client);
        drop(server);
        assert!(!Path::new("/dev/shm").join(&name).exists());
        assert!(Region::open_shared("../etc").is_err());
    }
}
