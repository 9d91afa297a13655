//! `GET /metrics`: the Prometheus text exposition format (version 0.0.4), written by hand
//! (a few dozen lines; a test parses the output back and checks the format's rules).

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::policy::{BudgetDirection, Direction, Reason};

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Counters of the daemon's life.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Policy actions applied, by (direction, reason).
    pub actions: BTreeMap<(Direction, Reason), u64>,
    /// Policy actions the VM refused, by (direction, reason).
    pub action_errors: BTreeMap<(Direction, Reason), u64>,
    /// DRAM budgets set by the policy, by (direction, reason).
    pub budget_actions: BTreeMap<(BudgetDirection, Reason), u64>,
    /// DRAM budgets the VM refused, by (direction, reason).
    pub budget_action_errors: BTreeMap<(BudgetDirection, Reason), u64>,
    /// Ticks run.
    pub ticks: u64,
}

/// One metric family being written: its samples follow its HELP and TYPE lines.
pub struct Exposition {
    out: String,
}

impl Default for Exposition {
    fn default() -> Self {
        Self::new()
    }
}

/// Escapes a label value (backslash, double quote, newline).
pub fn escape(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Self {
        Self { out: String::new() }
    }

    /// Starts a family: `kind` is "gauge" or "counter" (a counter's name ends in `_total`).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        debug_assert!(kind != "counter" || name.ends_with("_total"));
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    /// A sample of the family just started.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
        self
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// Every (direction, reason) pair, so each counter exists from the start (at 0).
pub fn all_kinds() -> Vec<(Direction, Reason)> {
    let mut v = Vec::new();
    for d in [Direction::Inflate, Direction::Deflate] {
        for r in [
            Reason::HostLowMemory,
            Reason::HostPressure,
            Reason::GuestShort,
            Reason::MakeRoom,
            Reason::StaleCache,
        ] {
            v.push((d, r));
        }
    }
    v
}

/// The direction's label.
pub fn direction_label(d: Direction) -> &'static str {
    match d {
        Direction::Inflate => "inflate",
        Direction::Deflate => "deflate",
    }
}

#[doc(hidden)]
pub mod parse {
    //! A strict reader of the text format, for tests (it panics on what it refuses): every line is a HELP, a TYPE or a
    //! sample of the family whose TYPE came last; names and labels are checked.

    use std::collections::{BTreeMap, BTreeSet};

    /// Series name with its labels (sorted) → value.
    pub type Series = BTreeMap<(String, Vec<(String, String)>), f64>;

    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    /// Parses `text`, panicking with the line on any violation.
    pub fn parse(text: &str) -> Series {
        let mut series = Series::new();
        let mut typed: BTreeSet<String> = BTreeSet::new();
        let mut current: Option<(String, String)> = None;
        assert!(text.is_empty() || text.ends_with('\n'), "no final newline");
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(valid_name(name), "{line}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(valid_name(name), "{line}");
                assert!(["gauge", "counter"].contains(&kind), "{line}");
                assert!(typed.insert(name.into()), "family {name} typed twice");
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "{line}");
                }
                current = Some((name.into(), kind.into()));
                continue;
            }
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let (name, rest) = match line.find(['{', ' ']) {
                Some(i) => line.split_at(i),
                None => panic!("{line}"),
            };
            assert_eq!(
                Some(name),
                current.as_ref().map(|c| c.0.as_str()),
                "sample outside its family: {line}"
            );
            let mut labels = Vec::new();
            let value_text = if let Some(body) = rest.strip_prefix('{') {
                let mut chars = body.char_indices().peekable();
                let end;
                loop {
                    let (i, c) = chars.next().expect("unterminated labels");
                    if c == '}' {
                        end = i;
                        break;
                    }
                    let key_start = i;
                    let mut key_end = i;
                    for (j, c) in chars.by_ref() {
                        if c == '=' {
                            key_end = j;
                            break;
                        }
                    }
                    let key = &body[key_start..key_end];
                    assert!(valid_name(key) && !key.starts_with("__"), "{line}");
                    assert_eq!(chars.next().map(|x| x.1), Some('"'), "{line}");
                    let mut value = String::new();
                    loop {
                        let (_, c) = chars.next().expect("unterminated value");
                        match c {
                            '"' => break,
                            '\\' => match chars.next().unwrap().1 {
                                '\\' => value.push('\\'),
                                '"' => value.push('"'),
                                'n' => value.push('\n'),
                                other => panic!("bad escape \\{other} in {line}"),
                            },
                            '\n' => panic!("raw newline"),
                            c => value.push(c),
                        }
                    }
                    labels.push((key.to_owned(), value));
                    if chars.peek().map(|x| x.1) == Some(',') {
                        chars.next();
                    }
                }
                &body[end + 1..]
            } else {
                rest
            };
            let value_text = value_text.strip_prefix(' ').expect("space before value");
            let value: f64 = match value_text {
                "NaN" => f64::NAN,
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
            };
            labels.sort();
            let key = (name.to_owned(), labels);
            assert!(!series.contains_key(&key), "duplicate series: {line}");
            series.insert(key, value);
        }
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_produces_what_the_strict_reader_accepts() {
        let mut e = Exposition::new();
        e.single("up", "gauge", "Whether it runs.\nSecond line", 1.0);
        e.family("x_bytes", "gauge", "Bytes.")
            .sample("x_bytes", &[("vm", "a\"b\\c\nd"), ("class", "low")], 1024.0)
            .sample("x_bytes", &[("vm", "b")], 0.5);
        e.family("y_total", "counter", "Things.")
            .sample("y_total", &[("kind", "k")], 3.0);
        e.single("z", "gauge", "nan", f64::NAN);
        let text = e.finish();
        let series = parse::parse(&text);
        assert_eq!(series.len(), 5);
        let key = (
            "x_bytes".to_string(),
            vec![
                ("class".to_string(), "low".to_string()),
                ("vm".to_string(), "a\"b\\c\nd".to_string()),
            ],
        );
        assert_eq!(series[&key], 1024.0);
        assert!(text.contains(r#"vm="a\"b\\c\nd""#), "{text}");
    }

    #[test]
    #[should_panic(expected = "sample outside its family")]
    fn the_reader_catches_a_sample_without_its_type() {
        parse::parse("# TYPE a gauge\na 1\nb 2\n");
    }
}
