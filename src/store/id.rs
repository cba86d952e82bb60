//! Entity IDs as the indexes keep them (`docs/ARCHITECTURE.md` §5, memory per queue): the IDs the
//! relay draws are 24 bytes, and an index keeps one or more for every queue, so an ID of up to 24
//! bytes is held inline, without an allocation of its own; a longer one (a client may choose a
//! link ID of up to 255 bytes) goes to the heap. An [`IdKey`] orders, compares and hashes exactly
//! as its bytes do, so maps keyed by it are looked up with a plain `&[u8]`.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

/// IDs of up to this many bytes are kept inline.
pub const INLINE_ID_LEN: usize = 24;

#[derive(Clone)]
pub enum IdKey {
    Inline { len: u8, bytes: [u8; INLINE_ID_LEN] },
    Long(Box<[u8]>),
}

impl IdKey {
    pub fn new(id: &[u8]) -> Self {
        if id.len() <= INLINE_ID_LEN {
            let mut bytes = [0u8; INLINE_ID_LEN];
            bytes[..id.len()].copy_from_slice(id);
            IdKey::Inline {
                len: id.len() as u8,
                bytes,
            }
        } else {
            IdKey::Long(id.into())
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            IdKey::Inline { len, bytes } => &bytes[..*len as usize],
            IdKey::Long(b) => b,
        }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        self.as_slice().to_vec()
    }
}

impl From<&[u8]> for IdKey {
    fn from(id: &[u8]) -> Self {
        IdKey::new(id)
    }
}

impl Borrow<[u8]> for IdKey {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for IdKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for IdKey {}

impl PartialOrd for IdKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for IdKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl Hash for IdKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `[u8]` hashes, so that a lookup by `&[u8]` finds it (`Borrow`).
        self.as_slice().hash(state)
    }
}

impl std::fmt::Debug for IdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", crate::crypto::hash::b64url(self.as_slice()))
    }
}

/// A queue of items kept per queue record that is empty most of the time (a queue's messages):
/// 8 bytes and no allocation while empty, instead of an empty `VecDeque`'s 32; the allocation
/// goes when the last item does.
#[derive(Debug, Clone)]
#[allow(clippy::box_collection)]
pub struct Sparse<T>(Option<Box<VecDeque<T>>>);

impl<T> Default for Sparse<T> {
    fn default() -> Self {
        Sparse(None)
    }
}

impl<T> From<VecDeque<T>> for Sparse<T> {
    fn from(q: VecDeque<T>) -> Self {
        Sparse((!q.is_empty()).then(|| Box::new(q)))
    }
}

impl<T> Sparse<T> {
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub fn front(&self) -> Option<&T> {
        self.0.as_ref()?.front()
    }

    pub fn back(&self) -> Option<&T> {
        self.0.as_ref()?.back()
    }

    pub fn iter(&self) -> SparseIter<'_, T> {
        SparseIter(self.0.as_ref().map(|q| q.iter()))
    }

    pub fn push_back(&mut self, x: T) {
        self.0.get_or_insert_with(Default::default).push_back(x);
    }

    pub fn pop_front(&mut self) -> Option<T> {
        let q = self.0.as_mut()?;
        let x = q.pop_front();
        if q.is_empty() {
            self.0 = None;
        }
        x
    }

    pub fn clear(&mut self) {
        self.0 = None;
    }
}

/// The items of a [`Sparse`], front to back.
pub struct SparseIter<'a, T>(Option<std::collections::vec_deque::Iter<'a, T>>);

impl<'a, T> Iterator for SparseIter<'a, T> {
    type Item = &'a T;
    fn next(&mut self) -> Option<&'a T> {
        self.0.as_mut()?.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.as_ref().map_or((0, Some(0)), |i| i.size_hint())
    }
}

impl<T> ExactSizeIterator for SparseIter<'_, T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    #[test]
    fn keys_of_every_length_compare_hash_and_look_up_as_their_bytes() {
        let mut ids: Vec<Vec<u8>> = [0usize, 1, 16, 23, 24, 25, 32, 255]
            .iter()
            .flat_map(|&n| [vec![0xab; n], (0..n as u8).collect()])
            .collect();
        ids.sort();
        ids.dedup();
        let mut tree = BTreeMap::new();
        let mut hash = HashMap::new();
        for (i, id) in ids.iter().enumerate() {
            let k = IdKey::new(id);
            assert_eq!(k.as_slice(), &id[..]);
            assert_eq!(matches!(k, IdKey::Inline { .. }), id.len() <= INLINE_ID_LEN);
            tree.insert(k.clone(), i);
            hash.insert(k, i);
        }
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(tree.get(&id[..]), Some(&i), "{id:?}");
            assert_eq!(hash.get(&id[..]), Some(&i), "{id:?}");
        }
        // The tree orders the keys as their bytes.
        let keys: Vec<Vec<u8>> = tree.keys().map(IdKey::to_vec).collect();
        assert_eq!(keys, ids);
        // A prefix is not the ID: the inline padding never makes two lengths equal.
        assert_ne!(IdKey::new(&[0; 3]), IdKey::new(&[0; 4]));
        assert!(!tree.contains_key(&[0xab; 26][..]));
    }

    #[test]
    fn a_sparse_queue_keeps_order_and_gives_its_allocation_back_when_emptied() {
        let mut q: Sparse<u32> = Sparse::default();
        assert!(q.is_empty() && q.front().is_none());
        for i in 0..5 {
            q.push_back(i);
        }
        assert_eq!((q.len(), q.front(), q.back()), (5, Some(&0), Some(&4)));
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        for i in 0..5 {
            assert_eq!(q.pop_front(), Some(i));
        }
        assert!(q.0.is_none(), "an emptied queue kept its allocation");
        assert_eq!(std::mem::size_of::<Sparse<u64>>(), 8);
    }

    #[test]
    fn an_inline_key_is_no_larger_than_a_vec_and_its_allocation() {
        assert!(std::mem::size_of::<IdKey>() <= 32);
    }
}
