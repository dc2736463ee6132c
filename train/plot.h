// train/plot.h: the loss curve of a run as an SVG picture: training loss at every step and
// validation loss at every evaluation, read from the run's metrics.jsonl (so a resumed run's
// picture covers its whole history).
#pragma once

#include <string>

namespace fg {

// Writes `svg_path` (through a temporary file and a rename). Throws if the metrics cannot be read.
void write_loss_curve(const std::string& metrics_jsonl, const std::string& svg_path,
                      const std::string& title);

}  // namespace fg
