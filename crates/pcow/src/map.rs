//! `ClusterMap`: logical cluster → u64 value, dense (a vector) for well-filled layers and
//! sparse (a hash map) otherwise. Every lookup is O(1).

use std::collections::HashMap;

/// Largest number of logical clusters for which a dense map is used.
const DENSE_LIMIT: u64 = 1 << 26;

/// Logical cluster → value map with O(1) lookups.
#[derive(Clone, Debug)]
pub enum ClusterMap {
    /// One slot per logical cluster; `u64::MAX` means absent.
    Dense(Vec<u64>),
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
    /// Value for `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u64> {
        match self {
            ClusterMap::Dense(v) => v.get(key as usize).copied().filter(|&x| x != u64::MAX),
            ClusterMap::Sparse(m) => m.get(&key).copied(),
        }
    }
    /// Sets `key` to `value`; `key` must be below the cluster count given at construction.
    pub fn insert(&mut self, key: u64, value: u64) {
        match self {
            ClusterMap::Dense(v) => {
                if let Some(x) = v.get_mut(key as usize) {
                    *x = value;
                }
            }
            ClusterMap::Sparse(m) => {
                m.insert(key, value);
            }
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
            ClusterMap::Sparse(m) => Box::new(m.iter().map(|(&k, &v)| (k, v))),
        }
    }
    /// Number of present keys (O(n) for dense maps).
    pub fn count(&self) -> usize {
        match self {
            ClusterMap::Dense(v) => v.iter().filter(|&&x| x != u64::MAX).count(),
            ClusterMap::Sparse(m) => m.len(),
        }
    }
}
