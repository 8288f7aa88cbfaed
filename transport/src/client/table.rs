//! The client's lock records, found by the slot index inside the lock id.
//!
//! Every lock operation looks its record up at least twice (to decide, then to apply the reply),
//! and a 31-key batch does so 62 times, so the lookup is on the client's hot path. Lock ids are
//! slot indexes the server hands out densely from zero (plus a generation), so the records sit
//! in pages indexed by the slot index: a lookup is two indexed loads and a comparison of the
//! whole id, with no hashing or probing. Pages are allocated when the first id in their range
//! arrives, so a client that knows a few locks holds a few pages whatever their ids.
//!
//! Two ids can share a slot index (one stale, from before the server reused the slot under a new
//! generation): the second is kept in a small spill map, so the table holds exactly what a map
//! keyed by the whole id would.

use std::collections::HashMap;

use dlock_core::LockId;
use dlock_core::ids::SLOT_INDEX_LIMIT;

use super::local::LocalLock;

/// Records per page (a power of two).
const PAGE: usize = 256;
/// Pages the largest slot index needs.
const PAGES_MAX: usize = SLOT_INDEX_LIMIT as usize / PAGE;

/// The client's record of one lock it got.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) local: LocalLock,
    pub(super) name: Box<[u8]>,
    /// An operation on this lock is in a batch in flight (see `pipeline`).
    pub(super) busy: bool,
}

impl Entry {
    fn id(&self) -> LockId {
        self.local.id
    }
}

type Page = Box<[Option<Entry>]>;

/// The records, by lock id.
#[derive(Debug, Default)]
pub(super) struct LockTable {
    /// Page `p` holds slot indexes `p * PAGE ..` (`None`: no id in that range yet).
    pages: Vec<Option<Page>>,
    /// Records whose slot index a record with another generation occupies in `pages`.
    spill: HashMap<LockId, Entry>,
}

/// Where `id`'s record lives in `pages`: page, then position.
#[inline]
fn place(id: LockId) -> (usize, usize) {
    let index = id.index() as usize;
    (index / PAGE, index % PAGE)
}

/// The place in `pages` for `id`'s slot index (whoever holds it), if its page exists.
#[inline]
fn slot_mut(pages: &mut [Option<Page>], id: LockId) -> Option<&mut Option<Entry>> {
    let (p, i) = place(id);
    pages
        .get_mut(p)
        .and_then(Option::as_mut)
        .map(|page| &mut page[i])
}

