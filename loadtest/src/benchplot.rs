//! `loadtest plot-bench`: the engine's cost against the review's size, per stage, from criterion's estimates of
//! the `stages` benchmark group (`cargo bench --bench engine -- stages`): a Markdown table on stdout and an SVG
//! plot, both axes logarithmic, so that linear growth is a straight line of slope 1.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::plot::{Line, LogLog};

/// Where criterion's estimates are and where the plot goes.
#[derive(Debug, clap::Args)]
pub struct PlotArgs {
    /// criterion's directory of the `stages` group.
    #[arg(long, value_name = "DIR", default_value = "target/criterion/stages")]
    pub criterion: PathBuf,
    /// The SVG to write.
    #[arg(long, value_name = "FILE", default_value = "cost-by-size.svg")]
    pub out: PathBuf,
}

#[derive(Deserialize)]
struct Estimates {
    median: Estimate,
}

#[derive(Deserialize)]
struct Estimate {
    point_estimate: f64,
    confidence_interval: Interval,
}

#[derive(Deserialize)]
struct Interval {
    lower_bound: f64,
    upper_bound: f64,
}

/// One stage's medians: (review bytes, median ns, lower, upper).
type Series = (String, Vec<(u64, f64, f64, f64)>);

fn read(dir: &Path) -> Result<Vec<Series>, String> {
    let error = |path: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let entries = |path: &Path| -> Result<Vec<PathBuf>, String> {
        let mut list: Vec<PathBuf> =
            std::fs::read_dir(path).map_err(|e| error(path, &e))?.filter_map(|e| e.ok().map(|e| e.path())).collect();
        list.sort();
        Ok(list)
    };
    let mut series = Vec::new();
    for stage in entries(dir)?.into_iter().filter(|p| p.is_dir() && !p.ends_with("report")) {
        let name = stage.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let mut points = Vec::new();
        for size in entries(&stage)? {
            let Some(bytes) = size.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            let path = size.join("new/estimates.json");
            let text = std::fs::read(&path).map_err(|e| error(&path, &e))?;
            let e: Estimates = serde_json::from_slice(&text).map_err(|e| error(&path, &e))?;
            let m = e.median;
            points.push((
                bytes,
                m.point_estimate,
                m.confidence_interval.lower_bound,
                m.confidence_interval.upper_bound,
            ));
        }
        points.sort_by_key(|p| p.0);
        if !points.is_empty() {
            series.push((name, points));
        }
    }
    if series.is_empty() {
        return Err(format!("{}: no estimates; run `cargo bench --bench engine -- stages` first", dir.display()));
    }
    Ok(series)
}

/// Prints the table and writes the plot.
pub fn run(args: &PlotArgs) -> Result<(), String> {
    let series = read(&args.criterion)?;
    let sizes: Vec<u64> = series[0].1.iter().map(|p| p.0).collect();
    print!("| stage |");
    for size in &sizes {
        print!(" {} |", crate::bodies::human_bytes(*size as usize));
    }
    println!("\n|---|{}", "---|".repeat(sizes.len()));
    for (name, points) in &series {
        print!("| {name} |");
        for (_, median, lower, upper) in points {
            print!(" {:.2} µs ({:.2}–{:.2}) |", median / 1e3, lower / 1e3, upper / 1e3);
        }
        println!();
    }
    if let Some((name, points)) = series.last() {
        print!("| {name}, per KB |");
        for (bytes, median, _, _) in points {
            print!(" {:.2} µs |", median / 1e3 / (*bytes as f64 / 1e3));
        }
        println!();
    }

    let (x_min, x_max) = (sizes[0] as f64 * 0.7, *sizes.last().unwrap_or(&1) as f64 * 1.4);
    let y_min = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).fold(f64::MAX, f64::min) / 1e3 * 0.7;
    let y_max = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).fold(0.0, f64::max) / 1e3 * 1.4;
    let lines: Vec<Line> = series
        .iter()
        .map(|(name, points)| Line {
            label: name.clone(),
            points: points.iter().map(|p| (p.0 as f64, p.1 / 1e3)).collect(),
        })
        .collect();
    let svg = LogLog {
        caption: "Engine cost by review size, per stage (criterion medians)",
        x: x_min..x_max,
        y: y_min..y_max,
        x_desc: "review size",
        y_desc: "µs per review",
        x_label: &|x| crate::bodies::human_bytes(*x as usize),
        dots: true,
    }
    .svg(&lines)?;
    std::fs::write(&args.out, svg).map_err(|e| format!("{}: {e}", args.out.display()))?;
    eprintln!("loadtest: wrote {}", args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(dir: &Path, stage: &str, size: u64, ns: f64) {
        let path = dir.join(stage).join(size.to_string()).join("new");
        std::fs::create_dir_all(&path).unwrap();
        let json = format!(
            r#"{{"mean":{{}},"median":{{"point_estimate":{ns},"confidence_interval":{{"lower_bound":{},"upper_bound":{}}}}}}}"#,
            ns * 0.99,
            ns * 1.01
        );
        std::fs::write(path.join("estimates.json"), json).unwrap();
    }

    #[test]
    fn reads_criterion_estimates_and_plots_them() {
        let dir = tempfile::tempdir().unwrap();
        for (size, ns) in [(2_000, 2_000.0), (60_000, 50_000.0)] {
            estimate(dir.path(), "1-parse", size, ns);
            estimate(dir.path(), "6-respond", size, ns * 1.5);
        }
        std::fs::create_dir_all(dir.path().join("report")).unwrap();
        let series = read(dir.path()).unwrap();
        assert_eq!(series.len(), 2);
        assert_eq!(series[1].0, "6-respond");
        assert_eq!(series[1].1[1].0, 60_000);
        assert_eq!(series[1].1[1].1, 75_000.0);
        let out = dir.path().join("plot.svg");
        run(&PlotArgs { criterion: dir.path().to_owned(), out: out.clone() }).unwrap();
        assert!(std::fs::read_to_string(out).unwrap().contains("6-respond"));
    }

    #[test]
    fn says_what_to_run_when_there_are_no_estimates() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap_err().contains("cargo bench --bench engine -- stages"));
    }
}
