//! What a run leaves for people and tools: the metrics file's writer, the observers of a run's
//! records, TensorBoard event files and PNG curves. Its public items also re-export the run
//! wing's checkpoint and lock readers, which the tools use.

pub(crate) mod metrics;
pub(crate) mod observe;
pub(crate) mod plot;
pub(crate) mod tensorboard;

// What a run leaves on disk and the tools that read it: checkpoints, the run lock, the
// metrics file's writer, TensorBoard event files, plots.
pub use crate::records::metrics::{MetricsWriter, Start};
pub use crate::records::plot::{band_chart, line_chart, plot_run, Band, Series};
pub use crate::records::tensorboard::{read_scalars, scalars_of};
pub use crate::run::checkpoint::{
    checkpoints_newest_first, export_lora, first_non_finite_weight, last_good, read_state,
    step_name,
};
pub use crate::run::lock::RunLock;
