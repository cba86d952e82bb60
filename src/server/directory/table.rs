//! The directory's table of 24-byte IDs (`docs/ARCHITECTURE.md` §5, memory per queue): an ID →
//! recipient ID entry is 48 bytes inline in an open-addressing table, plus one control byte, with
//! no allocation of its own (a general concurrent map allocates a node per entry, which doubled
//! what the directory cost per queue).
//!
//! The table is split into [`PARTS`] partitions by a seeded hash of the ID. A partition's slots
//! are read without a lock: a reader notes the partition's sequence number, probes, and probes
//! again if the number moved meanwhile (a sequence lock, made of atomics only). Writers are the
//! queues' owners (NEW, DEL, NKEY, LSET: rare next to lookups) and take the partition's mutex, so
//! an insert-if-absent is exact. A partition grows by a quarter when it is 7/8 full (entries and
//! removed slots), into a new slot array published through an epoch-reclaimed pointer, so a
//! reader still on the old array reads it whole.

use std::hash::BuildHasher;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

use crossbeam_epoch::{self as epoch, Atomic, Owned};

use crate::store::id::IdKey;

/// The ID length the table holds; the relay draws every ID it makes at this length.
pub const ID_LEN: usize = 24;

/// Partitions: enough that writers on different shards rarely meet and that one partition's
/// growth copies a small part of the table.
pub const PARTS: usize = 4096;
const PART_BITS: u32 = PARTS.trailing_zeros();
/// Hash bits that place an entry in its partition's array (below the partition's bits and
/// above the tag's).
const LOW_BITS: u32 = 64 - PART_BITS - 7;

/// Words of an entry: the ID, then the recipient ID.
const WORDS: usize = 2 * ID_LEN / 8;

/// Control bytes: a slot is empty, was emptied (probes pass over it), or holds an entry whose
/// hash has this tag (the high bit set).
const EMPTY: u8 = 0;
const REMOVED: u8 = 1;
const FULL: u8 = 0x80;

/// A partition's slots before its first growth.
const FIRST_SLOTS: usize = 16;

pub struct IdTable {
    parts: Box<[Part]>,
    hasher: foldhash::quality::RandomState,
    /// Entries whose ID or value is not [`ID_LEN`] bytes (a link ID a client chose, data
    /// imported from elsewhere): rare, so a general map. An ID of [`ID_LEN`] bytes is written
    /// here under its partition's writer lock, so an ID is never in both.
    other: LongMap,
    /// Set once `other` holds an entry (never cleared): the map's own length sums counters
    /// across threads, too dear to ask on every insert and every miss.
    other_used: AtomicBool,
    /// Entries a partition keeps at most (a cache, [`IdTable::bounded`]); `usize::MAX`: no
    /// bound. An insert into a full partition evicts one of its entries first.
    part_limit: usize,
    /// The other map's bound, when bounded (it is cleared when it reaches it).
    other_limit: usize,
}

type LongMap = papaya::HashMap<IdKey, IdKey, foldhash::quality::RandomState>;

#[derive(Default)]
struct Part {
    /// Odd while a writer changes the slots.
    seq: AtomicU64,
    slots: Atomic<Slots>,
    writer: Mutex<Counts>,
    /// Entries in the partition (`Counts::full`, for [`IdTable::len`] without the lock).
    len: AtomicUsize,
}

#[derive(Default)]
struct Counts {
    full: usize,
    removed: usize,
    /// Where a bounded partition looks for the next entry to evict (a clock hand).
    hand: usize,
}

struct Slots {
    ctrl: Box<[AtomicU8]>,
    words: Box<[AtomicU64]>,
}

