// train/checkpoint.h: durable files and the checkpoint of a run directory as one atomic unit.
//
// A checkpoint is a folder checkpoints/step_<N>[.<k>]/ holding model.safetensors and
// train_state.safetensors, and it counts only once checkpoint.json, the manifest, names it. The
// manifest is written last (the commit marker): the step, the folder, and each file's size and
// XXH3-64 checksum. Writing one goes:
//   1. both files into checkpoints/.partial/ (each written, fsynced, renamed, folder fsynced);
//   2. .partial renamed to the step's folder, checkpoints/ fsynced;
//   3. checkpoint.json written the same durable way (a temporary file renamed over the old one);
//   4. model.safetensors at the top of the run directory re-pointed at the new weights (a hard
//      link renamed into place), for users and `sample`; older checkpoint folders removed.
// A crash anywhere before 3 leaves the previous manifest and its folder untouched; after 3 the new
// checkpoint is complete. Readers verify sizes and checksums, so a truncated or flipped file is
// refused, never loaded. Leftover temporary files and folders are ignored and cleaned up.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace fg {

// Writes `bytes` to `path` so that after it returns the content survives a crash: a temporary
// file beside it (its name ends ".tmp"), written, fsynced, renamed over `path`, the folder
// fsynced. On failure (a full disk, say) the temporary file is removed, `path` is unchanged, and
// an fg::Error (of `op`) names the file and the system's reason.
void write_file_durably(const std::string& path, const std::string& bytes,
                        const char* op = "checkpoint");
// fsync of a folder (its entries: names created, renamed or removed in it).
void sync_folder(const std::string& path);
// XXH3-64 of the file's bytes, as 16 hex digits.
std::string file_checksum(const std::string& path);

struct CheckpointManifest {
    std::int64_t step = 0;
    std::string folder;  // relative to the run directory: "checkpoints/step_00000012"
    struct File {
        std::uint64_t bytes = 0;
        std::string xxh3;
    };
    std::map<std::string, File> files;  // by file name inside the folder
};

// Commits the files already written into <run_dir>/checkpoints/.partial/ (partial_folder()) as
// the checkpoint of `step`: steps 2-4 above.
void commit_checkpoint(const std::string& run_dir, std::int64_t step);
std::string partial_folder(const std::string& run_dir);
// True when the run directory has a committed checkpoint (checkpoint.json).
bool has_checkpoint(const std::string& run_dir);
// Reads checkpoint.json and verifies every file it lists (present, size, checksum); an fg::Error
// names the file and what is wrong. Returns the manifest (folder paths are relative).
CheckpointManifest verified_checkpoint(const std::string& run_dir);

}  // namespace fg
