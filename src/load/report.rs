//! Figures of a run, their median and range over runs, as a table for people and JSON lines for
//! tools (no serde: the records are flat).

use std::fmt::Write as _;

/// One run of one configuration: its settings and its figures, in display order.
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub scenario: String,
    /// The configuration's label, e.g. `conns=8 prefill=yes`; runs with the same label are
    /// summarized together.
    pub config: String,
    pub run: usize,
    pub figures: Vec<(&'static str, f64)>,
}

impl RunRecord {
    pub fn get(&self, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }
}

/// Median, min and max of one figure over the runs of one configuration.
#[derive(Debug, Clone)]
pub struct Summary {
    pub name: &'static str,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// A textual progress bar of 20 cells.
pub fn bar(done: usize, total: usize) -> String {
    let cells = 20;
    let full = (done * cells)
        .checked_div(total)
        .unwrap_or(cells)
        .min(cells);
    format!("[{}{}]", "#".repeat(full), ".".repeat(cells - full))
}

/// The p-quantile (0..=1) of samples, nearest-rank; NaN when empty.
pub fn percentile(samples: &mut [u64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_unstable();
    let rank = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1] as f64
}

pub fn median(v: &mut [f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Summaries of each figure over `runs` (all of one configuration).
pub fn summarize(runs: &[&RunRecord]) -> Vec<Summary> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .figures
        .iter()
        .map(|(name, _)| {
            let mut vals: Vec<f64> = runs.iter().filter_map(|r| r.get(name)).collect();
            let finite: Vec<f64> = vals.iter().copied().filter(|x| x.is_finite()).collect();
            Summary {
                name,
                median: median(&mut vals),
                min: finite.iter().copied().fold(f64::NAN, f64::min),
                max: finite.iter().copied().fold(f64::NAN, f64::max),
            }
        })
        .collect()
}

/// Configurations in first-seen order, each with its runs.
pub fn group(runs: &[RunRecord]) -> Vec<(String, Vec<&RunRecord>)> {
    let mut out: Vec<(String, Vec<&RunRecord>)> = Vec::new();
    for r in runs {
        match out.iter_mut().find(|(c, _)| *c == r.config) {
            Some((_, v)) => v.push(r),
            None => out.push((r.config.clone(), vec![r])),
        }
    }
    out
}

pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The table: one block per configuration, one line per figure with each run, then median
/// [min–max].
pub fn table(scenario: &str, runs: &[RunRecord]) -> String {
    let mut s = String::new();
    for (config, rs) in group(runs) {
        let _ = writeln!(s, "\n{scenario}  {config}  ({} runs)", rs.len());
        let _ = write!(s, "  {:<34}", "figure");
        for r in &rs {
            let _ = write!(s, "{:>12}", format!("run {}", r.run + 1));
        }
        let _ = writeln!(s, "{:>12}  range", "median");
        for sm in summarize(&rs) {
            let _ = write!(s, "  {:<34}", sm.name);
            for r in &rs {
                let _ = write!(s, "{:>12}", fmt_num(r.get(sm.name).unwrap_or(f64::NAN)));
            }
            let _ = writeln!(
                s,
                "{:>12}  [{}-{}]",
                fmt_num(sm.median),
                fmt_num(sm.min),
                fmt_num(sm.max)
            );
        }
    }
    s
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// One JSON object per line: each run, then a summary per configuration.
pub fn json_lines(scenario: &str, runs: &[RunRecord]) -> String {
    let mut s = String::new();
    for r in runs {
        let figs: Vec<String> = r
            .figures
            .iter()
            .map(|(n, v)| format!("{}:{}", json_str(n), json_num(*v)))
            .collect();
        let _ = writeln!(
            s,
            "{{\"type\":\"run\",\"scenario\":{},\"config\":{},\"run\":{},\"figures\":{{{}}}}}",
            json_str(scenario),
            json_str(&r.config),
            r.run + 1,
            figs.join(",")
        );
    }
    for (config, rs) in group(runs) {
        let sums = summarize(&rs);
        let part = |f: fn(&Summary) -> f64| -> String {
            sums.iter()
                .map(|sm| format!("{}:{}", json_str(sm.name), json_num(f(sm))))
                .collect::<Vec<_>>()
                .join(",")
        };
        let _ = writeln!(
            s,
            "{{\"type\":\"summary\",\"scenario\":{},\"config\":{},\"runs\":{},\"median\":{{{}}},\"min\":{{{}}},\"max\":{{{}}}}}",
            json_str(scenario),
            json_str(&config),
            rs.len(),
            part(|x| x.median),
            part(|x| x.min),
            part(|x| x.max)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_medians() {
        let mut v = vec![5, 1, 4, 2, 3];
        assert_eq!(percentile(&mut v, 0.5), 3.0);
        assert_eq!(percentile(&mut v, 0.99), 5.0);
        assert!(percentile(&mut [], 0.5).is_nan());
        assert_eq!(median(&mut [3.0, 1.0, 2.0, f64::NAN]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0]), 2.5);
    }

    #[test]
    fn json_is_flat_and_escaped() {
        let r = RunRecord {
            scenario: "storm".into(),
            config: "a\"b".into(),
            run: 0,
            figures: vec![("x", 1.5), ("y", f64::NAN)],
        };
        let j = json_lines("storm", &[r]);
        assert!(j.contains("\"config\":\"a\\\"b\""));
        assert!(j.contains("\"y\":null"));
        assert!(j.contains("\"median\":{\"x\":1.5,\"y\":null}"));
    }
}
