//! Observers of a run: everything that watches the typed records go by implements [`Observer`] —
//! the metrics file, the progress bar, TensorBoard event files, the plots drawn at the end — and
//! research code adds its own (`TrainerBuilder::observer`). The loop in run/run_loop.rs hands each
//! record to every observer in order.

use crate::records::metrics::MetricsWriter;
use crate::report::MetricsLine;
use anyhow::Result;
use std::path::Path;

/// Something that watches a run's records.
pub trait Observer {
    /// One record, as it is produced (the SFT warm-up's lines included).
    fn record(&mut self, line: &MetricsLine) -> Result<()>;
    /// The run ended; `run_dir` holds its files.
    fn finish(&mut self, _run_dir: &Path) -> Result<()> {
        Ok(())
    }
}

/// Several observers as one, each handed every record in order.
#[derive(Default)]
pub struct Observers(pub Vec<Box<dyn Observer>>);

impl Observers {
    pub fn push(&mut self, o: Box<dyn Observer>) {
        self.0.push(o);
    }
}

impl Observer for Observers {
    fn record(&mut self, line: &MetricsLine) -> Result<()> {
        self.0.iter_mut().try_for_each(|o| o.record(line))
    }

    fn finish(&mut self, run_dir: &Path) -> Result<()> {
        self.0.iter_mut().try_for_each(|o| o.finish(run_dir))
    }
}

impl Observer for MetricsWriter {
    fn record(&mut self, line: &MetricsLine) -> Result<()> {
        self.write(line)
    }
}

/// The progress bar on a terminal (hidden elsewhere) with the step's key figures.
pub struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    pub fn new(steps: u64, start: u64) -> Self {
        Self {
            bar: progress_bar("grpo", steps, start),
        }
    }
}

impl Observer for Progress {
    fn record(&mut self, line: &MetricsLine) -> Result<()> {
        if let MetricsLine::Grpo(s) = line {
            self.bar.set_message(format!(
                "acc {:.2}  len {:.1}  reward {:.3}",
                s.accuracy,
                s.len_mean.unwrap_or(0.0),
                s.reward
            ));
            self.bar.inc(1);
        }
        Ok(())
    }

    fn finish(&mut self, _run_dir: &Path) -> Result<()> {
        self.bar.finish_and_clear();
        Ok(())
    }
}

/// length.png, accuracy.png, reward.png, gamma_l.png at the end of the run. The run is done
/// and its metrics are on disk by then: a plot that cannot be drawn is a warning.
pub struct Plots;

impl Observer for Plots {
    fn record(&mut self, _line: &MetricsLine) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self, run_dir: &Path) -> Result<()> {
        if let Err(e) = crate::records::plot::plot_run(&run_dir.join("metrics.jsonl"), run_dir) {
            tracing::warn!("{e:#}");
        }
        Ok(())
    }
}

/// A progress bar for a phase (hidden when stderr is not a terminal).
pub fn progress_bar(phase: &str, len: u64, pos: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    let template = format!("{phase} {{bar:30}} {{pos}}/{{len}} {{elapsed}} {{msg}}");
    if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar.set_position(pos);
    bar
}
