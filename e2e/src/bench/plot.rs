//! The benchmark's SVG figure, drawn with `plotters`: the cumulative
//! distribution of each latency series, one panel per group, on a
//! log-scaled time axis. The SVG backend writes text as `<text>` elements,
//! so no font files are read (plotters' `ttf` feature is off).

use super::stats::Samples;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];
/// One panel's size in pixels, axis labels and caption included.
const PANEL: (u32, u32) = (560, 380);
const COLS: u32 = 2;
const FONT: &str = "sans-serif";
/// The percentiles marked by a dashed line in every panel.
const MARKS: [(f64, &str); 3] = [(0.5, "p50"), (0.95, "p95"), (0.99, "p99")];

/// Renders `panels` (title, series) side by side in rows of two.
pub fn cdf_svg(panels: &[(String, Vec<Samples>)]) -> String {
    let rows = (panels.len() as u32).div_ceil(COLS).max(1);
    let size = (PANEL.0 * COLS, PANEL.1 * rows);
    let mut svg = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw_all(&root, rows, panels)
    };
    match drawn {
        Ok(()) => svg,
        // The figure is a by-product of the report: say what failed in it
        // rather than lose the tables.
        Err(e) => format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="40"><text x="10" y="25">plot failed: {}</text></svg>
"#,
            size.0,
            escape(&e)
        ),
    }
}

fn draw_all(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    rows: u32,
    panels: &[(String, Vec<Samples>)],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((rows as usize, COLS as usize));
    for ((title, series), area) in panels.iter().zip(&areas) {
        panel(area, title, series).map_err(|e| format!("panel {title}: {e}"))?;
    }
    root.present().map_err(|e| e.to_string())
}

/// The x axis: whole decades of ms around every positive sample.
fn decades(series: &[Samples]) -> (f64, f64) {
    let positive = series
        .iter()
        .flat_map(|s| s.ms.iter().copied())
        .filter(|v| *v > 0.0 && v.is_finite());
    let (lo, hi) = positive.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return (0.1, 10.0);
    }
    let lo = lo.max(1e-3);
    let hi = hi.max(lo * 10.0);
    (
        10f64.powf(lo.log10().floor()),
        10f64.powf(hi.log10().ceil()),
    )
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    series: &[Samples],
) -> Result<(), Box<dyn std::error::Error>> {
    let (lo, hi) = decades(series);
    let labels = (hi / lo).log10().round() as usize + 1;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18).into_font().style(FontStyle::Bold))
        .margin(12)
        // Room for the last decade's label, centred on the right edge.
        .margin_right(28)
        .x_label_area_size(40)
        .y_label_area_size(52)
        .build_cartesian_2d(
            // A hair wider than the decades, so that rounding in plotters'
            // key points cannot drop the first or last decade's label.
            (lo * (1.0 - 1e-9)..hi * (1.0 + 1e-9)).log_scale(),
            0.0..1.0,
        )?;
    chart
        .configure_mesh()
        // Only whole decades get a label, as `1 ms`, `10 ms`.
        .x_labels(labels)
        .x_label_formatter(&|v| format!("{} ms", fmt_ms(*v)))
        .y_labels(11)
        .y_label_formatter(&|f| format!("{f:.1}"))
        .x_desc("latency (log scale)")
        .y_desc("fraction of samples at or below")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 13))
        .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .draw()?;
    for (f, name) in MARKS {
        chart.draw_series(DashedLineSeries::new(
            [(lo, f), (hi, f)],
            4,
            4,
            RGBColor(0xbb, 0xbb, 0xbb).stroke_width(1),
        ))?;
        chart.draw_series(std::iter::once(Text::new(
            name,
            (hi, f),
            (FONT, 11)
                .into_font()
                .color(&RGBColor(0x88, 0x88, 0x88))
                .pos(Pos::new(HPos::Right, VPos::Bottom)),
        )))?;
    }
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let sorted = s.sorted();
        let n = sorted.len().max(1) as f64;
        // Samples below the axis start are drawn at its edge.
        let points = sorted
            .iter()
            .enumerate()
            .map(|(k, v)| (v.max(lo), (k + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(format!("{} (p50 {:.2} ms, N={})", s.name, s.p50(), s.n()))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 12))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(0xbb, 0xbb, 0xbb))
        .draw()?;
    Ok(())
}

