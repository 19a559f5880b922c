//! Prometheus's text exposition format (version 0.0.4), as every Prism
//! metrics endpoint writes it: each family's `# HELP` and `# TYPE` lines,
//! then its samples, each with the cluster's `SessionName` label (Ray's).
//!
//! ```
//! use prism_protocol::exposition::{Exposition, Kind};
//! let mut out = Exposition::new("session_1");
//! out.family("ray_tasks", Kind::Gauge, "Tasks, by function and state.");
//! out.sample("ray_tasks", &[("Name", "add"), ("State", "FINISHED")], 3.0);
//! let text = out.finish();
//! assert!(text.contains("ray_tasks{SessionName=\"session_1\",Name=\"add\",State=\"FINISHED\"} 3\n"));
//! ```

use std::fmt::Write;

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that only grows (while its process lives).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Counts of observations by bucket (`_bucket{le=...}`, cumulative),
    /// with their `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// The text of one scrape, written family by family.
#[derive(Debug)]
pub struct Exposition {
    out: String,
    session: String,
}

impl Exposition {
    /// An empty exposition whose samples carry `SessionName=session`.
    pub fn new(session: &str) -> Exposition {
        Exposition {
            out: String::with_capacity(4096),
            session: escape(session),
        }
    }

    /// Starts a family: its help text and type. Its samples follow.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of the family started last, with these labels (values
    /// escaped here) besides `SessionName`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.out, "{name}{{SessionName=\"{}\"", self.session);
        for (label, v) in labels {
            let _ = write!(self.out, ",{label}=\"{}\"", escape(v));
        }
        let _ = writeln!(self.out, "}} {}", number(value));
    }

    /// The samples of one histogram of the family `name` started last:
    /// `counts[i]` observations at most `bounds[i]`, not cumulative, and
    /// one more count for those above the last bound; `sum` of all.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        let mut below = 0u64;
        let bucket = format!("{name}_bucket");
        for (i, count) in counts.iter().enumerate() {
            below += count;
            let le = bounds.get(i).map_or("+Inf".to_string(), |b| number(*b));
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, below as f64);
        }
        self.sample(&format!("{name}_sum"), labels, sum);
        self.sample(&format!("{name}_count"), labels, below as f64);
    }

    /// A family with a single sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// The text, ready to serve as `text/plain; version=0.0.4`.
    pub fn finish(self) -> String {
        self.out
    }
}

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A label value escaped: backslash, double quote and line feed.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A value as the format spells it: integers without a fraction,
/// `NaN`, `+Inf` and `-Inf` by name.
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_numbers_spelled_as_the_format_wants() {
        let mut out = Exposition::new("s\"1");
        out.family("prism_x_total", Kind::Counter, "A help\nwith a line.");
        out.sample("prism_x_total", &[("Name", "a\\b\n\"c\"")], 1.5);
        out.sample("prism_x_total", &[], f64::NAN);
        out.sample("prism_x_total", &[], f64::INFINITY);
        out.sample("prism_x_total", &[], 2e20);
        let text = out.finish();
        assert_eq!(
            text,
            "# HELP prism_x_total A help\\nwith a line.\n# TYPE prism_x_total counter\n\
             prism_x_total{SessionName=\"s\\\"1\",Name=\"a\\\\b\\n\\\"c\\\"\"} 1.5\n\
             prism_x_total{SessionName=\"s\\\"1\"} NaN\n\
             prism_x_total{SessionName=\"s\\\"1\"} +Inf\n\
             prism_x_total{SessionName=\"s\\\"1\"} 200000000000000000000\n"
        );
    }
}
