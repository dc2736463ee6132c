// cli/norm_plan.h: a norm call's plan in words, for people: `fusegrad norm-plan` prints
// it for any shape on a machine without a GPU, and docs/norms.md shows it. Host code only.
#pragma once

#include <string>

#include "kernels/norm/plan.h"

namespace fg::kernels::norm_plan {

// The properties plan_forward / plan_backward need of a GPU by name: h100, h200 (the same SMs,
// L2 and shared memory as an H100) or a100 (no staging: no bulk copies or clusters). Another
// name throws std::invalid_argument listing these.
NormDevice norm_device_named(const std::string& name);

// The forward's and backward's plans of `call` on `device` under `tuning`, one choice a line,
// each followed by the ids of the rules behind it ([F6], [B2 B4], ...).
std::string explain_plan(const NormCall& call, const NormDevice& device, const NormTuning& tuning);

}  // namespace fg::kernels::norm_plan
