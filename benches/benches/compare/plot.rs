//! The comparison as an SVG: one row per workload, throughput against clients on the left,
//! p50 and p99 latency (log scale) on the right; dlock in blue, Redis in red (`threads`), orange
//! (`async-mux`) and purple (`async-own`), each driving that was measured.

use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::Row;
use crate::run::{Cell, Driving, Workload};

const ROW_HEIGHT: u32 = 250;
const WIDTH: u32 = 1000;
const DLOCK: RGBColor = RGBColor(31, 119, 180);
const REDIS_THREADS: RGBColor = RGBColor(214, 39, 40);
const REDIS_ASYNC_MUX: RGBColor = RGBColor(255, 127, 14);
const REDIS_ASYNC_OWN: RGBColor = RGBColor(148, 103, 189);

/// One line of a chart: a side (dlock, or Redis as one driving drove it) and its points.
struct Series {
    name: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// Writes the plot of `rows` (one per workload and client count) to `path`.
pub fn write(path: &Path, rows: &[Row], clients: &[usize], title: &str) -> Result<(), String> {
    let workloads: Vec<Workload> = Workload::ALL
        .into_iter()
        .filter(|w| rows.iter().any(|r| r.workload == *w))
        .collect();
    let height = ROW_HEIGHT * workloads.len() as u32 + 40;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(fail)?;
    let (top, body) = root.split_vertically(40);
    top.titled(title, ("sans-serif", 18)).map_err(fail)?;
    let areas = body.split_evenly((workloads.len(), 2));
    for (i, &w) in workloads.iter().enumerate() {
        let rows: Vec<&Row> = rows.iter().filter(|r| r.workload == w).collect();
        let throughput = sides(&rows, clients, "", &|c| c.ops_per_s());
        let caption = format!("{}: operations/s", w.name());
        let top = throughput
            .iter()
            .flat_map(|s| s.points.iter().map(|&(_, y)| y))
            .fold(1.0, f64::max);
        let mut chart = ChartBuilder::on(&areas[2 * i])
            .caption(caption, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.3f64..(clients.len() as f64 - 0.7), 0f64..top * 1.15)
            .map_err(fail)?;
        mesh(&mut chart, clients)?;
        for s in throughput {
            let style = s.color.stroke_width(2);
            draw_line(&mut chart, s, style)?;
        }
        legend(&mut chart)?;
        latency_chart(&areas[2 * i + 1], w, &rows, clients)?;
    }
    root.present().map_err(fail)
}

/// p50 (solid) and p99 (pale) per operation of every side, on a log scale.
fn latency_chart(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    w: Workload,
    rows: &[&Row],
    clients: &[usize],
) -> Result<(), String> {
    let p50 = sides(rows, clients, " p50", &|c| c.p_us(0.5));
    let p99 = sides(rows, clients, " p99", &|c| c.p_us(0.99));
    let ys = p50
        .iter()
        .chain(&p99)
        .flat_map(|s| s.points.iter().map(|&(_, y)| y.max(0.1)));
    let (lo, hi) = ys.fold((f64::MAX, 0.1f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{}: latency per operation, µs", w.name()),
            ("sans-serif", 15),
        )
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(
            -0.3f64..(clients.len() as f64 - 0.7),
            (lo.min(hi) / 1.5..hi * 1.5).log_scale(),
        )
        .map_err(fail)?;
    mesh(&mut chart, clients)?;
    // Each side's p50 beside its p99.
    for (a, b) in p50.into_iter().zip(p99) {
        let (solid, pale) = (a.color.stroke_width(2), b.color.mix(0.45).stroke_width(2));
        draw_line(&mut chart, a, solid)?;
        draw_line(&mut chart, b, pale)?;
    }
    legend(&mut chart)
}

/// dlock's series, then one per Redis driving measured in `rows`, each named with `suffix` and
/// valued by `f`.
fn sides(rows: &[&Row], clients: &[usize], suffix: &str, f: &dyn Fn(&Cell) -> f64) -> Vec<Series> {
    let points = |cell: &dyn Fn(&Row) -> Option<&Cell>| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| cell(r).map(|c| (x_of(clients, r.clients), f(c))))
            .collect()
    };
    let mut out = vec![Series {
        name: format!("dlock{suffix}"),
        color: DLOCK,
        points: points(&|r| Some(&r.dlock)),
    }];
    for d in Driving::ALL {
        let p = points(&|r| r.redis_as(d));
        if !p.is_empty() {
            out.push(Series {
                name: format!("redis {}{suffix}", d.name()),
                color: color(d),
                points: p,
            });
        }
    }
    out
}

fn color(d: Driving) -> RGBColor {
    match d {
        Driving::Threads => REDIS_THREADS,
        Driving::AsyncMux => REDIS_ASYNC_MUX,
        Driving::AsyncOwn => REDIS_ASYNC_OWN,
    }
}

type Chart<'a, 'b, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, Y>>;

/// The y axes here: linear (throughput) or log (latency), both over `f64`.
trait YAxis: Ranged<ValueType = f64> + ValueFormatter<f64> {}
impl<Y: Ranged<ValueType = f64> + ValueFormatter<f64>> YAxis for Y {}

fn mesh<'a, 'b: 'a, Y: YAxis>(
    chart: &mut Chart<'a, 'b, Y>,
    clients: &[usize],
) -> Result<(), String> {
    chart
        .configure_mesh()
        .x_labels(clients.len())
        .x_label_formatter(&|x| client_label(clients, *x))
        .y_label_formatter(&|y| si(*y))
        .x_desc("clients")
        // Bold grid lines only: the light ones would triple the file's size.
        .max_light_lines(0)
        .draw()
        .map_err(fail)
}

fn draw_line<'a, 'b: 'a, Y: YAxis>(
    chart: &mut Chart<'a, 'b, Y>,
    s: Series,
    style: ShapeStyle,
) -> Result<(), String> {
    chart
        .draw_series(LineSeries::new(s.points.clone(), style))
        .map_err(fail)?
        .label(s.name)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
    chart
        .draw_series(
            s.points
                .into_iter()
                .map(|p| Circle::new(p, 3, style.filled())),
        )
        .map_err(fail)?;
    Ok(())
}

fn legend<'a, 'b: 'a, Y: YAxis>(chart: &mut Chart<'a, 'b, Y>) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(fail)
}

/// Client counts sit at evenly spaced x positions (0, 1, 2, ...), labelled with the count.
fn x_of(clients: &[usize], n: usize) -> f64 {
    clients.iter().position(|&c| c == n).unwrap_or(0) as f64
}

fn client_label(clients: &[usize], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 0.05 && i >= 0.0 {
        clients
            .get(i as usize)
            .map_or(String::new(), |c| c.to_string())
    } else {
        String::new()
    }
}

/// 1234567 as "1.2M", 4500 as "4.5k".
fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn fail(e: impl std::fmt::Debug) -> String {
    format!("plot: {e:?}")
}
