//! Line plots on logarithmic axes, as SVG (plotters): the latency-by-percentile plot of a run and the cost-by-size
//! plot of the benchmarks.

use std::ops::Range;

use plotters::prelude::*;

/// One line of a plot.
pub struct Line {
    /// Its legend.
    pub label: String,
    /// Its points, in plot coordinates (both positive).
    pub points: Vec<(f64, f64)>,
}

/// A plot with both axes logarithmic.
pub struct LogLog<'a> {
    /// The title.
    pub caption: &'a str,
    /// The axes' ranges.
    pub x: Range<f64>,
    /// The y axis's range.
    pub y: Range<f64>,
    /// The axes' names.
    pub x_desc: &'a str,
    /// The y axis's name.
    pub y_desc: &'a str,
    /// How an x value is labelled.
    pub x_label: &'a dyn Fn(&f64) -> String,
    /// Whether each point also gets a dot.
    pub dots: bool,
}

impl LogLog<'_> {
    /// The plot of `lines`, as SVG text.
    pub fn svg(&self, lines: &[Line]) -> Result<String, String> {
        let mut svg = String::new();
        self.draw(&mut svg, lines).map_err(|e| e.to_string())?;
        Ok(svg)
    }

    fn draw(&self, svg: &mut String, lines: &[Line]) -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::with_string(svg, (900, 540)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(self.caption, ("sans-serif", 20))
            .margin(20)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(self.x.clone().log_scale(), self.y.clone().log_scale())?;
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .x_label_formatter(self.x_label)
            .y_label_formatter(&|y| if *y < 10.0 { format!("{y:.1}") } else { format!("{y:.0}") })
            .draw()?;
        for (i, line) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(line.points.iter().copied(), color.stroke_width(2)))?
                .label(line.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            if self.dots {
                chart.draw_series(line.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}
