// train/setup.h: a run's parts built from a config: the device, the model's shape and its kernel
// settings, the optimizer, the data, the memory one step needs, and the data's paths as a run
// directory records them. Used by the trainer and by the commands that read a run back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "data.h"
#include "models/gpt.h"
#include "models/gpt_memory.h"
#include "optim.h"

namespace fg {

Device resolve_device(DeviceChoice choice);  // train.device (cuda: an error without CUDA)
// The GPT a config describes, with `vocab` tokens unless model.vocab_size says more: its shape
// and arithmetic, not its kernels' settings (configure_kernels).
GPTConfig gpt_config(const Config& config, std::int64_t vocab);
// Applies the layers' kernel settings of `config` to the modules of a built model
// (kernels.norm_reduction to every norm layer, kernels.attention to every attention layer,
// kernels.matmul_autotune with train.precision's TF32 to every Linear and the tied head;
// kernels.cuda_graph is the trainer's and the wing's),
// walking the module tree (Module::apply). Called once after building a model from a config: by
// the trainer (new and resumed runs) and load_run. kernels.attention=cudnn where cuDNN's fused
// attention cannot run the model (the CPU, f32, a build without cuDNN, ...) is an error saying why.
void configure_kernels(Module& model, const Config& config);
// AdamW's hyperparameters in a config.
AdamWOptions adamw_options(const Config& config);
// The optimizer a config describes (optim.name and its hyperparameters), over `params`.
std::unique_ptr<Optimizer> make_optimizer(const Config& config, const std::vector<NamedParam>& params);
// The dataset a config describes.
std::unique_ptr<Dataset> make_dataset(const Config& config);
// The attention calls of this config's training steps on `device`, as the op sees them.
AttentionCall training_attention(const Config& config, Device device);
// The memory one step of this run needs (each of `world_size` ranks its share of the batch),
// checked against what `device` has available before the model is built or anything is written,
// so that a batch too large for the machine is refused with the number instead of ending in an
// out-of-memory error part way through (train.memory_check: false skips the check).
TrainingMemory check_memory(const Config& config, const GPTConfig& shape, std::int64_t seq_len,
                            Device device, int world_size);
// data.path, data.val_path and train.init_from made absolute (a glob's folders too), so that the
// run directory's config.yaml reads the same files from any working directory (sample, eval,
// --resume).
Config with_absolute_data_paths(Config config);
// train.init_from's weights fit the model: where they sit beside a config.yaml (a run's, an
// imported model's), its model.* keys are this config's, dropout and vocab_size aside (shapes are
// checked as the weights load), or an error names those that differ.
void check_init_from(const Config& config);
// The run's text file (data.kind text) is where its config.yaml says, or an error naming the
// file, that config.yaml and what to edit. (A new run records the data's absolute paths.)
void require_data_files(const Config& config, const std::string& run_dir);

}  // namespace fg
