//! Guest ↔ host uid/gid mapping (ranges, like user namespaces).

use thiserror::Error;

/// The id reported for a host id that no range maps (as in user namespaces).
pub const OVERFLOW_ID: u32 = 65534;

/// One range: guest ids `guest..guest+count` are host ids `host..host+count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// First guest id.
    pub guest: u32,
    /// First host id.
    pub host: u32,
    /// Number of ids.
    pub count: u32,
}

/// A set of ranges. Empty means identity (ids pass through unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap {
    ranges: Vec<IdRange>,
}

/// A malformed `GUEST:HOST[:COUNT]` mapping.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum IdMapError {
    /// Not of the form GUEST:HOST[:COUNT].
    #[error("id map {0:?} is not GUEST:HOST[:COUNT] (e.g. 0:1000:1)")]
    Syntax(String),
    /// The range wraps past u32::MAX or has count 0.
    #[error("id map {0:?} has an empty or overflowing range")]
    Range(String),
    /// Two ranges overlap on the guest or host side.
    #[error("id map {0:?} overlaps an earlier range")]
    Overlap(String),
}

impl IdMap {
    /// The identity map.
    pub fn identity() -> Self {
        IdMap::default()
    }

    /// Parses and adds `GUEST:HOST[:COUNT]` (count defaults to 1).
    pub fn add(&mut self, spec: &str) -> Result<(), IdMapError> {
        let parts: Vec<&str> = spec.split(':').collect();
        let num = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| IdMapError::Syntax(spec.to_string()))
        };
        let (guest, host, count) = match parts.as_slice() {
            [g, h] => (num(g)?, num(h)?, 1),
            [g, h, c] => (num(g)?, num(h)?, num(c)?),
            _ => return Err(IdMapError::Syntax(spec.to_string())),
        };
        if count == 0
            || guest.checked_add(count - 1).is_none()
            || host.checked_add(count - 1).is_none()
        {
            return Err(IdMapError::Range(spec.to_string()));
        }
        let overlap = |a: u32, an: u32, b: u32, bn: u32| {
            (a as u64) < b as u64 + bn as u64 && (b as u64) < a as u64 + an as u64
        };
        if self.ranges.iter().any(|r| {
            overlap(r.guest, r.count, guest, count) || overlap(r.host, r.count, host, count)
        }) {
            return Err(IdMapError::Overlap(spec.to_string()));
        }
        self.ranges.push(IdRange { guest, host, count });
        Ok(())
    }

    /// True when no range is configured.
    pub fn is_identity(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Host id for a guest id (`OVERFLOW_ID` if unmapped). `u32::MAX` ("no id")
    /// passes through.
    pub fn to_host(&self, guest: u32) -> u32 {
        if self.ranges.is_empty() || guest == u32::MAX {
            return guest;
        }
        self.ranges
            .iter()
            .find(|r| guest >= r.guest && guest - r.guest < r.count)
            .map_or(OVERFLOW_ID, |r| r.host + (guest - r.guest))
    }

    /// Guest id for a host id (`OVERFLOW_ID` if unmapped).
    pub fn to_guest(&self, host: u32) -> u32 {
        if self.ranges.is_empty() {
            return host;
        }
        self.ranges
            .iter()
            .find(|r| host >= r.host && host - r.host < r.count)
            .map_or(OVERFLOW_ID, |r| r.guest + (host - r.host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_map_both_ways() {
        let mut m = IdMap::identity();
        assert_eq!(m.to_host(5), 5);
        m.add("0:1000").unwrap();
        m.add("1:100000:65536").unwrap();
        assert_eq!(m.to_host(0), 1000);
        assert_eq!(m.to_host(10), 100009);
        assert_eq!(m.to_guest(1000), 0);
        assert_eq!(m.to_guest(100009), 10);
        assert_eq!(m.to_guest(7), OVERFLOW_ID);
        assert_eq!(m.to_host(70000), OVERFLOW_ID);
        assert_eq!(m.to_host(u32::MAX), u32::MAX);
    }

    #[test]
    fn bad_specs_are_rejected() {
        let mut m = IdMap::identity();
        assert!(matches!(m.add("x"), Err(IdMapError::Syntax(_))));
        assert!(matches!(m.add("1:2:0"), Err(IdMapError::Range(_))));
        assert!(matches!(m.add("4294967295:0:2"), Err(IdMapError::Range(_))));
        m.add("0:1000:10").unwrap();
        assert!(matches!(m.add("5:5000"), Err(IdMapError::Overlap(_))));
        assert!(matches!(m.add("50:1005"), Err(IdMapError::Overlap(_))));
    }
}
