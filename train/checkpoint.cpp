// train/checkpoint.cpp: see checkpoint.h. POSIX calls for what the C++ library cannot promise
// (fsync of a file and of a folder); nlohmann::json for the manifest; xxHash (header-only) for
// the checksums.
#include "checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace fg {
namespace {

namespace fs = std::filesystem;

const char* kManifest = "checkpoint.json";
const char* kCheckpointMarker = ".fusegrad-checkpoint";  // in every step folder fusegrad makes

std::string reason() { return std::strerror(errno); }

// Writes all of `bytes` to the open descriptor; false (errno set) on any failure.
bool write_all(int fd, const std::string& bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
        ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        done += static_cast<std::size_t>(n);
    }
    return true;
}

// fsync of a folder (its entries: names created, renamed or removed in it).
void sync_folder(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    FG_CHECK(fd >= 0, "checkpoint", "cannot open folder '", path, "': ", reason());
    int rc = ::fsync(fd);
    std::string why = rc == 0 ? "" : reason();
    ::close(fd);
    FG_CHECK(rc == 0, "checkpoint", "cannot sync folder '", path, "': ", why);
}

// XXH3-64 of the file's bytes, as 16 hex digits.
std::string file_checksum(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    FG_CHECK(in.good(), "checkpoint", "cannot read '", path, "'");
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    std::vector<char> buf(1 << 20);
    while (in) {
        in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        XXH3_64bits_update(&state, buf.data(), static_cast<std::size_t>(in.gcount()));
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits_digest(&state)));
    return hex;
}

std::string folder_of(const std::string& path) {
    fs::path parent = fs::path(path).parent_path();
    return parent.empty() ? "." : parent.string();
}

// The name for step's folder: step_<N>, or step_<N>.<k> when that exists (the same step saved
// again after a resume) - never the folder the current manifest names.
std::string step_folder_name(const std::string& run_dir, std::int64_t step) {
    char base[32];
    std::snprintf(base, sizeof base, "step_%08lld", static_cast<long long>(step));
    std::string name = base;
    for (int k = 1; fs::exists(fs::path(run_dir) / "checkpoints" / name); ++k)
        name = std::string(base) + "." + std::to_string(k);
    return name;
}

// The process's umask, for files made with mkstemps (which makes them 0600): read from
// /proc/self/status where the kernel says it, else by the umask() round trip.
mode_t process_umask() {
    static const mode_t mask = [] {
        std::ifstream status("/proc/self/status");
        std::string line;
        while (std::getline(status, line))
            if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
        const mode_t m = ::umask(022);
        ::umask(m);
        return m;
    }();
    return mask;
}

}  // namespace

bool is_step_folder_name(const std::string& name) {
    // step_ and eight or more digits, then optionally a dot and digits (step_folder_name).
    const auto digits = [](const std::string& s) {
        const auto digit = [](unsigned char c) { return std::isdigit(c) != 0; };
        return !s.empty() && std::all_of(s.begin(), s.end(), digit);
    };
    const std::size_t dot = std::min(name.find('.'), name.size());  // 13: step_ and 8 digits
    return name.rfind("step_", 0) == 0 && dot >= 13 && digits(name.substr(5, dot - 5)) &&
           (dot == name.size() || digits(name.substr(dot + 1)));
}

void write_file_durably(const std::string& path, const std::string& bytes, const char* op) {
    // A new name of our own (mkstemps: O_CREAT | O_EXCL), so a file or link planted at any name
    // we might use is never opened, and rename replaces the name `path`, never what a link
    // there points to.
    std::string tmp = path + ".XXXXXX.tmp";
    int fd = ::mkstemps(tmp.data(), 4);
    FG_CHECK(fd >= 0, op, "cannot create a temporary file beside '", path, "': ", reason());
    bool ok = ::fchmod(fd, 0666 & ~process_umask()) == 0 && write_all(fd, bytes) &&
              ::fsync(fd) == 0;
    std::string why = ok ? "" : reason();
    ok = (::close(fd) == 0) && ok;
    if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
        ok = false;
        why = reason();
    }
    if (!ok) {
        ::unlink(tmp.c_str());
        fail(op, "writing '", path, "' failed: ", why.empty() ? reason() : why,
             "; the file was left as it was");
    }
    sync_folder(folder_of(path));
}

