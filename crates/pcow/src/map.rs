//! `ClusterMap`: logical cluster → u64 value, dense (a flat vector indexed by logical
//! cluster) for well-filled layers and sparse (a hash map) otherwise. Every lookup is O(1).

use std::collections::HashMap;

/// Largest number of logical clusters for which a dense map is used.
const DENSE_LIMIT: u64 = 1 << 26;

/// Absent marker of a narrow dense map.
const ABSENT32: u32 = u32::MAX;

/// Logical cluster → value map with O(1) lookups.
#[derive(Clone, Debug)]
pub enum ClusterMap {
    /// One slot per logical cluster; `u64::MAX` means absent.
    Dense(Vec<u64>),
    /// One slot per logical cluster for values below `u32::MAX` (physical slot numbers,
    /// which are at most `MAX_SLOTS`); `u32::MAX` means absent. Half the memory of `Dense`.
    Dense32(Vec<u32>),
    /// Only present keys.
    Sparse(HashMap<u64, u64>),
}

impl ClusterMap {
    /// A map for `clusters` logical clusters expected to hold about `expected` keys.
    pub fn with_expected(clusters: u64, expected: u64) -> Self {
        if clusters <= DENSE_LIMIT && expected.saturating_mul(16) >= clusters {
            ClusterMap::Dense(vec![u64::MAX; clusters as usize])
        } else {
            ClusterMap::Sparse(HashMap::with_capacity(expected.min(1 << 20) as usize))
        }
    }
    /// Like [`ClusterMap::with_expected`] for values that are always below `u32::MAX`
    /// (physical slots): a dense map then uses 4 bytes per logical cluster. Larger values
    /// are still accepted (the map switches to the wide representation).
    pub fn with_expected_narrow(clusters: u64, expected: u64) -> Self {
        if clusters <= DENSE_LIMIT && expected.saturating_mul(16) >= clusters {
            ClusterMap::Dense32(vec![ABSENT32; clusters as usize])
        } else {
            ClusterMap::Sparse(HashMap::with_capacity(expected.min(1 << 20) as usize))
        }
    }
    /// Value for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        match self {
            ClusterMap::Dense(v) => v.get(key as usize).copied().filter(|&x| x != u64::MAX),
            ClusterMap::Dense32(v) => v
                .get(key as usize)
                .copied()
                .filter(|&x| x != ABSENT32)
                .map(u64::from),
            ClusterMap::Sparse(m) => m.get(&key).copied(),
        }
    }
    /// Sets `key` to `value`; `key` must be below the cluster count given at construction.
    #[inline]
    pub fn insert(&mut self, key: u64, value: u64) {
        match self {
            ClusterMap::Dense(v) => {
                if let Some(x) = v.get_mut(key as usize) {
                    *x = value;
                }
            }
            ClusterMap::Dense32(v) => match u32::try_from(value) {
                Ok(narrow) if narrow != ABSENT32 => {
                    if let Some(x) = v.get_mut(key as usize) {
                        *x = narrow;
                    }
                }
                _ => {
                    self.widen();
                    self.insert(key, value);
                }
            },
            ClusterMap::Sparse(m) => {
                m.insert(key, value);
            }
        }
    }
    /// Sets `key` to `value` unless `keep(current value)` holds for a present value.
    /// Returns true if the value was set.
    #[inline]
    pub fn insert_unless(&mut self, key: u64, value: u64, keep: impl FnOnce(u64) -> bool) -> bool {
        let narrow = u32::try_from(value).ok().filter(|&v| v != ABSENT32);
        match (self, narrow) {
            (ClusterMap::Dense(v), _) => match v.get_mut(key as usize) {
                Some(x) if *x == u64::MAX || !keep(*x) => {
                    *x = value;
                    true
                }
                _ => false,
            },
            (ClusterMap::Dense32(v), Some(narrow)) => match v.get_mut(key as usize) {
                Some(x) if *x == ABSENT32 || !keep(u64::from(*x)) => {
                    *x = narrow;
                    true
                }
                _ => false,
            },
            (this @ ClusterMap::Dense32(_), None) => {
                this.widen();
                this.insert_unless(key, value, keep)
            }
            (ClusterMap::Sparse(m), _) => match m.entry(key) {
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    if keep(*o.get()) {
                        false
                    } else {
                        o.insert(value);
                        true
                    }
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(value);
                    true
                }
            },
        }
    }
    /// Converts a narrow dense map into a wide one (for a value that does not fit).
    fn widen(&mut self) {
        if let ClusterMap::Dense32(v) = self {
            let wide = v
                .iter()
                .map(|&x| {
                    if x == ABSENT32 {
                        u64::MAX
                    } else {
                        u64::from(x)
                    }
                })
                .collect();
            *self = ClusterMap::Dense(wide);
        }
    }
    /// Removes `key`.
    pub fn remove(&mut self, key: u64) {
        match self {
            ClusterMap::Dense(v) => {
                if let Some(x) = v.get_mut(key as usize) {
                    *x = u64::MAX;
                }
            }
            ClusterMap::Dense32(v) => {
                if let Some(x) = v.get_mut(key as usize) {
                    *x = ABSENT32;
                }
            }
            ClusterMap::Sparse(m) => {
                m.remove(&key);
            }
        }
    }
    /// All (key, value) pairs, in no particular order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (u64, u64)> + '_> {
        match self {
            ClusterMap::Dense(v) => Box::new(
                v.iter()
                    .enumerate()
                    .filter(|(_, &x)| x != u64::MAX)
                    .map(|(k, &x)| (k as u64, x)),
            ),
            ClusterMap::Dense32(v) => Box::new(
                v.iter()
                    .enumerate()
                    .filter(|(_, &x)| x != ABSENT32)
                    .map(|(k, &x)| (k as u64, u64::from(x))),
            ),
            ClusterMap::Sparse(m) => Box::new(m.iter().map(|(&k, &v)| (k, v))),
        }
    }
    /// Number of present keys (O(n) for dense maps).
    pub fn count(&self) -> usize {
        match self {
            ClusterMap::Dense(v) => v.iter().filter(|&&x| x != u64::MAX).count(),
            ClusterMap::Dense32(v) => v.iter().filter(|&&x| x != ABSENT32).count(),
            ClusterMap::Sparse(m) => m.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ClusterMap;

    #[test]
    fn all_representations_agree() {
        let mut maps = [
            ClusterMap::with_expected(1000, 1000),
            ClusterMap::with_expected_narrow(1000, 1000),
            ClusterMap::with_expected(1000, 1),
        ];
        assert!(matches!(maps[0], ClusterMap::Dense(_)));
        assert!(matches!(maps[1], ClusterMap::Dense32(_)));
        assert!(matches!(maps[2], ClusterMap::Sparse(_)));
        for m in &mut maps {
            m.insert(3, 7);
            m.insert(999, 0);
            m.insert(5, 9);
            m.remove(5);
            assert!(!m.insert_unless(3, 8, |_| true));
            assert!(m.insert_unless(4, 8, |_| true));
            assert!(m.insert_unless(4, 6, |old| old == 9));
            assert_eq!(m.get(4), Some(6));
            m.remove(4);
            assert_eq!(m.get(3), Some(7));
            assert_eq!(m.get(999), Some(0));
            assert_eq!(m.get(5), None);
            assert_eq!(m.get(4), None);
            assert_eq!(m.count(), 2);
            let mut all: Vec<_> = m.iter().collect();
            all.sort();
            assert_eq!(all, vec![(3, 7), (999, 0)]);
        }
    }

    #[test]
    fn narrow_map_widens_for_large_values() {
        let mut m = ClusterMap::with_expected_narrow(16, 16);
        m.insert(1, 5);
        m.insert(2, u64::from(u32::MAX));
        assert!(matches!(m, ClusterMap::Dense(_)));
        assert_eq!(m.get(1), Some(5));
        assert_eq!(m.get(2), Some(u64::from(u32::MAX)));
        assert_eq!(m.get(3), None);
    }
}
