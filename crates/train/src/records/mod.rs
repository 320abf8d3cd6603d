//! What a run leaves for people and tools: the metrics file's writer, the observers of a run's
//! records, TensorBoard event files and PNG curves. (The checkpoint and lock readers the tools
//! use are the crate root's: lib.rs.)

pub(crate) mod metrics;
pub(crate) mod observe;
pub(crate) mod plot;
pub(crate) mod tensorboard;

// What a run leaves on disk and the tools that read it: the metrics file's writer,
// TensorBoard event files, plots.
pub use crate::records::metrics::{MetricsWriter, Start};
pub use crate::records::plot::{band_chart, line_chart, plot_run, Band, Series};
pub use crate::records::tensorboard::{read_scalars, scalars_of};
