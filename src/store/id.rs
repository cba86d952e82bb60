//! Entity IDs as the indexes keep them (`docs/ARCHITECTURE.md` §5, memory per queue): the IDs the
//! relay draws are 24 bytes, and an index keeps one or more for every queue, so an ID of up to 24
//! bytes is held inline, without an allocation of its own; a longer one (a client may choose a
//! link ID of up to 255 bytes) goes to the heap. An [`IdKey`] orders, compares and hashes exactly
//! as its bytes do, so maps keyed by it are looked up with a plain `&[u8]`.

use std::borrow::Borrow;
use std::cmp::Ordering;
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
    fn an_inline_key_is_no_larger_than_a_vec_and_its_allocation() {
        assert!(std::mem::size_of::<IdKey>() <= 32);
    }
}