impl LockTable {
    /// Records held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.iter().count()
    }

    #[inline]
    pub(super) fn get(&self, id: LockId) -> Option<&Entry> {
        let (p, i) = place(id);
        match self
            .pages
            .get(p)
            .and_then(Option::as_ref)
            .map(|page| &page[i])
        {
            Some(Some(e)) if e.id() == id => Some(e),
            _ if self.spill.is_empty() => None,
            _ => self.spill.get(&id),
        }
    }

    #[inline]
    pub(super) fn get_mut(&mut self, id: LockId) -> Option<&mut Entry> {
        match slot_mut(&mut self.pages, id) {
            Some(Some(e)) if e.id() == id => Some(e),
            _ if self.spill.is_empty() => None,
            _ => self.spill.get_mut(&id),
        }
    }

    /// The record of `id`, made by `make` if there is none (`make` must return a record whose
    /// `local.id` is `id`).
    pub(super) fn get_or_insert_with(
        &mut self,
        id: LockId,
        make: impl FnOnce() -> Entry,
    ) -> &mut Entry {
        if self.get(id).is_none() {
            let e = make();
            debug_assert_eq!(e.id(), id, "a record filed under another id");
            self.insert(e);
        }
        self.get_mut(id).expect("just inserted")
    }

    /// Files `e` under its id (`e.local.id`), returning the record it replaces.
    pub(super) fn insert(&mut self, e: Entry) -> Option<Entry> {
        let id = e.id();
        let (p, i) = place(id);
        debug_assert!(p < PAGES_MAX);
        if self.pages.len() <= p {
            self.pages.resize_with(p + 1, || None);
        }
        let page = self.pages[p].get_or_insert_with(|| (0..PAGE).map(|_| None).collect());
        match &mut page[i] {
            Some(held) if held.id() == id => Some(std::mem::replace(held, e)),
            Some(_) => self.spill.insert(id, e),
            empty @ None => empty.replace(e),
        }
    }

    /// Takes `id`'s record out.
    pub(super) fn remove(&mut self, id: LockId) -> Option<Entry> {
        match slot_mut(&mut self.pages, id) {
            Some(held @ Some(_)) if held.as_ref().is_some_and(|e| e.id() == id) => {
                let taken = held.take();
                // A spilled record of the same slot index moves into the freed place.
                if let Some(spilled) = self.spill.keys().find(|k| k.index() == id.index()) {
                    let spilled = *spilled;
                    *held = self.spill.remove(&spilled);
                }
                taken
            }
            _ => self.spill.remove(&id),
        }
    }

    /// Every record, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.pages
            .iter()
            .flatten()
            .flat_map(|page| page.iter().flatten())
            .chain(self.spill.values())
    }

    /// Every record, mutable, in no particular order.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Entry> {
        self.pages
            .iter_mut()
            .flatten()
            .flat_map(|page| page.iter_mut().flatten())
            .chain(self.spill.values_mut())
    }

    /// Takes every record out, leaving the table empty (pages stay allocated).
    pub(super) fn drain(&mut self) -> Vec<Entry> {
        let mut out: Vec<Entry> = self
            .pages
            .iter_mut()
            .flatten()
            .flat_map(|page| page.iter_mut().filter_map(Option::take))
            .collect();
        out.extend(self.spill.drain().map(|(_, e)| e));
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use dlock_core::ids::GENERATION_MAX;
    use dlock_core::{LockId, LockKind};
    use proptest::prelude::*;

    use super::{Entry, LocalLock, LockTable};

    fn entry(id: LockId) -> Entry {
        Entry {
            local: LocalLock::new(id, LockKind::Atomic),
            name: Box::new([]),
            busy: false,
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(LockId),
        Remove(LockId),
        Touch(LockId),
    }

    /// Ids from a few slot indexes (some past the first page) and a few generations, so that
    /// ids often share a slot index.
    fn id() -> impl Strategy<Value = LockId> {
        (
            prop_oneof![0u32..4, 254u32..258, Just(51_199)],
            prop_oneof![1u32..4, Just(GENERATION_MAX)],
        )
            .prop_map(|(index, generation)| LockId::new(index, generation))
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            id().prop_map(Op::Insert),
            id().prop_map(Op::Remove),
            id().prop_map(Op::Touch),
        ]
    }

    proptest! {
        /// The table answers exactly as a map keyed by the whole id does, whatever the ids.
        #[test]
        fn behaves_as_a_map_by_id(ops in proptest::collection::vec(op(), 1..200)) {
            let mut table = LockTable::default();
            let mut model: HashMap<LockId, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(id) => {
                        let replaced = table.insert(entry(id)).map(|e| e.local.refs);
                        prop_assert_eq!(replaced, model.insert(id, 0));
                    }
                    Op::Remove(id) => {
                        let removed = table.remove(id).map(|e| e.local.refs);
                        prop_assert_eq!(removed, model.remove(&id));
                    }
                    Op::Touch(id) => {
                        // A change through `get_mut` is seen by later lookups of that id only.
                        if let Some(e) = table.get_mut(id) {
                            e.local.refs += 1;
                        }
                        if let Some(r) = model.get_mut(&id) {
                            *r += 1;
                        }
                    }
                }
                prop_assert_eq!(table.len(), model.len());
                for (&id, &refs) in &model {
                    prop_assert_eq!(table.get(id).map(|e| (e.local.id, e.local.refs)), Some((id, refs)));
                }
                let mut seen: Vec<LockId> = table.iter().map(|e| e.local.id).collect();
                let mut want: Vec<LockId> = model.keys().copied().collect();
                seen.sort();
                want.sort();
                prop_assert_eq!(seen, want);
            }
            let drained = table.drain().len();
            prop_assert_eq!(drained, model.len());
            prop_assert_eq!(table.len(), 0);
            prop_assert!(table.iter().next().is_none());
        }
    }
}
