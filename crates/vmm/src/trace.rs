//! Boot trace points: when the VMM started, when the VM was ready, when vCPU 0 first
//! entered the guest, and the marks the guest wrote to the trace port.

use serde::Serialize;
use std::time::Instant;

/// Name of a guest trace mark id (the byte written to port 0x502).
pub fn mark_name(id: u8) -> String {
    match id {
        0x01 => "probe_start".into(),
        0x02 => "probe_done".into(),
        0x10 => "linux_init".into(),
        0x11 => "linux_init_done".into(),
        other => format!("guest_mark_{other:#04x}"),
    }
}

/// A named point in time, in milliseconds since the trace origin.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TracePoint {
    /// Point name.
    pub name: String,
    /// Milliseconds since the origin.
    pub ms: f64,
}

/// The trace of one VM run.
#[derive(Debug, Clone)]
pub struct BootTrace {
    origin: Instant,
    points: Vec<(String, Instant)>,
}

impl BootTrace {
    /// Starts a trace whose origin (`vmm_start`) is `origin`.
    pub fn new(origin: Instant) -> Self {
        Self {
            origin,
            points: vec![("vmm_start".into(), origin)],
        }
    }

    /// Records a point now.
    pub fn mark(&mut self, name: &str) {
        self.mark_at(name, Instant::now());
    }

    /// Records a point at a given instant (first occurrence of a name wins).
    pub fn mark_at(&mut self, name: &str, at: Instant) {
        if !self.points.iter().any(|(n, _)| n == name) {
            self.points.push((name.to_string(), at));
        }
    }

    /// All points, ordered by time.
    pub fn points(&self) -> Vec<TracePoint> {
        let mut pts: Vec<_> = self
            .points
            .iter()
            .map(|(name, at)| TracePoint {
                name: name.clone(),
                ms: at.saturating_duration_since(self.origin).as_secs_f64() * 1000.0,
            })
            .collect();
        pts.sort_by(|a, b| a.ms.total_cmp(&b.ms));
        pts
    }

    /// Milliseconds from the origin to a named point.
    pub fn ms(&self, name: &str) -> Option<f64> {
        self.points()
            .into_iter()
            .find(|p| p.name == name)
            .map(|p| p.ms)
    }

    /// A two-column table: point, milliseconds.
    pub fn table(&self) -> String {
        let mut out = format!("{:<24} {:>10}\n", "trace point", "ms");
        for p in self.points() {
            out.push_str(&format!("{:<24} {:>10.3}\n", p.name, p.ms));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ordered_and_first_wins() {
        let t0 = Instant::now();
        let mut trace = BootTrace::new(t0);
        trace.mark_at("b", t0 + Duration::from_millis(5));
        trace.mark_at("a", t0 + Duration::from_millis(2));
        trace.mark_at("a", t0 + Duration::from_millis(9));
        let names: Vec<_> = trace.points().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["vmm_start", "a", "b"]);
        assert!((trace.ms("a").unwrap() - 2.0).abs() < 1e-6);
        assert!(trace.table().contains("vmm_start"));
        assert_eq!(mark_name(0x10), "linux_init");
        assert_eq!(mark_name(0x7f), "guest_mark_0x7f");
    }
}
