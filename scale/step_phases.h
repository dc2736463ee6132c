// scale/step_phases.h: where an eager training step's GPU time goes (train.phase_times).
//
// Timing events on fusegrad's stream mark four points of each step: its start, the end of its
// forward and backward passes, the end of the ranks' gradient exchange (the sums received and
// averaged; with one rank this follows the backward at once) and the end of the update (gradient
// norm, clip factor, optimizer). The GPU reaches a mark when the work queued before it is done,
// so the time between two marks is the GPU's time for that phase, waits for the host included.
// Marking adds no synchronisation: a step's marks are read after the next step's own wait for
// its loss, when the GPU has long passed them. At the end of a run summary() gives each phase's
// median beside the median wall time of a step; what the wall time has beyond the marks' span
// is time the GPU spent waiting for the host between steps.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace fg {

class StepPhases {
public:
    enum Mark { kStart, kBackwardDone, kExchangeDone, kUpdateDone, kMarks };

    StepPhases();  // needs CUDA
    ~StepPhases();
    StepPhases(const StepPhases&) = delete;
    StepPhases& operator=(const StepPhases&) = delete;

    // Records `mark` of the current step on fusegrad's stream.
    void mark(Mark mark);
    // The current step has ended after `wall_ms` on the host's clock; reads the previous step's
    // marks (reached by now) and keeps this step's for the next call.
    void step_done(double wall_ms);
    // Each phase's median over the steps timed, the first `skip` left out (fewer when there are
    // not enough), as one line for the log; waits for the last step's marks.
    std::string summary(std::size_t skip);
    std::size_t steps_timed() const { return wall_ms_.size(); }
    // Forgets the steps timed so far (a new Trainer::run call times its own).
    void reset();

private:
    void read(int set);

    std::array<std::array<void*, kMarks>, 2> events_{};  // two steps' marks, used in turn
    int current_ = 0;
    bool pending_ = false;  // the other set holds a step not read yet
    std::array<std::vector<double>, kMarks - 1> phase_ms_;  // per phase, per step read
    std::vector<double> wall_ms_;
};

}  // namespace fg
