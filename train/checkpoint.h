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
//      link renamed into place), for users and `sample`; the folder of the checkpoint it
//      replaced (the old manifest's) removed, and fusegrad's own leftovers (step folders that
//      carry its marker but no manifest names, its temporary files); nothing else.
// A crash anywhere before 3 leaves the previous manifest and its folder untouched; after 3 the new
// checkpoint is complete. Readers verify sizes and checksums, so a truncated or flipped file is
// refused, never loaded. Leftover temporary files and folders are ignored and cleaned up.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace fg {

// Writes `bytes` to `path` so that after it returns the content survives a crash: a temporary
// file beside it, of a new name made for it (`path`.XXXXXX.tmp, created exclusively, so a file or
// link planted there is never opened), written, fsynced, renamed over `path` (a link at `path` is
// replaced, never followed), the folder fsynced. On failure (a full disk, say) the temporary file is removed, `path` is unchanged, and
// an fg::Error (of `op`) names the file and the system's reason.
void write_file_durably(const std::string& path, const std::string& bytes,
                        const char* op = "checkpoint");

struct CheckpointManifest {
    std::int64_t step = 0;
    std::string folder;  // relative to the run directory: "checkpoints/step_00000012"
    struct File {
        std::uint64_t bytes = 0;
        std::string xxh3;
    };
    std::map<std::string, File> files;  // by file name inside the folder
};

// Appends `line` and a newline to `path`, a regular file fusegrad made or makes now: opened with
// O_NOFOLLOW (a symbolic link at `path` is refused, not followed) and O_NONBLOCK (a FIFO there
// is refused, not waited on). An fg::Error (of `op`) names the file and the reason.
void append_line(const std::string& path, const std::string& line, const char* op);

// The hidden file that marks a directory as a fusegrad run: written first when a new run
// starts, so that a later start can tell what a failed start left from a user's files.
inline constexpr const char* kRunMarker = ".fusegrad-run";

// Makes `run_dir` ready for a new run, or refuses it. A directory that does not exist is
// created, an empty one taken; one with a committed checkpoint is refused (resume it); one
// holding only what a start of fusegrad's left before its first checkpoint (the marker,
// config.yaml, vocab.txt, metrics.jsonl, loss_curve.svg, best.safetensors, model.safetensors,
// checkpoints/ with step folders or .partial, fusegrad's temporary files) is taken over: those
// files are removed, and the returned line says so for the log ("" otherwise). Any other file,
// or any file without the marker, is refused by name: a new run never writes over, or removes,
// a file it did not write. The marker is written before this returns.
std::string claim_new_run_directory(const std::string& run_dir);

// step_ and at least eight digits, optionally a dot and a number: the checkpoint folders
// fusegrad names (commit_checkpoint), the only ones it removes.
bool is_step_folder_name(const std::string& name);

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