void append_line(const std::string& path, const std::string& line, const char* op) {
    const int fd = ::open(path.c_str(),
                          O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    FG_CHECK(fd >= 0, op, "cannot append to '", path, "': ", reason(),
             errno == ELOOP ? " (it is a symbolic link; fusegrad writes only files it made)" : "");
    struct stat st {};
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    const bool ok = regular && write_all(fd, line + "\n");
    const std::string why = regular ? reason() : "not a regular file";
    ::close(fd);
    FG_CHECK(ok, op, "cannot append to '", path, "': ", why);
}

namespace {

// What a start of fusegrad's writes at the top of its run directory before (or while) it
// commits its first checkpoint.
bool written_by_a_start(const std::string& name) {
    for (const char* f : {"config.yaml", "vocab.txt", "metrics.jsonl", "loss_curve.svg",
                          "best.safetensors", "model.safetensors", "model.safetensors.tmp"})
        if (name == f) return true;
    return false;
}

// `base`.XXXXXX.tmp: a temporary file of write_file_durably's for one of fusegrad's names (or
// `base`.tmp, the one fixed name older fusegrads used).
bool our_temporary(const std::string& name) {
    const auto ours = [](const std::string& base) {
        return written_by_a_start(base) || base == kManifest || base == kRunMarker;
    };
    const auto alnum = [](unsigned char c) { return std::isalnum(c) != 0; };
    const std::size_t n = name.size();
    if (n <= 4 || name.compare(n - 4, 4, ".tmp") != 0) return false;
    return ours(name.substr(0, n - 4)) ||
           (n >= 12 && name[n - 11] == '.' && std::all_of(name.end() - 10, name.end() - 4, alnum) &&
            ours(name.substr(0, n - 11)));
}

}  // namespace

std::string claim_new_run_directory(const std::string& run_dir) {
    const fs::path run(run_dir);
    std::error_code ec;
    const auto write_marker = [&] {
        write_file_durably((run / kRunMarker).string(),
                           "This directory is a fusegrad run. fusegrad writes and removes only "
                           "the files it made here.\n",
                           "train");
    };
    if (!fs::exists(fs::symlink_status(run))) {
        fs::create_directories(run, ec);
        FG_CHECK(!ec, "train", "cannot create the run directory '", run_dir, "': ", ec.message());
        write_marker();
        return "";
    }
    FG_CHECK(fs::is_directory(run), "train", "train.out_dir '", run_dir,
             "' is not a directory");
    FG_CHECK(!has_checkpoint(run_dir), "train", "'", run_dir, "' already holds a run (",
             kManifest, "): resume it with --resume ", run_dir,
             ", or set train.out_dir to a new directory");
    const bool marked = fs::is_regular_file(fs::symlink_status(run / kRunMarker));
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(run)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    std::vector<std::string> left;  // by a failed start: to be taken over
    for (const std::string& name : names) {
        if (name == kRunMarker && marked) continue;
        const fs::path path = run / name;
        const fs::file_status st = fs::symlink_status(path);
        // The marker's own temporary file: a start killed while it wrote the marker.
        const bool marker_temporary =
            name.rfind(std::string(kRunMarker) + ".", 0) == 0 && our_temporary(name);
        bool ours = fs::is_regular_file(st) &&
                    (marker_temporary ||
                     (marked && (written_by_a_start(name) || our_temporary(name))));
        if (marked && name == "checkpoints" && fs::is_directory(st)) {
            ours = true;  // if it holds nothing but step folders and .partial
            for (const auto& e : fs::directory_iterator(path)) {
                const std::string f = e.path().filename();
                ours = ours && fs::is_directory(fs::symlink_status(e.path())) &&
                       (f == ".partial" || is_step_folder_name(f));
            }
        }
        FG_CHECK(ours, "train", "'", run_dir, "' holds '", name, "', which ",
                 marked ? "a start of fusegrad's does not leave before its first checkpoint"
                        : "fusegrad did not write",
                 ": a new run needs a new or empty directory, or one a failed start of fusegrad "
                 "left (set train.out_dir to another directory; fusegrad never writes over or "
                 "removes files it did not write)");
        left.push_back(name);
    }
    if (!marked) write_marker();  // an empty directory
    if (left.empty()) return "";
    std::string list;
    for (const std::string& name : left) {
        fs::remove_all(run / name, ec);
        FG_CHECK(!ec, "train", "cannot remove '", (run / name).string(), "': ", ec.message());
        list += (list.empty() ? "" : ", ") + name;
    }
    sync_folder(run_dir);
    return "taking over '" + run_dir + "': a start that stopped before its first checkpoint " +
           "left " + list + "; they are replaced";
}

std::string partial_folder(const std::string& run_dir) {
    return (fs::path(run_dir) / "checkpoints" / ".partial").string();
}

bool has_checkpoint(const std::string& run_dir) {
    return fs::exists(fs::path(run_dir) / kManifest);
}

void commit_checkpoint(const std::string& run_dir, std::int64_t step) {
    const fs::path run(run_dir), checkpoints = run / "checkpoints";
    const std::string partial = partial_folder(run_dir);
    // The folder says it is fusegrad's: a step folder that a crash left unnamed by any manifest
    // is then still known as ours, and removed by a later commit.
    write_file_durably((fs::path(partial) / kCheckpointMarker).string(),
                       "A checkpoint folder of fusegrad's.\n");
    nlohmann::json files = nlohmann::json::object();
    for (const auto& entry : fs::directory_iterator(partial)) {
        const std::string name = entry.path().filename().string();
        if (name == kCheckpointMarker) continue;
        if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) continue;
        files[name] = {{"bytes", fs::file_size(entry.path())},
                       {"xxh3", file_checksum(entry.path().string())}};
    }
    const std::string folder = step_folder_name(run_dir, step);
    std::error_code ec;
    // The folder of the checkpoint this one replaces: the only one fusegrad removes after it.
    std::string previous;
    if (has_checkpoint(run_dir)) {
        std::ifstream old((run / kManifest).string());
        const nlohmann::json j = nlohmann::json::parse(old, nullptr, false);
        if (j.is_object() && j.contains("folder") && j["folder"].is_string())
            previous = fs::path(j["folder"].get<std::string>()).filename().string();
    }
    fs::rename(partial, checkpoints / folder, ec);
    FG_CHECK(!ec, "checkpoint", "cannot rename '", partial, "' to '",
             (checkpoints / folder).string(), "': ", ec.message());
    sync_folder(checkpoints.string());
    nlohmann::json manifest = {{"step", step},
                               {"folder", "checkpoints/" + folder},
                               {"files", files}};
    // The commit: from here on the new checkpoint is the one resume reads.
    write_file_durably((run / kManifest).string(), manifest.dump(2) + "\n");
    // The latest weights at the top of the run directory, for users and `sample`: a hard link
    // under a new name of its own (made by mkstemps, then freed for link()), renamed into place;
    // where links fail, a copy written as every file is.
    const fs::path weights = checkpoints / folder / "model.safetensors";
    const std::string top = (run / "model.safetensors").string();
    std::string link_tmp = top + ".XXXXXX.tmp";
    const int fd = ::mkstemps(link_tmp.data(), 4);
    bool linked = fd >= 0;
    if (linked) {
        ::close(fd);
        ::unlink(link_tmp.c_str());
        linked = ::link(weights.c_str(), link_tmp.c_str()) == 0 &&
                 ::rename(link_tmp.c_str(), top.c_str()) == 0;
        if (!linked) ::unlink(link_tmp.c_str());
    }
    if (!linked) {
        try {
            std::ifstream in(weights, std::ios::binary);
            write_file_durably(top, std::string(std::istreambuf_iterator<char>(in), {}));
        } catch (const std::exception& e) {
            fail("checkpoint", "the checkpoint of step ", step, " is saved in '",
                 (checkpoints / folder).string(), "', but '", top, "' could not be updated: ",
                 e.what());
        }
    }
    sync_folder(run.string());
    // The checkpoint this one replaced is no longer needed, nor are fusegrad's own leftovers: step
    // folders that carry its marker (a crash between their rename and the manifest left them
    // unnamed) and its temporary files at the top. Nothing else is touched: fusegrad removes only
    // what it can tell it wrote.
    if (!previous.empty() && previous != folder && is_step_folder_name(previous))
        fs::remove_all(checkpoints / previous, ec);
    for (const auto& entry : fs::directory_iterator(checkpoints, ec)) {
        const std::string name = entry.path().filename().string();
        if (name != folder && is_step_folder_name(name) &&
            fs::is_regular_file(fs::symlink_status(entry.path() / kCheckpointMarker)))
            fs::remove_all(entry.path(), ec);
    }
    for (const auto& entry : fs::directory_iterator(run, ec)) {
        const std::string name = entry.path().filename().string();
        if (our_temporary(name) && fs::is_regular_file(fs::symlink_status(entry.path())))
            fs::remove(entry.path(), ec);
    }
}

