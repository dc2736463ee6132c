// cli/plot.h: loss curves as an SVG picture: training loss at every step and validation loss at
// every evaluation, read from metrics.jsonl files (so a resumed run's picture covers its whole
// history). Several runs share one pair of axes, each in its own colour (`fusegrad plot`).
#pragma once

#include <string>
#include <vector>

namespace fg {

struct LossCurveSource {
    std::string label;          // shown in the legend ("" for a single run); runs under one label
                                // (seeds of one setup) share a colour and a legend entry
    std::string metrics_jsonl;  // lines with "step" and "loss" and/or "val_loss"
};

// Writes `svg_path` (through a temporary file and a rename). Throws if a metrics file cannot be
// read; lines without a step are skipped.
// y_max > 0 sets the top of the loss axis (points above it are drawn at the top edge), to look
// closely at the end of training; 0 fits the axis to the data.
void write_loss_curves(const std::vector<LossCurveSource>& runs, const std::string& svg_path,
                       const std::string& title, double y_max = 0.0);

}  // namespace fg
