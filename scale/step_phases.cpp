// scale/step_phases.cpp: see step_phases.h.
#include "step_phases.h"

#include <algorithm>
#include <cstdio>

#include "core/cuda_backend.h"
#include "scale/scale_backend.h"

namespace fg {
namespace {

double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    const std::size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
    const double upper = v[mid];
    if (v.size() % 2) return upper;
    return 0.5 * (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
}

}  // namespace

StepPhases::StepPhases() {
    ScaleBackend& scale = scale_backend("train.phase_times");
    for (auto& set : events_)
        for (void*& e : set) e = scale.event_create_timed();
}

StepPhases::~StepPhases() {
    if (!cuda_backend_or_null()) return;
    ScaleBackend& scale = scale_backend("train.phase_times");
    for (auto& set : events_)
        for (void* e : set) scale.event_destroy(e);
}

void StepPhases::mark(Mark mark) { scale_backend("train.phase_times").event_record(events_[current_][mark]); }

void StepPhases::read(int set) {
    ScaleBackend& scale = scale_backend("train.phase_times");
    for (int p = 0; p + 1 < kMarks; ++p)
        phase_ms_[static_cast<std::size_t>(p)].push_back(
            scale.event_elapsed_ms(events_[set][p], events_[set][p + 1]));
}

void StepPhases::reset() {
    for (auto& v : phase_ms_) v.clear();
    wall_ms_.clear();
    pending_ = false;
}

void StepPhases::step_done(double wall_ms) {
    if (pending_) read(1 - current_);
    wall_ms_.push_back(wall_ms);
    pending_ = true;
    current_ = 1 - current_;
}

std::string StepPhases::summary(std::size_t skip) {
    if (pending_) {
        read(1 - current_);
        pending_ = false;
    }
    const std::size_t n = wall_ms_.size();
    if (n == 0) return "phase times: no eager step was timed";
    skip = std::min(skip, n / 2);  // keep at least half of a short run
    const auto late = [skip](const std::vector<double>& v) {
        return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(skip), v.end());
    };
    const double fwd_bwd = median(late(phase_ms_[0])), exchange = median(late(phase_ms_[1])),
                 update = median(late(phase_ms_[2])), wall = median(late(wall_ms_));
    std::vector<double> span(n - skip);
    for (std::size_t i = skip; i < n; ++i)
        span[i - skip] = phase_ms_[0][i] + phase_ms_[1][i] + phase_ms_[2][i];
    char line[320];
    std::snprintf(line, sizeof line,
                  "phase times (median of %zu eager steps, GPU ms): forward + backward %.2f, "
                  "gradient exchange %.2f, norm + update %.2f; start to end %.2f of the step's "
                  "%.2f ms wall",
                  n - skip, fwd_bwd, exchange, update, median(span), wall);
    return line;
}

}  // namespace fg
