//! Counts that go down only by what went up before them (bytes queued on a connection, asks
//! out, jobs left, notifications counted as sent). Taking more than is there is a bug: debug
//! builds — the tests and the owner simulation — stop at it; a release relay keeps 0 rather
//! than wrap, so one miscount cannot turn into a connection that never writes again.

use std::cell::Cell;
use std::fmt::Display;
use std::ops::Sub;

/// `v - n`, which must not go below 0 (`what` names the count in the failure).
pub fn less<T>(v: T, n: T, what: &str) -> T
where
    T: Copy + PartialOrd + Default + Sub<Output = T> + Display,
{
    debug_assert!(n <= v, "{what}: taking {n} from {v}");
    if n <= v {
        v - n
    } else {
        T::default()
    }
}

/// Takes `n` from the count in `c` (see [`less`]).
pub fn take<T>(c: &Cell<T>, n: T, what: &str)
where
    T: Copy + PartialOrd + Default + Sub<Output = T> + Display,
{
    c.set(less(c.get(), n, what));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_what_is_there() {
        let c = Cell::new(5usize);
        take(&c, 3, "bytes");
        assert_eq!(c.get(), 2);
        assert_eq!(less(7u64, 7, "ntfs"), 0);
    }

    #[test]
    #[should_panic(expected = "bytes: taking 3 from 2")]
    fn taking_more_stops_a_debug_build() {
        take(&Cell::new(2usize), 3, "bytes");
    }
}