impl Slots {
    fn new(n: usize) -> Self {
        Slots {
            ctrl: (0..n).map(|_| AtomicU8::new(EMPTY)).collect(),
            words: (0..n * WORDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn len(&self) -> usize {
        self.ctrl.len()
    }

    fn key_is(&self, slot: usize, key: &[u64; 3]) -> bool {
        let w = &self.words[slot * WORDS..];
        (0..3).all(|i| w[i].load(Ordering::Relaxed) == key[i])
    }

    fn value(&self, slot: usize) -> [u64; 3] {
        let w = &self.words[slot * WORDS + 3..];
        [0, 1, 2].map(|i| w[i].load(Ordering::Relaxed))
    }

    fn set(&self, slot: usize, tag: u8, key: &[u64; 3], value: &[u64; 3]) {
        let w = &self.words[slot * WORDS..];
        for i in 0..3 {
            w[i].store(key[i], Ordering::Relaxed);
            w[3 + i].store(value[i], Ordering::Relaxed);
        }
        self.ctrl[slot].store(tag, Ordering::Relaxed);
    }

    /// The slot of `key`, or `None`; every slot is looked at most once, so a probe ends even
    /// over slots a writer is changing (the reader's sequence check then discards it).
    fn find(&self, home: usize, tag: u8, key: &[u64; 3]) -> Option<usize> {
        let n = self.len();
        let mut i = home;
        for _ in 0..n {
            match self.ctrl[i].load(Ordering::Relaxed) {
                EMPTY => return None,
                c if c == tag && self.key_is(i, key) => return Some(i),
                _ => {}
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        None
    }

    /// For a writer (nothing changes the slots meanwhile): `Ok` with the slot of `key`, or `Err`
    /// with the first slot from `home` that takes it (removed or empty). The caller has made
    /// sure an empty slot exists.
    fn find_or_free(&self, home: usize, tag: u8, key: &[u64; 3]) -> Result<usize, usize> {
        let n = self.len();
        let mut i = home;
        let mut free = None;
        loop {
            match self.ctrl[i].load(Ordering::Relaxed) {
                EMPTY => return Err(free.unwrap_or(i)),
                REMOVED => {
                    free.get_or_insert(i);
                }
                c if c == tag && self.key_is(i, key) => return Ok(i),
                _ => {}
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }
}

fn words(id: &[u8]) -> [u64; 3] {
    let mut w = [0u64; 3];
    for (i, c) in id.chunks_exact(8).enumerate() {
        w[i] = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
    }
    w
}

/// An ID's bytes from its words (on the stack: growth rehashes every entry from them).
fn id_bytes(w: &[u64; 3]) -> [u8; ID_LEN] {
    let mut b = [0u8; ID_LEN];
    for (c, x) in b.chunks_exact_mut(8).zip(w) {
        c.copy_from_slice(&x.to_le_bytes());
    }
    b
}

/// Where a hash points: its partition (top bits), its tag, and its home slot among `n`.
struct Hashed {
    part: usize,
    tag: u8,
    low: u64,
}

impl Hashed {
    fn of(h: u64) -> Self {
        Hashed {
            part: (h >> (64 - PART_BITS)) as usize,
            tag: FULL | (h as u8 & 0x7f),
            low: (h >> 7) & ((1u64 << LOW_BITS) - 1),
        }
    }

    fn home(&self, n: usize) -> usize {
        ((u128::from(self.low) * n as u128) >> LOW_BITS) as usize
    }
}

impl Default for IdTable {
    fn default() -> Self {
        IdTable {
            parts: (0..PARTS).map(|_| Part::default()).collect(),
            hasher: foldhash::quality::RandomState::default(),
            other: LongMap::default(),
            other_used: AtomicBool::new(false),
            part_limit: usize::MAX,
            other_limit: usize::MAX,
        }
    }
}

impl IdTable {
    /// A table of at most about `limit` entries (each partition holds its share, at least one):
    /// a cache, whose inserts evict an entry of a full partition, the one after the last evicted
    /// (so an entry stays until every other of its partition was inserted or evicted since).
    pub fn bounded(limit: usize) -> Self {
        IdTable {
            part_limit: limit.div_ceil(PARTS).max(1),
            other_limit: limit.max(1),
            ..IdTable::default()
        }
    }

    fn hashed(&self, id: &[u8]) -> Hashed {
        Hashed::of(self.hasher.hash_one(id))
    }

    /// A batch of inserts, for a start's fill (see [`Batch`]).
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            table: self,
            items: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        let inline: usize = self
            .parts
            .iter()
            .map(|p| p.len.load(Ordering::Relaxed))
            .sum();
        inline + self.other.len()
    }

    /// The value `id` maps to.
    pub fn get(&self, id: &[u8]) -> Option<Vec<u8>> {
        let found = if id.len() == ID_LEN {
            self.get_inline(id)
        } else {
            None
        };
        found.or_else(|| {
            (id.len() != ID_LEN || self.other_used.load(Ordering::Relaxed))
                .then(|| self.other.pin().get(id).map(IdKey::to_vec))
                .flatten()
        })
    }

    /// Inserts `id → value` unless `id` is present; true if inserted.
    pub fn insert(&self, id: &[u8], value: &[u8]) -> bool {
        if id.len() != ID_LEN {
            return self.insert_other(id, value);
        }
        self.write(id, |part, counts, slots, h, key| {
            if value.len() != ID_LEN {
                // Absent from the table too, checked under the same lock.
                return slots.find(h.home(slots.len()), h.tag, key).is_none()
                    && self.insert_other(id, value);
            }
            let placed = Self::changing(part, || {
                if counts.full >= self.part_limit
                    && slots.find(h.home(slots.len()), h.tag, key).is_none()
                {
                    Self::evict(counts, slots);
                }
                self.place(counts, slots, h, key, &words(value))
            });
            part.len.store(counts.full, Ordering::Relaxed);
            placed
        })
    }

    /// Empties the partition's next full slot from its clock hand (the writer lock held, inside
    /// `changing`).
    fn evict(counts: &mut Counts, slots: &Slots) {
        let n = slots.len();
        for k in 0..n {
            let i = (counts.hand + k) % n;
            if slots.ctrl[i].load(Ordering::Relaxed) >= FULL {
                slots.ctrl[i].store(REMOVED, Ordering::Relaxed);
                counts.full -= 1;
                counts.removed += 1;
                counts.hand = i + 1;
                return;
            }
        }
    }

    /// Puts `key → value` in the slots of a partition whose writer lock the caller holds, with
    /// room made, unless the key is there or in the other map; true if put.
    fn place(
        &self,
        counts: &mut Counts,
        slots: &Slots,
        h: &Hashed,
        key: &[u64; 3],
        value: &[u64; 3],
    ) -> bool {
        let Err(free) = slots.find_or_free(h.home(slots.len()), h.tag, key) else {
            return false;
        };
        if self.other_used.load(Ordering::Relaxed)
            && self.other.pin().contains_key(&id_bytes(key)[..])
        {
            return false;
        }
        if slots.ctrl[free].load(Ordering::Relaxed) == REMOVED {
            counts.removed -= 1;
        }
        slots.set(free, h.tag, key, value);
        counts.full += 1;
        true
    }

    fn insert_other(&self, id: &[u8], value: &[u8]) -> bool {
        // Set first: a lookup that is told of the entry (its insert happened before it, through
        // whatever channel) sees the flag too, by the coherence of the flag's own order.
        self.other_used.store(true, Ordering::Relaxed);
        let m = self.other.pin();
        if self.other_limit != usize::MAX && m.len() >= self.other_limit && !m.contains_key(id) {
            // A bounded table's rare entries of other lengths: dropped all at once at the bound.
            m.clear();
        }
        m.try_insert(IdKey::new(id), IdKey::new(value)).is_ok()
    }

    /// Removes `id` if it maps to `value`; true if removed.
    pub fn remove_if(&self, id: &[u8], value: &[u8]) -> bool {
        let remove_other = || {
            let m = self.other.pin();
            m.get(id).is_some_and(|v| v.as_slice() == value) && m.remove(id).is_some()
        };
        if id.len() != ID_LEN {
            return remove_other();
        }
        self.write(id, |part, counts, slots, h, key| {
            let Some(slot) = slots.find(h.home(slots.len()), h.tag, key) else {
                return self.other_used.load(Ordering::Relaxed) && remove_other();
            };
            if value.len() != ID_LEN || slots.value(slot) != words(value) {
                return false;
            }
            Self::changing(part, || slots.ctrl[slot].store(REMOVED, Ordering::Relaxed));
            counts.full -= 1;
            counts.removed += 1;
            part.len.store(counts.full, Ordering::Relaxed);
            true
        })
    }

    fn get_inline(&self, id: &[u8]) -> Option<Vec<u8>> {
        let h = self.hashed(id);
        let key = words(id);
        let part = &self.parts[h.part];
        let guard = epoch::pin();
        loop {
            let before = part.seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let found = Self::slots_of(part, &guard)
                .and_then(|s| s.find(h.home(s.len()), h.tag, &key).map(|i| s.value(i)));
            fence(Ordering::Acquire);
            if part.seq.load(Ordering::Relaxed) == before {
                return found.map(|v| id_bytes(&v).to_vec());
            }
        }
    }

    /// Makes room in every partition for its share of `n` entries in all (not `n` more: the
    /// shards starting together each ask for the total they expect, while others insert, and a
    /// second ask must not grow what the first made).
    pub fn reserve(&self, n: usize) {
        let per_part = n.div_ceil(PARTS);
        for part in self.parts.iter() {
            let mut counts = part.writer.lock().unwrap_or_else(|e| e.into_inner());
            let want = per_part.max(counts.full + 1);
            // SAFETY: `counts` is the writer lock, held for this iteration.
            unsafe { self.room(part, &mut counts, want) };
        }
    }

    /// The partition's array, for its writer; no epoch pin (which would put a full barrier
    /// into every insert).
    ///
    /// # Safety
    /// The caller holds the partition's writer lock for as long as it uses the reference:
    /// arrays are replaced only by `grow` and freed only after being replaced (or by `Part`'s
    /// drop, which needs `&mut`), and `grow` runs only under that lock, so the array stays
    /// current, and allocated, meanwhile.
    unsafe fn current(part: &Part) -> Option<&Slots> {
        // SAFETY: the caller's lock keeps the array alive (above); `unprotected` only skips the
        // pin that would otherwise do so.
        unsafe {
            part.slots
                .load(Ordering::Acquire, epoch::unprotected())
                .as_ref()
        }
    }

    fn slots_of<'g>(part: &Part, guard: &'g epoch::Guard) -> Option<&'g Slots> {
        // SAFETY: a slot array is freed only by `defer_destroy` after `grow` replaced it (or by
        // `Part`'s drop, when nothing can read the table); `guard` was pinned before this load
        // and the reference lives no longer than it, so the epoch keeps the array alive.
        unsafe { part.slots.load(Ordering::Acquire, guard).as_ref() }
    }

    /// Runs `f` with the partition's writer lock held and room for one more entry.
    fn write<R>(
        &self,
        id: &[u8],
        f: impl FnOnce(&Part, &mut Counts, &Slots, &Hashed, &[u64; 3]) -> R,
    ) -> R {
        let h = self.hashed(id);
        let key = words(id);
        let part = &self.parts[h.part];
        let mut counts = part.writer.lock().unwrap_or_else(|e| e.into_inner());
        let want = counts.full + 1;
        // SAFETY: `counts` is the writer lock, held until this function returns.
        let slots = unsafe { self.room(part, &mut counts, want) };
        f(part, &mut counts, slots, &h, &key)
    }

    /// Grows the partition's array if `want` entries (and the removed slots) would fill it past
    /// 7/8, and returns it.
    ///
    /// # Safety
    /// `counts` is the content of the partition's writer lock, which the caller holds for as
    /// long as it uses the array.
    unsafe fn room<'a>(&self, part: &'a Part, counts: &mut Counts, want: usize) -> &'a Slots {
        // SAFETY (all three): the caller holds the writer lock.
        let n = unsafe { Self::current(part) }.map_or(0, Slots::len);
        if (want + counts.removed) * 8 > n * 7 {
            unsafe { self.grow(part, want) };
            counts.removed = 0;
        }
        unsafe { Self::current(part) }.expect("grown above")
    }

    /// Runs a change of the slots between the two steps of the sequence number.
    fn changing<R>(part: &Part, change: impl FnOnce() -> R) -> R {
        let s = part.seq.load(Ordering::Relaxed);
        part.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let r = change();
        part.seq.store(s + 2, Ordering::Release);
        r
    }

    /// Moves the partition's entries into a new array sized for `want` entries at 4/5 full (and
    /// at least a quarter more than the old one), leaving removed slots behind. Readers on the
    /// old array read it whole: it does not change, and is freed once none can hold it.
    ///
    /// # Safety
    /// The caller holds the partition's writer lock.
    unsafe fn grow(&self, part: &Part, want: usize) {
        // SAFETY: the caller holds the writer lock.
        let old = unsafe { Self::current(part) };
        let old_len = old.map_or(0, Slots::len);
        // Removed slots alone filled it (a cache's evictions, churn): rebuilt at its size.
        let by_entries = want * 8 > old_len * 7;
        let n = (want * 5 / 4 + 1)
            .max(if by_entries {
                old_len + old_len / 4
            } else {
                old_len
            })
            .max(FIRST_SLOTS);
        let new = Slots::new(n);
        if let Some(old) = old {
            for i in 0..old_len {
                let tag = old.ctrl[i].load(Ordering::Relaxed);
                if tag >= FULL {
                    let w = &old.words[i * WORDS..];
                    let key = [0, 1, 2].map(|j| w[j].load(Ordering::Relaxed));
                    let home = self.hashed(&id_bytes(&key)).home(n);
                    let slot = new
                        .find_or_free(home, tag, &key)
                        .unwrap_or_else(|free| free);
                    new.set(slot, tag, &key, &old.value(i));
                }
            }
        }
        let guard = epoch::pin();
        let replaced = part.slots.swap(Owned::new(new), Ordering::Release, &guard);
        if !replaced.is_null() {
            // SAFETY: `replaced` is no longer reachable from the table (the swap above), so only
            // readers pinned before it can hold it, and the epoch frees it after they unpin.
            unsafe { guard.defer_destroy(replaced) };
        }
    }
}

/// Entries a batch gathers before it inserts them.
const BATCH: usize = 1 << 18;

/// Inserts gathered and made a partition at a time: each partition's lock is taken, and its
/// array grown, once for all of its entries in the batch, and their stores are not serialized
/// by a lock's release after each one. A start fills the directory with every queue this way:
/// one insert at a time spent most of its time waiting on the lock, the partition and the slot,
/// each a cache miss behind the previous insert's barrier. Same rule as [`IdTable::insert`]:
/// an ID already present keeps its entry.
pub struct Batch<'t> {
    table: &'t IdTable,
    items: Vec<Item>,
}

struct Item {
    hash: u64,
    key: [u64; 3],
    value: [u64; 3],
}

impl Batch<'_> {
    pub fn insert(&mut self, id: &[u8], value: &[u8]) {
        if id.len() != ID_LEN || value.len() != ID_LEN {
            self.table.insert(id, value);
            return;
        }
        if self.items.capacity() == 0 {
            self.items.reserve_exact(BATCH);
        }
        self.items.push(Item {
            hash: self.table.hasher.hash_one(id),
            key: words(id),
            value: words(value),
        });
        if self.items.len() == BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let t = self.table;
        // The items in partition order (a counting sort: partitions are few and known).
        let mut starts = vec![0usize; PARTS + 1];
        for it in &self.items {
            starts[Hashed::of(it.hash).part + 1] += 1;
        }
        for p in 0..PARTS {
            starts[p + 1] += starts[p];
        }
        let mut order = vec![0u32; self.items.len()];
        let mut next = starts.clone();
        for (i, it) in self.items.iter().enumerate() {
            let p = Hashed::of(it.hash).part;
            order[next[p]] = i as u32;
            next[p] += 1;
        }
        for p in 0..PARTS {
            let run = &order[starts[p]..starts[p + 1]];
            if run.is_empty() {
                continue;
            }
            let part = &t.parts[p];
            let mut counts = part.writer.lock().unwrap_or_else(|e| e.into_inner());
            let want = counts.full + run.len();
            // SAFETY: `counts` is the writer lock, held for this partition's run.
            let slots = unsafe { t.room(part, &mut counts, want) };
            IdTable::changing(part, || {
                for &i in run {
                    let it = &self.items[i as usize];
                    t.place(&mut counts, slots, &Hashed::of(it.hash), &it.key, &it.value);
                }
            });
            part.len.store(counts.full, Ordering::Relaxed);
        }
        self.items.clear();
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        let slots = std::mem::replace(&mut self.slots, Atomic::null());
        // SAFETY: `&mut self`: no reader or writer can reach the partition any more, and the
        // pointer (when set) came from `Owned::new` in `grow`, and was not freed (only replaced
        // arrays are, and this one is current).
        drop(unsafe { slots.try_into_owned() });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn id(n: u64) -> Vec<u8> {
        let mut v = vec![0u8; ID_LEN];
        v[..8].copy_from_slice(&n.to_le_bytes());
        v[16..].copy_from_slice(&(n ^ 0x5a5a).to_be_bytes());
        v
    }

    #[test]
    fn holds_what_a_map_holds_through_growth_and_removal() {
        let t = IdTable::default();
        let mut model = std::collections::HashMap::new();
        // Many entries in few partitions' worth each, then removals and reinsertions, so that
        // arrays grow, removed slots are reused and growth leaves them behind.
        for n in 0..200_000u64 {
            assert!(t.insert(&id(n), &id(n + 1)));
            model.insert(id(n), id(n + 1));
        }
        assert!(
            !t.insert(&id(7), &id(9)),
            "an ID present is not taken again"
        );
        for n in (0..200_000u64).step_by(3) {
            assert!(!t.remove_if(&id(n), &id(n + 2)), "removal checks the value");
            assert!(t.remove_if(&id(n), &id(n + 1)));
            model.remove(&id(n));
        }
        for n in (0..200_000u64).step_by(6) {
            assert!(t.insert(&id(n), &id(n + 3)));
            model.insert(id(n), id(n + 3));
        }
        assert_eq!(t.len(), model.len());
        for n in 0..200_010u64 {
            assert_eq!(t.get(&id(n)), model.get(&id(n)).cloned(), "id {n}");
        }
    }

    /// Slots over every partition's array.
    fn slots(t: &IdTable) -> usize {
        let guard = epoch::pin();
        t.parts
            .iter()
            .map(|p| IdTable::slots_of(p, &guard).map_or(0, Slots::len))
            .sum()
    }

    #[test]
    fn a_bounded_table_keeps_its_bound_and_never_a_wrong_entry() {
        let limit = 20_000;
        let t = IdTable::bounded(limit);
        let most = limit.div_ceil(PARTS) * PARTS;
        let mut model = std::collections::HashMap::new();
        for round in 0..5u64 {
            for n in 0..100_000u64 {
                let v = id(n * 7 + round);
                if t.insert(&id(n), &v) {
                    // Absent (never put, removed or evicted): its entry is the new one.
                    model.insert(id(n), v);
                }
                // The entry just put or found is there, whatever the insert evicted.
                assert_eq!(t.get(&id(n)).as_ref(), model.get(&id(n)), "id {n}");
                assert!(t.len() <= most, "{} entries", t.len());
            }
            // Removing keeps the rule: only the ID's own entry goes.
            for n in (0..100_000u64).step_by(5) {
                if let Some(v) = model.remove(&id(n)) {
                    t.remove_if(&id(n), &v);
                }
            }
        }
        let mut found = 0;
        for n in 0..100_000u64 {
            // Evicted or held, never another value than the one inserted.
            if let Some(v) = t.get(&id(n)) {
                assert_eq!(Some(&v), model.get(&id(n)), "id {n}");
                found += 1;
            }
        }
        assert!(found > limit / 2, "{found} held");
        // Evictions leave removed slots; rebuilding for them does not grow the arrays.
        assert!(
            slots(&t) <= most * 2 + PARTS * FIRST_SLOTS,
            "{} slots",
            slots(&t)
        );
    }

    #[test]
    fn a_reserve_sizes_for_the_total_and_a_second_one_grows_nothing() {
        let t = IdTable::default();
        t.reserve(400_000);
        let reserved = slots(&t);
        assert!(reserved >= 400_000 * 8 / 7, "{reserved} slots");
        assert!(
            reserved <= 400_000 * 3 / 2 + PARTS * FIRST_SLOTS,
            "{reserved} slots"
        );
        for n in 0..200_000u64 {
            assert!(t.insert(&id(n), &id(n)));
        }
        // The other shard's start asks for the same total while this one has filled half.
        t.reserve(400_000);
        assert_eq!(slots(&t), reserved);
        for n in 200_000..300_000u64 {
            assert!(t.insert(&id(n), &id(n)));
        }
        // Filling to three quarters of the total grows (almost) nothing: the reserve was for it.
        assert!(slots(&t) < reserved + reserved / 20, "{} slots", slots(&t));
    }

    #[test]
    fn a_batch_inserts_as_single_inserts_would() {
        let t = IdTable::default();
        for n in 0..1_000u64 {
            assert!(t.insert(&id(n), &id(n + 1)));
        }
        {
            let mut b = t.batch();
            // More than one batch's worth, so that it flushes on the way and on drop; IDs
            // present before keep their entry, and within the batch the first one wins.
            for n in 500..300_000u64 {
                b.insert(&id(n), &id(n + 7));
            }
            b.insert(&id(100_000), &id(5));
            b.insert(&[9u8; 40], &id(1));
            b.insert(&id(400_000), b"short");
        }
        assert_eq!(t.len(), 300_000 + 2);
        for n in 0..300_010u64 {
            let want = match n {
                0..1_000 => Some(id(n + 1)),
                1_000..300_000 => Some(id(n + 7)),
                _ => None,
            };
            assert_eq!(t.get(&id(n)), want, "id {n}");
        }
        assert_eq!(t.get(&[9u8; 40]), Some(id(1)));
        assert_eq!(t.get(&id(400_000)), Some(b"short".to_vec()));
        assert!(!t.insert(&id(299_999), &id(0)));
    }

    #[test]
    fn ids_of_other_lengths_share_the_rules() {
        let t = IdTable::default();
        let long = vec![7u8; 40];
        assert!(t.insert(&long, &id(1)));
        assert!(!t.insert(&long, &id(2)));
        // A 24-byte ID with a value of another length, then the same ID again.
        assert!(t.insert(&id(5), b"short"));
        assert!(!t.insert(&id(5), &id(6)), "present in the other map");
        assert_eq!(t.get(&id(5)), Some(b"short".to_vec()));
        assert!(t.insert(&id(6), &id(7)));
        assert!(!t.insert(&id(6), b"short"), "present in the table");
        assert_eq!(t.len(), 3);
        assert!(t.remove_if(&id(5), b"short"));
        assert!(t.remove_if(&long, &id(1)));
        assert_eq!((t.get(&id(5)), t.get(&long), t.len()), (None, None, 1));
    }

    #[test]
    fn readers_never_see_a_torn_or_missing_entry_while_writers_grow_and_reuse() {
        // Writers insert, remove and reinsert their own IDs (values tie to the ID, so a torn
        // read shows as a wrong value); readers look up IDs that stay present the whole time and
        // must always find them, with the right value, across every growth.
        let t = Arc::new(IdTable::default());
        for n in 0..1_000u64 {
            assert!(t.insert(&id(n), &id(n * 3)));
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for round in 0..4u64 {
                        let base = 1_000_000 * (w + 1) + round * 100_000;
                        for n in base..base + 60_000 {
                            assert!(t.insert(&id(n), &id(n * 3)));
                        }
                        for n in base..base + 60_000 {
                            assert!(t.remove_if(&id(n), &id(n * 3)));
                        }
                    }
                })
            })
            .collect();
        let readers: Vec<_> = (0..2u64)
            .map(|r| {
                let (t, stop) = (t.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) || reads < 10_000 {
                        let n = (reads * 7 + r) % 1_000;
                        assert_eq!(t.get(&id(n)), Some(id(n * 3)), "id {n}");
                        let absent = 5_000_000 + reads;
                        assert_eq!(t.get(&id(absent)), None);
                        // An ID a writer churns: absent or its own value, never another's
                        // (its slot may be reused by another ID while this reads it).
                        let churned = 1_000_000 * (1 + reads % 2) + (reads * 7_919) % 360_000;
                        let got = t.get(&id(churned));
                        assert!(
                            got.is_none() || got == Some(id(churned * 3)),
                            "id {churned}"
                        );
                        reads += 1;
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().expect("reader");
        }
        assert_eq!(t.len(), 1_000);
    }
}
