//! The comparison as an SVG: one row per workload, throughput against clients on the left,
//! p50 and p99 latency (log scale) on the right; dlock in blue, Redis in red.

use std::path::Path;

use plotters::prelude::*;

use crate::Row;
use crate::run::Workload;

const ROW_HEIGHT: u32 = 250;
const WIDTH: u32 = 1000;
const DLOCK: RGBColor = RGBColor(31, 119, 180);
const REDIS: RGBColor = RGBColor(214, 39, 40);

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
    for (i, w) in workloads.iter().enumerate() {
        let pick = |dlock: bool, f: &dyn Fn(&crate::run::Cell) -> f64| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r.workload == *w)
                .map(|r| {
                    let cell = if dlock { &r.dlock } else { &r.redis };
                    (x_of(clients, r.clients), f(cell))
                })
                .collect()
        };
        let throughput = [
            ("dlock", DLOCK, pick(true, &|c| c.ops_per_s())),
            ("redis", REDIS, pick(false, &|c| c.ops_per_s())),
        ];
        let top = throughput
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(|&(_, y)| y))
            .fold(1.0, f64::max);
        let mut chart = ChartBuilder::on(&areas[2 * i])
            .caption(format!("{}: operations/s", w.name()), ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.3f64..(clients.len() as f64 - 0.7), 0f64..top * 1.15)
            .map_err(fail)?;
        chart
            .configure_mesh()
            .x_labels(clients.len())
            .x_label_formatter(&|x| client_label(clients, *x))
            .y_label_formatter(&|y| si(*y))
            .x_desc("clients")
            // Bold grid lines only: the light ones would triple the file's size.
            .max_light_lines(0)
            .draw()
            .map_err(fail)?;
        for (name, color, points) in throughput {
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(fail)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, color.filled())),
                )
                .map_err(fail)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(fail)?;

        let latency = [
            ("dlock p50", DLOCK, false, pick(true, &|c| c.p_us(0.5))),
            ("dlock p99", DLOCK, true, pick(true, &|c| c.p_us(0.99))),
            ("redis p50", REDIS, false, pick(false, &|c| c.p_us(0.5))),
            ("redis p99", REDIS, true, pick(false, &|c| c.p_us(0.99))),
        ];
        let ys = latency
            .iter()
            .flat_map(|(.., p)| p.iter().map(|&(_, y)| y.max(0.1)));
        let (lo, hi) = ys.fold((f64::MAX, 0.1f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
        let mut chart = ChartBuilder::on(&areas[2 * i + 1])
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
        chart
            .configure_mesh()
            .x_labels(clients.len())
            .x_label_formatter(&|x| client_label(clients, *x))
            .y_label_formatter(&|y| si(*y))
            .x_desc("clients")
            // Bold grid lines only: the light ones would triple the file's size.
            .max_light_lines(0)
            .draw()
            .map_err(fail)?;
        for (name, color, p99, points) in latency {
            let style = if p99 {
                color.mix(0.45).stroke_width(2)
            } else {
                color.stroke_width(2)
            };
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(fail)?
                .label(name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, style.filled())),
                )
                .map_err(fail)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(fail)?;
    }
    root.present().map_err(fail)
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