fn fmt_ms(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        // 0.1, 0.01: as many decimals as the decade needs, no float noise.
        let places = (-v.log10()).ceil().max(0.0) as usize;
        format!("{v:.places$}")
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

    /// Checks that `svg` is well-formed XML in the ways a writer can break
    /// it: every tag closed in order, attributes quoted, `<` and `&` only as
    /// markup or entities. Returns the text content, entities decoded.
    fn well_formed(svg: &str) -> Result<String, String> {
        let mut open: Vec<&str> = Vec::new();
        let mut text = String::new();
        let mut rest = svg;
        let mut seen_root = false;
        while let Some(lt) = rest.find('<') {
            text.push_str(&unescape(&rest[..lt])?);
            rest = &rest[lt..];
            let gt = tag_end(rest).ok_or_else(|| format!("unclosed tag at {rest:.40}"))?;
            let tag = &rest[1..gt];
            rest = &rest[gt + 1..];
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            if let Some(name) = tag.strip_prefix('/') {
                match open.pop() {
                    Some(o) if o == name.trim() => {}
                    o => return Err(format!("</{name}> closes {o:?}")),
                }
                continue;
            }
            let name = tag
                .split(|c: char| c.is_whitespace() || c == '/')
                .next()
                .unwrap_or("");
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                return Err(format!("bad tag name in <{tag}>"));
            }
            if open.is_empty() && seen_root {
                return Err(format!("second root element <{name}>"));
            }
            check_attributes(tag)?;
            seen_root = true;
            if !tag.ends_with('/') {
                open.push(name);
            }
        }
        text.push_str(&unescape(rest)?);
        if !open.is_empty() {
            return Err(format!("unclosed elements {open:?}"));
        }
        if !seen_root {
            return Err("no root element".into());
        }
        Ok(text)
    }

    /// The index of the `>` that ends the tag at the start of `s`, skipping
    /// quoted attribute values.
    fn tag_end(s: &str) -> Option<usize> {
        let mut quote = None;
        for (i, c) in s.char_indices().skip(1) {
            match (quote, c) {
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (None, '<') => return None,
                (None, '>') => return Some(i),
                _ => {}
            }
        }
        None
    }

    /// Every attribute is `name="value"` (or single quotes), no duplicates.
    fn check_attributes(tag: &str) -> Result<(), String> {
        let body = tag.trim_end_matches('/');
        let mut rest = body.trim_start_matches(|c: char| !c.is_whitespace()).trim();
        let mut names = Vec::new();
        while !rest.is_empty() {
            let eq = rest
                .find('=')
                .ok_or_else(|| format!("attribute without value in <{tag}>"))?;
            let name = rest[..eq].trim();
            if names.contains(&name) {
                return Err(format!("attribute {name} twice in <{tag}>"));
            }
            names.push(name);
            let value = rest[eq + 1..].trim_start();
            let q = value
                .chars()
                .next()
                .filter(|c| *c == '"' || *c == '\'')
                .ok_or_else(|| format!("unquoted attribute {name} in <{tag}>"))?;
            let end = value[1..]
                .find(q)
                .ok_or_else(|| format!("unterminated attribute {name} in <{tag}>"))?;
            unescape(&value[1..1 + end])?;
            rest = value[end + 2..].trim_start();
        }
        Ok(())
    }

    fn unescape(s: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = s;
        while let Some(amp) = rest.find('&') {
            out.push_str(&rest[..amp]);
            let semi = rest[amp..]
                .find(';')
                .ok_or_else(|| format!("bare & in {s:?}"))?;
            let entity = &rest[amp + 1..amp + semi];
            out.push(match entity {
                "lt" => '<',
                "gt" => '>',
                "amp" => '&',
                "quot" => '"',
                "apos" => '\'',
                _ => return Err(format!("unknown entity &{entity}; in {s:?}")),
            });
            rest = &rest[amp + semi + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn series(name: &str, scale: f64) -> Samples {
        let mut s = Samples::new(name);
        s.ms = (1..50).map(|i| f64::from(i) * scale).collect();
        s
    }

    #[test]
    fn svg_is_well_formed_and_names_every_panel_and_series() {
        let panels = vec![
            (
                "CNI ADD".to_string(),
                vec![series("ours ADD", 0.5), series("b<c & d", 2.0)],
            ),
            (
                "Device plugin Allocate".to_string(),
                vec![series("Allocate via gRPC", 0.01)],
            ),
            (
                "VERSION (process overhead)".to_string(),
                vec![series("/bin/true", 0.02)],
            ),
        ];
        let svg = cdf_svg(&panels);
        let text = well_formed(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        for (title, series) in &panels {
            assert!(
                text.contains(title.as_str()),
                "no title {title:?} in\n{text}"
            );
            for s in series {
                let legend = format!("{} (p50 {:.2} ms, N={})", s.name, s.p50(), s.n());
                assert!(text.contains(&legend), "no legend {legend:?} in\n{text}");
            }
        }
        // Axis labels: decades in ms, and what each axis shows.
        for label in ["0.01 ms", "1 ms", "100 ms", "latency (log scale)", "p95"] {
            assert!(text.contains(label), "no axis label {label:?} in\n{text}");
        }
        assert!(!svg.contains("plot failed"), "{svg}");
    }

    #[test]
    fn the_xml_check_catches_what_breaks_a_file() {
        for bad in [
            "<svg><text>a</svg>",
            "<svg><g></g>",
            "<svg><text>a < b</text></svg>",
            "<svg><text>a & b</text></svg>",
            "<svg x=1/>",
            "<svg/><svg/>",
        ] {
            assert!(well_formed(bad).is_err(), "{bad} passed");
        }
        assert_eq!(
            well_formed(r#"<?xml version="1.0"?><svg a="1"><t>x&lt;y</t><g/></svg>"#).as_deref(),
            Ok("x<y")
        );
    }

    #[test]
    fn empty_panels_still_draw_an_axis() {
        let svg = cdf_svg(&[("nothing yet".to_string(), vec![Samples::new("none")])]);
        let text = well_formed(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
        assert!(text.contains("nothing yet"), "{text}");
        assert!(text.contains("0.1 ms") && text.contains("10 ms"), "{text}");
    }
}