CheckpointManifest verified_checkpoint(const std::string& run_dir) {
    const fs::path run(run_dir);
    const std::string path = (run / kManifest).string();
    std::ifstream in(path);
    FG_CHECK(in.good(), "resume", "'", run_dir, "' holds no checkpoint (", kManifest,
             " is missing)");
    CheckpointManifest m;
    try {
        const nlohmann::json j = nlohmann::json::parse(in);
        m.step = j.at("step").get<std::int64_t>();
        m.folder = j.at("folder").get<std::string>();
        for (auto& [name, f] : j.at("files").items())
            m.files[name] = {f.at("bytes").get<std::uint64_t>(), f.at("xxh3").get<std::string>()};
    } catch (const nlohmann::json::exception& e) {
        fail("resume", "'", path, "' is corrupt: ", e.what());
    }
    FG_CHECK(m.step >= 0, "resume", "'", path, "' names step ", m.step, " (must be >= 0)");
    FG_CHECK(m.folder.rfind("checkpoints/", 0) == 0 && m.folder.find("..") == std::string::npos,
             "resume", "'", path, "' names the folder '", m.folder, "', not one in checkpoints/");
    for (const auto& [name, f] : m.files) {
        // Names of files inside the folder, never a path out of it.
        FG_CHECK(!name.empty() && name != "." && name != ".." &&
                     name.find('/') == std::string::npos && name.find('\0') == std::string::npos,
                 "resume", "'", path, "' lists the file '", name,
                 "', which is not a name inside its checkpoint folder (damaged or crafted)");
        const fs::path file = run / m.folder / name;
        std::error_code ec;
        const auto bytes = fs::file_size(file, ec);
        FG_CHECK(!ec, "resume", "'", file.string(), "', part of the checkpoint of step ", m.step,
                 ", is missing");
        FG_CHECK(bytes == f.bytes, "resume", "'", file.string(), "' has ", bytes, " bytes, the ",
                 "checkpoint of step ", m.step, " wrote ", f.bytes, " (truncated or replaced)");
        const std::string sum = file_checksum(file.string());
        FG_CHECK(sum == f.xxh3, "resume", "'", file.string(), "' does not match its checksum (",
                 sum, ", the checkpoint wrote ", f.xxh3, "): the file is corrupt");
    }
    return m;
}

}  // namespace fg
