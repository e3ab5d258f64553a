//! A small SVG plot: the cumulative distribution of each latency series,
//! one panel per group, on a log-scaled time axis.

use super::stats::Samples;
use std::fmt::Write;

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 260.0;
const MARGIN: f64 = 50.0;

/// Renders `panels` (title, series) side by side in rows of two.
pub fn cdf_svg(panels: &[(String, Vec<Samples>)]) -> String {
    let cols = 2usize;
    let rows = panels.len().div_ceil(cols).max(1);
    let width = cols as f64 * (PANEL_W + MARGIN * 2.0);
    let height = rows as f64 * (PANEL_H + MARGIN * 2.0);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, (title, series)) in panels.iter().enumerate() {
        let ox = (i % cols) as f64 * (PANEL_W + MARGIN * 2.0) + MARGIN;
        let oy = (i / cols) as f64 * (PANEL_H + MARGIN * 2.0) + MARGIN;
        panel(&mut svg, ox, oy, title, series);
    }
    svg.push_str("</svg>\n");
    svg
}

fn panel(svg: &mut String, ox: f64, oy: f64, title: &str, series: &[Samples]) {
    let all: Vec<f64> = series
        .iter()
        .flat_map(|s| s.ms.iter().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(1e-3);
    let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    let (llo, lhi) = (lo.log10().floor(), hi.log10().ceil());
    // Samples below the axis start are drawn at its edge; ticks are exact.
    let x_exact = |v: f64| ox + (v.log10() - llo) / (lhi - llo) * PANEL_W;
    let x = |v: f64| x_exact(v.max(10f64.powf(llo)));
    let y = |f: f64| oy + PANEL_H - f * PANEL_H;
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" font-size="13" font-weight="bold">{}</text>"#,
        ox,
        oy - 15.0,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{ox}" y="{oy}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#999"/>"##
    );
    let mut decade = llo;
    while decade <= lhi {
        let v = 10f64.powf(decade);
        let px = x_exact(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{px}" y1="{oy}" x2="{px}" y2="{}" stroke="#eee"/><text x="{px}" y="{}" text-anchor="middle">{} ms</text>"##,
            oy + PANEL_H,
            oy + PANEL_H + 14.0,
            fmt_ms(v)
        );
        decade += 1.0;
    }
    for f in [0.5, 0.95, 0.99] {
        let _ = writeln!(
            svg,
            r##"<line x1="{ox}" y1="{py}" x2="{}" y2="{py}" stroke="#ddd" stroke-dasharray="3,3"/><text x="{}" y="{py}" text-anchor="end">p{}</text>"##,
            ox + PANEL_W,
            ox - 4.0,
            (f * 100.0) as u32,
            py = y(f)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let sorted = s.sorted();
        let n = sorted.len().max(1) as f64;
        let points: Vec<String> = sorted
            .iter()
            .enumerate()
            .map(|(k, v)| format!("{:.1},{:.1}", x(*v), y((k + 1) as f64 / n)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            points.join(" ")
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" fill="{color}">{} (p50 {:.2} ms, N={})</text>"#,
            ox + 8.0,
            oy + 14.0 + 13.0 * i as f64,
            escape(&s.name),
            s.p50(),
            s.n()
        );
    }
}

fn fmt_ms(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_one_line_per_series() {
        let mut a = Samples::new("a");
        let mut b = Samples::new("b<c");
        for i in 1..50 {
            a.ms.push(f64::from(i));
            b.ms.push(f64::from(i) * 2.0);
        }
        let svg = cdf_svg(&[("ADD".into(), vec![a, b])]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("b&lt;c"));
        assert!(svg.ends_with("</svg>\n"));
    }
}
