// train/safetensors.h: reading and writing the safetensors format (the format PyTorch users load
// with safetensors.torch.load_file): 8 bytes of little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ..., "__metadata__":
// {string: string}}, then the raw little-endian data. Writes are durable (write_file_durably in
// checkpoint.h: a temporary file, fsynced and renamed into place), so a crash never leaves a
// half-written file under the real name.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace fg {

struct SafetensorsFile {
    std::vector<std::pair<std::string, Tensor>> tensors;  // CPU tensors, in file order
    std::map<std::string, std::string> metadata;
    const Tensor* find(const std::string& name) const;
};

// Tensors may live on any device (they are copied to the host). Throws on any I/O failure.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Validates everything (sizes, offsets, dtypes, shapes) and says what is wrong and where.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace fg
